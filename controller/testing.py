"""The public seam tests, benchmarks and the simulator build a loop from: the real Reconciler,
its registry and snapshot, over sources and a publisher the caller chooses (by default the
implicit target over the configured clusters, writing nothing)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from controller.exporter import make_registry
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
) -> Loop:
    """A Reconciler over ``sources`` with a fresh registry: nothing shared with another."""
    snapshot = Snapshot()
    registry, metrics = make_registry(snapshot)
    if publisher is None:
        publisher = implicit(source.cluster for source in sources)
    reconciler = Reconciler(settings, sources, publisher, metrics, snapshot, clock, on_tick)
    return Loop(reconciler, snapshot, registry)
