"""Pure: per-cluster signals + health + the weights now in force → the next integer weights.

``weigh`` applies a law to one routing target (an ExternalModel, an HTTPRoute rule, or the
configured clusters): the refs that map to a cluster share what the unmapped ones leave, on the
target's own scale. It is the only place weights are decided; the loop calls it once per target
per tick, and publishers only write what it returned.

The result always sums to exactly 100 (the ExternalModel ``weight`` field is 0..100 and the
router picks by weighted random choice over the total) and is never all zeros. Unhealthy
clusters get 0 at once; with no healthy cluster the weights in force are kept (fail static).

Two laws, one module each: ``capacity`` (the default: hold at rest, step by capacity share
minus demand share under pressure, then settle) and ``integral`` (the previous law). The
signals they read are derived in ``controller.signals``; rounding is ``rounding``, and what the
laws share about stepping from the weights in force is ``steps``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from controller.model import IMPLICIT_TARGET, Decision, Mode, Ref, Served, Signals, Target
from controller.settings import WeightSettings
from controller.signals import on_one_basis
from controller.weights import capacity, integral
from controller.weights.rounding import TOTAL, at_least, proportional, round_to_total
from controller.weights.steps import survivors

_V = TypeVar("_V")

__all__ = [
    "TOTAL",
    "at_least",
    "budget",
    "decide",
    "factors",
    "pin_problem",
    "proportional",
    "round_to_total",
    "weigh",
]


def drained(target: Target, signals: Mapping[str, Signals | None]) -> dict[str, int]:
    """What ``target`` should hold when its law cannot decide (it raised: a bug): the weights
    in force, but none left on a mapped ref whose cluster is unhealthy (no signals), its
    share handed to the healthy ones in proportion to theirs. Unchanged where no healthy ref
    holds any weight (never a write that sends all traffic nowhere), or a pause holds it."""
    held = dict(target.weights)
    if target.paused is not None:
        return held
    mapped = {r.name: r.cluster for r in target.refs if r.cluster is not None}
    down = {n for n, c in mapped.items() if signals.get(c) is None}
    up = {n: held.get(n, 0) for n in mapped if n not in down}
    least = target.minimum  # the schema's lowest weight, where it has one
    moving = sum(max(0, held.get(n, 0) - least) for n in down)
    if not moving or sum(up.values()) <= 0:
        return held
    spread = proportional(up, sum(up.values()) + moving)
    return within_bounds(
        target, {**held, **{n: min(held.get(n, 0), least) for n in down}, **spread}
    )


# The most one HTTPRoute backend may weigh: Gateway API's BackendRef.weight is 0..1,000,000
# (``+kubebuilder:validation:Maximum=1000000``, sigs.k8s.io/gateway-api apis/v1/shared_types.go).
MAX_ROUTE_WEIGHT = 1_000_000


def budget(target: Target) -> int:
    """What the mapped refs of ``target`` share between them, on the object's scale.

    ExternalModel weights are percentages (0..100): the mapped refs get what the unmapped ones
    leave of 100. HTTPRoute weights are relative within their rule (``weight / sum``,
    0..1,000,000): the rule keeps its total, so unmapped backends keep their share; a rule that
    is all ours is written on at least a 0..100 scale (its defaults of 1 give no resolution).
    (A rule whose weights would put a backend past what one may weigh is scaled down whole:
    ``within_bounds``.)"""
    mapped = sum(r.weight for r in target.refs if r.cluster is not None)
    unmapped = sum(r.weight for r in target.refs if r.cluster is None)
    if target.total is not None:
        return target.total - unmapped
    return mapped if unmapped > 0 else max(mapped, TOTAL)


def within_bounds(target: Target, weights: dict[str, int]) -> dict[str, int]:
    """``weights`` as the object's schema takes them: an HTTPRoute rule one of whose backends
    would weigh past ``MAX_ROUTE_WEIGHT`` is scaled down whole, every backend's share kept,
    so that one weighs exactly that. Kept at its total, two backends of 600,000 asked
    1,200,000 of the survivor when one died: refused, and the dead backend kept half the
    traffic (found by an attack). Capping what the mapped refs share instead moved traffic
    onto the unmapped backends on every step (a review). Only here are unmapped weights
    written, and their shares stay."""
    if target.total is not None or not weights or max(weights.values()) <= MAX_ROUTE_WEIGHT:
        return weights
    total = sum(weights.values()) * MAX_ROUTE_WEIGHT // max(weights.values())
    return proportional(weights, total)


def weigh(
    target: Target,
    signals: Mapping[str, Signals | None],
    params: WeightSettings,
    settling: bool = False,
    served: tuple[Mapping[str, float], Mapping[str, float]] | None = None,
) -> tuple[dict[str, int], Decision]:
    """The weights every ref of ``target`` should hold (unmapped refs keep theirs), and the
    decision over the mapped refs on a 0..100 scale. ``target.weights`` is what is in force;
    a mapped ref whose cluster has no signals this tick counts as unhealthy. ``settling``:
    the target changed less than ``settle`` ago (the capacity law waits for it to act).
    ``served``: each mapped ref's realised and intended share over
    ``weights.realised_window``, as the last tick's report holds them."""
    held = target.weights
    law = params.law
    if params.freeze:
        return held, Decision(held, {}, Mode.FROZEN, False, ("weights.freeze is on",), law=law)
    if target.paused is not None:
        return held, Decision(held, {}, Mode.PAUSED, False, (target.paused,), law=law)
    if target.pinned is not None:
        return _pinned(target, held, law)
    mapped = [ref for ref in target.refs if ref.cluster is not None]
    turned_off = _drained_by_hand(target, mapped)
    if turned_off is not None:  # (``drained`` is the law's fallback, above)
        return held, Decision(held, {}, Mode.PAUSED, False, (turned_off,), law=law)
    share = budget(target)
    problem = _no_room(target, mapped, share)
    if problem is not None:
        return held, Decision(None, {}, Mode.NO_DATA, False, (problem,), law=law)
    # Refs that name one cluster share its share: the cluster is decided once, then split.
    refs_of: dict[str, list[str]] = {}
    for ref in mapped:
        refs_of.setdefault(ref.cluster or "", []).append(ref.name)
    inputs = {cluster: signals.get(cluster) for cluster in refs_of}
    current = {c: sum(held.get(r, 0) for r in refs) for c, refs in refs_of.items()}
    in_force = proportional(current, TOTAL) if sum(current.values()) > 0 else None
    healthy, basis = on_one_basis({name: s for name, s in inputs.items() if s is not None})
    inputs = {name: healthy.get(name) for name in inputs}
    why = factors(healthy, params)
    decided = decide(inputs, in_force, params, settling, _by_cluster(served, refs_of))
    decision = _per_ref(
        replace(
            decided,
            scores={n: f["score"] for n, f in why.items()},
            factors=why,
            capacity_from={n: s.capacity_from for n, s in healthy.items() if s.capacity_from},
            notes=decided.notes if basis is None else (*decided.notes, basis),
        ),
        refs_of,
    )
    if not decision.changed or decision.weights is None:
        return held, decision
    scaled = at_least(proportional(decision.weights, share), target.minimum)
    return within_bounds(target, {**held, **scaled}), decision


