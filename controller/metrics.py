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


class ControllerMetrics:
    """The process's own counters and histograms, registered in a private registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # Fleet-wide: a histogram per cluster would be 14 series each (at 200 clusters most
        # of the page); each cluster's last fetch time is a gauge in the snapshot instead.
        self.scrape_duration = Histogram(
            f"{PREFIX}_scrape_duration_seconds",
            "Time to fetch all of a cluster's pages in one tick, over every cluster.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.scrape_errors = Counter(
            f"{PREFIX}_scrape_errors_total",
            "Pages (or whole clusters) that gave no usable data, by reason.",
            ["cluster", "reason"],
            registry=registry,
        )
        self.scrape_pages = Counter(
            f"{PREFIX}_scrape_pages_total",
            "Pages (or PromQL queries) fetched, failed or not: with scrape_errors_total, the "
            "share of a cluster's pages that fail.",
            ["cluster"],
            registry=registry,
        )
        self.invalid_samples = Counter(
            f"{PREFIX}_invalid_samples_total",
            "KV-cache samples ignored because they were NaN, infinite or outside 0..1.",
            ["cluster"],
            registry=registry,
        )
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Duration of one reconcile tick: fetch, judge, weigh, publish.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.interval = Gauge(
            f"{PREFIX}_interval_seconds",
            "The configured reconcile interval: what a tick's duration is measured against.",
            registry=registry,
        )
        self.last_reconcile = Gauge(
            f"{PREFIX}_last_reconcile_timestamp_seconds",
            "Unix time the last reconcile tick finished.",
            registry=registry,
        )
        self.reconcile_errors = Counter(
            f"{PREFIX}_reconcile_errors_total",
            "Ticks (or parts of ticks) that raised an unexpected exception.",
            ["stage"],
            registry=registry,
        )
        self.target_writes = Counter(
            f"{PREFIX}_target_writes_total",
            "Attempts to make a target hold new weights, by result (would: dry run).",
            ["target", "result"],
            registry=registry,
        )
        self.schema_rejections = Counter(
            f"{PREFIX}_schema_rejections_total",
            "Writes the API server refused because the object broke the CRD's schema, by the "
            "field it named. Not retried until the decision changes.",
            ["target", "field"],
            registry=registry,
        )
        self.api_errors = Counter(
            f"{PREFIX}_api_errors_total",
            "Kubernetes API calls that failed, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in (
            "not_found",
            "conflict",
            "invalid",
            "schema",
            "forbidden",
            "server_error",
            "unavailable",
            "error",
        ):
            self.api_errors.labels(reason)
        self.insecure = Gauge(
            f"{PREFIX}_cluster_insecure",
            "1 for a risk an operator opted into for a cluster: TLS not verified "
            "(tls_insecure_skip_verify), or a bearer token over plain http.",
            ["cluster", "risk"],
            registry=registry,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica holds the Lease and may write.",
            registry=registry,
        )
        self.health_transitions = Counter(
            f"{PREFIX}_health_transitions_total",
            "Clusters turning healthy or unhealthy.",
            ["cluster", "to"],
            registry=registry,
        )
        build = Gauge(
            f"{PREFIX}_build_info",
            "Always 1; labels say which build is running.",
            ["version", "python_version"],
            registry=registry,
        )
        build.labels(__version__, platform.python_version()).set(1)

    def add_cluster(self, cluster: str) -> None:
        """Create every labelled series at 0, so rate() and alerts see them from the start."""
        for to in ("healthy", "unhealthy"):
            self.health_transitions.labels(cluster, to)
        self.scrape_pages.labels(cluster)
        self.invalid_samples.labels(cluster)

    def add_target(self, target: str) -> None:
        for result in Write:
            if result not in (Write.NONE, Write.FOLLOWER):
                self.target_writes.labels(target, result.value)

    def count_fetch(self, metrics: ClusterMetrics) -> None:
        self.scrape_duration.observe(metrics.duration)
        self.scrape_pages.labels(metrics.cluster).inc(max(metrics.pages, len(metrics.errors)))
        for error in metrics.errors:
            self.scrape_errors.labels(metrics.cluster, error.reason.value).inc()
        if metrics.invalid_samples:
            self.invalid_samples.labels(metrics.cluster).inc(metrics.invalid_samples)
