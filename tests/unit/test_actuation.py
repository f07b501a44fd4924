"""The actuation delay: measured from the share of requests each cluster receives (counted by
``realised.Arrivals``), and the settle it makes the law keep."""

from __future__ import annotations

import random

from controller.model import ClusterMetrics, PodError, Reason
from controller.reconcile.actuation import UNKNOWN, Actuation
from controller.reconcile.realised import Arrivals

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
        act.observe(tick * INTERVAL, arrivals({"a": 50.0, "b": 50.0}, 300, rng), INTERVAL)
    return act, rng


def drive(
    delay: float, seed: int, n: int = 300, local: float = 0.0
) -> tuple[Actuation, list[tuple[float, bool]]]:
    """One change at t=100 from 50/50 to 25/75, acting ``delay`` later; every tick's
    ``settling`` as the law would ask for it. ``local``: requests b also serves each tick
    that the weights do not route."""
    rng = random.Random(seed)
    act, settling = Actuation(), []
    before, after = {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}
    for tick in range(1, 30):
        now = tick * INTERVAL
        # the tick counts (now - 10, now]: part of it under each split once the change acts
        acts_at = 100.0 + delay
        part = min(1.0, max(0.0, (now - acts_at) / INTERVAL))
        split = {c: before[c] + part * (after[c] - before[c]) for c in before}
        counts = arrivals(split, n, rng)
        counts["b"] = (counts["b"] or 0.0) + local
        act.observe(now, counts, INTERVAL)
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
    # given up once its time is out, that time counting as a delay (not seen acting in it)
    assert act.pending is None and act.estimate == UNKNOWN * INTERVAL
    waiting = [now for now, s in settling if s and now > 100]
    assert max(waiting) < 100 + UNKNOWN * INTERVAL


def test_small_moves_and_uncounted_clusters_are_not_measured() -> None:
    act, _ = at_even_split(3)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 47.0, "b": 53.0}, INTERVAL)
    assert act.pending is None  # 3 points drown in the counting noise
    later = 30.0 + UNKNOWN * INTERVAL  # the small one has surely acted by then
    act.observe(later, {"a": None, "b": 120.0}, INTERVAL)  # a dead cluster has no count
    act.changed(later, {"a": 47.0, "b": 53.0}, {"a": 0.0, "b": 100.0}, INTERVAL)
    assert act.pending is not None and act.pending.cluster == "b"


def test_a_change_made_before_the_last_one_acted_is_not_measured() -> None:
    act, rng = at_even_split(4)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}, INTERVAL)
    act.observe(40.0, arrivals({"a": 50.0, "b": 50.0}, 300, rng), INTERVAL)
    act.changed(50.0, {"a": 25.0, "b": 75.0}, {"a": 10.0, "b": 90.0}, INTERVAL)
    assert act.pending is None  # the first one acting would be taken for the second


def test_a_change_soon_after_one_too_small_to_see_is_not_measured_either() -> None:
    act, rng = at_even_split(5)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 47.0, "b": 53.0}, INTERVAL)
    act.observe(40.0, arrivals({"a": 47.0, "b": 53.0}, 300, rng), INTERVAL)
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
    act.observe(
        40.0, {"a": 45.0, "b": 255.0}, INTERVAL
    )  # the stray one: more than the move at once
    act.observe(50.0, {"a": 141.0, "b": 159.0}, INTERVAL)  # still at 53
    assert act.estimate is None and act.pending is not None
    for tick in (6, 7):  # it acts within the tick ending at 60
        act.observe(tick * INTERVAL, {"a": 75.0, "b": 225.0}, INTERVAL)
    assert act.estimate is not None and act.estimate >= INTERVAL


def test_traffic_the_weights_do_not_route_dilutes_the_move_but_it_is_still_measured() -> None:
    """b also serves 450 requests a tick of its own beside 300 routed: the change moves b's
    share of requests from 80% to 90%, not by the weights' 25 points. Half of those would
    never show, and the change would wait out its whole limit every time."""
    for delay in (5.0, 10.0, 30.0, 45.0):
        for seed in range(3):
            act, _ = drive(delay, seed, local=450.0)
            assert act.estimate is not None and abs(act.estimate - delay) <= INTERVAL / 2


