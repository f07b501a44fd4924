"""The reconcile loop: grid-aligned ticks that never overlap, isolation of failures, logs."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from dataclasses import replace

import pytest
import structlog
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from controller.logs import redact
from controller.model import ClusterMetrics, Reason, Ref, Target, Write, WriteResult
from controller.publish import Discovery, Publisher
from controller.reconcile import loop as loop_module
from controller.reconcile.loop import DEADLINE_SHARE, WIND_DOWN, Reconciler
from controller.settings import Settings, build_settings
from controller.state import Snapshot
from controller.testing import ScriptedSource, build_loop


class Timed(ScriptedSource):
    """A scripted source whose answers take ``delay`` (or raise, once); counts overlap."""

    def __init__(self, name: str, kv: float = 0.3, delay: float = 0.0) -> None:
        super().__init__(name)
        self.kv, self.delay = kv, delay
        self.raise_next = False
        self.active = 0
        self.max_active = 0
        self.starts: list[float] = []

    async def fetch(self) -> ClusterMetrics:
        self.starts.append(asyncio.get_running_loop().time())
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.raise_next:
                self.raise_next = False
                raise RuntimeError("bug in a source")
            await asyncio.sleep(self.delay)
            self.next = ClusterMetrics(
                self.name, time.time(), self.delay, 1, 1, kv_mean=self.kv, kv_max=self.kv
            )
            return await super().fetch()
        finally:
            self.active -= 1


def object_target(held: Mapping[str, int]) -> Target:
    """An ExternalModel-like target over clusters a and b, holding ``held``."""
    refs = tuple(
        Ref(f"/spec/externalProviderRefs/{i}", "/ref/name", name, weight, name)
        for i, (name, weight) in enumerate(held.items())
    )
    return Target("ExternalModel", "ns", "m", "uid", "1", refs)


class FailingPublisher:
    """One target, holding 50/50; every write raises (a bug, or a broken client)."""

    def __init__(self) -> None:
        self.attempts = 0

    async def discover(self) -> Discovery:
        return Discovery((object_target({"a": 50, "b": 50}),))

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        self.attempts += 1
        raise ConnectionError("API server unreachable")


def make(
    settings: Settings, *sources: Timed, publisher: Publisher | None = None
) -> tuple[Reconciler, Snapshot, CollectorRegistry]:
    loop = build_loop(settings, list(sources), publisher)
    return loop.reconciler, loop.snapshot, loop.registry


def settings(interval: float = 0.1) -> Settings:
    return build_settings(
        {
            "interval": interval,
            "scrape": {"timeout": interval / 2},
            "clusters": [
                {"name": "a", "vllm_urls": ["http://127.0.0.1:1/"]},
                {"name": "b", "vllm_urls": ["http://127.0.0.1:1/"]},
            ],
        }
    )


class SlowPublisher:
    """One target; the first write takes ``delay`` (a slow API server)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.held = {"a": 50, "b": 50}

    async def discover(self) -> Discovery:
        return Discovery((object_target(self.held),))

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        await asyncio.sleep(self.delay)
        self.delay = 0.0
        self.held = dict(desired)
        return WriteResult(Write.DONE, target.holding(desired))


@pytest.mark.looptime  # the loop's clock is virtual: no wall time, no CPU load, no jitter
async def test_ticks_stay_on_the_grid_skip_missed_slots_and_never_overlap() -> None:
    a, b = Timed("a", delay=0.12), Timed("b", kv=0.9)
    reconciler, snapshot, _ = make(settings(0.2), a, b, publisher=SlowPublisher(0.15))
    stop = asyncio.Event()
    task = asyncio.create_task(reconciler.run(stop))
    for _ in range(500):  # bounded: at most 5 s of loop time
        if len(a.starts) >= 6:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 2)
    assert a.max_active == 1
    origin = a.starts[0]
    offsets = [(t - origin) / 0.2 for t in a.starts]
    # every tick starts on a multiple of the interval: no drift
    assert offsets == pytest.approx([round(o) for o in offsets], abs=1e-6), offsets
    gaps = [round(y - x) for x, y in itertools.pairwise(offsets)]
    # a slow read (0.12 s) and the slow write (0.15 s), each within its stage deadline,
    # overran a slot, which was skipped, not bunched up
    assert gaps == [2, 1, 1, 1, 1], gaps
    assert snapshot.report.tick == len(a.starts)


