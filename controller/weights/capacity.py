"""Pure: the capacity law (``weights.law: capacity``, the default).

Each healthy cluster has a *capacity* (what it can hold) and a *utilization* (its KV use,
scaled up by the queue; read now and filtered over recent scrapes: ``controller.signals``).

- Under pressure (a cluster's filtered utilization at ``pressure``, or its newest reading at
  ``kv_saturation`` or past ``pressure`` while requests queue there, while another is below
  ``pressure``): step towards ``capacity_goal``, which sheds the hot cluster by how much more
  than its size it carries.
- At rest: hold; step towards capacity shares (``rest_goal``) only when a ref is
  ``rebalance`` points or more away from it — a returning cluster, a share set by hand.
- Every hot cluster and none cool (saturated): the same, never evening out: shares stay by
  capacity, so queues grow where there is most room to drain them.

Steps move at most ``max_step`` per ref; after one, the law waits ``settle`` to see it act.
Taking traffic off an unhealthy cluster never waits. How the defaults were chosen, and what was
tried and dropped, is in ``controller/simulation/README.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.model import Decision, Mode, Signals
from controller.settings import WeightSettings
from controller.weights.rounding import TOTAL, round_to_total
from controller.weights.steps import capped, forced, with_floor, within

LAW = "capacity"
# At rest a cluster gains only as far as keeps its utilization below this share of pressure.
REST_LIMIT = 0.85
# Where no request queues and nothing is saturated, a step takes this share of the way: a full
# step on a swing of utilization comes back as a reversal.
GAIN = 0.5


def load(signals: Signals) -> tuple[float, float, float]:
    """(capacity, filtered utilization, newest utilization) of one healthy cluster."""
    capacity = signals.capacity if signals.capacity and signals.capacity > 0 else 1.0
    now = signals.utilization if signals.utilization is not None else signals.kv
    filtered = signals.demand if signals.demand is not None else now
    return capacity, filtered, now


def factors(healthy: Mapping[str, Signals]) -> dict[str, dict[str, float]]:
    """Each healthy cluster's share of the fleet's capacity and of the demand it carries
    (capacity × utilization). ``score`` = capacity share − demand share: above 0 the cluster
    can take more than it has, below 0 it carries more than its size."""
    loads = {n: load(s) for n, s in healthy.items()}
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
    near the top preemption recomputes. In the token-level simulator KV grows close to load²;
    the square root undoes it, so a step sized on it moves load, not KV. Utilization above 1
    (a queue) passes through unchanged."""
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
    integral term would."""
    loads = {n: load(s) for n, s in healthy.items()}
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
    why = factors(healthy)
    goal = dict.fromkeys(base, 0.0)
    for name, f in why.items():
        share = TOTAL * f["capacity_share"]
        current = base.get(name, 0.0)
        if share > current and f["utilization"] > 0 and current > 0:
            share = min(share, current * REST_LIMIT * params.pressure / f["utilization"])
        goal[name] = max(share, min(current, TOTAL * f["capacity_share"]))
    mass = sum(goal.values())
    return {n: v * TOTAL / mass for n, v in goal.items()} if mass > 0 else dict(base)


def hot_clusters(healthy: Mapping[str, Signals], params: WeightSettings) -> list[str]:
    """The clusters under pressure: filtered utilization at ``pressure``, the newest reading at
    ``kv_saturation``, or past ``pressure`` (by a margin) while requests queue there."""
    quick = min(params.kv_saturation, params.pressure + 0.05)
    loads = {n: load(s) for n, s in healthy.items()}
    return [
        n
        for n, (_, u, now) in loads.items()
        if u >= params.pressure
        or now >= params.kv_saturation
        or (now >= quick and (healthy[n].queue_per_pod or 0) > 0)
    ]


def decide(
    clusters: Mapping[str, Signals | None],
    previous: Mapping[str, int] | None,
    base: Mapping[str, float] | None,
    params: WeightSettings,
    settling: bool,
) -> Decision:
    """The capacity law's next weights (see the module docstring); ``previous`` is what is in
    force and ``base`` the same with unhealthy clusters' share handed to the survivors."""
    healthy = {n: s for n, s in clusters.items() if s is not None}
    names = list(healthy)
    hot = hot_clusters(healthy, params)
    cool = [n for n in healthy if n not in hot]
    if previous is None or base is None:
        return _first(clusters, healthy, hot, cool, params.floor)
    saturated = bool(hot) and not cool
    must = forced(previous, names, params.floor)
    pressing = False
    goal = dict(base)
    if hot and cool:
        goal = capacity_goal(healthy, base, hot)
        pressing = any(goal[n] <= base[n] - params.deadband for n in hot)
    apart = False
    if not pressing:
        goal = rest_goal(healthy, base, params)
        apart = _apart(healthy, base, goal, params)
    if not must and (settling or not (pressing or apart)):
        return Decision(previous, goal, Mode.SATURATED if saturated else Mode.HOLD, False, law=LAW)
    weights = _step(healthy, base, goal, hot, must, params)
    if not must and within(previous, weights, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False, law=LAW)
    mode = Mode.SATURATED if saturated else Mode.NORMAL
    return Decision(weights, goal, mode, weights != previous, law=LAW)


def _first(
    clusters: Mapping[str, Signals | None],
    healthy: Mapping[str, Signals],
    hot: Sequence[str],
    cool: Sequence[str],
    floor: int,
) -> Decision:
    """Nothing in force yet: shares by capacity, and if some cluster is already under pressure
    one full, uncapped step off it (there is no split in force to smooth from)."""
    why = factors(healthy)
    first = {n: TOTAL * why[n]["capacity_share"] if n in why else 0.0 for n in clusters}
    if hot and cool:
        first = capacity_goal(healthy, first, hot)
    names = list(healthy)
    weights = round_to_total(with_floor(first, names, floor), floor, names)
    return Decision(weights, first, Mode.INITIAL, True, law=LAW)


def _apart(
    healthy: Mapping[str, Signals],
    base: Mapping[str, float],
    goal: Mapping[str, float],
    params: WeightSettings,
) -> bool:
    """A ref far below its capacity share (before the cap on gainers): a returning cluster is
    brought back in capped steps (of at least half of ``rebalance``), each sized on what its
    utilization did after the last. One above its share is left alone at rest."""
    why = factors(healthy)
    return any(
        TOTAL * why[n]["capacity_share"] - base[n] >= params.rebalance
        and goal[n] - base[n] >= max(params.deadband, params.rebalance / 2)
        for n in healthy
    )


def _step(
    healthy: Mapping[str, Signals],
    base: Mapping[str, float],
    goal: Mapping[str, float],
    hot: Sequence[str],
    must: bool,
    params: WeightSettings,
) -> dict[str, int]:
    """A step towards ``goal``: full where requests queue at a hot cluster, its filtered
    utilization is saturated, or the change is forced (traffic must go now); otherwise
    ``GAIN`` of the way. At most ``max_step`` per ref, none below ``floor``."""
    queueing = any((healthy[n].queue_per_pod or 0) > 0 for n in hot)
    full = any(load(healthy[n])[1] >= params.kv_saturation for n in hot)
    gain = 1.0 if queueing or full or must else GAIN
    delta = {n: gain * (goal[n] - base[n]) for n in base}
    names = list(healthy)
    moved = with_floor(capped(base, delta, float(params.max_step)), names, params.floor)
    return round_to_total(moved, params.floor, names)
