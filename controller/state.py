"""What the controller last saw and decided: one frozen ``TickReport``, built whole at the end
of a tick and swapped in at once, so a reader (``/metrics``, ``/debug/state``, the probes, a
caller's ``on_tick``) never sees this tick's health beside last tick's weights."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.model import ClusterHealth, ClusterMetrics, TargetDecision


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The latest of one cluster: last fetch, health after it, and its share of traffic in the
    only target (the implicit one, or the one object there is; else ``None``): of 100, what
    views show as its ``weight``."""

    metrics: ClusterMetrics | None = None
    health: ClusterHealth | None = None
    share: int | None = None


@dataclass(frozen=True, slots=True)
class TargetView:
    """One routing target after a tick: the decision and its write, plus its history."""

    outcome: TargetDecision
    last_write: float | None = None  # unix time of the last write that landed
    last_change: float | None = None  # unix time applied last changed (written or would be)
    # Over ``weights.realised_window``, per mapped ref (0..100 over the mapped refs): the share
    # of requests its cluster actually served, and the share the weights in force intended.
    realised: Mapping[str, float] = field(default_factory=dict)
    intended: Mapping[str, float] = field(default_factory=dict)
    # How long its changes take to act (measured, seconds; None before any was seen), and
    # whether the last change has yet to be seen acting (reconcile/actuation.py).
    actuation_delay: float | None = None
    acting: bool = False


@dataclass(frozen=True, slots=True)
class TickReport:
    """Everything one tick saw and decided. Tick 0 is the state before the first tick."""

    tick: int = 0
    clusters: Mapping[str, ClusterView] = field(default_factory=dict)
    targets: Mapping[str, TargetView] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)  # objects not written, and why
    kubernetes: tuple[bool | None, str | None] = (None, None)  # reachable, and why not
    duration: float = 0.0
    finished: float | None = None  # unix time the tick ended
    finished_monotonic: float | None = None  # the same on the monotonic clock (liveness)

    @property
    def only(self) -> TargetView | None:
        """The one target, when there is exactly one (the implicit target is one)."""
        return next(iter(self.targets.values())) if len(self.targets) == 1 else None

    @property
    def last_change(self) -> float | None:
        """When any target's applied weights last changed."""
        return max((t.last_change for t in self.targets.values() if t.last_change), default=None)


class Snapshot:
    """The latest ``TickReport``, replaced once per tick by the loop; and whether this process
    writes nothing (a dry run), which no tick changes."""

    def __init__(self, clusters: Iterable[str] = (), dry_run: bool = False) -> None:
        self.report = TickReport(clusters={name: ClusterView() for name in clusters})
        self.dry_run = dry_run
        # time.monotonic() when the loop last finished a stage: liveness is the loop turning,
        # whatever the API server does (each stage has its own deadline)
        self.beat: float | None = None
