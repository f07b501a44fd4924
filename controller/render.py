"""One table from what the controller knows to the names it is shown by, and the views built
from it: the JSON of ``/debug/state`` and ``once`` (the same per-target JSON for both), the
gauges of ``/metrics`` (``exporter``), the fields of the ``cluster status`` and ``weights
written`` log lines, and the words ``status`` and the demo print. A name an operator reads
(``vram_utilization``, ``weight_controller_cluster_vram_utilization``, ``vram_util``) is
written here once, beside the field it shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import signals
from controller.model import ClusterMetrics, TargetDecision
from controller.state import ClusterView, TargetView, TickReport


def _same(value: Any) -> Any:
    return value


def _rounded(digits: int) -> Callable[[Any], Any]:
    return lambda value: None if value is None else round(value, digits)


def _ms(value: Any) -> Any:
    """Seconds as whole milliseconds; ``None`` where that is no number: a bucket bound of
    1e306 (valid on a page) overflowed ``round`` and cost every tick (found by an attack)."""
    if value is None or not math.isfinite(ms := value * 1000):
        return None
    return round(ms)


@dataclass(frozen=True, slots=True)
class Column:
    """One fact about a cluster and its name in each view that shows it. ``value`` is
    ``None`` when unknown: JSON then shows ``default``, ``/metrics`` no sample."""

    key: str  # in /debug/state and once
    value: Callable[[ClusterView], Any]
    default: Any = None
    metric: str | None = None  # weight_controller_<metric>{cluster, *labels}
    labels: tuple[tuple[str, str], ...] = ()
    value_label: str | None = None  # the value is this label's, the sample is 1
    kind: str = "gauge"
    help: str = ""
    log: str | None = None  # field of the 'cluster status' line
    log_as: Callable[[Any], Any] = _same


def _m(view: ClusterView, get: Callable[[ClusterMetrics], Any]) -> Any:
    return get(view.metrics) if view.metrics is not None else None


def _latency(view: ClusterView, quantile: str) -> float | None:
    latency = view.metrics.latency if view.metrics is not None else None
    if latency is None:
        return None
    return latency.p50 if quantile == "p50" else latency.p90


_PODS = "Pods (or Ray nodes) scraped and answering; Ray Serve replicas read from them."
_LATENCY = "Request latency quantile over the last scrape interval."

CLUSTER: tuple[Column, ...] = (
    Column(
        "vram_utilization",
        lambda v: _m(v, lambda m: m.kv_mean),
        metric="cluster_vram_utilization",
        help="Mean KV-cache use over pods/engines, 0..1.",
        log="vram_util",
        log_as=_rounded(3),
    ),
    Column(
        "vram_utilization_max",
        lambda v: _m(v, lambda m: m.kv_max),
        metric="cluster_vram_utilization_max",
        help="Highest KV-cache use of any engine.",
        log="vram_max",
        log_as=_rounded(3),
    ),
    Column("kv_metric", lambda v: _m(v, lambda m: m.kv_family)),
    Column(
        "engine",
        lambda v: _m(v, lambda m: m.engine),
        metric="cluster_engine",
        value_label="engine",
        help="The engine(s) whose pages a cluster's pods serve (the engine table's rows).",
    ),
    Column(
        "queue_depth",
        lambda v: _m(v, lambda m: m.queue_depth),
        metric="cluster_queue_depth",
        help="Requests waiting, summed over pods.",
        log="queue",
        log_as=_rounded(1),
    ),
    Column(
        "running",
        lambda v: _m(v, lambda m: m.running),
        metric="cluster_running_requests",
        help="Requests running, summed over pods.",
    ),
    # Summary-typed, quantiles only: the quantile label is legal on summaries, and a
    # cumulative _count/_sum would be a lie for a per-window estimate.
    Column(
        "latency_p50_seconds",
        lambda v: _latency(v, "p50"),
        metric="cluster_latency_seconds",
        labels=(("quantile", "0.5"),),
        kind="summary",
        help=_LATENCY,
        log="p50_ms",
        log_as=_ms,
    ),
    Column(
        "latency_p90_seconds",
        lambda v: _latency(v, "p90"),
        metric="cluster_latency_seconds",
        labels=(("quantile", "0.9"),),
        kind="summary",
        help=_LATENCY,
        log="p90_ms",
        log_as=_ms,
    ),
    Column(
        "pods_scraped",
        lambda v: _m(v, lambda m: m.pods_scraped),
        default=0,
        metric="cluster_pods",
        labels=(("state", "scraped"),),
        help=_PODS,
        log="pods_scraped",
    ),
    Column(
        "pods_answering",
        lambda v: _m(v, lambda m: m.pods_answering),
        default=0,
        metric="cluster_pods",
        labels=(("state", "answering"),),
        help=_PODS,
        log="pods_answering",
    ),
    Column(
        "replicas",
        lambda v: _m(v, lambda m: m.replicas),
        metric="cluster_pods",
        labels=(("state", "replicas"),),
        help=_PODS,
        log="replicas",
    ),
    Column(
        "scrape_duration_seconds",
        lambda v: _m(v, lambda m: m.duration),
        metric="cluster_scrape_duration_seconds",
        help="How long the last fetch took.",
    ),
    Column(
        "healthy",
        lambda v: v.health.healthy if v.health else None,
        default=False,
        metric="cluster_healthy",
        help="1 when the cluster's data are usable.",
        log="healthy",
    ),
    Column(
        "degraded",
        lambda v: v.health.degraded if v.health else None,
        default=False,
        metric="cluster_degraded",
        help="1 when usable but some pods do not answer.",
        log="degraded",
    ),
    Column(
        "reason",
        lambda v: v.health.reason.value if v.health and v.health.reason else None,
        metric="cluster_unhealthy_reason",
        value_label="reason",  # only the reason that holds: one series, not fifteen
        help="1 for the reason a cluster is unhealthy (or failing while still healthy).",
        log="reason",
    ),
    Column("capacity", lambda v: _m(v, signals.capacity)),
    Column("capacity_from", lambda v: _m(v, signals.capacity_from)),
    Column("pods", lambda v: _m(v, signals.pods)),
    Column("kv_tokens", lambda v: _m(v, lambda m: m.kv_tokens)),
    Column(
        "discovered_pods",
        lambda v: _m(v, lambda m: list(m.discovered) if m.discovered is not None else None),
    ),
    Column("weight", lambda v: v.share, log="weight"),
)


@dataclass(frozen=True, slots=True)
class RefColumn:
    """One fact about a target's ref, its JSON key and its gauge (by target, ref, cluster)."""

    key: str
    value: Callable[[TargetView, str], Any]
    metric: str | None = None
    help: str = ""


