"""Pure: the integral law (``weights.law: integral``), the previous default, kept as a fallback
and as a baseline in the simulator.

1. Goal: every healthy cluster gets ``floor``; the rest is shared in proportion to a score:
   KV headroom ``(1 - kv / kv_saturation) ** kv_exponent``, times a queue penalty and a latency
   penalty relative to the best cluster. Unhealthy clusters get 0. If every healthy cluster is
   saturated, they split evenly. That is the first decision (nothing in force yet). After it,
   each cluster's goal moves from its weight in force by ``gain`` points per unit of score
   above or below the fleet's mean: an integral controller that stops where the scores even
   out, so clusters of different sizes end up with shares that fit their capacity.
2. Hold: if the goal is within ``deadband`` of the weights in force and no cluster gained or
   lost traffic entirely, nothing is published — noise is not republished.
3. Step: from the weights in force (a dead cluster's share first handed to the survivors in
   proportion to what they carry), move ``smoothing`` of the way to the goal — at least the
   deadband, at most ``max_step`` per cluster — keeping the sum.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.model import Decision, Mode, Signals
from controller.settings import WeightSettings
from controller.weights.rounding import TOTAL, round_to_total
from controller.weights.steps import capped, forced, with_floor, within

LAW = "integral"


def factors(healthy: Mapping[str, Signals], params: WeightSettings) -> dict[str, dict[str, float]]:
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
    return {name: f["score"] for name, f in factors(healthy, params).items()}


def targets(
    clusters: Mapping[str, Signals | None],
    params: WeightSettings,
    base: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], bool]:
    """Real-valued goal weights summing to 100, and whether every healthy one is saturated.

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
        return with_floor(result, list(healthy), params.floor), False
    total = sum(score.values())
    spare = TOTAL - floor * len(healthy)
    for name in healthy:
        result[name] = floor + spare * score[name] / total
    return result, False


def decide(
    clusters: Mapping[str, Signals | None],
    previous: Mapping[str, int] | None,
    base: Mapping[str, float] | None,
    params: WeightSettings,
) -> Decision:
    """The integral law's next weights (see the module docstring); ``previous`` is what is in
    force and ``base`` the same with unhealthy clusters' share handed to the survivors."""
    healthy = [n for n, s in clusters.items() if s is not None]
    if previous is None or base is None:
        goal, _ = targets(clusters, params)
        weights = round_to_total(goal, params.floor, healthy)
        return Decision(weights, goal, Mode.INITIAL, True, law=LAW)
    goal, saturated = targets(clusters, params, base)
    mode = Mode.SATURATED if saturated else Mode.NORMAL
    must = forced(previous, healthy, params.floor)
    if not must and within(previous, goal, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False, law=LAW)  # within the deadband
    moved = with_floor(_step(base, goal, params), healthy, params.floor)
    weights = round_to_total(moved, params.floor, healthy)
    if not must and within(previous, weights, params.deadband):
        return Decision(previous, goal, Mode.HOLD, False, law=LAW)
    return Decision(weights, goal, mode, weights != previous, law=LAW)


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
    return capped(base, delta, cap)
