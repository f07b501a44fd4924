"""End to end: the real controller against simulated clusters on loopback, read over HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.app import Controller
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.render import report_json
from controller.settings import Settings, build_settings
from controller.state import TickReport

INTERVAL = 0.25


def fleet() -> Fleet:
    return Fleet(
        [
            SimCluster("cool", kv=0.20),
            SimCluster("hot", kv=0.20, with_epp=True),
            SimCluster("old", style="v0", pods=1, kv=0.30),
        ]
    )


def settings_for(sims: Fleet, **extra: Any) -> Settings:
    return build_settings(
        {
            "interval": INTERVAL,
            "clusters": sims.settings_clusters(),
            "scrape": {"timeout": 0.1, "min_latency_requests": 1},
            "server": {"bind": "127.0.0.1:0"},
            **extra,
        }
    )


class Ticks:
    """Lets a test wait for the running loop's next ticks without sleeping blindly."""

    def __init__(self) -> None:
        self.reports: list[TickReport] = []
        self._event = asyncio.Event()

    def __call__(self, report: TickReport) -> None:
        self.reports.append(report)
        self._event.set()

    async def until(self, done: Callable[[TickReport], bool], max_ticks: int = 40) -> TickReport:
        for _ in range(max_ticks):
            self._event.clear()
            await asyncio.wait_for(self._event.wait(), timeout=10 * INTERVAL + 5)
            if done(self.reports[-1]):
                return self.reports[-1]
        raise AssertionError(f"not reached in {max_ticks} ticks: {self.reports[-1]}")


async def scrape(
    session: aiohttp.ClientSession, port: int
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def weight(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], cluster: str) -> float:
    """A cluster's applied weight in the implicit target, as /metrics shows it."""
    labels = (("cluster", cluster), ("ref", cluster), ("target", "configured"))
    return metrics[("weight_controller_applied_weight", labels)]


def w(report: TickReport, cluster: str) -> int:
    return report.clusters[cluster].share or 0


@pytest.fixture
async def running() -> AsyncIterator[tuple[Fleet, Controller, Ticks]]:
    ticks = Ticks()
    async with fleet() as sims, Controller(settings_for(sims), on_tick=ticks) as controller:
        stop = asyncio.Event()
        task = asyncio.create_task(controller.run(stop))
        try:
            yield sims, controller, ticks
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)


async def test_weights_move_away_from_the_hot_cluster_and_back(
    running: tuple[Fleet, Controller, Ticks],
) -> None:
    sims, controller, ticks = running
    assert controller.port
    await ticks.until(lambda r: r.tick >= 2)
    async with aiohttp.ClientSession() as session:
        before = await scrape(session, controller.port)
        assert weight(before, "hot") >= 25
        sims["hot"].kv = 0.95
        await ticks.until(lambda r: w(r, "hot") <= 8)
        hot = await scrape(session, controller.port)
        assert weight(hot, "hot") <= 8
        assert hot[("weight_controller_cluster_vram_utilization", (("cluster", "hot"),))] > 0.9
        assert sum(weight(hot, c) for c in ("cool", "hot", "old")) == 100
        sims["hot"].kv = 0.15
        # back to within `rebalance` of its capacity share (2 of 5 pods: 40)
        back = 40 - controller.settings.weights.rebalance
        await ticks.until(lambda r: w(r, "hot") >= back)
        cooled = await scrape(session, controller.port)
        assert weight(cooled, "hot") >= back
        for path, status in (("/healthz", 200), ("/readyz", 200)):
            async with session.get(f"http://127.0.0.1:{controller.port}{path}") as response:
                assert response.status == status
    steps = [
        abs(w(b, "hot") - w(a, "hot"))
        for a, b in zip(ticks.reports[2:], ticks.reports[3:], strict=False)
    ]
    assert max(steps) <= controller.settings.weights.max_step


