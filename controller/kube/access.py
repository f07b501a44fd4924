"""Who may read /metrics and /debug/state: the API server decides, as controller-runtime's
secure metrics server does (``filters.WithAuthenticationAndAuthorization``): the bearer token
goes to a TokenReview, and the user it names to a SubjectAccessReview for ``get`` on the
non-resource URL (the path). Grant it with a ClusterRole rule
``nonResourceURLs: ["/metrics"], verbs: ["get"]``.

Answers are cached for ``ttl`` seconds per token and path (a scrape every 30 s must not cost
two API calls each time), in two bounded caches: tokens the API server accepted, and tokens it
did not (401). Made-up tokens fill only the second, so a flood of them never evicts a real
scraper's answer; at most ``REVIEWS_AT_ONCE`` reviews are in flight, so a flood costs the API
server a few calls at a time, not one per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

import structlog

from controller.kube.errors import API_EXCEPTIONS, translate
from controller.kube.sdk import client

log = structlog.get_logger("controller.access")

CACHE_ENTRIES = 1024  # per cache: ~150 bytes each (a digest, a path, a time, a code)
REVIEWS_AT_ONCE = 4


class _Answers:
    """Answers by (token digest, path), each kept ``ttl`` seconds; the oldest goes first."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl, self._clock = ttl, clock
        self._kept: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: tuple[str, str]) -> int | None:
        found = self._kept.get(key)
        return found[1] if found is not None and self._clock() - found[0] < self._ttl else None

    def put(self, key: tuple[str, str], code: int) -> None:
        self._kept[key] = (self._clock(), code)
        self._kept.move_to_end(key)
        while len(self._kept) > CACHE_ENTRIES:
            self._kept.popitem(last=False)


class AccessReviewer:
    def __init__(
        self,
        api: client.ApiClient,
        timeout: float,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._authn = client.AuthenticationV1Api(api)
        self._authz = client.AuthorizationV1Api(api)
        self._timeout = timeout
        self.accepted = _Answers(ttl, clock)  # 200 or 403: a token the API server knows
        self.unknown = _Answers(ttl, clock)  # 401
        self._reviews = asyncio.Semaphore(REVIEWS_AT_ONCE)

    async def status(self, token: str | None, path: str) -> int:
        """200 to serve, 401 without a valid token, 403 when not allowed, 503 when the API
        server cannot tell."""
        if not token:
            return 401
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        for answers in (self.accepted, self.unknown):
            if (cached := answers.get(key)) is not None:
                return cached
        try:
            async with self._reviews, asyncio.timeout(self._timeout):
                code = await self._review(token, path)
        except (TimeoutError, *API_EXCEPTIONS) as exc:
            error = translate(exc, "review a metrics client's token")
            log.warning("access review failed", path=path, reason=error.reason, error=str(error))
            return 503
        (self.unknown if code == 401 else self.accepted).put(key, code)
        return code

    async def _review(self, token: str, path: str) -> int:
        review = await self._authn.create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
        )
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return 401
        user = status.user
        access = await self._authz.create_subject_access_review(
            client.V1SubjectAccessReview(
                spec=client.V1SubjectAccessReviewSpec(
                    user=user.username,
                    uid=user.uid,
                    groups=user.groups,
                    extra=user.extra,
                    non_resource_attributes=client.V1NonResourceAttributes(path=path, verb="get"),
                )
            )
        )
        allowed = access.status is not None and access.status.allowed
        if not allowed:
            log.info("metrics client not allowed", path=path, user=user.username)
        return 200 if allowed else 403
