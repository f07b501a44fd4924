"""API failures as our own types (kopf-style), translated at the boundary.

APIError
├── APINotFoundError      404: the object is gone — forget it
├── APIConflictError      409: someone wrote first — re-read, retry
├── APIInvalidError       422: a JSON-Patch ``test`` failed or the body is invalid — re-read
├── APIForbiddenError     403: RBAC is missing a verb — an operator must fix it
├── APIServerError        5xx
└── APIUnavailableError   no answer at all (connection refused, timeout)
"""

from __future__ import annotations

import json

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException


class APIError(Exception):
    reason = "error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class APINotFoundError(APIError):
    reason = "not_found"


class APIConflictError(APIError):
    reason = "conflict"


class APIInvalidError(APIError):
    reason = "invalid"


class APIForbiddenError(APIError):
    reason = "forbidden"


class APIServerError(APIError):
    reason = "server_error"


class APIUnavailableError(APIError):
    reason = "unavailable"


# What a kubernetes-asyncio call can raise when the API server says no or does not answer.
API_EXCEPTIONS = (ApiException, aiohttp.ClientError, OSError)

_BY_STATUS: dict[int, type[APIError]] = {
    404: APINotFoundError,
    409: APIConflictError,
    422: APIInvalidError,
    403: APIForbiddenError,
}


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def translate(exc: BaseException, doing: str) -> APIError:
    """``doing`` says what we tried (``patch externalmodels maas-system/m``) for the message."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        kind = _BY_STATUS.get(status, APIServerError if status >= 500 else APIError)
        return kind(f"{doing}: HTTP {status}: {_message(exc)}", status)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return APIUnavailableError(f"{doing}: {type(exc).__name__}: {exc}")
    raise exc
