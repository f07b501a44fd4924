"""Side by side: our fetch + extract against Debian's Prometheus scraping the same targets.

    python benchmarks/bench_prometheus.py [--targets 200] [--seconds 60]

One separate process serves the ~150 KiB vLLM V1 page on loopback under ``/pod-N/metrics``.
On the same machine, in one sitting:

- ours: ScrapeSource fetching and extracting ``--targets`` pages (and 10× that), as a tick does,
  CPU from ``time.process_time``;
- Prometheus (``/usr/bin/prometheus``, its own temporary storage, 127.0.0.1 only) scraping the
  same ``--targets`` pages every 10 s, once keeping only the families we read
  (``metric_relabel_configs`` keep) and once storing everything; its CPU read from
  ``/proc/<pid>/stat`` (utime + stime) over ``--seconds`` after a warm-up, divided by the
  scrapes it made meanwhile (``prometheus_target_interval_length_seconds_count``).

Prints one table: CPU milliseconds per scrape, and ours as a ratio of Prometheus's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from benchmarks.bench_fetch import cpu_per_endpoint, free_port, page_servers, wait_up  # noqa: E402
from controller.settings import build_settings  # noqa: E402
from controller.sources.prometheus import prometheus_source  # noqa: E402

WANTED = (
    "vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|vllm:num_requests_waiting|"
    "vllm:num_requests_running|vllm:e2e_request_latency_seconds_(bucket|sum|count)"
)
TICKS = os.sysconf("SC_CLK_TCK")
PODS = 10  # targets per cluster label, for the PromQL source's queries


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def config(port: int, targets: int, keep_only_wanted: bool) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_name": "vllm",
        "scrape_interval": "10s",
        "scrape_timeout": "5s",
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {"__metrics_path__": f"/pod-{i}/metrics", "cluster": f"c{i // PODS}"},
            }
            for i in range(targets)
        ],
    }
    if keep_only_wanted:
        job["metric_relabel_configs"] = [
            {"source_labels": ["__name__"], "regex": WANTED, "action": "keep"}
        ]
    return {"global": {"scrape_interval": "10s"}, "scrape_configs": [job]}


async def scrapes_made(session: aiohttp.ClientSession, url: str) -> float:
    """Scrapes Prometheus has made, from its own /metrics (it does not scrape itself here)."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_target_interval_length_seconds_count"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(300):  # bounded: 30 s
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("Prometheus did not become ready in 30 s")


async def promql_cost(
    session: aiohttp.ClientSession, url: str, pid: int, clusters: int, rounds: int
) -> tuple[float, float]:
    """CPU ms per cluster read through the PromQL source: ours, and Prometheus's answering
    the queries (its CPU meanwhile, less what its scraping costs in the same time)."""
    settings = build_settings(
        {
            "clusters": [
                {
                    "name": f"c{i}",
                    "prometheus": {
                        "url": url,
                        "matchers": {"cluster": f"c{i}"},
                        "push_interval": "10s",  # its scrape interval here
                    },
                }
                for i in range(clusters)
            ],
            "prometheus_queries": {"window": "60s"},
        }
    )
    sources = [
        prometheus_source(cluster, settings.prometheus_queries, settings.scrape, session)
        for cluster in settings.clusters
    ]
    first = await sources[0].fetch()
    assert first.kv_mean is not None and not first.errors, first
    idle_start, idle_cpu = time.perf_counter(), cpu_seconds(pid)
    await asyncio.sleep(5)
    scraping = (cpu_seconds(pid) - idle_cpu) / (time.perf_counter() - idle_start)
    wall, ours, theirs = time.perf_counter(), time.process_time(), cpu_seconds(pid)
    for _ in range(rounds):
        await asyncio.gather(*(source.fetch() for source in sources))
    wall = time.perf_counter() - wall
    ours = time.process_time() - ours
    theirs = cpu_seconds(pid) - theirs - scraping * wall
    fetches = clusters * rounds
    print(f"(the PromQL source sends {len(sources[0].queries)} queries per cluster read)")
    return ours * 1000 / fetches, max(0.0, theirs) * 1000 / fetches


async def prometheus_cpu(
    port: int, targets: int, keep: bool, seconds: float
) -> tuple[float, tuple[float, float] | None]:
    """Prometheus's CPU milliseconds per scrape of one target; with ``keep``, also what a
    cluster read through the PromQL source costs (ours, Prometheus's)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus not found: apt-get install -y prometheus")
    with tempfile.TemporaryDirectory() as workdir:
        config_file = Path(workdir) / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config(port, targets, keep)))
        listen = free_port()
        url = f"http://127.0.0.1:{listen}"
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir}/data",
            f"--web.listen-address=127.0.0.1:{listen}",
            "--log.level=warn",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            async with aiohttp.ClientSession() as session:
                await ready(session, f"{url}/-/ready")
                await asyncio.sleep(25)  # warm-up: every target scraped at least twice
                scrapes, cpu = await scrapes_made(session, url), cpu_seconds(process.pid)
                await asyncio.sleep(seconds)
                scrapes = await scrapes_made(session, url) - scrapes
                cpu = cpu_seconds(process.pid) - cpu
                queried = None
                if keep:
                    queried = await promql_cost(session, url, process.pid, targets // PODS, 20)
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)
    if scrapes <= 0:
        raise SystemExit("Prometheus made no scrapes: is the page server up?")
    return cpu * 1000 / scrapes, queried


async def measure(port: int, targets: int, seconds: float) -> None:
    await wait_up(f"http://127.0.0.1:{port}/pod-0/metrics")
    ours_small, _ = await cpu_per_endpoint(port, targets, 5)
    ours_large, _ = await cpu_per_endpoint(port, targets * 10, 2)
    kept, queried = await prometheus_cpu(port, targets, True, seconds)
    stored, _ = await prometheus_cpu(port, targets, False, seconds)
    print(f"CPU ms per scrape of one 150 KiB vLLM page, {targets} targets, measured together")
    print(f"{'':44} {'ms':>7} {'ours / it':>10}")
    rows = (
        (f"ours, fetch + extract, {targets} endpoints", ours_small),
        (f"ours, fetch + extract, {targets * 10} endpoints", ours_large),
        ("Prometheus 2.42, keeping only what we read", kept),
        ("Prometheus 2.42, storing everything", stored),
    )
    for name, value in rows:
        ratio = "" if name.startswith("ours") else f"{ours_small / value:.2f}x"
        print(f"{name:44} {value:7.2f} {ratio:>10}")
    print(f"(goal: ours <= 1/3 of Prometheus's; measured {time.strftime('%Y-%m-%d')})")
    assert queried is not None
    ours_q, theirs_q = queried
    print(
        f"\nthe PromQL source, {targets // PODS} clusters of {PODS} pods, CPU ms per cluster read"
    )
    print(f"{'ours (its queries, JSON answers)':44} {ours_q:7.2f}")
    print(f"{'Prometheus answering them':44} {theirs_q:7.2f}")
    print(
        f"direct scraping costs us {ours_small:.2f} ms per pod: through Prometheus a cluster "
        f"costs us what {ours_q / ours_small:.1f} pods do, whatever its size"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with page_servers() as (port,):
        asyncio.run(measure(port, args.targets, args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