async def test_a_failing_cluster_gets_zero_then_recovers(
    running: tuple[Fleet, Controller, Ticks],
) -> None:
    sims, controller, ticks = running
    await ticks.until(lambda r: r.tick >= 2)
    sims["old"].fault = Fault.HTTP_500

    def named(report: TickReport) -> bool:
        """Down to 0 and named for its 500s: on a loaded machine a tick's scrape may also time
        out first (scrape.timeout is 0.1 s here), which is a reason too, not this one."""
        health = report.clusters["old"].health
        reason = health.reason.value if health is not None and health.reason else None
        return w(report, "old") == 0 and reason == "http_status"

    down = await ticks.until(named)
    health = down.clusters["old"].health
    assert health is not None and not health.healthy and health.reason is not None
    assert health.reason.value == "http_status"
    assert controller.port
    async with aiohttp.ClientSession() as session:
        metrics = await scrape(session, controller.port)
    assert metrics[("weight_controller_cluster_healthy", (("cluster", "old"),))] == 0
    assert (
        metrics[
            (
                "weight_controller_scrape_errors_total",
                (("cluster", "old"), ("reason", "http_status")),
            )
        ]
        >= 2
    )
    assert (
        "weight_controller_cluster_vram_utilization",
        (("cluster", "old"),),
    ) not in metrics  # unknown, not 0
    sims["old"].fault = Fault.NONE
    back = await ticks.until(lambda r: w(r, "old") > 0)
    assert back.clusters["old"].health is not None and back.clusters["old"].health.healthy
    assert w(back, "old") <= controller.settings.weights.max_step


async def test_our_metrics_page_has_every_documented_family(
    running: tuple[Fleet, Controller, Ticks],
) -> None:
    _, controller, ticks = running
    await ticks.until(lambda r: r.tick >= 3)
    assert controller.port
    async with aiohttp.ClientSession() as session:
        metrics = await scrape(session, controller.port)
    names = {name for name, _ in metrics}
    for expected in (
        "weight_controller_cluster_vram_utilization",
        "weight_controller_cluster_queue_depth",
        "weight_controller_cluster_latency_seconds",
        "weight_controller_cluster_healthy",
        "weight_controller_applied_weight",
        "weight_controller_desired_weight",
        "weight_controller_target_share",
        "weight_controller_target_mode",
        "weight_controller_scrape_duration_seconds_bucket",
        "weight_controller_cluster_scrape_duration_seconds",
        "weight_controller_scrape_pages_total",
        "weight_controller_reconcile_duration_seconds_count",
        "weight_controller_last_reconcile_timestamp_seconds",
        "weight_controller_target_writes_total",
        "weight_controller_build_info",
        # the process's own cost, for the CPU and memory panel
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "python_gc_collections_total",
    ):
        assert expected in names, expected
    # lean: no _created series, and no zero series for faults that did not happen
    assert not any(name.endswith("_created") for name in names)
    assert "weight_controller_scrape_errors_total" not in names  # no cluster failed
    assert (
        metrics[
            ("weight_controller_cluster_latency_seconds", (("cluster", "hot"), ("quantile", "0.9")))
        ]
        > 0
    )


async def test_readyz_waits_for_the_first_reconcile_and_healthz_for_a_live_loop() -> None:
    async with fleet() as sims, Controller(settings_for(sims)) as controller:
        assert controller.port
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{controller.port}"
            async with session.get(base + "/readyz") as response:
                assert response.status == 503
            await controller.once()
            async with session.get(base + "/readyz") as response:
                assert response.status == 200
            stalled = time.monotonic() - 10 * INTERVAL
            report = controller.snapshot.report
            controller.snapshot.report = replace(report, finished_monotonic=stalled)
            async with session.get(base + "/healthz") as response:
                assert response.status == 200  # a stage finished since: the loop turns
            controller.snapshot.beat = stalled
            async with session.get(base + "/healthz") as response:
                assert response.status == 503


