"""A hub querier (Thanos, ACM observability) holding many clusters: queries sent once per
signal for all of them (``queriers[]``) beside queries per cluster (``prometheus.url``).

    python benchmarks/bench_queriers.py [--clusters 50 200] [--ticks 10]

One separate process serves the ~150 KiB vLLM V1 page on loopback; Debian's Prometheus
(its own temporary storage, 127.0.0.1 only) scrapes it once per cluster every 10 s, each
target labelled with its ``cluster``. For each fleet size, in one sitting, both ways, a tick
being every cluster's fetch at once (as the loop does), the per-query timeout the daemon's
default (3 s):

- controller CPU per tick (``time.process_time``), Prometheus CPU per tick (``/proc`` utime +
  stime, less what its scraping costs in the same time), queries and failed clusters per tick.
"""

from __future__ import annotations

import argparse
import asyncio
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

from benchmarks.bench_fetch import free_port, page_servers, wait_up  # noqa: E402
from benchmarks.bench_prometheus import cpu_seconds, ready  # noqa: E402
from controller.settings import Settings, build_settings  # noqa: E402
from controller.sources.prometheus import (  # noqa: E402
    PrometheusQuerySource,
    prometheus_source,
    shared_queriers,
)

PUSH = "10s"  # the Prometheus here scrapes every 10 s


def config(port: int, clusters: int) -> dict[str, Any]:
    job = {
        "job_name": "vllm",
        "scrape_interval": PUSH,
        "scrape_timeout": "5s",
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {"__metrics_path__": f"/pod-{i}/metrics", "cluster": f"c{i}"},
            }
            for i in range(clusters)
        ],
    }
    return {"global": {"scrape_interval": PUSH}, "scrape_configs": [job]}


def settings_for(url: str, clusters: int, shared: bool) -> Settings:
    def prometheus(i: int) -> dict[str, Any]:
        if shared:
            return {"querier": "hub"}
        return {"url": url, "matchers": {"cluster": f"c{i}"}, "push_interval": PUSH}

    return build_settings(
        {
            "queriers": [{"name": "hub", "url": url, "push_interval": PUSH}] if shared else [],
            "clusters": [{"name": f"c{i}", "prometheus": prometheus(i)} for i in range(clusters)],
            "scrape": {"max_concurrency": 32},
        }
    )


async def one_way(
    session: aiohttp.ClientSession, url: str, pid: int, clusters: int, shared: bool, ticks: int
) -> dict[str, float]:
    settings = settings_for(url, clusters, shared)
    queriers = shared_queriers(
        settings.queriers, settings.prometheus_queries, settings.scrape, session
    )
    sources: list[PrometheusQuerySource] = [
        prometheus_source(c, settings.prometheus_queries, settings.scrape, session, queriers)
        for c in settings.clusters
    ]
    await asyncio.gather(*(s.fetch() for s in sources))  # warm: connections, first answers
    idle_start, idle_cpu = time.perf_counter(), cpu_seconds(pid)
    await asyncio.sleep(5)
    scraping = (cpu_seconds(pid) - idle_cpu) / (time.perf_counter() - idle_start)
    sent_before = _sent(sources)
    wall, ours, theirs = time.perf_counter(), time.process_time(), cpu_seconds(pid)
    failed = 0
    for _ in range(ticks):
        results = await asyncio.gather(*(s.fetch() for s in sources))
        failed += sum(1 for m in results if m.errors or m.kv_mean is None)
    wall = time.perf_counter() - wall
    ours = time.process_time() - ours
    theirs = cpu_seconds(pid) - theirs - scraping * wall
    return {
        "ours_ms": ours * 1000 / ticks,
        "theirs_ms": max(0.0, theirs) * 1000 / ticks,
        "queries": (_sent(sources) - sent_before) / ticks,
        "failed": failed / ticks,
        "tick_s": wall / ticks,
    }


def _sent(sources: list[PrometheusQuerySource]) -> int:
    queriers = {id(s.querier): s.querier for s in sources}
    return sum(q.sent for q in queriers.values())


async def fleet(port: int, clusters: int, ticks: int) -> dict[str, dict[str, float]]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus not found: apt-get install -y prometheus")
    with tempfile.TemporaryDirectory() as workdir:
        config_file = Path(workdir) / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config(port, clusters)))
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
                await asyncio.sleep(45)  # warm-up: every target scraped a few times (rates)
                return {
                    "per cluster": await one_way(session, url, process.pid, clusters, False, ticks),
                    "one querier": await one_way(session, url, process.pid, clusters, True, ticks),
                }
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def measure(port: int, sizes: list[int], ticks: int) -> None:
    await wait_up(f"http://127.0.0.1:{port}/pod-0/metrics")
    print(f"clusters read through one Prometheus 2.42, per tick (mean of {ticks} ticks)")
    header = ("clusters", "queries sent", "ours CPU ms", "Prometheus CPU ms", "queries", "failed")
    print(
        f"{header[0]:>8} {header[1]:>13} {header[2]:>12} {header[3]:>18} {header[4]:>8} "
        f"{header[5]:>7} {'tick s':>7}"
    )
    for size in sizes:
        for way, row in (await fleet(port, size, ticks)).items():
            print(
                f"{size:>8} {way:>13} {row['ours_ms']:>12.1f} {row['theirs_ms']:>18.1f} "
                f"{row['queries']:>8.0f} {row['failed']:>7.1f} {row['tick_s']:>7.2f}"
            )
    print(f"(measured {time.strftime('%Y-%m-%d')})")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clusters", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--ticks", type=int, default=10)
    args = parser.parse_args()
    with page_servers() as (port,):
        asyncio.run(measure(port, args.clusters, args.ticks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
