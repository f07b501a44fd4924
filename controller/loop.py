"""The reconcile loop. One tick reads top to bottom:

    discover  the routing targets the publisher knows (or the implicit one) and extra clusters
    read      every cluster's signals, each under the tick deadline
    judge     each cluster's health from its fetch
    weigh     every target, once, with ``weights.weigh`` from what it holds now
    publish   what changed, through the publisher (a conflict is weighed again from a fresh read)
    record    the snapshot behind /metrics, /debug/state and status, and the log lines

Ticks never overlap and do not drift: each starts on the interval grid, and a tick that overran
skips the slots it missed instead of bunching up. One cluster's failure stays that cluster's,
and one target's failure stays that target's.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from controller import health, signals, weights
from controller.exporter import ClusterView, ControllerMetrics, Snapshot, TargetView, only_target
from controller.logs import Conditions
from controller.model import (
    IMPLICIT_TARGET,
    ClusterHealth,
    ClusterMetrics,
    Decision,
    Mode,
    Reason,
    Ref,
    Signals,
    Target,
    TargetDecision,
    Write,
    WriteResult,
)
from controller.publish import Discovery, Publisher
from controller.settings import ClusterSettings, Settings
from controller.sources import ClusterMetricsSource

log = structlog.get_logger("controller.loop")

# A tick must leave room for publishing and for the next one to start on time.
DEADLINE_SHARE = 0.8
REALISED_MIN_REQUESTS = 50  # fewer requests in the window say nothing about a split


@dataclass(frozen=True, slots=True)
class TickReport:
    tick: int
    clusters: Mapping[str, ClusterView]
    targets: Mapping[str, TargetView]
    duration: float

    @property
    def only(self) -> TargetView | None:
        """The one target, when there is exactly one (the implicit target is one)."""
        return only_target(self.targets)


@dataclass(slots=True)
class _Memory:
    """What the loop remembers of one target between ticks.

    ``shadow`` is what a dry run would have applied, and ``seeded_from`` what the object held
    then: while the object still holds that, the next decision continues from the shadow (so a
    dry run moves as a live run would); once someone changes the object, from the object."""

    shadow: dict[str, int] | None = None
    seeded_from: dict[str, int] | None = None
    refused: tuple[dict[str, int], WriteResult] | None = None  # a schema rejection, kept
    last_write: float | None = None
    last_change: float | None = None
    # (time, requests served per mapped ref, share intended per mapped ref), oldest first
    served: deque[tuple[float, dict[str, float], dict[str, float]]] = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class _Plan:
    """One target weighed: as found, as in force, and what it should hold."""

    found: Target
    target: Target
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
        source_factory: Callable[[ClusterSettings], ClusterMetricsSource] | None = None,
    ) -> None:
        self._settings = settings
        self._on_tick = on_tick
        self._sources = {source.cluster: source for source in sources}
        self._static = set(self._sources)
        self._dynamic: dict[str, ClusterSettings] = {}
        self._source_factory = source_factory
        self._publisher = publisher
        self._metrics = metrics
        self._snapshot = snapshot
        self._clock = clock
        self._health: dict[str, ClusterHealth] = {}
        self._signal_memory: dict[str, signals.SignalMemory] = {}
        self._in_system: dict[str, float] = {}  # running + waiting at the last good fetch
        self._arrived: dict[str, float | None] = {}  # requests that arrived since then
        settle = settings.weights.settle
        self._settle = 2 * settings.interval if settle is None else float(settle)
        self._memory: dict[str, _Memory] = {}
        self._tick = 0
        self._conditions = Conditions(log, settings.log.repeat_interval, clock)
        self._shown: dict[str, tuple[object, ...]] = {}  # last logged status per cluster
        self._last_summary: float | None = None
        for name in self._sources:
            snapshot.clusters.setdefault(name, ClusterView())
            metrics.add_cluster(name)
        for stage in ("discover", "fetch", "publish", "tick"):
            metrics.reconcile_errors.labels(stage)

    @property
    def targets(self) -> Mapping[str, TargetView]:
        """Every target after the last tick."""
        return self._snapshot.targets

    async def tick(self) -> TickReport:
        self._tick += 1
        began = time.perf_counter()
        with structlog.contextvars.bound_contextvars(tick=self._tick):
            found = await self._discover()
            fetched = await asyncio.gather(*(self._fetch(s) for s in self._sources.values()))
            self._judge(fetched)
            signals = self._inputs()
            plans = [self._weigh(self._in_force(t), t, signals) for t in self._targets(found)]
            outcomes = [await self._publish(plan, signals) for plan in plans]
            self._record(outcomes, began)
            self._log_tick()
        report = TickReport(
            self._tick,
            dict(self._snapshot.clusters),
            dict(self._snapshot.targets),
            self._elapsed(began),
        )
        if self._on_tick is not None:
            self._on_tick(report)
        return report

    @staticmethod
    def _elapsed(began: float) -> float:
        return time.perf_counter() - began

    # ---- discover ----------------------------------------------------------------------------
    async def _discover(self) -> Discovery:
        """The publisher's targets; clusters it names beyond the configured ones are watched."""
        try:
            async with asyncio.timeout(self._settings.interval * DEADLINE_SHARE):
                found = await self._publisher.discover()
        except Exception:  # discovery failing must not stop scraping what we know
            self._metrics.reconcile_errors.labels("discover").inc()
            self._conditions.observe("discovery failed", ("discover",), "error", exc_info=True)
            return Discovery(tuple(v.outcome.target for v in self._snapshot.targets.values()))
        self._conditions.clear(("discover",))
        self._snapshot.refused = dict(found.refused)
        self._snapshot.kubernetes = (found.reachable, found.error)
        self._watch({c.name: c for c in found.clusters if c.name not in self._static})
        return found

    def _watch(self, defined: dict[str, ClusterSettings]) -> None:
        if defined == self._dynamic or self._source_factory is None:
            return
        for name in self._dynamic.keys() - defined.keys():
            log.info("cluster no longer referenced", cluster=name)
            self._sources.pop(name, None)
            self._health.pop(name, None)
            self._arrived.pop(name, None)
            self._in_system.pop(name, None)
            self._signal_memory.pop(name, None)
            self._snapshot.clusters.pop(name, None)
        for name, cluster in defined.items():
            if self._dynamic.get(name) != cluster:
                log.info("watching cluster defined by annotations", cluster=name)
                self._sources[name] = self._source_factory(cluster)
                self._snapshot.clusters.setdefault(name, ClusterView())
                self._metrics.add_cluster(name)
        self._dynamic = defined

    def _targets(self, found: Discovery) -> Sequence[Target]:
        """The published-to targets; with none, one implicit target over every cluster."""
        if found.targets:
            return found.targets
        memory = self._memory.get(IMPLICIT_TARGET)
        held = memory.shadow if memory and memory.shadow else {}
        refs = tuple(Ref("", "", name, held.get(name, 0), name) for name in self._sources)
        return (Target(IMPLICIT_TARGET, "", IMPLICIT_TARGET, "", "", refs),)

    def _in_force(self, target: Target) -> Target:
        """``target`` holding what is in force: the object's weights, or a dry run's shadow."""
        memory = self._memory.get(target.key)
        if memory is None or memory.shadow is None or memory.seeded_from != target.weights:
            return target
        return target.holding(memory.shadow)

    # ---- read and judge ----------------------------------------------------------------------
    async def _fetch(self, source: ClusterMetricsSource) -> ClusterMetrics:
        deadline = self._settings.interval * DEADLINE_SHARE
        try:
            async with asyncio.timeout(deadline):
                return await source.fetch()
        except TimeoutError:
            detail = f"tick deadline {deadline:g}s passed"
            return ClusterMetrics.failed(source.cluster, self._clock(), Reason.TIMEOUT, detail)
        except Exception as exc:  # a bug in one source must not take the others down
            self._metrics.reconcile_errors.labels("fetch").inc()
            key = ("fetch", source.cluster)
            self._conditions.observe(
                "fetch raised", key, "error", cluster=source.cluster, exc_info=True
            )
            return ClusterMetrics.failed(
                source.cluster,
                self._clock(),
                Reason.INTERNAL,
                f"{type(exc).__name__} (the log has the traceback)",
            )

    def _judge(self, fetched: Sequence[ClusterMetrics]) -> None:
        now = self._clock()
        for metrics in fetched:
            self._judge_one(metrics, now)

    def _judge_one(self, metrics: ClusterMetrics, now: float) -> None:
        name = metrics.cluster
        self._metrics.count_fetch(metrics)
        before = self._health.get(name)
        after = health.judge(
            before, metrics, self._settings.health, self._settings.scrape.min_pod_fraction, now
        )
        self._health[name] = after
        self._count_arrivals(name, metrics)
        self._signal_memory[name] = signals.remember(
            self._signal_memory.get(name), metrics, after, self._settings.weights.demand_smoothing
        )
        clusters = self._snapshot.clusters
        clusters[name] = replace(clusters[name], metrics=metrics, health=after)
        if not any(e.reason is Reason.INTERNAL for e in metrics.errors):
            self._conditions.clear(("fetch", name))
        if after.changed:
            self._metrics.health_transitions.labels(name, _word(after.healthy)).inc()
            self._log_transition(name, before, after, metrics)
        self._log_pods(name, after, metrics)

    def _log_transition(
        self,
        name: str,
        before: ClusterHealth | None,
        after: ClusterHealth,
        metrics: ClusterMetrics,
    ) -> None:
        if after.healthy and before is None:
            log.info("cluster healthy", cluster=name, successes=after.successes)
        elif after.healthy:
            log.info("cluster healthy again", cluster=name, successes=after.successes)
        else:
            first = metrics.errors[0] if metrics.errors else None
            log.warning(
                "cluster unhealthy",
                cluster=name,
                reason=after.reason.value if after.reason else None,
                detail=first.detail if first else None,
                failures=after.failures,
                failing_pods=[e.url for e in metrics.errors],
            )

    def _log_pods(self, name: str, after: ClusterHealth, metrics: ClusterMetrics) -> None:
        """While a cluster stays usable, each of its failing pods is a condition of its own."""
        failing = set()
        if after.healthy:
            for error in metrics.errors:
                key = ("pod", name, error.url)
                failing.add(key)
                self._conditions.observe(
                    "pod failing",
                    key,
                    cluster=name,
                    pod=error.url,
                    reason=error.reason.value,
                    detail=error.detail,
                )
        self._conditions.retain(("pod", name), failing)

    def _count_arrivals(self, name: str, metrics: ClusterMetrics) -> None:
        """Requests that reached the cluster since its last fetch: the ones that completed
        (the latency histogram's count) plus the growth of those still running or waiting.
        Completions alone undercount a saturated cluster, which finishes only what it can."""
        latency = metrics.latency
        if latency is None:
            self._arrived[name] = None
            return
        in_system = None
        if metrics.running is not None and metrics.queue_depth is not None:
            in_system = metrics.running + metrics.queue_depth
        before = self._in_system.get(name)
        growth = in_system - before if in_system is not None and before is not None else 0.0
        self._arrived[name] = max(0.0, latency.requests + growth)
        if in_system is not None:
            self._in_system[name] = in_system

    def _inputs(self) -> dict[str, Signals | None]:
        params = self._settings.weights
        return {
            name: signals.derive(state, self._signal_memory.get(name), params)
            for name, state in self._health.items()
        }

    # ---- weigh -------------------------------------------------------------------------------
    def _weigh(self, target: Target, found: Target, signals: Mapping[str, Signals | None]) -> _Plan:
        """The one place a target's weights are decided: ``weights.weigh`` on what it holds."""
        params = self._settings.weights
        memory = self._memory.get(found.key)
        settling = (
            memory is not None
            and memory.last_change is not None
            and self._clock() - memory.last_change < self._settle
        )
        desired, decision = weights.weigh(target, signals, params, settling)
        if decision.mode is Mode.FAIL_STATIC:
            self._conditions.observe(
                "fail static",
                ("fail static", found.key),
                "error",
                target=found.key,
                note=decision.notes[0],
                weights=target.weights,
            )
        else:
            self._conditions.clear(("fail static", found.key))
        self._log_control(found.key, decision)
        return _Plan(found, target, desired, decision)

    def _log_control(self, key: str, decision: Decision) -> None:
        """An operator's hand on a target (pause, pin, freeze): one line when it starts and
        one when it ends, with how long it lasted."""
        control = ("control", key)
        note = decision.notes[0] if decision.notes else None
        if decision.mode is Mode.PAUSED:
            self._conditions.observe("target paused", control, "info", target=key, note=note)
        elif decision.mode is Mode.PINNED:
            self._conditions.observe(
                "target pinned", control, "info", target=key, weights=dict(decision.weights or {})
            )
        elif decision.mode is Mode.FROZEN:
            self._conditions.observe("target frozen", control, "info", target=key, note=note)
        else:
            self._conditions.clear(control)

    # ---- publish -----------------------------------------------------------------------------
    async def _publish(self, plan: _Plan, signals: Mapping[str, Signals | None]) -> TargetDecision:
        """Write what changed; after a conflict, weigh again from the fresh read and retry."""
        result = WriteResult(Write.NONE, plan.target)
        for _ in range(self._settings.kubernetes.write_retries):
            if plan.desired == plan.target.weights:
                result = WriteResult(Write.NONE, plan.target)
                break
            result = await self._write(plan)
            if result.write is not Write.CONFLICT or result.target is None:
                break
            plan = self._weigh(result.target, result.target, signals)
        else:
            result = replace(
                result, detail="the object changed under every attempt", reason="conflict"
            )
        if result.write not in (Write.NONE, Write.FOLLOWER):
            self._metrics.add_target(plan.found.key)
            self._metrics.target_writes.labels(plan.found.key, result.write.value).inc()
        return self._settled(plan, result)

    async def _write(self, plan: _Plan) -> WriteResult:
        why = f"{plan.decision.mode.value}: {_change(plan.target.weights, plan.desired)}"
        if plan.target.kind == IMPLICIT_TARGET:  # nothing holds it but us
            return WriteResult(Write.WOULD, plan.target.holding(plan.desired))
        memory = self._memory.setdefault(plan.found.key, _Memory())
        if memory.refused is not None and memory.refused[0] == plan.desired:
            return memory.refused[1]  # the schema refused exactly this: do not send it again
        result = await self._send(plan, why)
        schema = result.write is Write.REFUSED and result.reason == "schema"
        memory.refused = (dict(plan.desired), result) if schema else None
        return result

    async def _send(self, plan: _Plan, why: str) -> WriteResult:
        try:
            return await self._publisher.write(plan.target, plan.desired, why)
        except Exception as exc:  # one target's failure must not stop the others
            self._metrics.reconcile_errors.labels("publish").inc()
            key = ("publish", plan.found.key)
            self._conditions.observe(
                "publish raised", key, "error", target=plan.found.key, exc_info=True
            )
            return WriteResult(Write.FAILED, plan.target, type(exc).__name__, "internal")

    def _settled(self, plan: _Plan, result: WriteResult) -> TargetDecision:
        """What the target holds after the write, remembered for the next tick."""
        key = plan.found.key
        memory = self._memory.setdefault(key, _Memory())
        now = self._clock()
        applied = (result.target or plan.target).weights
        if result.write is Write.WOULD:
            applied = dict(plan.desired)
            memory.shadow, memory.seeded_from = applied, plan.found.weights
        elif result.write is Write.DONE:
            memory.shadow = memory.seeded_from = None
            memory.last_write = now
        if result.write in (Write.WOULD, Write.DONE):
            memory.last_change = now
        self._log_write(plan, result)
        target = result.target or plan.target
        return TargetDecision(
            target, plan.desired, applied, plan.decision, result.write, result.detail
        )

    def _log_write(self, plan: _Plan, result: WriteResult) -> None:
        """One line per change of a target's weights, with what drove it; a write that keeps
        failing is one condition (logged when it starts and ends), not a line per tick."""
        key = ("write", plan.found.key)
        if result.write in (Write.DONE, Write.WOULD, Write.NONE):
            self._conditions.clear(key)
        if result.write in (Write.DONE, Write.WOULD):
            fields = self._change_fields(plan, result)
            if result.write is Write.DONE:
                log.info("weights written", **fields)
            else:
                log.info("would write", **fields)
        elif result.write is Write.REFUSED:
            self._conditions.observe("write refused", key, "error", **self._failure(plan, result))
        elif result.write in (Write.FAILED, Write.CONFLICT):
            self._conditions.observe("write failed", key, **self._failure(plan, result))

    @staticmethod
    def _failure(plan: _Plan, result: WriteResult) -> dict[str, Any]:
        return {
            "target": plan.found.key,
            "reason": result.reason,
            "detail": result.detail,
            "wanted": _change(plan.target.weights, plan.desired),
        }

    def _change_fields(self, plan: _Plan, result: WriteResult) -> dict[str, object]:
        before, after = plan.target.weights, plan.desired
        factors = {}
        for ref in plan.target.refs:
            state = self._health.get(ref.cluster or "")
            metrics = state.metrics if state and state.healthy else None
            factors[ref.name] = {
                "cluster": ref.cluster,
                "healthy": bool(state and state.healthy),
                "kv": _rounded(metrics.kv_mean) if metrics else None,
                "queue_per_pod": _rounded(metrics.queue_per_pod, 2) if metrics else None,
                "score": _rounded(plan.decision.scores.get(ref.name)),
            }
        return {
            "target": plan.found.key,
            "mode": plan.decision.mode.value,
            "write": result.write.value,
            "change": _change(before, after),
            "weights_from": dict(before),
            "weights_to": dict(after),
            "factors": factors,
        }

    # ---- record ------------------------------------------------------------------------------
    def _record(self, outcomes: Sequence[TargetDecision], began: float) -> None:
        views = {}
        for outcome in outcomes:
            if outcome.write is Write.GONE:
                self._memory.pop(outcome.key, None)
                continue
            memory = self._memory.setdefault(outcome.key, _Memory())
            realised, intended = self._realised(memory, outcome)
            views[outcome.key] = TargetView(
                outcome, memory.last_write, memory.last_change, realised, intended
            )
        for key in self._memory.keys() - views.keys():
            del self._memory[key]
        self._snapshot.targets = views
        only = only_target(views)
        for name, view in self._snapshot.clusters.items():
            share = _cluster_share(only.outcome, name) if only is not None else None
            self._snapshot.clusters[name] = replace(view, weight=share)
        self._snapshot.ticks = self._tick
        self._snapshot.last_tick_monotonic = time.monotonic()
        self._snapshot.last_tick_wall = self._clock()
        self._metrics.reconcile_duration.observe(self._elapsed(began))
        self._metrics.last_reconcile.set(self._snapshot.last_tick_wall)

    def _realised(
        self, memory: _Memory, outcome: TargetDecision
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Realised and intended shares of ``outcome``'s mapped refs over the window.

        Each tick adds the requests that reached every mapped ref's cluster since its last
        scrape (``_count_arrivals``) beside the share the weights in force gave it. A tick
        where a cluster that holds weight has no count (its scrape failed) is left out rather
        than read as 0."""
        now = self._clock()
        window = self._settings.weights.realised_window
        served = memory.served
        while served and served[0][0] <= now - window:
            served.popleft()
        mapped = {ref: c for ref, c in outcome.target.clusters.items() if c is not None}
        weights = {ref: outcome.applied.get(ref, 0) for ref in mapped}
        total = sum(weights.values())
        counts: dict[str, float] = {}
        for ref, cluster in mapped.items():
            arrived = self._arrived.get(cluster)
            if arrived is None:
                if weights[ref] > 0:
                    counts = {}
                    break
                continue
            counts[ref] = arrived
        if counts and total > 0:
            shares = {ref: 100.0 * w / total for ref, w in weights.items()}
            served.append((now, counts, shares))
        requests: dict[str, float] = {}
        intended: dict[str, float] = {}
        for _, tick_counts, tick_shares in served:
            for ref, n in tick_counts.items():
                requests[ref] = requests.get(ref, 0.0) + n
            for ref, share in tick_shares.items():
                intended[ref] = intended.get(ref, 0.0) + share / len(served)
        seen = sum(requests.values())
        if seen < REALISED_MIN_REQUESTS:
            return {}, {}
        realised = {ref: 100.0 * n / seen for ref, n in requests.items()}
        return realised, {ref: intended.get(ref, 0.0) for ref in realised}

    def _log_tick(self) -> None:
        """A cluster's status line at info when it changes (health, reason, pods) and in the
        periodic summary; at debug on every other tick. Plus one summary per target."""
        now = self._clock()
        every = self._settings.log.summary_interval
        if self._last_summary is None:
            self._last_summary = now
        summary = every > 0 and now - self._last_summary >= every
        if summary:
            self._last_summary = now
        for name, view in self._snapshot.clusters.items():
            fields = status_fields(name, view)
            shown = tuple(v for k, v in fields.items() if k in _STATUS_CHANGES)
            if self._shown.get(name) != shown:
                log.info("cluster status", **fields)
            elif summary:
                log.info("cluster status", **fields, summary=True)
            else:
                log.debug("cluster status", **fields)
            self._shown[name] = shown
        for name in self._shown.keys() - self._snapshot.clusters.keys():
            del self._shown[name]
        if summary:
            for key, target in self._snapshot.targets.items():
                outcome = target.outcome
                log.info(
                    "target summary",
                    target=key,
                    mode=outcome.decision.mode.value,
                    weights=_weights(outcome.applied),
                    applied=dict(outcome.applied),
                    desired=dict(outcome.desired),
                    write=outcome.write.value,
                    healthy_refs=sum(1 for s in outcome.decision.scores),
                    refs=len(outcome.applied),
                    last_change=target.last_change,
                )

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on the interval grid until ``stop`` is set; an exception costs one tick only."""
        loop = asyncio.get_running_loop()
        interval = self._settings.interval
        next_at = loop.time()
        while not stop.is_set():
            try:
                await self.tick()
                self._conditions.clear(("tick",))
            except Exception:
                self._metrics.reconcile_errors.labels("tick").inc()
                self._conditions.observe("tick failed", ("tick",), "error", exc_info=True)
            next_at += interval
            behind = loop.time() - next_at
            if behind > 0:
                skipped = math.ceil(behind / interval)
                next_at += skipped * interval
                self._conditions.observe(
                    "tick overran the interval", ("overrun",), skipped_ticks=skipped
                )
            else:
                self._conditions.clear(("overrun",))
            await wait_or_stop(stop, next_at - loop.time())


def _cluster_share(outcome: TargetDecision, cluster: str) -> int | None:
    """A cluster's share of the only target's traffic as applied, in whole points."""
    shares = [
        outcome.share(ref) for ref, mapped in outcome.target.clusters.items() if mapped == cluster
    ]
    known = [s for s in shares if s is not None]
    return round(sum(known)) if known else None


# The fields of a cluster's status line whose change is worth a line at info.
# (A weight change has its own line, ``weights written``/``would write``.)
_STATUS_CHANGES = ("healthy", "reason", "degraded", "pods_answering", "pods_scraped")


def _weights(values: Mapping[str, int]) -> str:
    return " ".join(f"{n}={w}" for n, w in sorted(values.items()))


def _change(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """``a=50->40 b=50->60``: the refs whose weight changes."""
    return " ".join(
        f"{n}={before.get(n)}->{w}" for n, w in sorted(after.items()) if before.get(n) != w
    )


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep that a shutdown cuts short."""
    if seconds <= 0:
        return
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


def _word(healthy: bool) -> str:
    return "healthy" if healthy else "unhealthy"


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _ms(value: float | None) -> int | None:
    return None if value is None else round(value * 1000)


def status_fields(name: str, view: ClusterView) -> dict[str, object]:
    """The per-cluster line an operator greps: ``cluster=b vram_util=0.2 ... weight=80``."""
    m, h = view.metrics, view.health
    latency = m.latency if m else None
    return {
        "cluster": name,
        "vram_util": _rounded(m.kv_mean) if m else None,
        "vram_max": _rounded(m.kv_max) if m else None,
        "queue": _rounded(m.queue_depth, 1) if m else None,
        "p50_ms": _ms(latency.p50) if latency else None,
        "p90_ms": _ms(latency.p90) if latency else None,
        "pods_answering": m.pods_answering if m else None,
        "pods_scraped": m.pods_scraped if m else None,
        "healthy": h.healthy if h else None,
        "degraded": h.degraded if h else None,
        "reason": h.reason.value if h and h.reason else None,
        "weight": view.weight,
    }
