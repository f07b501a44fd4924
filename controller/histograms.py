"""Pure: cumulative histograms from samples, their increase between scrapes, and quantiles.

Latency is judged on what happened between two scrapes — the same thing PromQL's
``histogram_quantile(q, sum by (le) (rate(x_bucket[w])))`` computes — never on since-start
totals, which would let a pod that was slow an hour ago look slow forever.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise, repeat
from operator import add, attrgetter, ge, itemgetter, lt, sub

from controller.exposition import PAGE_LINES, Labels, Sample, bound_or_none

SeriesKey = tuple[tuple[str, str], ...]
Bounds = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts by ascending upper bound; the last bound is +Inf when complete.

    Compact because a baseline is kept per series of every page between scrapes: counts are a
    C array of doubles, and equal bound tuples are one shared object, so a series costs a few
    hundred bytes rather than a list of float pairs (benchmarks/README.md has the figures).
    """

    bounds: Bounds
    counts: array[float]
    count: float
    sum: float

    @property
    def buckets(self) -> list[tuple[float, float]]:
        return list(zip(self.bounds, self.counts, strict=True))


# Distinct bound sets are few (one per histogram definition); the cap keeps a hostile page
# that invents new ones on every scrape from growing this without end.
_SHARED_BOUNDS: dict[Bounds, Bounds] = {}
_SHARED_LIMIT = 1024


def _shared(bounds: Bounds) -> Bounds:
    found = _SHARED_BOUNDS.get(bounds)
    if found is not None:
        return found
    if len(_SHARED_BOUNDS) < _SHARED_LIMIT:
        _SHARED_BOUNDS[bounds] = bounds
    return bounds


def series_key(labels: Mapping[str, str]) -> SeriesKey:
    """The labels without ``le``, sorted: one histogram series (worked out once per label
    set when the labels came from the extractor)."""
    if isinstance(labels, Labels):
        return labels.key()
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def _bound(labels: Mapping[str, str]) -> float | None:
    if isinstance(labels, Labels):
        return labels.derived()[1]
    return bound_or_none(labels["le"]) if "le" in labels else None


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
        labels = sample.labels
        if keep is not None and not _matches(labels, keep):
            continue
        # An EPP's page, once per cluster: Fold._add has the inlined form for pods' pages.
        key, bound = series_key(labels), _bound(labels)
        if bound is None:
            continue
        per_series = buckets.get(key)
        if per_series is None:
            buckets[key] = {bound: sample.value}
        else:
            per_series[bound] = per_series.get(bound, 0.0) + sample.value
    counts = _by_series(by_name.get(family + "_count", ()), keep)
    sums = _by_series(by_name.get(family + "_sum", ()), keep)
    result: dict[SeriesKey, Histogram] = {}
    for key, per_series in buckets.items():
        if key not in counts:
            continue
        bounds = tuple(per_series)
        if any(a >= b for a, b in pairwise(bounds)):  # pages list them ascending
            bounds = tuple(sorted(bounds))
        values = array("d", [per_series[b] for b in bounds])
        result[key] = Histogram(_shared(bounds), values, counts[key], sums.get(key, math.nan))
    return result


def _matches(labels: Mapping[str, str], keep: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in keep.items())


def _by_series(samples: Iterable[Sample], keep: Mapping[str, str] | None) -> dict[SeriesKey, float]:
    return {
        series_key(s.labels): s.value for s in samples if keep is None or _matches(s.labels, keep)
    }


@dataclass(frozen=True, slots=True)
class Folded:
    """A page's histogram series summed into one (``Fold``), with what tells whether two of
    them may be subtracted: the series folded, in page order, and each one's count."""

    histogram: Histogram
    series: tuple[SeriesKey, ...]
    counts: array[float]

    def follows(self, previous: Folded) -> bool | None:
        """Whether this is ``previous``'s same series, none of whose counts fell: then
        ``increase`` of the two is exactly the ``merge`` of each series' own increase.
        ``None`` when the series differ (one appeared or went: the page counts from the next
        scrape, as a new page does); ``False`` when a count fell (a restart)."""
        if self.series == previous.series:  # the same keys, mostly the same objects
            return all(map(ge, self.counts, previous.counts))  # one count per series each
        before = dict(zip(previous.series, previous.counts, strict=True))
        if len(before) != len(self.series) or any(k not in before for k in self.series):
            return None
        return all(map(ge, self.counts, [before[k] for k in self.series]))


