"""Scores of one simulated run, from its trace."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from controller.simulation.engine import Trace
from controller.simulation.scenarios import Scenario

OVERLOAD = 0.9
RECOVERED = 0.8
RECOVERY_TICKS = 10  # ticks after a cluster's return in which its ramp-up is judged


@dataclass(frozen=True)
class Scores:
    policy: str
    recovery_s: float | None  # hot cluster: first >90% KV until back <80% (None: never >90%)
    peak_kv: dict[str, float]
    overload_s: float  # seconds during which any live cluster was above 90% KV
    overload_cluster_s: float  # the same summed over clusters (cluster-seconds)
    mean_latency_s: float  # request latency averaged over the traffic routed
    dead_traffic_share: float | None  # traffic sent to dead clusters after detection
    reversals_per_hour: float  # weight direction changes, all clusters
    writes_per_hour: float
    recovery_jump: int | None  # largest one-tick gain of a cluster coming back from 0
    unhealthy_alive_s: float | None  # seconds a live, answering cluster was judged unhealthy

    def row(self) -> dict[str, Any]:
        return asdict(self)


def score(
    policy: str, scenario: Scenario, trace: Trace, interval: float, detect_ticks: int
) -> Scores:
    hours = scenario.duration / 3600.0
    return Scores(
        policy=policy,
        recovery_s=_recovery(trace, scenario.hot),
        peak_kv={n: round(max(trace.kv[n]), 3) for n in trace.names},
        overload_s=float(
            sum(
                1
                for i in range(len(trace.seconds))
                if any(trace.alive[n][i] and trace.kv[n][i] > OVERLOAD for n in trace.names)
            )
        ),
        overload_cluster_s=float(
            sum(
                1
                for n in trace.names
                for kv, alive in zip(trace.kv[n], trace.alive[n], strict=True)
                if alive and kv > OVERLOAD
            )
        ),
        mean_latency_s=_mean_latency(trace),
        dead_traffic_share=_dead_share(trace, interval * detect_ticks),
        reversals_per_hour=_reversals(trace) / hours,
        writes_per_hour=len(trace.published) / hours,
        recovery_jump=_recovery_jump(trace),
        unhealthy_alive_s=_unhealthy_alive(trace, interval),
    )


def _mean_latency(trace: Trace) -> float:
    weighted = sum(
        trace.routed[n][i] * trace.latency[n][i]
        for n in trace.names
        for i in range(len(trace.seconds))
        if trace.alive[n][i]
    )
    total = sum(
        trace.routed[n][i]
        for n in trace.names
        for i in range(len(trace.seconds))
        if trace.alive[n][i]
    )
    return round(weighted / total, 2) if total else 0.0


def _recovery(trace: Trace, hot: str | None) -> float | None:
    if hot is None:
        return None
    series = trace.kv[hot]
    crossed = next((i for i, kv in enumerate(series) if kv >= OVERLOAD), None)
    if crossed is None:
        return None
    back = next((i for i in range(crossed, len(series)) if series[i] < RECOVERED), len(series))
    return float(back - crossed)


def _dead_share(trace: Trace, detection: float) -> float | None:
    sent = total = 0.0
    any_death = False
    for name in trace.names:
        died_at: float | None = None
        for i, t in enumerate(trace.seconds):
            alive = trace.alive[name][i]
            if not alive and died_at is None:
                died_at, any_death = t, True
            elif alive:
                died_at = None
            if died_at is not None and t >= died_at + detection:
                sent += trace.routed[name][i]
                total += sum(trace.routed[n][i] for n in trace.names)
    if not any_death:
        return None
    return sent / total if total else 0.0


def _reversals(trace: Trace) -> int:
    count = 0
    for name in trace.names:
        last_sign = 0
        previous: int | None = None
        for _, weights in trace.published:
            value = weights[name]
            if previous is not None and value != previous:
                sign = 1 if value > previous else -1
                if last_sign and sign != last_sign:
                    count += 1
                last_sign = sign
            previous = value
    return count


def _recovery_jump(trace: Trace) -> int | None:
    jumps: list[int] = []
    for name in trace.names:
        series = [w[name] for _, w in trace.published]
        for i in range(1, len(series)):
            if series[i - 1] == 0 and series[i] > 0:
                window = series[i - 1 : i + RECOVERY_TICKS]
                jumps.append(max(b - a for a, b in itertools.pairwise(window)))
    return max(jumps) if jumps else None


def _unhealthy_alive(trace: Trace, interval: float) -> float | None:
    if all(h is None for n in trace.names for h in trace.healthy[n]):
        return None
    seconds = 0.0
    for name in trace.names:
        for i, tick in enumerate(trace.ticks):
            second = min(int(tick), len(trace.seconds) - 1)
            if trace.healthy[name][i] is False and trace.alive[name][second]:
                seconds += interval
    return seconds
