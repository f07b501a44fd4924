"""What decides the weights in a simulation: the daemon itself, and the baselines.

- ``Ours``: the daemon's own Reconciler — the same health, weights and (dry-run) publishing code,
  fed with ClusterMetrics read from rendered pages — on the simulated clock. With
  ``weights.law: integral`` it is the previous law, kept as a named baseline.
- ``Naive``: weights ∝ 1 − KV of the last reading, with the same health judgement (an unhealthy
  cluster gets 0), written whenever they change.
- ``Proportional``: a textbook P controller with the same health judgement: each cluster's
  share is the even split plus ``gain`` × (fleet mean KV − its KV).
- ``Static``: equal weights, written once.
- ``Oracle``: a floor, not a controller (it reads the scenario's truth); ``PodsOnly``: the
  daemon with capacity in pods (before it read the KV pools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from controller import health, signals, weights
from controller.model import IMPLICIT_TARGET, ClusterHealth, ClusterMetrics, Signals, Write
from controller.settings import Settings
from controller.simulation.scenarios import Scenario, capacity, kill, revive
from controller.testing import Driver
from controller.weights.rounding import round_to_total
from controller.weights.steps import capped, within


class Policy(Protocol):
    name: str

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        """The weights to publish now, or ``None`` for no write."""
        ...

    def healthy(self, name: str) -> bool | None: ...


class Ours:
    """The daemon's own Reconciler with simulated sources and a virtual clock."""

    def __init__(self, settings: Settings, name: str = "ours") -> None:
        self.name = name
        self._driver = Driver(settings)

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        report = await self._driver.tick(now, metrics)
        only = report.only  # the implicit target: what it would apply goes to the router
        if only is None or only.outcome.write is not Write.WOULD:
            return None
        return dict(only.outcome.applied)

    def healthy(self, name: str) -> bool | None:
        state = self._driver.snapshot.report.clusters[name].health
        return None if state is None else state.healthy

    def realised(self) -> dict[str, float]:
        """The implicit target's realised share per cluster, as the daemon exports it."""
        view = self._driver.snapshot.report.targets.get(IMPLICIT_TARGET)
        return dict(view.realised) if view is not None else {}

    def actuation_delay(self) -> float | None:
        """The implicit target's measured actuation delay, as /debug/state shows it."""
        view = self._driver.snapshot.report.targets.get(IMPLICIT_TARGET)
        return view.actuation_delay if view is not None else None

    def intended(self) -> dict[str, float]:
        """... and the share its weights intended over the same window."""
        view = self._driver.snapshot.report.targets.get(IMPLICIT_TARGET)
        return dict(view.intended) if view is not None else {}


