"""Pure: per-cluster signals + health + the weights now in force → the next integer weights.

The result always sums to exactly 100 (the ExternalModel ``weight`` field is 0..100 and the
router picks by weighted random choice over the total) and is never all zeros.

Two laws. ``law: capacity`` (the default, ``_capacity`` below): hold while no cluster is under
pressure; under pressure, step by each cluster's capacity share minus its demand share; then
settle. It was chosen in the token-level simulator (README: "Simulator"), where the integral
law below rewrote routing about 300 times an hour. ``law: integral``, the previous default:

1. Target: every healthy cluster gets ``floor``; the rest is shared in proportion to a score:
   KV headroom ``(1 - kv / kv_saturation) ** kv_exponent``, times a queue penalty and a latency
   penalty relative to the best cluster. Unhealthy clusters get 0. If every healthy cluster is
   saturated, they split evenly.
   That is the first decision (nothing in force yet). After it, the target moves each
   cluster from its weight in force by ``gain`` points per unit of score above or below the
   fleet's mean: an integral controller that stops where the scores even out, so clusters of
   different sizes end up with shares that fit their capacity.
2. Hold: if the target is within ``deadband`` of the weights in force and no cluster gained or
   lost traffic entirely, nothing is published — noise is not republished.
3. Step: from the weights in force (a dead cluster's share first handed to the survivors in
   proportion to what they carry), move ``smoothing`` of the way to the target — at least the
   deadband, at most ``max_step`` per cluster — keeping the sum.
With no healthy cluster the weights in force are kept (fail static).

``weigh`` applies this to one routing target (an ExternalModel, an HTTPRoute rule, or the
configured clusters): the refs that map to a cluster share what the unmapped ones leave, on the
target's own scale. It is the only place weights are decided; the loop calls it once per target
per tick, and publishers only write what it returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from controller.model import Decision, Mode, Signals, Target
from controller.settings import WeightSettings

TOTAL = 100


def budget(target: Target) -> int:
    """What the mapped refs of ``target`` share between them, on the object's scale.

    ExternalModel weights are percentages (0..100): the mapped refs get what the unmapped ones
    leave of 100. HTTPRoute weights are relative within their rule (``weight / sum``,
    0..1,000,000): the rule keeps its total, so unmapped backends keep their share; a rule that
    is all ours is written on at least a 0..100 scale (its defaults of 1 give no resolution)."""
    mapped = sum(r.weight for r in target.refs if r.cluster is not None)
    unmapped = sum(r.weight for r in target.refs if r.cluster is None)
    if target.total is not None:
        return target.total - unmapped
    return mapped if unmapped > 0 else max(mapped, TOTAL)


def weigh(
    target: Target,
    signals: Mapping[str, Signals | None],
    params: WeightSettings,
    settling: bool = False,
) -> tuple[dict[str, int], Decision]:
    """The weights every ref of ``target`` should hold (unmapped refs keep theirs), and the
    decision over the mapped refs on a 0..100 scale. ``target.weights`` is what is in force;
    a mapped ref whose cluster has no signals this tick counts as unhealthy. ``settling``:
    the target changed less than ``settle`` ago (the capacity law waits for it to act)."""
    held = target.weights
    if params.freeze:
        return held, Decision(held, {}, Mode.FROZEN, False, ("weights.freeze is on",))
    if target.paused is not None:
        return held, Decision(held, {}, Mode.PAUSED, False, (target.paused,))
    if target.pinned is not None:
        return _pinned(target, held)
    mapped = [ref for ref in target.refs if ref.cluster is not None]
    share = budget(target)
    if not mapped or share < len(mapped) * max(1, target.minimum):
        note = "no ref maps to a known cluster" if not mapped else "unmapped refs hold it all"
        return held, Decision(None, {}, Mode.NO_DATA, False, (note,))
    inputs = {ref.name: signals.get(ref.cluster or "") for ref in mapped}
    current = {ref.name: ref.weight for ref in mapped}
    in_force = proportional(current, TOTAL) if sum(current.values()) > 0 else None
    healthy = {name: s for name, s in inputs.items() if s is not None}
    why = factors(healthy, params)
    decision = replace(
        decide(inputs, in_force, params, settling),
        scores={n: f["score"] for n, f in why.items()},
        factors=why,
    )
    if not decision.changed or decision.weights is None:
        return held, decision
    scaled = at_least(proportional(decision.weights, share), target.minimum)
    return {**held, **scaled}, decision


def pin_problem(target: Target) -> str | None:
    """Why ``target``'s pin cannot be applied, or ``None``."""
    pinned = target.pinned
    if pinned is None:
        return None
    if not pinned:
        return "the pin annotation is not a JSON map of ref name to integer weight"
    unknown = sorted(set(pinned) - set(target.weights))
    if unknown:
        return f"the pin names refs the target does not have: {', '.join(unknown)}"
    if any(w < target.minimum for w in pinned.values()):
        return f"a pinned weight is below the schema's minimum of {target.minimum}"
    total = target.total
    if total is not None and sum({**target.weights, **pinned}.values()) != total:
        return f"the pinned weights (with any refs not named) must add up to {total}"
    if sum({**target.weights, **pinned}.values()) <= 0:
        return "the pinned weights would send all traffic nowhere"
    return None


