"""The public seam tests, benchmarks, the simulator and replay build a loop from: the real
Reconciler, its registry and snapshot, over sources and a publisher the caller chooses (by
default the implicit target over the configured clusters, writing nothing).

``Driver`` runs that loop a tick at a time on a virtual clock, each tick over the metrics the
caller gives: the loop's only inputs are its sources and its clock, so what it decides from
given metrics at a given time is what the daemon would have decided."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from controller.exporter import make_registry
from controller.model import ClusterMetrics
from controller.publish import Publisher
from controller.publish.configured import implicit
from controller.reconcile.loop import Reconciler
from controller.settings import Settings
from controller.sources import ClusterMetricsSource
from controller.state import Snapshot, TickReport


@dataclass(frozen=True, slots=True)
class Loop:
    reconciler: Reconciler
    snapshot: Snapshot
    registry: CollectorRegistry


def build_loop(
    settings: Settings,
    sources: Sequence[ClusterMetricsSource],
    publisher: Publisher | None = None,
    clock: Callable[[], float] = time.time,
    on_tick: Callable[[TickReport], None] | None = None,
    journal: bool = True,
) -> Loop:
    """A Reconciler over ``sources`` with a fresh registry: nothing shared with another
    (``journal``: see ``Reconciler``)."""
    snapshot = Snapshot()
    registry, metrics = make_registry(snapshot)
    if publisher is None:
        publisher = implicit(source.cluster for source in sources)
    reconciler = Reconciler(
        settings, sources, publisher, metrics, snapshot, clock, on_tick, journal=journal
    )
    return Loop(reconciler, snapshot, registry)


class VirtualClock:
    """A clock that moves only when told: the loop's time under a ``Driver`` and in tests."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ScriptedSource:
    """A ClusterMetricsSource that answers what it was last given (``next``)."""

    def __init__(self, name: str, first: ClusterMetrics | None = None) -> None:
        self.name = name
        self.next = first

    @property
    def cluster(self) -> str:
        return self.name

    async def fetch(self) -> ClusterMetrics:
        if self.next is None:
            raise LookupError(f"{self.name}: no metrics given for this tick")
        return self.next


class Driver:
    """The real Reconciler over one ``ScriptedSource`` per configured cluster, on a
    ``VirtualClock``: ``tick(now, metrics)`` runs one tick at ``now`` over ``metrics`` (by
    cluster; a cluster not given answers what it was given last)."""

    def __init__(
        self,
        settings: Settings,
        publisher: Publisher | None = None,
        start: float = 0.0,
        on_tick: Callable[[TickReport], None] | None = None,
        journal: bool = True,
    ) -> None:
        self.clock = VirtualClock(start)
        self.sources = {c.name: ScriptedSource(c.name) for c in settings.clusters}
        self.loop = build_loop(
            settings, list(self.sources.values()), publisher, self.clock, on_tick, journal
        )

    @property
    def snapshot(self) -> Snapshot:
        return self.loop.snapshot

    async def tick(self, now: float, metrics: Mapping[str, ClusterMetrics]) -> TickReport:
        self.clock.now = now
        for name, given in metrics.items():
            self.sources[name].next = given
        return await self.loop.reconciler.tick()
