"""Histograms from extracted samples: grouping, increase between scrapes, merge and quantile,
and a page's series folded into one."""

from __future__ import annotations

import math
import random
from array import array
from itertools import pairwise

import pytest

from benchmarks.vllm_page import vllm_v1_page
from controller import histograms
from controller.exposition import FOLD_BATCH, PIECE, Extractor, PageStream, Sample
from controller.histograms import Histogram
from controller.model import Latency
from controller.sources.between import LatencyWindow
from controller.sources.page import POD_EXTRACTOR, Page, read_page

Read = tuple[Latency | None, bool]

E2E = "vllm:e2e_request_latency_seconds"
EXTRACTOR = Extractor(histograms=[E2E])


def page(
    engine_counts: dict[str, list[int]], bounds: tuple[str, ...] = ("0.5", "1", "+Inf")
) -> str:
    lines = []
    for engine, counts in engine_counts.items():
        for bound, count in zip(bounds, counts, strict=True):
            lines.append(f'{E2E}_bucket{{engine="{engine}",le="{bound}"}} {count}')
        lines.append(f'{E2E}_count{{engine="{engine}"}} {counts[-1]}')
        lines.append(f'{E2E}_sum{{engine="{engine}"}} {counts[-1] * 0.7}')
    return "\n".join(lines) + "\n"


def collect(text: str) -> dict[histograms.SeriesKey, Histogram]:
    return histograms.collect(EXTRACTOR.extract(text).by_name(), E2E)


def test_series_are_grouped_without_le_and_share_one_bounds_tuple() -> None:
    found = collect(page({"0": [1, 3, 4], "1": [0, 2, 2]}))
    assert set(found) == {(("engine", "0"),), (("engine", "1"),)}
    zero, one = found[(("engine", "0"),)], found[(("engine", "1"),)]
    assert zero.buckets == [(0.5, 1.0), (1.0, 3.0), (math.inf, 4.0)]
    assert (zero.count, one.count) == (4.0, 2.0)
    # equal bound sets are one object, on this page and the next: the baseline stays small
    again = collect(page({"0": [2, 5, 6]}))[(("engine", "0"),)]
    assert zero.bounds is one.bounds is again.bounds


def test_bounds_out_of_order_on_the_page_are_sorted() -> None:
    text = page({"0": [4, 1, 3]}, bounds=("+Inf", "0.5", "1"))
    (only,) = collect(text).values()
    assert only.buckets == [(0.5, 1.0), (1.0, 3.0), (math.inf, 4.0)]


def test_increase_subtracts_and_a_reset_restarts_from_the_current_counts() -> None:
    before = collect(page({"0": [1, 3, 4]}))[(("engine", "0"),)]
    after = collect(page({"0": [2, 6, 9]}))[(("engine", "0"),)]
    grown = histograms.increase(before, after)
    assert grown.buckets == [(0.5, 1.0), (1.0, 3.0), (math.inf, 5.0)]
    assert grown.count == 5.0
    restarted = collect(page({"0": [0, 1, 1]}))[(("engine", "0"),)]
    assert histograms.increase(after, restarted) is restarted
    # a bucket going down while the count grows is a restart too
    odd = collect(page({"0": [0, 7, 10]}))[(("engine", "0"),)]
    assert histograms.increase(after, odd) is odd


def test_increase_across_a_changed_bucket_layout_uses_zero_for_new_bounds() -> None:
    before = Histogram((1.0, math.inf), array("d", [2, 4]), 4.0, 3.0)
    after = Histogram((0.5, 1.0, math.inf), array("d", [1, 3, 6]), 6.0, 5.0)
    grown = histograms.increase(before, after)
    assert grown.buckets == [(0.5, 1.0), (1.0, 1.0), (math.inf, 2.0)]
    assert (grown.count, grown.sum) == (2.0, 2.0)