def test_a_share_falling_back_after_a_lucky_run_is_not_the_change_acting() -> None:
    """The law sheds b because it has been receiving more than its half (56, 57, 55 of 300
    requests in a hundred, by chance); the next ticks fall back to 50 while the change is
    still on its way. Counted against the share before alone that passes for the change
    acting at once; the share before is as noisy as the ticks after, and both count."""
    act = Actuation()
    for tick, b in zip((7, 8, 9), (56.0, 57.0, 55.0), strict=True):
        act.observe(tick * INTERVAL, {"a": 3 * (100 - b), "b": 3 * b}, INTERVAL)
    act.changed(90.0, {"a": 50.0, "b": 50.0}, {"a": 60.0, "b": 40.0}, INTERVAL)
    for tick in (10, 11, 12):  # the gateway has not moved yet: the even split
        act.observe(tick * INTERVAL, {"a": 150.0, "b": 150.0}, INTERVAL)
    assert act.estimate is None and act.settling(120.0, SETTLE, INTERVAL)
    for tick in (13, 14):  # it acts within the tick ending at 130: b gets 40% of them
        act.observe(tick * INTERVAL, {"a": 180.0, "b": 120.0}, INTERVAL)
    assert act.estimate is not None and abs(act.estimate - 30.0) <= INTERVAL


def measured(delay: float) -> Actuation:
    """An actuation whose one change, at 30 s, was seen acting ``delay`` later."""
    act, _ = at_even_split(6)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}, INTERVAL)
    for tick in range(4, 12):
        now = tick * INTERVAL
        part = min(1.0, max(0.0, (now - 30.0 - delay) / INTERVAL))
        act.observe(now, {"a": 150.0 - 75.0 * part, "b": 150.0 + 75.0 * part}, INTERVAL)
    assert act.estimate is not None and abs(act.estimate - delay) <= INTERVAL / 2
    return act


def test_a_change_seen_acting_in_less_than_half_the_measured_delay_is_not_believed() -> None:
    act = measured(30.0)
    act.changed(120.0, {"a": 25.0, "b": 75.0}, {"a": 50.0, "b": 50.0}, INTERVAL)
    for tick in (13, 14):  # at once: noise, or a gateway that got faster
        act.observe(tick * INTERVAL, {"a": 150.0, "b": 150.0}, INTERVAL)
    assert len(act.delays) == 2  # noted ...
    assert act.settling(140.0 + SETTLE, SETTLE, INTERVAL)  # ... but the law waits on
    assert not act.settling(120.0 + 30.0 + SETTLE + INTERVAL / 2, SETTLE, INTERVAL)


def test_a_change_not_seen_acting_in_all_its_time_lengthens_a_short_estimate() -> None:
    """Misread at 5 s, the estimate let the next step go after 20 s; that step's change is
    still not seen when the one after replaces it, so the delay is longer than 5 s: the 20 s
    it was given counts as one."""
    act = measured(5.0)
    limit = act.wait_limit(0.0, INTERVAL)
    act.changed(120.0, {"a": 25.0, "b": 75.0}, {"a": 50.0, "b": 50.0}, INTERVAL)
    for tick in (13, 14, 15):  # not yet
        act.observe(tick * INTERVAL, {"a": 75.0, "b": 225.0}, INTERVAL)
    act.changed(150.0, {"a": 50.0, "b": 50.0}, {"a": 60.0, "b": 40.0}, INTERVAL)
    assert act.longest == limit and act.wait_limit(0.0, INTERVAL) > limit


def test_the_next_change_starts_from_what_the_last_one_left_not_from_its_move() -> None:
    act, _ = at_even_split(7)
    act.changed(100.0, {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}, INTERVAL)
    # it acts at 105: the tick ending at 110 is half under each split
    for tick, b in ((11, 62.5), (12, 75.0), (13, 75.0)):
        act.observe(tick * INTERVAL, {"a": 3 * (100 - b), "b": 3 * b}, INTERVAL)
    assert act.estimate is not None
    act.changed(130.0, {"a": 25.0, "b": 75.0}, {"a": 10.0, "b": 90.0}, INTERVAL)
    assert act.pending is not None and act.pending.before == 75.0