class Fold:
    """A page's series of one histogram, summed by bound: each ``family_bucket`` line the
    extractor reads is handed over (``labels``, ``values``) and summed once the page is read
    (``folded``), or its samples are added (``add_all``). What is kept of a pod between
    scrapes is one array, not one per series (a V1 page has one e2e series per engine), and
    its bucket lines never become samples.

    Exact against ``collect`` + ``increase`` per series + ``merge``, which is what it replaces,
    while a page's series stay the same from scrape to scrape and their counts do not fall,
    as a process's do (``Folded.follows``); only the bounds every series has are kept, as
    ``merge`` keeps them. Where the two part: a series that appears or goes, or whose count
    falls, leaves the whole page out for that interval (per series, the others would still be
    counted); a series without ``_count`` makes the page's histogram unknown (per series, it
    alone would be left out); a bucket line given twice makes its bound one not every series
    has.

    A bucket line repeated on the page (the same series and bound) is kept at its first value,
    as a Prometheus scrape keeps a repeated series, and counted in ``duplicates``."""

    __slots__ = (
        "_column",
        "_keep",
        "_layouts",
        "_lines",
        "_seen",
        "_series",
        "_sums",
        "duplicates",
        "first_duplicate",
        "labels",
        "sample_name",
        "values",
    )

    def __init__(
        self,
        family: str,
        keep: Mapping[str, str] | None = None,
        layouts: Layouts | None = None,
    ) -> None:
        """``layouts``: where the layouts of pages folded before are kept (one per reader),
        so a page laid out as one of them is summed without working its layout out again."""
        self.sample_name = family + "_bucket"
        self._keep = tuple(keep.items()) if keep else ()
        self._layouts = layouts
        self._sums: dict[float, float] = {}
        self._lines: dict[float, int] = {}
        self._series: dict[SeriesKey, None] = {}
        self._seen: set[tuple[SeriesKey, float]] = set()  # the buckets summed line by line
        self.duplicates = 0
        self.first_duplicate: SeriesKey = ()
        # A page summed by columns keeps its layout and column sums as they are (``folded``
        # reads them so); they become the three dicts above only if more lines follow.
        self._column: tuple[_Layout, list[float]] | None = None
        # The bucket lines the extractor hands over as it reads a page, in page order (its
        # label set, its value): two appends a line, summed once the page is read (settle).
        self.labels: list[dict[str, str]] = []
        self.values: list[float] = []

    def settle(self) -> None:
        """Sum the bucket lines handed over: by whole columns where the page lists every
        series' buckets in one block each, bounds in the same order (as client libraries
        write them), else line by line (``_add``). Both add each bound's values in page order,
        so they give the same sums to the last bit (a NaN's sign aside: the C compiler may
        order the two NaNs of one addition either way)."""
        labels, values = self.labels, self.values
        if labels and not self._by_columns(labels, values):
            self._spread()
            for line_labels, value in zip(labels, values, strict=True):
                self._add(line_labels, value)
        labels.clear()
        values.clear()

    def _by_columns(
        self, labels: list[dict[str, str]], values: list[float], kept: bool = False
    ) -> bool:
        """``settle``'s sums done in C, a column of values per bound, or ``False`` (nothing
        done) where the page is not laid out for it (``_Layout.of``) or a ``keep`` is to be
        matched (``kept``: every line was found to match it)."""
        if (self._keep and not kept) or self._sums or self._column is not None:
            return False
        layouts = self._layouts
        layout = layouts.get(labels) if layouts is not None else None
        if layout is None:
            layout = _Layout.of(labels)
            if layout is None:
                return False
            if layouts is not None:
                layouts.keep(labels, layout)
        width = layout.width
        sums = values[:width]
        for start in range(width, len(values), width):  # a series' block at a time, in order
            sums = list(map(add, sums, values[start : start + width]))
        self._column = (layout, sums)
        return True

    def _spread(self) -> None:
        """Column sums kept as they were (``_by_columns``) made the per-bound sums that
        ``_add`` goes on from."""
        if self._column is None:
            return
        layout, sums = self._column
        self._column = None
        self._series = dict.fromkeys(layout.series)
        self._seen = {(key, bound) for key in layout.series for bound in layout.columns}
        self._sums = dict(zip(layout.columns, sums, strict=True))
        self._lines = dict.fromkeys(layout.columns, len(layout.series))

    def _add(self, labels: Mapping[str, str], value: float) -> None:
        """One bucket sample; one of a series other than ``keep``'s, or whose ``le`` bounds
        nothing, is passed over (as ``collect`` does). Called once per bucket line of a page
        that ``settle`` cannot sum by columns, so it works from what the extractor's label
        set already knows."""
        for name, wanted in self._keep:  # a loop, not any(): no generator per sample
            if labels.get(name) != wanted:
                return
        if type(labels) is Labels:
            try:
                key, bound = labels.series, labels.bound  # already worked out, mostly
            except AttributeError:
                key, bound = labels.derived()
        else:
            key, bound = series_key(labels), _bound(labels)
        if bound is None:
            return
        if (key, bound) in self._seen:
            self.duplicates += 1
            self.first_duplicate = self.first_duplicate or (*key, ("le", str(bound)))
            return
        self._seen.add((key, bound))
        sums = self._sums
        if bound in sums:
            sums[bound] += value
            self._lines[bound] += 1
        else:
            sums[bound] = value
            self._lines[bound] = 1
        self._series[key] = None

    def add_all(self, samples: Iterable[Sample]) -> Fold:
        """``_add`` for each of ``samples`` (``_bucket`` samples of the one histogram)."""
        self._spread()
        for _, labels, value, _ in samples:
            self._add(labels, value)
        return self

    def add_samples(self, samples: Sequence[Sample]) -> Fold:
        """``add_all``, summed by columns instead where the fold is still empty, the samples
        are laid out for it and all match ``keep`` (a Ray node's replica, told apart after
        its page was read): to the same bits, at a third of the cost."""
        if samples and not (self._sums or self._column is not None or self.labels):
            keep = self._keep
            if not keep or all(
                s.labels.get(name) == wanted for s in samples for name, wanted in keep
            ):
                sets = list(map(_LABELS_OF, samples))
                if self._by_columns(sets, list(map(_VALUE_OF, samples)), kept=True):
                    return self
        return self.add_all(samples)

    def folded(self, by_name: Mapping[str, list[Sample]]) -> Folded | None:
        """The fold with the page's ``_count`` and ``_sum`` of its family; ``None`` when no
        series was folded, or one has no ``_count``."""
        self.settle()
        family = self.sample_name.removesuffix("_bucket")
        if self._column is not None:  # every series has every column: the layout's bounds
            layout, column_sums = self._column
            series, bounds = layout.series, layout.bounds
            totals = column_sums if layout.order is None else [column_sums[i] for i in layout.order]
        else:
            series = tuple(self._series)
            every = len(series)
            bounds = _shared(tuple(sorted(b for b, n in self._lines.items() if n == every)))
            totals = [self._sums[b] for b in bounds]
        if not series:
            return None
        keep = dict(self._keep) or None
        counts = _by_series(by_name.get(family + "_count", ()), keep)
        try:
            per_series = [counts[key] for key in series]
        except KeyError:
            return None
        sums = _by_series(by_name.get(family + "_sum", ()), keep)
        histogram = Histogram(
            bounds,
            array("d", totals),
            sum(per_series),
            sum(sums.get(key, math.nan) for key in series),
        )
        return Folded(histogram, series, array("d", per_series))