class PodsOnly(Ours):
    """The daemon as it was before it read each pod's KV pool: capacity in pods answering.
    Not in the default table; ``--policies pods`` shows what reading the pools buys."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, "pods")

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        blind = {n: replace(m, kv_tokens=None, kv_tokens_from=None) for n, m in metrics.items()}
        return await super().tick(now, blind)


class _Judged:
    """A baseline that judges health exactly as the daemon does, then applies its own law."""

    name = "judged"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._health: dict[str, ClusterHealth] = {}
        self._published: dict[str, int] | None = None

    def law(self, healthy: Mapping[str, Signals]) -> dict[str, float]:
        raise NotImplementedError

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        settings = self._settings
        for name, m in metrics.items():
            self._health[name] = health.judge(self._health.get(name), m, settings.health, now)
        usable = {n: signals.current(h, "p90") for n, h in self._health.items()}
        healthy = {n: s for n, s in usable.items() if s is not None}
        if not healthy:
            return None  # fail static, as the daemon does
        shares = dict.fromkeys(metrics, 0.0)
        shares.update(self.law(healthy))
        if sum(shares.values()) <= 0:
            shares.update(dict.fromkeys(healthy, 1.0))
        new = weights.proportional(shares, weights.TOTAL)
        if new == self._published:
            return None
        self._published = new
        return new

    def healthy(self, name: str) -> bool | None:
        state = self._health.get(name)
        return None if state is None else state.healthy


class Naive(_Judged):
    name = "naive"

    def law(self, healthy: Mapping[str, Signals]) -> dict[str, float]:
        return {n: max(0.0, 1.0 - s.kv) for n, s in healthy.items()}


class Proportional(_Judged):
    name = "proportional"
    gain = 1.0  # share per unit of KV difference from the fleet's mean

    def law(self, healthy: Mapping[str, Signals]) -> dict[str, float]:
        mean = sum(s.kv for s in healthy.values()) / len(healthy)
        even = 1.0 / len(healthy)
        return {n: max(0.02, even + self.gain * (mean - s.kv)) for n, s in healthy.items()}


class Oracle:
    """A floor, not a controller: it reads the scenario itself (every cluster's true capacity,
    the local traffic it gets now and whether it is alive, which no controller can see) and
    publishes, at the first tick after any changes, the weights that give every live cluster
    the same load. What it scores is what the actuation delay and the world's own dynamics
    leave to any policy."""

    name = "oracle"

    def __init__(self, scenario: Scenario) -> None:
        self._scenario = scenario
        self._published: dict[str, int] | None = None

    def local(self, now: float, metrics: Mapping[str, ClusterMetrics]) -> dict[str, float]:
        """The local traffic each cluster gets now, as the oracle knows it."""
        return {c.name: c.local(now) for c in self._scenario.clusters}

    def alive(self, now: float, metrics: Mapping[str, ClusterMetrics]) -> set[str]:
        """The clusters alive now, as the oracle knows it: from the scenario's deaths and
        returns."""
        dead: set[str] = set()
        for event in self._scenario.events:
            if event.at <= now and event.action is kill:
                dead.add(event.cluster)
            elif event.at <= now and event.action is revive:
                dead.discard(event.cluster)
        return {c.name for c in self._scenario.clusters} - dead

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        sc = self._scenario
        alive = self.alive(now, metrics)
        served = {
            c.name: c.replicas * capacity(c.replica, sc.lengths) if c.name in alive else 0.0
            for c in sc.clusters
        }
        local = {n: v if n in alive else 0.0 for n, v in self.local(now, metrics).items()}
        routed = sc.load(now)
        level = (routed + sum(local.values())) / sum(served.values())  # the even load
        want = {n: max(0.0, level * served[n] - local[n]) for n in served}
        if sum(want.values()) <= 0:
            want = dict(served)
        new = weights.proportional(want, weights.TOTAL)
        if self._published is not None and within(self._published, new, 2):
            return None
        self._published = new
        return new

    def healthy(self, name: str) -> bool | None:
        return None


class Seen(Oracle):
    """The oracle from the moment a controller could know: more local traffic on a cluster
    is known only from the first tick its pages read KV at ``pressure`` (less, at once); a
    death from the first read its pages refuse, a return from the first they answer. The
    floor for any law that reacts to readings: what is left is detection, the actuation
    delay and the backlog built meanwhile. On request only (``--policies seen``)."""

    name = "seen"

    def __init__(self, scenario: Scenario, pressure: float) -> None:
        super().__init__(scenario)
        self._pressure = pressure
        self._known: dict[str, float] = {c.name: c.local(0.0) for c in scenario.clusters}

    def local(self, now: float, metrics: Mapping[str, ClusterMetrics]) -> dict[str, float]:
        for name, truth in super().local(now, metrics).items():
            kv = metrics[name].kv_mean if name in metrics else None
            if truth < self._known[name] or (kv is not None and kv >= self._pressure):
                self._known[name] = truth
        return dict(self._known)

    def alive(self, now: float, metrics: Mapping[str, ClusterMetrics]) -> set[str]:
        names = {c.name for c in self._scenario.clusters}
        return {n for n in names if n not in metrics or not health.all_refused(metrics[n])}


class SeenCapped(Seen):
    """``Seen`` held to the law's own bounds: no ref moves more than ``max_step`` in a write,
    and no write comes within ``settle`` of the last. The floor for a law that reacts to
    readings *and* keeps those bounds: where it misses a goal, the defaults do, not the law.
    On request only (``--policies seen-capped``)."""

    name = "seen-capped"

    def __init__(self, scenario: Scenario, pressure: float, max_step: int, settle: float) -> None:
        super().__init__(scenario, pressure)
        self._max_step, self._settle = float(max_step), settle
        self._last: float | None = None

    async def tick(
        self, now: float, metrics: Mapping[str, ClusterMetrics]
    ) -> dict[str, int] | None:
        if self._last is not None and now - self._last < self._settle:
            return None
        in_force = self._published
        wanted = await super().tick(now, metrics)
        if wanted is None:
            return None
        if in_force is not None:
            base = {n: float(v) for n, v in in_force.items()}
            moved = capped(base, {n: wanted[n] - base[n] for n in base}, self._max_step)
            wanted = round_to_total(moved, 0, list(moved))
            self._published = wanted  # the next tick moves on from what was written
        self._last = now
        return wanted


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
