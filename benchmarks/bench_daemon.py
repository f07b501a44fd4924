"""The daemon itself at fleet scale: CPU share of a core, peak RSS, tick durations, failures.

    python benchmarks/bench_daemon.py [--endpoints 200 2000] [--seconds 60]

Separate processes serve the ~150 KiB vLLM V1 page on loopback (their CPU is not counted);
``weight-controller run`` scrapes ``endpoints`` URLs (clusters of 10 pods) every 10 s for
``--seconds``. Its CPU comes from /proc/<pid>/stat, its peak RSS from VmHWM, tick durations
and failures from its own /metrics and /debug/state.
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
from pathlib import Path

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


async def run_one(endpoints: int, seconds: float, ports: list[int]) -> dict[str, float]:
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
            while first is None and time.monotonic() - began < 60:
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
            cpu0, wall0 = cpu_seconds(child.pid), time.monotonic()
            await asyncio.sleep(seconds)
            cpu = cpu_seconds(child.pid) - cpu0
            wall = time.monotonic() - wall0
            rss = peak_rss_mb(child.pid)
            last = await state(metrics_port)
        finally:
            child.terminate()
            await asyncio.wait_for(child.wait(), 20)
    ticks = last["ticks"]
    return {
        "endpoints": endpoints,
        "cpu_percent": 100 * cpu / wall,
        "peak_rss_mb": rss,
        "first_tick_failures": failures,
        "ticks": float(ticks) if isinstance(ticks, int) else 0.0,
    }


async def measure(sizes: list[int], seconds: float, ports: list[int]) -> None:
    await asyncio.sleep(2)  # the page servers start
    rows = [await run_one(n, seconds, ports) for n in sizes]
    print(f"the daemon, 10 s interval, {seconds:g} s measured after the first tick")
    print(
        f"{'endpoints':>10} {'CPU % of a core':>16} {'peak RSS MB':>12} {'1st-tick failures':>18}"
    )
    for r in rows:
        print(
            f"{r['endpoints']:>10.0f} {r['cpu_percent']:>16.1f} {r['peak_rss_mb']:>12.0f}"
            f" {r['first_tick_failures']:>18.0f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with page_servers(SERVERS) as ports:
        asyncio.run(measure(args.endpoints, args.seconds, ports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