def test_merge_sums_by_le_and_keeps_only_bounds_every_histogram_has() -> None:
    same = list(collect(page({"0": [1, 3, 4], "1": [0, 2, 2]})).values())
    merged = histograms.merge(same)
    assert merged is not None
    assert merged.buckets == [(0.5, 1.0), (1.0, 5.0), (math.inf, 6.0)]
    assert merged.count == 6.0
    other = Histogram((1.0, 2.0, math.inf), array("d", [1, 1, 2]), 2.0, 1.0)
    mixed = histograms.merge([*same, other])
    assert mixed is not None
    assert mixed.buckets == [(1.0, 6.0), (math.inf, 8.0)]
    assert histograms.merge([]) is None


def test_quantile_follows_histogram_quantile() -> None:
    merged = histograms.merge(collect(page({"0": [2, 6, 8]})).values())
    assert merged is not None
    # rank 4 of 8 lands in (0.5, 1]: 0.5 + 0.5 * (4 - 2) / 4
    assert histograms.quantile(0.5, merged) == 0.75
    # rank 7.2 lands in +Inf: the top finite bound
    assert histograms.quantile(0.9, merged) == 1.0


def test_plain_label_dicts_are_read_the_same_as_extracted_ones() -> None:
    samples = {
        f"{E2E}_bucket": [
            Sample(f"{E2E}_bucket", {"engine": "0", "le": "1"}, 3.0),
            Sample(f"{E2E}_bucket", {"engine": "0", "le": "+Inf"}, 4.0),
            Sample(f"{E2E}_bucket", {"engine": "0", "le": "bad"}, 9.0),
        ],
        f"{E2E}_count": [Sample(f"{E2E}_count", {"engine": "0"}, 4.0)],
    }
    (only,) = histograms.collect(samples, E2E).values()
    assert only.buckets == [(1.0, 3.0), (math.inf, 4.0)]
    assert math.isnan(only.sum)


def test_a_nan_bound_is_left_out_like_any_other_malformed_le() -> None:
    text = (
        f'{E2E}_bucket{{le="1"}} 2\n{E2E}_bucket{{le="NaN"}} 3\n{E2E}_bucket{{le="+Inf"}} 4\n'
        f"{E2E}_count 4\n{E2E}_sum 2.5\n"
    )
    (only,) = collect(text).values()
    assert only.buckets == [(1.0, 2.0), (math.inf, 4.0)]


# ---- a page's series folded into one (Fold): what pods-only clusters keep between scrapes ----


def _grown(text: str, factor: int) -> str:
    """``text`` with every e2e bucket, count and sum multiplied by ``factor``: the same
    process later on (the counters stay cumulative and consistent)."""
    out = []
    for line in text.splitlines():
        if line.startswith(E2E) and not line.startswith(E2E + "_created"):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def _both_ways(
    ticks: list[list[str | None]], keep: dict[str, str] | None
) -> list[tuple[Read, Read]]:
    """Each tick's (latency, fell) read per series (``collect``, ``observe``) and folded
    (``Fold``, ``observe_folded``) from the same pages; ``None``: that pod did not answer."""
    per_series, folded = LatencyWindow(1), LatencyWindow(1)
    out: list[tuple[Read, Read]] = []
    for texts in ticks:
        pages = [read_page(f"p{i}", t, POD_EXTRACTOR) for i, t in enumerate(texts) if t is not None]
        assert all(isinstance(p, Page) for p in pages)
        read = [p for p in pages if isinstance(p, Page)]
        series = [(p.url, histograms.collect(p.samples, E2E, keep)) for p in read]
        folds = [
            (
                p.url,
                histograms.Fold(E2E, keep).add_all(p.samples[f"{E2E}_bucket"]).folded(p.samples),
            )
            for p in read
        ]
        out.append((per_series.observe(E2E, series), folded.observe_folded(E2E, folds)))
    return out


def _same(a: Read, b: Read) -> None:
    """Quantiles and counts exactly; the mean to rounding (a sum of differences against a
    difference of sums)."""
    (la, fa), (lb, fb) = a, b
    assert fa == fb
    if la is None or lb is None:
        assert la is lb
        return
    assert (la.p50, la.p90, la.requests, la.family) == (lb.p50, lb.p90, lb.requests, lb.family)
    if la.mean is None or lb.mean is None:
        assert la.mean is lb.mean
    else:
        assert abs(la.mean - lb.mean) <= 1e-12 * abs(la.mean)


