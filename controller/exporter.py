"""Our own /metrics: the process's counters (``metrics``), its own cost (prometheus_client's
process and GC collectors), and a Collector that mirrors the latest ``TickReport`` — read once
per scrape, so one page never mixes two ticks, and nothing is cleared or left stale by hand.

Every app instance gets its own CollectorRegistry: tests and the demo never share state. The
per-cluster and per-ref gauges come from ``render``'s tables, where their names are written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller import render
from controller.cgroup import memory_limit
from controller.metrics import PREFIX, ControllerMetrics
from controller.model import Mode
from controller.state import Snapshot, TickReport


class StateCollector(Collector):
    """Mirrors the latest tick; a cluster's unknown value is absent, never 0."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily: the cluster set is only known at run time

    def collect(self) -> Iterator[Metric]:
        report = self._snapshot.report  # one tick for the whole page
        yield from _clusters(report)
        yield from _refs(report)
        yield from _targets(report)
        yield from _process(report, self._snapshot.dry_run)


def _clusters(report: TickReport) -> Iterator[Metric]:
    families: dict[str, Metric] = {}
    for column in render.CLUSTER:
        if column.metric is not None and column.metric not in families:
            labels = ["cluster", *(k for k, _ in column.labels)]
            if column.value_label:
                labels.append(column.value_label)
            name = f"{PREFIX}_{column.metric}"
            families[column.metric] = (
                Metric(name, column.help, "summary")
                if column.kind == "summary"
                else GaugeMetricFamily(name, column.help, labels=labels)
            )
    for cluster, view in report.clusters.items():
        for column in render.CLUSTER:
            value = column.value(view)
            if column.metric is None or value is None:
                continue
            sample = {"cluster": cluster, **dict(column.labels)}
            if column.value_label:
                sample[column.value_label], value = str(value), 1.0
            family = families[column.metric]
            family.add_sample(family.name, sample, float(value))
    yield from families.values()


def _refs(report: TickReport) -> Iterator[Metric]:
    labels = ["target", "ref", "cluster"]
    families = {
        c.metric: GaugeMetricFamily(f"{PREFIX}_{c.metric}", c.help, labels=labels)
        for c in render.REF
        if c.metric is not None
    }
    for key, view in report.targets.items():
        clusters = view.outcome.target.clusters
        for ref, cluster in clusters.items():
            row = [key, ref, cluster or ""]
            for column in render.REF:
                value = column.value(view, ref)
                if column.metric is not None and value is not None:
                    families[column.metric].add_metric(row, value)
    yield from families.values()


def _targets(report: TickReport) -> Iterator[Metric]:
    mode = _family("target_mode", "1 for how the target's weights were decided.", "target", "mode")
    factor = _family(
        "target_factor",
        "Why a ref gets its weight: its cluster's score and the score's parts, for "
        "healthy clusters (capacity law: capacity, utilization, capacity_share, "
        "demand_share; integral law: kv_headroom × queue_penalty × latency_penalty).",
        "target",
        "ref",
        "cluster",
        "factor",
    )
    unmapped = _family(
        "target_unmapped_refs",
        "Refs of a target that map to no known cluster (they keep their weight).",
        "target",
    )
    delay = _family(
        "target_actuation_delay_seconds",
        "How long a target's weight changes take to act (the realised share moving), measured;"
        " absent before a change was seen acting.",
        "target",
    )
    for key, view in report.targets.items():
        outcome = view.outcome
        if view.actuation_delay is not None:
            delay.add_metric([key], view.actuation_delay)
        for ref, parts in outcome.decision.factors.items():
            cluster = outcome.target.clusters.get(ref) or ""
            for name, value in parts.items():
                factor.add_metric([key, ref, cluster, name], value)
        for m in Mode:
            mode.add_metric([key, m.value], float(outcome.decision.mode is m))
        missing = sum(1 for c in outcome.target.clusters.values() if c is None)
        unmapped.add_metric([key], missing)
    yield from (mode, factor, unmapped, delay)


def _process(report: TickReport, dry_run: bool) -> Iterator[Metric]:
    frozen = any(t.outcome.decision.mode is Mode.FAIL_STATIC for t in report.targets.values())
    fail_static = _family(
        "fail_static",
        "1 while some target has every cluster unhealthy and its weights are frozen.",
    )
    fail_static.add_metric([], float(frozen))
    dry = _family("dry_run", "1 when this process writes nothing (dry run, read-only once).")
    dry.add_metric([], float(dry_run))
    targets = _family(
        "targets",
        "Targets weighed in the last tick; 0 with Kubernetes on means no ExternalModel is "
        "opted in (the 'no target opted in' condition names the label selector).",
    )
    targets.add_metric([], len(report.targets))
    yield from (fail_static, dry, targets)


def _family(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


# A cache's size: entries, and bytes of what it keys on where that is what grows (label text).
CacheSize = Callable[[], tuple[int, int | None]]


class CacheCollector(Collector):
    """What the process's bounded caches hold now, by cache (read at scrape time)."""

    def __init__(self, caches: MutableMapping[str, CacheSize]) -> None:
        self.caches = caches

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        entries = _family("cache_entries", "Entries a bounded cache holds, by cache.", "cache")
        size = _family(
            "cache_bytes", "Bytes of key text a bounded cache holds (label caches).", "cache"
        )
        for name, measure in sorted(self.caches.items()):
            count, held = measure()
            entries.add_metric([name], count)
            if held is not None:
                size.add_metric([name], held)
        yield from (entries, size)


class MemoryLimitCollector(Collector):
    """The memory limit the process is held to (its container's ``limits.memory``, from its
    cgroup), read at each scrape (an in-place resize changes it), absent where none is set:
    beside ``process_resident_memory_bytes``, how close it is to being OOM-killed."""

    def __init__(self, read: Callable[[], int | None] = memory_limit) -> None:
        self._read = read

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        limit = self._read()
        if limit is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_memory_limit_bytes",
                "The memory limit of the process's cgroup (its container's limits.memory).",
                value=limit,
            )


def make_registry(snapshot: Snapshot) -> tuple[CollectorRegistry, ControllerMetrics]:
    # No *_created series on it: the process sets that once at start-up (cli.lean_metrics).
    registry = CollectorRegistry(auto_describe=False)
    # The process's own cost, as every prometheus_client process exports it: CPU seconds,
    # resident memory, open fds, start time (from /proc), and the cyclic collector's passes.
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(MemoryLimitCollector())
    metrics = ControllerMetrics(registry)
    registry.register(StateCollector(snapshot))
    return registry, metrics
