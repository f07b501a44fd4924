"""The actuation delay: measured from the share of requests each cluster receives, and the
settle it makes the law keep."""

from __future__ import annotations

import random

from controller.reconcile.actuation import UNKNOWN, Actuation

INTERVAL, SETTLE = 10.0, 20.0


def arrivals(shares: dict[str, float], n: int, rng: random.Random) -> dict[str, float | None]:
    """``n`` requests split by ``shares`` (0..100) at random, as a router's would be."""
    counts = dict.fromkeys(shares, 0.0)
    names = list(shares)
    for _ in range(n):
        counts[rng.choices(names, [shares[c] for c in names])[0]] += 1
    return dict(counts)


def at_even_split(seed: int) -> tuple[Actuation, random.Random]:
    """An actuation that has seen three ticks of an even split (the baseline a change needs)."""
    act, rng = Actuation(), random.Random(seed)
    for tick in range(1, 4):
        act.observe(tick * INTERVAL, arrivals({"a": 50.0, "b": 50.0}, 300, rng))
    return act, rng


def drive(delay: float, seed: int, n: int = 300) -> tuple[Actuation, list[tuple[float, bool]]]:
    """One change at t=100 from 50/50 to 25/75, acting ``delay`` later; every tick's
    ``settling`` as the law would ask for it."""
    rng = random.Random(seed)
    act, settling = Actuation(), []
    before, after = {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}
    for tick in range(1, 30):
        now = tick * INTERVAL
        # the tick counts (now - 10, now]: part of it under each split once the change acts
        acts_at = 100.0 + delay
        part = min(1.0, max(0.0, (now - acts_at) / INTERVAL))
        split = {c: before[c] + part * (after[c] - before[c]) for c in before}
        act.observe(now, arrivals(split, n, rng))
        settling.append((now, act.settling(now, SETTLE, INTERVAL)))
        if now == 100.0:
            act.changed(now, before, after, INTERVAL)
    return act, settling


def test_the_delay_is_measured_within_a_tick() -> None:
    for delay in (5.0, 10.0, 30.0, 45.0):
        for seed in range(3):
            act, _ = drive(delay, seed)
            assert act.estimate is not None and abs(act.estimate - delay) <= INTERVAL / 2


def test_the_law_waits_until_the_change_acted_and_settle_is_the_floor() -> None:
    _, fast = drive(5.0, 1)
    waiting = [now for now, s in fast if s and now > 100]
    assert waiting and max(waiting) < 100 + 5 + SETTLE  # settle counts from when it acted
    _, slow = drive(30.0, 1)
    waiting = [now for now, s in slow if s and now > 100]
    assert max(waiting) >= 100 + 30  # never step before the last one acted


def test_a_router_that_ignores_the_weights_does_not_freeze_them() -> None:
    act, settling = drive(10_000.0, 2)  # never acts
    assert act.estimate is None
    waiting = [now for now, s in settling if s and now > 100]
    assert max(waiting) < 100 + UNKNOWN * INTERVAL


def test_small_moves_and_uncounted_clusters_are_not_measured() -> None:
    act, _ = at_even_split(3)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 47.0, "b": 53.0}, INTERVAL)
    assert act.pending is None  # 3 points drown in the counting noise
    later = 30.0 + UNKNOWN * INTERVAL  # the small one has surely acted by then
    act.observe(later, {"a": None, "b": 120.0})  # a dead cluster has no count
    act.changed(later, {"a": 47.0, "b": 53.0}, {"a": 0.0, "b": 100.0}, INTERVAL)
    assert act.pending is not None and act.pending.cluster == "b"


def test_a_change_made_before_the_last_one_acted_is_not_measured() -> None:
    act, rng = at_even_split(4)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}, INTERVAL)
    act.observe(40.0, arrivals({"a": 50.0, "b": 50.0}, 300, rng))
    act.changed(50.0, {"a": 25.0, "b": 75.0}, {"a": 10.0, "b": 90.0}, INTERVAL)
    assert act.pending is None  # the first one acting would be taken for the second


def test_a_change_soon_after_one_too_small_to_see_is_not_measured_either() -> None:
    act, rng = at_even_split(5)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 47.0, "b": 53.0}, INTERVAL)
    act.observe(40.0, arrivals({"a": 47.0, "b": 53.0}, 300, rng))
    act.changed(40.0, {"a": 47.0, "b": 53.0}, {"a": 20.0, "b": 80.0}, INTERVAL)
    assert act.pending is None


def test_one_stray_tick_beside_a_still_one_is_not_the_change_acting() -> None:
    """An arrival count that misreads one tick (counted from completions and what is in the
    system, it can) beside a tick that barely moved: pooled they pass for half the move, and
    a delay read off them would be near 0, letting later steps stack on a slow gateway
    (daily@30s: one world wrote 60 times an hour). The newest tick of the confirmation must
    show half the move on its own."""
    act, _ = at_even_split(8)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}, INTERVAL)
    act.observe(40.0, {"a": 45.0, "b": 255.0})  # the stray one: more than the move at once
    act.observe(50.0, {"a": 141.0, "b": 159.0})  # still at 53
    assert act.estimate is None and act.pending is not None
    for tick in (6, 7):  # it acts within the tick ending at 60
        act.observe(tick * INTERVAL, {"a": 75.0, "b": 225.0})
    assert act.estimate is not None and act.estimate >= INTERVAL