@pytest.mark.parametrize("keep", [None, {"model_name": "sql-lora"}], ids=["all", "one-model"])
def test_a_folded_page_reads_as_its_series_merged(keep: dict[str, str] | None) -> None:
    """V1-style pages (3 engines × 3 model names: 9 series each), three pods growing at
    different rates, one not answering for a tick and one restarting: latency, its request
    count and whether a count fell are what reading each series gives, tick by tick."""
    base = [vllm_v1_page(seed=i) for i in range(3)]
    ticks: list[list[str | None]] = []
    for tick in range(6):
        texts: list[str | None] = [_grown(t, 1 + tick * (i + 1)) for i, t in enumerate(base)]
        if tick == 2:
            texts[1] = None  # no answer: its baseline stays
        if tick == 4:
            texts[2] = base[2]  # a restart: its counts fall back
        ticks.append(texts)
    results = _both_ways(ticks, keep)
    for a, b in results:
        _same(a, b)
    assert results[0][1][0] is None  # the first scrape only sets baselines
    assert all(latency is not None for (latency, _), _ in results[1:])
    assert results[4][1][1] is True and results[5][1][1] is False


def test_a_series_that_appears_leaves_its_page_out_for_that_interval() -> None:
    """Where folding parts from reading each series (documented on Fold): a new series means
    the page's fold has no baseline, so that page counts from the next scrape."""
    one = page({"0": [1, 3, 4]})
    two = page({"0": [2, 6, 8], "1": [1, 1, 1]})
    later = page({"0": [3, 9, 12], "1": [2, 2, 2]})
    results = _both_ways([[one], [two], [later]], None)
    per_series, folded = results[1]
    assert per_series[0] is not None and per_series[0].requests == 4  # engine 0 alone
    assert folded == (None, False)
    for a, b in results[2:]:
        _same(a, b)


def test_a_fold_keeps_the_bounds_every_series_has_and_needs_every_count() -> None:
    text = (
        f'{E2E}_bucket{{engine="0",le="1"}} 2\n{E2E}_bucket{{engine="0",le="2"}} 3\n'
        f'{E2E}_bucket{{engine="0",le="+Inf"}} 4\n{E2E}_count{{engine="0"}} 4\n'
        f'{E2E}_bucket{{engine="1",le="1"}} 1\n{E2E}_bucket{{engine="1",le="+Inf"}} 5\n'
        f'{E2E}_bucket{{engine="1",le="bad"}} 9\n{E2E}_count{{engine="1"}} 5\n'
        f'{E2E}_sum{{engine="0"}} 2.5\n{E2E}_sum{{engine="1"}} 1.5\n'
    )
    samples = EXTRACTOR.extract(text).by_name()
    folded = histograms.Fold(E2E).add_all(samples[f"{E2E}_bucket"]).folded(samples)
    assert folded is not None
    assert folded.histogram.buckets == [(1.0, 3.0), (math.inf, 9.0)]  # le="2": engine 0 only
    assert (folded.histogram.count, folded.histogram.sum) == (9.0, 4.0)
    assert (
        folded.histogram.bounds
        is collect(page({"0": [1, 1]}, ("1", "+Inf")))[(("engine", "0"),)].bounds
    )  # shared, as collect's are
    no_count = text.replace(f'{E2E}_count{{engine="1"}} 5\n', "")
    samples = EXTRACTOR.extract(no_count).by_name()
    assert histograms.Fold(E2E).add_all(samples[f"{E2E}_bucket"]).folded(samples) is None
    assert histograms.Fold(E2E).folded(samples) is None  # nothing folded


