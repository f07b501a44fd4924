"""What the loop remembers of each routing target between ticks, and what follows from it:
the weights in force, whether the last change is still settling, and what a write leaves.

A dry run (or the implicit target, which no object holds) remembers its ``shadow``: what it
would have applied, and ``seeded_from``, what the object held then. While the object still
holds that, the next decision continues from the shadow (so a dry run moves as a live run
would); once someone changes the object, from the object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.model import Target, Write, WriteResult
from controller.reconcile.actuation import Actuation
from controller.reconcile.realised import Window


@dataclass(slots=True)
class TargetMemory:
    shadow: dict[str, int] | None = None
    seeded_from: dict[str, int] | None = None
    refused: tuple[dict[str, int], WriteResult] | None = None  # a schema rejection, kept
    last_write: float | None = None  # the last write that landed
    last_change: float | None = None  # the last time applied changed (written or would be)
    realised: Window = field(default_factory=Window)
    actuation: Actuation = field(default_factory=Actuation)


def in_force(target: Target, memory: TargetMemory | None) -> Target:
    """``target`` holding what is in force: the object's weights, or a dry run's shadow."""
    if memory is None or memory.shadow is None or memory.seeded_from != target.weights:
        return target
    return target.holding(memory.shadow)


def settling(memory: TargetMemory | None, now: float, settle: float, interval: float) -> bool:
    """The target's last step may not have acted yet: it changed less than ``settle`` ago, or
    has not been seen acting (``actuation.Actuation.settling``), this process's own or one
    its object records (``follow_record``)."""
    if memory is None:
        return False
    return memory.actuation.settling(now, settle, interval)


def follow_record(memory: TargetMemory, target: Target, now: float, interval: float) -> None:
    """A write the object records that this process did not see land (``written_elsewhere``)
    is followed as one of its own, from the time the record carries: a change whose shares
    before are unknown, waited on as one too small to see (the longest delay measured and
    ``settle``; ``wait_limit`` before any). Without it, a new leader after a failover or a
    rollout, a restarted process, or one whose patch landed after its answer timed out
    stepped again at once, two steps stacked where the last would have waited (found by an
    attack); waiting ``settle`` alone from the record still stacked them 20-60 s early at the
    defaults, where the writer itself waits until it sees the step act (a review)."""
    written = written_elsewhere(target, memory, now, interval)
    if written is not None:
        memory.actuation.changed(written, {}, {}, interval)


def written_elsewhere(
    target: Target, memory: TargetMemory | None, now: float, interval: float
) -> float | None:
    """When the object's record of our last write (``Target.applied_at``) says it was made,
    where that is later than any change this process made or would have: another replica's
    write, or one of its own it did not see land. ``None`` otherwise, and for a record
    stamped more than an interval after ``now`` (a clock that is not ours to wait on: another
    replica's far ahead, or a test's virtual one); one a little ahead counts as now."""
    at = target.applied_at
    if at is None or at > now + interval:
        return None
    known = memory.actuation.last_change if memory is not None else None
    if known is not None and at < known + 1.0:  # stamped in whole seconds, truncated
        return None
    return min(at, now)


def cluster_shares(target: Target, weights: Mapping[str, int]) -> dict[str, float]:
    """Each mapped cluster's share (0..100) of ``weights`` over the target's mapped refs."""
    mapped = {ref: c for ref, c in target.clusters.items() if c is not None}
    total = sum(weights.get(ref, 0) for ref in mapped)
    shares: dict[str, float] = {}
    for ref, cluster in mapped.items():
        share = 100.0 * weights.get(ref, 0) / total if total > 0 else 0.0
        shares[cluster] = shares.get(cluster, 0.0) + share
    return shares


def after_write(
    memory: TargetMemory,
    found: Target,
    in_effect: Target,
    desired: dict[str, int],
    result: WriteResult,
    now: float,
    interval: float,
) -> dict[str, int]:
    """Remember what ``result`` did and return what the target holds now (in a dry run what
    it would hold). ``found`` is the target as read, ``in_effect`` as it was weighed."""
    applied = (result.target or in_effect).weights
    if result.write is Write.WOULD:
        applied = dict(desired)
        memory.shadow, memory.seeded_from = applied, found.weights
    elif result.write is Write.DONE:
        memory.shadow = memory.seeded_from = None
        memory.last_write = now
    if result.write in (Write.WOULD, Write.DONE):
        memory.last_change = now
        before, after = cluster_shares(found, in_effect.weights), cluster_shares(found, applied)
        memory.actuation.changed(now, before, after, interval)
    return applied
