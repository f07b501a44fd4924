"""The reconcile loop: one tick fetches every cluster, judges health, weighs and publishes.

Ticks never overlap and do not drift: each starts on the interval grid, and a tick that overran
skips the slots it missed instead of bunching up. Every fetch runs under the tick deadline and
one cluster's failure stays that cluster's.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import structlog

from controller import health, weights
from controller.exporter import ClusterView, ControllerMetrics, Snapshot
from controller.model import ClusterHealth, ClusterMetrics, Decision, Mode, Reason, Signals
from controller.publish import Publisher
from controller.settings import ClusterSettings, Settings
from controller.sources import ClusterMetricsSource

log = structlog.get_logger("controller.loop")

# A tick must leave room for publishing and for the next one to start on time.
DEADLINE_SHARE = 0.8
# Readings the KV forecast fits its slope to: enough to average out noise, few enough to turn.
FORECAST_POINTS = 3


@dataclass(frozen=True, slots=True)
class TickReport:
    tick: int
    clusters: Mapping[str, ClusterView]
    decision: Decision
    duration: float


def signals_of(state: ClusterHealth, quantile: str) -> Signals | None:
    """What weighting may use of a cluster: nothing unless it is healthy."""
    metrics = state.signals
    if not state.healthy or metrics is None or metrics.kv_mean is None:
        return None
    latency = None
    if metrics.latency is not None:
        latency = {"p50": metrics.latency.p50, "p90": metrics.latency.p90}.get(
            quantile, metrics.latency.mean
        )
    return Signals(kv=metrics.kv_mean, queue_per_pod=metrics.queue_per_pod, latency=latency)


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
        self._kv_history: dict[str, deque[tuple[float, float]]] = {}
        self._in_force: dict[str, int] | None = None
        self._tick = 0
        for name in self._sources:
            snapshot.clusters.setdefault(name, ClusterView())
            metrics.add_cluster(name)
        for stage in ("discover", "fetch", "publish", "tick"):
            metrics.reconcile_errors.labels(stage)

    @property
    def in_force(self) -> Mapping[str, int] | None:
        return self._in_force

    async def tick(self) -> TickReport:
        self._tick += 1
        began = time.perf_counter()
        with structlog.contextvars.bound_contextvars(tick=self._tick):
            await self._discover()
            fetched = await asyncio.gather(*(self._fetch(s) for s in self._sources.values()))
            now = self._clock()
            for metrics in fetched:
                self._judge(metrics, now)
            inputs = self._inputs()
            decision = self._decide(inputs)
            await self._publish(inputs, decision)
            self._record(decision, began)
            self._log_tick(decision)
        report = TickReport(
            self._tick, dict(self._snapshot.clusters), decision, self._elapsed(began)
        )
        if self._on_tick is not None:
            self._on_tick(report)
        return report

    @staticmethod
    def _elapsed(began: float) -> float:
        return time.perf_counter() - began

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
            log.exception("fetch raised", cluster=source.cluster)
            return ClusterMetrics.failed(source.cluster, self._clock(), Reason.INTERNAL, repr(exc))

    def _judge(self, metrics: ClusterMetrics, now: float) -> None:
        name = metrics.cluster
        self._metrics.count_fetch(metrics)
        before = self._health.get(name)
        after = health.judge(
            before, metrics, self._settings.health, self._settings.scrape.min_pod_fraction, now
        )
        self._health[name] = after
        self._remember(name, metrics, after.healthy and after.signals is metrics)
        clusters = self._snapshot.clusters
        clusters[name] = replace(clusters[name], metrics=metrics, health=after)
        if after.changed:
            self._metrics.health_transitions.labels(name, _word(after.healthy)).inc()
            self._log_transition(name, before, after, metrics)

    def _log_transition(
        self,
        name: str,
        before: ClusterHealth | None,
        after: ClusterHealth,
        metrics: ClusterMetrics,
    ) -> None:
        if after.healthy:
            event = "cluster healthy" if before is None else "cluster healthy again"
            log.info(event, cluster=name, successes=after.successes)
            return
        detail = metrics.errors[0].detail if metrics.errors else None
        log.warning(
            "cluster unhealthy",
            cluster=name,
            reason=after.reason.value if after.reason else None,
            failures=after.failures,
            detail=detail,
        )

    async def _discover(self) -> None:
        """Let the publisher name clusters beyond the configured ones; keep them in sync."""
        try:
            async with asyncio.timeout(self._settings.interval * DEADLINE_SHARE):
                defined = {c.name: c for c in await self._publisher.discover()}
        except Exception:  # discovery failing must not stop scraping what we know
            self._metrics.reconcile_errors.labels("discover").inc()
            log.exception("discovery failed")
            return
        defined = {n: c for n, c in defined.items() if n not in self._static}
        if defined == self._dynamic or self._source_factory is None:
            return
        for name in self._dynamic.keys() - defined.keys():
            log.info("cluster no longer referenced", cluster=name)
            self._drop(name)
        for name, cluster in defined.items():
            if self._dynamic.get(name) != cluster:
                log.info("watching cluster defined by annotations", cluster=name)
                self._sources[name] = self._source_factory(cluster)
                self._snapshot.clusters.setdefault(name, ClusterView())
                self._metrics.add_cluster(name)
        self._dynamic = defined

    def _drop(self, name: str) -> None:
        self._sources.pop(name, None)
        self._health.pop(name, None)
        self._snapshot.clusters.pop(name, None)
        if self._in_force is not None:
            self._in_force.pop(name, None)

    def _inputs(self) -> dict[str, Signals | None]:
        quantile = self._settings.weights.latency_quantile
        horizon = float(self._settings.weights.forecast_horizon)
        inputs = {name: signals_of(state, quantile) for name, state in self._health.items()}
        if horizon <= 0:
            return inputs
        for name, signals in inputs.items():
            history = self._kv_history.get(name)
            # Two noisy points make a wild slope: forecast only from a full window.
            if signals is not None and history and len(history) == FORECAST_POINTS:
                inputs[name] = replace(signals, kv=weights.forecast_kv(history, horizon))
        return inputs

    def _remember(self, name: str, metrics: ClusterMetrics, good: bool) -> None:
        """Keep the last few good KV readings of each cluster for the forecast."""
        history = self._kv_history.setdefault(name, deque(maxlen=FORECAST_POINTS))
        if good and metrics.kv_mean is not None:
            history.append((metrics.scraped_at, metrics.kv_mean))
        elif not good:
            history.clear()  # after a gap, do not extrapolate across it

    def _decide(self, inputs: Mapping[str, Signals | None]) -> Decision:
        decision = weights.decide(inputs, self._in_force, self._settings.weights)
        if decision.mode is Mode.FAIL_STATIC:
            log.error("fail static", note=decision.notes[0], weights=_format(decision.weights))
        return decision

    async def _publish(self, inputs: Mapping[str, Signals | None], decision: Decision) -> None:
        try:
            await self._publisher.publish(inputs, decision)
        except Exception:  # the weights in force stay the old ones; next tick tries again
            self._metrics.reconcile_errors.labels("publish").inc()
            log.exception("publish failed", weights=_format(decision.weights))
            return
        if not decision.changed or decision.weights is None:
            return
        self._in_force = dict(decision.weights)
        self._snapshot.last_change_wall = self._clock()
        self._metrics.weight_updates.inc()
        log.info("weights changed", mode=decision.mode.value, weights=_format(decision.weights))

    def _record(self, decision: Decision, began: float) -> None:
        clusters = self._snapshot.clusters
        for name, view in clusters.items():
            weight = self._in_force.get(name) if self._in_force else None
            clusters[name] = replace(view, weight=weight, target=decision.targets.get(name))
        self._snapshot.decision = decision
        self._snapshot.ticks = self._tick
        self._snapshot.last_tick_monotonic = time.monotonic()
        self._snapshot.last_tick_wall = self._clock()
        self._metrics.reconcile_duration.observe(self._elapsed(began))
        self._metrics.last_reconcile.set(self._snapshot.last_tick_wall)

    def _log_tick(self, decision: Decision) -> None:
        for name, view in self._snapshot.clusters.items():
            log.info("cluster status", **status_fields(name, view), mode=decision.mode.value)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on the interval grid until ``stop`` is set; an exception costs one tick only."""
        loop = asyncio.get_running_loop()
        interval = self._settings.interval
        next_at = loop.time()
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                self._metrics.reconcile_errors.labels("tick").inc()
                log.exception("tick failed")
            next_at += interval
            behind = loop.time() - next_at
            if behind > 0:
                skipped = math.ceil(behind / interval)
                next_at += skipped * interval
                log.warning("tick overran the interval", skipped_ticks=skipped)
            await wait_or_stop(stop, next_at - loop.time())


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


def _format(values: Mapping[str, int] | None) -> str:
    return " ".join(f"{n}={w}" for n, w in sorted((values or {}).items()))


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
        "pods": f"{m.pods_answering}/{m.pods_scraped}" if m else None,
        "healthy": h.healthy if h else None,
        "reason": h.reason.value if h and h.reason else None,
        "weight": view.weight,
    }
