"""The daemon and its CLI as child processes, the way the image and the README run them."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from controller.fakes.clusters import Fault, Fleet, SimCluster
from tests.conftest import StartDaemon
from tests.support.servers import Server, free_port


def fleet() -> Fleet:
    return Fleet(
        [
            SimCluster("cool", kv=0.20),
            SimCluster("hot", kv=0.20, with_epp=True),
            SimCluster("old", style="v0", pods=1, kv=0.30),
        ]
    )


def config_for(sims: Fleet, port: int | None = None) -> dict[str, Any]:
    return {
        "interval": "300ms",
        "clusters": sims.settings_clusters(),
        "scrape": {"timeout": "100ms"},
        "server": {"bind": f"127.0.0.1:{port or free_port()}"},
    }


async def test_once_cli_prints_json(daemon: StartDaemon) -> None:
    async with fleet() as sims:
        child = await daemon(config_for(sims), "once")
        code = await child.finish()
    assert code == 0, child.err
    clusters = json.loads(child.out)["clusters"]
    assert clusters["cool"]["healthy"] is True and isinstance(clusters["cool"]["weight"], int)


async def test_the_process_exports_no_created_series(daemon: StartDaemon) -> None:
    """The CLI switches prometheus_client's ``*_created`` series off once, at start-up."""
    async with fleet() as sims:
        child = await daemon(config_for(sims), "run")
        await child.wait_ready()
        await child.wait_for_ticks(2)
        async with (
            aiohttp.ClientSession() as session,
            session.get(child.url + "/metrics") as response,
        ):
            page = await response.text()
        await child.stop(10)
    names = {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line[:1] != "#"}
    assert "weight_controller_scrape_pages_total" in names  # a counter: it would have one
    assert not [n for n in names if n.endswith("_created")]


async def test_run_reads_a_moved_field_and_warns_once(daemon: StartDaemon) -> None:
    async with fleet() as sims:
        config = config_for(sims)
        config["scrape"]["min_pod_fraction"] = 0.25
        child = await daemon(config, "run")
        await child.wait_ready()
        await child.stop(10)
    moved = [e for e in child.events() if e["event"] == "config field moved"]
    assert [e["detail"].split(":")[0] for e in moved] == [
        "scrape.min_pod_fraction has moved to health.min_pod_fraction"
    ]


async def test_sigterm_stops_the_real_process_cleanly_within_5s(daemon: StartDaemon) -> None:
    async with fleet() as sims:
        sims["hot"].fault = Fault.HANG  # a tick in flight when SIGTERM lands
        child = await daemon(config_for(sims), "run")
        await child.wait_ready()
        await child.wait_for_ticks(2)
        took = await child.stop(10)
    assert child.returncode == 0, child.err.decode()
    assert took < 5
    events = child.events()
    status = [e for e in events if e["event"] == "cluster status" and e["cluster"] == "cool"]
    assert status and {"vram_util", "queue", "p50_ms", "healthy", "weight", "tick"} <= set(
        status[-1]
    )
    assert any(e["event"] == "cluster unhealthy" and e["reason"] == "timeout" for e in events)
    assert events[-1]["event"] == "stopped"


async def test_a_taken_metrics_port_is_a_clear_error(daemon: StartDaemon) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        async with fleet() as sims:
            child = await daemon(config_for(sims, taken), "run")
            code = await child.finish(30)
    stderr = child.err.decode()
    assert code == 1
    assert "address already in use" in stderr
    assert "Traceback" not in stderr
    assert "Unclosed" not in stderr


async def test_sigterm_in_the_middle_of_a_hung_tick_exits_0_quickly_without_a_traceback(
    daemon: StartDaemon,
) -> None:
    arrived = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        arrived.set()
        await asyncio.sleep(60)
        return web.Response(text="late\n")

    server = await Server().start({"/metrics": hang})
    config = (
        "interval: 30s\nscrape: {timeout: 20s}\n"
        f"clusters: [{{name: a, vllm_urls: ['{server.url('/metrics')}']}}]\n"
        f"server: {{bind: '127.0.0.1:{free_port()}'}}\n"
    )
    try:
        child = await daemon(config, "run")
        await asyncio.wait_for(arrived.wait(), 30)  # the tick is now stuck in the fetch
        took = await child.stop(15)
    finally:
        await server.stop()
    output = child.out + child.err
    assert child.returncode == 0, child.err.decode()
    assert took < 5, took
    assert b"Traceback" not in output and b"CancelledError" not in output


def test_quick_commands_do_not_load_the_kubernetes_client(tmp_path: Path) -> None:
    """--version, check-config and status start without importing the Kubernetes client or
    the daemon's loop (benchmarks/README.md has how long they take)."""
    config = tmp_path / "c.yaml"
    config.write_text("clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n")
    probe = (
        "import sys, contextlib, io\n"
        "from controller import cli\n"
        "for argv in (['--version'], ['check-config', sys.argv[1]], ['status', '--url', '127.0.0.1:9']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        cli.main(argv)\n"
        "heavy = ('kubernetes_asyncio', 'controller.app', 'controller.reconcile.loop', 'prometheus_client')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
