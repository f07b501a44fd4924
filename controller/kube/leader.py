"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go's
``leaderelection`` package does it (tools/leaderelection/leaderelection.go), with a fence.

kubernetes-asyncio ships a leaderelection module, but it cannot tell a caller *now* whether it
still leads (it only runs callbacks), it takes whole seconds as its smallest period, and it
does not count lease transitions; so this is a small one of our own, following client-go:

- A follower takes the Lease when its holder has not renewed it for the **record's**
  ``leaseDurationSeconds`` (not our own setting: during a rolling update that changes it, the
  holder's promise is what counts), measured on the follower's own clock from when it *saw*
  the record change (no clock-skew trust). An empty holder (a released Lease) is free at once.
- ``leaseTransitions`` goes up by one whenever a replica that was not the holder takes the
  Lease (a released one included), and is kept on renewal.
- Writes are optimistic: replace with the read resourceVersion; a 409 means someone else won.
- The leader renews every ``retry_period``; a renewal that fails is retried every
  ``retry_period`` until ``renew_deadline`` after the last success, then leadership is lost.
- ``is_leader(margin)`` is true only while at least ``margin`` seconds remain before
  ``renew_deadline`` after the start of the last successful renewal. ``renew_deadline <
  lease_duration``, so a leader that cannot renew stops writing before any follower may take
  over, and a writer asks for ``api_timeout`` of margin so no write outlives the fence.
- Lease times are always written with six fractional digits (``micro_time``).
- On shutdown the leader releases the Lease (empty holder) so a follower takes over at once.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import Gauge

from controller.conditions import Conditions
from controller.kube.errors import (
    API_EXCEPTIONS,
    APIError,
    APINotFoundError,
    no_answer,
    translate,
)
from controller.kube.sdk import ApiException, client
from controller.settings import LeaderSettings

log = structlog.get_logger("controller.leader")


def _now() -> datetime:
    return datetime.now(UTC)


def micro_time(when: object) -> str | None:
    """A Lease time as the API server parses MicroTime: the fixed layout
    ``2006-01-02T15:04:05.000000Z07:00`` (k8s.io/apimachinery metav1.MicroTime, RFC3339Micro),
    six fractional digits always. ``datetime.isoformat()`` drops the fraction when the
    microseconds are 0, and the server answers 400 to that."""
    if when is None or isinstance(when, str):
        return when
    assert isinstance(when, datetime)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
        self._identity = settings.identity or socket.gethostname()  # as configured
        self.identity = self._identity
        self._gauge = gauge
        self._monotonic = monotonic
        self._valid_until = -math.inf
        self._observed: tuple[str | None, object, str | None] | None = None
        self._observed_at = -math.inf
        self._conditions = Conditions(log, repeat, monotonic)
        # the renewTimes our last writes of the Lease sent, answered or not (a reply lost
        # after the server applied it left our own renewal looking foreign: a review)
        self._sent: deque[str] = deque(maxlen=4)

    def is_leader(self, margin: float = 0.0) -> bool:
        """Leading, with at least ``margin`` seconds of the fence left."""
        return self._monotonic() + margin < self._valid_until

    async def run(self, stop: asyncio.Event) -> None:
        """Try to acquire or renew every ``retry_period`` until ``stop``; then release."""
        was_leader = False
        try:
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
        finally:
            if self._gauge is not None:  # however it ends, it no longer says it leads
                self._gauge.set(0)

    async def try_once(self) -> bool:
        """One try, for a single tick (``once --apply``), under an identity of this process's
        own: ``kubectl exec`` into the leading pod inherits its identity, and under it the
        running leader's Lease read as ours to renew, then to release (a review). Leading
        after it? A Lease another replica renewed lately stays theirs, as in ``run``; ``run``
        renews it through the tick, ``release`` gives it back."""
        self.identity = f"{self._identity}-once-{os.getpid()}"
        await self._attempt()
        return self.is_leader()

    @property
    def holder(self) -> str | None:
        """Who held the Lease when it was last read (``None``: no one, or never read)."""
        return self._observed[0] if self._observed is not None else None

    async def _attempt(self) -> None:
        """One try. A leader's is bounded by what is left of its fence (so a renewal keeps
        being retried until ``renew_deadline``, never cut short at ``retry_period``); a
        follower's by ``renew_deadline``."""
        started = self._monotonic()
        budget = self._settings.renew_deadline
        if self.is_leader():
            budget = self._valid_until - started
        try:
            async with asyncio.timeout(budget):
                if await self._try_acquire_or_renew():
                    self._valid_until = started + self._settings.renew_deadline
        except (TimeoutError, APIError) as exc:
            error = str(exc) or type(exc).__name__
            self._conditions.observe(
                "lease attempt failed", ("lease",), identity=self.identity, error=error
            )
        except Exception as exc:  # the elector outlives any one attempt
            # An attempt that raised what no API call should (a bug, an answer no check
            # foresaw) is a failed attempt: let out, it ended the elector's task for good while
            # the gauge kept saying it led (found by an attack). Retried, as client-go's
            # wait.Until recovers a panicking renewal; the fence stops the writes meanwhile.
            self._conditions.observe(
                "lease attempt failed",
                ("lease",),
                level="error",
                identity=self.identity,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
        else:
            self._conditions.clear(("lease",))

    async def _read(self) -> client.V1Lease:
        """The Lease. An answer that is no Lease (a proxy's page answered 200 during an API
        server's restart, ``{}``: the client fills a V1Lease with nothing) is a server error,
        as a LIST's is (``errors.list_of``): taken as it came, its missing ``metadata`` ended
        the elector's task for good (found by an attack)."""
        s = self._settings
        doing = f"get lease {s.namespace}/{s.lease_name}"
        try:
            lease = await self._api.read_namespaced_lease(s.lease_name, s.namespace)
        except API_EXCEPTIONS as exc:
            raise translate(exc, doing) from exc
        metadata = getattr(lease, "metadata", None)
        if not isinstance(lease, client.V1Lease) or not getattr(metadata, "resource_version", None):
            raise no_answer("Lease", lease, doing)
        return lease

    async def _try_acquire_or_renew(self) -> bool:
        s = self._settings
        try:
            lease = await self._read()
        except APINotFoundError:
            return await self._create()
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or None
        self._observe(holder, spec.renew_time, lease.metadata.resource_version)
        # The holder's own promise: the record's duration, from when we saw it renew.
        duration = spec.lease_duration_seconds or s.lease_duration
        valid = self._monotonic() - self._observed_at < duration
        if holder not in (None, self.identity) and valid:
            self._deposed()
            return False  # someone else holds it and has renewed recently enough
        mine = holder == self.identity
        if mine and valid and micro_time(spec.renew_time) not in self._sent:
            # held under our name, not written by us: two processes given one identity (a
            # shared config's leader_election.identity) both led, each taking the other's
            # renewal for its own (found by an attack). One we did not write is another
            # process's, or this pod's before a crash: waited out as any other holder's.
            self._conditions.observe(
                "lease held under this identity by another process",
                ("twin",),
                identity=self.identity,
                renewed=str(spec.renew_time),
            )
            self._deposed()
            return False
        self._conditions.clear(("twin",))
        return await self._replace(lease, spec, renewing=mine)

    def _deposed(self) -> None:
        """Another replica (or process under this identity) holds the Lease, as read: this one
        stops leading now, as client-go's
        ``IsLeader`` turns false the moment it observes another holder, not when its own
        fence runs out. Kept until then, a deleted or taken-over Lease had two replicas
        writing for up to ``renew_deadline`` (found by an attack). A failed write of the
        Lease (409) deposes no one: the next read says who holds it."""
        self._valid_until = -math.inf

    def _observe(self, holder: str | None, renewed: object, version: str | None) -> None:
        record = (holder, renewed, version)
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()

    def _body(self, acquired: object, transitions: int, version: str | None) -> Any:
        """A Lease as plain JSON: the client sends a dict as it is, while a V1Lease would
        serialize its times with ``isoformat()`` (no fraction when microseconds are 0)."""
        s = self._settings
        metadata: dict[str, Any] = {"name": s.lease_name, "namespace": s.namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(s.lease_duration)),
                "acquireTime": micro_time(acquired),
                "renewTime": self._renewal(),
                "leaseTransitions": transitions,
            },
        }

    def _renewal(self) -> str | None:
        """A renewTime to send, kept as this process's own before it is sent (a label someone
        adds changes no renewal)."""
        renewed = micro_time(_now())
        if renewed is not None:
            self._sent.append(renewed)
        return renewed

    async def _create(self) -> bool:
        s = self._settings
        try:
            await self._api.create_namespaced_lease(s.namespace, self._body(_now(), 0, None))
        except API_EXCEPTIONS as exc:
            if isinstance(exc, ApiException) and exc.status == 409:
                return False  # another replica created it first (the next read tells)
            raise translate(exc, f"create lease {s.namespace}/{s.lease_name}") from exc
        return True

    async def _replace(
        self, lease: client.V1Lease, spec: client.V1LeaseSpec, renewing: bool
    ) -> bool:
        s = self._settings
        # client-go: a renewal keeps acquireTime and the count; anyone else taking it —
        # from a holder that expired or from a released (empty) Lease — counts one more.
        transitions = (spec.lease_transitions or 0) + (0 if renewing else 1)
        acquired = (spec.acquire_time or _now()) if renewing else _now()
        body = self._body(acquired, transitions, lease.metadata.resource_version)
        try:
            await self._api.replace_namespaced_lease(s.lease_name, s.namespace, body)
        except API_EXCEPTIONS as exc:
            if isinstance(exc, ApiException) and exc.status == 409:
                # written since we read it: by whom, the next read tells (a label someone
                # added is no reason to stop leading: a review)
                return False
            raise translate(exc, f"update lease {s.namespace}/{s.lease_name}") from exc
        if not renewing:
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
                lease = await self._read()
                spec = lease.spec
                if spec is not None and spec.holder_identity == self.identity:
                    body = self._body(
                        spec.acquire_time,
                        spec.lease_transitions or 0,
                        lease.metadata.resource_version,
                    )
                    body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
                    await self._api.replace_namespaced_lease(s.lease_name, s.namespace, body)
                    log.info("lease released", identity=self.identity)
        except (*API_EXCEPTIONS, APIError, TimeoutError, ValueError) as exc:  # ValueError:
            # an answer the client could not decode, as in _attempt
            log.warning("could not release the lease", error=str(exc) or type(exc).__name__)