def _odd(text: str) -> str:
    """``text`` with its bucket lines written every way the format allows: a timestamp on
    some, an exemplar on others, CRLF, indentation, the ``vllm_`` spelling, a bound that is
    no number."""
    out = []
    for n, line in enumerate(text.splitlines()):
        if line.startswith(E2E + "_bucket"):
            kind = n % 6
            if kind == 1:
                line += " 1700000000000"
            elif kind == 2:
                line += ' # {trace_id="a"} 0.5'
            elif kind == 3:
                line = "  " + line + "\r"
            elif kind == 4:
                line = line.replace("vllm:", "vllm_", 1)
        out.append(line)
    out.append(f'{E2E}_bucket{{engine="9",le="soon"}} 3')
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("keep", [None, {"model_name": "sql-lora"}], ids=["all", "one-model"])
@pytest.mark.parametrize("odd", [False, True], ids=["plain", "odd"])
def test_a_page_folded_as_it_is_read_is_the_fold_of_its_samples(
    keep: dict[str, str] | None, odd: bool
) -> None:
    """What a pods-only cluster keeps (``PageReader.pod_stream``): the buckets summed as the
    page streams in, in pieces that split lines anywhere, never made samples; the same
    ``Folded`` as folding the samples of the same page read whole, and the same other samples."""
    for seed in range(4):
        text = vllm_v1_page(seed=seed)
        text = _odd(text) if odd else text
        whole = read_page("p", text, POD_EXTRACTOR)
        assert isinstance(whole, Page)
        expected = histograms.Fold(E2E, keep).add_all(whole.samples[f"{E2E}_bucket"])
        stream = PageStream(POD_EXTRACTOR, fold=histograms.Fold(E2E, keep))
        size = 1000 + 977 * seed  # pieces that end mid-line
        for start in range(0, len(text), size):
            stream.feed(text[start : start + size])
        assert stream.result.invalid_lines == 0 and stream.result.fold is not None
        samples = stream.result.by_name()
        assert f"{E2E}_bucket" not in samples
        assert samples == {k: v for k, v in whole.samples.items() if k != f"{E2E}_bucket"}
        got = stream.result.fold
        assert isinstance(got, histograms.Fold)
        a, b = got.folded(samples), expected.folded(whole.samples)
        assert a is not None and b is not None
        assert (a.series, list(a.counts)) == (b.series, list(b.counts))
        assert a.histogram.bounds == b.histogram.bounds
        assert list(a.histogram.counts) == list(b.histogram.counts)
        assert a.histogram.count == b.histogram.count
        sums = (a.histogram.sum, b.histogram.sum)
        assert sums[0] == sums[1] or all(math.isnan(x) for x in sums)


# Values whose sums change with the order they are added in (0.1 + 0.2 + 0.3 is not
# 0.3 + 0.2 + 0.1; 1e16 + 1 loses the 1), and now and then NaN, an infinity, -0, the largest
# and smallest doubles.
_ORDERED = ["0.1", "0.2", "0.3", "0.7", "1e16", "1", "-1e16", "3e-5", "7"]
_HOSTILE = ["NaN", "+Inf", "-Inf", "-0", "1e300", "5e-324"]
_BOUNDS = ("0.3", "0.5", "1.0", "2.5", "10.0", "+Inf")


def _laid_out(rng: random.Random, layout: str) -> tuple[str, list[str]]:
    """Bucket lines of a few series laid out as ``layout`` says, then a count for each
    series (``folded`` needs one), and the series' engines."""
    engines = [str(e) for e in range(rng.randint(1, 6))]
    values = _HOSTILE if rng.random() < 0.2 else _ORDERED
    rows = [(e, b, rng.choice(values)) for e in engines for b in _BOUNDS]
    width = len(_BOUNDS)
    if layout == "split" and len(engines) > 1:  # a series' last line after the next series
        rows.insert(2 * width - 1, rows.pop(width - 1))
    elif layout == "twice":  # a bucket line given twice
        at = rng.randrange(len(rows))
        rows.insert(at, rows[at])
    elif layout == "missing":  # one series without one of its bounds
        rows.pop(rng.randrange(len(rows)))
    elif layout == "descending":  # blocks still, each with its bounds from the top down
        rows = [r for e in engines for r in reversed([r for r in rows if r[0] == e])]
    elif layout == "bucket-major":  # every series' first bucket, then every second, ...
        rows.sort(key=lambda r: _BOUNDS.index(r[1]))
    elif layout == "no-number":  # a bound that bounds nothing
        e, _, v = rows[0]
        rows[0] = (e, "soon", v)
    elif layout == "stray":  # inside a block, a line of a series of its own
        at = rng.randrange(len(engines)) * width + rng.randrange(1, width)
        rows[at] = ("9", *rows[at][1:])
        engines.append("9")
    lines = [f'{E2E}_bucket{{engine="{e}",le="{b}"}} {v}' for e, b, v in rows]
    lines += [f'{E2E}_count{{engine="{e}"}} 1' for e in engines]
    return "\n".join(lines) + "\n", engines


