"""Replay's closed loop: the recorded load moved with the replayed weights (pure parts)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controller.cli import _read_whole
from controller.errors import ConfigError, FetchError, FetchParseError, FetchTimeoutError
from controller.model import IMPLICIT_TARGET, ClusterMetrics, Reason
from controller.replay import History, Response, moved, recorded_split, run, table
from controller.settings import Settings, build_settings
from controller.sources.answers import Answers, Asked, Series, cluster_metrics
from controller.state import TickReport

ASKED = Asked("http://hub", "cluster", "east", {"kv_mean": "q"}, 60.0, 5.0)


def hub(names: list[str], value: str | None = None) -> tuple[Settings, dict[str, Asked]]:
    """A config reading ``names`` through one querier, each by its name as the value of its
    cluster label (or all by ``value``), and whom each cluster's answers came from."""
    settings = build_settings(
        {
            "interval": "10s",
            "queriers": [{"name": "hub", "url": "http://127.0.0.1:9", "push_interval": "10s"}],
            "clusters": [
                {"name": c, "prometheus": {"querier": "hub", "cluster": value or c}} for c in names
            ],
        }
    )
    asked = {
        c: Asked("http://hub", "cluster", value or c, {"kv_mean": "q"}, 60.0, 5.0) for c in names
    }
    return settings, asked


def steady(names: list[str], answers: Answers, ticks: int) -> tuple[Settings, History, list[float]]:
    """A config over ``names`` and a history of ``ticks`` steps 10 s apart from 1000, each
    answering ``answers``."""
    settings, asked = hub(names)
    times = [1000.0 + 10 * i for i in range(ticks)]
    series = dict.fromkeys(times, answers)
    return settings, History(times[0], times[-1], times, dict.fromkeys(names, series), asked), times


def recorded(kv: float | None = 0.6) -> Answers:
    """One querier's answers at one time: east's as the tests move them, west's beside."""
    east = {} if kv is None else {"east": kv}
    return {
        "kv_mean": {**east, "west": 0.3},
        "kv_max": {**({} if kv is None else {"east": kv + 0.1}), "west": 0.35},
        "queue": {"east": 12.0, "west": 1.0},
        "running": {"east": 16.0, "west": 4.0},
        "latency_requests": {"east": 38.0, "west": 9.0},
        "pods": {"east": 2.0, "west": 2.0},
    }


def east(answers: Answers) -> ClusterMetrics:
    """East as the loop reads it: the answers through the live source's conversion."""
    return cluster_metrics("east", answers, ASKED, 160.0, 0.0, 100.0)


def test_a_share_cut_to_a_seventh_moves_the_routed_load_with_it() -> None:
    factors = Response.factors({"east": 7, "west": 93}, Response.of({"east": 1, "west": 1}).given)
    assert factors == pytest.approx({"east": 0.14, "west": 1.86})
    found = east(moved(recorded(), {"east": factors["east"]}))
    assert (found.kv_mean, found.kv_max) == pytest.approx((0.084, 0.098))
    assert (found.queue_depth, found.queue_per_pod, found.running) == pytest.approx(
        (1.68, 0.84, 2.24)
    )
    # 38 requests over the 60 s window, 60 s since the last answers: 38 completed, moved
    assert found.completed == pytest.approx(5.32)
    assert found.pods_answering == 2 and found.scraped_at == 160.0  # the rest as recorded
    # a cluster given no factor, and the answers given, are read as recorded
    west_asked = Asked("http://hub", "cluster", "west", {"kv_mean": "q"}, 60.0, 5.0)
    west = cluster_metrics("west", moved(recorded(), {"east": 0.14}), west_asked, 160.0, 0, 100)
    assert (west.kv_mean, west.queue_depth, west.running) == (0.3, 1.0, 4.0)
    given = recorded()  # moved leaves what it was given as it was
    moved(given, {"east": 0.14, "west": 2.0})
    assert given == recorded()


def test_counts_and_latencies_no_cluster_can_have_are_refused_by_name() -> None:
    """An attack: a querier's queue of 1e300 moved traffic as if it were one, and a p90 of
    -5 s was exported as the cluster's latency, healthy."""
    answers = recorded()
    answers["queue"] = {"east": 1e300}
    answers["p50"], answers["p90"] = {"east": float("nan")}, {"east": -5.0}
    answers["running"] = {"east": 1e300}
    found = east(answers)
    assert found.queue_depth is None and found.latency is not None
    assert (found.latency.p50, found.latency.p90) == (None, None)  # NaN: none; below 0: refused
    refused = {e.url.rpartition(" ")[2]: e for e in found.errors}
    assert set(refused) == {"(queue)", "(running)", "(p90)"}
    answers["p90"] = {"east": 1e300}
    assert any("a latency past a day" in e.detail for e in east(answers).errors)
    assert all(e.reason is Reason.OUT_OF_RANGE for e in refused.values())
    assert "more requests than a cluster holds" in refused["(queue)"].detail
    assert found.kv_mean == 0.6  # the rest is read


def test_more_traffic_than_the_cache_holds_waits_in_the_queue() -> None:
    doubled = east(moved(recorded(0.6), {"east": 2.0}))  # the cache holds 1/0.6 of running
    assert doubled.kv_mean == 1.0 and doubled.kv_max == 1.0
    assert doubled.running == pytest.approx(16 / 0.6)
    queue = 12 * 2 + 16 * (2 - 1 / 0.6)  # today's queue doubled, and what the cache cannot hold
    assert doubled.queue_depth == pytest.approx(queue)
    assert doubled.queue_per_pod == pytest.approx(queue / 2)
    assert doubled.completed == pytest.approx(38 / 0.6)
    tenfold = east(moved(recorded(0.6), {"east": 10.0}))
    assert tenfold.running == pytest.approx(16 / 0.6)  # no more runs than the cache holds
    assert tenfold.queue_depth == pytest.approx(12 * 10 + 16 * (10 - 1 / 0.6))


