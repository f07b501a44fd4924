"""What the live controller recorded of its own weights, read back for ``replay``: each
cluster's share of a target's traffic as the objects held it, step by step over the window
(``weight_controller_target_share``, named in ``render.REF``).

The series are the controller's own, wherever its /metrics was scraped (the hub's Prometheus,
a Thanos beside it): each querier the replay reads is asked, and the one holding most of the
chosen target's steps is the record. Three things a real record holds are read past:
- a replica in dry run exports what it would have held, not what the objects held: its series
  are left out (``weight_controller_dry_run``, 1 in a dry run);
- several replicas export the same share (a follower reads the same objects): one is kept;
- a scrape that gives its target a ``cluster`` label of its own makes Prometheus keep ours as
  ``exported_cluster`` (``honor_labels: false``, the default: prometheus.io/docs/prometheus/
  latest/configuration/configuration/#scrape_config): read from there where it is. An
  unmapped ref is exported with ``cluster=""``, which Prometheus drops, so the scrape's own
  label takes its place: a replica whose other series were renamed is read as unmapped there
  (``_cluster_of``). A Thanos external ``cluster`` label filling it cannot be told apart.
Nothing is filled in: a step the record has no share at is absent, and said so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.errors import FetchError
from controller.settings.queries import quoted
from controller.sources.answers import Series
from controller.sources.prometheus import Querier

METRIC = "weight_controller_target_share"
# A replica in dry run held nothing: what it would have held, and the delay of changes that
# never were, are left out. Its realised share is counted requests, real either way.
_WROTE = "unless on (instance, job) (weight_controller_dry_run == 1)"
QUERY = f"max by (target, ref, cluster, exported_cluster, instance) ({METRIC} {_WROTE})"
REALISED = (
    "max by (target, ref, cluster, exported_cluster, instance) "
    "(weight_controller_target_realised_share{{target={target}}})"
)
DELAY = (  # ``{target}`` filled in when it is known
    "max by (target) (weight_controller_target_actuation_delay_seconds{{target={target}}} "
    + _WROTE
    + ")"
)


@dataclass(frozen=True, slots=True)
class Record:
    """One target's record: at each step it was read at, each of the config's clusters'
    share of the traffic over the config's clusters as the objects held it (``shares``; a
    cluster the target had no ref for then is absent) and as it was served (``realised``,
    over the controller's realised window), 0..1; how long its changes took to act, as it
    measured (``delays``, seconds); and what could not be read (``missing``, one phrase)."""

    target: str
    source: str  # the querier it was read from
    shares: Mapping[float, Mapping[str, float]]
    steps: int  # the steps of the window, read or not
    realised: Mapping[float, Mapping[str, float]] = field(default_factory=dict)
    delays: Mapping[float, float] = field(default_factory=dict)
    missing: str = ""
    # each ref the target held over the window: the config's cluster it maps to (None: none
    # of them) and its share (0..100) at the first step it was seen
    refs: Mapping[str, tuple[str | None, float]] = field(default_factory=dict)

    def describe(self) -> str:
        missing = f"; {self.missing}" if self.missing else ""
        return (
            f"{METRIC} of {self.target} from {self.source} "
            f"({len(self.shares)} of {self.steps} steps{missing})"
        )


@dataclass(frozen=True, slots=True)
class Found:
    """What reading the record gave: the record, or why there is none (one line)."""

    record: Record | None
    note: str


@dataclass(frozen=True, slots=True)
class _Held:
    """What one querier holds of the record: each target's shares by step, and why steps
    could not be read there."""

    querier: Querier
    targets: Mapping[str, Mapping[float, Mapping[str, float]]]
    steps: int
    unread: str
    refs: Mapping[str, Mapping[str, tuple[str | None, float]]]


async def read_records(
    queriers: Sequence[Querier],
    names: Sequence[str],
    start: float,
    end: float,
    step: float,
    targets: Sequence[str] = (),
) -> list[Found]:
    """The record of each of ``targets`` (none named: every target the record holds, in
    order) over the window, each from the querier that holds most of its steps (a Prometheus
    of short retention beside a Thanos of the whole window); a querier that fails is passed
    over and named, never fatal: the record is what replay is set beside, not what it runs
    on. A target named and not held is a ``Found`` without a record, saying so, and so is
    each target held over none of the config's clusters; no record at all, one such saying
    why."""
    failures: list[str] = []
    held: list[_Held] = []
    seen: set[str] = set()  # every target the record names, over any cluster
    for querier in queriers:
        read = await querier.series_over(QUERY, start, end, step)
        errors = [a for a in read.values() if isinstance(a, FetchError)]
        if errors and len(errors) == len(read):
            failures.append(f"{querier.base}_range: {errors[0].detail}")
            continue
        unread = f"{len(errors)} not read: {errors[0].detail}" if errors else ""
        seen.update(
            labels.get("target", "")
            for series in read.values()
            if not isinstance(series, FetchError)
            for labels, _ in series
        )
        by_target = _by_target(read, set(names))
        if by_target:
            firsts = {target: min(steps) for target, steps in by_target.items()}
            refs = _refs(read, set(names), firsts)
            held.append(_Held(querier, by_target, len(read), unread, refs))
    found = sorted({t for h in held for t in h.targets})
    # the targets over clusters the config does not read: said, never replayed
    away = {
        t: Found(None, f"the record holds {t} only over clusters the config does not read")
        for t in sorted(seen - set(found) - {""})
    }
    if not found and not targets:
        tried = "; ".join(failures) if failures else "none of the queriers holds it in the window"
        return [
            *away.values(),
            Found(None, f"no record of the controller's own weights ({METRIC}): {tried}"),
        ]
    records: list[Found] = [] if targets else list(away.values())
    for chosen in dict.fromkeys(targets) or found:  # each named once, in the order given
        holders = [h for h in held if chosen in h.targets]
        if chosen in away:
            records.append(away[chosen])
            continue
        if not holders:
            held_list = ", ".join(found) or "none over the config's clusters"
            tried = f"; {'; '.join(failures)}" if failures and not found else ""
            records.append(
                Found(None, f"the record holds no target {chosen} (it holds {held_list}){tried}")
            )
            continue
        best = max(holders, key=lambda h: len(h.targets[chosen]))
        record = await _measured(best, chosen, names, start, end, step)
        records.append(Found(record, f"recorded: {record.describe()}"))
    return records


async def _measured(
    held: _Held, target: str, names: Sequence[str], start: float, end: float, step: float
) -> Record:
    """``target``'s record from the querier that holds it, with what the controller measured
    of it there: its realised share and its actuation delay."""
    querier = held.querier
    key = quoted(target)
    realised = await querier.series_over(REALISED.format(target=key), start, end, step)
    delays = await querier.series_over(DELAY.format(target=key), start, end, step)
    missing = [held.unread] if held.unread else []
    for what, read in (("its realised share", realised), ("its delay", delays)):
        errors = [a for a in read.values() if isinstance(a, FetchError)]
        if errors:
            missing.append(f"{what} not read at {len(errors)}: {errors[0].detail}")
    return Record(
        target,
        querier.base + "_range",
        held.targets[target],
        held.steps,
        _by_target(realised, set(names)).get(target, {}),
        _delays(delays),
        "; ".join(missing),
        held.refs.get(target, {}),
    )


def _by_target(
    read: Mapping[float, Series | FetchError], names: set[str]
) -> dict[str, dict[float, dict[str, float]]]:
    """Each target's shares at each step, over the config's clusters it maps a ref to. A
    target's series come from one scrape: a cluster absent at a step had no ref then, and the
    others' shares are its whole traffic; a share no ref can hold (NaN, past 100) leaves the
    step out for that target, never read around."""
    summed: dict[str, dict[float, dict[str, float]]] = {}
    for at, series in read.items():
        if isinstance(series, FetchError):
            continue
        refs: dict[tuple[str, str, str], float] = {}  # one share a ref, whichever replica said it
        broken: set[str] = set()
        renamed = _renamed(series)
        for labels, value in series:
            cluster = _cluster_of(labels, renamed)
            if cluster not in names:
                continue
            target = labels.get("target", "")
            if not 0.0 <= value <= 100.0:  # NaN neither
                broken.add(target)
                continue
            ref = (target, labels.get("ref", ""), cluster)
            refs[ref] = max(refs.get(ref, value), value)
        for (target, _, cluster), value in refs.items():
            if target in broken:
                continue
            shares = summed.setdefault(target, {}).setdefault(at, {})
            shares[cluster] = shares.get(cluster, 0.0) + value  # refs of one cluster: one share
    found: dict[str, dict[float, dict[str, float]]] = {}
    for key, by_step in summed.items():
        for at, shares in by_step.items():
            total = sum(shares.values())
            if total > 0:
                found.setdefault(key, {})[at] = {c: v / total for c, v in shares.items()}
    return found


def _refs(
    read: Mapping[float, Series | FetchError],
    names: set[str],
    first: Mapping[str, float],
) -> dict[str, dict[str, tuple[str | None, float]]]:
    """Each target's refs at its ``first`` step (the first ``_by_target`` reads a split at),
    each with the config's cluster it maps to (None: an unmapped ref, or one to a cluster the
    config does not read) and its share then: one split the target held, never refs of
    different times put together. Replicas a scrape apart that disagree give the larger (the
    target is then scaled to its total, ``replay.recorded_target``); a ref whose share is no
    share is left out."""
    found: dict[str, dict[str, tuple[str | None, float]]] = {}
    for target, at in first.items():
        series = read.get(at)
        if series is None or isinstance(series, FetchError):
            continue
        refs: dict[str, tuple[str | None, float]] = {}
        renamed = _renamed(series)
        for labels, value in series:
            if labels.get("target", "") != target or not 0.0 <= value <= 100.0:
                continue
            cluster = _cluster_of(labels, renamed)
            ref = labels.get("ref", "")
            before = refs.get(ref, (None, value))[1]
            refs[ref] = (cluster if cluster in names else None, max(before, value))
        found[target] = refs
    return found


def _renamed(series: Series) -> set[str]:
    """The replicas (by ``instance``) whose scrape renamed our ``cluster`` label."""
    return {labels.get("instance", "") for labels, _ in series if "exported_cluster" in labels}


def _cluster_of(labels: Mapping[str, str], renamed: set[str]) -> str:
    """The cluster a series of ours names: ``exported_cluster`` where the scrape renamed it;
    none (an unmapped ref's empty label) where that replica's scrape renamed others but not
    this one, so its ``cluster`` is the scrape's; else ``cluster``."""
    if "exported_cluster" in labels:
        return labels["exported_cluster"]
    if labels.get("instance", "") in renamed:
        return ""
    return labels.get("cluster", "")


def _delays(read: Mapping[float, Series | FetchError]) -> dict[float, float]:
    """The target's actuation delay at each step that has one (a delay no change can take,
    negative or not finite, is none)."""
    found: dict[float, float] = {}
    for at, series in read.items():
        if isinstance(series, FetchError):
            continue
        values = [v for _, v in series if math.isfinite(v) and v >= 0]
        if values:
            found[at] = max(values)
    return found
