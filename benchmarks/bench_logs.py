"""Log volume: lines (and bytes) per minute at info, in steady state and during the demo's story.

    python benchmarks/bench_logs.py [--minutes 60]

Steady state: 2, 20 and 200 clusters whose KV never moves (seeded ±1% noise), the real
Reconciler on a virtual clock at a 10 s interval, logs rendered as JSON by the real pipeline
(summaries every 5 minutes, the default). The story: the demo's three clusters served over
loopback, one 60-tick cycle (b heats up and cools, c fails and recovers) at the demo's 1 s
interval, so one cycle is one minute.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller import logs  # noqa: E402
from controller.app import Controller  # noqa: E402
from controller.demo.runner import PERIOD, apply_scenario, demo_fleet  # noqa: E402
from controller.model import ClusterMetrics  # noqa: E402
from controller.settings import build_settings  # noqa: E402
from controller.testing import Driver, VirtualClock  # noqa: E402


def steady_metrics(names: list[str], now: float, rng: random.Random) -> dict[str, ClusterMetrics]:
    """Clusters whose KV barely moves (±1 point)."""
    kvs = [0.4 + rng.uniform(-0.01, 0.01) for _ in names]
    return {
        n: ClusterMetrics(n, now, 0.01, 2, 2, kv_mean=kv, kv_max=kv)
        for n, kv in zip(names, kvs, strict=True)
    }


def capture() -> io.StringIO:
    stream = io.StringIO()
    logs.configure("info", "json", stream)
    return stream


def counted(stream: io.StringIO, minutes: float) -> tuple[float, float, float]:
    lines = [json.loads(x) for x in stream.getvalue().splitlines() if x.startswith("{")]
    besides = [e for e in lines if e["event"] != "target summary" and not e.get("summary")]
    size = len(stream.getvalue().encode())
    return len(lines) / minutes, len(besides) / minutes, size / minutes / 1024


async def steady(clusters: int, minutes: float) -> tuple[float, float, float]:
    rng = random.Random(f"steady-{clusters}")
    names = [f"c{i:03}" for i in range(clusters)]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in names],
        }
    )
    driver, now = Driver(settings), 1_000_000.0
    stream = capture()
    for _ in range(6):  # the first minute settles the first weights; not counted
        await driver.tick(now, steady_metrics(names, now, rng))
        now += 10
    stream.seek(0)
    stream.truncate()
    for _ in range(int(minutes * 6)):
        await driver.tick(now, steady_metrics(names, now, rng))
        now += 10
    return counted(stream, minutes)


async def story() -> tuple[float, float, float]:
    clock = VirtualClock(1_000_000.0)
    async with demo_fleet() as fleet:
        settings = build_settings(
            {
                "interval": 1,
                "clusters": fleet.settings_clusters(),
                "scrape": {"timeout": 0.5, "min_latency_requests": 3},
            }
        )
        apply_scenario(fleet, 0)
        stream = capture()
        async with Controller(settings, serve=False, clock=clock) as controller:
            for tick in range(1, PERIOD + 1):
                report = await controller.once()
                only = report.only
                apply_scenario(fleet, tick, dict(only.outcome.applied) if only else None)
                clock.now += 1
    return counted(stream, PERIOD / 60)


async def main(minutes: float) -> None:
    rows = [(f"steady, {n} clusters", await steady(n, minutes)) for n in (2, 20, 200)]
    rows.append(("demo story (3 clusters, 1 s ticks)", await story()))
    logging.getLogger().handlers[:] = []
    print(f"log volume at info (steady: {minutes:g} virtual minutes, 10 s interval)")
    print(f"{'':38} {'lines/min':>10} {'besides summaries':>18} {'KiB/min':>8}")
    for name, (total, besides, kib) in rows:
        print(f"{name:38} {total:10.1f} {besides:18.1f} {kib:8.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    asyncio.run(main(parser.parse_args().minutes))
