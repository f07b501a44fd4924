"""End to end: the real controller against simulated clusters on loopback, read over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.app import Controller
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.render import report_json
from controller.settings import Settings, build_settings
from controller.state import TickReport
from tests.conftest import CONTROLLER, free_port

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
    return report.clusters[cluster].weight or 0


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
    down = await ticks.until(lambda r: w(r, "old") == 0)
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


async def _process(
    tmp_path: Path, sims: Fleet, *args: str
) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    config = {
        "interval": "300ms",
        "clusters": sims.settings_clusters(),
        "scrape": {"timeout": "100ms"},
        "server": {"bind": f"127.0.0.1:{port}"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await asyncio.create_subprocess_exec(
        *CONTROLLER,
        *args,
        "--config",
        str(path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    return process, port


async def test_once_cli_prints_json(tmp_path: Path) -> None:
    async with fleet() as sims:
        process, _ = await _process(tmp_path, sims, "once")
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr
    clusters = json.loads(stdout)["clusters"]
    assert clusters["cool"]["healthy"] is True and isinstance(clusters["cool"]["weight"], int)


async def test_sigterm_stops_the_real_process_cleanly_within_5s(tmp_path: Path) -> None:
    async with fleet() as sims:
        sims["hot"].fault = Fault.HANG  # a tick in flight when SIGTERM lands
        process, port = await _process(tmp_path, sims, "run")
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("controller never became ready")
        await asyncio.sleep(0.4)
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 10)
        took = time.monotonic() - began
    assert process.returncode == 0, stderr.decode()
    assert took < 5
    events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    status = [e for e in events if e["event"] == "cluster status" and e["cluster"] == "cool"]
    assert status and {"vram_util", "queue", "p50_ms", "healthy", "weight", "tick"} <= set(
        status[-1]
    )
    assert any(e["event"] == "cluster unhealthy" and e["reason"] == "timeout" for e in events)
    assert events[-1]["event"] == "stopped"


async def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        async with fleet() as sims:
            config = {
                "clusters": sims.settings_clusters(),
                "server": {"bind": f"127.0.0.1:{taken}"},
            }
            path = tmp_path / "config.yaml"
            path.write_text(yaml.safe_dump(config))
            done = await asyncio.create_subprocess_exec(
                *CONTROLLER,
                "run",
                "--config",
                str(path),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            _, stderr = await asyncio.wait_for(done.communicate(), 30)
    assert done.returncode == 1
    assert "address already in use" in stderr.decode()
    assert "Traceback" not in stderr.decode()
    assert "Unclosed" not in stderr.decode()


async def test_sigterm_in_the_middle_of_a_hung_tick_exits_0_quickly_without_a_traceback(
    tmp_path: Any,
) -> None:
    import signal

    from aiohttp import web

    from tests.conftest import free_port

    arrived = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        arrived.set()
        await asyncio.sleep(60)
        return web.Response(text="late\n")

    app = web.Application()
    app.router.add_get("/metrics", hang)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = tmp_path / "config.yaml"
    config.write_text(
        "interval: 30s\nscrape: {timeout: 20s}\n"
        f"clusters: [{{name: a, vllm_urls: ['http://127.0.0.1:{port}/metrics']}}]\n"
        f"server: {{bind: '127.0.0.1:{free_port()}'}}\n"
    )
    child = await asyncio.create_subprocess_exec(
        *CONTROLLER,
        "run",
        "--config",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.wait_for(arrived.wait(), 30)  # the tick is now stuck in the fetch
        child.send_signal(signal.SIGTERM)
        began = asyncio.get_running_loop().time()
        out, err = await asyncio.wait_for(child.communicate(), 15)
        took = asyncio.get_running_loop().time() - began
    finally:
        if child.returncode is None:
            child.kill()
        await runner.cleanup()
    assert child.returncode == 0, err.decode()
    assert took < 5, took
    assert b"Traceback" not in out + err and b"CancelledError" not in out + err


def test_quick_commands_do_not_load_the_kubernetes_client(tmp_path: Any) -> None:
    """--version, check-config and status start without importing the Kubernetes client or
    the daemon (measured in the README: well under half a second)."""
    config = tmp_path / "c.yaml"
    config.write_text("clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n")
    probe = (
        "import sys, contextlib, io\n"
        "from controller import cli\n"
        "for argv in (['--version'], ['check-config', sys.argv[1]], ['status', '--url', '127.0.0.1:9']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        cli.main(argv)\n"
        "print(sorted(m for m in ('kubernetes_asyncio', 'controller.app', 'controller.loop', 'prometheus_client') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


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


async def test_the_demo_tells_the_same_story_every_time() -> None:
    import io

    from controller.demo.runner import run_demo

    runs = []
    for _ in range(2):
        out = io.StringIO()
        await run_demo(2.0, 0.2, "127.0.0.1:0", False, out=out, seed=7)
        runs.append([b for b in out.getvalue().split("\n\ntick ")[1:] if "demo stopped" not in b])
    common = min(len(r) for r in runs)
    assert common >= 3  # bounded by the duration; compare the ticks both runs reached
    assert runs[0][:common] == runs[1][:common]


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
