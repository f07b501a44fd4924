"""Replay's closed loop: the recorded load moved with the replayed weights (pure parts)."""

from __future__ import annotations

import pytest

from controller.errors import ConfigError
from controller.model import IMPLICIT_TARGET, ClusterMetrics
from controller.replay import History, Response, recorded_split, responded, run
from controller.settings import build_settings
from controller.sources.answers import Answers, Asked
from controller.state import TickReport


def reading(kv: float | None = 0.6) -> ClusterMetrics:
    return ClusterMetrics(
        "east",
        100.0,
        0.01,
        2,
        2,
        kv_mean=kv,
        kv_max=None if kv is None else kv + 0.1,
        queue_depth=12.0,
        queue_per_pod=6.0,
        running=16.0,
        arrived=40.0,
        completed=38.0,
    )


def test_a_share_cut_to_a_seventh_moves_the_routed_load_with_it() -> None:
    factors = Response.of({"east": 1, "west": 1}).factors({"east": 7, "west": 93})
    assert factors == pytest.approx({"east": 0.14, "west": 1.86})
    moved = responded(reading(), factors["east"])
    assert (moved.kv_mean, moved.kv_max) == pytest.approx((0.084, 0.098))
    assert (moved.queue_depth, moved.queue_per_pod, moved.running) == pytest.approx(
        (1.68, 0.84, 2.24)
    )
    assert (moved.arrived, moved.completed) == pytest.approx((5.6, 5.32))
    assert moved.pods_answering == 2 and moved.scraped_at == 100.0  # the rest as recorded


def test_more_traffic_than_the_cache_holds_waits_in_the_queue() -> None:
    doubled = responded(reading(0.6), 2.0)  # the cache holds 1/0.6 of today's running
    assert doubled.kv_mean == 1.0 and doubled.kv_max == 1.0
    assert doubled.running == pytest.approx(16 / 0.6)
    queue = 12 * 2 + 16 * (2 - 1 / 0.6)  # today's queue doubled, and what the cache cannot hold
    assert doubled.queue_depth == pytest.approx(queue)
    assert doubled.queue_per_pod == pytest.approx(queue / 2)
    assert doubled.arrived == 80.0 and doubled.completed == pytest.approx(38 / 0.6)
    tenfold = responded(reading(0.6), 10.0)
    assert tenfold.running == pytest.approx(16 / 0.6)  # no more runs than the cache holds
    assert tenfold.queue_depth == pytest.approx(12 * 10 + 16 * (10 - 1 / 0.6))


def test_an_unknown_stays_unknown() -> None:
    assert responded(reading(None), 0.5).kv_mean is None
    same = reading()
    assert responded(same, 1.0) is same


def test_a_cluster_without_recorded_traffic_is_read_as_recorded() -> None:
    response = Response.of({"east": 0, "west": 1})
    assert response.factors({"east": 30, "west": 70}) == pytest.approx({"east": 1.0, "west": 0.7})
    # no weights in force at all: nothing is moved
    assert Response.of({"east": 1, "west": 1}).factors({}) == {"east": 1.0, "west": 1.0}


def test_the_recorded_split_is_even_unless_given_and_every_cluster_named() -> None:
    assert recorded_split(None, ["a", "b"]).recorded == {"a": 0.5, "b": 0.5}
    assert recorded_split("a=3, b=1", ["a", "b"]).recorded == {"a": 0.75, "b": 0.25}
    assert recorded_split("a=0,b=1", ["a", "b"]).recorded == {"a": 0.0, "b": 1.0}
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
    settings = build_settings(
        {
            "interval": "10s",
            "queriers": [{"name": "hub", "url": "http://127.0.0.1:9", "push_interval": "10s"}],
            "clusters": [
                {"name": c, "prometheus": {"querier": "hub", "cluster": c}} for c in names
            ],
        }
    )
    asked = {c: Asked("http://hub", "cluster", c, {"kv_mean": "q"}, 60.0, 5.0) for c in names}
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
        factor = response.factors(seen[tick - 1][0])["east"]
        assert seen[tick][1] == pytest.approx(min(1.0, recorded * factor)), tick
        moved += factor != 1.0
    assert moved >= 10  # the story moved east's load for a while: the check means something
