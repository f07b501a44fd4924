"""Pure: what the laws read of each healthy cluster, derived from its fetches over time.

A cluster's ``Signals`` come from its last usable fetch (``ClusterHealth.metrics``) and a small
memory carried from tick to tick (``SignalMemory``):

- *utilization*: KV use scaled up by the queue, ``(running + waiting) / running × KV`` when
  requests wait: what the cluster would use if it could admit everything offered to it;
- *demand*: that utilization filtered over recent scrapes (an EWMA with
  ``weights.demand_smoothing``), started afresh after an outage; *previous*: the utilization
  of the good fetch before the newest (a single reading is not yet a trend);
- *kv*: the newest KV use, or with ``weights.forecast_horizon`` its value that far ahead on the
  line through the last ``FORECAST_POINTS`` good readings (only when rising);
- *capacity*: what the cluster holds: its KV-cache tokens where its pages say (each pod's KV
  pool by its engine's row, or its pods × ``kv_tokens_per_pod``), else its pods (the EPP's
  ready endpoints, or the pods that answered). ``weights.weigh`` puts a target's clusters in
  tokens (``on_one_basis``: one that does not say is estimated from those that do).

The loop keeps one ``SignalMemory`` per cluster and calls ``remember`` after judging each fetch
and ``derive`` before weighing; the simulator's baselines use ``current`` (no memory).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.model import (
    CapacityFrom,
    ClusterHealth,
    ClusterMetrics,
    Signals,
    quick_init,
    replaced,
)
from controller.settings import WeightSettings

# Readings the KV forecast fits its slope to: enough to average out noise, few enough to turn.
FORECAST_POINTS = 3


@quick_init
@dataclass(frozen=True, slots=True)
class SignalMemory:
    """What one cluster's signals remember between ticks."""

    history: tuple[tuple[float, float], ...] = ()  # (scraped_at, KV) of the last good fetches
    demand: float | None = None  # the filtered utilization
    readings: tuple[float, ...] = ()  # the utilization of the last two good fetches
    occupancy: tuple[float, float] | None = None  # (KV use, running), filtered slowly


# How fast the occupancy filter follows (the newest fetch's weight): a KV pool is hardware,
# so its estimate from occupancy should not move with one tick's noise (~10 ticks to settle).
OCCUPANCY_SMOOTHING = 0.1
# Below this KV use or one request running, a cluster's occupancy measures nothing.
MIN_OCCUPIED, MIN_RUNNING = 0.05, 1.0


def utilization(metrics: ClusterMetrics) -> float | None:
    """KV use, scaled up by the queue when requests wait: (running + waiting) / running × KV
    is what the cluster would use if it could admit everything offered to it."""
    kv = metrics.kv_mean
    if kv is None:
        return None
    running, waiting = metrics.running, metrics.queue_depth
    if not waiting or waiting <= 0 or running is None or running <= 0:
        return kv
    return kv * (running + waiting) / running


def remember(
    memory: SignalMemory | None, metrics: ClusterMetrics, health: ClusterHealth, smoothing: float
) -> SignalMemory:
    """``memory`` after a fetch judged ``health``. Only a fetch that is in use (healthy, and
    not a failed one ridden out on the last good signals) feeds the filter and the forecast;
    after a gap the forecast starts again, and after an outage so does the filter."""
    memory = memory or SignalMemory()
    good = health.healthy and health.metrics is metrics
    history = memory.history
    if good and metrics.kv_mean is not None:
        history = (*history, (metrics.scraped_at, metrics.kv_mean))[-FORECAST_POINTS:]
    elif not good:
        history = ()  # do not extrapolate across a gap
    occupancy = _occupancy(memory.occupancy, metrics) if good else memory.occupancy
    now = utilization(metrics) if good else None
    if now is None:
        readings = memory.readings if health.healthy else ()
        demand = memory.demand if health.healthy else None
        return SignalMemory(history, demand, readings, occupancy)
    before = memory.demand
    demand = now if before is None else before + smoothing * (now - before)
    return SignalMemory(history, demand, (*memory.readings, now)[-2:], occupancy)


