"""The daemon itself at fleet scale: CPU share of a core, peak RSS, tick durations, failures.

    python benchmarks/bench_daemon.py [--endpoints 200 2000 10000] [--seconds 60] [--concurrency N]

Separate processes serve the ~150 KiB vLLM V1 page on loopback (their CPU is not counted);
``weight-controller run`` scrapes ``endpoints`` URLs (clusters of 10 pods) every 10 s for
``--seconds``. Its CPU comes from /proc/<pid>/stat, its peak RSS from VmHWM, tick durations
from its own reconcile histogram on /metrics, and failing pages (first tick and last) from
/debug/state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from benchmarks.bench_fetch import free_port, page_servers  # noqa: E402  (the same page server)

SERVERS = 2  # page servers, so serving is not the bottleneck on a 2-core machine
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def state(port: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{port}/debug/state"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        found: dict[str, object] = await response.json()
        return found


async def tick_seconds(port: int) -> tuple[float, float]:
    """Ticks so far and their total seconds, from the daemon's own reconcile histogram."""
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    found = {"_count": 0.0, "_sum": 0.0}
    for line in text.splitlines():
        for suffix in found:
            if line.startswith(f"weight_controller_reconcile_duration_seconds{suffix} "):
                found[suffix] = float(line.split()[-1])
    return found["_count"], found["_sum"]


async def run_one(
    endpoints: int, seconds: float, ports: list[int], concurrency: int | None
) -> dict[str, Any]:
    clusters = []
    for c in range(endpoints // 10):
        port = ports[c % len(ports)]
        urls = [f"http://127.0.0.1:{port}/c{c}-p{p}/metrics" for p in range(10)]
        clusters.append({"name": f"c{c:05}", "vllm_urls": urls})
    metrics_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            json.dumps(
                {
                    "interval": "10s",
                    "clusters": clusters,
                    "server": {"bind": f"127.0.0.1:{metrics_port}"},
                    "log": {"format": "json", "level": "warning"},
                    **({"scrape": {"max_concurrency": concurrency}} if concurrency else {}),
                }
            )
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controller",
            "run",
            "--config",
            str(config),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        try:
            first = None
            began = time.monotonic()
            while first is None and time.monotonic() - began < 120:
                await asyncio.sleep(0.5)
                try:
                    snapshot = await state(metrics_port)
                except aiohttp.ClientError:
                    continue
                if isinstance(snapshot["ticks"], int) and snapshot["ticks"] >= 1:
                    first = snapshot
            assert first is not None, "no first tick"
            clusters_state = first["clusters"]
            assert isinstance(clusters_state, dict)
            failures = sum(len(c["errors"]) for c in clusters_state.values())
            ticks0, took0 = await tick_seconds(metrics_port)
            cpu0, wall0 = cpu_seconds(child.pid), time.monotonic()
            await asyncio.sleep(seconds)
            cpu = cpu_seconds(child.pid) - cpu0
            wall = time.monotonic() - wall0
            rss = peak_rss_mb(child.pid)
            ticks1, took1 = await tick_seconds(metrics_port)
            last = await state(metrics_port)
            last_clusters = last["clusters"]
            assert isinstance(last_clusters, dict)
            failing = sum(len(c["errors"]) for c in last_clusters.values())
            reasons = Counter(e["reason"] for c in last_clusters.values() for e in c["errors"])
        finally:
            child.terminate()
            await asyncio.wait_for(child.wait(), 20)
    ticks = ticks1 - ticks0
    return {
        "endpoints": endpoints,
        "cpu_percent": 100 * cpu / wall,
        "peak_rss_mb": rss,
        "first_tick_failures": failures,
        "last_tick_failures": failing,
        "ticks": ticks,
        "tick_seconds": (took1 - took0) / ticks if ticks else float("nan"),
        "reasons": dict(reasons),
    }


async def measure(
    sizes: list[int], seconds: float, ports: list[int], concurrency: int | None
) -> None:
    await asyncio.sleep(2)  # the page servers start
    rows = [await run_one(n, seconds, ports, concurrency) for n in sizes]
    limit = concurrency or "default"
    print(f"the daemon, 10 s interval, {seconds:g} s measured after the first tick,")
    print(f"scrape.max_concurrency {limit}")
    print(
        f"{'endpoints':>10} {'CPU % of a core':>16} {'peak RSS MB':>12} {'ticks':>6}"
        f" {'mean tick s':>12} {'1st-tick failures':>18} {'last-tick failures':>19}"
    )
    for r in rows:
        print(
            f"{r['endpoints']:>10.0f} {r['cpu_percent']:>16.1f} {r['peak_rss_mb']:>12.0f}"
            f" {r['ticks']:>6.0f} {r['tick_seconds']:>12.2f} {r['first_tick_failures']:>18.0f}"
            f" {r['last_tick_failures']:>19.0f}"
        )
    for r in rows:
        if r["reasons"]:
            print(
                f"{r['endpoints']:.0f} endpoints, the last tick's failing pages by reason:",
                r["reasons"],
            )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", type=int, nargs="+", default=[200, 2000, 10000])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, help="scrape.max_concurrency (default: ours)")
    args = parser.parse_args()
    with page_servers(SERVERS) as ports:
        asyncio.run(measure(args.endpoints, args.seconds, ports, args.concurrency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
