"""Histograms from extracted samples: grouping, increase between scrapes, merge and quantile."""

from __future__ import annotations

import math
from array import array

from controller import histograms
from controller.exposition import Extractor, Sample
from controller.histograms import Histogram

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
