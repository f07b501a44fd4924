"""Pure: the capacity law (``weights.law: capacity``, the default).

Each healthy cluster has a *capacity* (what it holds: KV-cache tokens where every cluster of
the target says, else pods) and a *utilization* (its KV use, scaled up by the queue; read now
and filtered over recent scrapes: ``controller.signals``). Compute speed enters through
utilization: a faster GPU finishes requests sooner, so the same traffic holds less of its KV.

- Under pressure (a cluster's filtered utilization at ``pressure``; or its newest two readings
  within ``RISING`` of it, the fast path; or its newest at ``kv_saturation`` with requests
  waiting) while another has room (below ``pressure`` now, filtered and before): step towards
  ``capacity_goal``, which sheds the hot cluster by how much more than its size it carries,
  and by more where its arrivals show traffic the weights do not move (``follows``); such a
  cluster's load is also read from its arrivals (``arrival_loads``), which, unlike KV use,
  do not saturate. Where some cluster carries traffic the weights do not move (``fair_shares``),
  a hot cluster whose filtered load stays below ``kv_saturation`` (``_transient``) is not shed
  below the share that evens out load (``even_shares``; for one with traffic of its own, its
  fair share while that is steady, ``steady_fair``), or what it holds if less (``held_to``):
  at the fleet's even load, a reading at ``pressure`` is a Poisson burst, and shedding it
  hands the cluster with traffic of its own points it sheds again. One whose load stays
  saturated is shed as any other.
- At rest: hold; step towards capacity shares (``rest_goal``, whose cap on gainers holds) only
  when a ref is ``rebalance`` points or more below its share and its cluster is clearly less
  used than the others (``APART``): a returning cluster, a share set by hand. A cluster whose
  arrivals, over ``weights.realised_window`` and now, carry traffic the weights do not move
  gains no further than its fair share (``fair_shares``).
- A hot cluster saturated with a growing queue while another has room (``emergency``): the
  step off it may pass ``max_step``, which then bounds what each other cluster gains (or its
  room before ``pressure``, ``rooms``, if more); one step, then the same wait as any other
  (mode ``emergency``).
- Every hot cluster and none with room (saturated): the same, never evening out: shares stay
  by capacity, so queues grow where there is most room to drain them. A single dip is not room.

Steps move at most ``max_step`` per ref, but for an emergency; after one the law waits
(``settling``) until it is seen acting, with ``settle`` as the floor
(``controller.reconcile.actuation``). Taking traffic off an unhealthy cluster never waits.
How the defaults were chosen, and what was tried and dropped, is in
``controller/simulation/HISTORY.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.model import Decision, Mode, Served, Signals
from controller.settings import WeightSettings
from controller.weights.rounding import TOTAL, round_to_total
from controller.weights.steps import capped, forced, with_floor, within

LAW = "capacity"
# At rest a cluster gains only as far as keeps its utilization below this share of pressure.
REST_LIMIT = 0.85
# Where no request queues and nothing is saturated, a step takes this share of the way: a full
# step on a swing of utilization comes back as a reversal.
GAIN = 0.5
# At rest a cluster below its capacity share is handed more only while its utilization is at
# most this share of the rest of the fleet's.
APART = 0.7
# ``follows``: at most this much more shedding than the weights alone suggest, and only from
# this many requests in the tick.
MIN_FOLLOW = 1 / 3
MIN_ARRIVALS = 30.0
# ``arrival_loads`` is used for a hot cluster at most this much of whose arrivals follow the
# weights: elsewhere arrivals ∝ weights, and an arrival's cost differs with the GPU.
LOCAL = 0.8
# The most load a queue is read as: 1.5× what the cluster can serve (see ``load_of``).
MAX_LOAD = 1.5
# The fast path: two readings in a row within this much of ``pressure`` are under pressure.
RISING = 0.05
# ``steady_fair``: a hot cluster with traffic of its own is shed no lower than its fair share
# only while it holds from this many points below that share to this many above it (further
# below, the share is stale: its own traffic rose; further above, it has not been placed there)
# and its arrivals now show no more of that traffic than the window, within this many σ.
FAIR_BELOW, FAIR_ABOVE, FAIR_SIGMAS = 4.0, 6.0, 2.0


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
    (a queue) passes through, up to ``MAX_LOAD``: a queue is a backlog, the sum of past excess,
    not the rate that overflows now, and shedding by its length sends everything away until
    it drains and then everything back."""
    if utilization <= 0:
        return 0.0
    return utilization**0.5 if utilization < 1 else min(utilization, MAX_LOAD)


