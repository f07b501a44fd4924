"""The closed loop on a virtual clock: scrape → decide → (actuation delay) → requests → KV.

The world advances in slices of ``DT`` seconds. Every ``interval`` the policy reads the rendered
pages (through the daemon's own PageReader) and may publish weights; a publication takes effect
``delay`` seconds later (± ``jitter``), as a gateway picks up a changed route. Requests already
in flight drain where they are. Deterministic for a seed; nothing sleeps.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from controller.settings import Settings
from controller.simulation.policies import Policy
from controller.simulation.scenarios import Scenario
from controller.simulation.vllm import Request
from controller.simulation.world import Arrivals, Cluster, Scraper
from controller.sources.scrape import PageReader

DT = 0.5


@dataclass
class Trace:
    """Everything scores and plots need: one row per slice, per tick, or per request."""

    names: list[str]
    dt: float = DT
    seconds: list[float] = field(default_factory=list)
    kv: dict[str, list[float]] = field(default_factory=dict)
    waiting: dict[str, list[int]] = field(default_factory=dict)
    alive: dict[str, list[bool]] = field(default_factory=dict)
    effective: dict[str, list[float]] = field(default_factory=dict)  # weight in force, 0..100
    ticks: list[float] = field(default_factory=list)
    published: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    healthy: dict[str, list[bool | None]] = field(default_factory=dict)  # per tick
    received: dict[str, list[int]] = field(default_factory=dict)  # routable arrivals, per tick
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    lost: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        tables: tuple[dict[str, list], ...] = (  # type: ignore[type-arg]
            self.kv,
            self.waiting,
            self.alive,
            self.effective,
            self.healthy,
            self.received,
        )
        for table in tables:
            for name in self.names:
                table.setdefault(name, [])


async def run(
    scenario: Scenario,
    policy: Policy,
    settings: Settings,
    seed: int = 1,
    delay: float = 10.0,
    jitter: float = 0.2,
    honour: bool = True,
) -> Trace:
    """Simulate ``scenario`` under ``policy``. ``jitter`` is the actuation delay's relative
    spread (uniform ± that fraction). ``honour=False`` is a router that ignores what is
    published and keeps the even split (what the realised-share alert is for)."""
    # One stream for the world (the same requests whatever the policy), one for the scrapes.
    world_rng = random.Random(f"{scenario.name}/{seed}/world")
    route_rng = random.Random(f"{scenario.name}/{seed}/route")
    scraper = Scraper(random.Random(f"{scenario.name}/{seed}/scrape"))
    clusters = {c.name: Cluster.build(c) for c in scenario.clusters}
    for cluster in clusters.values():
        cluster.scrape_age = scenario.scrape_age
    readers = {
        c.name: PageReader(c, settings.scrape.min_latency_requests) for c in settings.clusters
    }
    names = list(clusters)
    trace = Trace(names)
    routed = Arrivals(scenario.load, random.Random(f"{scenario.name}/{seed}/arrivals"))
    local = {
        n: Arrivals(c.spec.local, random.Random(f"{scenario.name}/{seed}/local/{n}"))
        for n, c in clusters.items()
    }
    lengths = scenario.lengths
    effective = dict.fromkeys(names, 100.0 / len(names))
    pending: list[tuple[float, dict[str, int]]] = []
    events = sorted(scenario.events, key=lambda e: e.at)
    interval = settings.interval
    next_tick = 0.0
    ident = 0
    done: list[tuple[Request, float]] = []
    steps = int(scenario.duration / DT)
    for step in range(steps):
        t = step * DT
        while events and events[0].at <= t:
            event = events.pop(0)
            event.action(clusters[event.cluster], scraper, t)
            trace.events.append((t, event.note))
        for cluster in clusters.values():
            cluster.remember(t)
        if t >= next_tick - 1e-9:
            await _tick(t, clusters, scraper, readers, policy, trace)
            if trace.published and trace.published[-1][0] == t:
                spread = 1.0 + route_rng.uniform(-jitter, jitter)
                bisect.insort(pending, (t + delay * spread, trace.published[-1][1]))
            next_tick += interval
        while pending and pending[0][0] <= t:
            published = pending.pop(0)[1]
            if honour:
                effective = {n: float(w) for n, w in published.items()}
        order = [n for n in names if effective[n] > 0]
        cumulative: list[float] = []
        running = 0.0
        for n in order:
            running += effective[n]
            cumulative.append(running)
        for arrival in routed.until(t + DT):
            prompt, output = lengths.draw(world_rng)
            ident += 1
            pick = route_rng.random() * running
            target = order[min(bisect.bisect_right(cumulative, pick), len(order) - 1)]
            clusters[target].offer(Request(arrival, prompt, output, True, ident))
        for name, source in local.items():
            for arrival in source.until(t + DT):
                prompt, output = lengths.draw(world_rng)
                ident += 1
                clusters[name].offer(Request(arrival, prompt, output, False, ident))
        for name, cluster in clusters.items():
            if cluster.alive:
                for replica in cluster.replicas:
                    replica.step(t, DT, done)
            trace.kv[name].append(cluster.kv if cluster.alive else 0.0)
            trace.waiting[name].append(cluster.waiting if cluster.alive else 0)
            trace.alive[name].append(cluster.alive)
            trace.effective[name].append(effective[name])
        trace.seconds.append(t)
        for _, latency in done:
            trace.e2e.append(latency)
        done.clear()
    trace.lost = sum(c.lost for c in clusters.values())
    trace.ttft = _ttfts(clusters)
    return trace


def _ttfts(clusters: dict[str, Cluster]) -> list[float]:
    return [v for c in clusters.values() for r in c.replicas for v in r.first_tokens]


async def _tick(
    t: float,
    clusters: dict[str, Cluster],
    scraper: Scraper,
    readers: dict[str, PageReader],
    policy: Policy,
    trace: Trace,
) -> None:
    metrics = {n: readers[n].read(scraper.pages(c, t), None, t, 0.0) for n, c in clusters.items()}
    published = await policy.tick(t, metrics)
    trace.ticks.append(t)
    for name, cluster in clusters.items():
        trace.healthy[name].append(policy.healthy(name))
        trace.received[name].append(cluster.received)
    if published is not None:
        trace.published.append((t, published))