def _by_cluster(
    served: tuple[Mapping[str, float], Mapping[str, float]] | None,
    refs_of: Mapping[str, Sequence[str]],
) -> dict[str, tuple[float, float]]:
    """Each cluster's realised and intended share, its refs' summed (where all were counted)."""
    if served is None:
        return {}
    realised, intended = served
    return {
        cluster: (sum(realised[r] for r in refs), sum(intended.get(r, 0.0) for r in refs))
        for cluster, refs in refs_of.items()
        if all(r in realised for r in refs)
    }


def _drained_by_hand(target: Target, mapped: Sequence[Ref]) -> str | None:
    """Why an object whose mapped refs all hold 0 is held as it is, or ``None``. A weight of 0
    turns a ref off (MaaS's CRD: "disables the ref"; Gateway API: no traffic), and this
    controller never writes every mapped ref off: someone turned the model off by hand, and
    weighing from "nothing in force" turned it back on at capacity shares within a tick,
    unlogged (found by an attack). Not the implicit target, whose 0s mean nothing was
    decided yet, nor zeros our own record says we wrote."""
    if target.kind == IMPLICIT_TARGET or not mapped or any(ref.weight for ref in mapped):
        return None
    ours = target.last_applied
    if ours is not None and all(ours.get(ref.name) == 0 for ref in mapped):
        return None
    return (
        "every ref that maps to a cluster holds 0 on the object, which this controller never "
        "writes: traffic was turned off by hand, and is held so; give a ref a weight to hand "
        "it back"
    )


def _no_room(target: Target, mapped: Sequence[Ref], share: int) -> str | None:
    """Why the mapped refs cannot be weighed at all, or ``None``. More refs than points is
    not one of them where a weight may be 0: some then get 0 (``decide`` says so)."""
    if not mapped:
        return "no ref maps to a known cluster"
    if share <= 0:
        return "unmapped refs hold it all"
    if share < len(mapped) * target.minimum:
        return (
            f"{len(mapped)} refs at the schema's minimum of {target.minimum} need more than "
            f"the {share} points they share"
        )
    return None


def _per_ref(decision: Decision, refs_of: Mapping[str, Sequence[str]]) -> Decision:
    """A decision over clusters as one over refs: each cluster's weight and goal split evenly
    among the refs that name it, its score and factors shown on each."""

    def split(values: Mapping[str, float]) -> dict[str, float]:
        return {
            ref: values[cluster] / len(refs)
            for cluster, refs in refs_of.items()
            if cluster in values
            for ref in refs
        }

    def each(values: Mapping[str, _V]) -> dict[str, _V]:
        return {r: values[c] for c, refs in refs_of.items() if c in values for r in refs}

    weights = None if decision.weights is None else proportional(split(decision.weights), TOTAL)
    return replace(
        decision,
        weights=weights,
        goal=split(decision.goal),
        scores=each(decision.scores),
        factors=each(decision.factors),
        capacity_from=each(decision.capacity_from),
    )