def follows(healthy: Mapping[str, Signals], base: Mapping[str, float]) -> dict[str, float]:
    """The share of each cluster's requests that its weight explains (``base``, 0..100, the
    split in force), from this tick's arrivals: 1 where all of them follow the weights, less
    where a cluster also serves traffic they do not move (local requests, another target's).
    With one such cluster it is exact: its arrivals are ``w·R + L`` of a total ``R + L``.
    Between ``MIN_FOLLOW`` and 1; nothing where the arrivals are not all counted."""
    arrived = {n: s.arrived for n, s in healthy.items()}
    known = {n: a for n, a in arrived.items() if a is not None}
    total = sum(known.values())
    if len(known) < len(arrived) or total < MIN_ARRIVALS:
        return {}
    return {
        n: min(1.0, max(MIN_FOLLOW, base.get(n, 0.0) / TOTAL * total / a))
        for n, a in known.items()
        if a > 0
    }


def arrival_loads(healthy: Mapping[str, Signals], hot: Sequence[str]) -> dict[str, float]:
    """Each hot cluster's load as its arrivals tell it: KV use saturates near the top (a
    cluster offered 120% of what it serves reads much as one offered 95%), its arrivals do
    not. What an arrival costs per unit of capacity is read off the clusters that are not hot
    (their load from utilization, ``load_of``, over their arrivals), and a hot cluster's
    load is its arrivals at that cost, up to ``MAX_LOAD``. Nothing where the arrivals are
    not all counted, too few, or no cluster that is not hot carries any."""
    arrived = {n: s.arrived for n, s in healthy.items()}
    if (
        any(a is None for a in arrived.values())
        or sum(a or 0.0 for a in arrived.values()) < MIN_ARRIVALS
    ):
        return {}
    loads = {n: load(s) for n, s in healthy.items()}
    others = [n for n in healthy if n not in hot]
    cost_load = sum(loads[n][0] * load_of(loads[n][1]) for n in others)
    cost_arrivals = sum(arrived[n] or 0.0 for n in others)
    if cost_arrivals <= 0 or cost_load <= 0:
        return {}
    cost = cost_load / cost_arrivals
    return {n: min(MAX_LOAD, cost * (arrived[n] or 0.0) / loads[n][0]) for n in hot}


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
    integral term would. A hot cluster whose arrivals show such demand (``follows`` below 1)
    is shed by that much more at once: only the part that follows the weights can move."""
    loads = {n: load(s) for n, s in healthy.items()}
    demand = {n: c * load_of(max(u, now) if n in hot else u) for n, (c, u, now) in loads.items()}
    follow = follows(healthy, base)
    for name, estimate in arrival_loads(healthy, hot).items():
        if follow.get(name, 1.0) <= LOCAL:  # elsewhere arrivals only restate the weights
            demand[name] = max(demand[name], loads[name][0] * estimate)
    capacity = sum(c for c, _, _ in loads.values())
    total = sum(demand.values())
    result = dict.fromkeys(base, 0.0)
    for name, (c, _, _) in loads.items():
        share = demand[name] / total if total > 0 else c / capacity
        move = TOTAL * (c / capacity - share)
        if name in hot and move < 0:
            move /= follow.get(name, 1.0)
        result[name] = max(0.0, base.get(name, 0.0) + move)
    mass = sum(result.values())
    if mass <= 0:
        return {n: (TOTAL * loads[n][0] / capacity if n in loads else 0.0) for n in base}
    return {n: v * TOTAL / mass for n, v in result.items()}


def unmoved(healthy: Mapping[str, Signals], served: Served) -> tuple[dict[str, float], float]:
    """Over ``weights.realised_window``, from each cluster's realised and intended share
    (``served``): the arrivals of each healthy cluster that the weights do not move, as a share
    of all arrivals (0..1; only clusters at most ``LOCAL`` of whose arrivals follow the
    weights), and the share of all arrivals that the weights route. Where a cluster's arrivals
    are ``w·R + L`` of a total ``T``, the clusters without such traffic give ``R/T`` (what they
    realised over what they were meant to), and each other cluster's ``L/T`` is what it
    realised beyond ``w·R/T``. A window holds hundreds of requests, where ``follows`` reads
    one tick's few dozen: from those, a fair share lands anywhere in 6–17 points
    (controller/simulation/HISTORY.md)."""
    shares = {n: served[n] for n in healthy if n in served}
    realised = sum(r for r, _ in shares.values())
    intended = sum(w for _, w in shares.values())
    if len(shares) < len(healthy) or realised <= 0 or intended <= 0:
        return {}, 1.0
    shares = {n: (r / realised, w / intended) for n, (r, w) in shares.items()}
    local = {n for n, (r, w) in shares.items() if r > 0 and w / r <= LOCAL}
    follow_r = sum(r for n, (r, _) in shares.items() if n not in local)
    follow_w = sum(w for n, (_, w) in shares.items() if n not in local)
    if not local or follow_w <= 0:
        return {}, 1.0
    routed = min(1.0, follow_r / follow_w)
    if routed <= 0:  # nothing the weights route arrived anywhere: no share is fair to read
        return {}, 1.0
    return {n: max(0.0, shares[n][0] - shares[n][1] * routed) for n in local}, routed


def fair_shares(
    healthy: Mapping[str, Signals], base: Mapping[str, float], served: Served
) -> dict[str, tuple[float, float]]:
    """Each cluster that carries traffic the weights do not move, over the window
    (``unmoved``) and in this tick's arrivals too (``follows``, so that a burst that has
    ended no longer counts): that traffic's share of all arrivals, and its *fair share*
    (0..100), the share that gives it arrivals in proportion to its capacity with its own
    traffic counted (in proportion to capacity is what capacity shares give the others)."""
    local, routed = unmoved(healthy, served)
    if not local:
        return {}
    follow = follows(healthy, base)
    why = factors(healthy)
    return {
        n: (extra, TOTAL * max(0.0, why[n]["capacity_share"] - extra) / routed)
        for n, extra in local.items()
        if follow.get(n, 1.0) <= LOCAL
    }


def rest_goal(
    healthy: Mapping[str, Signals],
    base: Mapping[str, float],
    params: WeightSettings,
    fair: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, float]:
    """With no cluster under pressure: shares proportional to capacity, except that a cluster
    gains only as far as its utilization, scaled with the part of its share that follows the
    weights (``follows``), stays below ``REST_LIMIT`` of ``pressure``: demand that does not
    follow the weights, such as local traffic, is not moved back onto a cluster that would
    then be hot. Noise in utilization does not move it. A cluster with a ``fair`` share
    (``fair_shares``) gains no further than that: its utilization, read in a lull, would
    hand it its capacity share, which its own traffic makes wrong.

    A gainer held by that cap keeps exactly its cap: only the others are scaled to make the
    goals sum to 100 (scaling every goal would hand the capped ones more than the cap)."""
    why = factors(healthy)
    follow = follows(healthy, base)
    goal = dict.fromkeys(base, 0.0)
    capped: set[str] = set()
    for name, f in why.items():
        share = TOTAL * f["capacity_share"]
        current = base.get(name, 0.0)
        if fair and name in fair and fair[name][1] < share:
            share = max(fair[name][1], min(current, share))
            capped.add(name)
        if share > current and f["utilization"] > 0 and current > 0:
            # only the part that follows the weights grows with them
            rho = follow.get(name, 1.0)
            room = REST_LIMIT * params.pressure / f["utilization"] - (1.0 - rho)
            cap = current * max(0.0, room) / rho
            if cap < share:
                share = max(cap, current)
                capped.add(name)
        goal[name] = share
    held = sum(goal[n] for n in capped)
    rest = sum(v for n, v in goal.items() if n not in capped)
    if rest <= 0 or held >= TOTAL:
        mass = sum(goal.values())
        return {n: v * TOTAL / mass for n, v in goal.items()} if mass > 0 else dict(base)
    scale = (TOTAL - held) / rest
    return {n: v if n in capped else v * scale for n, v in goal.items()}


def hot_clusters(healthy: Mapping[str, Signals], params: WeightSettings) -> list[str]:
    """The clusters under pressure: filtered utilization at ``pressure``, or the newest two
    readings both near it (``rising``: the fast path, which does not wait for the filter to
    catch up). A single high reading is a transient, not yet a trend."""
    return [
        n
        for n, s in healthy.items()
        if load(s)[1] >= params.pressure
        or rising(s, params.pressure)
        or (load(s)[2] >= params.kv_saturation and (s.queue_per_pod or 0) > 0)
    ]


def rising(signals: Signals, pressure: float) -> bool:
    """The newest reading and the one before it are both within ``RISING`` of ``pressure``."""
    now = load(signals)[2]
    return signals.previous is not None and min(now, signals.previous) >= pressure - RISING


def cool_clusters(
    healthy: Mapping[str, Signals], hot: Sequence[str], params: WeightSettings
) -> list[str]:
    """The clusters that can take more: not hot, and below ``pressure`` filtered, now and at
    the reading before (a single dip in a hot fleet is not room)."""
    result = []
    for name, s in healthy.items():
        _, u, now = load(s)
        before = s.previous if s.previous is not None else now
        if name not in hot and max(u, now, before) < params.pressure:
            result.append(name)
    return result


def decide(
    clusters: Mapping[str, Signals | None],
    previous: Mapping[str, int] | None,
    base: Mapping[str, float] | None,
    params: WeightSettings,
    settling: bool,
    served: Served | None = None,
) -> Decision:
    """The capacity law's next weights (see the module docstring); ``previous`` is what is in
    force and ``base`` the same with unhealthy clusters' share handed to the survivors;
    ``served``, each cluster's realised and intended share over ``weights.realised_window``."""
    healthy = {n: s for n, s in clusters.items() if s is not None}
    names = list(healthy)
    hot = hot_clusters(healthy, params)
    cool = cool_clusters(healthy, hot, params)
    if previous is None or base is None:
        return _first(clusters, healthy, hot, cool, params.floor)
    saturated = bool(hot) and not cool
    must = forced(previous, names, params.floor)
    pressing = False
    goal = dict(base)
    fair = fair_shares(healthy, base, served or {})
    held: tuple[str, ...] = ()
    if hot and cool:
        shed = capacity_goal(healthy, base, hot)
        floors = {**even_shares(healthy, fair), **steady_fair(healthy, base, fair)}
        goal = held_to(shed, base, [n for n in hot if _transient(healthy[n], params)], floors)
        held = tuple(
            f"{n}: hot on readings its load does not keep (filtered {load(healthy[n])[1]:.2f}):"
            f" shed no lower than {goal[n]:.1f} (its floor with the traffic the weights do "
            "not move counted, or what it holds if less)"
            for n in hot
            if goal[n] > shed[n] + 1e-9
        )
        pressing = any(goal[n] <= base[n] - params.deadband for n in hot)
    apart = False
    notes: tuple[str, ...] = held
    if not pressing:
        notes += tuple(
            f"{n}: {100 * extra:.0f}% of arrivals do not follow the weights: at rest it gains "
            f"no further than its fair share, {share:.1f}"
            for n, (extra, share) in sorted(fair.items())
        )
        goal = rest_goal(healthy, base, params, fair)
        apart = _apart(healthy, base, goal, params)
    if not must and (settling or not (pressing or apart)):
        mode = Mode.SATURATED if saturated else Mode.HOLD
        return Decision(previous, goal, mode, False, notes, law=LAW)
    urgent = pressing and emergency(healthy, hot, params)
    weights = _step(healthy, base, goal, hot, must, params, urgent)
    if not must and within(previous, weights, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False, notes, law=LAW)
    mode = Mode.SATURATED if saturated else Mode.EMERGENCY if urgent else Mode.NORMAL
    return Decision(weights, goal, mode, weights != previous, notes, law=LAW)


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
    """A ref far below its capacity share (before the cap on gainers) whose cluster is also
    clearly less used than the rest of the fleet (``APART`` of their utilization): a returning
    cluster is brought back in capped steps (of at least half of ``rebalance``), each sized
    on what its utilization did after the last. One above its share is left alone at rest, and
    so is one below it that is as busy as the others (it carries traffic the weights do not
    move, or its GPUs are slower than its size says): handing it more would only come back."""
    why = factors(healthy)
    return any(
        TOTAL * why[n]["capacity_share"] - base[n] >= params.rebalance
        and goal[n] - base[n] >= max(params.deadband, params.rebalance / 2)
        and why[n]["utilization"] <= APART * _others(why, n)
        for n in healthy
    )