@pytest.mark.looptime
async def test_the_tick_deadline_fails_only_the_slow_cluster() -> None:
    a, b = Timed("a", delay=5), Timed("b")
    reconciler, _, _ = make(settings(0.1), a, b)
    report = await asyncio.wait_for(reconciler.tick(), 1)
    assert report.clusters["a"].metrics is not None
    assert [e.reason for e in report.clusters["a"].metrics.errors] == [Reason.TIMEOUT]
    # what it took is the deadline it was cut off at, not 0 s (the fastest bucket: an attack)
    assert report.clusters["a"].metrics.duration == pytest.approx(0.1 * DEADLINE_SHARE, abs=1e-3)
    assert report.clusters["b"].health is not None and report.clusters["b"].health.healthy
    assert report.targets["configured"].outcome.applied == {"a": 0, "b": 100}


@pytest.mark.looptime
async def test_a_slow_cluster_is_cut_off_at_the_deadline_and_a_cancelled_tick_leaves_none() -> None:
    """The read stage has one deadline for every cluster: a fetch still out is cancelled
    there (it does not run on into the next tick), the others kept; a tick cancelled while
    its fetches are out (the daemon stopping) cancels them all."""
    a, b = Timed("a", delay=5), Timed("b", delay=0.05)
    reconciler, _, _ = make(settings(0.1), a, b)
    report = await reconciler.tick()
    assert a.active == 0  # cut off at 0.08 s, not left running for 5 s
    assert report.clusters["b"].metrics is not None and report.clusters["b"].metrics.errors == ()
    a.delay = b.delay = 1.0
    tick = asyncio.create_task(reconciler.tick())
    for _ in range(100):  # bounded: both fetches start within a few loop turns
        if a.active and b.active:
            break
        await asyncio.sleep(0)
    assert a.active == b.active == 1
    tick.cancel()
    with pytest.raises(asyncio.CancelledError):
        await tick
    for _ in range(10):
        await asyncio.sleep(0)
    assert a.active == b.active == 0


class Stubborn(Timed):
    """A source whose fetch swallows its cancellation ``ignores`` times (a library under it
    that does), sleeping ``delay`` again each time."""

    def __init__(self, name: str, delay: float, ignores: int) -> None:
        super().__init__(name, delay=delay)
        self.ignores = ignores

    async def fetch(self) -> ClusterMetrics:
        for _ in range(self.ignores):  # bounded: then it is cancelled like any other
            try:
                return await super().fetch()
            except asyncio.CancelledError:
                continue
        return await super().fetch()


class StubbornPublisher(SlowPublisher):
    """Every write swallows its cancellation once and then sleeps ``delay`` again."""

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            await asyncio.sleep(self.delay)
        return WriteResult(Write.DONE, target.holding(desired))


@pytest.mark.looptime
async def test_a_fetch_or_write_that_ignores_its_cancellation_does_not_stop_the_tick() -> None:
    """The tick waited for every cancelled fetch and write to end: one whose library swallowed
    the cancellation held the loop for as long as it liked (here another 60 s, and forever
    in the worst case). Now it is given ``WIND_DOWN``, left behind and named in the log; the
    other cluster's reading and the tick go on, and the next tick reads it again."""
    a, b = Stubborn("a", delay=60, ignores=1), Timed("b", kv=0.9)
    reconciler, _, registry = make(settings(0.1), a, b, publisher=StubbornPublisher(60))
    loop = asyncio.get_running_loop()
    began = loop.time()
    with capture_logs() as logs:
        report = await reconciler.tick()
    took = loop.time() - began
    # the read and publish stages' deadlines (0.08 s each) and one wind-down each, no more
    assert took <= 2 * 0.08 + 2 * WIND_DOWN + 0.05, took
    assert report.clusters["a"].metrics is not None
    assert [e.reason for e in report.clusters["a"].metrics.errors] == [Reason.TIMEOUT]
    # its deadline, not the stage's time with the wind-down (a review: 1.08 s)
    assert report.clusters["a"].metrics.duration == pytest.approx(0.08, abs=1e-3)
    assert report.clusters["b"].health is not None and report.clusters["b"].health.healthy
    events = [e["event"] for e in logs]
    assert "fetch did not stop when cancelled" in events
    assert "write did not stop when cancelled" in events
    assert (
        registry.get_sample_value("weight_controller_reconcile_errors_total", {"stage": "fetch"})
        == 1
    )
    assert report.targets["ExternalModel/ns/m"].outcome.write is Write.FAILED  # cut off
    a.ignores = 0
    again = await reconciler.tick()  # the left-behind fetch still sleeps; a new one is made
    assert again.clusters["a"].metrics is not None
    assert [e.reason for e in again.clusters["a"].metrics.errors] == [Reason.TIMEOUT]
    left = list(loop_module._STUCK)
    assert left  # held until they end, then let go
    for task in left:
        task.cancel()  # each swallowed one cancellation already: this one ends it
    await asyncio.wait(left)
    assert not loop_module._STUCK


