"""What the laws read of a cluster, derived from its fetches: utilization, the demand filter,
the KV forecast and capacity (controller/signals.py), table by table."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import pytest

from controller import signals
from controller.model import ClusterHealth, Latency
from controller.settings import WeightSettings
from tests.support.signals import INTERVAL, fetch, history, read

P = WeightSettings()


@pytest.mark.parametrize(
    ("kv", "running", "waiting", "expected"),
    [
        (0.5, 8.0, 0.0, 0.5),  # nothing waits: KV as read
        (0.5, 8.0, 8.0, 1.0),  # as many waiting as running: twice what it holds
        (0.8, 4.0, 2.0, 1.2),
        (0.5, 0.0, 3.0, 0.5),  # nothing running: the queue cannot be scaled from
        (0.5, None, 3.0, 0.5),  # running unknown
        (None, 8.0, 8.0, None),  # KV unknown: utilization unknown, never 0
    ],
)
def test_utilization_scales_kv_by_what_waits(
    kv: float | None, running: float | None, waiting: float, expected: float | None
) -> None:
    metrics = replace(fetch(kv), running=running, queue_depth=waiting)
    assert signals.utilization(metrics) == (pytest.approx(expected) if expected else expected)


@pytest.mark.parametrize(
    ("kvs", "demand"),
    [
        ([0.4], 0.4),  # the first reading is the filter's start
        ([0.4, 0.8], 0.6),  # then an EWMA with demand_smoothing (0.5)
        ([0.4, 0.8, 0.8], 0.7),
        # one failure is ridden out on the last good reading and does not feed the filter:
        # the good one after it moves the filter from 0.9 half-way to 0.3
        ([0.9, None, 0.3], 0.6),
    ],
)
def test_the_demand_filter_follows_good_readings(kvs: list[float | None], demand: float) -> None:
    state, memory = history(kvs)
    assert state.healthy
    assert memory.demand == pytest.approx(demand)


def test_an_outage_starts_the_filter_and_the_forecast_afresh() -> None:
    state, memory = history([0.9, 0.9, None, None])  # two failures: unhealthy
    assert not state.healthy
    assert memory.demand is None and memory.history == ()
    assert signals.derive(state, memory, P) is None  # nothing to weigh an unhealthy cluster on


def test_a_ridden_out_failure_keeps_the_filter_but_not_the_forecast_window() -> None:
    state, memory = history([0.5, 0.6, 0.7, None])
    assert state.healthy and state.metrics is not None and state.metrics.kv_mean == 0.7
    assert memory.demand is not None and memory.history == ()  # no slope across the gap


@pytest.mark.parametrize(
    ("kvs", "horizon", "expected"),
    [
        ([0.3, 0.4, 0.5], 0, 0.5),  # off by default: the newest reading
        ([0.3, 0.4, 0.5], 20, 0.7),  # rising 0.01/s: 20 s ahead
        ([0.5, 0.4, 0.3], 20, 0.3),  # falling: never anticipated
        ([0.4, 0.5], 20, 0.5),  # two points make a wild slope: not used
        ([0.8, 0.9, 1.0], 30, 1.0),  # never above 1
    ],
)
def test_the_kv_forecast_uses_a_full_window_of_rising_readings(
    kvs: list[float], horizon: float, expected: float
) -> None:
    params = WeightSettings(forecast_horizon=horizon)
    assert read(*kvs, params=params).kv == pytest.approx(expected)


def test_forecast_kv_is_the_least_squares_line() -> None:
    points = [(0.0, 0.2), (INTERVAL, 0.4), (2 * INTERVAL, 0.3)]
    slope = (0.3 - 0.2) / (2 * INTERVAL)  # least squares through the three
    assert signals.forecast_kv(points, 10) == pytest.approx(0.3 + slope * 10)


def test_capacity_is_the_pods_that_answered_and_the_queue_is_per_pod() -> None:
    derived = read(0.5, pods=8, queue=2.0)
    assert derived.capacity == 8.0
    assert derived.queue_per_pod == 2.0
    assert derived.utilization == pytest.approx(0.5 * (4 + 2) / 4)


@pytest.mark.parametrize(("quantile", "expected"), [("p50", 0.7), ("p90", 1.5), ("mean", 0.9)])
def test_latency_is_the_configured_quantile(quantile: str, expected: float) -> None:
    latency = Latency(0.7, 1.5, 0.9, requests=40, family="vllm:e2e_request_latency_seconds")
    metrics = replace(fetch(0.5), latency=latency)
    state = ClusterHealth(True, None, 0, 1, False, True, metrics)
    derived = signals.current(state, quantile)
    assert derived is not None and derived.latency == expected


def test_replaced_is_dataclasses_replace_for_the_hot_records() -> None:
    import dataclasses

    from controller.model import ClusterMetrics, Signals, replaced

    metrics = ClusterMetrics("a", 1.0, 0.1, 3, 2, kv_mean=0.4, queue_depth=2.0, running=9.0)
    signals = Signals(kv=0.4, pods=3.0, capacity=3.0)
    for record, changes in (
        (metrics, {"kv_mean": 0.2, "running": None}),
        (signals, {"capacity": 5.0, "capacity_from": "measured"}),
        (signals, {}),
    ):
        assert replaced(record, **changes) == dataclasses.replace(record, **changes)
        assert replaced(record, **changes) is not record
    copy = replaced(metrics, kv_mean=0.3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.kv_mean = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'kv'"):
        replaced(metrics, kv=0.2)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Marked(ClusterMetrics):  # its inherited slots are set where they are declared
        mark: str = ""

    marked = Marked("a", 1.0, 0.1, 3, 2, kv_mean=0.4, mark="m")
    assert replaced(marked, kv_mean=0.2) == dataclasses.replace(marked, kv_mean=0.2)

    @dataclasses.dataclass(frozen=True, slots=True)
    class One:
        notes: str

    with pytest.raises(TypeError, match="two fields or more"):
        replaced(One("x"), notes="y")


def test_quick_init_builds_what_the_generated_init_builds() -> None:
    """The same signature, defaults, errors and frozen records as ``dataclass`` generates."""
    import dataclasses

    from controller.model import quick_init

    @dataclasses.dataclass(frozen=True, slots=True)
    class Generated:
        name: str
        at: float
        kv: float | None = None
        notes: tuple[str, ...] = ()

    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Quick:
        name: str
        at: float
        kv: float | None = None
        notes: tuple[str, ...] = ()

    good: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("a", 1.0), {}),
        (("a",), {"at": 2.0, "notes": ("n",)}),
        (("a", 1.0, 0.5, ("x",)), {}),
        ((), {"kv": 0.2, "at": 3.0, "name": "b"}),
    ]
    for args, kwargs in good:
        quick, generated = Quick(*args, **kwargs), Generated(*args, **kwargs)
        assert dataclasses.astuple(quick) == dataclasses.astuple(generated)
        assert quick == Quick(*args, **kwargs) and hash(quick) == hash(Quick(*args, **kwargs))
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {"at": 1.0}),
        (("a", 1.0), {"kw": 1}),
        (("a", 1.0, 0, (), 5), {}),
    ]
    for args, kwargs in bad:
        with pytest.raises(TypeError):
            Generated(*args, **kwargs)
        with pytest.raises(TypeError):
            Quick(*args, **kwargs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Quick("a", 1.0).kv = 0.5  # type: ignore[misc]
    assert "kv=None" in repr(Quick("a", 1.0))
    assert str(inspect.signature(Quick.__init__)) == str(inspect.signature(Generated.__init__))

    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Odd:  # fields named as the generated code's own names would be
        self: int
        _0: int = 3

    assert (Odd(1), Odd(self=2, _0=5)) == (Odd(1, 3), Odd(2, 5))

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        notes: list[str] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="plain init fields"):
        quick_init(Factory)


def test_a_target_holding_new_weights_states_them_and_keeps_the_refs_that_already_hold() -> None:
    from controller.model import Ref, Target

    refs = (
        Ref("/r/0", "/n", "east", 50, "east"),
        Ref("/r/1", "/n", "west", 50, "west", stated=False),  # a default, not yet written
        Ref("/r/2", "/n", "other", 7, None),
    )
    target = Target("ExternalModel", "ns", "m", "uid", "1", refs, paused="by hand")
    moved = target.holding({"east": 30, "west": 50})
    assert [(r.name, r.weight, r.stated) for r in moved.refs] == [
        ("east", 30, True),
        ("west", 50, True),
        ("other", 7, True),
    ]
    assert moved.refs[2] is refs[2] and moved.paused == "by hand" and target.refs == refs
    still = target.holding({"east": 50})
    assert still.refs[0] is refs[0] and still.refs[1] is not refs[1]