def test_an_unknown_or_failed_answer_stays_so() -> None:
    assert east(moved(recorded(None), {"east": 0.5})).kv_mean is None
    failed = {**recorded(), "queue": FetchTimeoutError("http://hub (queue)", "slow")}
    after = moved(failed, {"east": 0.5})
    assert after["queue"] is failed["queue"]
    assert east(after).queue_depth is None and east(after).running == 8.0
    same = recorded()
    assert moved(same, {"east": 1.0, "west": 1.0}) is same


def test_a_cluster_without_recorded_traffic_is_read_as_recorded() -> None:
    then = Response.of({"east": 0, "west": 1}).given
    assert Response.factors({"east": 30, "west": 70}, then) == pytest.approx(
        {"east": 1.0, "west": 0.7}
    )
    # no weights in force at all: nothing is moved
    even = Response.of({"east": 1, "west": 1}).given
    assert Response.factors({}, even) == {}


def test_the_recorded_split_is_even_unless_given_and_every_cluster_named() -> None:
    assert recorded_split(None, ["a", "b"]).given == {"a": 0.5, "b": 0.5}
    assert recorded_split("a=3, b=1", ["a", "b"]).given == {"a": 0.75, "b": 0.25}
    assert recorded_split("a=0,b=1", ["a", "b"]).given == {"a": 0.0, "b": 1.0}
    for bad in (
        "a=3",
        "a=3,b=-1",
        "a=3,b=inf",
        "a=3,c=1",
        "a,b=1",
        "a=0,b=0",
        "a=1,a=3,b=1",
        "a=1e-320,b=1",
        "a=1e308,b=1e308",
    ):
        with pytest.raises(ConfigError) as raised:
            recorded_split(bad, ["a", "b"])
        assert len(raised.value.lines) == 1 and raised.value.lines[0].startswith("--recorded")


async def test_each_decision_moves_the_load_read_on_the_next_tick() -> None:
    """Tick k's weights in force scale the readings of tick k+1, not k, nor k+2."""
    names = ["east", "west"]
    settings, asked = hub(names)
    times = [1000.0 + 10 * i for i in range(40)]

    def answers(at: float) -> Answers:
        hot = 1100 <= at < 1250
        return {
            "kv_mean": {"east": 0.95 if hot else 0.5, "west": 0.4},
            "kv_max": {"east": 0.99 if hot else 0.55, "west": 0.45},
            "queue": {"east": 40.0 if hot else 0.0, "west": 0.0},
            "running": {"east": 30.0, "west": 20.0},
            "pods": {"east": 4.0, "west": 4.0},
        }

    history = History(
        times[0], times[-1], times, {c: {t: answers(t) for t in times} for c in names}, asked
    )
    seen: list[tuple[dict[str, int], float]] = []  # applied after the tick, east's KV read

    def keep(at: float, report: TickReport) -> None:
        target = report.targets[IMPLICIT_TARGET]
        east = report.clusters["east"].metrics
        assert east is not None and east.kv_mean is not None
        seen.append((dict(target.outcome.applied), east.kv_mean))

    response = recorded_split(None, names)
    await run(settings, history, keep, response)
    moved = 0
    for tick in range(1, len(times)):
        recorded = answers(times[tick])["kv_mean"]["east"]  # type: ignore[index]
        factor = response.factors(seen[tick - 1][0], response.given)["east"]
        assert seen[tick][1] == pytest.approx(min(1.0, recorded * factor)), tick
        moved += factor != 1.0
    assert moved >= 10  # the story moved east's load for a while: the check means something


async def test_a_cluster_the_querier_never_answered_for_is_named() -> None:
    """Found by an attack: a cluster whose label value the querier holds no series for (a
    typo) was replayed as unknown at every tick and counted among the others' missing
    readings, named nowhere."""
    names = ["east", "west"]
    settings, asked = hub(names)
    times = [1000.0 + 10 * i for i in range(12)]
    answers: Answers = {"kv_mean": {"east": 0.4}, "running": {"east": 8.0}}
    history = History(
        times[0], times[-1], times, {n: dict.fromkeys(times, answers) for n in names}, asked
    )
    summary = await run(settings, history, None, recorded_split(None, names))
    assert summary.unknown == {"west": 12}
    assert summary.row(names)["unknown_ticks_by_cluster"] == {"west": 12}
    assert "  never read: west: no KV reading at any tick" in table(summary, names)
    # a target of west alone (another target read its clusters): named too (a review)
    assert "  never read: west: no KV reading at any tick" in table(summary, ["west"])


def test_a_kv_reading_no_cache_can_have_is_not_made_usable() -> None:
    for bad in (1.5, 60.0, -0.2):
        answers = {**recorded(), "kv_mean": {"east": bad, "west": 0.3}}
        for factor in (0.0, 0.5, 2.0):
            assert east(moved(answers, {"east": factor})).kv_mean is None, (bad, factor)


