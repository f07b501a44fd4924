"""What the live controller recorded of its own weights, read back for ``replay``: each
cluster's share of a target's traffic as the objects held it, step by step over the window
(``weight_controller_target_share``, named in ``render.REF``).

The series are the controller's own, wherever its /metrics was scraped (the hub's Prometheus,
a Thanos beside it): each querier the replay reads is asked in turn, the first that holds any
is the record. Three things a real record holds are read past:
- a replica in dry run exports what it would have held, not what the objects held: its series
  are left out (``weight_controller_dry_run``, 1 in a dry run);
- several replicas export the same share (a follower reads the same objects): one is kept;
- a scrape that gives its target a ``cluster`` label of its own makes Prometheus keep ours as
  ``exported_cluster`` (``honor_labels: false``, the default: prometheus.io/docs/prometheus/
  latest/configuration/configuration/#scrape_config): read from there where it is.
Nothing is filled in: a step the record has no share at is absent, and said so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.errors import FetchError
from controller.sources.answers import Series
from controller.sources.prometheus import Querier

METRIC = "weight_controller_target_share"
# A replica in dry run held nothing: what it would have held, and the delay of changes that
# never were, are left out. Its realised share is counted requests, real either way.
_WROTE = "unless on (instance, job) (weight_controller_dry_run == 1)"
QUERY = f"max by (target, ref, cluster, exported_cluster) ({METRIC} {_WROTE})"
REALISED = (
    "max by (target, ref, cluster, exported_cluster) "
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
    share of the traffic over the config's clusters as the objects held it (``shares``) and
    as it was served (``realised``, over the controller's realised window), 0..1; and how
    long its changes took to act, as it measured (``delays``, seconds)."""

    target: str
    source: str  # the querier it was read from
    shares: Mapping[float, Mapping[str, float]]
    steps: int  # the steps of the window, read or not
    realised: Mapping[float, Mapping[str, float]] = field(default_factory=dict)
    delays: Mapping[float, float] = field(default_factory=dict)

    def describe(self) -> str:
        return (
            f"{METRIC} of {self.target} from {self.source} "
            f"({len(self.shares)} of {self.steps} steps)"
        )


@dataclass(frozen=True, slots=True)
class Found:
    """What reading the record gave: the record, or why there is none (one line)."""

    record: Record | None
    note: str


async def read_record(
    queriers: Sequence[Querier],
    names: Sequence[str],
    start: float,
    end: float,
    step: float,
    target: str | None,
) -> Found:
    """The record of ``target`` (``None``: the only target the record holds) over the window,
    from the first of ``queriers`` that holds any; a querier that fails is passed over and
    named, never fatal: the record is what replay compares with, not what it runs on."""
    failures: list[str] = []
    for querier in queriers:
        read = await querier.series_over(QUERY, start, end, step)
        errors = [a for a in read.values() if isinstance(a, FetchError)]
        if errors and len(errors) == len(read):
            failures.append(f"{querier.base}_range: {errors[0].detail}")
            continue
        by_target = _by_target(read, set(names))
        if not by_target:
            continue
        source = querier.base + "_range"
        if target is None and len(by_target) > 1:
            held = ", ".join(sorted(by_target))
            return Found(
                None, f"the record at {source} holds targets {held}: name one with --target"
            )
        chosen = target if target is not None else next(iter(by_target))
        if chosen not in by_target:
            held = ", ".join(sorted(by_target))
            return Found(None, f"the record at {source} holds no target {chosen} (it holds {held})")
        quoted = json.dumps(chosen)  # a PromQL string: Go's escapes are JSON's
        realised = await querier.series_over(REALISED.format(target=quoted), start, end, step)
        delays = await querier.series_over(DELAY.format(target=quoted), start, end, step)
        record = Record(
            chosen,
            source,
            by_target[chosen],
            len(read),
            _by_target(realised, set(names)).get(chosen, {}),
            _delays(delays),
        )
        return Found(record, f"recorded: {record.describe()}")
    tried = "; ".join(failures) if failures else "none of the queriers holds it in the window"
    return Found(None, f"no record of the controller's own weights ({METRIC}): {tried}")


def _by_target(
    read: Mapping[float, Series | FetchError], names: set[str]
) -> dict[str, dict[float, dict[str, float]]]:
    """Each target's shares at each step, over the config's clusters it maps a ref to."""
    summed: dict[str, dict[float, dict[str, float]]] = {}
    for at, series in read.items():
        if isinstance(series, FetchError):
            continue
        refs: dict[tuple[str, str, str], float] = {}  # one share a ref, whichever replica said it
        for labels, value in series:
            cluster = labels.get("exported_cluster") or labels.get("cluster", "")
            if cluster in names and 0.0 <= value <= 100.0:  # NaN neither
                ref = (labels.get("target", ""), labels.get("ref", ""), cluster)
                refs[ref] = max(refs.get(ref, value), value)
        for (target, _, cluster), value in refs.items():
            held = summed.setdefault(target, {}).setdefault(at, {})
            held[cluster] = held.get(cluster, 0.0) + value  # refs of one cluster: one share
    found: dict[str, dict[float, dict[str, float]]] = {}
    for key, by_step in summed.items():
        for at, held in by_step.items():
            total = sum(held.values())
            if total > 0:
                found.setdefault(key, {})[at] = {c: v / total for c, v in held.items()}
    return found


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