_SERIES, _BOUND = attrgetter("series"), attrgetter("bound")  # Labels' worked-out slots
_LABELS_OF, _VALUE_OF = itemgetter(1), itemgetter(2)  # a Sample's


@dataclass(frozen=True, slots=True)
class _Layout:
    """How a page lists a histogram's bucket lines when they can be summed by columns: every
    series (``series``, in page order) in one block of ``width`` lines, each block with the
    same bounds in the same order (``columns``)."""

    width: int
    series: tuple[SeriesKey, ...]
    columns: tuple[float, ...]
    # Worked out once for every page summed by the layout: the bounds ascending (one shared
    # tuple), and the columns in that order (``None``: they are already).
    bounds: Bounds = field(init=False)
    order: tuple[int, ...] | None = field(init=False)

    def __post_init__(self) -> None:
        order = tuple(sorted(range(self.width), key=self.columns.__getitem__))
        bounds = tuple(self.columns[i] for i in order)
        object.__setattr__(self, "bounds", _shared(bounds))
        object.__setattr__(self, "order", None if bounds == self.columns else order)

    @staticmethod
    def of(labels: list[dict[str, str]]) -> _Layout | None:
        """The layout of bucket lines with these label sets, or ``None`` where they are not
        laid out so: a label set the extractor has not worked out (``Labels.derived``), a
        bound given twice or no number, a series in two blocks, blocks of different
        bounds."""
        try:
            keys = list(map(_SERIES, labels))
            bounds = list(map(_BOUND, labels))
        except AttributeError:  # not worked out, or not a Labels at all
            return None
        try:  # a block is as wide as the first bound comes round again
            width = bounds.index(bounds[0], 1)
        except ValueError:
            width = len(bounds)
        columns = bounds[:width]
        if len(bounds) % width or None in columns or len(set(columns)) != width:
            return None
        series = keys[::width]
        if len(set(series)) != len(series) or bounds != columns * len(series):
            return None
        if keys != list(chain.from_iterable(map(repeat, series, repeat(width)))):
            return None
        return _Layout(width, tuple(series), tuple(columns))


