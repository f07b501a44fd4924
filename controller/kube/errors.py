"""API failures as our own types (kopf-style), translated at the boundary.

APIError
├── APINotFoundError      404: the object is gone — forget it
├── APIConflictError      409: someone wrote first — re-read, retry
├── APIInvalidError       422 without causes: a JSON-Patch ``test`` failed — re-read, retry
│   └── APISchemaError    422 whose ``details.causes`` name fields: the object breaks the
│                         CRD's schema (``NewInvalid``) — never retried with the same body
├── APIForbiddenError     403: RBAC is missing a verb — an operator must fix it
├── APIServerError        5xx
└── APIUnavailableError   no answer at all (connection refused, timeout)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from controller.kube.sdk import ApiException

T = TypeVar("T")


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


class APISchemaError(APIInvalidError):
    reason = "schema"

    def __init__(self, message: str, status: int | None, causes: list[dict[str, str]]) -> None:
        super().__init__(message, status)
        self.causes = causes

    @property
    def fields(self) -> str:
        return ", ".join(f"{c.get('field')}: {c.get('message')}" for c in self.causes)


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


def _status_body(exc: ApiException) -> dict[str, object]:
    try:
        body = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def _message(exc: ApiException) -> str:
    return str(_status_body(exc).get("message") or exc.reason)


def _causes(exc: ApiException) -> list[dict[str, str]]:
    details = _status_body(exc).get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if not isinstance(causes, list):
        return []
    return [
        {k: str(v) for k, v in c.items() if k in ("reason", "message", "field")}
        for c in causes
        if isinstance(c, dict) and c.get("field")
    ]


def translate(exc: BaseException, doing: str) -> APIError:
    """``doing`` says what we tried (``patch externalmodels maas-system/m``) for the message."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{doing}: HTTP {status}: {_message(exc)}"
        if status == 422 and (causes := _causes(exc)):
            return APISchemaError(message, status, causes)
        kind = _BY_STATUS.get(status, APIServerError if status >= 500 else APIError)
        return kind(message, status)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return APIUnavailableError(f"{doing}: {type(exc).__name__}: {exc}")
    raise exc


async def call(doing: str, request: Callable[[], Awaitable[T]], seconds: float) -> T:
    """``request()`` within ``seconds``; a failure as our own error, saying what we were
    ``doing`` (``patch externalmodels llm/granite``)."""
    try:
        async with asyncio.timeout(seconds):
            return await request()
    except API_EXCEPTIONS as exc:
        raise translate(exc, doing) from exc
