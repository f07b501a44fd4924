"""The process's own counters and histograms: what the controller does, as it does it.

Low in the layers so that the loop, the publisher and discovery may count what they do; what the
controller last saw and decided is not here but in ``state`` (mirrored by ``exporter``).
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller import __version__
from controller.model import ClusterMetrics, Write

PREFIX = "weight_controller"
API_ERROR_REASONS = (
    "not_found",
    "conflict",
    "invalid",
    "schema",
    "forbidden",
    "server_error",
    "unavailable",
    "api_timeout",
    "throttled",
    "error",
)


class _Factory:
    """Metrics of one registry, named with our prefix."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(f"{PREFIX}_{name}", doc, list(labels), registry=self._registry)

    def gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(f"{PREFIX}_{name}", doc, list(labels), registry=self._registry)

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"{PREFIX}_{name}", doc, buckets=buckets, registry=self._registry)


class ControllerMetrics:
    """The process's own counters and histograms, registered in a private registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        new = _Factory(registry)
        self._pages: dict[str, Counter] = {}  # each cluster's pages counter, looked up once
        # Fleet-wide: a histogram per cluster would be 14 series each (most of the page at a
        # few hundred clusters); each cluster's last fetch time is a gauge in the state instead.
        self.scrape_duration = new.histogram(
            "scrape_duration_seconds",
            "Time to fetch all of a cluster's pages in one tick, over every cluster.",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.scrape_errors = new.counter(
            "scrape_errors_total",
            "Pages (or whole clusters) that gave no usable data, by reason.",
            "cluster",
            "reason",
        )
        self.scrape_pages = new.counter(
            "scrape_pages_total",
            "Pages (or PromQL queries) fetched, failed or not: with scrape_errors_total, the "
            "share of a cluster's pages that fail.",
            "cluster",
        )
        self.invalid_samples = new.counter(
            "invalid_samples_total",
            "Samples ignored: KV-cache values NaN, infinite or outside 0..1, and lines skipped "
            "as not values (a NaN timestamp, a bucket whose le bounds nothing, a native "
            "histogram).",
            "cluster",
        )
        self.duplicate_samples = new.counter(
            "duplicate_samples_total",
            "Samples dropped because their series had already appeared on the same page (the "
            "first is kept, as Prometheus keeps it).",
            "cluster",
        )
        self.reconcile_duration = new.histogram(
            "reconcile_duration_seconds",
            "Duration of one reconcile tick: fetch, judge, weigh, publish.",
            (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.interval = new.gauge(
            "interval_seconds",
            "The configured reconcile interval: what a tick's duration is measured against.",
        )
        self.last_reconcile = new.gauge(
            "last_reconcile_timestamp_seconds", "Unix time the last reconcile tick finished."
        )
        self.reconcile_errors = new.counter(
            "reconcile_errors_total",
            "Ticks (or parts of ticks) that raised an unexpected exception.",
            "stage",
        )
        self._publishing(new)
        self.health_transitions = new.counter(
            "health_transitions_total", "Clusters turning healthy or unhealthy.", "cluster", "to"
        )
        build = new.gauge(
            "build_info",
            "Always 1; labels say which build is running.",
            "version",
            "python_version",
        )
        build.labels(__version__, platform.python_version()).set(1)

    def _publishing(self, new: _Factory) -> None:
        self.target_writes = new.counter(
            "target_writes_total",
            "Attempts to make a target hold new weights, by result (would: dry run).",
            "target",
            "result",
        )
        self.schema_rejections = new.counter(
            "schema_rejections_total",
            "Writes the API server refused because the object broke the CRD's schema, by the "
            "field it named. Not retried until the decision changes.",
            "target",
            "field",
        )
        self.api_errors = new.counter(
            "api_errors_total", "Kubernetes API calls that failed, by reason.", "reason"
        )
        for reason in API_ERROR_REASONS:
            self.api_errors.labels(reason)
        self.insecure = new.gauge(
            "cluster_insecure",
            "1 for a risk an operator opted into for a cluster: TLS not verified "
            "(tls_insecure_skip_verify), or a bearer token over plain http.",
            "cluster",
            "risk",
        )
        self.leader = new.gauge("leader", "1 while this replica holds the Lease and may write.")
        self.server_connections = new.gauge(
            "server_connections", "Connections open to our own HTTP server (probes, scrapers)."
        )
        self.server_closed = new.counter(
            "server_connections_closed_total",
            "Connections our server closed itself, by reason: limit (too many open: the oldest "
            "without a request, else the one idle longest after its answer, made room, or the "
            "newcomer was closed), header_timeout (no TLS handshake and whole request in time).",
            "reason",
        )
        for reason in ("limit", "header_timeout"):
            self.server_closed.labels(reason)

    def add_cluster(self, cluster: str) -> None:
        """Create every labelled series at 0, so rate() and alerts see them from the start."""
        for to in ("healthy", "unhealthy"):
            self.health_transitions.labels(cluster, to)
        self._pages[cluster] = self.scrape_pages.labels(cluster)
        self.invalid_samples.labels(cluster)
        self.duplicate_samples.labels(cluster)

    def remove_cluster(self, cluster: str) -> None:
        """A cluster no longer read (an ExternalProvider that defined it gone or renamed):
        its series go with it, else a tenant renaming its providers grows /metrics without
        end (found by an attack: 230 KB to 1.5 MB with 51 clusters live)."""
        for metric in (
            self.scrape_errors,
            self.scrape_pages,
            self.health_transitions,
            self.invalid_samples,
            self.duplicate_samples,
            self.insecure,
        ):
            metric.remove_by_labels({"cluster": cluster})
        self._pages.pop(cluster, None)

    def remove_target(self, target: str) -> None:
        """A target gone (its object deleted, or no longer opted in): its series with it."""
        for metric in (self.target_writes, self.schema_rejections):
            metric.remove_by_labels({"target": target})

    def add_target(self, target: str) -> None:
        for result in Write:
            if result not in (Write.NONE, Write.FOLLOWER):
                self.target_writes.labels(target, result.value)

    def count_fetch(self, metrics: ClusterMetrics) -> None:
        self.scrape_duration.observe(metrics.duration)
        pages = self._pages.get(metrics.cluster) or self.scrape_pages.labels(metrics.cluster)
        pages.inc(max(metrics.pages, len(metrics.errors)))
        for error in metrics.errors:
            self.scrape_errors.labels(metrics.cluster, error.reason.value).inc()
        if metrics.invalid_samples:
            self.invalid_samples.labels(metrics.cluster).inc(metrics.invalid_samples)
        if metrics.duplicate_samples:
            self.duplicate_samples.labels(metrics.cluster).inc(metrics.duplicate_samples)
