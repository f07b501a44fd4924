"""The closed loop on a virtual clock: scrape → decide → publish → (delay) → traffic → KV.

"ours" is the real daemon's Reconciler — the same health and weights code, fed with
ClusterMetrics read from rendered pages by the same PageReader — driven tick by tick with the
simulated time as its clock. Two baselines run in the same world: "naive" (weights ∝ 1 − KV, no
smoothing, floor, deadband or health) and "static" (equal weights, never changed).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller import weights
from controller.exporter import Snapshot, make_registry
from controller.loop import Reconciler
from controller.model import ClusterMetrics, Write
from controller.publish.dryrun import DryRunPublisher
from controller.settings import Settings, build_settings
from controller.simulation.scenarios import Scenario
from controller.simulation.world import ClusterState, Scraper
from controller.sources.scrape import PageReader


@dataclass
class Trace:
    """Everything scores and plots need, one row per simulated second or per tick."""

    names: list[str]
    seconds: list[float] = field(default_factory=list)
    kv: dict[str, list[float]] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)
    alive: dict[str, list[bool]] = field(default_factory=dict)
    effective: dict[str, list[float]] = field(default_factory=dict)  # weight in force, 0..100
    routed: dict[str, list[float]] = field(default_factory=dict)  # req/s sent to the cluster
    ticks: list[float] = field(default_factory=list)
    published: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    healthy: dict[str, list[bool | None]] = field(default_factory=dict)  # per tick, ours only

    def __post_init__(self) -> None:
        for table in (self.kv, self.latency, self.alive, self.effective, self.routed, self.healthy):
            for name in self.names:
                table.setdefault(name, [])


class Policy(Protocol):
    name: str

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        """The weights to publish now, or ``None`` for no write."""
        ...

    def healthy(self, name: str) -> bool | None: ...


class _SimSource:
    def __init__(self, name: str) -> None:
        self.name = name
        self.next: ClusterMetrics | None = None

    @property
    def cluster(self) -> str:
        return self.name

    async def fetch(self) -> ClusterMetrics:
        assert self.next is not None
        return self.next


class Ours:
    """The daemon's own Reconciler with simulated sources and a virtual clock."""

    def __init__(self, settings: Settings, name: str = "ours") -> None:
        self.name = name
        self._now = 0.0
        self._sources = {c.name: _SimSource(c.name) for c in settings.clusters}
        self._snapshot = Snapshot()
        _, metrics = make_registry(self._snapshot)
        self._reconciler = Reconciler(
            settings,
            list(self._sources.values()),
            DryRunPublisher(),
            metrics,
            self._snapshot,
            clock=lambda: self._now,
        )

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        self._now = now
        for name, source in self._sources.items():
            source.next = metrics[name]
        report = await self._reconciler.tick()
        only = report.only  # the implicit target: what it would apply goes to the router
        if only is None or only.outcome.write is not Write.WOULD:
            return None
        return dict(only.outcome.applied)

    def healthy(self, name: str) -> bool | None:
        health = self._snapshot.clusters[name].health
        return None if health is None else health.healthy


class Naive:
    """Weights ∝ 1 − KV of the last reading; nothing else."""

    name = "naive"

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._published: dict[str, int] | None = None

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        for name, m in metrics.items():
            if m.kv_mean is not None:
                self._last[name] = m.kv_mean
        headroom = {n: max(0.0, 1.0 - self._last.get(n, 0.0)) for n in metrics}
        if sum(headroom.values()) <= 0:
            headroom = dict.fromkeys(metrics, 1.0)
        new = weights.proportional(headroom, weights.TOTAL)
        if new == self._published:
            return None
        self._published = new
        return new

    def healthy(self, name: str) -> bool | None:
        return None


class Static:
    """Equal weights, written once."""

    name = "static"

    def __init__(self) -> None:
        self._done = False

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        if self._done:
            return None
        self._done = True
        return weights.proportional(dict.fromkeys(metrics, 1.0), weights.TOTAL)

    def healthy(self, name: str) -> bool | None:
        return None


def sim_settings(scenario: Scenario, interval: float, overrides: Mapping[str, object]) -> Settings:
    """Settings for ``scenario``'s clusters: the shipped defaults plus ``overrides``."""
    clusters = [
        {
            "name": c.name,
            "vllm_urls": [f"http://{c.name}-pod-{i}:8000/metrics" for i in range(c.pods)],
        }
        for c in scenario.clusters
    ]
    return build_settings(
        {
            "interval": interval,
            "clusters": clusters,
            "scrape": {"timeout": interval / 2},
            "weights": dict(overrides),
        }
    )


async def run(
    scenario: Scenario,
    policy: Policy,
    settings: Settings,
    seed: int = 1,
    actuation_delay: float = 10.0,
) -> Trace:
    """Simulate ``scenario`` under ``policy``: deterministic for a seed, no sleeping."""
    rng = random.Random(f"{scenario.name}/{seed}")
    scraper = Scraper(rng)
    world = {c.name: ClusterState(c, style=c.style) for c in scenario.clusters}
    readers = {
        c.name: PageReader(c, settings.scrape.min_latency_requests) for c in settings.clusters
    }
    names = list(world)
    trace = Trace(names)
    effective = dict.fromkeys(names, 100.0 / len(names))
    pending: list[tuple[float, dict[str, int]]] = []
    events = sorted(scenario.events, key=lambda e: e.at)
    interval = settings.interval
    t = 0.0
    while t < scenario.duration:
        while events and events[0].at <= t:
            event = events.pop(0)
            event.action(world[event.cluster], scraper, t)
        if t % interval < 1e-9 or abs(t % interval - interval) < 1e-9:
            await _tick(t, world, scraper, readers, policy, trace, pending, actuation_delay)
        while pending and pending[0][0] <= t:
            effective = {n: float(w) for n, w in pending.pop(0)[1].items()}
        _advance(t, world, effective, scenario, trace)
        t += 1.0
    return trace


async def _tick(
    t: float,
    world: Mapping[str, ClusterState],
    scraper: Scraper,
    readers: Mapping[str, PageReader],
    policy: Policy,
    trace: Trace,
    pending: list[tuple[float, dict[str, int]]],
    delay: float,
) -> None:
    metrics = {n: readers[n].read(scraper.pages(s, t), None, t, 0.0) for n, s in world.items()}
    published = await policy.tick(t, metrics)
    trace.ticks.append(t)
    for name in world:
        trace.healthy[name].append(policy.healthy(name))
    if published is not None:
        trace.published.append((t, published))
        pending.append((t + delay, published))


def _advance(
    t: float,
    world: Mapping[str, ClusterState],
    effective: Mapping[str, float],
    scenario: Scenario,
    trace: Trace,
) -> None:
    load = scenario.load(t)
    total = sum(effective.values()) or 1.0
    trace.seconds.append(t)
    for name, state in world.items():
        routed = load * effective[name] / total
        state.step(t, routed)
        trace.kv[name].append(state.kv)
        trace.latency[name].append(state.latency())
        trace.alive[name].append(state.alive)
        trace.effective[name].append(effective[name])
        trace.routed[name].append(routed)
