"""Our own /metrics: what the controller does (counters, histograms) and what it last saw and
decided (a Collector over the latest snapshot, so nothing is cleared or left stale by hand).

Every app instance gets its own CollectorRegistry: tests and the demo never share state.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller import __version__
from controller.model import ClusterHealth, ClusterMetrics, Decision, Mode, Reason

PREFIX = "weight_controller"


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The latest of one cluster: last fetch, health after it, weight in force.

    Frozen: a tick replaces views, so a TickReport kept by a caller never changes under it."""

    metrics: ClusterMetrics | None = None
    health: ClusterHealth | None = None
    weight: int | None = None
    target: float | None = None


@dataclass(frozen=True, slots=True)
class TargetView:
    """One published-to object: what each ref should hold and what it holds."""

    kind: str
    namespace: str
    name: str
    desired: Mapping[str, int]
    applied: Mapping[str, int]
    clusters: Mapping[str, str | None]
    mode: Mode
    last_write: float | None = None


@dataclass(slots=True)
class Snapshot:
    """Written by the reconcile loop once per tick, read by /metrics, /healthz and /readyz."""

    clusters: dict[str, ClusterView] = field(default_factory=dict)
    decision: Decision | None = None
    targets: dict[str, TargetView] = field(default_factory=dict)
    ticks: int = 0
    last_tick_monotonic: float | None = None
    last_tick_wall: float | None = None
    last_change_wall: float | None = None


class ControllerMetrics:
    """The process's own counters and histograms, registered in a private registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrape_duration = Histogram(
            f"{PREFIX}_scrape_duration_seconds",
            "Time to fetch all of a cluster's pages in one tick.",
            ["cluster"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.scrape_errors = Counter(
            f"{PREFIX}_scrape_errors_total",
            "Pages (or whole clusters) that gave no usable data, by reason.",
            ["cluster", "reason"],
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
        self.weight_updates = Counter(
            f"{PREFIX}_weight_updates_total",
            "Times new weights were published.",
            registry=registry,
        )
        self.target_writes = Counter(
            f"{PREFIX}_target_writes_total",
            "Patches that changed the weights of a Kubernetes object.",
            ["kind"],
            registry=registry,
        )
        for kind in ("ExternalModel", "HTTPRoute"):
            self.target_writes.labels(kind)
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
            "forbidden",
            "server_error",
            "unavailable",
            "error",
        ):
            self.api_errors.labels(reason)
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
        for reason in Reason:
            self.scrape_errors.labels(cluster, reason.value)
        for to in ("healthy", "unhealthy"):
            self.health_transitions.labels(cluster, to)
        self.invalid_samples.labels(cluster)

    def count_fetch(self, metrics: ClusterMetrics) -> None:
        self.scrape_duration.labels(metrics.cluster).observe(metrics.duration)
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
        labels = ("kind", "namespace", "target", "ref", "cluster")
        desired = _family("desired_weight", "Weight a target's ref should hold.", labels)
        applied = _family("applied_weight", "Weight a target's ref holds (last read).", labels)
        unmapped = _family(
            "target_unmapped_refs",
            "Refs of a target that map to no known cluster (they keep their weight).",
            ("kind", "namespace", "target"),
        )
        for view in self._snapshot.targets.values():
            for ref, cluster in view.clusters.items():
                row = [view.kind, view.namespace, view.name, ref, cluster or ""]
                _add(desired, row, view.desired.get(ref))
                _add(applied, row, view.applied.get(ref))
            missing = sum(1 for c in view.clusters.values() if c is None)
            unmapped.add_metric([view.kind, view.namespace, view.name], missing)
        yield from (desired, applied, unmapped)

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
        yield from (kv, kv_max, queue, running, latency, pods)

    def _decisions(self) -> Iterator[Metric]:
        healthy = _family("cluster_healthy", "1 when the cluster's data are usable.")
        degraded = _family("cluster_degraded", "1 when usable but some pods do not answer.")
        reason = _family(
            "cluster_unhealthy_reason",
            "1 for the reason a cluster is unhealthy (or failing while still healthy).",
            ("cluster", "reason"),
        )
        weight = _family("cluster_weight", "Weight in force (0..100; sums to 100).")
        target = _family(
            "cluster_target_weight", "Where the weights are heading, before smoothing."
        )
        for name, view in self._snapshot.clusters.items():
            h = view.health
            if h is not None:
                healthy.add_metric([name], float(h.healthy))
                degraded.add_metric([name], float(h.degraded))
                for r in Reason:
                    reason.add_metric([name, r.value], float(h.reason is r))
            _add(weight, [name], view.weight)
            _add(target, [name], view.target)
        mode = _family("decision_mode", "1 for how the last weights were decided.", ("mode",))
        decision = self._snapshot.decision
        for m in Mode:
            mode.add_metric([m.value], float(decision is not None and decision.mode is m))
        fail_static = GaugeMetricFamily(
            f"{PREFIX}_fail_static", "1 while every cluster is unhealthy and weights are frozen."
        )
        fail_static.add_metric(
            [], float(decision is not None and decision.mode is Mode.FAIL_STATIC)
        )
        yield from (healthy, degraded, reason, weight, target, mode, fail_static)


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
        "target_weight": view.target,
        "errors": [
            {"url": e.url, "reason": e.reason.value, "detail": e.detail}
            for e in (m.errors if m else ())
        ],
    }


def state_json(snapshot: Snapshot, leader: bool | None) -> dict[str, Any]:
    """Everything the controller last saw and decided, for ``/debug/state`` and ``status``."""
    decision = snapshot.decision
    return {
        "ticks": snapshot.ticks,
        "last_tick": snapshot.last_tick_wall,
        "last_change": snapshot.last_change_wall,
        "leader": leader,
        "mode": decision.mode.value if decision else None,
        "notes": list(decision.notes) if decision else [],
        "clusters": {name: cluster_json(view) for name, view in snapshot.clusters.items()},
        "targets": {
            key: {
                "kind": t.kind,
                "namespace": t.namespace,
                "name": t.name,
                "mode": t.mode.value,
                "last_write": t.last_write,
                "refs": {
                    ref: {
                        "cluster": cluster,
                        "desired": t.desired.get(ref),
                        "applied": t.applied.get(ref),
                    }
                    for ref, cluster in t.clusters.items()
                },
            }
            for key, t in snapshot.targets.items()
        },
    }


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


def make_registry(snapshot: Snapshot) -> tuple[CollectorRegistry, ControllerMetrics]:
    registry = CollectorRegistry(auto_describe=False)
    metrics = ControllerMetrics(registry)
    registry.register(SnapshotCollector(snapshot))
    return registry, metrics