def _decided(get: Callable[[TargetDecision, str], Any]) -> Callable[[TargetView, str], Any]:
    return lambda view, ref: get(view.outcome, ref)


REF: tuple[RefColumn, ...] = (
    RefColumn("cluster", _decided(lambda o, ref: o.target.clusters.get(ref))),
    RefColumn(
        "desired",
        _decided(lambda o, ref: o.desired.get(ref)),
        "desired_weight",
        "Weight a target's ref was decided to hold.",
    ),
    RefColumn(
        "applied",
        _decided(lambda o, ref: o.applied.get(ref)),
        "applied_weight",
        "Weight a target's ref holds (in a dry run: would hold).",
    ),
    RefColumn(
        "share",
        _decided(lambda o, ref: o.share(ref)),
        "target_share",
        "A ref's share of its target's traffic as applied, 0..100.",
    ),
    RefColumn("goal", _decided(lambda o, ref: o.decision.goal.get(ref))),
    RefColumn("factors", _decided(lambda o, ref: dict(o.decision.factors.get(ref, {})) or None)),
    RefColumn("capacity_from", _decided(lambda o, ref: o.decision.capacity_from.get(ref))),
    RefColumn(
        "realised",
        lambda view, ref: view.realised.get(ref),
        "target_realised_share",
        "Share of the target's requests (0..100, over its mapped refs) the ref's cluster "
        "actually served over weights.realised_window, from its request counters.",
    ),
    RefColumn(
        "intended",
        lambda view, ref: view.intended.get(ref),
        "target_intended_share",
        "Share (0..100, over the mapped refs) the weights in force gave the ref, averaged "
        "over the same window as target_realised_share.",
    ),
)


# ---- JSON: /debug/state and once -------------------------------------------------------------


def cluster_json(view: ClusterView) -> dict[str, Any]:
    """One cluster's signals and decision as JSON."""
    fields = {c.key: _or(c.value(view), c.default) for c in CLUSTER}
    errors = view.metrics.errors if view.metrics else ()
    fields["errors"] = [
        {"url": e.url, "reason": e.reason.value, "detail": e.detail} for e in errors
    ]
    return fields


def target_json(view: TargetView) -> dict[str, Any]:
    """One target's decision, write and history as JSON: the same in ``once`` and
    ``/debug/state``."""
    outcome = view.outcome
    target, decision = outcome.target, outcome.decision
    return {
        "kind": target.kind,
        "namespace": target.namespace or None,
        "name": target.name,
        "law": decision.law,
        "mode": decision.mode.value,
        "write": outcome.write.value,
        "reason": outcome.reason,
        "detail": outcome.detail,
        "notes": list(decision.notes),
        "desired": dict(outcome.desired),
        "applied": dict(outcome.applied),
        "last_write": view.last_write,
        "last_change": view.last_change,
        "actuation_delay_s": view.actuation_delay,
        "waiting_to_act": view.acting,
        "refs": {ref: {c.key: c.value(view, ref) for c in REF} for ref in target.clusters},
    }