def _others(why: Mapping[str, Mapping[str, float]], name: str) -> float:
    """The capacity-weighted utilization of every cluster but ``name``."""
    others = [f for n, f in why.items() if n != name]
    capacity = sum(f["capacity"] for f in others)
    if capacity <= 0:
        return 0.0
    return sum(f["capacity"] * f["utilization"] for f in others) / capacity


def _step(
    healthy: Mapping[str, Signals],
    base: Mapping[str, float],
    goal: Mapping[str, float],
    hot: Sequence[str],
    must: bool,
    params: WeightSettings,
    urgent: bool,
) -> dict[str, int]:
    """A step towards ``goal``: full where requests queue at a hot cluster, its filtered
    utilization is saturated, its last two readings are at ``pressure``, or the change is
    forced (traffic must go now); otherwise ``GAIN`` of the way. At most ``max_step`` per
    ref, none below ``floor``. When ``urgent`` (``emergency``) the bound holds the gainers
    alone: each gains at most ``max_step`` or, where its cluster has more room (``rooms``),
    that; a hot cluster loses whatever they take together."""
    queueing = any((healthy[n].queue_per_pod or 0) > 0 for n in hot)
    full = any(
        load(healthy[n])[1] >= params.kv_saturation or rising(healthy[n], params.pressure)
        for n in hot
    )
    gain = 1.0 if queueing or full or must else GAIN
    delta = {n: gain * (goal[n] - base[n]) for n in base}
    names = list(healthy)
    step = float(params.max_step)
    if urgent:  # the hot one may lose all the others take, each up to its room
        room = rooms(healthy, base, hot, params.pressure)
        moved = capped(base, delta, TOTAL, {n: max(step, room.get(n, 0.0)) for n in base})
    else:
        moved = capped(base, delta, step)
    return round_to_total(with_floor(moved, names, params.floor), params.floor, names)