class Layouts:
    """The layouts (``_Layout``) of the pages one reader folds, by their bucket lines' label
    sets. A reader's pages (the pods of one deployment, scrape after scrape; a Ray model's
    replicas, each its own) are laid out alike, and the extractor hands out one label-set
    object per label text, so a page laid out as one before is known by comparing its list of
    label sets with a kept one: equal sets have equal series and bounds. Working the layout
    out again costs more than the sums (benchmarks/README.md). Kept by their number of lines
    and first label set, at most ``LINES`` label sets in all (a few batches of one page's
    bucket lines, ``FOLD_BATCH``, or a few hundred replicas' own): past it, all are
    dropped and kept afresh; a layout of more than a quarter of that is not kept. Where one
    tick's reads keep more than that (a model's replicas over a fleet of Ray nodes: 200
    nodes hold ~1,100 replicas of a model, 23,500 bucket lines), the bound doubles instead,
    up to ``GROWTH`` times and to no more than ``PAGE_LINES`` for each page the tick read:
    else every replica's layout is worked out again every tick, while one page's flood of
    lines grows nothing."""

    __slots__ = ("_allowed", "_kept", "_lines", "_read", "limit")
    LINES = 16_384
    GROWTH = 4

    def __init__(self) -> None:
        # (lines, id of the first label set) → the label sets, and their layout. The list
        # holds the first label set alive, so its id is never another's while kept.
        self._kept: dict[tuple[int, int], tuple[list[dict[str, str]], _Layout]] = {}
        self._lines = 0
        self._read = 0  # lines kept since the reader's read began (``begin``)
        self._allowed = self.LINES  # what the pages of that read may grow the bound to
        self.limit = self.LINES

    def begin(self, pages: int) -> None:
        """The reader's read of ``pages`` begins: what is kept from here to the next is one
        tick's."""
        self._read = 0
        self._allowed = min(self.LINES * self.GROWTH, max(self.LINES, pages * PAGE_LINES))

    def get(self, labels: list[dict[str, str]]) -> _Layout | None:
        if not labels:
            return None
        kept = self._kept.get((len(labels), id(labels[0])))
        if kept is None or kept[0] != labels:  # the same objects mostly: a pointer each
            return None
        return kept[1]

    def keep(self, labels: list[dict[str, str]], layout: _Layout) -> None:
        if not labels or len(labels) > self.LINES // 4:  # a hostile replica's: not kept
            return
        key = (len(labels), id(labels[0]))
        if key not in self._kept:
            if self._lines + len(labels) > self.limit:
                if self._read + len(labels) > self.limit and 2 * self.limit <= self._allowed:
                    self.limit *= 2  # one tick's own layouts: hold them
                else:
                    self._kept.clear()
                    self._lines = 0
            self._lines += len(labels)
            self._read += len(labels)
        self._kept[key] = (list(labels), layout)

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def lines(self) -> int:
        """The label sets kept, over every layout."""
        return self._lines


def increase(previous: Histogram, current: Histogram) -> Histogram:
    """What ``current`` added since ``previous``; a counter reset restarts from zero.

    Any bucket or the count going down means the process restarted (as PromQL's ``rate``
    assumes), so everything counted since then — ``current`` itself — is the increase.
    """
    if current.count < previous.count:
        return current
    if current.bounds == previous.bounds:  # shared, so usually the same object
        before = previous.counts
        if any(map(lt, current.counts, before)):  # the same bounds: as many counts
            return current
        counts = array("d", map(sub, current.counts, before))
    else:
        old = dict(zip(previous.bounds, previous.counts, strict=True))
        if any(c < old.get(b, 0.0) for b, c in zip(current.bounds, current.counts, strict=True)):
            return current
        counts = array(
            "d", [c - old.get(b, 0.0) for b, c in zip(current.bounds, current.counts, strict=True)]
        )
    return Histogram(
        current.bounds, counts, current.count - previous.count, current.sum - previous.sum
    )


def merge(histograms: Iterable[Histogram]) -> Histogram | None:
    """``sum by (le)`` over bounds every histogram has (a bound missing anywhere would skew)."""
    items = list(histograms)
    if not items:
        return None
    first = items[0]
    if all(h.bounds == first.bounds for h in items):
        bounds = first.bounds
        totals = list(first.counts)
        for histogram in items[1:]:
            totals = list(map(add, totals, histogram.counts))
    else:
        common = set.intersection(*(set(h.bounds) for h in items))
        sums = dict.fromkeys(common, 0.0)
        for histogram in items:
            for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
                if bound in sums:
                    sums[bound] += count
        bounds = tuple(sorted(sums))
        totals = [sums[b] for b in bounds]
    return Histogram(
        bounds=bounds,
        counts=array("d", totals),
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


def _monotonic(buckets: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Scrapes are not atomic: a later bucket may read lower; clamp as PromQL does."""
    fixed: list[tuple[float, float]] = []
    highest = 0.0
    for bound, count in buckets:
        highest = max(highest, count)
        fixed.append((bound, highest))
    return fixed
