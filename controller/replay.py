"""``weight-controller replay``: what the controller would have done over a window of the
fleet's own history, before it is let write.

Each cluster's history is read through its querier (``Querier.history``: the live daemon's
templates as range queries, at the config's interval), and the real loop (health, signals,
weights, actuation) runs a tick at each step on a virtual clock (``testing.Driver``) over
what the live source would have read then (``answers.cluster_metrics``). Nothing is written
anywhere: the loop decides for each target the controller's own record holds (or each
named), as it held it (``recorded_target``), one replay after another on the history read
once; without a record, for the implicit target over the config's clusters.

The recorded signals followed the weights that were in force then, not the replayed ones. By
default the loop is closed to first order (``Response``): each cluster's routed load (KV use,
queue, running requests, request rates) is moved with its replayed share of the traffic over
its recorded share, so a cluster the replay shed cools and is given back, as it would have
been; what a full cache cannot hold waits in the queue. That is a model, and said so: load
that no weight moves (local traffic) is moved too, and latency's quantiles are not (the
requests they are computed over are, with what completes). ``--open-loop`` feeds the
recorded signals as they were: exactly what the loop would have decided from what the
clusters showed, tick by tick, but never what its own moves would have done.

Where the controller ran over the window, its own series hold what the objects held
(``controller.recorded``): that record is the recorded split the load is moved from, and it is
set beside the replay in the summary, the plot and each ``--json`` tick. Each target is
replayed on its own: where two share clusters, each one's closed loop moves those clusters'
recorded load with its own weights, never with the other's (``SEPARATE``).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar

import aiohttp

from controller.churn import largest_step, reversals
from controller.errors import ConfigError, FetchError
from controller.model import IMPLICIT_TARGET, ClusterMetrics, Ref, Target, Write
from controller.publish import Discovery
from controller.publish.dryrun import DryRun
from controller.recorded import Found, Record, read_records
from controller.render import report_json
from controller.settings import Settings, build_settings
from controller.settings.durations import default_staleness
from controller.settings.schema import MAX_INTERVAL
from controller.sources.answers import POOL_PODS, TOKEN_PODS, Answers, Asked, cluster_metrics
from controller.sources.prometheus import (
    PrometheusQuerySource,
    prometheus_source,
    shared_queriers,
    steps,
)
from controller.state import TickReport
from controller.testing import Driver
from controller.weights.rounding import proportional

OPEN_LOOP = (
    "open loop: the recorded signals followed the weights in force then, not these; this "
    "shows when and how often it would have moved traffic, not what that traffic would have done"
)
CLOSED_LOOP = (
    "closed loop, first order: each cluster's KV use, queue, running requests and request "
    "rates moved with its replayed share over its recorded share ({recorded}); local traffic "
    "is moved with them, latency's quantiles are not"
)


SEPARATE = (
    "each target replayed on its own: where targets share a cluster, each one's closed loop "
    "moves that cluster's recorded load with its own weights, not with the others'"
)


MAX_RECORDED = 1_000_000  # a weight, in whatever unit the split was written in
MIN_RECORDED_SHARE = 0.001


@dataclass(frozen=True, slots=True)
class Response:
    """How the recorded load follows the replayed weights: a cluster's routed load scales with
    its share of the traffic, so a reading taken while it held its share then (0..1) is moved
    to the share the replay gives it. Its share then is the controller's own record
    (``record``, ``controller.recorded``): the split at the record's latest step up to then
    (weights stay on the objects until written), its first split before that step, and
    ``given`` (even, or ``--recorded``) without one. Weights act on load ``lag`` seconds
    after they are in force, as the record measured its own changes take (``delays``; none
    before its first measure: from the next tick). A cluster that held none then (or less than
    ``MIN_RECORDED_SHARE``) is read as recorded (what it would have carried is not in the
    history)."""

    given: Mapping[str, float]
    record: Mapping[float, Mapping[str, float]] = field(default_factory=dict)
    source: str = ""  # where the record came from, said in the output
    delays: Mapping[float, float] = field(default_factory=dict)
    _times: list[float] = field(default_factory=list, init=False, repr=False, compare=False)
    _delay_times: list[float] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._times.extend(sorted(self.record))
        self._delay_times.extend(sorted(self.delays))

    @classmethod
    def of(cls, weights: Mapping[str, float], record: Record | None = None) -> Response:
        total = sum(weights.values())
        given = {name: w / total for name, w in weights.items()}
        if record is None:
            return cls(given)
        if record.shares:  # before its first step the target held what it held then
            given = dict(record.shares[min(record.shares)])
        source = f"weights for {record.target} (below)"
        return cls(given, record.shares, source, record.delays)

    def split(self, at: float) -> Mapping[str, float]:
        """The recorded split in force at ``at``."""
        return _as_of(self._times, self.record, at, self.given)

    def lag(self, at: float) -> float:
        """How long weights took to act at ``at``, as last measured (0: unknown)."""
        return _as_of(self._delay_times, self.delays, at, 0.0)

    @staticmethod
    def factors(applied: Mapping[str, int], then: Mapping[str, float]) -> dict[str, float]:
        """Each cluster's load factor under ``applied`` (the replay's weights in force, by
        cluster) over ``then`` (its share when the history was recorded)."""
        # the weighed target's clusters only, each share then taken over them (a cluster the
        # target has no ref to carries none of its traffic: its load is not moved)
        total = sum(applied.values())
        over = sum(then.get(name, 0.0) for name in applied)
        found: dict[str, float] = {}
        for name in applied:
            share = then.get(name, 0.0) / over if over > 0 else 0.0
            now = applied[name] / total if total > 0 else share
            # a share too small to scale from (a cluster held at a point or two of a large
            # weight) is read as none: its load would be moved a thousandfold
            found[name] = now / share if share >= MIN_RECORDED_SHARE else 1.0
        return found

    def describe(self) -> str:
        given = ", ".join(f"{n} {100 * s:.0f}%" for n, s in self.given.items())
        if not self.source:
            lagged = ", acting after the delay the controller measured" if self.delays else ""
            return f"recorded split {given}{lagged}"
        lagged = (
            ", acting after the delay it measured" if self.delays else ", acting at the next tick"
        )
        return (
            f"recorded split from the controller's own {self.source}, the last one holding "
            f"between its steps{lagged}; before its first, as at its first ({given})"
        )


V = TypeVar("V")


def _as_of(times: Sequence[float], by_time: Mapping[float, V], at: float, before: V) -> V:
    """What ``by_time`` held at ``at``: its value at the latest of ``times`` (its keys, in
    order) up to ``at``; ``before`` before the first."""
    index = bisect.bisect_right(times, at)
    return by_time[times[index - 1]] if index else before


# The answers a cluster's routed load moves (``moved``); the rest (pods, pools, the oldest
# sample, latency quantiles) read as recorded.
MOVED = ("kv_mean", "kv_max", "queue", "running", "latency_requests")


def moved(answers: Answers, factors: Mapping[str, float]) -> Answers:
    """One querier's ``answers`` at one time as they would have read with each cluster's
    routed load scaled by its factor (``factors``, by its value of the querier's cluster
    label; ``Response``): requests arrive ``factor`` times as often; as many more run as its
    KV cache holds (at most full), the rest wait in its queue, and what completes follows what
    runs. One pass over the querier's answers a tick, not a record rebuilt per cluster: in a
    replay of a week that was a tenth of each tick. Nothing is made up or made usable: a
    query that failed stays failed (a queue it would have shown is not invented), a cluster it
    answered nothing for stays unknown, and a KV reading no cache can have (outside 0..1) is
    left as it was, for the conversion to refuse."""
    if all(factor == 1.0 for factor in factors.values()):
        return answers
    recorded = {q: a for q in MOVED if isinstance(a := answers.get(q), dict)}
    found = {q: dict(a) for q, a in recorded.items()}
    kv, kv_max = recorded.get("kv_mean", {}), recorded.get("kv_max", {})
    queue, running = recorded.get("queue", {}), recorded.get("running", {})
    done = recorded.get("latency_requests", {})
    for who, factor in factors.items():
        load = kv.get(who)
        if factor == 1.0 or (load is not None and not 0.0 <= load <= 1.0):
            continue
        admitted = min(factor, 1.0 / load) if load is not None and load > 0 else factor
        if load is not None:
            found["kv_mean"][who] = min(1.0, load * factor)
        if (peak := kv_max.get(who)) is not None:
            found["kv_max"][who] = min(1.0, peak * factor)
        waiting, runs = queue.get(who), running.get(who)
        if (waiting is not None or runs is not None) and "queue" in found:
            found["queue"][who] = (waiting or 0.0) * factor + (runs or 0.0) * (factor - admitted)
        if runs is not None:
            found["running"][who] = runs * admitted
        if (requests := done.get(who)) is not None:
            found["latency_requests"][who] = requests * admitted
    return {**answers, **found}


def utc(at: float) -> str:
    """A time as ``--start`` and ``--end`` take it."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The most ticks one replay holds: every tick's answers are read before the first is
