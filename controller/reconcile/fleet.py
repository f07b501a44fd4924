"""The clusters the loop reads, and what it remembers of each between ticks.

A source per cluster: the configured ones, and the ones objects define (ExternalProviders with
metrics annotations), followed as discovery finds them. Per cluster, its health (hysteresis in
``controller.health``), its signal memory (``controller.signals``) and its arrivals
(``realised``); a cluster no longer referenced is forgotten whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from controller import health, signals
from controller.metrics import ControllerMetrics
from controller.model import ClusterHealth, ClusterMetrics, Signals
from controller.reconcile.realised import Arrivals
from controller.settings import ClusterSettings, Settings
from controller.sources import ClusterMetricsSource
from controller.state import ClusterView

log = structlog.get_logger("controller.fleet")

SourceFactory = Callable[[ClusterSettings], ClusterMetricsSource]


def opt_outs(cluster: ClusterSettings, metrics: ControllerMetrics) -> None:
    """The risks a cluster's settings take (TLS unverified, a bearer token over plain http):
    said when it is first read, configured or defined by a tenant's annotations (which set
    no gauge before: an attack), and kept visible as ``weight_controller_cluster_insecure``."""
    if cluster.tls_insecure_skip_verify:
        metrics.insecure.labels(cluster.name, "tls_unverified").set(1)
        log.warning("tls verification off", cluster=cluster.name)
    plain = [host for host, scheme in cluster.tokened() if scheme == "http"]
    if cluster.allow_token_over_http and plain:
        metrics.insecure.labels(cluster.name, "token_over_http").set(1)
        log.warning("bearer token over plain http", cluster=cluster.name, hosts=plain)
    elif cluster.token_over_cluster_network and plain:
        metrics.insecure.labels(cluster.name, "token_in_cluster").set(1)
        log.warning("bearer token over the cluster network", cluster=cluster.name, hosts=plain)


class Fleet:
    def __init__(
        self,
        settings: Settings,
        sources: Iterable[ClusterMetricsSource],
        metrics: ControllerMetrics,
        factory: SourceFactory | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._factory = factory
        self._sources = {source.cluster: source for source in sources}
        self._static = set(self._sources)
        self._defined: dict[str, ClusterSettings] = {}
        self._last: dict[str, ClusterMetrics] = {}
        self._health: dict[str, ClusterHealth] = {}
        self._memory: dict[str, signals.SignalMemory] = {}
        self.arrivals = Arrivals()
        for name in self._sources:
            metrics.add_cluster(name)

    @property
    def sources(self) -> Mapping[str, ClusterMetricsSource]:
        return self._sources

    def follow(self, clusters: Sequence[ClusterSettings]) -> None:
        """Read the clusters objects define now (beyond the configured ones), and only those."""
        defined = {c.name: c for c in clusters if c.name not in self._static}
        if defined == self._defined or self._factory is None:
            return
        for name in self._defined.keys() - defined.keys():
            log.info("cluster no longer referenced", cluster=name)
            self._forget(name)
        for name, cluster in defined.items():
            if self._defined.get(name) != cluster:
                log.info("watching cluster defined by annotations", cluster=name)
                self._sources[name] = self._factory(cluster)
                self._metrics.add_cluster(name)
                self._metrics.insecure.remove_by_labels({"cluster": name})
                opt_outs(cluster, self._metrics)
        self._defined = defined

    def _forget(self, name: str) -> None:
        self._metrics.remove_cluster(name)
        self._sources.pop(name, None)
        self._last.pop(name, None)
        self._health.pop(name, None)
        self._memory.pop(name, None)
        self.arrivals.forget(name)

    def judge(self, metrics: ClusterMetrics, now: float) -> ClusterHealth:
        """The cluster's health after this fetch; its signal memory and arrivals follow it."""
        name = metrics.cluster
        settings = self._settings
        after = health.judge(self._health.get(name), metrics, settings.health, now)
        self._last[name] = metrics
        self._health[name] = after
        self.arrivals.count(name, metrics)
        smoothing = settings.weights.demand_smoothing
        self._memory[name] = signals.remember(self._memory.get(name), metrics, after, smoothing)
        return after

    def signals(self) -> dict[str, Signals | None]:
        """What the laws read of each judged cluster this tick (``None``: unusable)."""
        params = self._settings.weights
        result: dict[str, Signals | None] = {}
        for name, state in self._health.items():
            fresh = state.metrics is self._last.get(name)  # read this tick: its arrivals count
            arrived = self.arrivals.latest.get(name) if fresh else None
            result[name] = signals.derive(state, self._memory.get(name), params, arrived)
        return result

    def views(self, shares: Mapping[str, int | None]) -> dict[str, ClusterView]:
        """Every cluster as this tick left it, with its share in the only target."""
        return {
            name: ClusterView(self._last.get(name), self._health.get(name), shares.get(name))
            for name in self._sources
        }