async def test_a_raising_source_is_counted_and_the_loop_goes_on() -> None:
    a, b = Timed("a"), Timed("b")
    reconciler, _, registry = make(settings(), a, b)
    a.raise_next = True
    report = await reconciler.tick()
    assert report.clusters["a"].health is not None
    assert report.clusters["a"].health.reason is Reason.INTERNAL
    assert (
        registry.get_sample_value("weight_controller_reconcile_errors_total", {"stage": "fetch"})
        == 1
    )
    again = await reconciler.tick()
    assert again.clusters["a"].metrics is not None and again.clusters["a"].metrics.errors == ()


async def test_a_source_that_cancels_itself_is_internal_and_the_tick_goes_on() -> None:
    """A library under a source raising ``CancelledError`` of its own (not the deadline, not
    the tick's cancel) is a bug in that source: before, its task's result raised out of the
    read stage and took every cluster's tick with it. The raised one is logged with its
    traceback."""

    class Cancelling(Timed):
        async def fetch(self) -> ClusterMetrics:
            raise asyncio.CancelledError

    a, b = Cancelling("a"), Timed("b")
    reconciler, _, registry = make(settings(), a, b)
    with capture_logs() as logs:
        report = await reconciler.tick()
        b.raise_next = True
        later = await reconciler.tick()
    assert report.clusters["a"].health is not None
    assert report.clusters["a"].health.reason is Reason.INTERNAL
    assert report.clusters["b"].metrics is not None and report.clusters["b"].metrics.errors == ()
    assert later.clusters["b"].health is not None
    assert later.clusters["b"].health.reason is Reason.INTERNAL
    raised = [e for e in logs if e["event"] == "fetch raised"]
    assert {e["cluster"] for e in raised} == {"a", "b"}
    assert all(isinstance(e["exc_info"], BaseException) for e in raised)
    errors = registry.get_sample_value(
        "weight_controller_reconcile_errors_total", {"stage": "fetch"}
    )
    assert errors == 3  # a twice, b once


