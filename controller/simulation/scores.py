"""Scores of one simulated run, from its trace.

- ``overload_cluster_s``: cluster-seconds during which a live cluster had KV > 90% or a
  non-empty queue (requests waiting for a batch slot or for KV blocks).
- ``ttft_p99_s`` / ``e2e_p99_s``: over every request that got a first token / completed.
- ``queued_s``: request-seconds spent waiting, summed; ``lost``: requests sent to (or inside) a
  dead cluster.
- ``writes_per_hour``, ``reversals_per_hour`` (a cluster's weight changing direction), and
  ``largest_step`` (the biggest change of one cluster's weight in one write).
- ``recovery_s``: for the scenario's hot cluster, from its 10 s mean KV first reaching 90% to
  that mean being back under 80% (``None``: it never reached 90%; the rest of the run if never).
- ``dead_share``: share of routed requests sent to a dead cluster once it had been detected
  and the change had had time to act (detection + actuation delay + one interval).
- ``return_step``: the largest one-write gain of a cluster in the ten writes after it came back.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from controller.churn import largest_step, reversals
from controller.simulation.engine import Trace
from controller.simulation.scenarios import Scenario

OVERLOAD = 0.9
RECOVERED = 0.8
MEAN_WINDOW = 10.0  # seconds of KV averaged when timing recovery
RETURN_WRITES = 10


@dataclass(frozen=True)
class Scores:
    policy: str
    overload_cluster_s: float
    ttft_p99_s: float
    e2e_p99_s: float
    queued_s: float
    lost: int
    writes_per_hour: float
    reversals_per_hour: float
    largest_step: int
    recovery_s: float | None
    dead_share: float | None
    return_step: int | None
    peak_kv: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


def score(
    policy: str, scenario: Scenario, trace: Trace, interval: float, detect_ticks: int, delay: float
) -> Scores:
    hours = scenario.duration / 3600.0
    dt = trace.dt
    overload = 0.0
    queued = 0.0
    for name in trace.names:
        for kv, waiting, alive in zip(
            trace.kv[name], trace.waiting[name], trace.alive[name], strict=True
        ):
            if alive and (kv > OVERLOAD or waiting > 0):
                overload += dt
            queued += waiting * dt
    return Scores(
        policy=policy,
        overload_cluster_s=overload,
        ttft_p99_s=round(_quantile(trace.ttft, 0.99), 2),
        e2e_p99_s=round(_quantile(trace.e2e, 0.99), 2),
        queued_s=round(queued),
        lost=trace.lost,
        writes_per_hour=len(trace.published) / hours,
        reversals_per_hour=reversals(trace.published, trace.names) / hours,
        largest_step=largest_step(trace.published, trace.names),
        recovery_s=_recovery(trace, scenario),
        dead_share=_dead_share(trace, interval * (detect_ticks + 1) + delay * 1.2),
        return_step=_return_step(trace),
        peak_kv=round(max(max(trace.kv[n]) for n in trace.names), 3),
    )


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _recovery(trace: Trace, scenario: Scenario) -> float | None:
    if scenario.hot is None:
        return None
    series = trace.kv[scenario.hot]
    width = max(1, int(MEAN_WINDOW / trace.dt))
    means = [
        sum(series[max(0, i - width + 1) : i + 1]) / len(series[max(0, i - width + 1) : i + 1])
        for i in range(len(series))
    ]
    start = int(scenario.hot_from / trace.dt)
    crossed = next((i for i in range(start, len(means)) if means[i] >= OVERLOAD), None)
    if crossed is None:
        return None
    back = next((i for i in range(crossed, len(means)) if means[i] < RECOVERED), len(means))
    return (back - crossed) * trace.dt


def _dead_share(trace: Trace, settle: float) -> float | None:
    """Share of routed arrivals that went to dead clusters, from ``settle`` after each death."""
    sent = total = 0.0
    any_death = False
    seconds_per_slice = trace.dt
    for name in trace.names:
        died: float | None = None
        for k in range(1, len(trace.ticks)):
            t = trace.ticks[k]
            alive = trace.alive[name][min(len(trace.alive[name]) - 1, int(t / seconds_per_slice))]
            if not alive and died is None:
                died, any_death = t, True
            elif alive:
                died = None
            if died is not None and t >= died + settle:
                sent += trace.received[name][k] - trace.received[name][k - 1]
                total += sum(trace.received[n][k] - trace.received[n][k - 1] for n in trace.names)
    if not any_death:
        return None
    return round(sent / total, 4) if total else 0.0


def _return_step(trace: Trace) -> int | None:
    jumps: list[int] = []
    for name in trace.names:
        series = [w[name] for _, w in trace.published]
        for i in range(1, len(series)):
            if series[i - 1] <= 1 and series[i] > 1:  # back from 0 (or the schema's minimum 1)
                window = series[i - 1 : i + RETURN_WRITES]
                jumps.append(max(b - a for a, b in itertools.pairwise(window)))
    return max(jumps) if jumps else None
