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
from controller.sources.reader import PageReader

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
    world = _World(scenario, settings, seed)
    router = _Router(world, scenario, policy, settings, seed, delay, jitter, honour)
    for step in range(int(scenario.duration / DT)):
        t = step * DT
        world.happen(t)
        await router.ask(t)
        router.actuate(t)
        router.route(t)
        world.serve(t, router.effective)
    return world.finish()


class _World:
    """The clusters, the requests no weight moves, and the trace of what happened."""

    def __init__(self, scenario: Scenario, settings: Settings, seed: int) -> None:
        # One stream for the world (the same requests whatever the policy), one for the scrapes.
        self.rng = random.Random(f"{scenario.name}/{seed}/world")
        self.scraper = Scraper(random.Random(f"{scenario.name}/{seed}/scrape"))
        self.clusters = {c.name: Cluster.build(c) for c in scenario.clusters}
        for cluster in self.clusters.values():
            cluster.scrape_age = scenario.scrape_age
        self.readers = {
            c.name: PageReader(c, settings.scrape.min_latency_requests, settings.engine_table())
            for c in settings.clusters
        }
        self.names = list(self.clusters)
        self.trace = Trace(self.names)
        self.lengths = scenario.lengths
        self.local = {
            n: Arrivals(c.spec.local, random.Random(f"{scenario.name}/{seed}/local/{n}"))
            for n, c in self.clusters.items()
        }
        self.events = sorted(scenario.events, key=lambda e: e.at)
        self.ident = 0
        self._done: list[tuple[Request, float]] = []

    def happen(self, t: float) -> None:
        """The scenario's events due by ``t``; every cluster notes the time."""
        while self.events and self.events[0].at <= t:
            event = self.events.pop(0)
            event.action(self.clusters[event.cluster], self.scraper, t)
            self.trace.events.append((t, event.note))
        for cluster in self.clusters.values():
            cluster.remember(t)

    def request(self, arrival: float, routed: bool) -> Request:
        prompt, output = self.lengths.draw(self.rng)
        self.ident += 1
        return Request(arrival, prompt, output, routed, self.ident)

    def serve(self, t: float, effective: dict[str, float]) -> None:
        """Local traffic arrives, every live replica runs one slice, the trace records it."""
        for name, source in self.local.items():
            for arrival in source.until(t + DT):
                self.clusters[name].offer(self.request(arrival, False))
        trace = self.trace
        for name, cluster in self.clusters.items():
            if cluster.alive:
                before = len(self._done)
                for replica in cluster.replicas:
                    replica.step(t, DT, self._done)
                for _, latency in self._done[before:]:
                    cluster.epp.observe(latency)
            trace.kv[name].append(cluster.kv if cluster.alive else 0.0)
            trace.waiting[name].append(cluster.waiting if cluster.alive else 0)
            trace.alive[name].append(cluster.alive)
            trace.effective[name].append(effective[name])
        trace.seconds.append(t)
        for _, latency in self._done:
            trace.e2e.append(latency)
        self._done.clear()

    def finish(self) -> Trace:
        self.trace.lost = sum(c.lost for c in self.clusters.values())
        self.trace.ttft = _ttfts(self.clusters)
        return self.trace


class _Router:
    """The policy's decisions every interval, acting after the actuation delay, and the
    routed requests split by the weights in force."""

    def __init__(
        self,
        world: _World,
        scenario: Scenario,
        policy: Policy,
        settings: Settings,
        seed: int,
        delay: float,
        jitter: float,
        honour: bool,
    ) -> None:
        self._world = world
        self._policy = policy
        self._rng = random.Random(f"{scenario.name}/{seed}/route")
        # Its own stream per moment, so every policy meets the same gateway: a publication at
        # time t takes effect after the same delay whoever made it (common random numbers),
        # and routing draws stay in step across policies.
        self._delays = f"{scenario.name}/{seed}/delay"
        self._arrivals = Arrivals(scenario.load, random.Random(f"{scenario.name}/{seed}/arrivals"))
        self._interval = settings.interval
        self._delay, self._jitter, self._honour = delay, jitter, honour
        self._next_tick = 0.0
        self._pending: list[tuple[float, dict[str, int]]] = []
        start = scenario.start or dict.fromkeys(world.names, 1.0)
        total = sum(start.values())
        self.effective = {n: 100.0 * start.get(n, 0.0) / total for n in world.names}

    async def ask(self, t: float) -> None:
        """On the interval: the policy reads the pages and may publish; a publication takes
        effect ``delay`` (± ``jitter``) later."""
        if t < self._next_tick - 1e-9:
            return
        world = self._world
        await _tick(t, world.clusters, world.scraper, world.readers, self._policy, world.trace)
        published = world.trace.published
        if published and published[-1][0] == t:
            draw = random.Random(f"{self._delays}/{t:.1f}").uniform(-self._jitter, self._jitter)
            spread = 1.0 + draw
            bisect.insort(self._pending, (t + self._delay * spread, published[-1][1]))
        self._next_tick += self._interval

    def actuate(self, t: float) -> None:
        while self._pending and self._pending[0][0] <= t:
            published = self._pending.pop(0)[1]
            if self._honour:
                self.effective = {n: float(w) for n, w in published.items()}

    def route(self, t: float) -> None:
        """This slice's routed requests, each to a cluster picked by the weights in force."""
        order = [n for n in self._world.names if self.effective[n] > 0]
        cumulative: list[float] = []
        running = 0.0
        for n in order:
            running += self.effective[n]
            cumulative.append(running)
        for arrival in self._arrivals.until(t + DT):
            request = self._world.request(arrival, True)
            pick = self._rng.random() * running
            target = order[min(bisect.bisect_right(cumulative, pick), len(order) - 1)]
            self._world.clusters[target].offer(request)


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
    metrics = {
        n: readers[n].read(scraper.pages(c, t), scraper.epp(c, t), t, 0.0)
        for n, c in clusters.items()
    }
    published = await policy.tick(t, metrics)
    trace.ticks.append(t)
    for name, cluster in clusters.items():
        trace.healthy[name].append(policy.healthy(name))
        trace.received[name].append(cluster.received)
    if published is not None:
        trace.published.append((t, published))