@pytest.mark.parametrize(
    "layout",
    ["blocks", "descending", "split", "twice", "missing", "bucket-major", "no-number", "stray"],
)
def test_a_fold_summed_by_columns_is_the_line_by_line_sum_to_the_last_bit(layout: str) -> None:
    """What the extractor hands a ``Fold`` is summed a column per bound where the page lists
    each series in one block of the same bounds, else line by line; either way each bound's
    values are added in page order, so the sums are the same bits. Every other layout leaves
    the column sums alone."""
    rng = random.Random(f"columns-{layout}")
    for _ in range(40):
        text, engines = _laid_out(rng, layout)
        # one series alone is one block whatever was moved or dropped
        # (a bucket whose le is no number is skipped as it is read: its series is one short)
        by_columns = layout in ("blocks", "descending") or (
            len(engines) == 1 and layout in ("split", "missing", "bucket-major", "no-number")
        )
        for _ in range(2):  # the second time, every label text is one parsed before
            stream = PageStream(EXTRACTOR, fold=histograms.Fold(E2E))
            stream.feed(text)
            fold = stream.result.fold
            assert isinstance(fold, histograms.Fold) and stream.result.invalid_lines == 0
            columns = histograms.Fold(E2E)._by_columns(list(fold.labels), list(fold.values))
            assert columns is by_columns
            _sums_as_line_by_line(fold, text)


@pytest.mark.parametrize(
    "layout",
    ["blocks", "descending", "split", "twice", "missing", "bucket-major", "no-number", "stray"],
)
def test_samples_summed_by_columns_are_their_line_by_line_sum_to_the_last_bit(
    layout: str,
) -> None:
    """A Ray replica's buckets, told apart after its node's page was read, are summed by
    columns (``add_samples``) where they are laid out for it and all match the fold's
    ``keep``: the same series, bounds, counts (to the bit) and repeats as ``add_all``'s line
    by line; a keep that some lines miss, or a layout that is not blocks, goes line by line."""
    rng = random.Random(f"samples-{layout}")
    layouts = histograms.Layouts()
    for _ in range(40):
        text, engines = _laid_out(rng, layout)
        whole = EXTRACTOR.extract(text).by_name()
        buckets = whole[f"{E2E}_bucket"]
        for keep in (None, {"engine": engines[0]}, {"engine": "absent"}):
            for _ in range(2):  # the second time, from the layout kept the first
                fast = histograms.Fold(E2E, keep, layouts).add_samples(buckets)
                slow = histograms.Fold(E2E, keep).add_all(buckets)
                assert (fast.duplicates, fast.first_duplicate) == (
                    slow.duplicates,
                    slow.first_duplicate,
                )
                a, b = fast.folded(whole), slow.folded(whole)
                assert (a is None) == (b is None)
                if a is not None and b is not None:
                    assert (a.series, a.histogram.bounds) == (b.series, b.histogram.bounds)
                    assert _bits(a.histogram.counts) == _bits(b.histogram.counts)
                    assert _bits(a.counts) == _bits(b.counts)
    if layout in ("blocks", "descending"):
        assert len(layouts) > 0  # these were summed by columns, their layouts kept
    assert layouts.lines <= histograms.Layouts.LINES


