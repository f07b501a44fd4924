"""The reconcile loop. One tick is a list of stages, read top to bottom in ``tick()``:

    discover  the routing targets the publisher knows, and the clusters objects define
    read      every cluster's signals, each under the stage deadline
    judge     each cluster's health from its fetch (``fleet``)
    weigh     every target, once, with ``weights.weigh`` from what it holds now (``memory``)
    publish   what changed, through the publisher, several targets at once under one deadline
              (a conflict is weighed again from a fresh read)
    record    the tick's report, built whole (with realised share) and swapped in at once
    journal   the log lines, from the previous report and this one

Ticks never overlap and do not drift: each starts on the interval grid, and a tick that overran
skips the slots it missed instead of bunching up. Discover, read and publish each end by their
deadline (``DEADLINE_SHARE`` of the interval) and beat the snapshot's heartbeat, so a hung API
server costs ticks their writes, never liveness. One cluster's failure stays that cluster's,
and one target's failure stays that target's.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import structlog

from controller import render, weights
from controller.conditions import Conditions
from controller.metrics import ControllerMetrics
from controller.model import (
    ClusterMetrics,
    Decision,
    Mode,
    Reason,
    Signals,
    Target,
    TargetDecision,
    Write,
    WriteResult,
)
from controller.publish import MAY_HAVE_LANDED, Discovery, Publisher
from controller.reconcile.fleet import Fleet, SourceFactory
from controller.reconcile.journal import Journal
from controller.reconcile.memory import (
    TargetMemory,
    after_write,
    follow_record,
    in_force,
    settling,
)
from controller.settings import Settings
from controller.sources import ClusterMetricsSource
from controller.state import ClusterView, Snapshot, TargetView, TickReport

log = structlog.get_logger("controller.loop")

# A tick must leave room for publishing and for the next one to start on time.
DEADLINE_SHARE = 0.8
STAGES = ("discover", "fetch", "weigh", "publish", "tick")


@dataclass(frozen=True, slots=True)
class Plan:
    """One target weighed: as found, as in force, and what it should hold."""

    discovered: Target  # as the publisher found it
    in_force: Target  # as in force: the object's weights, or a dry run's shadow
    desired: dict[str, int]
    decision: Decision


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        sources: Sequence[ClusterMetricsSource],
        publisher: Publisher,
        metrics: ControllerMetrics,
        snapshot: Snapshot,
        clock: Callable[[], float] = time.time,
        on_tick: Callable[[TickReport], None] | None = None,
        source_factory: SourceFactory | None = None,
        *,
        journal: bool = True,
    ) -> None:
        """``journal``: write the log lines (off only where no one reads them: ``replay``,
        whose decisions are the daemon's, tick for tick)."""
        self._settings = settings
        self._publisher = publisher
        self._metrics = metrics
        self._snapshot = snapshot
        self._clock = clock
        self._on_tick = on_tick
        self._fleet = Fleet(settings, sources, metrics, source_factory)
        self._memory: dict[str, TargetMemory] = {}
        self._conditions = Conditions(log, settings.log.repeat_interval, clock)
        self._journal = Journal(settings.log, self._conditions, clock) if journal else None
        self._found = Discovery()
        self._tick = 0
        self._settle = settings.settle
        snapshot.report = replace(snapshot.report, clusters=self._fleet.views({}))
        for stage in STAGES:
            metrics.reconcile_errors.labels(stage)

    @property
    def targets(self) -> Mapping[str, TargetView]:
        """Every target after the last tick."""
        return self._snapshot.report.targets

    async def tick(self) -> TickReport:
        self._tick += 1
        began = time.perf_counter()
        with structlog.contextvars.bound_contextvars(tick=self._tick):
            found = await self._discover()
            self._beat()
            self._judge(await self._read())
            self._beat()
            inputs = self._fleet.signals()
            self._observe(found.targets)
            plans = [self._weigh(target, inputs) for target in found.targets]
            outcomes = await self._publish_all(plans, inputs)
            self._beat()
            report = self._record(found, outcomes, began)
            # the report is served before it is logged: a log line that fails (a bug, named
            # by 'tick failed') never freezes /metrics and /debug/state on an old tick
            previous, self._snapshot.report = self._snapshot.report, report
            if self._journal is not None:
                self._journal.write(previous, report)
        if self._on_tick is not None:
            self._on_tick(report)
        return report

    def _beat(self) -> None:
        self._snapshot.beat = time.monotonic()

    # ---- discover ----------------------------------------------------------------------------
    async def _discover(self) -> Discovery:
        """The publisher's targets; clusters it names beyond the configured ones are read too.
        If discovery fails or runs out of time, the targets as the last tick left them are
        weighed again."""
        deadline = self._settings.interval * DEADLINE_SHARE
        known = tuple(view.outcome.target for view in self.targets.values())
        try:
            async with asyncio.timeout(deadline):
                found = await self._publisher.discover()
        except TimeoutError:  # a slow or hung API server: a condition, not a bug
            self._metrics.reconcile_errors.labels("discover").inc()
            error = f"discovery: no answer within the stage deadline {deadline:g}s"
            self._conditions.observe(
                "cannot read targets",
                ("discover",),
                reason="api_timeout",
                error=error,
                kept_targets=len(known),
            )
            return replace(self._found, targets=known, reachable=False, error=error)
        except Exception:  # discovery failing must not stop scraping what we know
            self._metrics.reconcile_errors.labels("discover").inc()
            self._conditions.observe("discovery failed", ("discover",), "error", exc_info=True)
            return replace(self._found, targets=known)
        self._conditions.clear(("discover",))
        self._found = found
        self._fleet.follow(found.clusters)
        return found

    # ---- read and judge ----------------------------------------------------------------------
    async def _read(self) -> list[ClusterMetrics]:
        sources = list(self._fleet.sources.values())
        deadline = self._settings.interval * DEADLINE_SHARE
        return await fetch_all(sources, deadline, self._clock, self._metrics, self._conditions)

    def _judge(self, fetched: Sequence[ClusterMetrics]) -> None:
        now = self._clock()
        for metrics in fetched:
            self._metrics.count_fetch(metrics)
            after = self._fleet.judge(metrics, now)
            if after.changed:
                to = "healthy" if after.healthy else "unhealthy"
                self._metrics.health_transitions.labels(metrics.cluster, to).inc()
            if not any(e.reason is Reason.INTERNAL for e in metrics.errors):
                self._conditions.clear(("fetch", metrics.cluster))

    # ---- weigh -------------------------------------------------------------------------------
    def _observe(self, targets: Sequence[Target]) -> None:
        """This tick's arrivals per cluster, to each target's actuation: has its last change
        started to act?"""
        now, arrived = self._clock(), self._fleet.arrivals.latest
        for target in targets:
            memory = self._memory.setdefault(target.key, TargetMemory())
            clusters = {c for c in target.clusters.values() if c is not None}
            memory.actuation.observe(
                now, {c: arrived.get(c) for c in clusters}, self._settings.interval
            )

    def _weigh(
        self, found: Target, inputs: Mapping[str, Signals | None], fresh: bool = False
    ) -> Plan:
        """The one place a target's weights are decided: ``weights.weigh`` on what it holds
        (the object's weights, or a dry run's shadow; ``fresh``: the object as just re-read)."""
        memory = self._memory.setdefault(found.key, TargetMemory())
        target = found if fresh else in_force(found, memory)
        now, interval = self._clock(), self._settings.interval
        follow_record(memory, found, now, interval)
        wait = settling(memory, now, self._settle, interval)
        served = memory.realised.shares() if memory is not None else None
        try:
            desired, decision = weights.weigh(target, inputs, self._settings.weights, wait, served)
        except Exception as exc:  # a bug: this target is held as it is, the others weighed
            self._metrics.reconcile_errors.labels("weigh").inc()
            self._conditions.observe(
                "weighing raised", ("weigh", found.key), "error", target=found.key, exc_info=exc
            )
            note = (
                f"the law raised {type(exc).__name__}: held as it is, but for unhealthy "
                "clusters' share, handed to the healthy (the log has the traceback)"
            )
            held = Decision(None, {}, Mode.NO_DATA, False, (note,), law=self._settings.weights.law)
            return Plan(found, target, weights.drained(target, inputs), held)
        self._conditions.clear(("weigh", found.key))
        return Plan(found, target, desired, decision)

    # ---- publish -----------------------------------------------------------------------------
    async def _publish_all(
        self, plans: Sequence[Plan], inputs: Mapping[str, Signals | None]
    ) -> list[TargetDecision]:
        """Every plan's writes, ``kubernetes.max_parallel_writes`` at once, all under one
        deadline; a write still out when it passes is cut off and counts as failed
        (``api_timeout``; it is weighed and tried again next tick). Outcomes in plan order."""
        deadline = self._settings.interval * DEADLINE_SHARE
        changing = [plan for plan in plans if self._changes(plan)]
        jobs = [lambda plan=plan: self._attempt(plan, inputs) for plan in changing]
        limit = self._settings.kubernetes.max_parallel_writes
        answers = iter(await bounded(jobs, limit, deadline))
        outcomes = []
        for plan in plans:
            result = WriteResult(Write.NONE, plan.in_force)
            if self._changes(plan):
                answer = next(answers)
                if answer is None:
                    detail = (
                        f"publish deadline {deadline:g}s passed before the write was answered; "
                        f"it may have landed: {MAY_HAVE_LANDED}"
                    )
                    result = WriteResult(Write.FAILED, plan.in_force, detail, "api_timeout")
                elif isinstance(answer, BaseException):  # a bug: this target's only
                    result = self._raised(plan.discovered.key, plan.in_force, answer)
                else:
                    plan, result = answer
            outcomes.append(self._outcome(plan, result))
        return outcomes

    @staticmethod
    def _changes(plan: Plan) -> bool:
        return plan.desired != plan.in_force.weights

    async def _attempt(
        self, plan: Plan, inputs: Mapping[str, Signals | None]
    ) -> tuple[Plan, WriteResult]:
        """Write what changed; after a conflict, weigh again from the fresh read and retry."""
        result = WriteResult(Write.NONE, plan.in_force)
        for _ in range(self._settings.kubernetes.write_retries):
            if plan.desired == plan.in_force.weights:
                result = WriteResult(Write.NONE, plan.in_force)
                break
            result = await self._write(plan)
            if result.write is not Write.CONFLICT or result.target is None:
                break
            plan = self._weigh(result.target, inputs, fresh=True)
        else:
            detail = "the object changed under every attempt"
            result = replace(result, detail=detail, reason="conflict")
        return plan, result

    def _outcome(self, plan: Plan, result: WriteResult) -> TargetDecision:
        """What one target's publishing came to, and its memory after it."""
        key = plan.discovered.key
        if result.write not in (Write.NONE, Write.FOLLOWER):
            self._metrics.add_target(key)
            self._metrics.target_writes.labels(key, result.write.value).inc()
        memory = self._memory.setdefault(key, TargetMemory())
        now = self._clock()
        interval = self._settings.interval
        applied = after_write(
            memory, plan.discovered, plan.in_force, plan.desired, result, now, interval
        )
        return TargetDecision(
            target=result.target or plan.in_force,
            held=plan.in_force.weights,
            desired=plan.desired,
            applied=applied,
            decision=plan.decision,
            write=result.write,
            detail=result.detail,
            reason=result.reason,
        )

    async def _write(self, plan: Plan) -> WriteResult:
        memory = self._memory.setdefault(plan.discovered.key, TargetMemory())
        if memory.refused is not None and memory.refused[0] == plan.desired:
            return memory.refused[1]  # the schema refused exactly this: do not send it again
        why = f"{plan.decision.mode.value}: {render.change(plan.in_force.weights, plan.desired)}"
        try:
            result = await self._publisher.write(plan.in_force, plan.desired, why)
        except Exception as exc:  # one target's failure must not stop the others
            result = self._raised(plan.discovered.key, plan.in_force, exc)
        schema = result.write is Write.REFUSED and result.reason == "schema"
        memory.refused = (dict(plan.desired), result) if schema else None
        return result

    def _raised(self, key: str, target: Target, exc: BaseException) -> WriteResult:
        """A write that raised (a bug): failed, this target's only, with its traceback."""
        self._metrics.reconcile_errors.labels("publish").inc()
        self._conditions.observe(
            "publish raised", ("publish", key), "error", target=key, exc_info=exc
        )
        return WriteResult(Write.FAILED, target, type(exc).__name__, "internal")

    # ---- record ------------------------------------------------------------------------------
    def _record(
        self, found: Discovery, outcomes: Sequence[TargetDecision], began: float
    ) -> TickReport:
        """This tick's report: every target's outcome with its history and realised share,
        every cluster's fetch and health, built whole so readers never see half a tick."""
        now = self._clock()
        window = self._settings.weights.realised_window
        arrived = self._fleet.arrivals.latest
        views = {
            outcome.key: target_view(self._memory, outcome, now, window, arrived)
            for outcome in outcomes
            if outcome.write is not Write.GONE
        }
        for key in self._memory.keys() - views.keys():
            del self._memory[key]
            self._metrics.remove_target(key)
        only = next(iter(views.values())) if len(views) == 1 else None
        shares = _cluster_shares(only.outcome) if only else {}
        duration = time.perf_counter() - began
        self._metrics.reconcile_duration.observe(duration)
        self._metrics.last_reconcile.set(now)
        return TickReport(
            tick=self._tick,
            clusters=self._fleet.views(shares),
            targets=views,
            refused=found.refused,
            kubernetes=(found.reachable, found.error),
            duration=duration,
            finished=now,
            finished_monotonic=time.monotonic(),
        )

    # ---- the loop ----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Tick on the interval grid until ``stop`` is set; an exception costs one tick only."""
        await on_the_grid(self.tick, self._settings.interval, stop, self._metrics, self._conditions)


T = TypeVar("T")


async def fetch_all(
    sources: Sequence[ClusterMetricsSource],
    deadline: float,
    clock: Callable[[], float],
    metrics: ControllerMetrics,
    conditions: Conditions,
) -> list[ClusterMetrics]:
    """Every cluster's fetch at once, in ``sources``' order: one still out ``deadline`` after
    they began fails as ``timeout`` (its fetch cancelled, the others kept), one whose source
    raised as ``internal`` (a bug in one source must not take the others down); one that does
    not stop when cancelled is left behind (``cut_off``) and named in the log until it ends.
    One timer for the stage, not one per cluster, and the fetches' own tasks, nothing around
    them: in a replay of a week each was a tenth of a tick."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    tasks = [loop.create_task(source.fetch()) for source in sources]
    if not tasks:
        return []
    ended: dict[asyncio.Task[ClusterMetrics], float] = {}  # what each fetch took, as it ends
    for task in tasks:
        task.add_done_callback(lambda done: ended.setdefault(done, loop.time() - began))
    late: set[asyncio.Task[ClusterMetrics]] = set()
    try:
        await asyncio.sleep(0)  # one turn: a fetch with its answer at hand (replay's) is done
        if not all(task.done() for task in tasks):
            left = max(0.0, deadline - (loop.time() - began))
            _, late = await asyncio.wait(tasks, timeout=left)
    finally:  # the deadline passed, or the tick itself was cancelled: nothing left running
        stuck = await cut_off(tasks) if not all(task.done() for task in tasks) else set()
        for task in tasks:  # read now, whatever ends the stage: none is "never retrieved"
            if task.done() and not task.cancelled():
                task.exception()
    # what a fetch that failed took: a late one its deadline (a review: the stage's time,
    # wind-down and all, was given to every failed fetch), one that raised until it did (a
    # done callback runs a loop turn after: one that ended in the stage's last turn is
    # timed by the stage, never by the deadline it did not wait for)
    spent = loop.time() - began
    return [
        _fetched(
            source,
            task,
            task in late,
            task in stuck,
            (deadline, deadline if task in late else ended.get(task, spent)),
            clock,
            metrics,
            conditions,
        )
        for source, task in zip(sources, tasks, strict=True)
    ]


def _fetched(
    source: ClusterMetricsSource,
    task: asyncio.Task[ClusterMetrics],
    late: bool,
    stuck: bool,
    times: tuple[float, float],
    clock: Callable[[], float],
    metrics: ControllerMetrics,
    conditions: Conditions,
) -> ClusterMetrics:
    """One fetch's end as the tick reads it: its metrics, or why there are none. A source
    that cancelled itself (a library raising ``CancelledError`` of its own) is a bug in that
    source, as one that raised."""
    if stuck:
        key = ("stuck fetch", source.cluster)
        metrics.reconcile_errors.labels("fetch").inc()
        conditions.observe(
            "fetch did not stop when cancelled",
            key,
            "error",
            cluster=source.cluster,
            wind_down_seconds=WIND_DOWN,
        )
        task.add_done_callback(_clearing(conditions, key))
    deadline, spent = times
    if late:  # cancelled by us (the tick's own cancel never gets here)
        detail = f"tick deadline {deadline:g}s passed"
        return ClusterMetrics.failed(source.cluster, clock(), Reason.TIMEOUT, detail, spent)
    try:
        return task.result()
    except (Exception, asyncio.CancelledError) as raised:  # the source's own, traceback and all
        error: BaseException = raised
    metrics.reconcile_errors.labels("fetch").inc()
    key = ("fetch", source.cluster)
    conditions.observe("fetch raised", key, "error", cluster=source.cluster, exc_info=error)
    detail = f"{type(error).__name__} (the log has the traceback)"
    return ClusterMetrics.failed(source.cluster, clock(), Reason.INTERNAL, detail, spent)


# A cancelled fetch or write is given this long to wind down. One that ignores its
# cancellation (a library under it swallowing CancelledError) is left to end on its own, held
# here until it does, and the tick goes on: no task can stop the loop.
WIND_DOWN = 1.0
_STUCK: set[asyncio.Future[Any]] = set()


def _clearing(conditions: Conditions, key: tuple[str, str]) -> Callable[[object], None]:
    return lambda _: conditions.clear(key)


async def cut_off(tasks: Sequence[asyncio.Future[T]]) -> set[asyncio.Future[T]]:
    """Cancel every task still running and wait for them to wind down, at most ``WIND_DOWN``;
    those still running then are returned (and held until they end)."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if not pending:
        return set()
    _, stuck = await asyncio.wait(pending, timeout=WIND_DOWN)
    for task in stuck:
        _STUCK.add(task)
        task.add_done_callback(_ended)
    return stuck


def _ended(task: asyncio.Future[Any]) -> None:
    """A task left behind has ended: let it go, its exception read (nobody awaits it)."""
    _STUCK.discard(task)
    if not task.cancelled():
        task.exception()


def target_view(
    memories: dict[str, TargetMemory],
    outcome: TargetDecision,
    now: float,
    window: float,
    arrived: Mapping[str, float | None],
) -> TargetView:
    """A target's outcome with its history, realised share and actuation, as the report shows."""
    memory = memories.setdefault(outcome.key, TargetMemory())
    realised, intended = memory.realised.add(now, window, outcome, arrived)
    act = memory.actuation
    return TargetView(
        outcome,
        memory.last_write,
        memory.last_change,
        realised,
        intended,
        act.estimate,
        act.pending is not None,
    )


async def bounded(
    jobs: Sequence[Callable[[], Awaitable[T]]], limit: int, deadline: float
) -> list[T | BaseException | None]:
    """Each job's answer, at most ``limit`` running at once, all within ``deadline``: an
    exception for one that raised, ``None`` for one cut off (also when the caller is
    cancelled, nothing is left running). In the jobs' order."""
    slots = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with slots:
            return await job()

    tasks = [asyncio.create_task(one(job)) for job in jobs]
    try:
        if tasks:
            await asyncio.wait(tasks, timeout=deadline)
    finally:
        stuck = await cut_off(tasks)
    if stuck:
        log.error(
            "write did not stop when cancelled", writes=len(stuck), wind_down_seconds=WIND_DOWN
        )
    return [
        None if not task.done() or task.cancelled() else (task.exception() or task.result())
        for task in tasks
    ]


async def on_the_grid(
    tick: Callable[[], Awaitable[object]],
    interval: float,
    stop: asyncio.Event,
    metrics: ControllerMetrics,
    conditions: Conditions,
) -> None:
    """``tick`` on the interval grid until ``stop``: ticks never overlap and do not drift; one
    that overran skips the slots it missed instead of bunching up."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while not stop.is_set():
        try:
            await tick()
            conditions.clear(("tick",))
        except Exception:
            metrics.reconcile_errors.labels("tick").inc()
            conditions.observe("tick failed", ("tick",), "error", exc_info=True)
        next_at += interval
        behind = loop.time() - next_at
        if behind > 0:
            skipped = math.ceil(behind / interval)
            next_at += skipped * interval
            conditions.observe("tick overran the interval", ("overrun",), skipped_ticks=skipped)
        else:
            conditions.clear(("overrun",))
        await wait_or_stop(stop, next_at - loop.time())


def _cluster_shares(outcome: TargetDecision) -> dict[str, int]:
    """Each mapped cluster's share of the only target's traffic as applied, in whole points
    (its refs' together); none while the target holds no traffic."""
    total = sum(outcome.applied.values())
    if total <= 0:
        return {}
    shares: dict[str, float] = {}
    for ref in outcome.target.refs:
        if ref.cluster is not None:
            share = 100.0 * outcome.applied.get(ref.name, 0) / total
            shares[ref.cluster] = shares.get(ref.cluster, 0.0) + share
    return {cluster: round(share) for cluster, share in shares.items()}


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep that a shutdown cuts short."""
    if seconds <= 0:
        return
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


__all__ = ["ClusterView", "Reconciler", "TickReport", "wait_or_stop"]