PIN_NAMES_SHOWN = 5  # of a pin's unknown refs, in its problem


def pin_problem(target: Target) -> str | None:
    """Why ``target``'s pin cannot be applied, or ``None``."""
    pinned = target.pinned
    if pinned is None:
        return None
    if not pinned:
        return "the pin annotation is not a JSON map of ref name to integer weight"
    unknown = sorted(set(pinned) - set(target.weights))
    if unknown:  # an annotation's keys, quoted and few: they reach logs and a terminal
        named = ", ".join(ascii(ref[:64]) for ref in unknown[:PIN_NAMES_SHOWN])
        more = (
            f" (+{len(unknown) - PIN_NAMES_SHOWN} more)" if len(unknown) > PIN_NAMES_SHOWN else ""
        )
        return f"the pin names refs the target does not have: {named}{more}"
    if any(w < target.minimum for w in pinned.values()):
        return f"a pinned weight is below the schema's minimum of {target.minimum}"
    if target.total is None and any(w > MAX_ROUTE_WEIGHT for w in pinned.values()):
        return f"a pinned weight is above the schema's maximum of {MAX_ROUTE_WEIGHT:,}"
    total = target.total
    if total is not None and sum({**target.weights, **pinned}.values()) != total:
        return f"the pinned weights (with any refs not named) must add up to {total}"
    if sum({**target.weights, **pinned}.values()) <= 0:
        return "the pinned weights would send all traffic nowhere"
    return None


def _pinned(target: Target, held: dict[str, int], law: str) -> tuple[dict[str, int], Decision]:
    """An operator's pin, applied as it is; a pin that cannot be applied holds instead."""
    problem = pin_problem(target)
    if problem is not None:
        note = f"pin ignored, weights held: {problem}"
        return held, Decision(held, {}, Mode.PAUSED, False, (note,), law=law)
    assert target.pinned is not None
    desired = {**held, **target.pinned}
    changed = desired != held
    return desired, Decision(desired, {}, Mode.PINNED, changed, ("pinned by annotation",), law=law)


def factors(healthy: Mapping[str, Signals], params: WeightSettings) -> dict[str, dict[str, float]]:
    """Why each healthy cluster deserves the traffic it gets, for the law in use."""
    if params.law == capacity.LAW:
        return capacity.factors(healthy)
    return integral.factors(healthy, params)


def decide(
    clusters: Mapping[str, Signals | None],
    in_force: Mapping[str, int] | None,
    params: WeightSettings,
    settling: bool = False,
    served: Served | None = None,
) -> Decision:
    """The next weights (see ``_decide``), with a note when the floor cannot hold.

    Weights are whole points out of 100. With more healthy clusters than ``100 / floor`` the
    floor is lowered to what 100 points allow — one point each up to 100 clusters, so no
    healthy ref sits at 0 while one point each is possible (an ExternalModel has at most 64
    refs, so it always is). Past 100 healthy clusters (only the implicit target can have so
    many) 100 points cannot cover them: some get 0, and the note says so."""
    decision = _decide(clusters, in_force, params, settling, served)
    healthy = sum(1 for s in clusters.values() if s is not None)
    if healthy == 0 or decision.weights is None or params.floor * healthy <= TOTAL:
        return decision
    if healthy > TOTAL:
        note = f"{healthy} healthy clusters share {TOTAL} points: some get 0, not the floor"
    else:
        note = f"floor lowered to {TOTAL // healthy}: {healthy} healthy clusters × {params.floor}"
        note += f" > {TOTAL}"
    return replace(decision, notes=(*decision.notes, note))


def _decide(
    clusters: Mapping[str, Signals | None],
    in_force: Mapping[str, int] | None,
    params: WeightSettings,
    settling: bool = False,
    served: Served | None = None,
) -> Decision:
    """The next weights. ``clusters`` maps every cluster to its signals, or ``None`` if
    unhealthy; ``in_force`` is what was last published (``None`` before the first time)."""
    previous = {n: in_force.get(n, 0) for n in clusters} if in_force else None
    if previous is not None and sum(previous.values()) <= 0:
        previous = None
    healthy = [n for n, s in clusters.items() if s is not None]
    law = params.law
    if not healthy:
        if previous is None:
            note = "no cluster has usable data yet"
            return Decision(None, {}, Mode.NO_DATA, False, (note,), law=law)
        note = "every cluster is unhealthy: keeping the last weights (fail static)"
        return Decision(previous, {}, Mode.FAIL_STATIC, False, (note,), law=law)
    base = survivors(previous, healthy) if previous else None
    if law == capacity.LAW:
        return capacity.decide(clusters, previous, base, params, settling, served)
    return integral.decide(clusters, previous, base, params)