# replayed, ~2 KB a tick for 20 clusters (a 30-day window at 10 s held 531 MB; a year ran
# out of memory after a minute: found by an attack).
MAX_TICKS = 300_000


class ReplayError(Exception):
    """A replay that cannot be run: one line, exit 2."""


@dataclass(slots=True)
class Summary:
    """What the loop did over the window, for the target it weighed: each write as each
    cluster's share of it in whole percent (``percent``), from ``held`` (what the target held
    before the first; an even split if not known)."""

    start: float
    end: float
    held: dict[str, int] | None = None
    ticks: int = 0
    published: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    modes: Counter[str] = field(default_factory=Counter)
    health_changes: Counter[str] = field(default_factory=Counter)
    shed: list[tuple[float, str]] = field(default_factory=list)  # (when, the cluster) set to 0
    # each cluster's ticks without a KV reading (missing or failed queries)
    unknown: Counter[str] = field(default_factory=Counter)
    # each query a querier could not answer at some ticks: (ticks, the first, why)
    failed: dict[str, tuple[int, float, str]] = field(default_factory=dict)

    def _from_held(self) -> list[tuple[float, dict[str, int]]]:
        """The writes, after what was held before the first (where known): a write turning
        back from it is a reversal, as the record's own count has it."""
        return [(self.start, self.held), *self.published] if self.held else self.published

    def fail(self, query: str, at: float, error: FetchError) -> None:
        ticks, first, why = self.failed.get(query, (0, at, error.detail))
        self.failed[query] = (ticks + 1, first, why)

    @property
    def hours(self) -> float:
        return max(self.end - self.start, 1.0) / 3600.0

    def row(self, names: Sequence[str]) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "writes": len(self.published),
            "writes_per_hour": round(len(self.published) / self.hours, 1),
            "reversals_per_hour": round(reversals(self._from_held(), names) / self.hours, 1),
            "largest_step": largest_step(self.published, names, self.held) if self.published else 0,
            # how deep each cluster was shed: its least weight over the window
            "lowest": {n: min(w.get(n, 0) for _, w in self.published) for n in names}
            if self.published
            else {},
            "ticks_per_mode": dict(self.modes),
            "health_changes": dict(self.health_changes),
            "shed": [{"time": t, "cluster": c} for t, c in self.shed],
            "unknown_cluster_ticks": self.unknown.total(),
            "unknown_ticks_by_cluster": {n: self.unknown[n] for n in names if self.unknown[n]},
            "failed_queries": {
                q: {"ticks": n, "first": first, "why": why}
                for q, (n, first, why) in sorted(self.failed.items())
            },
        }


