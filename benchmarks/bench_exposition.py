"""Our targeted extractor vs prometheus_client.parser and the splitlines floor, same run.

    python benchmarks/bench_exposition.py [--repeat N]

On a small, a medium and a 1 MB vLLM page: ms/page for the reference parser, for
``str.splitlines`` (the least any line-by-line reader costs), and for ours with a warm label
cache (every scrape after the first) and a cold one (the first). Ours and the reference must
yield the same wanted samples (checked).
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

from benchmarks.ray_page import MODELS, ray_node_page
from benchmarks.sglang_page import sglang_page
from benchmarks.vllm_page import vllm_v1_page
from controller.exposition import Extractor
from controller.settings import build_settings
from controller.sources.page import POD_EXTRACTOR, POD_GAUGES, POD_HISTOGRAMS, Page, read_page
from controller.sources.reader import PageReader


def per_call_ms(work: Callable[[], object], number: int) -> float:
    began = time.perf_counter()
    for _ in range(number):
        work()
    return (time.perf_counter() - began) * 1000 / number


FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"


def pages() -> list[tuple[str, str]]:
    """Small: a real vLLM V0 capture (../shared/fixtures); medium: the ~150 KiB V1 page of
    3 engines; large: the same server shape with 7 engines and 9 LoRA adapters, ~1 MiB."""
    found = [
        ("medium (V1, 3 engines)", vllm_v1_page()),
        ("medium (SGLang, 7 dp ranks)", sglang_page()),
        ("1 MB (V1, 7 engines, 9 LoRA)", vllm_v1_page(engines=7, adapters=9)),
    ]
    small = FIXTURES / "vllm-v0-aibrix-docs.prom"
    if small.exists():
        found.insert(0, ("small (real V0 capture)", small.read_text()))
    return found


def measure(page: str, repeat: int) -> dict[str, float]:
    wanted = POD_EXTRACTOR.sample_names
    ours = sorted(
        (s.name, sorted(s.labels.items()), s.value) for s in POD_EXTRACTOR.extract(page).samples
    )
    reference = sorted(
        (s.name, sorted(s.labels.items()), float(s.value))
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name in wanted
    )
    assert ours == reference, "extractor and reference disagree"
    scale = max(1, 150_000 // len(page))  # about the same work per timed round on every page
    # Cold: no label set seen before (the first scrape after a start). The patterns are
    # compiled once per process, at import, so only the label cache is emptied each time.
    fresh = Extractor(POD_GAUGES, POD_HISTOGRAMS)

    def cold_extract() -> None:
        fresh.forget()
        fresh.extract(page)

    work: dict[str, tuple[Callable[[], object], int]] = {
        "ref": (lambda: list(text_string_to_metric_families(page)), scale),
        "floor": (page.splitlines, 20 * scale),
        "warm": (lambda: POD_EXTRACTOR.extract(page), 20 * scale),
        "cold": (cold_extract, 5 * scale),
    }
    # Interleaved: every round times each side once, so a ratio compares times taken in the
    # same moment (this machine's speed drifts by up to 2x within a minute). Times are the
    # best round's; ratios the median of the rounds'.
    rounds = [{key: per_call_ms(f, n) for key, (f, n) in work.items()} for _ in range(repeat)]
    best = {key: min(r[key] for r in rounds) for key in work}
    ratio = {key: statistics.median(r["ref"] / r[key] for r in rounds) for key in ("warm", "cold")}
    ratio["floor"] = statistics.median(r["warm"] / r["floor"] for r in rounds)
    return {
        "kib": len(page) / 1024,
        "wanted": len(ours),
        **best,
        "warm x": ratio["warm"],
        "cold x": ratio["cold"],
        "warm/floor": ratio["floor"],
    }


def engines_compared(repeat: int, gauges_only: bool = False) -> tuple[float, float]:
    """An SGLang page's warm read against a vLLM page's of about the same size, timed in the
    same rounds: the medians of the rounds' ratios per KiB and per wanted sample (#41: no
    engine's page may cost more to read). ``gauges_only``: the SGLang page of scheduler gauges
    alone (``sglang_page``), which wants ~2.2× the V1 page's lines per KiB, so per KiB it does
    more of the work the floor does not."""
    sglang, vllm = sglang_page(gauges_only=gauges_only), vllm_v1_page()
    wanted = [len(POD_EXTRACTOR.extract(p).samples) for p in (sglang, vllm)]
    per_kib, per_sample = [], []
    for _ in range(repeat):
        s = per_call_ms(lambda: POD_EXTRACTOR.extract(sglang), 20)
        v = per_call_ms(lambda: POD_EXTRACTOR.extract(vllm), 20)
        per_kib.append((s / len(sglang)) / (v / len(vllm)))
        per_sample.append((s / wanted[0]) / (v / wanted[1]))
    return statistics.median(per_kib), statistics.median(per_sample)


def ray_node(repeat: int) -> tuple[float, float, float]:
    """A Ray node's page of 16 replicas of 3 models read for one model's cluster, warm: the
    page extracted, split by replica and summed (``PageReader.read``), against ``splitlines``
    of the page in the same rounds: one cluster reading the page alone (the daemon reads a
    node's page once for all of its models' clusters: ``bench_daemon --ray``). Returns the
    best ms of ours and of the floor, and the median of the rounds' ratios."""
    page = ray_node_page()
    url = "http://10.0.0.5:8080/metrics"
    config = {"name": "c", "vllm_urls": [url], "model_name": MODELS[0]}
    reader = PageReader(build_settings({"clusters": [config]}).clusters[0], 1)

    def ours() -> object:
        read = read_page(url, page, reader.pod_extractor)
        assert isinstance(read, Page)
        return reader.read([read], None, 0.0, 0.0)

    metrics = ours()
    assert getattr(metrics, "replicas", None) == 6 and not getattr(metrics, "errors", ()), metrics
    rounds = [(per_call_ms(ours, 20), per_call_ms(page.splitlines, 20)) for _ in range(repeat)]
    return (
        min(r[0] for r in rounds),
        min(r[1] for r in rounds),
        statistics.median(r[0] / r[1] for r in rounds),
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = [(name, measure(page, args.repeat)) for name, page in pages()]
    print("extraction, ms per page (best round) and ratios (median of interleaved rounds)")
    print(
        f"{'page':<30} {'KiB':>6} {'wanted':>6} {'prom_client':>11} {'splitlines':>10}"
        f" {'ours warm':>9} {'ours cold':>9} {'warm x':>7} {'cold x':>7} {'warm/floor':>10}"
    )
    for name, r in rows:
        print(
            f"{name:<30} {r['kib']:>6.0f} {r['wanted']:>6.0f} {r['ref']:>11.3f} {r['floor']:>10.3f}"
            f" {r['warm']:>9.3f} {r['cold']:>9.3f} {r['warm x']:>7.1f}"
            f" {r['cold x']:>7.1f} {r['warm/floor']:>10.2f}"
        )
    for gauges_only, shape in ((False, "as its collector writes it"), (True, "gauges only")):
        kib, sample = engines_compared(args.repeat, gauges_only)
        print(
            f"SGLang page ({shape}) / vLLM V1 page, warm (median of rounds): {kib:.2f} per KiB,"
            f" {sample:.2f} per wanted sample"
        )
    ours, floor, ratio = ray_node(args.repeat)
    print(
        f"Ray node page (16 replicas of 3 models, {len(ray_node_page()) // 1024} KiB), one model's"
        f" cluster, warm: {ours:.3f} ms, splitlines {floor:.3f} ms, {ratio:.2f}x the floor"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