def state_json(report: TickReport, leader: bool | None, dry_run: bool) -> dict[str, Any]:
    """Everything the controller last saw and decided, for ``/debug/state`` and ``status``."""
    return {
        "ticks": report.tick,
        "last_tick": report.finished,
        "last_change": report.last_change,
        "leader": leader,
        "dry_run": dry_run,
        "clusters": {name: cluster_json(view) for name, view in report.clusters.items()},
        "targets": {key: target_json(view) for key, view in report.targets.items()},
        "refused": dict(report.refused),
        "kubernetes": {"reachable": report.kubernetes[0], "error": report.kubernetes[1]},
    }


def report_json(report: TickReport) -> dict[str, Any]:
    """The ``once`` output: every cluster as ``/debug/state`` shows it (``weight``: its share
    in the only target), every target exactly as ``/debug/state`` shows it, and the only
    target's mode."""
    only = report.only
    return {
        "clusters": {name: cluster_json(view) for name, view in report.clusters.items()},
        "targets": {key: target_json(view) for key, view in report.targets.items()},
        "mode": only.outcome.decision.mode.value if only else None,
    }


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


# ---- log fields ------------------------------------------------------------------------------

# The fields of a cluster's status line whose change is worth a line at info.
# (A weight change has its own line, ``weights written``/``would write``.)
STATUS_CHANGES = ("healthy", "reason", "degraded", "pods_answering", "pods_scraped")


def status_key(view: ClusterView) -> tuple[object, ...]:
    """The fields of ``STATUS_CHANGES``, as ``status_fields`` gives them: whether a status
    line is due at info, worked out without building the line."""
    return tuple(column.log_as(column.value(view)) for column in _CHANGING)


def status_fields(name: str, view: ClusterView) -> dict[str, object]:
    """The per-cluster line an operator greps: ``cluster=b vram_util=0.2 ... weight=80``."""
    fields: dict[str, object] = {"cluster": name}
    for column in CLUSTER:
        if column.log is not None:
            fields[column.log] = column.log_as(column.value(view))
    return fields


_CHANGING = tuple(next(c for c in CLUSTER if c.log == key) for key in STATUS_CHANGES)


def change(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """``a=50->40 b=50->60``: the refs whose weight changes."""
    return " ".join(
        f"{n}={before.get(n)}->{w}" for n, w in sorted(after.items()) if before.get(n) != w
    )


def weights_text(values: Mapping[str, int]) -> str:
    """``a=40 b=60``."""
    return " ".join(f"{n}={w}" for n, w in sorted(values.items()))


def change_fields(outcome: TargetDecision, clusters: Mapping[str, ClusterView]) -> dict[str, Any]:
    """The ``weights written`` / ``would write`` line: the change and what drove it, per ref:
    its cluster's health, KV use and queue (as weighed) and its score."""
    factors = {}
    for ref, cluster in outcome.target.clusters.items():
        view = clusters.get(cluster or "")
        state = view.health if view else None
        used = state.metrics if state and state.healthy else None
        factors[ref] = {
            "cluster": cluster,
            "healthy": bool(state and state.healthy),
            "kv": _rounded(3)(used.kv_mean) if used else None,
            "queue_per_pod": _rounded(2)(used.queue_per_pod) if used else None,
            "score": _rounded(3)(outcome.decision.scores.get(ref)),
        }
    return {
        "target": outcome.target.key,
        "mode": outcome.decision.mode.value,
        "write": outcome.write.value,
        "change": change(outcome.held, outcome.desired),
        "weights_from": dict(outcome.held),
        "weights_to": dict(outcome.desired),
        "factors": factors,
    }


def summary_fields(view: TargetView) -> dict[str, Any]:
    """The periodic ``target summary`` line."""
    outcome = view.outcome
    return {
        "target": outcome.target.key,
        "mode": outcome.decision.mode.value,
        "weights": weights_text(outcome.applied),
        "applied": dict(outcome.applied),
        "desired": dict(outcome.desired),
        "write": outcome.write.value,
        "healthy_refs": len(outcome.decision.scores),
        "refs": len(outcome.applied),
        "last_change": view.last_change,
    }


# ---- words for people: status and the demo ----------------------------------------------------


def health_words(cluster: Mapping[str, Any]) -> str:
    """A cluster's health as ``status`` and the demo print it, from its JSON."""
    if not cluster["healthy"]:
        return f"UNHEALTHY ({cluster['reason']})"
    if cluster["reason"]:
        return f"healthy, last fetch failed ({cluster['reason']})"
    if cluster["degraded"]:
        return "healthy, degraded"
    return "healthy"
