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
    has not been seen acting (``actuation.Actuation.settling``)."""
    if memory is None:
        return False
    return memory.actuation.settling(now, settle, interval)


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