def emergency(healthy: Mapping[str, Signals], hot: Sequence[str], params: WeightSettings) -> bool:
    """A hot cluster saturated (newest utilization at ``kv_saturation``) with requests
    waiting, more than at the reading before: it is offered more than it serves, and each
    interval spent in ``max_step``-sized steps adds to a backlog that takes minutes to drain."""
    return any(
        (now := load(s)[2]) >= params.kv_saturation
        and (s.queue_per_pod or 0) > 0
        and s.previous is not None
        and now > s.previous
        for s in (healthy[n] for n in hot)
    )


def _transient(s: Signals, params: WeightSettings) -> bool:
    """Hot on readings its load does not keep: its filtered utilization below
    ``kv_saturation``. Only such a cluster is held to an even floor (``held_to``); one whose
    load stays saturated is shed as before, whatever another cluster's traffic of its own (a
    review: a follower on slower cards, its KV pool read as big as the others', was held at
    its even share, its queue growing for the rest of the run). Below ``pressure`` or not
    saturating (``emergency``'s own test) would be stricter, and released the floor on the
    noise it is for (local-heavy 30 writes/h again, simulation/HISTORY.md)."""
    return load(s)[1] < params.kv_saturation


def rooms(
    healthy: Mapping[str, Signals], base: Mapping[str, float], hot: Sequence[str], pressure: float
) -> dict[str, float]:
    """How much more share each cluster that is not hot can take before its load (``load_of``
    its higher utilization, filtered or newest) reaches the load ``pressure`` stands for;
    its load grows with its share, as its traffic follows the weights."""
    limit = load_of(pressure)
    result = {}
    for name, signals in healthy.items():
        if name in hot:
            continue
        _, filtered, now = load(signals)
        busy = load_of(max(filtered, now))
        share = base.get(name, 0.0)
        result[name] = max(0.0, share * (limit / busy - 1.0)) if busy > 0 else float(TOTAL)
    return result


