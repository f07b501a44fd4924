"""Pure: cumulative histograms from samples, their increase between scrapes, and quantiles.

Latency is judged on what happened between two scrapes — the same thing PromQL's
``histogram_quantile(q, sum by (le) (rate(x_bucket[w])))`` computes — never on since-start
totals, which would let a pod that was slow an hour ago look slow forever.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.exposition import Sample, parse_le

SeriesKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts sorted by upper bound; the last bound is +Inf when complete."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


def series_key(labels: Mapping[str, str]) -> SeriesKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def collect(
    by_name: Mapping[str, list[Sample]],
    family: str,
    keep: Mapping[str, str] | None = None,
) -> dict[SeriesKey, Histogram]:
    """The histograms of one family on one page, one per label set (``le`` aside).

    ``keep`` drops series whose labels differ from it. A series with a malformed ``le`` or
    without ``_count`` is left out rather than guessed at.
    """
    buckets: dict[SeriesKey, dict[float, float]] = {}
    for sample in by_name.get(family + "_bucket", ()):
        if not _matches(sample.labels, keep) or "le" not in sample.labels:
            continue
        try:
            bound = parse_le(sample.labels["le"])
        except ValueError:
            continue
        per_series = buckets.setdefault(series_key(sample.labels), {})
        per_series[bound] = per_series.get(bound, 0.0) + sample.value
    counts = _by_series(by_name.get(family + "_count", ()), keep)
    sums = _by_series(by_name.get(family + "_sum", ()), keep)
    result: dict[SeriesKey, Histogram] = {}
    for key, per_series in buckets.items():
        if key not in counts:
            continue
        ordered = tuple(sorted(per_series.items()))
        result[key] = Histogram(ordered, counts[key], sums.get(key, math.nan))
    return result


def _matches(labels: Mapping[str, str], keep: Mapping[str, str] | None) -> bool:
    return keep is None or all(labels.get(k) == v for k, v in keep.items())


def _by_series(samples: Iterable[Sample], keep: Mapping[str, str] | None) -> dict[SeriesKey, float]:
    return {series_key(s.labels): s.value for s in samples if _matches(s.labels, keep)}


def increase(previous: Histogram, current: Histogram) -> Histogram:
    """What ``current`` added since ``previous``; a counter reset restarts from zero.

    Any bucket or the count going down means the process restarted (as PromQL's ``rate``
    assumes), so everything counted since then — ``current`` itself — is the increase.
    """
    before = dict(previous.buckets)
    reset = current.count < previous.count or any(
        count < before.get(bound, 0.0) for bound, count in current.buckets
    )
    if reset:
        return current
    return Histogram(
        buckets=tuple((b, c - before.get(b, 0.0)) for b, c in current.buckets),
        count=current.count - previous.count,
        sum=current.sum - previous.sum,
    )


def merge(histograms: Iterable[Histogram]) -> Histogram | None:
    """``sum by (le)`` over bounds every histogram has (a bound missing anywhere would skew)."""
    items = list(histograms)
    if not items:
        return None
    common = set.intersection(*(set(dict(h.buckets)) for h in items))
    totals = dict.fromkeys(common, 0.0)
    for histogram in items:
        for bound, count in histogram.buckets:
            if bound in totals:
                totals[bound] += count
    return Histogram(
        buckets=tuple(sorted(totals.items())),
        count=sum(h.count for h in items),
        sum=sum(h.sum for h in items),
    )


def quantile(q: float, histogram: Histogram) -> float | None:
    """``histogram_quantile`` semantics: linear within a bucket, the lowest bucket from 0,
    and the top finite bound when the rank lands in +Inf. ``None`` where PromQL gives NaN."""
    buckets = _monotonic(histogram.buckets)
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]) or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if index == len(buckets) - 1:
        return buckets[-2][0]
    upper, count = buckets[index]
    if index == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = buckets[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def _monotonic(buckets: tuple[tuple[float, float], ...]) -> list[tuple[float, float]]:
    """Scrapes are not atomic: a later bucket may read lower; clamp as PromQL does."""
    fixed: list[tuple[float, float]] = []
    highest = 0.0
    for bound, count in buckets:
        highest = max(highest, count)
        fixed.append((bound, highest))
    return fixed