HISTORY_QUERIER = "replay-history"  # the querier named on the command line (``--querier``)


def replay_settings(
    settings: Settings,
    overrides: Mapping[str, str],
    querier: str | None = None,
    label: str = "cluster",
    step: float | None = None,
) -> Settings:
    """The config as replay runs it: writing nowhere (Kubernetes off: the implicit target
    over the config's clusters), with ``weights.*`` overrides. ``querier``: a Prometheus or
    Thanos that holds the series of the clusters the config scrapes (each cluster's by its
    name as the value of ``label``); those clusters are read through it. ``step``
    (``--step``): a tick every so often instead of every interval, no shorter than it."""
    if step is not None and not step >= settings.interval:
        raise ConfigError(
            [
                f"--step {step:g}s: shorter than the config's interval ({settings.interval:g}s);"
                " the loop never ticks faster than its interval"
            ]
        )
    if step is not None and step > MAX_INTERVAL:
        raise ConfigError(
            [f"--step {step:g}s: longer than {MAX_INTERVAL:g}s, the longest interval the loop runs"]
        )
    data = settings.model_dump(mode="json", exclude_unset=True)  # as the file gave it
    if step is not None:
        data["interval"] = step
        # a reading held through a failed fetch is a step old: a staleness no longer than
        # the step (a config's own, or its default for a shorter interval) follows the step
        # as a default follows a long interval; a longer one is kept
        if settings.health.max_staleness <= step:
            stale = default_staleness(step)
            data["health"] = {**data.get("health", {}), "max_staleness": stale}
    data["kubernetes"] = {**data.get("kubernetes", {}), "enabled": False}
    data["leader_election"] = {**data.get("leader_election", {}), "enabled": False}
    data["weights"] = {**data.get("weights", {}), **overrides}
    if querier is not None:
        history = {"name": HISTORY_QUERIER, "url": querier, "cluster_label": label}
        data["queriers"] = [*data.get("queriers", []), history]
        data["clusters"] = [
            c
            if c.get("prometheus")
            else {
                "name": c["name"],
                "prometheus": {"querier": HISTORY_QUERIER, "cluster": c["name"]},
            }
            for c in data["clusters"]
        ]
    return build_settings(data)


def sources(settings: Settings, session: aiohttp.ClientSession) -> dict[str, PrometheusQuerySource]:
    """Each cluster's PromQL source; a cluster read without a querier has no history."""
    without = [c.name for c in settings.clusters if c.prometheus is None]
    if without:
        raise ReplayError(
            f"clusters {', '.join(without)} are scraped, not read through a querier: their "
            "history is in no Prometheus the config names (name one that holds it with "
            "--querier URL, each cluster by its name as the value of --cluster-label)"
        )
    queriers = shared_queriers(
        settings.queriers, settings.prometheus_queries, settings.scrape, session
    )
    return {
        c.name: prometheus_source(
            c, settings.prometheus_queries, settings.scrape, session, queriers
        )
        for c in settings.clusters
    }


async def histories(
    found: Mapping[str, PrometheusQuerySource], start: float, end: float, step: float
) -> dict[str, dict[float, Answers]]:
    """Each cluster's answers at every step, one history per querier (shared clusters share
    it); a querier that answered nothing usable at any step is a ``ReplayError``."""
    by_querier: dict[int, dict[float, Answers]] = {}
    for source in found.values():
        querier = source.querier
        if id(querier) not in by_querier:
            read = await querier.history(start, end, step)
            failed = [
                kv for kv in (a.get("kv_mean") for a in read.values()) if isinstance(kv, FetchError)
            ]
            if read and len(failed) == len(read):
                raise ReplayError(
                    f"{querier.base}_range answered no part of the window ({len(read)} steps "
                    f"from {utc(start)} to {utc(end)}): {failed[0].detail}"
                )
            by_querier[id(querier)] = read
    return {name: by_querier[id(s.querier)] for name, s in found.items()}


@dataclass(frozen=True, slots=True)
class History:
    """What the queriers answered at every step of the window, for each cluster, and whom
    each cluster's answers came from."""

    start: float
    end: float
    times: Sequence[float]
    answers: Mapping[str, Mapping[float, Answers]]
    asked: Mapping[str, Asked]


def gaps(history: History) -> dict[str, dict[str, tuple[int, float]]]:
    """Gaps in the history: for each query, each cluster it answered for at some steps of the
    window and not at others (a series that stopped, started late or was missing a while),
    at how many steps and from when. Those ticks read it as unknown, never as a value; a query
    that failed at a step is counted with the failures, not here. One set difference per
    querier, step and query (a week of 20 clusters: under a second)."""
    missing: dict[tuple[str, str], tuple[int, float]] = {}
    never: set[tuple[str, str]] = set()  # answered nothing at any step: not a gap
    for by_time, members in _movable(history):
        names = {label: name for name, label in members}
        wanted = set(names)
        unseen: dict[str, set[str]] = {}  # by query, the labels it has not answered for yet
        for at in history.times:
            for query, answer in by_time[at].items():
                if query in (POOL_PODS, TOKEN_PODS) or not isinstance(answer, dict):
                    continue
                pending = unseen.setdefault(query, set(wanted))
                if pending:
                    pending.difference_update(answer.keys())
                for label in wanted - answer.keys():
                    count, first = missing.get((query, names[label]), (0, at))
                    missing[(query, names[label])] = (count + 1, first)
        never.update((query, names[label]) for query, left in unseen.items() for label in left)
    found: dict[str, dict[str, tuple[int, float]]] = {}
    for (query, name), gap in sorted(missing.items()):
        if (query, name) not in never:
            found.setdefault(query, {})[name] = gap
    return found


def target_lines(target: Target | None) -> list[str]:
    """Which target was weighed, where it is the record's."""
    if target is None:
        return []
    refs = ", ".join(f"{r.name} → {r.cluster or 'no cluster of the config'}" for r in target.refs)
    return [f"  weighed {target.key} as the record had it: {refs}"]


