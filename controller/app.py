"""Wiring: one ClientSession, a source per cluster, the reconciler, the HTTP server, and an
ordered shutdown (stop ticking → short grace → cancel → close server and session)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import signal
import ssl
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

import aiohttp
import structlog

from controller import exposition, server
from controller.addresses import TenantAddresses
from controller.exporter import CacheCollector, make_registry
from controller.kube import client as kube_client
from controller.kube.access import AccessReviewer
from controller.kube.discovery import TargetDiscovery
from controller.kube.endpoints import slice_lister
from controller.kube.errors import APIGate
from controller.kube.informer import CoreObjects, Lister
from controller.kube.leader import LeaderElector
from controller.kube.pools import PoolResolver
from controller.kube.sdk import client as kube_sdk
from controller.publish import Publisher
from controller.publish.configured import implicit
from controller.publish.dryrun import DryRun
from controller.publish.kubernetes import KubernetesPublisher
from controller.reconcile.fleet import opt_outs
from controller.reconcile.loop import Reconciler
from controller.settings import ClusterSettings, Settings
from controller.settings.schema import host_and_port
from controller.sources import ClusterMetricsSource
from controller.sources.dns import GuardedResolver
from controller.sources.limiter import Limiter
from controller.sources.page import EPP_EXTRACTOR, pod_extractors
from controller.sources.prometheus import prometheus_source, shared_queriers
from controller.sources.scrape import ScrapeSource, SharedPages
from controller.state import Snapshot, TickReport

log = structlog.get_logger("controller.app")

# SIGTERM → the tick in flight gets this long to finish before it is cancelled; the rest of
# shutdown (server, sessions) takes well under a second, so the process exits within 5 s.
SHUTDOWN_GRACE = 2.0
# How often the serving certificate's files are checked for a rotation.
CERT_CHECK_SECONDS = 60.0
# Python's cyclic collector, for a process that allocates a page's samples by the hundred and
# keeps almost none of them. A young pass costs what is still alive, not what was allocated, so
# rarer passes cost less in all; and what start-up loaded (modules, clients, settings) is never
# garbage, so gc.freeze() takes it out of every later pass (docs.python.org/3/library/gc.html).
# What the defaults cost the daemon, and what this saves, is measured in benchmarks/README.md.
GC_THRESHOLD = (10_000, 10, 10)


class MakeSource(Protocol):
    """A cluster's source; ``defined``: a cluster objects define (a tenant's)."""

    def __call__(self, cluster: ClusterSettings, defined: bool = False) -> ClusterMetricsSource: ...


def source_factory(
    settings: Settings,
    session: aiohttp.ClientSession,
    clock: Callable[[], float],
    api: kube_client.ApiClient | None = None,
    pools: PoolResolver | None = None,
    shared: SharedPages | None = None,
    querying: aiohttp.ClientSession | None = None,
    tenants: aiohttp.ClientSession | None = None,
    theirs: SharedPages | None = None,
) -> MakeSource:
    """``shared``: where a page several clusters read is fetched once a tick (a Ray node's,
    one cluster per model); one of its own when not given. ``querying``: the session PromQL
    sources ask through, apart from the pages' (``_query_connector``); ``session`` if not
    given. ``tenants``: the session of clusters annotations define (``defined``), whose
    every address is checked when dialled (``_tenant_connector``), with pages shared among
    them alone: neither a DNS answer, a pooled connection nor a page of the operator's
    clusters is a tenant's (a review: a tenant's name, dialled after a configured
    cluster's, read a loopback page through the configured cluster's cache)."""
    # One limiter for every page of every cluster: bounded, clusters served in the order
    # their fetches began (sources/limiter.py), so one big cluster's pages queue among the
    # others' instead of starving them.
    # a first page waits at most half a request's timeout, and never past a quarter of the
    # interval (a timeout near the interval would leave no time after it in the tick)
    grace = min(settings.scrape.timeout / 2, settings.interval / 4)
    limiter = Limiter(settings.scrape.max_concurrency, grace=grace)
    shared = shared or SharedPages()
    theirs = theirs or SharedPages()
    queries, scrape = settings.prometheus_queries, settings.scrape
    querying = querying or session
    queriers = shared_queriers(settings.queriers, queries, scrape, querying)
    engines = settings.engine_table()

    def make(cluster: ClusterSettings, defined: bool = False) -> ClusterMetricsSource:
        if cluster.prometheus is not None:
            return prometheus_source(cluster, queries, scrape, querying, queriers, clock)
        timeout = settings.cluster_timeout(cluster)
        slices = slice_lister(api, settings.kubernetes.api_timeout) if api is not None else None
        return ScrapeSource(
            cluster,
            scrape,
            timeout,
            tenants if defined and tenants is not None else session,
            clock,
            limiter,
            slices,
            engines=engines,
            pools=pools,
            shared=theirs if defined else shared,
        )

    return make


def _connector(settings: Settings) -> aiohttp.TCPConnector:
    # As many connections as pages may be read at once (scrape.max_concurrency), kept alive
    # where the server allows (an EPP), and 8 spare (a connection closing while the next page
    # opens one); PromQL sources have their own
    # (``_query_connector``), the Kubernetes client its own session. vLLM closes an idle
    # connection after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so at a 10 s interval each of its
    # pages opens one.
    # An idle connection is kept for two intervals, so a pod that keeps it that long (vLLM
    # with VLLM_HTTP_TIMEOUT_KEEP_ALIVE above the interval) is read on it next tick
    # (benchmarks/HISTORY.md measures what that saves).
    limit = settings.scrape.max_concurrency + 8
    return aiohttp.TCPConnector(
        limit=limit, limit_per_host=0, ttl_dns_cache=60, keepalive_timeout=2 * settings.interval
    )


def _tenant_connector(settings: Settings, tenants: TenantAddresses) -> aiohttp.TCPConnector:
    """The connections of clusters annotations define, apart from the operator's: every
    address their names resolve to is checked before it is dialled (``GuardedResolver``);
    a name is text until then. Bounded by the pages' limiter, as the pages' own are."""
    return aiohttp.TCPConnector(
        limit=settings.scrape.max_concurrency + 8,
        limit_per_host=0,
        ttl_dns_cache=60,
        keepalive_timeout=2 * settings.interval,
        resolver=GuardedResolver(tenants.refusal),
    )


def _query_connector(settings: Settings) -> aiohttp.TCPConnector:
    """PromQL sources' own connections, apart from the pages': 32 pods that hang held every
    connection of a shared pool, and a sane querier's queries timed out waiting for one
    (found by an attack). Unbounded here, bounded by the config: a querier asks its twelve
    queries once a round, a cluster with its own querier the same."""
    return aiohttp.TCPConnector(
        limit=0, limit_per_host=0, ttl_dns_cache=60, keepalive_timeout=2 * settings.interval
    )


def _session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        headers={"User-Agent": "weight-controller"},
        # every request runs under its own deadline (sources.http); aiohttp's default
        # (300 s) would only add a second timer to each
        timeout=aiohttp.ClientTimeout(total=None),
        # Stateless, as Prometheus's scrapes are: an OpenShift route sets a sticky-session
        # cookie by default, and sent back it would pin every later read of that route to
        # one pod behind it. No jar also spares a lookup per request (benchmarks/HISTORY.md).
        cookie_jar=aiohttp.DummyCookieJar(),
    )


class Controller:
    """The running controller. ``async with Controller(settings) as c: await c.run(stop)``."""

    def __init__(
        self,
        settings: Settings,
        publisher: Publisher | None = None,
        clock: Callable[[], float] = time.time,
        serve: bool = True,
        on_tick: Callable[[TickReport], None] | None = None,
        dry_run: bool = False,
        api: kube_client.ApiClient | None = None,
    ) -> None:
        """``api`` replaces the in-cluster/kubeconfig client (tests point it at loopback)."""
        self._on_tick = on_tick
        self.settings = settings
        self._publisher_override = publisher
        self._dry_run = dry_run
        self._api = api
        self._owns_api = api is None
        self.leader: LeaderElector | None = None
        self.publisher: Publisher = publisher or implicit(c.name for c in settings.clusters)
        self.snapshot = Snapshot(dry_run=dry_run)
        self._engines = tuple(settings.engine_table().values())
        self.registry, self.metrics = make_registry(self.snapshot)
        self.caches = CacheCollector(
            {
                "labels_vllm": lambda: (
                    sum(e.cached_entries for e in pod_extractors(self._engines)),
                    sum(e.cached_bytes for e in pod_extractors(self._engines)),
                ),
                "labels_epp": lambda: (EPP_EXTRACTOR.cached_entries, EPP_EXTRACTOR.cached_bytes),
            }
        )
        self.registry.register(self.caches)
        self.metrics.interval.set(settings.interval)
        self._clock = clock
        self._serve = serve
        self._session: aiohttp.ClientSession | None = None  # pages
        self._querying: aiohttp.ClientSession | None = None  # PromQL sources
        self._tenants: aiohttp.ClientSession | None = None  # clusters objects define
        self._runner: server.Serving | None = None
        self._probe_runner: server.Serving | None = None
        self.probe_port: int | None = None
        self._discovery: TargetDiscovery | None = None
        self._pools: PoolResolver | None = None
        # a page several clusters read (a Ray node's, one cluster per model), once a tick
        self._shared = SharedPages()
        self._tenant_pages = SharedPages()  # the pages of clusters objects define
        self.port: int | None = None
        self.reconciler: Reconciler | None = None
        self._certificate: server.ServingCertificate | None = None
        self._cert_watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Controller:
        self._addresses = TenantAddresses(self.settings.kubernetes.annotation_urls)
        self._session = _session(_connector(self.settings))
        self._tenants = _session(_tenant_connector(self.settings, self._addresses))
        self._querying = _session(_query_connector(self.settings))
        try:
            await self._connect_kubernetes()
            self._pools = self._pool_resolver()
        except BaseException:
            await self._session.close()
            await self._tenants.close()
            await self._querying.close()
            raise
        self._warn_about_opt_outs()
        make_source = source_factory(
            self.settings,
            self._session,
            self._clock,
            self._api,
            self._pools,
            self._shared,
            self._querying,
            self._tenants,
            self._tenant_pages,
        )
        self.reconciler = Reconciler(
            self.settings,
            [make_source(cluster) for cluster in self.settings.clusters],
            self.publisher,
            self.metrics,
            self.snapshot,
            self._clock,
            self._on_tick,
            lambda cluster: make_source(cluster, defined=True),  # the clusters objects define
        )
        if self._serve:
            try:
                await self._start_server()
            except BaseException:
                await self._close_clients()  # __aexit__ does not run when __aenter__ fails
                raise
        return self

    def _warn_about_opt_outs(self) -> None:
        """Risks an operator chose: said once at start-up, and kept visible as a gauge."""
        for cluster in self.settings.clusters:
            opt_outs(cluster, self.metrics)

    async def _start_server(self) -> None:
        bind = self.settings.server
        authorize = None
        if bind.authenticate:
            if self._api is None:
                self._api = await kube_client.api_client(self.settings.kubernetes)
            reviewer = AccessReviewer(self._api, self.settings.kubernetes.api_timeout)
            authorize = reviewer.status
            self.caches.caches["access_accepted"] = lambda: (len(reviewer.accepted), None)
            self.caches.caches["access_unknown"] = lambda: (len(reviewer.unknown), None)
        tls = None
        if bind.tls_cert_file is not None and bind.tls_key_file is not None:
            self._certificate = server.ServingCertificate(bind.tls_cert_file, bind.tls_key_file)
            tls = self._certificate.context
            self._cert_watch = asyncio.create_task(self._watch_certificate(), name="cert-watch")
        connections = server.Connections(
            on_change=self.metrics.server_connections.set,
            on_close=lambda reason: self.metrics.server_closed.labels(reason).inc(),
        )
        app = server.make_app(
            self.registry, self.snapshot, self.settings.interval, authorize, connections
        )
        self._runner, self.port = await server.start(app, bind.host, bind.port, tls)
        if bind.probe_bind is not None:  # the kubelet's: plain HTTP, never a token
            host, port = host_and_port(bind.probe_bind)
            probes = server.make_probe_app(self.snapshot, self.settings.interval)
            self._probe_runner, self.probe_port = await server.start(probes, host, port)
        scheme = "https" if tls is not None else "http"
        log.info(
            "serving",
            address=f"{scheme}://{bind.host}:{self.port}",
            authenticate=bind.authenticate,
            probes=f"http://{bind.probe_bind}" if bind.probe_bind else None,
        )

    async def _watch_certificate(self) -> None:
        """Pick up a rotated serving certificate for new connections."""
        assert self._certificate is not None
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            try:
                if self._certificate.reload():
                    log.info("serving certificate reloaded")
            except (OSError, ssl.SSLError) as exc:  # mid-rotation: keep the old one
                log.warning("serving certificate not reloaded", error=str(exc))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._cert_watch is not None:
            self._cert_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cert_watch
        for serving in (self._runner, self._probe_runner):
            if serving is not None:
                await serving.cleanup()
        await self._close_clients()

    async def _connect_kubernetes(self) -> None:
        """The API client, the leader elector and the Kubernetes publisher, when configured."""
        kube, election = self.settings.kubernetes, self.settings.leader_election
        if not (kube.enabled or election.enabled) or self._publisher_override is not None:
            self.metrics.leader.set(1)
            return
        if self._api is None:
            self._api = await kube_client.api_client(kube)
        if election.enabled and self._dry_run:
            # A shadow never writes, so it takes no Lease either: it sends only GETs and LISTs.
            log.info("dry run: not taking part in leader election")
            is_leader = _always
        elif election.enabled:
            self.leader = LeaderElector(
                self._api, election, self.metrics.leader, repeat=self.settings.log.repeat_interval
            )
            is_leader = self.leader.is_leader
        else:
            self.metrics.leader.set(1)  # a single replica is its own leader
            is_leader = _always
        if kube.enabled:
            # a dry run sends only GETs and LISTs: it writes nothing through the publisher,
            # and posts no Event either (it counted as the leader: an attack saw a Warning)
            writes = _never if self._dry_run else is_leader
            writer = KubernetesPublisher(
                self.settings, self._api, self.metrics, writes, tenants=self._addresses
            )
            self._discovery = writer.discovery
            self.publisher = DryRun(writer) if self._dry_run else writer

    def _pool_resolver(self) -> PoolResolver | None:
        """InferencePools and their EPP Services, watched in the pools' namespaces through the
        API client (its own throttle gate: a pool lookup never waits behind a write)."""
        kube = self.settings.kubernetes
        if self._api is None or all(c.inference_pool is None for c in self.settings.clusters):
            return None
        custom, core = kube_sdk.CustomObjectsApi(self._api), CoreObjects(self._api)
        lister = Lister(custom, kube.api_timeout, kube.watch, APIGate(), kube.watch_idle, core)
        return PoolResolver(lister)

    async def _close_clients(self) -> None:
        if self._discovery is not None:  # its watches, before the client they use
            await self._discovery.close()
        if self._pools is not None:
            await self._pools.close()
        await self._shared.close()  # its fetches in flight, before the session they use
        await self._tenant_pages.close()
        if self._api is not None and self._owns_api:
            await self._api.close()
        if self._session is not None:
            await self._session.close()
        if self._querying is not None:
            await self._querying.close()
        if self._tenants is not None:
            await self._tenants.close()

    async def once(self) -> TickReport:
        """One tick. With leader election on (``once --apply``), it writes only holding the
        Lease, as a replica of ``run`` would: taken for the tick if no other replica renewed
        it lately, then given back; else the writes are ``follower``'s, and said why."""
        assert self.reconciler is not None, "use inside 'async with'"
        if self.leader is None:
            return await self.reconciler.tick()
        margin = self.settings.kubernetes.api_timeout
        stop, renewing = asyncio.Event(), None
        if await self.leader.try_once() and self.leader.is_leader(margin):
            # renewed through the tick, as ``run`` renews it: a slow tick's writes came after
            # the fence, and were ``follower``'s unsaid (a review)
            renewing = asyncio.create_task(self.leader.run(stop), name="leader-election")
        else:
            election = self.settings.leader_election
            log.warning(
                "not the leader: nothing will be written",
                lease=f"{election.namespace}/{election.lease_name}",
                holder=self.leader.holder,
                identity=self.leader.identity,
            )
        try:
            return await self.reconciler.tick()
        finally:
            stop.set()
            if renewing is not None:
                await renewing  # and released
            else:
                await self.leader.release()

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile until ``stop`` is set, then give the tick in flight a short grace."""
        assert self.reconciler is not None, "use inside 'async with'"
        # The elector stops only after the loop: no write can follow the Lease's release.
        elector_stop = asyncio.Event()
        elector = None
        if self.leader is not None:
            elector = asyncio.create_task(self.leader.run(elector_stop), name="leader-election")
        try:
            await self._run_loop(stop)
        finally:
            elector_stop.set()
            if elector is not None:
                try:
                    await asyncio.wait_for(elector, SHUTDOWN_GRACE)
                except TimeoutError:  # cancelled by wait_for: the fence expires on its own
                    log.warning("lease not released in time")

    async def _run_loop(self, stop: asyncio.Event) -> None:
        assert self.reconciler is not None
        task = asyncio.create_task(self.reconciler.run(stop), name="reconcile-loop")
        stopper = asyncio.create_task(stop.wait(), name="stop-wait")
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            log.info("stopping", grace_seconds=SHUTDOWN_GRACE)
            try:
                await asyncio.wait_for(asyncio.shield(task), SHUTDOWN_GRACE)
            except TimeoutError:
                log.info("tick still running at the end of the grace; cancelled")
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not task.cancelled():
            task.result()  # surface a crash of the loop itself (it catches per tick)


OPEN_FILES = 65536

# SIGHUP stops the daemon as SIGTERM does (the tick in flight finishes, the Lease is released,
# exit 0) instead of killing it: the settings are read once, so a "reload" is a restart, which
# Kubernetes does when the process exits.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def stopping(signum: signal.Signals) -> None:
        if signum is signal.SIGHUP:
            note = "settings are read at start-up: SIGHUP stops, a restart reads them again"
            log.info("signal received", signal=signum.name, note=note)
        else:
            log.info("signal received", signal=signum.name)
        stop.set()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stopping, signum)


def _always(margin: float = 0.0) -> bool:
    return True


def _never(margin: float = 0.0) -> bool:
    return False


def raise_open_file_limit() -> None:
    """The soft limit on open files up to the hard one (at most 65,536), as Go's runtime does
    since 1.19: the default soft 1,024 is shared by the server's connections (bounded by
    ``server.MAX_CONNECTIONS``), every page in flight and the API client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def settle_collector() -> None:
    """Once start-up is done: what exists now is kept for good, so the collector stops
    looking at it, and young passes come ``GC_THRESHOLD[0]`` new containers apart."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class CollectorSettler:
    """Called after each tick: once the label caches have grown to the fleet
    (``exposition._Kept``: a Ray node's lines are its own, so 200 nodes hold ~180,000 label
    sets and heads) and a tick went by without them dropping anything, what they hold is
    kept for good: the process unfrozen, collected once and frozen again, as start-up's is
    (so a cycle an earlier freeze caught in flight is collected then). Else every full pass
    of the collector walks all of them: over 200 Ray nodes, in turns with it off, 4.14–4.38
    against 4.51–4.53 ms a node page (benchmarks/HISTORY.md). Once per growth, a handful in
    a process's life; what the caches drop later is freed by its reference count (label sets
    hold no cycles)."""

    def __init__(self) -> None:
        self._settled = exposition.growths
        self._rotations = exposition.rotations

    def __call__(self, report: TickReport | None = None) -> None:
        grown, still = exposition.growths != self._settled, exposition.rotations == self._rotations
        if grown and still:  # and what an earlier freeze kept that is garbage now
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._settled = exposition.growths
        self._rotations = exposition.rotations


async def serve_forever(settings: Settings, dry_run: bool = False) -> None:
    stop = asyncio.Event()
    install_signal_handlers(stop)
    server.AcceptErrors(log).install(asyncio.get_running_loop())
    raise_open_file_limit()
    async with Controller(settings, dry_run=dry_run, on_tick=CollectorSettler()) as controller:
        settle_collector()
        await controller.run(stop)
    log.info("stopped")


__all__ = ["Controller", "serve_forever"]