async def test_once_reports_every_cluster_as_json() -> None:
    async with fleet() as sims:
        sims["old"].fault = Fault.GARBAGE
        async with Controller(settings_for(sims), serve=False) as controller:
            report = report_json(await controller.once())
    clusters = report["clusters"]
    assert set(clusters) == {"cool", "hot", "old"}
    assert clusters["cool"]["vram_utilization"] == pytest.approx(0.2, abs=0.03)
    assert clusters["cool"]["healthy"] is True
    assert [e["reason"] for e in clusters["old"]["errors"]] == ["parse"]  # its one page
    assert clusters["old"]["healthy"] is False and clusters["old"]["reason"] == "parse"
    assert clusters["old"]["vram_utilization"] is None and clusters["old"]["weight"] == 0
    assert sum(c["weight"] for c in clusters.values()) == 100
    json.dumps(report)


async def test_once_and_debug_state_show_a_target_with_the_same_keys_and_values() -> None:
    async with fleet() as sims, Controller(settings_for(sims)) as controller:
        sims["hot"].kv = 0.95
        for _ in range(3):
            report = report_json(await controller.once())
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{controller.port}/debug/state") as response,
        ):
            state = await response.json()
    assert report["targets"] == state["targets"]
    assert report["clusters"] == state["clusters"]
    target = report["targets"]["configured"]
    # what once printed before is all still there, and the law in force is named
    assert {"desired", "applied", "write", "mode", "notes"} <= set(target)
    assert target["law"] == "capacity"
    assert set(target["refs"]["hot"]) >= {"desired", "applied", "share", "goal", "factors"}


async def test_opted_in_risks_are_warned_about_at_start_up_and_exported() -> None:
    from structlog.testing import capture_logs

    settings = build_settings(
        {
            "clusters": [
                {
                    "name": "lax",
                    "vllm_urls": ["https://127.0.0.1:1/m"],
                    "tls_insecure_skip_verify": True,
                },
                {
                    "name": "plain",
                    "vllm_urls": ["http://127.0.0.1:1/m"],
                    "bearer_token_file": "/dev/null",
                    "allow_token_over_http": True,
                },
            ],
            "server": {"bind": "127.0.0.1:0"},
        }
    )
    with capture_logs() as logs:
        async with Controller(settings, serve=False) as controller:
            registry = controller.registry
    events = {(e["event"], e["cluster"]) for e in logs if e["log_level"] == "warning"}
    assert events == {("tls verification off", "lax"), ("bearer token over plain http", "plain")}
    for cluster, risk in (("lax", "tls_unverified"), ("plain", "token_over_http")):
        labels = {"cluster": cluster, "risk": risk}
        assert registry.get_sample_value("weight_controller_cluster_insecure", labels) == 1


async def test_the_demo_tells_the_same_story_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from controller.demo.runner import run_demo

    runs = []
    for run in range(2):  # ticks back to back on a stepped clock: no wall time in the story
        if run:  # nor the shell's: a daemon's variables left in it (a floor, a typo) change nothing
            monkeypatch.setenv("WEIGHT_CONTROLLER_WEIGHTS__FLOOR", "40")
            monkeypatch.setenv("WEIGHT_CONTROLLER_NO_SUCH_SETTING", "1")
        out = io.StringIO()
        await run_demo(None, 10.0, "127.0.0.1:0", False, out=out, seed=7, ticks=30)
        runs.append(out.getvalue().split("\n\ntick ")[1:])
    assert len(runs[0]) == 30
    assert runs[0] == runs[1]

    def weight(block: str, cluster: str) -> int:
        row = next(line for line in block.splitlines() if line.split()[:1] == [cluster])
        return int(row.rstrip("# ").split()[-1])

    first, last = runs[0][0], runs[0][-1]  # the story is told: b's climb sheds its share,
    assert weight(last, "cluster-b") < weight(first, "cluster-b") / 4  # c's failure its own
    assert weight(last, "cluster-c") == 0 and "UNHEALTHY (http_status)" in last