def gap_lines(found: Mapping[str, Mapping[str, tuple[int, float]]]) -> list[str]:
    return [
        f"  {query} answered nothing usable for {name} at {missing} ticks, "
        f"the first at {utc(first)}"
        for query, by_name in found.items()
        for name, (missing, first) in by_name.items()
    ]


async def read_history(
    settings: Settings, start: float, end: float, session: aiohttp.ClientSession
) -> History:
    """The window's answers at the config's interval, read once (candidates replayed side
    by side share them)."""
    if end <= start:
        raise ReplayError(f"the window is empty: --end ({end:g}) is not after --start ({start:g})")
    ticks = (end - start) / settings.interval
    if ticks > MAX_TICKS:
        raise ReplayError(
            f"the window holds {ticks:,.0f} ticks at {settings.interval:g}s, more than "
            f"{MAX_TICKS:,} (a month at 10s, ~500 MB held): replay it in parts, or a "
            "coarser --step"
        )
    if not steps(start, end, settings.interval):
        raise ReplayError(
            f"the window is empty: no multiple of the {settings.interval:g}s step from "
            f"{utc(start)} to {utc(end)} (ticks fall on them, as query frontends align them)"
        )
    found = sources(settings, session)
    read = await histories(found, start, end, settings.interval)
    times = sorted(next(iter(read.values())))
    return History(start, end, times, read, {name: s.asked() for name, s in found.items()})


def by_cluster(target: Target, weights: Mapping[str, int]) -> dict[str, int]:
    """``weights`` of ``target``'s refs by the cluster each maps to (refs of one cluster added
    up; an unmapped ref, which keeps its weight, left out): for the implicit target, whose
    refs are its clusters, the weights themselves."""
    found: dict[str, int] = {}
    for ref, cluster in target.clusters.items():
        if cluster is not None:
            found[cluster] = found.get(cluster, 0) + weights.get(ref, 0)
    return found


def percent(weights: Mapping[str, int]) -> dict[str, int]:
    """Weights as whole percents of their sum: an HTTPRoute's relative weights, or a target
    with unmapped refs, counted on the scale the record and the implicit target use."""
    total = sum(weights.values())
    return {n: round(100 * w / total) if total > 0 else 0 for n, w in weights.items()}


def recorded_target(record: Record) -> Target | None:
    """The target the record holds, as the loop weighs one: its kind, namespace and name (and
    an HTTPRoute's rule) from its key, each ref with the config's cluster it maps to and the
    weight it held at the first step it was seen. What the record cannot say is taken as a
    target that says nothing of it: no pause or pin, the lowest weight 0, an ExternalModel's
    weights out of 100 and an HTTPRoute's relative. ``None`` where the key is not a target's
    or no ref maps to a cluster of the config (the implicit target is weighed instead)."""
    parts = record.target.split("/")
    rule: int | None = None
    if len(parts) == 4 and parts[3].startswith("rule-") and parts[3][5:].isdigit():
        rule = int(parts[3][5:])
        parts = parts[:3]
    if len(parts) != 3 or not all(parts) or parts[0] == IMPLICIT_TARGET:
        return None
    if not any(cluster is not None for cluster, _ in record.refs.values()):
        return None
    kind, namespace, name = parts
    total = 100 if kind == "ExternalModel" else None
    shares = {ref: share for ref, (_, share) in record.refs.items()}
    # out of 100 where the kind says so (two replicas a scrape apart may add up past it)
    weights = proportional(shares, total) if total else {r: round(v) for r, v in shares.items()}
    refs = tuple(
        Ref("", "", ref, weights[ref], cluster) for ref, (cluster, _) in sorted(record.refs.items())
    )
    return Target(kind, namespace, name, "", "", refs, rule=rule, total=total)


class _Holding:
    """A discoverer that finds one target, always as given (what a replayed write would make
    it hold lives in the loop's dry-run shadow, as for the implicit target)."""

    def __init__(self, target: Target) -> None:
        self._found = Discovery((target,))

    async def discover(self) -> Discovery:
        return self._found


async def run(
    settings: Settings,
    history: History,
    on_tick: Any = None,
    response: Response | None = None,
    target: Target | None = None,
) -> Summary:
    """The loop over ``history`` with ``settings`` (the config's, or a candidate's);
    ``on_tick(time, report)`` sees every tick. ``response``: the recorded load moved with the
    replayed weights (closed loop); ``None``: the recorded signals as they were (open loop).
    ``target``: the one weighed, as the record had it (``recorded_target``); ``None``: the
    implicit target over the config's clusters."""
    publisher = DryRun(_Holding(target)) if target is not None else None
    driver = Driver(settings, publisher, start=history.start, journal=False)  # no log read
    held = percent(by_cluster(target, target.weights)) if target is not None else None
    summary = Summary(history.start, history.end, held)
    last: dict[str, int] | None = held  # a cluster held at 0 before is not shed by a write
    previous: float | None = None
    seen_kv = False
    # the replay's weights after each tick, all kept: the record's delay may grow (a week
    # is 60,480 references)
    decided_at: list[float] = []
    decided: list[Mapping[str, int]] = []
    groups = _movable(history)
    # what the summary counts is the weighed target's: its clusters' health and readings, and
    # the queriers that read them (another target's are in its own summary)
    mine = set(history.answers) if target is None else set(by_cluster(target, target.weights))
    queriers = list(
        {id(a): a for a, members in groups if any(n in mine for n, _ in members)}.values()
    )
    for at in history.times:
        failed: dict[str, FetchError] = {}  # once a tick per query, whichever queriers failed
        for answers in queriers:
            for query, answer in answers[at].items():
                if isinstance(answer, FetchError):
                    failed.setdefault(query, answer)
        for query, error in failed.items():
            summary.fail(query, at, error)
        factors: dict[str, float] = {}  # before the first decision, the recorded split holds
        if response is not None:
            acting = at - response.lag(at)  # the load now follows the weights in force then
            index = bisect.bisect_right(decided_at, acting)
            if index:
                factors = response.factors(decided[index - 1], response.split(acting))
        metrics: dict[str, ClusterMetrics] = {}
        for answers, members in groups:
            read = moved(answers[at], {label: factors.get(n, 1.0) for n, label in members})
            for name, _ in members:
                metrics[name] = cluster_metrics(name, read, history.asked[name], at, 0.0, previous)
        summary.unknown.update(n for n, m in metrics.items() if n in mine and m.kv_mean is None)
        seen_kv = seen_kv or any(m.kv_mean is not None for m in metrics.values())
        report = await driver.tick(at, metrics)
        previous = at
        last = _account(summary, at, report, last, mine)
        weighed = report.only
        if weighed is not None and response is not None:
            decided_at.append(at)
            decided.append(by_cluster(weighed.outcome.target, weighed.outcome.applied))
        if on_tick is not None:
            on_tick(at, report)
    if not seen_kv:
        raise ReplayError(
            f"no KV-cache reading for any cluster between {history.start:g} and "
            f"{history.end:g}: the window holds no history of these clusters (check the time, "
            "the queriers' matchers and retention)"
        )
    return summary


