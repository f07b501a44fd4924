"""API failures as our own types (kopf-style), translated at the boundary.

APIError
├── APINotFoundError      404: the object is gone — forget it
├── APIConflictError      409: someone wrote first — re-read, retry
├── APIInvalidError       422 without causes: a JSON-Patch ``test`` failed — re-read, retry
│   └── APISchemaError    422 whose ``details.causes`` name fields: the object breaks the
│                         CRD's schema (``NewInvalid``) — never retried with the same body
├── APIForbiddenError     403: RBAC is missing a verb — an operator must fix it
├── APIServerError        5xx, or a 200 whose body is no List (a proxy's page)
├── APIThrottledError     429 (or 503 with Retry-After): wait as told — ``APIGate`` sends
│                         nothing until then
└── APIUnavailableError   no answer at all (connection refused)
    └── APITimeoutError   no answer within ``kubernetes.api_timeout``: a slow or hung API
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
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


class APITimeoutError(APIUnavailableError):
    reason = "api_timeout"


class APIThrottledError(APIError):
    reason = "throttled"

    def __init__(self, message: str, status: int | None, retry_after: float | None) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


# A throttled API is left alone for what Retry-After says, within these bounds; without one,
# for BACKOFF_FIRST seconds, doubled on every throttle in a row up to BACKOFF_MAX.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


class APIGate:
    """One API server's throttle: after a 429 nothing is sent until its ``Retry-After`` has
    passed (client-go's ``WithRetryAfter`` semantics, but failing fast instead of sleeping
    inside a tick). Shared by every caller of one API server."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.until = 0.0
        self._streak = 0

    def closed_for(self) -> float:
        """Seconds left to wait; 0 when requests may go."""
        return max(0.0, self.until - self._clock())

    def throttled(self, retry_after: float | None) -> float:
        """Told to wait: close for ``retry_after`` (bounded), or back off; the wait."""
        self._streak += 1
        backoff = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self._streak - 1))
        wait = backoff if retry_after is None else min(BACKOFF_MAX, max(0.0, retry_after))
        self.until = max(self.until, self._clock() + wait)
        return wait

    def answered(self) -> None:
        self._streak = 0


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


def _retry_after(exc: ApiException) -> float | None:
    """``Retry-After`` in seconds (RFC 9110 also allows a date; the API server sends seconds)."""
    headers: Mapping[str, str] = exc.headers or {}
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds == seconds else None  # NaN: none


def translate(exc: BaseException, doing: str) -> APIError:
    """``doing`` says what we tried (``patch externalmodels maas-system/m``) for the message."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{doing}: HTTP {status}: {_message(exc)}"
        if status == 422 and (causes := _causes(exc)):
            return APISchemaError(message, status, causes)
        retry_after = _retry_after(exc)
        if status == 429 or (status == 503 and retry_after is not None):
            return APIThrottledError(message, status, retry_after)
        kind = _BY_STATUS.get(status, APIServerError if status >= 500 else APIError)
        return kind(message, status)
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return APITimeoutError(f"{doing}: no answer (timed out)")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return APIUnavailableError(f"{doing}: {type(exc).__name__}: {exc}")
    raise exc


async def call(
    doing: str,
    request: Callable[[], Awaitable[T]],
    seconds: float,
    gate: APIGate | None = None,
) -> T:
    """``request()`` within ``seconds``; a failure as our own error, saying what we were
    ``doing`` (``patch externalmodels llm/granite``). While ``gate`` is closed by a throttle
    nothing is sent: the call fails at once as throttled."""
    if gate is not None and (left := gate.closed_for()) > 0:
        raise APIThrottledError(
            f"{doing}: not sent, the API server asked to wait {left:.1f}s more", None, left
        )
    try:
        async with asyncio.timeout(seconds):
            answer = await request()
    except API_EXCEPTIONS as exc:
        error = translate(exc, doing)
        if gate is not None and isinstance(error, APIThrottledError):
            error.retry_after = gate.throttled(error.retry_after)
        raise error from exc
    if gate is not None:
        gate.answered()
    return answer


def list_of(answer: object, doing: str) -> tuple[list[dict[str, object]], str]:
    """A LIST answer's items and resourceVersion. One that is no List (a proxy's HTML page
    during an API server's restart, ``items`` that are no objects) is a server error, retried
    as any failed LIST: taken as it came, an informer died on it for good and an
    EndpointSlice lookup dropped the pods found before (found by an attack). A List says it
    is one (``kind: …List``) and has its ``items`` (``null``: empty, as Go's client decodes
    it); ``{}``, a Status or a gateway's ``{"error": …}`` answered 200 is no List (a
    review: read as an empty one, every pod was dropped without a word)."""
    if isinstance(answer, dict) and "items" in answer and _a_list(answer.get("kind")):
        items, meta = answer.get("items"), answer.get("metadata")
        items = [] if items is None else items
        if (
            isinstance(items, list)
            and all(isinstance(item, dict) for item in items)
            and isinstance(meta, dict | None)
        ):
            return items, str((meta or {}).get("resourceVersion", ""))
    raise no_answer("List", answer, doing)


def no_answer(kind: str, answer: object, doing: str) -> APIServerError:
    """A 200 whose body is no ``kind`` (a proxy's page, ``{}``): a server error, retried as
    any failed call. Shown by its first characters or its keys, never serialised whole."""
    to_dict = getattr(answer, "to_dict", None)
    if callable(to_dict):  # a model the client filled from what it could (all None from a page)
        answer = {k: v for k, v in to_dict().items() if v is not None}
    if isinstance(answer, str):
        shown = repr(answer[:64])
    elif isinstance(answer, dict):
        shown = f"an object with keys {sorted(map(str, answer))[:8]}"
    else:
        shown = type(answer).__name__
    return APIServerError(f"{doing}: the answer is no {kind}: {shown}", 200)


def _a_list(kind: object) -> bool:
    """A List's ``kind`` (``ExternalModelList``, ``EndpointSliceList``, or ``List``)."""
    return isinstance(kind, str) and kind.endswith("List")