def test_once_started_the_collector_skips_what_start_up_loaded_and_passes_less_often() -> None:
    """In a fresh interpreter (the suite's own collector is left alone): after
    settle_collector, the objects start-up made are frozen out of every pass and young
    passes come GC_THRESHOLD[0] new containers apart instead of 700."""
    probe = (
        "import gc, json\n"
        "from controller.app import GC_THRESHOLD, settle_collector\n"
        "before = gc.get_threshold()\n"
        "settle_collector()\n"
        "print(json.dumps([before, gc.get_threshold(), GC_THRESHOLD, gc.get_freeze_count()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, wanted, frozen = json.loads(done.stdout)
    assert before[0] == 700 and after == list(wanted) and wanted[0] > before[0]
    assert frozen > 10_000  # modules, classes, functions: all of start-up


async def test_in_the_demo_the_requests_follow_the_weights() -> None:
    """The demo's clusters completed the same requests whatever their weight, so its realised
    share said traffic went nowhere near where the weights sent it."""
    from controller.demo.runner import apply_scenario, demo_fleet

    async with demo_fleet(seed=3, seconds_per_scrape=1.0) as fleet:
        settings = build_settings(
            {
                "interval": 1,
                "clusters": fleet.settings_clusters(),
                "scrape": {"timeout": 0.5, "min_latency_requests": 3},
            }
        )
        async with Controller(settings, serve=False) as controller:
            apply_scenario(fleet, 0)
            for tick in range(1, 36):  # b heats up and holds at 95%: its weight falls
                report = await controller.once()
                only = report.only
                assert only is not None
                apply_scenario(fleet, tick, dict(only.outcome.applied))
    assert only is not None
    assert only.outcome.applied["cluster-b"] < 100 / 3  # shed below an equal share
    for cluster, intended in only.intended.items():
        assert abs(only.realised[cluster] - intended) < 10, (only.realised, only.intended)


async def test_an_idle_connection_outlives_the_interval() -> None:
    """A pod that keeps its connection across a tick (VLLM_HTTP_TIMEOUT_KEEP_ALIVE above
    the interval) is read on it next tick: the client keeps an idle one for two intervals."""
    from controller.app import _connector

    for interval in (10.0, 45.0):
        settings = build_settings(
            {
                "interval": interval,
                "clusters": [{"name": "a", "vllm_urls": ["http://127.0.0.1:1/m"]}],
            }
        )
        connector = _connector(settings)
        try:
            assert connector._keepalive_timeout == 2 * interval
        finally:
            await connector.close()


async def test_a_scrape_sends_back_no_cookie_a_page_set() -> None:
    """Scrapes are stateless, as Prometheus's are (its client has no cookie jar): a cookie a
    page sets, such as the sticky-session cookie an OpenShift route's router adds by default
    (haproxy.router.openshift.io/disable_cookies turns it off), is never sent back. Sent back,
    it would pin every later scrape of that route to the one pod behind it."""
    from aiohttp import web

    from controller.fakes.pages import CumulativeHistogram, vllm_v1_page
    from tests.support.servers import Server

    cookies: list[str | None] = []

    async def page(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie"))
        text = vllm_v1_page("m", [0.3], [0.0], [1.0], [CumulativeHistogram()])
        response = web.Response(text=text, content_type="text/plain")
        response.set_cookie("route", "pod-a")  # host-only: a jar keeps it for "localhost"
        return response

    server = await Server().start({"/metrics": page})
    try:
        url = f"http://localhost:{server.port}/metrics"
        settings = build_settings({"clusters": [{"name": "a", "vllm_urls": [url]}]})
        async with Controller(settings, serve=False) as controller:
            reports = [report_json(await controller.once()) for _ in range(3)]
    finally:
        await server.stop()
    assert [r["clusters"]["a"]["healthy"] for r in reports] == [True, True, True]
    assert cookies == [None, None, None]
