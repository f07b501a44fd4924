"""Finding a cluster's vLLM pods instead of listing them (``ClusterSettings.pods``), and its
EPP from its InferencePool (``ClusterSettings.inference_pool``: ``PoolFinder``).

From the A/AAAA records of a headless Service, as Prometheus's ``dns_sd_configs`` does, or
from the ready endpoints of a Service's EndpointSlices (a lister the app gives, over the
Kubernetes client it already has). The pods are looked up again every ``refresh`` (sooner
when a record's TTL says so); while a lookup fails the last pods found are kept, and the
failure is reported as the cluster's error ``discovery``. A record set larger than
``max_pods`` is cut to it and said so.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum

from controller.model import PodError, Reason
from controller.settings import InferencePoolRef, PodDiscovery
from controller.settings.schema import host_and_port
from controller.sources import dns

# (namespace, service) → the addresses of its ready endpoints
SliceLister = Callable[[str, str], Awaitable[list[str]]]


class Problem(StrEnum):
    """Why a pool gives no EPP to read: the first word of the cluster's error, to grep."""

    NO_POOL = "no_pool"  # no InferencePool of that name
    NO_EPP_REF = "no_endpoint_picker"  # the pool names no EPP, or one that is not a Service
    NO_SERVICE = "no_service"  # the Service it names does not exist
    NOT_PINNED = "not_the_service"  # it names another Service than inference_pool.service
    NO_SELECTOR = "no_selector"  # the Service selects no pods: hand-written endpoints
    EXTERNAL_NAME = "external_name"  # an ExternalName Service: refused, as the API says
    NO_METRICS_PORT = "no_metrics_port"  # the Service has no port of that name
    API = "api"  # the API could not be read


class PoolError(Exception):
    def __init__(self, problem: Problem, detail: str) -> None:
        super().__init__(f"{problem}: {detail}")
        self.problem = problem


# an InferencePool → its EPP's metrics URL, or PoolError (controller.kube.pools)
PoolLookup = Callable[[InferencePoolRef], Awaitable[str]]


class PoolFinder:
    """The EPP page of a cluster's InferencePool, looked up on every fetch (from the watched
    objects: no request). While the API cannot be read the URL found before is kept (the
    failure is the cluster's error ``discovery``, as for pods); a pool that no longer leads to
    an EPP leaves none to read, and says why (``inference_pool``)."""

    def __init__(self, ref: InferencePoolRef, lookup: PoolLookup | None) -> None:
        self._ref, self._lookup = ref, lookup
        self.url: str | None = None

    async def find(self) -> PodError | None:
        """Look the EPP up again (``url``); why it failed, if it did."""
        if self._lookup is None:
            self.url = None
            return PodError(self._ref.where, Reason.INFERENCE_POOL, "needs kubernetes.enabled")
        try:
            self.url = await self._lookup(self._ref)
        except PoolError as exc:
            if exc.problem is Problem.API:
                return PodError(self._ref.where, Reason.DISCOVERY, str(exc))
            self.url = None
            return PodError(self._ref.where, Reason.INFERENCE_POOL, str(exc))
        return None


class PodFinder:
    def __init__(
        self,
        settings: PodDiscovery,
        timeout: float,
        slices: SliceLister | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._timeout = timeout
        self._slices = slices
        self._clock = clock
        self._urls: list[str] = []
        self._due = 0.0
        self._error: PodError | None = None

    @property
    def where(self) -> str:
        s = self._settings
        if s.dns is not None:
            return f"dns:{s.dns}"
        assert s.endpoint_slices is not None
        return f"endpointslices:{s.endpoint_slices.namespace}/{s.endpoint_slices.service}"

    @property
    def tls_name(self) -> str | None:
        """What each pod's certificate is checked against (``pods.tls_name``)."""
        return self._settings.tls_name

    async def find(self) -> tuple[list[str], PodError | None]:
        """The pod URLs now, and why the last lookup failed (if it did)."""
        now = self._clock()
        if now < self._due:
            return self._urls, self._error
        try:
            addresses, ttl = await self._lookup()
        except dns.DNSError as exc:
            self._error = PodError(self.where, Reason.DISCOVERY, str(exc))
            self._due = now + min(self._settings.refresh, 5.0)  # try again soon
            return self._urls, self._error
        limit = self._settings.max_pods
        self._error = None
        if len(addresses) > limit:
            detail = f"{len(addresses)} addresses, more than pods.max_pods ({limit}): read {limit}"
            self._error = PodError(self.where, Reason.DISCOVERY, detail)
        self._urls = [self._url(address) for address in addresses[:limit]]
        refresh = self._settings.refresh if ttl is None else min(self._settings.refresh, ttl)
        self._due = now + max(1.0, refresh)
        return self._urls, self._error

    async def _lookup(self) -> tuple[list[str], float | None]:
        s = self._settings
        if s.endpoint_slices is not None:
            if self._slices is None:
                raise dns.DNSError("EndpointSlices need kubernetes.enabled")
            ref = s.endpoint_slices
            return sorted(await self._slices(ref.namespace, ref.service)), None
        assert s.dns is not None
        if s.nameserver is None:
            return await dns.system_lookup(s.dns, self._timeout)
        server = host_and_port(s.nameserver)  # ip:port, checked at start-up
        return await dns.direct_lookup(s.dns, server, self._timeout, s.max_pods + 1)

    def _url(self, address: str) -> str:
        s = self._settings
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
        return f"{s.scheme}://{host}:{s.port}{s.path}"
