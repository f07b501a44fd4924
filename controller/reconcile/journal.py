"""The log lines of a tick, composed in one place from the previous and the current
``TickReport`` (structlog's canonical lines): what changed is logged once, at info or above;
what persists is a condition (``conditions.Conditions``: logged when it starts, now and then
while it lasts, and when it ends); the rest is at debug, and a periodic summary shows the state
of a quiet controller. Every event is in the event catalogue (``manifests/RUNBOOKS.md``).

Lines about a failure that is not in the report (an exception, with its traceback) are logged
by the stage that caught it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import structlog

from controller import logs, render
from controller.conditions import Conditions
from controller.model import ClusterHealth, Mode, Reason, TargetDecision, Write
from controller.settings import LogSettings
from controller.state import ClusterView, TargetView, TickReport

log = structlog.get_logger("controller.journal")

POD_MISSES_TO_LOG = 2  # a usable cluster's pod that fails this many ticks in a row is logged


class Journal:
    def __init__(self, settings: LogSettings, conditions: Conditions, clock: Callable[[], float]):
        self._every = settings.summary_interval
        self._conditions = conditions
        self._clock = clock
        self._last_summary: float | None = None
        self._engines: dict[str, str] = {}  # the engine each cluster's pages were last read by
        self._shown: dict[str, tuple[object, ...]] = {}  # each cluster's last status_key
        self._misses: dict[tuple[str, str, str], int] = {}  # a usable cluster's pods, in a row

    def write(self, previous: TickReport, current: TickReport) -> None:
        for name, cluster in current.clusters.items():
            before = previous.clusters.get(name)
            self._health(name, before.health if before else None, cluster)
            self._pods(name, cluster)
            self._engine(name, cluster)
        self._engines = {n: e for n, e in self._engines.items() if n in current.clusters}
        failing = self._pod_keys(current)
        self._misses = {key: n for key, n in self._misses.items() if key in failing}
        self._conditions.retain(("pod",), failing)
        self._conditions.retain(("lb",), self._balanced_keys(current))
        self._conditions.retain(("read past",), self._notice_keys(current))
        for target in current.targets.values():
            self._control(target)
        for target in current.targets.values():
            self._write(target, current)
        for prefix in ("fail static", "control", "write", "weigh"):
            self._conditions.retain((prefix,), {(prefix, key) for key in current.targets})
        summary = self._summary_due()
        self._statuses(previous, current, summary)
        if summary:
            for target in current.targets.values():
                log.info("target summary", **render.summary_fields(target))

    # ---- clusters ----------------------------------------------------------------------------
    def _health(self, name: str, before: ClusterHealth | None, view: ClusterView) -> None:
        after, metrics = view.health, view.metrics
        if after is None or not after.changed:
            return
        if after.healthy and before is None:
            log.info("cluster healthy", cluster=name, successes=after.successes)
        elif after.healthy:
            log.info("cluster healthy again", cluster=name, successes=after.successes)
        else:
            errors = metrics.errors if metrics else ()
            log.warning(
                "cluster unhealthy",
                cluster=name,
                reason=after.reason.value if after.reason else None,
                detail=errors[0].detail if errors else None,
                failures=after.failures,
                timeouts=after.timeouts,
                failing_pods=[e.url for e in errors],
            )

    def _engine(self, name: str, view: ClusterView) -> None:
        """Which engine a cluster's pages are read by: said once when found, and again when it
        changes (a rollout to another engine, or pods of a second one joining)."""
        engine = view.metrics.engine if view.metrics else None
        before = self._engines.get(name)
        if engine is None or engine == before:
            return
        self._engines[name] = engine
        log.info("cluster engine", cluster=name, engine=engine, was=before)

    def _pods(self, name: str, view: ClusterView) -> None:
        """While a cluster stays usable, each of its failing pods is a condition of its own.
        A URL that answers as several processes is one whatever the cluster's health: it is
        a configuration to fix, and the line says which URL."""
        for error in view.metrics.errors if view.metrics else ():
            if error.reason is Reason.LOAD_BALANCED:
                self._conditions.observe(
                    "url serves several processes",
                    ("lb", name, error.url),
                    cluster=name,
                    pod=error.url,
                    detail=error.detail,
                )
        for notice in view.metrics.notices if view.metrics else ():
            self._conditions.observe(
                "page read past",
                ("read past", name, notice.url, notice.reason),
                once=True,
                cluster=name,
                pod=notice.url,
                reason=notice.reason.value,
                detail=notice.detail,
            )
        if view.health is None or not view.health.healthy or view.metrics is None:
            return
        for error in {e.url: e for e in reversed(view.metrics.errors)}.values():
            # a pod's miss is said from its second in a row (a probe's failureThreshold): 2
            # pods of 50 missing at random each tick wrote 4 lines a cluster a tick, 28,000
            # an hour for 20 clusters (found by an attack); the counters have every miss
            key = ("pod", name, error.url)
            self._misses[key] = misses = self._misses.get(key, 0) + 1
            if misses < POD_MISSES_TO_LOG:
                continue
            self._conditions.observe(
                "pod failing",
                key,
                cluster=name,
                pod=error.url,
                reason=error.reason.value,
                detail=error.detail,
            )

    @staticmethod
    def _pod_keys(report: TickReport) -> set[tuple[str, str, str]]:
        return {
            ("pod", name, error.url)
            for name, view in report.clusters.items()
            if view.health is not None and view.health.healthy and view.metrics is not None
            for error in view.metrics.errors
        }

    @staticmethod
    def _notice_keys(report: TickReport) -> set[tuple[str, str, str, Reason]]:
        return {
            ("read past", name, notice.url, notice.reason)
            for name, view in report.clusters.items()
            for notice in (view.metrics.notices if view.metrics else ())
        }

    @staticmethod
    def _balanced_keys(report: TickReport) -> set[tuple[str, str, str]]:
        return {
            ("lb", name, error.url)
            for name, view in report.clusters.items()
            for error in (view.metrics.errors if view.metrics else ())
            if error.reason is Reason.LOAD_BALANCED
        }

    def _statuses(self, previous: TickReport, current: TickReport, summary: bool) -> None:
        """A cluster's status line at info when it changes (health, reason, pods) and in the
        periodic summary; at debug on every other tick (built only when debug is on)."""
        debug = logs.enabled(log, logging.DEBUG)
        shown = {}
        for name, view in current.clusters.items():
            shown[name] = key = render.status_key(view)
            before = self._shown.get(name)
            if before is None and name in previous.clusters:  # a journal that joins late
                before = render.status_key(previous.clusters[name])
            if before != key:
                log.info("cluster status", **render.status_fields(name, view))
            elif summary:
                log.info("cluster status", **render.status_fields(name, view), summary=True)
            elif debug:
                log.debug("cluster status", **render.status_fields(name, view))
        self._shown = shown

    def _summary_due(self) -> bool:
        now = self._clock()
        if self._last_summary is None:
            self._last_summary = now
        if self._every > 0 and now - self._last_summary >= self._every:
            self._last_summary = now
            return True
        return False

    # ---- targets -----------------------------------------------------------------------------
    def _control(self, view: TargetView) -> None:
        """Fail static, and an operator's hand on a target (pause, pin, freeze): one line when
        it starts and one when it ends, with how long it lasted."""
        outcome = view.outcome
        key, decision = outcome.target.key, outcome.decision
        note = decision.notes[0] if decision.notes else None
        if decision.mode is Mode.FAIL_STATIC:
            self._conditions.observe(
                "fail static",
                ("fail static", key),
                "error",
                target=key,
                note=note,
                weights=dict(outcome.held),
            )
        else:
            self._conditions.clear(("fail static", key))
        # a hold that changes (a pin for a pause, a new note, a pin ignored) ends the one
        # before and is said (``renew``): one condition for all of them said none of the
        # changes and ended with the first's name (found by an attack)
        control = ("control", key)
        if decision.mode is Mode.PAUSED:
            self._conditions.observe(
                "target paused", control, "info", renew=True, target=key, note=note
            )
        elif decision.mode is Mode.PINNED:
            weights = dict(decision.weights or {})
            self._conditions.observe(
                "target pinned", control, "info", renew=True, target=key, weights=weights
            )
        elif decision.mode is Mode.FROZEN:
            self._conditions.observe(
                "target frozen", control, "info", renew=True, target=key, note=note
            )
        else:
            self._conditions.clear(control)

    def _write(self, view: TargetView, report: TickReport) -> None:
        """One line per change of a target's weights, with what drove it; a write that keeps
        failing is one condition (logged when it starts and ends), not a line per tick."""
        outcome = view.outcome
        key = ("write", outcome.target.key)
        if outcome.write in (Write.DONE, Write.WOULD, Write.NONE):
            self._conditions.clear(key)
        if outcome.write is Write.DONE:
            log.info("weights written", **render.change_fields(outcome, report.clusters))
        elif outcome.write is Write.WOULD:
            log.info("would write", **render.change_fields(outcome, report.clusters))
        elif outcome.write is Write.REFUSED:
            self._conditions.observe("write refused", key, "error", **_failure(outcome))
        elif outcome.write in (Write.FAILED, Write.CONFLICT):
            self._conditions.observe("write failed", key, **_failure(outcome))


def _failure(outcome: TargetDecision) -> dict[str, Any]:
    return {
        "target": outcome.target.key,
        "reason": outcome.reason,
        "detail": outcome.detail,
        "wanted": render.change(outcome.held, outcome.desired),
    }
