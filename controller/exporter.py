"""Our own /metrics: what the controller does (counters, histograms) and what it last saw and
decided (a Collector over the latest snapshot, so nothing is cleared or left stale by hand).

Every app instance gets its own CollectorRegistry: tests and the demo never share state.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller import __version__
from controller.model import ClusterHealth, ClusterMetrics, Mode, TargetDecision, Write

PREFIX = "weight_controller"


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The latest of one cluster: last fetch, health after it, and its share of traffic in the
    implicit target (or in the only target, when there is exactly one; else ``None``).

    Frozen: a tick replaces views, so a TickReport kept by a caller never changes under it."""

    metrics: ClusterMetrics | None = None
    health: ClusterHealth | None = None
    weight: int | None = None


@dataclass(frozen=True, slots=True)
class TargetView:
    """One routing target after a tick: the decision and its write, plus its history."""

    outcome: TargetDecision
    last_write: float | None = None  # unix time of the last write that landed
    last_change: float | None = None  # unix time applied last changed (written or would be)
    # Over ``weights.realised_window``, per mapped ref (0..100 over the mapped refs): the share
    # of requests its cluster actually served, and the share the weights in force intended.
    realised: Mapping[str, float] = field(default_factory=dict)
    intended: Mapping[str, float] = field(default_factory=dict)


def only_target(targets: Mapping[str, TargetView]) -> TargetView | None:
    """The one target, when there is exactly one (the implicit target is one)."""
    return next(iter(targets.values())) if len(targets) == 1 else None


@dataclass(slots=True)
class Snapshot:
    """Written by the reconcile loop once per tick, read by /metrics, /healthz and /readyz."""

    clusters: dict[str, ClusterView] = field(default_factory=dict)
    targets: dict[str, TargetView] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # objects we will not write, and why
    kubernetes: tuple[bool | None, str | None] = (None, None)  # reachable, and why not
    dry_run: bool = False
    ticks: int = 0
    last_tick_monotonic: float | None = None
    last_tick_wall: float | None = None

    @property
    def last_change_wall(self) -> float | None:
        return max((t.last_change for t in self.targets.values() if t.last_change), default=None)


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


def _family(name: str, doc: str, labels: tuple[str, ...] = ("cluster",)) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


class SnapshotCollector(Collector):
    """Mirrors the latest snapshot; a cluster's unknown value is absent, never 0."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily: the cluster set is only known at run time

    def collect(self) -> Iterator[Metric]:
        yield from self._signals()
        yield from self._decisions()
        yield from self._targets()

    def _targets(self) -> Iterator[Metric]:
        labels = ("target", "ref", "cluster")
        desired = _family("desired_weight", "Weight a target's ref was decided to hold.", labels)
        applied = _family(
            "applied_weight", "Weight a target's ref holds (in a dry run: would hold).", labels
        )
        share = _family(
            "target_share", "A ref's share of its target's traffic as applied, 0..100.", labels
        )
        mode = _family(
            "target_mode", "1 for how the target's weights were decided.", ("target", "mode")
        )
        factor = _family(
            "target_factor",
            "Why a ref gets its weight: its cluster's score and the score's parts, for "
            "healthy clusters (capacity law: capacity, utilization, capacity_share, "
            "demand_share; integral law: kv_headroom × queue_penalty × latency_penalty).",
            ("target", "ref", "cluster", "factor"),
        )
        realised = _family(
            "target_realised_share",
            "Share of the target's requests (0..100, over its mapped refs) the ref's cluster "
            "actually served over weights.realised_window, from its request counters.",
            labels,
        )
        intended = _family(
            "target_intended_share",
            "Share (0..100, over the mapped refs) the weights in force gave the ref, averaged "
            "over the same window as target_realised_share.",
            labels,
        )
        unmapped = _family(
            "target_unmapped_refs",
            "Refs of a target that map to no known cluster (they keep their weight).",
            ("target",),
        )
        for key, view in self._snapshot.targets.items():
            outcome = view.outcome
            for ref, cluster in outcome.target.clusters.items():
                row = [key, ref, cluster or ""]
                _add(desired, row, outcome.desired.get(ref))
                _add(applied, row, outcome.applied.get(ref))
                _add(share, row, outcome.share(ref))
            for ref, value in view.realised.items():
                row = [key, ref, outcome.target.clusters.get(ref) or ""]
                realised.add_metric(row, value)
                if ref in view.intended:
                    intended.add_metric(row, view.intended[ref])
            for ref, parts in outcome.decision.factors.items():
                cluster = outcome.target.clusters.get(ref) or ""
                for name, value in parts.items():
                    factor.add_metric([key, ref, cluster, name], value)
            for m in Mode:
                mode.add_metric([key, m.value], float(outcome.decision.mode is m))
            missing = sum(1 for c in outcome.target.clusters.values() if c is None)
            unmapped.add_metric([key], missing)
        yield from (desired, applied, share, mode, factor, realised, intended, unmapped)

    def _signals(self) -> Iterator[Metric]:
        kv = _family("cluster_vram_utilization", "Mean KV-cache use over pods/engines, 0..1.")
        kv_max = _family("cluster_vram_utilization_max", "Highest KV-cache use of any engine.")
        queue = _family("cluster_queue_depth", "Requests waiting, summed over pods.")
        running = _family("cluster_running_requests", "Requests running, summed over pods.")
        # A summary-typed family of quantiles only: the quantile label is legal on summaries,
        # and a cumulative _count/_sum would be a lie for a per-window estimate.
        latency = Metric(
            f"{PREFIX}_cluster_latency_seconds",
            "Request latency quantile over the last scrape interval.",
            "summary",
        )
        pods = _family("cluster_pods", "Pods scraped and answering.", ("cluster", "state"))
        took = _family("cluster_scrape_duration_seconds", "How long the last fetch took.")
        for name, view in self._snapshot.clusters.items():
            m = view.metrics
            if m is None:
                continue
            _add(kv, [name], m.kv_mean)
            _add(kv_max, [name], m.kv_max)
            _add(queue, [name], m.queue_depth)
            _add(running, [name], m.running)
            if m.latency is not None:
                for quantile, value in (("0.5", m.latency.p50), ("0.9", m.latency.p90)):
                    if value is not None:
                        labels = {"cluster": name, "quantile": quantile}
                        latency.add_sample(latency.name, labels, value)
            pods.add_metric([name, "scraped"], m.pods_scraped)
            pods.add_metric([name, "answering"], m.pods_answering)
            took.add_metric([name], m.duration)
        yield from (kv, kv_max, queue, running, latency, pods, took)

    def _decisions(self) -> Iterator[Metric]:
        healthy = _family("cluster_healthy", "1 when the cluster's data are usable.")
        degraded = _family("cluster_degraded", "1 when usable but some pods do not answer.")
        reason = _family(
            "cluster_unhealthy_reason",
            "1 for the reason a cluster is unhealthy (or failing while still healthy).",
            ("cluster", "reason"),
        )
        for name, view in self._snapshot.clusters.items():
            h = view.health
            if h is not None:
                healthy.add_metric([name], float(h.healthy))
                degraded.add_metric([name], float(h.degraded))
                if h.reason is not None:  # only the reason that holds: one series, not 15
                    reason.add_metric([name, h.reason.value], 1.0)
        frozen = any(
            t.outcome.decision.mode is Mode.FAIL_STATIC for t in self._snapshot.targets.values()
        )
        fail_static = GaugeMetricFamily(
            f"{PREFIX}_fail_static",
            "1 while some target has every cluster unhealthy and its weights are frozen.",
        )
        fail_static.add_metric([], float(frozen))
        dry_run = GaugeMetricFamily(
            f"{PREFIX}_dry_run", "1 when this process writes nothing (dry run, read-only once)."
        )
        dry_run.add_metric([], float(self._snapshot.dry_run))
        yield from (healthy, degraded, reason, fail_static, dry_run)


def cluster_json(view: ClusterView) -> dict[str, Any]:
    """One cluster's signals and decision as JSON (``once``, ``/debug/state``)."""
    m, h = view.metrics, view.health
    latency = m.latency if m else None
    return {
        "vram_utilization": m.kv_mean if m else None,
        "vram_utilization_max": m.kv_max if m else None,
        "kv_metric": m.kv_family if m else None,
        "queue_depth": m.queue_depth if m else None,
        "running": m.running if m else None,
        "latency_p50_seconds": latency.p50 if latency else None,
        "latency_p90_seconds": latency.p90 if latency else None,
        "pods_scraped": m.pods_scraped if m else 0,
        "pods_answering": m.pods_answering if m else 0,
        "healthy": h.healthy if h else False,
        "degraded": h.degraded if h else False,
        "reason": h.reason.value if h and h.reason else None,
        "weight": view.weight,
        "errors": [
            {"url": e.url, "reason": e.reason.value, "detail": e.detail}
            for e in (m.errors if m else ())
        ],
    }


