"""Scenarios: small declarative descriptions of a fleet, its load and what happens to it.

Capacities are GPUs × 32 concurrent requests, each held for 20 s, so a 4-GPU cluster completes
6.4 requests/s when full. ``load`` is the routable traffic in requests/s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from controller.simulation.world import ClusterSpec, ClusterState, Rate, Scraper, constant

Action = Callable[[ClusterState, Scraper, float], None]


@dataclass(frozen=True)
class Event:
    at: float
    cluster: str
    action: Action
    note: str


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    clusters: list[ClusterSpec]
    load: Rate
    events: list[Event] = field(default_factory=list)
    hot: str | None = None  # the cluster whose recovery from >90% KV is timed
    duration: float = 3600.0


def kill(state: ClusterState, _: Scraper, __: float) -> None:
    state.alive = False


def revive(state: ClusterState, _: Scraper, __: float) -> None:
    state.alive = True


def flap(rate: float) -> Action:
    def action(state: ClusterState, _: Scraper, __: float) -> None:
        state.scrape_failure_rate = rate

    return action


def freeze(state: ClusterState, scraper: Scraper, now: float) -> None:
    scraper.freeze(state, now)


def restyle(style: Literal["v1", "v0"]) -> Action:
    def action(state: ClusterState, _: Scraper, __: float) -> None:
        state.style = style

    return action


def ramp(start: float, end: float, low: float, high: float) -> Rate:
    """``low`` until ``start``, linearly to ``high`` at ``end``, then ``high``."""

    def rate(t: float) -> float:
        if t <= start:
            return low
        if t >= end:
            return high
        return low + (high - low) * (t - start) / (end - start)

    return rate


def window(start: float, end: float, base: Rate, extra: Rate) -> Rate:
    return lambda t: base(t) + (extra(t) if start <= t < end else 0.0)


def three(gpus: int = 4) -> list[ClusterSpec]:
    return [ClusterSpec("a", gpus=gpus), ClusterSpec("b", gpus=gpus), ClusterSpec("c", gpus=gpus)]


def steady() -> Scenario:
    return Scenario(
        "steady",
        "three equal clusters at 50% with measurement noise",
        three(),
        constant(0.5 * 3 * 6.4),
    )


def hot_cluster() -> Scenario:
    # b's own local load jumps within 10 s so that, at a 50/50 split, b would sit at 95% while
    # a sits at 20%; short (10 s) requests fill b's cache faster than one tick can react.
    burst = window(600, 2400, constant(0.0), ramp(600, 610, 0.0, 19.2))
    clusters = [
        ClusterSpec("a", gpus=8, service_time=10.0),
        ClusterSpec("b", gpus=8, service_time=10.0, external=burst),
    ]
    return Scenario(
        "hot-cluster",
        "b's local load drives it from 20% toward 95% KV; a stays at 20%",
        clusters,
        constant(10.24),
        hot="b",
    )


def dead_and_recover() -> Scenario:
    events = [Event(900, "c", kill, "c dies"), Event(1800, "c", revive, "c recovers")]
    return Scenario(
        "dead-recover",
        "c dies at 15 min and comes back at 30 min",
        three(),
        constant(0.4 * 3 * 6.4),
        events,
    )


def flapping() -> Scenario:
    events = [Event(300, "b", flap(0.3), "30% of b's scrapes fail")]
    return Scenario(
        "flapping",
        "b is fine but 30% of its scrapes fail",
        three(),
        constant(0.5 * 3 * 6.4),
        events,
    )


def all_overloaded() -> Scenario:
    return Scenario(
        "all-overloaded",
        "130% of the fleet's capacity, all the time",
        three(),
        constant(1.3 * 3 * 6.4),
    )


def frozen() -> Scenario:
    burst = window(900, 3600, constant(0.0), ramp(900, 960, 0.0, 7.0))
    clusters = [ClusterSpec("a", gpus=8), ClusterSpec("b", gpus=8, external=burst)]
    events = [Event(900, "b", freeze, "b's exporter freezes as b gets busy")]
    return Scenario(
        "frozen",
        "b's metrics freeze (stamped) while b's real load climbs",
        clusters,
        constant(5.12),
        events,
        hot="b",
    )


def heterogeneous() -> Scenario:
    clusters = [ClusterSpec("small", gpus=2), ClusterSpec("large", gpus=8)]
    return Scenario(
        "heterogeneous",
        "2 GPUs beside 8 GPUs at 60% of the total",
        clusters,
        constant(0.6 * 10 * 1.6),
        hot="small",
    )


def spike() -> Scenario:
    base = 0.35 * 3 * 6.4
    return Scenario(
        "spike",
        "3x traffic for 5 minutes at 15 min",
        three(),
        window(900, 1200, constant(base), constant(2 * base)),
    )


def rename() -> Scenario:
    clusters = [ClusterSpec("a"), ClusterSpec("b", style="v0")]
    events = [Event(900, "b", restyle("v1"), "b upgrades vLLM: gpu_ -> kv_cache_usage_perc")]
    return Scenario(
        "rename",
        "b's KV metric is renamed mid-run (vLLM upgrade)",
        clusters,
        constant(0.5 * 2 * 6.4),
        events,
    )


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    s().name: s
    for s in (
        steady,
        hot_cluster,
        dead_and_recover,
        flapping,
        all_overloaded,
        frozen,
        heterogeneous,
        spike,
        rename,
    )
}