def test_a_layout_kept_from_earlier_pages_sums_only_a_page_laid_out_the_same() -> None:
    """One reader's ``Layouts`` over pages of every layout, mixed: those of one number of
    lines may hold the same label sets in another order ("split", "bucket-major"), or
    another label set ("stray"); each is summed to the same bits as line by line, so a kept
    layout is only ever used for a page laid out as it was."""
    rng = random.Random("layouts")
    kinds = [
        "blocks",
        "descending",
        "split",
        "twice",
        "missing",
        "bucket-major",
        "no-number",
        "stray",
    ]
    layouts = histograms.Layouts()
    reused = 0
    for _ in range(300):
        text, _ = _laid_out(rng, rng.choice(kinds))
        stream = PageStream(EXTRACTOR, fold=histograms.Fold(E2E, layouts=layouts))
        stream.feed(text)
        fold = stream.result.fold
        assert isinstance(fold, histograms.Fold)
        reused += layouts.get(fold.labels) is not None
        _sums_as_line_by_line(fold, text)
        assert layouts.lines <= histograms.Layouts.LINES
    assert reused >= 20  # pages laid out as an earlier one were summed by its layout


def test_lines_after_a_batch_summed_by_columns_are_added_to_its_sums() -> None:
    """A long page is summed a batch at a time: a first batch laid out in blocks is summed by
    columns and kept so, and the lines of the next batch go on from its sums, to the same
    bits as the whole page folded line by line."""
    rng = random.Random("batches")
    for _ in range(20):
        engines = [str(e) for e in range(rng.randint(2, 8))]
        cut = rng.randint(1, len(engines) - 1)  # the first batch: whole series, in blocks
        rows = [(e, b, rng.choice(_ORDERED)) for e in engines for b in _BOUNDS]
        if rng.random() < 0.5:  # the second batch another layout: line by line either way
            rows[cut * len(_BOUNDS) :] = sorted(rows[cut * len(_BOUNDS) :], key=lambda r: r[1])
        lines = [f'{E2E}_bucket{{engine="{e}",le="{b}"}} {v}' for e, b, v in rows]
        lines += [f'{E2E}_count{{engine="{e}"}} 1' for e in engines]
        first = "".join(f"{line}\n" for line in lines[: cut * len(_BOUNDS)])
        text = "\n".join(lines) + "\n"
        stream = PageStream(EXTRACTOR, fold=histograms.Fold(E2E))
        fold = stream.result.fold
        assert isinstance(fold, histograms.Fold)
        stream.feed(first)
        fold.settle()  # as PageStream does once FOLD_BATCH lines wait
        assert fold._column is not None  # summed by columns, not yet spread
        stream.feed(text[len(first) :])
        _sums_as_line_by_line(fold, text)


def _sums_as_line_by_line(fold: histograms.Fold, text: str) -> None:
    """``fold``, fed ``text``, sums as the page read whole and folded line by line does: the
    same series and bounds, and counts of the same bits."""
    whole = EXTRACTOR.extract(text).by_name()
    a = fold.folded(whole)
    b = histograms.Fold(E2E).add_all(whole[f"{E2E}_bucket"]).folded(whole)
    assert a is not None and b is not None
    assert (a.series, a.histogram.bounds) == (b.series, b.histogram.bounds)
    assert _bits(a.histogram.counts) == _bits(b.histogram.counts)


def _bits(values: array[float]) -> list[str]:
    """Each double's exact bits; every NaN alike (which sign the sum of two NaNs has depends
    on how the C compiler ordered one addition, in the interpreter's ``+=`` as in ``Fold._add``)."""
    return ["nan" if math.isnan(v) else v.hex() for v in values]