def target_json(view: TargetView) -> dict[str, Any]:
    """One target's decision, write and history as JSON (``once``, ``/debug/state``)."""
    outcome = view.outcome
    target, decision = outcome.target, outcome.decision
    return {
        "kind": target.kind,
        "namespace": target.namespace or None,
        "name": target.name,
        "mode": decision.mode.value,
        "write": outcome.write.value,
        "detail": outcome.detail,
        "notes": list(decision.notes),
        "desired": dict(outcome.desired),
        "applied": dict(outcome.applied),
        "last_write": view.last_write,
        "last_change": view.last_change,
        "refs": {
            ref: {
                "cluster": cluster,
                "desired": outcome.desired.get(ref),
                "applied": outcome.applied.get(ref),
                "share": outcome.share(ref),
                "goal": decision.goal.get(ref),
                "factors": dict(decision.factors.get(ref, {})) or None,
                "realised": view.realised.get(ref),
                "intended": view.intended.get(ref),
            }
            for ref, cluster in target.clusters.items()
        },
    }


def state_json(snapshot: Snapshot, leader: bool | None) -> dict[str, Any]:
    """Everything the controller last saw and decided, for ``/debug/state`` and ``status``."""
    return {
        "ticks": snapshot.ticks,
        "last_tick": snapshot.last_tick_wall,
        "last_change": snapshot.last_change_wall,
        "leader": leader,
        "dry_run": snapshot.dry_run,
        "clusters": {name: cluster_json(view) for name, view in snapshot.clusters.items()},
        "targets": {key: target_json(view) for key, view in snapshot.targets.items()},
        "refused": dict(snapshot.refused),
        "kubernetes": {"reachable": snapshot.kubernetes[0], "error": snapshot.kubernetes[1]},
    }


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


def make_registry(snapshot: Snapshot) -> tuple[CollectorRegistry, ControllerMetrics]:
    # No *_created series: a third of the page at 200 clusters, and Prometheus's rate() has
    # no use for them (the process's own start time is in process_start_time_seconds).
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=False)
    # The process's own cost, as every prometheus_client process exports it: CPU seconds,
    # resident memory, open fds, start time (from /proc), and the cyclic collector's passes.
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    metrics = ControllerMetrics(registry)
    registry.register(SnapshotCollector(snapshot))
    return registry, metrics