def _pinned(target: Target, held: dict[str, int]) -> tuple[dict[str, int], Decision]:
    """An operator's pin, applied as it is; a pin that cannot be applied holds instead."""
    problem = pin_problem(target)
    if problem is not None:
        note = f"pin ignored, weights held: {problem}"
        return held, Decision(held, {}, Mode.PAUSED, False, (note,))
    assert target.pinned is not None
    desired = {**held, **target.pinned}
    return desired, Decision(desired, {}, Mode.PINNED, desired != held, ("pinned by annotation",))


def at_least(values: Mapping[str, int], minimum: int) -> dict[str, int]:
    """``values`` with none below ``minimum`` (the schema's lowest weight: on MaaS v0.2.0 a
    ref cannot be set to 0, so a dead cluster keeps 1), the points taken one at a time from
    the largest (ties by name), keeping the sum. The caller ensures the sum allows it."""
    result = dict(values)
    for name in sorted(result):
        while result[name] < minimum:
            donor = max(result, key=lambda n: (result[n], n))
            if result[donor] <= minimum:
                return result
            result[donor] -= 1
            result[name] += 1
    return result


def forecast_kv(history: Sequence[tuple[float, float]], horizon: float) -> float:
    """KV ``horizon`` seconds after the last of ``history`` ((time, kv) pairs, oldest first),
    on the least-squares line through them when it rises; at most 1. One point: itself."""
    last = history[-1][1]
    if horizon <= 0 or len(history) < 2:
        return last
    n = len(history)
    mean_t = sum(t for t, _ in history) / n
    mean_kv = sum(kv for _, kv in history) / n
    spread = sum((t - mean_t) ** 2 for t, _ in history)
    if spread <= 0:
        return last
    slope = sum((t - mean_t) * (kv - mean_kv) for t, kv in history) / spread
    # Only rising KV is anticipated: late shedding overloads, late returning merely waits.
    return min(1.0, last + max(0.0, slope) * horizon)


def factors(healthy: Mapping[str, Signals], params: WeightSettings) -> dict[str, dict[str, float]]:
    """Why each healthy cluster deserves the traffic it gets, for the law in use."""
    if params.law == "capacity":
        return capacity_factors(healthy)
    return integral_factors(healthy, params)


def integral_factors(
    healthy: Mapping[str, Signals], params: WeightSettings
) -> dict[str, dict[str, float]]:
    """Why each healthy cluster deserves the traffic it gets: ``score`` = ``kv_headroom`` ×
    ``queue_penalty`` × ``latency_penalty`` (penalties relative to the best cluster, 1 when
    unknown). Exported and logged so an operator can answer "why this weight?"."""
    queues = [s.queue_per_pod for s in healthy.values() if s.queue_per_pod is not None]
    latencies = [s.latency for s in healthy.values() if s.latency is not None and s.latency > 0]
    shortest = min(queues, default=0.0)
    fastest = min(latencies, default=0.0)
    result = {}
    for name, signal in healthy.items():
        headroom = max(0.0, 1.0 - signal.kv / params.kv_saturation) ** params.kv_exponent
        queue = 1.0
        if signal.queue_per_pod is not None:
            ratio = (params.queue_reference + shortest) / (
                params.queue_reference + signal.queue_per_pod
            )
            queue = ratio**params.queue_sensitivity
        latency = 1.0
        if signal.latency is not None and signal.latency > 0:
            latency = (fastest / signal.latency) ** params.latency_sensitivity
        result[name] = {
            "kv_headroom": headroom,
            "queue_penalty": queue,
            "latency_penalty": latency,
            "score": headroom * queue * latency,
        }
    return result