def _occupancy(
    before: tuple[float, float] | None, metrics: ClusterMetrics
) -> tuple[float, float] | None:
    kv, running = metrics.kv_mean, metrics.running
    if kv is None or running is None or not (math.isfinite(kv) and math.isfinite(running)):
        return before  # a reading that is not a number never enters the filter
    if before is None:
        return kv, running
    a = OCCUPANCY_SMOOTHING
    return before[0] + a * (kv - before[0]), before[1] + a * (running - before[1])


def current(health: ClusterHealth, quantile: str, **more: Any) -> Signals | None:
    """A cluster's signals from its last usable fetch alone (and ``more``, what ``derive``
    adds, built in the same object: this runs per cluster per tick); nothing unless it is
    healthy."""
    metrics = health.metrics
    if not health.healthy or metrics is None or metrics.kv_mean is None:
        return None
    latency = None
    if metrics.latency is not None:
        latency = {"p50": metrics.latency.p50, "p90": metrics.latency.p90}.get(
            quantile, metrics.latency.mean
        )
    fields: dict[str, Any] = {
        "kv": metrics.kv_mean,
        "queue_per_pod": metrics.queue_per_pod,
        "latency": latency,
        "utilization": utilization(metrics),
        "capacity": capacity(metrics),
        "capacity_from": capacity_from(metrics),
        "pods": pods(metrics),
        "kv_tokens": metrics.kv_tokens,
    }
    fields.update(more)
    return Signals(**fields)


def pods(metrics: ClusterMetrics) -> float | None:
    """The pods serving: the EPP's ready endpoints where it says, else the replicas read
    from Ray's node pages, else the pods that answered."""
    if metrics.ready is not None:
        return metrics.ready
    if metrics.replicas is not None:
        return float(metrics.replicas) or None
    return float(metrics.pods_answering) if metrics.pods_answering else None


def capacity(metrics: ClusterMetrics) -> float | None:
    """What the cluster holds in its best-known unit: KV tokens, else pods."""
    return metrics.kv_tokens if metrics.kv_tokens is not None else pods(metrics)


def capacity_from(metrics: ClusterMetrics) -> str | None:
    """Where ``capacity`` came from (a ``CapacityFrom`` value)."""
    if metrics.kv_tokens is not None:
        return metrics.kv_tokens_from or CapacityFrom.KV_BLOCKS
    if metrics.ready is not None:
        return CapacityFrom.READY_ENDPOINTS
    if metrics.replicas is not None:
        return CapacityFrom.REPLICAS if metrics.replicas else None
    return CapacityFrom.PODS if metrics.pods_answering else None


def on_one_basis(healthy: Mapping[str, Signals]) -> tuple[dict[str, Signals], str | None]:
    """``healthy`` with every capacity in one unit, KV tokens, and a note naming what was
    estimated. A cluster whose pages publish no KV pool (an engine or version that does not
    say, a pod not yet profiled) is measured against the clusters that do: they say how many
    tokens a running request holds (the same model and the same stream of requests: the
    same size on any hardware), so its running requests over its KV use give its pool.
    Before it has load to measure, it counts as their smallest pod: too little traffic is
    soon measured and corrected, too much overloads it before it is (in the simulator's
    mixed-engines world, their mean pod gave 3× a small cluster's pool and a minute of
    overload). What the others know of their hardware is kept either way, never flattened to a
    pod count (which takes an 80 GB pod for a 24 GB one). With no cluster that knows its
    tokens, all are weighed in pods."""
    known = {n: s for n, s in healthy.items() if s.kv_tokens is not None}
    if len(known) == len(healthy):
        return dict(healthy), None
    sizes = [s.kv_tokens / s.pods for s in known.values() if s.kv_tokens and s.pods]
    if not sizes:
        result = {}
        for name, s in healthy.items():
            from_ = CapacityFrom.READY_ENDPOINTS if s.capacity_from in _READY else CapacityFrom.PODS
            if s.capacity_from == CapacityFrom.REPLICAS:  # Ray Serve's replicas, not its nodes
                from_ = CapacityFrom.REPLICAS
            result[name] = replaced(s, capacity=s.pods, capacity_from=from_)
        return result, None
    per_pod, largest = min(sizes), max(sizes)
    per_request = _tokens_per_request(known.values())
    result = dict(healthy)
    notes = []
    for name in sorted(n for n in healthy if n not in known):
        s = healthy[name]
        if per_request is not None and _measurable(s):
            assert s.running is not None and s.occupied is not None
            estimate = s.running * per_request / s.occupied
            # never more than its pods as the largest pod known: a cluster that reports a
            # little KV use and many requests must not draw a fleet's traffic to itself
            ceiling = (s.pods or 1.0) * largest
            capped = " (capped: its pods × the largest pod)" if estimate > ceiling else ""
            estimate = min(estimate, ceiling)
            result[name] = replaced(s, capacity=estimate, capacity_from=CapacityFrom.MEASURED)
            notes.append(
                f"{name}: {estimate:.0f} tokens measured, {s.running:.1f} running × "
                f"{per_request:.0f} tokens a request / {s.occupied:.3f} KV use{capped}"
            )
            continue
        estimate_ = s.pods * per_pod if s.pods else None
        result[name] = replaced(s, capacity=estimate_, capacity_from=CapacityFrom.LEARNED_PER_POD)
        notes.append(f"{name}: pods × {per_pod:.0f} tokens, the smallest pod (no load to measure)")
    return result, (
        f"capacity where no KV pool is published, against {', '.join(sorted(known))}: "
        + "; ".join(notes)
    )