def _movable(history: History) -> list[tuple[Mapping[float, Answers], list[tuple[str, str]]]]:
    """The clusters in groups whose answers are moved together (``moved``), each with its
    value of its querier's cluster label: the clusters read through one querier share its
    answers, moved once a tick for all of them, unless two name the same series (one label
    value read as two clusters of the config), which are moved apart, each by its own share."""
    groups: list[tuple[Mapping[float, Answers], list[tuple[str, str]]]] = []
    for name, answers in history.answers.items():
        label = history.asked[name].value
        group = next(
            (g for g in groups if g[0] is answers and all(label != taken for _, taken in g[1])),
            None,
        )
        if group is None:
            group = (answers, [])
            groups.append(group)
        group[1].append((name, label))
    return groups


async def replay(
    settings: Settings,
    start: float,
    end: float,
    session: aiohttp.ClientSession,
    on_tick: Any = None,
    response: Response | None = None,
) -> Summary:
    """Read the window and run the loop over it (``read_history``, then ``run``)."""
    history = await read_history(settings, start, end, session)
    return await run(settings, history, on_tick, response)


def _account(
    summary: Summary,
    at: float,
    report: TickReport,
    last: dict[str, int] | None,
    mine: set[str],
) -> dict[str, int] | None:
    summary.ticks += 1
    for name, view in report.clusters.items():
        if name in mine and view.health is not None and view.health.changed:
            summary.health_changes[name] += 1
    target = report.only  # replay weighs one target: the implicit one, or the record's
    if target is None:
        return last
    outcome = target.outcome
    summary.modes[str(outcome.decision.mode)] += 1
    if outcome.write is Write.WOULD:
        applied = percent(by_cluster(outcome.target, outcome.applied))
        summary.published.append((at, applied))
        for name, weight in applied.items():
            if weight == 0 and (last is None or last.get(name, 1) > 0):
                summary.shed.append((at, name))
        return applied
    return last


@dataclass(slots=True)
class Trace:
    """Each tick's share of the traffic as replayed and as the controller's own record had it
    (``recorded``, where it has that step: a cluster its target had no ref for then held 0),
    and KV as the loop read it, per cluster: what ``plot`` draws. A tick without a value is
    NaN: a gap, never 0."""

    times: list[float] = field(default_factory=list)
    shares: dict[str, list[float]] = field(default_factory=dict)
    recorded: dict[str, list[float]] = field(default_factory=dict)
    kv: dict[str, list[float]] = field(default_factory=dict)

    def add(self, at: float, report: TickReport, record: Record | None = None) -> None:
        recorded = record.shares.get(at) if record is not None else None
        target = report.only
        applied = by_cluster(target.outcome.target, target.outcome.applied) if target else {}
        total = sum(applied.values())
        self.times.append(at)
        for name, view in report.clusters.items():
            kv = view.metrics.kv_mean if view.metrics is not None else None
            self.kv.setdefault(name, []).append(math.nan if kv is None else kv)
            share = 100 * applied[name] / total if name in applied and total > 0 else math.nan
            self.shares.setdefault(name, []).append(share)
            weighed = name in applied  # a cluster outside the weighed target: no line
            then = recorded.get(name, 0.0) if recorded is not None and weighed else math.nan
            self.recorded.setdefault(name, []).append(100 * then)