def test_a_change_given_up_is_not_confirmed_by_a_move_long_after() -> None:
    """#40: a change the router ignored while the law held; half an hour later local traffic
    moved the share, taken for the change acting: a 1,796 s delay kept, and the next small
    change held the law 1,820 s while a cluster might be hot."""
    act, rng = at_even_split(11)
    act.changed(30.0, {"a": 50.0, "b": 50.0}, {"a": 25.0, "b": 75.0}, INTERVAL)
    now = 30.0
    for _ in range(180):  # thirty minutes, the router still splitting evenly
        now += INTERVAL
        act.observe(now, arrivals({"a": 50.0, "b": 50.0}, 300, rng), INTERVAL)
    for _ in range(3):  # local traffic lands on b: the share moves as the change wanted
        now += INTERVAL
        act.observe(now, arrivals({"a": 25.0, "b": 75.0}, 300, rng), INTERVAL)
    assert act.longest <= 12 * INTERVAL, list(act.delays)
    small = now + INTERVAL  # a change too small to follow
    act.changed(small, {"a": 25.0, "b": 75.0}, {"a": 22.0, "b": 78.0}, INTERVAL)
    waits = [
        t for t in range(int(small), int(small) + 2000, 10) if act.settling(t, SETTLE, INTERVAL)
    ]
    assert max(waits) - small <= 150, max(waits) - small


def test_the_first_count_after_a_failed_fetch_is_not_one_intervals_traffic() -> None:
    """A counter's increase read after a failed fetch spans both intervals: taken as one, it
    doubled a flaky cluster's arrivals and read as traffic the weights do not move."""
    arrivals = Arrivals()

    def fetch(at: float, arrived: float | None, failed: bool = False) -> float | None:
        errors = (PodError("http://b/metrics", Reason.TIMEOUT, "timed out"),) if failed else ()
        arrivals.count(
            "b", ClusterMetrics("b", at, 0.1, 1, 0 if failed else 1, arrived=arrived, errors=errors)
        )
        return arrivals.latest["b"]

    assert fetch(0.0, None) is None  # the first read has nothing to count from
    assert fetch(10.0, 20.0) == 20.0  # a clean first read does not hold the next count back
    assert fetch(20.0, None, failed=True) is None
    assert fetch(30.0, 40.0) is None  # 20 s of requests: not this interval's
    assert fetch(40.0, 20.0) == 20.0


def test_a_write_recorded_on_the_object_settles_a_process_that_did_not_see_it_land() -> None:
    """``reconcile.memory.follow_record``: the object's record of our last write (another
    replica's, or this process's own that timed out) is followed as one of its own from its
    time: waited on until the step could have acted (``wait_limit`` before any delay was
    measured), not ``settle`` alone (a review: 20-60 s early at the defaults). The change this
    process made itself is not counted twice, and a record stamped by a clock far ahead of
    ours (another replica's, a test's virtual one) is not waited on."""
    from dataclasses import replace

    from controller.model import Target
    from controller.reconcile.memory import TargetMemory, follow_record, settling

    target = Target("ExternalModel", "llm", "m", "uid", "1", ())
    now, settle, interval = 10_000.0, 20.0, 10.0

    def newcomer(record: Target, at: float) -> bool:
        memory = TargetMemory()
        follow_record(memory, record, at, interval)
        return settling(memory, at, settle, interval)

    assert not newcomer(target, now)  # no record, nothing known
    recorded = replace(target, applied_at=now - 30)
    assert newcomer(recorded, now)  # past settle, not past the wait for a step to act
    limit = UNKNOWN * interval
    assert newcomer(recorded, now - 30 + limit - interval)
    assert not newcomer(recorded, now - 30 + limit + 1)  # then the law goes on
    assert newcomer(replace(target, applied_at=now + 5), now)  # a little ahead: from now
    assert not newcomer(replace(target, applied_at=now + 3600), now)
    ours = TargetMemory()
    ours.actuation.changed(now - 30.4, {}, {}, interval)  # the change this process made
    own_record = replace(target, applied_at=now - 31)  # its stamp, whole seconds
    follow_record(ours, own_record, now, interval)
    assert ours.actuation.last_change == now - 30.4  # by its memory, not twice