def test_a_long_page_of_buckets_is_summed_as_it_streams_and_the_same_as_line_by_line() -> None:
    """A page of far more bucket lines than a real one (2,000 series, 12,000 lines: a hostile
    or broken exporter) never has more than ``FOLD_BATCH`` lines and one piece's waiting to be
    summed, and sums as the whole page read line by line does."""
    rng = random.Random("long")
    engines = [str(e) for e in range(2000)]
    lines = [
        f'{E2E}_bucket{{engine="{e}",le="{b}"}} {rng.choice(_ORDERED)}'
        for e in engines
        for b in _BOUNDS
    ]
    lines += [f'{E2E}_count{{engine="{e}"}} 1' for e in engines]
    text = "\n".join(lines) + "\n"
    stream = PageStream(EXTRACTOR, fold=histograms.Fold(E2E))
    fold = stream.result.fold
    assert isinstance(fold, histograms.Fold)
    waiting = []
    for start in range(0, len(text), PIECE):
        stream.feed(text[start : start + PIECE])
        waiting.append(len(fold.values))
    per_piece = PIECE // len(lines[0])  # bucket lines are no shorter than the first
    assert max(waiting) < FOLD_BATCH + per_piece
    assert sum(1 for a, b in pairwise(waiting) if b < a) >= 2  # summed along the way
    _sums_as_line_by_line(fold, text)


def test_layouts_never_hold_more_label_sets_than_their_cap() -> None:
    """A replica's buckets come whole, not in batches: one hostile replica of more lines
    than the cap allows is summed but not kept, and many small ones are dropped and kept
    afresh, so what is held stays bounded (the cap grown for one tick's own, at most
    ``GROWTH`` times)."""
    layouts = histograms.Layouts()
    cap = histograms.Layouts.LINES * histograms.Layouts.GROWTH
    big = [{"le": str(i)} for i in range(histograms.Layouts.LINES)]
    layouts.keep(big, object())  # type: ignore[arg-type]
    assert len(layouts) == 0 and layouts.lines == 0
    layouts.begin(pages=1_000)
    for i in range(cap // 10):
        layouts.keep([{"r": str(i), "le": str(b)} for b in range(22)], object())  # type: ignore[arg-type]
        assert layouts.lines <= layouts.limit <= cap
    assert 0 < len(layouts) < cap // 10 and layouts.limit == cap


def _replicas() -> list[list[dict[str, str]]]:
    """Replicas' bucket label sets, 22 each, twice the first bound's lines in all (each
    tick hands the same objects over, as the extractor's cache does)."""
    return [
        [{"r": str(i), "le": str(b)} for b in range(22)]
        for i in range(2 * histograms.Layouts.LINES // 22)
    ]


def _read_replicas(
    layouts: histograms.Layouts, replicas: list[list[dict[str, str]]], pages: int
) -> int:
    """One tick of a reader over ``replicas`` read from ``pages`` pages: each replica's
    layout found, or kept. Returns the replicas found."""
    found = 0
    layouts.begin(pages=pages)
    for labels in replicas:
        if layouts.get(labels) is not None:
            found += 1
        else:
            layouts.keep(labels, object())  # type: ignore[arg-type]
    return found


def test_a_tick_of_more_replicas_than_the_cap_holds_finds_them_all_the_next() -> None:
    """A model over 200 Ray nodes has ~1,100 replicas, 23,500 bucket lines: past the cap,
    the layouts were dropped part way through every tick and each replica's worked out again
    the next. One tick's own grow the cap; the next tick finds every one of them."""
    layouts, replicas = histograms.Layouts(), _replicas()
    assert _read_replicas(layouts, replicas, pages=200) == 0
    assert _read_replicas(layouts, replicas, pages=200) == len(replicas)
    assert layouts.limit == 2 * histograms.Layouts.LINES


def test_one_page_of_many_replicas_grows_no_layouts() -> None:
    """The bound grows to what the tick's pages may hold (``PAGE_LINES`` each): one page's
    flood of replicas is dropped and kept afresh at the first bound, read after read."""
    layouts, replicas = histograms.Layouts(), _replicas()
    for _ in range(3):
        _read_replicas(layouts, replicas, pages=1)
        assert layouts.lines <= layouts.limit == histograms.Layouts.LINES