def scores(healthy: Mapping[str, Signals], params: WeightSettings) -> dict[str, float]:
    """How much each healthy cluster deserves traffic, ≥ 0; 0 means saturated."""
    return {name: f["score"] for name, f in integral_factors(healthy, params).items()}


def targets(
    clusters: Mapping[str, Signals | None],
    params: WeightSettings,
    base: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], bool]:
    """Real-valued target weights summing to 100, and whether every healthy one is saturated.

    Without ``base`` (nothing in force yet) the spare share follows the scores. With ``base``
    (the weights in force) each cluster moves from its current weight by ``gain`` points per
    unit of score above or below the fleet's mean score: an integral controller on the
    imbalance. Weights keep shifting until the clusters' scores (their KV use, queues, latency)
    even out, so clusters of different sizes settle at shares that fit their capacity, and a
    cluster with little traffic is pulled back as strongly as one with much.
    """
    healthy = {n: s for n, s in clusters.items() if s is not None}
    result = dict.fromkeys(clusters, 0.0)
    floor = min(float(params.floor), TOTAL / len(healthy))
    score = scores(healthy, params)
    if sum(score.values()) <= 0:
        for name in healthy:
            result[name] = TOTAL / len(healthy)
        return result, True
    if base is not None:
        mean = sum(score.values()) / len(score)
        moved = {n: max(0.0, base.get(n, 0.0) + params.gain * (score[n] - mean)) for n in healthy}
        mass = sum(moved.values())
        for name in healthy:
            result[name] = moved[name] * TOTAL / mass
        return _with_floor(result, list(healthy), params.floor), False
    total = sum(score.values())
    spare = TOTAL - floor * len(healthy)
    for name in healthy:
        result[name] = floor + spare * score[name] / total
    return result, False


def decide(
    clusters: Mapping[str, Signals | None],
    in_force: Mapping[str, int] | None,
    params: WeightSettings,
    settling: bool = False,
) -> Decision:
    """The next weights (see ``_decide``), with a note when the floor cannot hold.

    Weights are whole points out of 100. With more healthy clusters than ``100 / floor`` the
    floor is lowered to what 100 points allow — one point each up to 100 clusters, so no
    healthy ref sits at 0 while one point each is possible (an ExternalModel has at most 64
    refs, so it always is). Past 100 healthy clusters (only the implicit target can have so
    many) 100 points cannot cover them: some get 0, and the note says so."""
    decision = _decide(clusters, in_force, params, settling)
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
) -> Decision:
    """The next weights. ``clusters`` maps every cluster to its signals, or ``None`` if
    unhealthy; ``in_force`` is what was last published (``None`` before the first time)."""
    previous = {n: in_force.get(n, 0) for n in clusters} if in_force else None
    if previous is not None and sum(previous.values()) <= 0:
        previous = None
    healthy = [n for n, s in clusters.items() if s is not None]
    if not healthy:
        if previous is None:
            return Decision(None, {}, Mode.NO_DATA, False, ("no cluster has usable data yet",))
        note = "every cluster is unhealthy: keeping the last weights (fail static)"
        return Decision(previous, {}, Mode.FAIL_STATIC, False, (note,))
    base = _survivors(previous, healthy) if previous else None
    if params.law == "capacity":
        return _capacity(clusters, previous, base, params, settling)
    if previous is None or base is None:
        goal, _ = targets(clusters, params)
        return Decision(round_to_total(goal, params.floor, healthy), goal, Mode.INITIAL, True)
    goal, saturated = targets(clusters, params, base)
    mode = Mode.SATURATED if saturated else Mode.NORMAL
    forced = _forced(previous, healthy, params)
    if not forced and _within(previous, goal, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False)  # within the deadband of the goal
    moved = _with_floor(_step(base, goal, params), healthy, params.floor)
    weights = round_to_total(moved, params.floor, healthy)
    if not forced and _within(previous, weights, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False)
    return Decision(weights, goal, mode, weights != previous)