async def test_a_range_refused_in_part_is_named_in_the_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A querier that refused some chunks (too many points, a timeout) leaves those ticks'
    answers failed: the loop runs on, and the summary names the query, how many ticks, the
    first and why, never a value made up for them."""
    names = ["east", "west"]
    settings, asked = hub(names)
    times = [1000.0 + 10 * i for i in range(30)]
    refused = FetchTimeoutError("http://hub/api/v1/query_range", "no complete answer within 5s")

    def answers(at: float) -> Answers:
        if 1100 <= at < 1150:  # one chunk of five ticks
            return {"kv_mean": refused, "running": {"east": 8.0, "west": 8.0}}
        return {"kv_mean": {"east": 0.4, "west": 0.4}, "running": {"east": 8.0, "west": 8.0}}

    # each cluster through a querier of its own: a tick both failed at counts once
    history = History(
        times[0], times[-1], times, {n: {t: answers(t) for t in times} for n in names}, asked
    )
    summary = await run(settings, history, None, recorded_split(None, names))
    assert summary.failed == {"kv_mean": (5, 1100.0, "no complete answer within 5s")}
    assert summary.unknown == {"east": 5, "west": 5} and summary.ticks == 30
    shown = table(summary, names)
    assert "cluster-ticks without a KV reading: 10, east 5, west 5" in shown
    assert "never read" not in shown
    assert "kv_mean could not be read at 5 ticks, the first at 1970-01-01T00:18:20Z" in shown
    assert summary.row(names)["failed_queries"]["kv_mean"]["ticks"] == 5
    # and the exit says so (found by an attack: 91% unread printed 0.0 writes/h, exit 0)
    assert _read_whole([SimpleNamespace(target=None, summary=summary)]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("replay")]
    assert said == [
        "replay: the config's clusters: the querier failed to answer kv_mean at 5 of 30 ticks"
        " (17%), the first at 1970-01-01T00:18:20Z: no complete answer within 5s; the figures"
        " count those ticks as unread"
    ]


def test_a_range_answer_reads_each_time_as_its_instant_answer_would() -> None:
    """``range_answers`` reads most queries straight into numbers; it must give what
    ``split`` gives each time's series: the first finite value per label value, NaN and
    infinities left out (kept for the pod count, which is refused by name), a series without
    the label under "", a time with nothing an empty answer, the pool queries by labels."""
    import json
    import math

    from controller.sources.answers import split
    from controller.sources.prometheus import matrix_series, range_answers

    def series(metric: dict[str, str], *values: tuple[float, str]) -> dict[str, object]:
        return {"metric": metric, "values": [list(v) for v in values]}

    pool = {"num_gpu_blocks": "4", "block_size": "16"}

    result = [
        series({"cluster": "east"}, (10.0, "0.5"), (20.0, "NaN"), (30.0, "+Inf")),
        series({"cluster": "east", "pod": "b"}, (10.0, "0.7"), (20.0, "0.6"), (30.0, "0.4")),
        series({"cluster": "west"}, (10.0, "1e-3"), (30.0, "-Inf")),
        series({}, (20.0, "3")),
        series({"cluster": "north", "num_gpu_blocks": "8", "block_size": "16"}, (10.0, "2")),
        # a pool that scales and comes back to what it was, a NaN in it: pooled once per
        # set of series and values, each time its own answer
        series({"cluster": "south", "pod": "a", **pool}, (20.0, "2"), (40.0, "1"), (50.0, "1")),
        series({"cluster": "south", "pod": "b", **pool}, (20.0, "NaN"), (30.0, "1")),
    ]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
    times = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    for name in ("kv_mean", "pods", "kv_pools", "kv_tokens", "queue"):
        fast = range_answers(name, body, times, "cluster", "u")
        slow = {t: split(name, matrix_series(body, "u").get(t, []), "cluster") for t in times}
        assert repr(fast) == repr(slow), name  # NaN == NaN only as text
    pools = range_answers("kv_pools", body, times, "cluster", "u")
    assert pools[40.0]["kv_pools"] == pools[50.0]["kv_pools"] == {"south": 64.0}
    assert pools[40.0]["kv_pools"] is not pools[50.0]["kv_pools"]
    assert "south" not in pools[20.0]["kv_pools"]  # type: ignore[operator]  # NaN: unknown
    kv = range_answers("kv_mean", body, times, "cluster", "u")
    assert kv[20.0] == {"kv_mean": {"east": 0.6, "": 3.0, "south": 2.0}}
    assert kv[40.0] == {"kv_mean": {"south": 1.0}} and kv[60.0] == {"kv_mean": {}}
    pods = range_answers("pods", body, times, "cluster", "u")[30.0]["pods"]
    assert isinstance(pods, dict) and math.isinf(pods["east"])
    # what split refuses, range_answers refuses: a time that is not one (even beside a value
    # it would leave out), a series whose metric is not an object
    for bad in (
        [series({"cluster": "east"}, ("abc", "NaN"))],  # type: ignore[arg-type]
        [{"metric": [1], "values": [[10.0, "1"]]}],
        # values the live query refuses (found by an attack: replay read true as KV 1.0, a
        # JSON number as itself, and "0_1" as 1.0, where Go's ParseFloat reads no number)
        [{"metric": {}, "values": [[10.0, True]]}],
        [{"metric": {}, "values": [[10.0, 0.01]]}],
        [{"metric": {}, "values": [[10.0, "0_1"]]}],
    ):
        page = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": bad}})
        for name in ("kv_mean", "kv_tokens", "kv_pools"):
            with pytest.raises(FetchParseError):
                range_answers(name, page, times, "", "u")
        with pytest.raises(FetchParseError):
            matrix_series(page, "u")


def test_a_pool_past_a_float_s_range_is_no_pool_and_no_crash() -> None:
    from controller.sources.answers import pools

    huge = {"cluster": "a", "pod": "p", "num_gpu_blocks": str(10**200), "block_size": str(10**200)}
    tokens, pods = pools([(huge, 1.0)], "cluster")
    assert tokens == {"a": math.inf} and pods == {"a": 1.0}  # refused later as no cache holds
    beyond = {**huge, "num_gpu_blocks": str(10**400)}
    assert pools([(beyond, 1.0)], "cluster") == ({}, {})  # left out: unknown


def test_the_record_is_one_share_a_ref_and_refs_of_a_cluster_add_up() -> None:
    """``recorded._by_target``: replicas saying one ref's share count once (the largest), a
    cluster's refs add up, clusters the config does not name are read past, a share no ref
    can hold (NaN, past 100) leaves that target's step out, and a step where the config's
    clusters hold nothing is absent."""
    from controller.recorded import _by_target

    def share(target: str, ref: str, cluster: str, value: float) -> tuple[dict[str, str], float]:
        return {"target": target, "ref": ref, "cluster": cluster}, value

    read: dict[float, Series | FetchError] = {
        10.0: [
            share("t", "0", "east", 30.0),
            share("t", "0", "east", 30.0),  # a second replica
            share("t", "1", "east", 10.0),  # a second ref to east
            share("t", "2", "west", 60.0),
            share("t", "3", "north", 99.0),  # not the config's
            share("u", "0", "east", math.nan),
            share("u", "1", "west", 150.0),
        ],
        20.0: [share("t", "0", "east", 0.0), share("t", "2", "west", 0.0)],
        30.0: FetchTimeoutError("u", "slow"),
        # west's share unreadable: the step is left out, not read as all of it on east
        40.0: [share("t", "0", "east", 30.0), share("t", "2", "west", math.nan)],
        # west had no ref then: east's share is the target's whole traffic
        50.0: [share("t", "0", "east", 30.0)],
    }
    found = _by_target(read, {"east", "west"})
    assert found == {"t": {10.0: {"east": 0.4, "west": 0.6}, 50.0: {"east": 1.0}}}


async def test_the_trace_holds_replayed_and_recorded_shares_with_gaps_as_nan() -> None:
    import math

    from controller.recorded import Record
    from controller.replay import Trace
    from controller.testing import Driver

    names = ["east", "west"]
    settings, _ = hub(names, None)
    driver = Driver(settings, journal=False)
    read = {n: cluster_metrics(n, recorded(), ASKED, 10.0, 0.0, None) for n in names}
    report = await driver.tick(10.0, read)
    record = Record("t", "q", {10.0: {"east": 0.25}}, 2)  # west held nothing in it
    trace = Trace()
    trace.add(10.0, report, record)
    trace.add(20.0, report, record)  # a step the record does not have
    applied = report.targets[IMPLICIT_TARGET].outcome.applied
    assert trace.shares["east"][0] == pytest.approx(100 * applied["east"] / sum(applied.values()))
    assert trace.recorded["east"][0] == 25.0 and trace.recorded["west"][0] == 0.0
    assert math.isnan(trace.recorded["east"][1]) and math.isnan(trace.recorded["west"][1])


def test_the_recorded_split_and_delay_hold_from_their_step_until_the_next() -> None:
    """``Response.split`` and ``lag`` at any time: the record's latest step up to it (the
    weights stayed on the objects), the given split and no delay before its first."""
    response = Response(
        {"east": 0.5, "west": 0.5},
        {100.0: {"east": 0.1, "west": 0.9}, 200.0: {"east": 0.3, "west": 0.7}},
        "record",
        {150.0: 40.0},
    )
    assert response.split(99.0) == {"east": 0.5, "west": 0.5}
    assert response.split(100.0) == response.split(199.9) == {"east": 0.1, "west": 0.9}
    assert response.split(1e9) == {"east": 0.3, "west": 0.7}
    assert response.lag(149.0) == 0.0 and response.lag(150.0) == response.lag(1e9) == 40.0
    assert "acting after the delay it measured" in response.describe()


async def test_load_follows_the_weights_in_force_as_long_ago_as_the_record_says() -> None:
    """With a delay in the record, each tick's load is moved by the replayed weights decided
    that long before (not the last tick's), also when the delay first appears mid-window and
    reaches back past ticks already moved by the previous tick's."""
    names = ["east", "west"]
    hot: Answers = {"kv_mean": {"east": 0.95, "west": 0.2}, "pods": {"east": 2.0, "west": 2.0}}
    settings, history, times = steady(names, hot, 40)
    response = Response({"east": 0.5, "west": 0.5}, {}, "record", {1200.0: 30.0})
    seen: dict[float, tuple[dict[str, int], float]] = {}

    def keep(at: float, report: TickReport) -> None:
        east = report.clusters["east"].metrics
        assert east is not None and east.kv_mean is not None
        seen[at] = (dict(report.targets[IMPLICIT_TARGET].outcome.applied), east.kv_mean)

    await run(settings, history, keep, response)
    checked = 0
    for at in times[1:]:
        acting = at - (30.0 if at >= 1200.0 else 10.0)
        if acting < times[0]:
            continue
        applied = seen[acting][0]
        factor = applied["east"] / sum(applied.values()) / 0.5
        assert seen[at][1] == pytest.approx(min(1.0, 0.95 * factor)), at
        checked += factor != 1.0
    assert checked >= 10


def test_the_range_check_refuses_exactly_what_the_named_problems_refuse() -> None:
    """``answers._checked`` asks the named problems only about numbers outside the plainly
    possible: it must refuse exactly where they find a problem, at the bounds too."""
    import itertools
    import math

    from controller.sources import (
        MAX_KV_TOKENS_PER_POD,
        MAX_PODS,
        kv_tokens_problem,
        pod_count_problem,
    )
    from controller.sources.answers import _checked

    odd = [math.nan, math.inf, -math.inf]
    for pods in [-1.0, 0.0, 1.0, float(MAX_PODS), MAX_PODS + 1.0, *odd]:
        _, refused = _checked({"kv_mean": 0.5, "pods": pods}, ASKED)
        assert bool(refused) == (pod_count_problem(pods, "pods") is not None), pods
    top = MAX_KV_TOKENS_PER_POD
    tokens = [-5.0, 0.0, 1.0, top, top + 1, 3 * top, 3 * top + 1, *odd]
    for value, pool_pods in itertools.product(tokens, [0.0, 1.0, 3.0, math.nan]):
        for query, counted in (("kv_pools", "kv_pool_pods"), ("kv_tokens", "kv_token_pods")):
            _, refused = _checked({"kv_mean": 0.5, query: value, counted: pool_pods}, ASKED)
            problem = kv_tokens_problem(value, pool_pods or 0.0, query)
            assert bool(refused) == (problem is not None), (query, value, pool_pods)


def test_a_share_too_small_to_scale_from_is_read_as_recorded() -> None:
    """The record may hold a cluster at a point or two of a large weight: --recorded refuses
    such a split, and the record's is read as if that cluster held none."""
    then = {"east": 0.0005, "west": 0.9995}
    factors = Response.factors({"east": 50, "west": 50}, then)
    assert factors["east"] == 1.0 and factors["west"] == pytest.approx(0.5 / 0.9995)


def test_recorded_given_replaces_the_record_s_split_not_its_delay() -> None:
    from controller.recorded import Record

    record = Record("t", "q", {100.0: {"a": 0.9, "b": 0.1}}, 1, delays={100.0: 40.0})
    given = recorded_split("a=1,b=1", ["a", "b"], record)
    assert given.split(200.0) == {"a": 0.5, "b": 0.5} and given.lag(200.0) == 40.0
    assert "acting after the delay the controller measured" in given.describe()
    own = recorded_split(None, ["a", "b"], record)
    assert own.split(200.0) == {"a": 0.9, "b": 0.1} and own.lag(200.0) == 40.0


def test_gaps_name_each_series_missing_for_a_while_and_nothing_else() -> None:
    """A query that answered for a cluster at some steps and not at others is a gap, named
    with its steps and the first; one a cluster never answers (its engine does not publish
    it), a failed query (counted with the failures) and the pool bookkeeping are not."""
    from controller.errors import FetchTimeoutError
    from controller.replay import gap_lines, gaps, table

    names = ["east", "west"]
    _, asked = hub(names)
    times = [1000.0, 1010.0, 1020.0, 1030.0]

    def at(t: float) -> Answers:
        queue = {"east": 1.0} if t in (1000.0, 1030.0) else {}
        found: Answers = {"kv_mean": {"east": 0.5, "west": 0.4}, "queue": queue, "kv_tokens": {}}
        found["kv_pool_pods"] = {"west": 2.0} if t == 1000.0 else {}
        if t == 1020.0:
            found["kv_mean"] = FetchTimeoutError("u", "slow")
        return found

    series = {t: at(t) for t in times}
    history = History(times[0], times[-1], times, dict.fromkeys(names, series), asked)
    found = gaps(history)
    assert found == {"queue": {"east": (2, 1010.0)}}
    lines = gap_lines(found)
    assert lines == [
        "  queue answered nothing usable for east at 2 ticks, the first at 1970-01-01T00:16:50Z"
    ]
    from controller.replay import Summary

    shown = table(Summary(times[0], times[-1]), names, more=lines)
    assert shown.splitlines()[-2] == lines[0]  # before the loop's line


def test_the_record_s_target_is_weighed_as_it_was_held() -> None:
    """``recorded_target``: the kind, namespace, name and an HTTPRoute's rule from the key,
    each ref with its cluster and first share; none where the key is not a target's or no
    ref maps to a cluster of the config."""
    from controller.recorded import Record
    from controller.replay import recorded_target

    refs = {"p-east": ("east", 60.4), "p-west": ("west", 39.6), "p-far": (None, 0.0)}
    model = recorded_target(Record("ExternalModel/llm/llama", "q", {}, 1, refs=refs))
    assert model is not None and model.key == "ExternalModel/llm/llama" and model.total == 100
    assert model.clusters == {"p-east": "east", "p-far": None, "p-west": "west"}
    assert {r.name: r.weight for r in model.refs} == {"p-east": 60, "p-far": 0, "p-west": 40}
    route = recorded_target(Record("HTTPRoute/llm/chat/rule-1", "q", {}, 1, refs=refs))
    assert route is not None and route.rule == 1 and route.total is None
    assert route.key == "HTTPRoute/llm/chat/rule-1"
    for key in ("configured", "a/b", "ExternalModel//x", "HTTPRoute/a/b/rule-x"):
        assert recorded_target(Record(key, "q", {}, 1, refs=refs)) is None, key
    unmapped = {"p-far": (None, 100.0)}
    assert recorded_target(Record("ExternalModel/a/b", "q", {}, 1, refs=unmapped)) is None


async def test_a_recorded_target_s_refs_are_summed_by_cluster_for_the_summary() -> None:
    """Two refs to east and one to no cluster of the config: the summary, the trace and the
    closed loop read east's weight as both of its refs', the unmapped ref's left out."""
    from controller.recorded import Record
    from controller.replay import Trace, recorded_target

    names = ["east", "west"]
    hot: Answers = {"kv_mean": {"east": 0.95, "west": 0.2}, "pods": {"east": 2.0, "west": 2.0}}
    settings, history, times = steady(names, hot, 20)
    refs = {"e1": ("east", 30.0), "e2": ("east", 30.0), "w": ("west", 30.0), "x": (None, 10.0)}
    record = Record("ExternalModel/llm/llama", "q", {}, 1, refs=refs)
    target = recorded_target(record)
    assert target is not None
    trace = Trace()
    applied: dict[float, dict[str, int]] = {}

    def keep(at: float, report: TickReport) -> None:
        trace.add(at, report)
        assert report.only is not None
        applied[at] = dict(report.only.outcome.applied)

    summary = await run(settings, history, keep, Response.of({"east": 1, "west": 1}), target)
    assert summary.published and set(summary.published[0][1]) == {"east", "west"}
    assert all(w["x"] == 10 for w in applied.values())  # unmapped: it keeps its weight
    for at, by_cluster in summary.published:  # in whole percents of the mapped refs' sum
        held = applied[at]
        east, west = held["e1"] + held["e2"], held["w"]
        assert by_cluster == {
            "east": round(100 * east / (east + west)),
            "west": round(100 * west / (east + west)),
        }
    assert summary.held == {"east": 67, "west": 33}  # 60 of 90 mapped, before the first write
    last = applied[times[-1]]
    east = last["e1"] + last["e2"]
    assert trace.shares["east"][-1] == pytest.approx(100 * east / (east + last["w"]))
    assert east < 60  # shed from the hot cluster


async def test_a_recorded_target_s_churn_and_load_are_its_own() -> None:
    """Found by a review: a target held at 90/10 that moves to 98/2 took a step of 8, not 48
    from an even split; a target over east and west of a config of three leaves south's load
    as recorded (it was read as none: factor 0), whatever split the closed loop is given."""
    from controller.recorded import Record
    from controller.replay import recorded_target

    names = ["east", "west"]
    hot: Answers = {"kv_mean": {"east": 0.3, "west": 0.95}, "pods": {"east": 2.0, "west": 2.0}}
    settings, history, times = steady(names, hot, 60)
    refs = {"p-east": ("east", 90.0), "p-west": ("west", 10.0)}
    held = recorded_target(Record("ExternalModel/llm/llama", "q", {}, 1, refs=refs))
    summary = await run(settings, history, None, None, held)
    previous, steps = {"east": 90, "west": 10}, []
    for _, weights in summary.published:
        steps.append(max(abs(weights[n] - previous[n]) for n in names))
        previous = weights
    assert steps and summary.row(names)["largest_step"] == max(steps) < 25

    three = ["east", "west", "south"]
    settings, asked = hub(three)
    calm: Answers = {"kv_mean": {"east": 0.4, "west": 0.4, "south": 0.5}, "pods": {}}
    calm["pods"] = dict.fromkeys(three, 2.0)
    series = dict.fromkeys(times[:30], calm)
    history = History(times[0], times[29], times[:30], dict.fromkeys(three, series), asked)
    record = Record(
        "ExternalModel/llm/llama", "q", {}, 1, refs={"e": ("east", 50.0), "w": ("west", 50.0)}
    )
    target = recorded_target(record)
    read: dict[str, float | None] = {}

    def keep(at: float, report: TickReport) -> None:
        for name, view in report.clusters.items():
            read[name] = view.metrics.kv_mean if view.metrics else None

    for given in ("east=1,west=1,south=1", None):
        response = recorded_split(given, three, record)
        summary = await run(settings, history, keep, response, target)
        assert read == pytest.approx({"east": 0.4, "west": 0.4, "south": 0.5}), given
        assert summary.row(["east", "west"])["writes"] == 0, given


def test_a_record_s_target_is_the_split_of_one_step() -> None:
    """East alone at 100, then a ref to west added at 50/50: the target is what it held at
    its first step (east at 100), never refs of two times put together (east 100 and west
    50, 150 out of 100)."""
    from controller.recorded import _by_target, _refs

    def refs(read: dict[float, Series | FetchError]) -> object:
        first = {t: min(steps) for t, steps in _by_target(read, {"east", "west"}).items()}
        return _refs(read, {"east", "west"}, first)

    def share(ref: str, cluster: str, value: float) -> tuple[dict[str, str], float]:
        return {"target": "t", "ref": ref, "cluster": cluster}, value

    read: dict[float, Series | FetchError] = {
        10.0: [share("p-east", "east", 100.0)],
        20.0: [share("p-east", "east", 50.0), share("p-west", "west", 50.0)],
    }
    assert refs(read) == {"t": {"p-east": ("east", 100.0)}}
    broken: dict[float, Series | FetchError] = {
        5.0: [share("p-east", "east", math.nan), share("p-west", "west", 40.0)],
        **read,
    }
    assert refs(broken) == {"t": {"p-east": ("east", 100.0)}}


async def test_before_the_record_s_first_step_its_first_split_held() -> None:
    """Found by a review: a record from 1200 of a target held 90/10 read the even split
    before it, so east's load was moved 1.8× with nothing changed, and writes followed."""
    from controller.recorded import Record
    from controller.replay import recorded_target

    names = ["east", "west"]
    calm: Answers = {"kv_mean": {"east": 0.4, "west": 0.4}, "pods": {"east": 2.0, "west": 2.0}}
    settings, history, times = steady(names, calm, 30)
    shares = {t: {"east": 0.9, "west": 0.1} for t in times if t >= 1200.0}
    refs = {"p-east": ("east", 90.0), "p-west": ("west", 10.0)}
    record = Record("ExternalModel/llm/llama", "q", shares, len(times), refs=refs)
    read: list[float | None] = []

    def keep(at: float, report: TickReport) -> None:
        east = report.clusters["east"].metrics
        read.append(east.kv_mean if east else None)

    response = recorded_split(None, names, record)
    summary = await run(settings, history, keep, response, recorded_target(record))
    assert read == pytest.approx([0.4] * len(times)) and summary.published == []


def test_a_recorded_target_is_scaled_to_its_total_and_counted_from_what_it_held() -> None:
    """Replicas a scrape apart (90 and 20) make an ExternalModel of 82/18, out of 100; a
    cluster held at 0 before the first write is not shed by it; a write turning back from
    what was held is a reversal, as the record's own count has it."""
    from controller.recorded import Record
    from controller.replay import Summary, recorded_target

    refs = {"p-east": ("east", 90.0), "p-west": ("west", 20.0)}
    target = recorded_target(Record("ExternalModel/llm/llama", "q", {}, 1, refs=refs))
    assert target is not None
    assert {r.name: r.weight for r in target.refs} == {"p-east": 82, "p-west": 18}
    summary = Summary(0.0, 3600.0, {"east": 90, "west": 10})
    summary.published = [(10.0, {"east": 80, "west": 20}), (20.0, {"east": 85, "west": 15})]
    assert summary.row(["east", "west"])["reversals_per_hour"] == 2.0
    assert (
        Summary(0.0, 3600.0, None, published=summary.published).row(["east", "west"])[
            "reversals_per_hour"
        ]
        == 0.0
    )  # without a known start, as before


async def test_a_cluster_held_at_nothing_before_is_not_shed_by_a_write() -> None:
    from controller.recorded import Record
    from controller.replay import recorded_target

    names = ["east", "west", "south"]
    answers: Answers = {"kv_mean": {"west": 0.95, "south": 0.2}, "pods": dict.fromkeys(names, 2.0)}
    settings, history, _ = steady(names, answers, 30)
    refs = {"e": ("east", 0.0), "w": ("west", 50.0), "s": ("south", 50.0)}
    target = recorded_target(Record("ExternalModel/llm/llama", "q", {}, 1, refs=refs))
    summary = await run(settings, history, None, None, target)
    assert summary.published and all(w["east"] == 0 for _, w in summary.published)
    assert summary.shed == []


def test_an_unmapped_ref_is_not_read_as_the_cluster_its_scrape_names() -> None:
    """An unmapped ref is exported with ``cluster=""``, which Prometheus drops; a scrape that
    labels its targets ``cluster="east"`` then fills it in, while it renames the mapped refs'
    label ``exported_cluster``. That replica's series without ``exported_cluster`` are read as
    unmapped; another replica, scraped without the label, is read as it says."""
    from controller.recorded import _by_target, _refs

    def share(instance: str, ref: str, value: float, **labels: str) -> tuple[dict[str, str], float]:
        return {"target": "t", "ref": ref, "instance": instance, **labels}, value

    read: dict[float, Series | FetchError] = {
        10.0: [
            share("wc-1", "p-east", 45.0, cluster="east", exported_cluster="east"),
            share("wc-1", "p-west", 45.0, cluster="east", exported_cluster="west"),
            share("wc-1", "p-far", 10.0, cluster="east"),  # unmapped: the scrape's label
            share("wc-0", "p-east", 45.0, cluster="east"),  # scraped without the label
        ]
    }
    names = {"east", "west"}
    assert _by_target(read, names) == {"t": {10.0: {"east": 0.5, "west": 0.5}}}
    assert _refs(read, names, {"t": 10.0}) == {
        "t": {"p-east": ("east", 45.0), "p-west": ("west", 45.0), "p-far": (None, 10.0)}
    }


async def test_each_target_held_is_replayed_on_its_own_and_what_is_not_held_is_said(
    tmp_path: Path,
) -> None:
    """Two targets over east and west, held 90/10 and 20/80: each is replayed as it was held,
    with its own record's split moving the load, the same whether replayed alone or after
    the other; a target named and not held is said beside them, and with nothing held the
    implicit target is replayed, saying why."""
    from controller.recorded import Found, Record
    from controller.replay import held_apart, replay_target

    names = ["east", "west"]
    hot: Answers = {"kv_mean": {"east": 0.95, "west": 0.2}, "pods": {"east": 2.0, "west": 2.0}}
    settings, history, times = steady(names, hot, 30)

    def found(key: str, east: float) -> Found:
        refs = {"e": ("east", east), "w": ("west", 100.0 - east)}
        shares = {times[0]: {"east": east / 100, "west": 1 - east / 100}}
        return Found(Record(key, "q", shares, len(times), refs=refs), f"recorded {key}")

    llama, other = found("ExternalModel/llm/llama", 90.0), found("ExternalModel/llm/other", 20.0)
    missing = Found(None, "the record holds no target x/y/z")
    held, unheld = held_apart([llama, missing, other])
    assert held == [llama, other] and unheld == [missing.note]
    runs = [await replay_target(settings, {}, history, f, ticks=tmp_path) for f in held]
    assert [r.target.key if r.target else None for r in runs] == [
        "ExternalModel/llm/llama",
        "ExternalModel/llm/other",
    ]
    assert [r.summary.held for r in runs] == [{"east": 90, "west": 10}, {"east": 20, "west": 80}]
    for one in runs:  # each closed loop over its own record's split
        record = one.found.record
        assert one.response is not None and record is not None
        assert one.response.split(times[0]) == record.shares[times[0]]
        assert one.ticks is not None and len(one.ticks) == len(times)
        assert [t["time"] for t in one.ticks] == times
    alone = await replay_target(settings, {}, history, other, ticks=tmp_path)
    assert alone.ticks is not None and runs[1].ticks is not None
    assert alone.summary.published == runs[1].summary.published
    assert list(alone.ticks) == list(runs[1].ticks)
    held, unheld = held_apart([missing])
    assert held == [Found(None, missing.note)] and unheld == []
    implicit = await replay_target(settings, {}, history, held[0])
    assert implicit.target is None and implicit.weighed == names and implicit.ticks is None


async def test_a_target_s_summary_counts_its_own_clusters_and_queriers() -> None:
    """Found by a review: each target's summary counted every cluster's health changes and
    missing readings and every querier's failures, so a target over east and west carried
    north's and south's, read through another querier that failed for ten ticks."""
    from controller.recorded import Record
    from controller.replay import recorded_target

    names = ["east", "west", "north", "south"]
    settings, asked = hub(names)
    times = [1000.0 + 10 * i for i in range(30)]
    calm: Answers = {"kv_mean": {"east": 0.4, "west": 0.4}, "pods": {"east": 2.0, "west": 2.0}}
    slow = FetchTimeoutError("http://hub", "slow")
    other: dict[float, Answers] = {
        t: {"kv_mean": slow if i < 10 else {"north": 0.5, "south": 0.5}, "pods": {}}
        for i, t in enumerate(times)
    }
    answers = {"east": dict.fromkeys(times, calm), "west": dict.fromkeys(times, calm)}
    answers |= {"north": other, "south": other}
    history = History(times[0], times[-1], times, answers, asked)
    refs = {"e": ("east", 50.0), "w": ("west", 50.0)}
    target = recorded_target(Record("ExternalModel/llm/a", "q", {}, 1, refs=refs))
    row = (await run(settings, history, None, None, target)).row(["east", "west"])
    assert set(row["health_changes"]) <= {"east", "west"}
    assert row["unknown_cluster_ticks"] == 0 and row["failed_queries"] == {}
    everyone = (await run(settings, history)).row(names)  # the implicit target: all of them
    assert everyone["unknown_cluster_ticks"] == 20 and everyone["failed_queries"]["kv_mean"]


def test_a_kv_sample_stamped_ahead_of_our_clock_is_not_fresh() -> None:
    """Found by an attack: a querier answering kv_oldest a day ahead read as fresh (the page
    path says stale past 5 s ahead), so a querier whose clock runs ahead turned staleness off."""
    from controller import health
    from controller.settings import HealthSettings

    settings = HealthSettings()
    # a querier's clock a few seconds, or most of a minute, ahead of ours is no fault
    for stamp, fresh in ((150.0, True), (170.0, True), (215.0, True), (160.0 + 86400, False)):
        metrics = east(
            {"kv_mean": {"east": 0.5}, "pods": {"east": 2.0}, "kv_oldest": {"east": stamp}}
        )
        reason = health.failure_reason(metrics, settings, 160.0)
        assert (reason is None) is fresh and (fresh or reason is Reason.STALE), (stamp, reason)


def test_set_is_checked_over_the_config_s_own_weights_one_line_a_field() -> None:
    """Found by an attack: --set was checked alone against the defaults, so deadband=30 was
    refused beside a config's max_step of 50; and a union's branches each gave a line
    ("settle.literal[0]: Input should be 0", "function-after[...]")."""
    from controller.replay import check_overrides

    own = {"max_step": 50, "deadband": 1}
    assert check_overrides(["deadband=30"], own) == {"deadband": "30"}
    with pytest.raises(ConfigError) as raised:
        check_overrides(["deadband=30"])
    assert raised.value.lines == [
        "--set weights: deadband must be smaller than max_step, or weights never move"
    ]
    with pytest.raises(ConfigError) as raised:
        check_overrides(["settle=soon"], own, "--compare")
    assert raised.value.lines == [
        "--compare weights.settle: not a duration: 'soon' (use e.g. 500ms, 10s, 2m)"
    ]


def test_a_key_set_twice_is_refused_not_the_last_one_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an attack: ``--set floor=5 --set floor=10`` replayed 10 without a word, and
    so did ``--compare floor=5,floor=10``; a candidate given twice was replayed once."""
    from controller.cli import main
    from controller.replay import check_overrides

    config = tmp_path / "hub.yaml"
    config.write_text(
        "queriers: [{name: hub, url: 'http://127.0.0.1:1'}]\n"
        "clusters: [{name: east, prometheus: {querier: hub, cluster: east}}]\n"
    )
    replay = ["replay", "--config", str(config), "--start", "1700000000", "--end", "1700003600"]
    cases = {
        ("--set", "floor=5", "--set", "weights.floor=10"): "--set floor: given twice",
        ("--compare", "floor=5,floor=10"): "--compare floor: given twice ('floor=5' and",
        ("--compare", "floor=5", "--compare", "floor=5"): "--compare 'floor=5': given twice",
    }
    for given, why in cases.items():
        assert main([*replay, *given]) == 2, given
        assert why in capsys.readouterr().err, given
    # a --compare's key over --set's is the candidate's change, as before
    assert check_overrides(["floor=5", "floor=10"], {}) == {"floor": "10"}


def test_json_ticks_are_spooled_not_held_and_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack: ``--json`` held every tick as a dict until the end, 13.7 GB for a
    week of 20 clusters. Ticks go to a file as they are replayed; the document is streamed
    beside the output and put in its place whole."""
    import json
    import tempfile
    import tracemalloc

    from controller.replay import Ticks, spool_directory, write_document

    tick = {"time": 0.0, "clusters": {f"c{i}": {"kv": 0.5, "healthy": True} for i in range(20)}}
    first, empty = Ticks(tmp_path), Ticks(tmp_path)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at in range(5_000):  # ~5 MB as JSON
            first.add({**tick, "time": float(at)})
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, grown
    assert len(first) == 5_000 and [t["time"] for t in first][-1] == 4_999.0

    out = tmp_path / "replay.json"
    document: dict[str, Any] = {"targets": [{"summary": {"a": 1}}, {}], "gaps": {}, "x": None}
    write_document(out, document, [first, empty])
    written = json.loads(out.read_text())
    assert written["gaps"] == {} and written["x"] is None
    assert [b.get("summary") for b in written["targets"]] == [{"a": 1}, None]
    assert written["targets"][0]["ticks"] == list(first) and written["targets"][1]["ticks"] == []

    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as write_text made it (a review)

    broken = Ticks(tmp_path)
    broken.add(tick)
    broken.close()  # a write that fails halfway: the last document stays, nothing beside it
    with pytest.raises(ValueError, match="closed file"):
        write_document(out, document, [first, broken])
    assert json.loads(out.read_text()) == written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.json"]
    monkeypatch.setattr(os, "replace", fail_with("no room"))
    with pytest.raises(OSError, match="no room"):  # the rename refused: nothing left behind
        write_document(out, document, [first, empty])
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.json"]

    # spooled beside the file a link names, and not in /dev for /dev/stdout (a read-through)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "via").symlink_to(elsewhere / "r.json")
    assert spool_directory(tmp_path / "via") == elsewhere
    assert spool_directory(Path("/dev/null")) == Path(tempfile.gettempdir())
    # a symlink is written through, not replaced by a file of its own (a review)
    link = tmp_path / "link.json"
    link.symlink_to(out)
    write_document(link, {**document, "x": 1}, [first, empty])
    assert link.is_symlink() and json.loads(out.read_text())["x"] == 1


def fail_with(message: str) -> Callable[..., None]:
    def failing(*_: object) -> None:
        raise OSError(message)

    return failing


def test_steps_are_the_step_s_multiples_in_the_window_to_the_ms() -> None:
    """Ticks fall on the step's multiples, as a query frontend aligns a range. Found by a
    review: taken in floats, a start exactly on a multiple was dropped for 6,688 of the
    steps from 100 ms to 60 s at this decade's times (1.7e9 s)."""
    from controller.sources.prometheus import steps

    dropped = []
    for each in range(100, 60_001):  # ms
        start = 1_765_000_000_000 // each * each / 1000  # a multiple, as Prometheus writes it
        if steps(start, start + each / 1000 / 2, each / 1000) != [start]:
            dropped.append(each)
    assert dropped == []
    assert steps(1003.0, 1041.0, 10.0) == [1010.0, 1020.0, 1030.0, 1040.0]
    assert steps(1003.0, 1009.0, 10.0) == []  # no multiple in the window
    assert steps(0.25, 2.0, 0.5) == [0.5, 1.0, 1.5, 2.0]
