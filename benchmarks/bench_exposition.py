"""Our targeted extractor vs prometheus_client.parser on a ~150 KB vLLM V1 page, same run.

    python benchmarks/bench_exposition.py [--repeat N]

Prints ms/page for each and the speed-up. Both must yield the same wanted samples (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.vllm_page import vllm_v1_page
from controller.exposition import Extractor
from controller.sources.scrape import VLLM_E2E, VLLM_EXTRACTOR, VLLM_GAUGES


def best_ms(work: Callable[[], object], repeat: int, number: int) -> tuple[float, float]:
    """Best and median milliseconds per call over ``repeat`` rounds of ``number`` calls."""
    rounds = []
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(number):
            work()
        rounds.append((time.perf_counter() - began) * 1000 / number)
    return min(rounds), statistics.median(rounds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    page = vllm_v1_page()
    wanted = VLLM_EXTRACTOR.sample_names
    ours = sorted(
        (s.name, sorted(s.labels.items()), s.value) for s in VLLM_EXTRACTOR.extract(page).samples
    )
    reference = sorted(
        (s.name, sorted(s.labels.items()), float(s.value))
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name in wanted
    )
    assert ours == reference, "extractor and reference disagree"
    ref_best, ref_median = best_ms(
        lambda: list(text_string_to_metric_families(page)), args.repeat, 3
    )
    our_best, our_median = best_ms(lambda: VLLM_EXTRACTOR.extract(page), args.repeat, 100)
    # Cold: a new extractor per page, so no label set has been seen before (first scrape).
    cold_best, _ = best_ms(
        lambda: Extractor(VLLM_GAUGES, [VLLM_E2E]).extract(page), args.repeat, 20
    )
    print(
        f"page: {len(page) / 1024:.0f} KiB, {page.count(chr(10))} lines, {len(ours)} wanted samples"
    )
    print(f"prometheus_client.parser: {ref_best:8.3f} ms/page (median {ref_median:.3f})")
    print(f"controller.exposition:    {our_best:8.3f} ms/page (median {our_median:.3f})")
    print(f"controller.exposition, cold label cache: {cold_best:.3f} ms/page")
    print(f"speed-up: {ref_best / our_best:.1f}x (medians: {ref_median / our_median:.1f}x)")
    print(f"speed-up, cold: {ref_best / cold_best:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