def _tokens_per_request(known: Iterable[Signals]) -> float | None:
    """KV tokens a running request holds on the clusters that publish their pools."""
    held = running = 0.0
    for s in known:
        if _measurable(s) and s.kv_tokens is not None:
            assert s.running is not None and s.occupied is not None
            held += s.occupied * s.kv_tokens
            running += s.running
    return held / running if running > 0 else None


def _measurable(s: Signals) -> bool:
    return (
        s.occupied is not None
        and s.running is not None
        and MIN_OCCUPIED <= s.occupied <= 1.0
        and MIN_RUNNING <= s.running < math.inf
    )


_READY = (CapacityFrom.READY_ENDPOINTS, CapacityFrom.KV_TOKENS_PER_POD)


def derive(
    health: ClusterHealth,
    memory: SignalMemory | None,
    params: WeightSettings,
    arrived: float | None = None,
) -> Signals | None:
    """What the laws read of a cluster this tick: ``current`` with its filtered demand and,
    when ``forecast_horizon`` is on and the window is full, its KV forecast; ``arrived``:
    its arrivals this tick, where they were read this tick."""
    more: dict[str, Any] = {}
    if arrived is not None:
        more["arrived"] = arrived
    if memory is not None:
        if memory.demand is not None:
            more["demand"] = memory.demand
        if memory.occupancy is not None:
            more["occupied"], more["running"] = memory.occupancy
        if len(memory.readings) == 2 and health.metrics is not None:
            more["previous"] = memory.readings[0]
        horizon = float(params.forecast_horizon)
        # Two noisy points make a wild slope: forecast only from a full window.
        if horizon > 0 and len(memory.history) == FORECAST_POINTS:
            more["kv"] = forecast_kv(memory.history, horizon)
    return current(health, params.latency_quantile, **more)


def forecast_kv(history: Sequence[tuple[float, float]], horizon: float) -> float:
    """KV ``horizon`` seconds after the last of ``history`` ((time, kv) pairs, oldest first),
    on the least-squares line through them when it rises; at most 1. One point: itself."""
    last = history[-1][1]
    if horizon <= 0 or len(history) < 2:
        return last
    n = len(history)
    mean_t = sum(t for t, _ in history) / n
    mean_kv = sum(kv for _, kv in history) / n
    spread = sum((t - mean_t) ** 2 for t, _ in history)
    if spread <= 0:
        return last
    slope = sum((t - mean_t) * (kv - mean_kv) for t, kv in history) / spread
    # Only rising KV is anticipated: late shedding overloads, late returning merely waits.
    return min(1.0, last + max(0.0, slope) * horizon)
