"""``weight-controller demo``: three simulated clusters and the real controller, with a table.

cluster-a sits near 20% KV; cluster-b's own load climbs until it is at 95% and later cools;
cluster-c (an older vLLM V0) fails with HTTP 500 for a while and recovers. Each cluster's KV
use answers the weights too (the routed traffic adds to it), so shed traffic shows up as KV on
the others and comes back when b cools. The scenario advances per tick, so what you see does
not depend on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from typing import TextIO

from controller import logs, render
from controller.app import Controller, install_signal_handlers
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.settings import build_settings
from controller.state import TickReport

PERIOD = 60  # ticks per scenario cycle


ROUTED_KV = 0.15  # KV use our routed traffic adds to a cluster at an equal share


def hot_kv(tick: int) -> float:
    """cluster-b's own load: quiet, climbing until b is at 95%, holding, cooling, quiet."""
    t = tick % PERIOD
    if t < 5:
        return 0.10
    if t < 20:
        return 0.10 + (0.85 - 0.10) * (t - 5) / 15
    if t < 35:
        return 0.85
    if t < 45:
        return 0.85 - (0.85 - 0.10) * (t - 35) / 10
    return 0.10


def apply_scenario(fleet: Fleet, tick: int, weights: dict[str, int] | None = None) -> None:
    fleet["cluster-b"].kv = hot_kv(tick)
    failing = 25 <= tick % PERIOD < 35
    fleet["cluster-c"].fault = Fault.HTTP_500 if failing else Fault.NONE
    if weights:  # the routed traffic follows the weights: a cluster's KV answers them
        equal = 100 / len(fleet.clusters)
        for name, cluster in fleet.clusters.items():
            cluster.share = weights.get(name, 0) / equal


def demo_fleet(seed: int = 0, seconds_per_scrape: float | None = 1.0) -> Fleet:
    """The three clusters; their noise is seeded and their traffic counted per scrape, not by
    the wall clock, so a seed always tells the same story."""
    shapes = [
        SimCluster("cluster-a", style="v1", pods=2, engines=2, kv=0.05),
        SimCluster("cluster-b", style="v1", pods=2, engines=2, kv=0.10, with_epp=True),
        SimCluster("cluster-c", style="v0", pods=1, kv=0.25),
    ]
    return Fleet(
        [
            replace(c, routed_kv=ROUTED_KV, seed=seed, seconds_per_scrape=seconds_per_scrape)
            for c in shapes
        ]
    )


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(report: TickReport, out: TextIO) -> None:
    """One block per tick: each target's mode and write, then each cluster's signals (as
    ``/debug/state`` shows them) and its share of that target (the demo has one: the implicit
    target over its three clusters)."""
    for key, view in report.targets.items():
        outcome = view.outcome
        print(
            f"\ntick {report.tick:<4} target={key} mode={outcome.decision.mode.value}"
            f" write={outcome.write.value}",
            file=out,
        )
        print(
            f"  {'cluster':<10} {'kv':>5} {'queue':>6} {'p90':>7}  {'health':<40} weight",
            file=out,
        )
        for ref, cluster in outcome.target.clusters.items():
            shown = report.clusters.get(cluster or "")
            c = render.cluster_json(shown) if shown else None
            p90 = c["latency_p90_seconds"] if c else None
            weight = outcome.applied.get(ref, 0)
            print(
                f"  {ref:<10} {_cell(c['vram_utilization'] if c else None, '.2f'):>5}"
                f" {_cell(c['queue_depth'] if c else None, '.1f'):>6}"
                f" {_cell(p90 * 1000 if p90 is not None else None, '.0f') + 'ms':>7}"
                f"  {render.health_words(c) if c else '-':<40} {weight:>3} {'#' * (weight // 4)}",
                file=out,
            )
    out.flush()


async def run_demo(
    duration: float | None,
    interval: float,
    bind: str,
    verbose: bool,
    out: TextIO = sys.stdout,
    seed: int = 0,
    ticks: int | None = None,
) -> int:
    """Run the demo until ``duration`` has passed or a stop signal. With ``ticks``, tick that
    many times back to back instead, on a clock that moves one interval per tick: the story
    then owes nothing to how fast the machine is (a scrape still has ``interval / 2`` of real
    time to answer)."""
    logs.configure("info" if verbose else "warning", "console", sys.stderr)
    stop = asyncio.Event()
    install_signal_handlers(stop)
    async with demo_fleet(seed, seconds_per_scrape=interval) as fleet:
        settings = build_settings(
            {
                "interval": interval,
                "clusters": fleet.settings_clusters(),
                "scrape": {"timeout": interval / 2, "min_latency_requests": 3},
                "server": {"bind": bind},
            },
            environment=False,
        )

        def on_tick(report: TickReport) -> None:
            print_table(report, out)
            only = report.only
            weights = {} if only is None else dict(only.outcome.applied)
            apply_scenario(fleet, report.tick, weights)

        apply_scenario(fleet, 0)
        stepped = [time.time()]
        clock = time.time if ticks is None else lambda: stepped[0]
        async with Controller(settings, clock=clock, on_tick=on_tick) as controller:
            print(f"weight-controller demo: our /metrics on http://{bind}/metrics", file=out)
            if ticks is not None:
                assert controller.reconciler is not None
                for _ in range(ticks):
                    if stop.is_set():  # Ctrl-C
                        break
                    stepped[0] += interval
                    await controller.reconciler.tick()
            else:
                if duration is not None:
                    asyncio.get_running_loop().call_later(duration, stop.set)
                await controller.run(stop)
    print("\ndemo stopped", file=out)
    return 0