async def test_no_fetch_s_exception_is_left_unread_whatever_ends_the_stage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A source that raised before the tick was cancelled, and one that turns its cancel at
    the deadline into another error (a library tearing its connection down): asyncio would
    log "Task exception was never retrieved" for each if the stage did not read them."""
    import gc

    from controller.reconcile.loop import fetch_all

    class Raising(Timed):
        async def fetch(self) -> ClusterMetrics:
            raise RuntimeError("bug in a source")

    class TornDown(Timed):
        async def fetch(self) -> ClusterMetrics:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise OSError("connection torn down while cancelled") from None
            return await super().fetch()

    from controller.conditions import Conditions
    from controller.metrics import ControllerMetrics

    metrics = ControllerMetrics(CollectorRegistry())
    conditions = Conditions(structlog.get_logger())
    stage = asyncio.ensure_future(
        fetch_all([Raising("a"), Timed("b", delay=10)], 5.0, time.time, metrics, conditions)
    )
    for _ in range(100):  # bounded: the raising fetch ends within a few loop turns
        await asyncio.sleep(0)
    stage.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stage
    late = await fetch_all([TornDown("c")], 0.05, time.time, metrics, conditions)
    assert [e.reason for e in late[0].errors] == [Reason.TIMEOUT]
    gc.collect()
    unread = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unread == []


async def test_a_failed_publish_keeps_the_old_weights_in_force() -> None:
    a, b = Timed("a", kv=0.9), Timed("b", kv=0.1)
    publisher = FailingPublisher()
    reconciler, snapshot, registry = make(settings(), a, b, publisher=publisher)
    with capture_logs() as logs:
        await reconciler.tick()
    outcome = reconciler.targets["ExternalModel/ns/m"].outcome
    assert outcome.write is Write.FAILED and publisher.attempts == 1
    assert outcome.applied == {"a": 50, "b": 50} and outcome.desired["b"] > 50
    assert snapshot.report.clusters["a"].share == 50
    assert (
        registry.get_sample_value("weight_controller_reconcile_errors_total", {"stage": "publish"})
        == 1
    )
    assert any(e["event"] == "publish raised" for e in logs)


async def test_logs_one_greppable_line_per_cluster_and_state_changes() -> None:
    a, b = Timed("a", kv=0.95), Timed("b", kv=0.2)
    reconciler, _, _ = make(settings(), a, b)
    with capture_logs() as logs:
        await reconciler.tick()
        a.raise_next = True
        await reconciler.tick()
    status = [e for e in logs if e["event"] == "cluster status" and e["cluster"] == "b"]
    assert status[0]["vram_util"] == 0.2 and status[0]["healthy"] is True
    assert status[0]["weight"] >= 65  # away from the cluster at 95% at the first decision
    assert any(e["event"] == "would write" and e["log_level"] == "info" for e in logs)
    assert any(e["event"] == "cluster healthy" for e in logs)
    a.raise_next = True
    with capture_logs() as later:
        await reconciler.tick()
    unhealthy = [e for e in later if e["event"] == "cluster unhealthy"]
    assert unhealthy and unhealthy[0]["reason"] == "internal" and unhealthy[0]["cluster"] == "a"


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"token": "s3cr3t"}, {"token": "***"}),
        ({"Authorization": "Bearer s3cr3t"}, {"Authorization": "***"}),
        (
            {"url": "https://user:pw@example.test/metrics"},
            {"url": "https://***@example.test/metrics"},
        ),
        ({"url": "http://127.0.0.1:8000/metrics"}, {"url": "http://127.0.0.1:8000/metrics"}),
    ],
)
def test_secrets_are_never_rendered(event: dict[str, str], expected: dict[str, str]) -> None:
    assert redact(None, "info", dict(event)) == expected


async def test_our_own_metrics_page_stays_under_two_kilobytes_per_cluster() -> None:
    from prometheus_client import generate_latest

    names = [f"c{i:03}" for i in range(200)]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in names],
        }
    )
    sources = [Timed(n, kv=0.2 + (i % 7) / 20) for i, n in enumerate(names)]
    sources[0].raise_next = True  # one failing cluster: its error series appear too
    reconciler, _, registry = make(settings, *sources)
    for _ in range(3):
        await reconciler.tick()
    page = generate_latest(registry)
    assert len(page) / len(names) <= 2048, len(page) / len(names)
    assert b"_created" not in page


def _served(name: str, now: float, arrived: float) -> ClusterMetrics:
    return ClusterMetrics(
        name, now, 0.01, 1, 1, kv_mean=0.3, kv_max=0.3, running=1.0, queue_depth=0.0,
        kv_tokens=32768.0, arrived=arrived, completed=arrived,
    )  # fmt: skip


async def test_a_cluster_that_dies_leaves_when_no_routed_request_arrived_anywhere() -> None:
    """Found by an attack: every request arrived at one cluster and none at the two the
    weights route to (a router not honouring them), so the rest step's fair share divided by
    a routed share of 0, every tick raised, and a cluster that then died kept its third."""
    from controller.testing import Driver

    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in "abc"],
        }
    )
    driver, now = Driver(settings, journal=False), 1000.0
    for tick in range(8):
        now += 10
        given = {"a": _served("a", now, 100.0), "b": _served("b", now, 0.0)}
        given["c"] = (
            ClusterMetrics.failed("c", now, Reason.REFUSED, "connection refused", 0.01)
            if tick >= 3
            else _served("c", now, 0.0)
        )
        report = await driver.tick(now, given)
    assert report.only is not None and report.only.outcome.applied["c"] == 0


class _TwoTargets:
    """Targets over clusters a and b, x and y (``names``); every write is done."""

    def __init__(self) -> None:
        self.names: tuple[str, ...] = ("x", "y")

    async def discover(self) -> Discovery:
        one = object_target({"a": 50, "b": 50})
        return Discovery(tuple(replace(one, name=n, uid=n) for n in self.names))

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        return WriteResult(Write.DONE, target.holding(desired))


async def test_a_law_that_raises_holds_its_target_and_weighs_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in the law for one target is that target's alone: held as it is (mode no_data,
    counted under stage weigh, a condition with its traceback), and the other target is
    weighed the same tick, where an exception in the list of plans failed the tick for all.
    Held, but not on a dead cluster (a review): b refuses, and x's share of it goes to a."""
    from controller import weights as weights_module

    real = weights_module.weigh

    def weigh(target: Target, *args: object, **kwargs: object) -> object:
        if target.name == "x":
            raise ZeroDivisionError("a bug")
        return real(target, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(weights_module, "weigh", weigh)
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in "ab"],
        }
    )
    sources = [ScriptedSource(n) for n in "ab"]
    for source in sources:
        source.next = ClusterMetrics(source.name, time.time(), 0.01, 1, 1, kv_mean=0.3, kv_max=0.3)
    publisher = _TwoTargets()
    loop = build_loop(settings, sources, publisher)
    with capture_logs() as logs:
        report = await loop.reconciler.tick()
    assert report.targets["ExternalModel/ns/x"].outcome.applied == {"a": 50, "b": 50}
    sources[1].next = ClusterMetrics.failed("b", time.time(), Reason.REFUSED, "refused", 0.01)
    with capture_logs():
        drained = await loop.reconciler.tick()
    assert drained.targets["ExternalModel/ns/x"].outcome.applied == {"a": 100, "b": 0}
    x, y = report.targets["ExternalModel/ns/x"], report.targets["ExternalModel/ns/y"]
    assert str(x.outcome.decision.mode) == "no_data" and x.outcome.write is Write.NONE
    assert "the law raised ZeroDivisionError" in x.outcome.decision.notes[0]
    assert str(y.outcome.decision.mode) != "no_data"
    assert [e["target"] for e in logs if e["event"] == "weighing raised"] == ["ExternalModel/ns/x"]
    samples = loop.registry.get_sample_value(
        "weight_controller_reconcile_errors_total", {"stage": "weigh"}
    )
    assert samples == 2.0  # both ticks
    publisher.names = ("y",)  # x is deleted: its condition ends with it
    with capture_logs() as later:
        await loop.reconciler.tick()
    ended = [e for e in later if e["event"] == "condition ended"]
    assert [e["condition"] for e in ended] == ["weighing raised"]


@pytest.mark.looptime
async def test_a_fetch_that_raised_at_once_is_timed_by_itself_not_the_deadline() -> None:
    """A review: each fetch's end was noted by a done callback, which asyncio runs a loop
    turn later; a stage whose every fetch ended in its first turn gave each the deadline
    (8 s recorded for a fetch that raised at once)."""
    from controller.conditions import Conditions
    from controller.metrics import ControllerMetrics
    from controller.reconcile.loop import fetch_all

    class Raising(Timed):
        async def fetch(self) -> ClusterMetrics:
            raise RuntimeError("a bug in this source")

    metrics = ControllerMetrics(CollectorRegistry())
    conditions = Conditions(structlog.get_logger())
    (alone,) = await fetch_all([Raising("a")], 8.0, time.time, metrics, conditions)
    assert alone.errors[0].reason is Reason.INTERNAL and alone.duration < 0.01
    beside = await fetch_all(
        [Raising("a"), Timed("b", delay=0.05)], 8.0, time.time, metrics, conditions
    )
    assert beside[0].duration < 0.01 and beside[1].errors == ()
