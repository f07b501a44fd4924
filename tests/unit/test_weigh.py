"""``weights.weigh`` at the edges of a target: refs that share a cluster, more clusters than
points, the schema's minimum."""

from __future__ import annotations

from controller.model import IMPLICIT_TARGET, Mode, Ref, Target
from controller.settings import WeightSettings
from controller.weights import weigh
from tests.support.signals import read

P = WeightSettings()


def target(refs: list[tuple[str, str, int]], minimum: int = 0, total: int | None = 100) -> Target:
    return Target(
        "ExternalModel",
        "llm",
        "m",
        "uid",
        "1",
        tuple(
            Ref(f"/spec/externalProviderRefs/{i}", "/ref/name", n, w, c)
            for i, (n, c, w) in enumerate(refs)
        ),
        minimum=minimum,
        total=total,
    )


def test_two_refs_on_one_cluster_share_its_share() -> None:
    # a and a-again both name cluster east; beside an equal west, east still gets half (from
    # nothing decided yet: an object all at 0 is someone's drain, held)
    from dataclasses import replace

    t = target([("a", "east", 0), ("a-again", "east", 0), ("b", "west", 0)])
    t = replace(t, kind=IMPLICIT_TARGET, name=IMPLICIT_TARGET)
    desired, decision = weigh(t, {"east": read(0.3), "west": read(0.3)}, P)
    assert decision.mode is Mode.INITIAL
    assert desired["a"] + desired["a-again"] == desired["b"] == 50
    assert decision.factors["a"] == decision.factors["a-again"]  # the cluster's, on each


def test_more_clusters_than_points_is_never_all_zero() -> None:
    names = [f"c{i:03d}" for i in range(101)]
    t = Target(
        IMPLICIT_TARGET,
        "",
        IMPLICIT_TARGET,
        "",
        "",
        tuple(Ref(n, n, n, 0, n) for n in names),
        total=100,
    )
    desired, decision = weigh(t, {n: read(0.3) for n in names}, P)
    assert sum(desired.values()) == 100 and max(desired.values()) == 1
    assert any("some get 0" in note for note in decision.notes)


def test_refs_the_schema_minimum_cannot_fit_are_held_and_said_so() -> None:
    refs = [(f"r{i}", f"c{i}", 1) for i in range(101)]
    desired, decision = weigh(target(refs, minimum=1), {f"c{i}": read(0.3) for i in range(101)}, P)
    assert decision.mode is Mode.NO_DATA and desired == {r: 1 for r, _, _ in refs}
    assert "minimum of 1" in decision.notes[0]


def test_a_route_s_weights_stay_within_what_one_backend_may_weigh() -> None:
    """Gateway API's BackendRef.weight is at most 1,000,000: a rule whose refs add up past it
    shares 1,000,000 (else shedding one asks the other for more than the schema takes), and a
    pin above it holds rather than ask for a write the API server refuses."""
    from dataclasses import replace

    from controller.weights import MAX_ROUTE_WEIGHT, drained

    rule = target([("east", "east", 600_000), ("west", "west", 600_000)], total=None)
    desired, decision = weigh(rule, {"east": read(0.3), "west": None}, P)
    assert desired == {"east": MAX_ROUTE_WEIGHT, "west": 0}
    assert drained(rule, {"east": read(0.3), "west": None}) == desired  # the law's fallback
    # an unmapped backend keeps its share on an ordinary step, and where the rule is scaled
    # down to fit (a review: capping what the mapped refs share moved traffic onto it)
    shared = target(
        [*((f"c{i}", f"c{i}", 500_000) for i in range(4)), ("fallback", "", 1_000_000)],
        total=None,
    )
    shared = replace(shared, refs=(*shared.refs[:4], replace(shared.refs[4], cluster=None)))
    hot = {f"c{i}": read(0.3) for i in range(1, 4)} | {"c0": read(0.97)}
    desired, decision = weigh(shared, hot, P)
    assert decision.changed and desired["fallback"] == 1_000_000
    assert sum(desired.values()) == 3_000_000  # its share, a third, kept
    wide = replace(shared, refs=tuple(replace(r, weight=900_000) for r in shared.refs))
    desired, _ = weigh(wide, {f"c{i}": read(0.3) for i in range(4)} | {"c0": None}, P)
    assert max(desired.values()) <= MAX_ROUTE_WEIGHT and desired["c0"] == 0
    assert abs(desired["fallback"] / sum(desired.values()) - 0.2) < 1e-5
    pinned = replace(rule, pinned={"east": 2_000_000, "west": 0})
    held, decision = weigh(pinned, {"east": read(0.3), "west": read(0.3)}, P)
    assert held == {"east": 600_000, "west": 600_000} and decision.mode is Mode.PAUSED
    assert "maximum of 1,000,000" in decision.notes[0]


def test_an_object_turned_off_by_hand_is_held_not_turned_back_on() -> None:
    """Every mapped ref at 0 (MaaS: each provider disabled) read as "nothing in force", and
    capacity shares were written within a tick, unlogged (found by an attack). Held, said
    so; zeros our own record says we wrote (unmapped refs carrying the traffic) are weighed."""
    from dataclasses import replace

    drained = target([("east", "east", 0), ("west", "west", 0)])
    held, decision = weigh(drained, {"east": read(0.3), "west": read(0.3)}, P)
    assert held == {"east": 0, "west": 0} and decision.mode is Mode.PAUSED
    assert "turned off by hand" in decision.notes[0]
    saas = target([("east", "east", 0), ("west", "west", 0), ("saas", "", 40)])
    saas = replace(saas, refs=(*saas.refs[:2], replace(saas.refs[2], cluster=None)))
    ours = replace(saas, last_applied={"east": 0, "west": 0, "saas": 40})
    desired, decision = weigh(ours, {"east": read(0.3), "west": read(0.3)}, P)
    assert decision.mode is not Mode.PAUSED and desired["east"] + desired["west"] == 60