def even_shares(
    healthy: Mapping[str, Signals], fair: Mapping[str, tuple[float, float]]
) -> dict[str, float]:
    """Where some cluster carries traffic the weights do not move (``fair``, from
    ``fair_shares``): the share (0..100) of each other cluster that evens out load, what the
    fair shares leave split by capacity (what the oracle would give it, read from the
    arrivals over ``weights.realised_window``). Nothing where no cluster has a fair share."""
    if not fair:
        return {}
    why = factors(healthy)
    left = TOTAL - sum(share for _, share in fair.values())
    others = {n: f["capacity_share"] for n, f in why.items() if n not in fair}
    capacity = sum(others.values())
    if left <= 0 or capacity <= 0:
        return {}
    return {n: left * c / capacity for n, c in others.items()}


def steady_fair(
    healthy: Mapping[str, Signals],
    base: Mapping[str, float],
    fair: Mapping[str, tuple[float, float]],
) -> dict[str, float]:
    """The fair share of each cluster with traffic of its own (``fair``) where it can be
    trusted as a floor: the cluster holds from ``FAIR_BELOW`` points below it to
    ``FAIR_ABOVE`` above, and this tick's arrivals show no more of its own traffic than the
    window did, beyond ``FAIR_SIGMAS`` of counting noise. A window still holding calm minutes
    puts the share too high when that traffic rises (a spike): the cluster is then hot below
    its share, or its arrivals say so."""
    if not fair:
        return {}
    arrived = {n: s.arrived for n, s in healthy.items()}
    if any(a is None for a in arrived.values()):
        return {}
    total = sum(a or 0.0 for a in arrived.values())
    followers = [n for n in healthy if n not in fair]
    weight = sum(base.get(n, 0.0) for n in followers) / TOTAL
    if total < MIN_ARRIVALS or weight <= 0:
        return {}
    routed = sum(arrived[n] or 0.0 for n in followers) / weight  # all the weights route now
    result = {}
    for name, (extra, share) in fair.items():
        held = base.get(name, 0.0)
        if not share - FAIR_BELOW <= held <= share + FAIR_ABOVE:
            continue
        a = arrived[name] or 0.0
        own = max(0.0, a - held / TOTAL * routed)
        if own / total <= extra + FAIR_SIGMAS * max(1.0, a) ** 0.5 / total:
            result[name] = share
    return result


def held_to(
    goal: Mapping[str, float],
    base: Mapping[str, float],
    hot: Sequence[str],
    floors: Mapping[str, float],
) -> dict[str, float]:
    """``goal`` with no hot cluster shed below its floor (``floors``), or below what it holds
    if that is less; what it keeps is taken back from the gainers in proportion to their
    gains, so the goals still sum to 100."""
    result = dict(goal)
    kept = 0.0
    for name in hot:
        if name not in floors:
            continue
        least = min(base.get(name, 0.0), floors[name])
        if result[name] < least:
            kept += least - result[name]
            result[name] = least
    if kept <= 0:
        return result
    gains = {n: v - base.get(n, 0.0) for n, v in result.items() if v > base.get(n, 0.0)}
    total = sum(gains.values())
    if total <= 0:
        return dict(goal)
    scale = max(0.0, 1.0 - kept / total)
    for name, gain in gains.items():
        result[name] = base.get(name, 0.0) + gain * scale
    return result
