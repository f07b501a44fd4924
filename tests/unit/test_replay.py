"""Replay's closed loop: the recorded load moved with the replayed weights (pure parts)."""

from __future__ import annotations

import pytest

from controller.errors import ConfigError
from controller.model import ClusterMetrics
from controller.replay import Response, recorded_split, responded


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


def test_more_traffic_fills_the_cache_at_most_and_an_unknown_stays_unknown() -> None:
    assert responded(reading(0.6), 2.0).kv_mean == 1.0
    assert responded(reading(0.6), 2.0).running == 32.0
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
    for bad in ("a=3", "a=3,b=-1", "a=3,b=inf", "a=3,c=1", "a,b=1", "a=0,b=0"):
        with pytest.raises(ConfigError) as raised:
            recorded_split(bad, ["a", "b"])
        assert len(raised.value.lines) == 1 and raised.value.lines[0].startswith("--recorded")