def plotting(path: Path | None = None) -> None:
    """Say now, before anything is read or written, if ``--plot`` cannot draw (to ``path``:
    in a format matplotlib writes)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:  # an optional extra: say how to get it
        raise ReplayError(
            "plotting needs matplotlib: pip install 'weight-controller[plot]'"
        ) from exc
    if path is not None:
        from matplotlib.backend_bases import FigureCanvasBase

        kinds = FigureCanvasBase.get_supported_filetypes()
        if path.suffix.lstrip(".").lower() not in kinds:
            raise ReplayError(
                f"--plot {path}: no format matplotlib writes (name it .{', .'.join(sorted(kinds))})"
            )


def writable(flag: str, path: Path) -> None:
    """Say now, before a window is read (minutes for a week), if ``path`` cannot be written:
    found by an attack, a missing directory lost every tick read, after the whole replay."""
    where = path.parent  # Path("r.json").parent is Path(".")
    if path.is_dir():
        raise ReplayError(f"{flag} {path}: a directory")
    if not where.is_dir():
        raise ReplayError(f"{flag} {path}: no directory {where}")
    if not os.access(where, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ReplayError(f"{flag} {path}: not writable")


def plot(traces: Sequence[tuple[str, Trace]], path: Path, closed: bool = False) -> None:
    """For each target replayed (its label and its ``Trace``), weights as replayed and KV as
    fed to the loop per cluster over the window (``closed``: the recorded load moved with the
    replayed weights; else as recorded), one pair of panes a target, with matplotlib (the
    ``plot`` extra); a tick without a reading is a gap, never 0."""
    plotting(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2 * len(traces), 1, figsize=(10, 6 * len(traces)), sharex=True, squeeze=False
    )
    how = (
        "closed loop, first order: the recorded load moved with the replayed weights"
        if closed
        else "open loop: the recorded KV followed the weights in force then"
    )
    for index, (label, trace) in enumerate(traces):
        weights, kv = axes[2 * index][0], axes[2 * index + 1][0]
        start = trace.times[0] if trace.times else 0.0
        minutes = [(t - start) / 60 for t in trace.times]
        for name in trace.shares:
            if all(math.isnan(v) for v in trace.shares[name]):
                continue  # a cluster this target has no ref to
            (line,) = weights.plot(minutes, trace.shares[name], label=f"{name}, replayed")
            if not all(math.isnan(v) for v in trace.recorded[name]):
                colour = line.get_color()
                weights.plot(
                    minutes, trace.recorded[name], "--", color=colour, label=f"{name}, recorded"
                )
            kv.plot(minutes, trace.kv[name], label=name)
        weights.set_ylabel("share of the traffic, %")
        kv.set_ylabel("KV use, moved with the weights" if closed else "KV use, recorded")
        weights.legend(loc="upper right")
        weights.set_title(f"replay of {label} ({how})")
    axes[-1][0].set_xlabel("minutes from --start")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def tick_record(at: float, report: TickReport, record: Record | None = None) -> dict[str, Any]:
    """One tick as ``--json`` writes it: its time, what ``once`` prints, and what the
    controller's own record holds at that step (each cluster's share of the traffic as the
    objects held it and as it was served, %, and the actuation delay it measured), where it
    has it. The tick's own realised shares and delay are the closed loop's model; these were
    measured."""
    found = {"time": at, **report_json(report)}
    if record is None:
        return found
    held, served, delay = record.shares.get(at), record.realised.get(at), record.delays.get(at)
    recorded: dict[str, Any] = {}
    if held is not None:
        recorded["share"] = {name: round(100 * share, 3) for name, share in held.items()}
    if served is not None:
        recorded["realised"] = {name: round(100 * share, 3) for name, share in served.items()}
    if delay is not None:
        recorded["actuation_delay_seconds"] = delay
    if recorded:
        found["recorded"] = recorded
    return found


async def record_of(
    settings: Settings,
    start: float,
    end: float,
    session: aiohttp.ClientSession,
    targets: Sequence[str] = (),
) -> list[Found]:
    """The controller's own record over the window (``controller.recorded``) of each of
    ``targets`` (none: every target it holds), asked of the queriers the replay reads, at its
    steps."""
    queriers = shared_queriers(
        settings.queriers, settings.prometheus_queries, settings.scrape, session
    )
    names = [c.name for c in settings.clusters]
    return await read_records(
        list(queriers.values()), names, start, end, settings.interval, targets
    )


def held_apart(founds: Sequence[Found], named: bool = False) -> tuple[list[Found], list[str]]:
    """What to replay: each target the record holds (every one read, or each named), or
    without any the implicit target, with why there is no record; and what the record holds
    that is not replayed (one line each: a target over clusters the config does not read),
    said beside. ``named`` (``--target``): a target named and not held is a ``ReplayError``,
    never a replay of something else."""
    held = [f for f in founds if f.record is not None]
    unheld = [f.note for f in founds if f.record is None]
    if named and unheld:
        raise ReplayError("; ".join(unheld))
    if held:
        return held, unheld
    return [Found(None, "; ".join(unheld))], []


def shared(runs: Sequence[Run]) -> bool:
    """Some cluster is weighed by two of the targets replayed (``SEPARATE`` is said)."""
    weighed = [c for run in runs for c in run.weighed]
    return len(weighed) > len(set(weighed))


class Ticks:
    """Each tick as ``--json`` writes it, spooled to a file as it is replayed (one JSON line
    a tick), never held: a week of 20 clusters held as dicts took 13.7 GB. Read back by
    iterating; written into the document by ``write_array``."""

    def __init__(self, where: Path) -> None:
        """Spooled in ``where``: the directory ``--json`` writes in (a container's /tmp may be
        memory)."""
        self._file = tempfile.TemporaryFile("w+", encoding="utf-8", dir=where)  # noqa: SIM115
        self._count = 0

    def add(self, tick: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(tick, separators=(",", ":")) + "\n")
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._file.seek(0)
        for line in self._file:
            yield json.loads(line)
        self._file.seek(0, os.SEEK_END)

    def write_array(self, out: IO[str]) -> None:
        """The ticks as a JSON array, line by line."""
        self._file.seek(0)
        out.write("[")
        for index, line in enumerate(self._file):
            out.write(("," if index else "") + "\n" + line.rstrip("\n"))
        out.write("\n]" if self._count else "]")
        self._file.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._file.close()


def _regular(path: Path) -> Path | None:
    """The file ``path`` names (through a symlink), or ``None`` where that is no regular file
    (``/dev/stdout``, a pipe)."""
    target = path.resolve()
    return None if target.exists() and not target.is_file() else target


def spool_directory(path: Path) -> Path:
    """Where ``--json``'s ticks are spooled: beside the file it names, or the temporary
    directory where that is no regular file (``/dev/stdout``: not /dev)."""
    target = _regular(path)
    return Path(tempfile.gettempdir()) if target is None else target.parent


def write_document(path: Path, document: Mapping[str, Any], ticks: Sequence[Ticks]) -> None:
    """``--json``: ``document`` with each of its ``targets`` given its spooled ``ticks``,
    streamed to a file beside ``path`` and put in its place whole (a replay cut short, or a
    disk that fills, leaves no half a document), with the mode ``write_text`` gives (0666
    less the umask). A symlink is written through (its target is replaced), and what is no
    regular file (``/dev/stdout``, a pipe) is written in place."""
    target = _regular(path)
    if target is None:
        with path.open("w", encoding="utf-8") as device:
            _write_document(device, document, ticks)
        return
    out = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed, then renamed, below)
        "w", encoding="utf-8", dir=target.parent, prefix=f".{target.name}.", delete=False
    )
    try:
        with out:
            _write_document(out, document, ticks)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(out.name, 0o666 & ~umask)
        os.replace(out.name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out.name)
        raise


def _write_document(out: IO[str], document: Mapping[str, Any], ticks: Sequence[Ticks]) -> None:
    def members(value: Mapping[str, Any]) -> str:  # an object's members, no braces
        return json.dumps(value, indent=2)[1:-1].strip()

    rest = members({k: v for k, v in document.items() if k != "targets"})
    out.write('{\n"targets": [')
    for index, (block, kept) in enumerate(zip(document["targets"], ticks, strict=True)):
        head = members(block)
        out.write(("," if index else "") + "\n{\n  " + (f"{head}," if head else ""))
        out.write('\n  "ticks": ')
        kept.write_array(out)
        out.write("\n}")
    out.write("\n]" + (f",\n{rest}" if rest else "") + "\n}\n")


@dataclass(slots=True)
class Run:
    """One target replayed over the history: the record it was weighed as (``found``; none:
    the implicit target over the config's clusters), the clusters it weighs, how the load
    followed its weights (``response``; ``None``: open loop), what the loop did with the
    replay's settings and with each candidate's, and each tick as ``--json`` and ``--plot``
    keep it."""

    found: Found
    target: Target | None
    weighed: list[str]
    response: Response | None
    summary: Summary
    compared: dict[str, Summary]
    ticks: Ticks | None
    trace: Trace


async def replay_target(
    settings: Settings,
    candidates: Mapping[str, Settings],
    history: History,
    found: Found,
    recorded: str | None = None,
    open_loop: bool = False,
    ticks: Path | None = None,
    trace: bool = False,
) -> Run:
    """Replay the target ``found`` holds (``recorded_target``; without a record, or where its
    key is no target's, the implicit one) with ``settings`` and each candidate, on the same
    history; closed loop over its record (or ``--recorded``) unless ``open_loop``; each tick
    kept for ``--json`` (spooled in the directory ``ticks``) and for ``--plot`` (``trace``).
    Each target is replayed on its own: its closed loop moves its clusters' routed load with
    its weights alone, as with one target."""
    record = found.record
    target = recorded_target(record) if record is not None else None
    names = [c.name for c in settings.clusters]
    weighed = names if target is None else [c for c in names if c in target.clusters.values()]
    response = None if open_loop else recorded_split(recorded, names, record)
    kept = Ticks(ticks) if ticks is not None else None
    drawn = Trace()

    def on_tick(at: float, report: TickReport) -> None:
        if kept is not None:
            kept.add(tick_record(at, report, record))
        if trace:
            drawn.add(at, report, record)

    watching = kept is not None or trace
    summary = await run(settings, history, on_tick if watching else None, response, target)
    compared = {
        item: await run(other, history, None, response, target)
        for item, other in candidates.items()
    }
    return Run(found, target, weighed, response, summary, compared, kept, drawn)


def record_row(found: Found, names: Sequence[str], hours: float) -> dict[str, Any]:
    """How the recorded split moved over the window, as the summary counts the replay's: a
    change of any cluster's share by a whole percent is a write."""
    record = found.record
    if record is None:
        return {"note": found.note}
    split = [
        (t, {n: round(100 * record.shares[t].get(n, 0.0)) for n in names})
        for t in sorted(record.shares)
    ]
    changes = [b for a, b in itertools.pairwise(split) if b[1] != a[1]]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(split)]
    steps = [max(abs(b[1][n] - a[1][n]) for n in names) for a, b in itertools.pairwise(split)]
    delays = sorted(record.delays.values())
    return {
        "note": found.note,
        "target": record.target,
        "steps_read": len(record.shares),
        # as the controller measured its changes take to act, at the middle step that has one
        "actuation_delay_seconds": delays[len(delays) // 2] if delays else None,
        "changes": len(changes),
        "changes_per_hour": round(len(changes) / hours, 1),
        "reversals_per_hour": round(reversals(split, names) / hours, 1),
        "largest_step": max(steps, default=0),
        # across a gap the split before it is taken to hold (weights stay until written)
        "longest_gap_seconds": max(gaps, default=0.0),
    }


def record_line(row: Mapping[str, Any]) -> str:
    """The record's churn beside the replay's, or why there is none."""
    if "changes" not in row:
        return f"  ({row['note']})"
    delay = row["actuation_delay_seconds"]
    acted = "" if delay is None else f", its changes acting after {delay:g}s"
    return (
        f"  the controller's own record ({row['note'].removeprefix('recorded: ')}): "
        f"{row['changes']} changes ({row['changes_per_hour']}/h), reversals "
        f"{row['reversals_per_hour']}/h, largest step {row['largest_step']}{acted}"
    )


def compared(rows: Mapping[str, Summary], names: Sequence[str]) -> str:
    """Candidates side by side on the same history: one line each."""
    head = (
        f"{'settings':<28} {'writes':>6} {'/h':>6} {'reversals/h':>11} {'largest':>7} {'shed':>4}"
    )
    lines = [head]
    for label, summary in rows.items():
        row = summary.row(names)
        lines.append(
            f"{label:<28} {row['writes']:>6} {row['writes_per_hour']:>6} "
            f"{row['reversals_per_hour']:>11} {row['largest_step']:>7} {len(row['shed']):>4}"
        )
    return "\n".join(lines)


def recorded_split(
    given: str | None, names: Sequence[str], record: Record | None = None
) -> Response:
    """``--recorded NAME=WEIGHT,...``: the split in force while the history was recorded, every
    cluster named, in place of the controller's own ``record`` (whose measured delay still
    holds); when not given, the record where there is one, and the even split before it or
    without one. A bad one is a ConfigError."""
    if given is None:
        return Response.of(dict.fromkeys(names, 1.0), record)
    delays = record.delays if record is not None else {}
    weights: dict[str, float] = {}
    for item in given.split(","):
        name, sep, value = item.strip().partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or name not in names or name in weights or not 0 <= weight <= MAX_RECORDED:
            raise ConfigError(
                [
                    f"--recorded {item.strip()!r}: expected NAME=WEIGHT, each cluster of the "
                    f"config once and a weight from 0 to {MAX_RECORDED}"
                ]
            )
        weights[name] = weight
    missing = [n for n in names if n not in weights]
    total = sum(weights.values())
    # a share too small to scale from: its replayed load would be thousands of times the record's
    tiny = [n for n, w in weights.items() if 0 < w < total * MIN_RECORDED_SHARE]
    if missing or total <= 0 or tiny:
        why = (
            f"names no weight for {', '.join(missing)} (name every cluster)"
            if missing
            else "gives no traffic"
            if total <= 0
            else f"gives {', '.join(tiny)} less than {MIN_RECORDED_SHARE:.1%} of the traffic: "
            "too little to scale its load from (0, if it had none)"
        )
        raise ConfigError([f"--recorded {given!r}: {why}"])
    return Response(Response.of(weights).given, delays=delays)


def loop_line(response: Response | None) -> str:
    """What the replay fed the loop, said with its result."""
    if response is None:
        return OPEN_LOOP
    return CLOSED_LOOP.format(recorded=response.describe())


def table(
    summary: Summary,
    names: Sequence[str],
    loop: str = OPEN_LOOP,
    more: Sequence[str] = (),
    title: str = "",
) -> str:
    """The summary as printed; ``more``: lines about the history itself (``gap_lines``);
    ``title``: the target it is of, where several were replayed."""
    row = summary.row(names)
    lines = [
        f"{title}{': ' if title else ''}replayed {row['ticks']} ticks ({summary.hours:.1f} h) "
        f"of {', '.join(names)}",
        f"  writes {row['writes']} ({row['writes_per_hour']}/h), reversals "
        f"{row['reversals_per_hour']}/h, largest step {row['largest_step']}",
        "  ticks per mode: "
        + ", ".join(f"{m} {n}" for m, n in sorted(row["ticks_per_mode"].items())),
        "  health changes: "
        + (", ".join(f"{c} {n}" for c, n in sorted(row["health_changes"].items())) or "none"),
        f"  cluster-ticks without a KV reading: {row['unknown_cluster_ticks']}"
        + "".join(f", {n} {t}" for n, t in row["unknown_ticks_by_cluster"].items()),
    ]
    never = [n for n, t in row["unknown_ticks_by_cluster"].items() if t == summary.ticks]
    if never:
        lines.append(
            f"  never read: {', '.join(never)}: no KV reading at any tick (is the querier's "
            "label value for it right?)"
        )
    for query, failed in row["failed_queries"].items():
        lines.append(
            f"  {query} could not be read at {failed['ticks']} ticks, the first at "
            f"{utc(failed['first'])}: {failed['why']}"
        )
    if row["lowest"]:
        least = ", ".join(f"{c} {w}" for c, w in row["lowest"].items())
        lines.insert(2, f"  least weight each held: {least}")
    for shed in row["shed"]:
        lines.append(f"  shed {shed['cluster']} at {utc(shed['time'])}")
    lines.extend(more)
    lines.append(f"  ({loop})")
    return "\n".join(lines)


_FIELD = re.compile(r"[a-z_][a-z0-9_]*|[0-9]+")


def check_overrides(
    items: Sequence[str], base: Mapping[str, object] | None = None, flag: str = "--set"
) -> dict[str, str]:
    """``--set KEY=VALUE`` items (weights.*), checked now over the config's own weights
    (``base``, as the file gave them): a bad one is a ConfigError. Checked alone against the
    defaults, deadband=30 was refused beside a config's max_step of 50 (found by an attack)."""
    from pydantic import ValidationError

    from controller.settings import WeightSettings

    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError([f"{flag} {item!r}: expected KEY=VALUE"])
        pairs[key.removeprefix("weights.")] = value
    try:
        WeightSettings.model_validate({**(base or {}), **pairs})
    except ValidationError as exc:
        # one line a field: pydantic's union branches (literal[0], function-after[...]) are
        # no field, and the literal branch's "Input should be 0" says nothing of the value
        found: dict[str, str] = {}
        for error in sorted(exc.errors(), key=lambda e: any("[" in str(p) for p in e["loc"])):
            parts = [str(p) for p in error["loc"] if _FIELD.fullmatch(str(p))]
            field = ".".join(["weights", *parts])
            found.setdefault(field, str(error["msg"]).removeprefix("Value error, "))
        lines = [f"{flag} {field}: {message}" for field, message in found.items()]
        raise ConfigError(lines) from None
    return pairs


def once_each(items: Sequence[str], flag: str) -> list[str]:
    """``items`` (``--set``'s, or one ``--compare``'s) if none sets a key another sets: the
    last one won without a word (``--set floor=5 --set floor=10`` replayed 10)."""
    seen: dict[str, str] = {}
    for item in items:
        key = item.partition("=")[0].removeprefix("weights.")
        if key in seen:
            raise ConfigError([f"{flag} {key}: given twice ({seen[key]!r} and {item!r})"])
        seen[key] = item
    return list(items)
