"""Leader election on a ``coordination.k8s.io/v1`` Lease, the client-go way, with a fence.

kubernetes-asyncio ships a leaderelection module, but it cannot tell a caller *now* whether it
still leads (it only runs callbacks), it takes whole seconds as its smallest period, and it
does not count lease transitions; so this is a small one of our own.

- A follower takes the Lease when its holder has not renewed for ``lease_duration``, measured
  on the follower's own clock from when it *saw* the last change (no clock-skew trust).
- Writes are optimistic: replace with the read resourceVersion; a 409 means someone else won.
- ``is_leader()`` is true only until ``renew_deadline`` after the start of our last successful
  renewal. ``renew_deadline < lease_duration``, so a leader that cannot renew stops writing
  before any follower may take over.
- On shutdown the leader releases the Lease (empty holder) so a follower takes over at once.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Gauge

from controller.kube.errors import API_EXCEPTIONS, APIError, APINotFoundError, translate
from controller.logs import Conditions
from controller.settings import LeaderSettings

log = structlog.get_logger("controller.leader")


def _now() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        settings: LeaderSettings,
        gauge: Gauge | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        repeat: float = 300.0,
    ) -> None:
        self._api = client.CoordinationV1Api(api)
        self._settings = settings
        self.identity = settings.identity or socket.gethostname()
        self._gauge = gauge
        self._monotonic = monotonic
        self._valid_until = -math.inf
        self._observed: tuple[str | None, object, str | None] | None = None
        self._observed_at = -math.inf
        self._conditions = Conditions(log, repeat, monotonic)

    def is_leader(self) -> bool:
        return self._monotonic() < self._valid_until

    async def run(self, stop: asyncio.Event) -> None:
        """Try to acquire or renew every ``retry_period`` until ``stop``; then release."""
        was_leader = False
        while not stop.is_set():
            await self._attempt()
            leading = self.is_leader()
            if leading and not was_leader:
                log.info("leadership acquired", identity=self.identity)
            elif was_leader and not leading:
                log.warning("leadership lost", identity=self.identity)
            was_leader = leading
            if self._gauge is not None:
                self._gauge.set(float(leading))
            try:
                async with asyncio.timeout(self._settings.retry_period):
                    await stop.wait()
            except TimeoutError:
                pass
        await self.release()

    async def _attempt(self) -> None:
        started = self._monotonic()
        try:
            async with asyncio.timeout(self._settings.retry_period):
                if await self._try_acquire_or_renew():
                    self._valid_until = started + self._settings.renew_deadline
        except (TimeoutError, APIError) as exc:
            error = str(exc) or type(exc).__name__
            self._conditions.observe(
                "lease attempt failed", ("lease",), identity=self.identity, error=error
            )
        else:
            self._conditions.clear(("lease",))

    async def _try_acquire_or_renew(self) -> bool:
        s = self._settings
        try:
            lease = await self._api.read_namespaced_lease(s.lease_name, s.namespace)
        except API_EXCEPTIONS as exc:
            error = translate(exc, f"get lease {s.namespace}/{s.lease_name}")
            if isinstance(error, APINotFoundError):
                return await self._create()
            raise error from exc
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or None
        self._observe(holder, spec.renew_time, lease.metadata.resource_version)
        fresh = self._monotonic() - self._observed_at < s.lease_duration
        if holder not in (None, self.identity) and fresh:
            return False  # someone else holds it and has renewed recently enough
        return await self._replace(lease, spec, taking_over=holder != self.identity)

    def _observe(self, holder: str | None, renewed: object, version: str | None) -> None:
        record = (holder, renewed, version)
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()

    def _spec(self, acquired: datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=max(1, math.ceil(self._settings.lease_duration)),
            acquire_time=acquired,
            renew_time=_now(),
            lease_transitions=transitions,
        )

    async def _create(self) -> bool:
        s = self._settings
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=s.lease_name, namespace=s.namespace),
            spec=self._spec(_now(), 0),
        )
        try:
            await self._api.create_namespaced_lease(s.namespace, body)
        except API_EXCEPTIONS as exc:
            if isinstance(exc, ApiException) and exc.status == 409:
                return False  # another replica created it first
            raise translate(exc, f"create lease {s.namespace}/{s.lease_name}") from exc
        return True

    async def _replace(
        self, lease: client.V1Lease, spec: client.V1LeaseSpec, taking_over: bool
    ) -> bool:
        s = self._settings
        transitions = (spec.lease_transitions or 0) + (
            1 if taking_over and spec.holder_identity else 0
        )
        acquired = _now() if taking_over else (spec.acquire_time or _now())
        lease.spec = self._spec(acquired, transitions)
        try:
            await self._api.replace_namespaced_lease(s.lease_name, s.namespace, lease)
        except API_EXCEPTIONS as exc:
            if isinstance(exc, ApiException) and exc.status == 409:
                return False  # written by someone else since we read it
            raise translate(exc, f"update lease {s.namespace}/{s.lease_name}") from exc
        if taking_over:
            log.info("lease taken", identity=self.identity, previous=spec.holder_identity)
        return True

    async def release(self) -> None:
        """Give the Lease up so a follower need not wait out ``lease_duration``."""
        if not self.is_leader():
            return
        self._valid_until = -math.inf
        if self._gauge is not None:
            self._gauge.set(0)
        s = self._settings
        try:
            async with asyncio.timeout(2):
                lease = await self._api.read_namespaced_lease(s.lease_name, s.namespace)
                if lease.spec is not None and lease.spec.holder_identity == self.identity:
                    lease.spec.holder_identity = ""
                    lease.spec.lease_duration_seconds = 1
                    await self._api.replace_namespaced_lease(s.lease_name, s.namespace, lease)
                    log.info("lease released", identity=self.identity)
        except API_EXCEPTIONS as exc:
            log.warning("could not release the lease", error=str(exc) or type(exc).__name__)