def _forced(previous: Mapping[str, int], healthy: list[str], params: WeightSettings) -> bool:
    """A change that must be published whatever its size: an unhealthy cluster still has
    traffic, or a healthy one is below its floor (a recovered one at 0, or weights set by hand)."""
    if any(previous[n] > 0 for n in previous if n not in healthy):
        return True
    low = min(params.floor, TOTAL // len(healthy))
    return any(previous[n] < low for n in healthy)


def _within(previous: Mapping[str, int], other: Mapping[str, float], deadband: int) -> bool:
    return max(abs(other[n] - previous[n]) for n in previous) < deadband


def _survivors(previous: Mapping[str, int], healthy: list[str]) -> dict[str, float] | None:
    """The weights in force with unhealthy clusters' share handed to the healthy ones in
    proportion to what they carry; ``None`` if no healthy cluster carries anything."""
    carried = sum(previous[n] for n in healthy)
    if carried <= 0:
        return None
    result = dict.fromkeys(previous, 0.0)
    for name in healthy:
        result[name] = previous[name] * TOTAL / carried
    return result


def _step(
    base: Mapping[str, float], goal: Mapping[str, float], params: WeightSettings
) -> dict[str, float]:
    """``smoothing`` of the way to the goal, but a move of at least the deadband (a goal
    ``deadband`` away is reached in deadband-sized writes, never in unpublishable crumbs),
    at most ``max_step`` per cluster, keeping the sum."""
    cap = float(params.max_step)
    delta = {n: params.smoothing * (goal[n] - base[n]) for n in base}
    largest = max(abs(d) for d in delta.values())
    if 0 < largest < params.deadband + 0.5:
        stretch = min(1.0 / params.smoothing, (params.deadband + 0.5) / largest)
        delta = {n: d * stretch for n, d in delta.items()}
    return _capped(base, delta, cap)


def _capped(base: Mapping[str, float], delta: Mapping[str, float], cap: float) -> dict[str, float]:
    """``base`` moved by ``delta`` (which sums to 0), each move at most ``cap``, keeping the
    sum: where capping cut one side, the other side is shrunk to match."""
    delta = {n: max(-cap, min(cap, d)) for n, d in delta.items()}
    gains = sum(d for d in delta.values() if d > 0)
    losses = -sum(d for d in delta.values() if d < 0)
    # Capping broke the zero sum; shrink the larger side so the total stays 100.
    if gains > losses:
        delta = {n: d * losses / gains if d > 0 else d for n, d in delta.items()}
    elif losses > gains:
        delta = {n: d * gains / losses if d < 0 else d for n, d in delta.items()}
    return {n: base[n] + delta[n] for n in base}


# ---- the capacity law -----------------------------------------------------------------------


def _load(signals: Signals) -> tuple[float, float, float]:
    """(capacity, filtered utilization, newest utilization) of one healthy cluster."""
    capacity = signals.capacity if signals.capacity and signals.capacity > 0 else 1.0
    now = signals.utilization if signals.utilization is not None else signals.kv
    filtered = signals.demand if signals.demand is not None else now
    return capacity, filtered, now


def capacity_factors(healthy: Mapping[str, Signals]) -> dict[str, dict[str, float]]:
    """Each healthy cluster's share of the fleet's capacity and of the demand it carries
    (capacity × utilization). ``score`` = capacity share − demand share: above 0 the cluster
    can take more than it has, below 0 it carries more than its size."""
    loads = {n: _load(s) for n, s in healthy.items()}
    capacity = sum(c for c, _, _ in loads.values())
    demand = sum(c * u for c, u, _ in loads.values())
    result = {}
    for name, (c, u, now) in loads.items():
        capacity_share = c / capacity
        demand_share = c * u / demand if demand > 0 else capacity_share
        result[name] = {
            "capacity": c,
            "utilization": u,
            "utilization_now": now,
            "capacity_share": capacity_share,
            "demand_share": demand_share,
            "score": capacity_share - demand_share,
        }
    return result


def load_of(utilization: float) -> float:
    """The load (share of what a cluster can serve) behind a utilization: KV use grows faster
    than load — decode slows as the batch grows, so each request holds its blocks longer, and
    near the top preemption recomputes. In the token-level simulator KV is 0.31 at half load
    and 0.55 at 73%, close to load²; the square root undoes it, so a step sized on it moves
    load, not KV. Utilization above 1 (a queue) passes through unchanged."""
    if utilization <= 0:
        return 0.0
    return utilization**0.5 if utilization < 1 else utilization


def capacity_goal(
    healthy: Mapping[str, Signals], base: Mapping[str, float], hot: Sequence[str] = ()
) -> dict[str, float]:
    """Where each cluster's weight should go, summing to 100: from the weights in force, each
    cluster's share moves by the gap between its capacity share and its demand share
    (capacity × utilization over the fleet's). A ``hot`` cluster counts with its newest
    utilization if that is above the filtered one.

    If a cluster's demand comes from the traffic routed to it, its demand share *is* its
    share, and one step lands on shares proportional to capacity, which even out utilization
    (a Newton step on a linear plant; feed-forward from the capacity estimate). Demand that
    does not follow the weights (local traffic) leaves a residue that later steps trim, as an
    integral term would. (Estimating local traffic per cluster instead, from the least demand
    per share, was tried: it reads a momentary lull on one cluster as local traffic on all
    the others, and swung two equal clusters in a 90 s limit cycle.)"""
    loads = {n: _load(s) for n, s in healthy.items()}
    demand = {n: c * load_of(max(u, now) if n in hot else u) for n, (c, u, now) in loads.items()}
    capacity = sum(c for c, _, _ in loads.values())
    total = sum(demand.values())
    result = dict.fromkeys(base, 0.0)
    for name, (c, _, _) in loads.items():
        share = demand[name] / total if total > 0 else c / capacity
        result[name] = max(0.0, base.get(name, 0.0) + TOTAL * (c / capacity - share))
    mass = sum(result.values())
    if mass <= 0:
        return {n: (TOTAL * loads[n][0] / capacity if n in loads else 0.0) for n in base}
    return {n: v * TOTAL / mass for n, v in result.items()}


def rest_goal(
    healthy: Mapping[str, Signals], base: Mapping[str, float], params: WeightSettings
) -> dict[str, float]:
    """With no cluster under pressure: shares proportional to capacity, except that a cluster
    gains only as far as its utilization, scaled with its share, stays below ``REST_LIMIT`` of
    ``pressure`` (demand that does not follow the weights, such as local traffic, is not moved
    back onto a cluster that would then be hot). Noise in utilization does not move it."""
    why = capacity_factors(healthy)
    goal = dict.fromkeys(base, 0.0)
    for name, f in why.items():
        share = TOTAL * f["capacity_share"]
        current = base.get(name, 0.0)
        if share > current and f["utilization"] > 0 and current > 0:
            share = min(share, current * REST_LIMIT * params.pressure / f["utilization"])
        goal[name] = max(share, min(current, TOTAL * f["capacity_share"]))
    mass = sum(goal.values())
    return {n: v * TOTAL / mass for n, v in goal.items()} if mass > 0 else dict(base)


REST_LIMIT = 0.85
GAIN = 0.5


def _capacity(
    clusters: Mapping[str, Signals | None],
    previous: Mapping[str, int] | None,
    base: Mapping[str, float] | None,
    params: WeightSettings,
    settling: bool,
) -> Decision:
    """The capacity law.

    - Under pressure (a cluster's filtered utilization at ``pressure``, or its newest reading
      at ``kv_saturation`` or past ``pressure`` while requests queue there, while another is
      below ``pressure``): step towards
      ``capacity_goal``, which sheds the hot cluster by how much more than its size it carries.
    - At rest: step towards capacity shares (``rest_goal``) only when a ref is ``rebalance``
      points or more away from it — a returning cluster, a share set by hand.
    - Every hot cluster and none cool (saturated): the same, never evening out: shares stay by
      capacity, so queues grow where there is most room to drain them.
    Steps move at most ``max_step`` per ref; after one, the law waits ``settle`` to see it
    act. Taking traffic off an unhealthy cluster never waits."""
    healthy = {n: s for n, s in clusters.items() if s is not None}
    names = list(healthy)
    floor = params.floor
    loads = {n: _load(s) for n, s in healthy.items()}
    quick = min(params.kv_saturation, params.pressure + 0.05)
    hot = [
        n
        for n, (_, u, now) in loads.items()
        if u >= params.pressure
        or now >= params.kv_saturation
        or (now >= quick and (healthy[n].queue_per_pod or 0) > 0)
    ]
    cool = [n for n in healthy if n not in hot]
    if previous is None or base is None:
        # nothing in force yet: shares by capacity, and if some cluster is already under
        # pressure one full, uncapped step off it (there is no split in force to smooth from)
        why = capacity_factors(healthy)
        first = {n: TOTAL * why[n]["capacity_share"] if n in why else 0.0 for n in clusters}
        if hot and cool:
            first = capacity_goal(healthy, first, hot)
        weights = round_to_total(_with_floor(first, names, floor), floor, names)
        return Decision(weights, first, Mode.INITIAL, True)
    saturated = bool(hot) and not cool
    forced = _forced(previous, names, params)
    pressing = False
    goal = dict(base)
    if hot and cool:
        goal = capacity_goal(healthy, base, hot)
        pressing = any(goal[n] <= base[n] - params.deadband for n in hot)
    apart = False
    if not pressing:
        goal = rest_goal(healthy, base, params)
        # a ref far below its capacity share (before the cap on gainers): a returning cluster
        # is brought back in capped steps (of at least half of ``rebalance``), each sized on
        # what its utilization did after the last. One above its share is left alone at rest
        # (measured: rebalancing those too doubled hot-hard's writes and added overload).
        why = capacity_factors(healthy)
        apart = any(
            TOTAL * why[n]["capacity_share"] - base[n] >= params.rebalance
            and goal[n] - base[n] >= max(params.deadband, params.rebalance / 2)
            for n in healthy
        )
    if not forced and (settling or not (pressing or apart)):
        return Decision(previous, goal, Mode.SATURATED if saturated else Mode.HOLD, False)
    # Full steps only where requests queue or the filtered utilization is at saturation
    # (traffic must go now); otherwise half of the way:
    # utilization swings by tens of points on a scale of a minute (heavy-tailed requests), and
    # a full step on a swing comes back as a reversal.
    queueing = any((healthy[n].queue_per_pod or 0) > 0 for n in hot)
    full = any(loads[n][1] >= params.kv_saturation for n in hot)  # filtered: saturated
    gain = 1.0 if queueing or full or forced else GAIN
    delta = {n: gain * (goal[n] - base[n]) for n in base}
    moved = _with_floor(_capped(base, delta, float(params.max_step)), names, floor)
    weights = round_to_total(moved, floor, names)
    if not forced and _within(previous, weights, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False)
    mode = Mode.SATURATED if saturated else Mode.NORMAL
    return Decision(weights, goal, mode, weights != previous)


def _with_floor(values: Mapping[str, float], healthy: list[str], floor: int) -> dict[str, float]:
    """Lift healthy clusters below the floor, taking from the others' excess over it."""
    low = min(float(floor), TOTAL / len(healthy))
    result = dict(values)
    deficit = sum(max(0.0, low - result[n]) for n in healthy)
    if deficit <= 0:
        return result
    excess = {n: result[n] - low for n in healthy if result[n] > low}
    spare = sum(excess.values())
    for name in healthy:
        if name in excess:
            result[name] -= deficit * excess[name] / spare
        else:
            result[name] = low
    return result


def proportional(values: Mapping[str, float], total: int) -> dict[str, int]:
    """Integers in the same proportions as ``values`` that sum to exactly ``total``
    (largest remainder; ties by name). All-zero input stays all zero."""
    mass = sum(values.values())
    if mass <= 0:
        return dict.fromkeys(values, 0)
    exact = {n: v * total / mass for n, v in values.items()}
    ints = {n: int(v) for n, v in exact.items()}
    for name in sorted(exact, key=lambda n: (-(exact[n] - ints[n]), n))[
        : total - sum(ints.values())
    ]:
        ints[name] += 1
    return ints


def round_to_total(values: Mapping[str, float], floor: int, healthy: list[str]) -> dict[str, int]:
    """Integers summing to exactly 100 (largest remainder; ties by name, so deterministic).

    Only healthy clusters receive the rounding remainder, and none ends below the floor
    (float error can leave 1.9999 where 2 was meant)."""
    ints = {n: (int(v) if n in healthy else 0) for n, v in values.items()}
    short = TOTAL - sum(ints.values())
    by_remainder = sorted(healthy, key=lambda n: (-(values[n] - ints[n]), n))
    for name in by_remainder[: max(0, short)]:
        ints[name] += 1
    low = min(floor, TOTAL // len(healthy))
    for name in healthy:
        while ints[name] < low:
            donor = max(healthy, key=lambda n: (ints[n], n))
            ints[donor] -= 1
            ints[name] += 1
    return ints
