"""Many teams, one controller (the real daemon as a child process): what one tenant's pages or
objects hold must not reach the others, nor the process."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from controller.exposition import _CACHE_BYTES
from controller.fakes.clusters import Fleet, SimCluster
from tests.conftest import Serve, StartDaemon
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import kubeconfig, seed
from tests.support.servers import free_port

HUGE = 200 * 1024  # bytes of one label value
PODS = 16


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_huge_label_values_that_change_every_scrape_cost_parsing_never_memory(
    serve: Serve, daemon: StartDaemon
) -> None:
    """Sixteen pods whose KV series carries a 200 KB label value, new on every scrape: the
    label cache is bounded in bytes, so the daemon stays under 150 MB (it kept 16,384 of
    them: 2.5 GB in a minute)."""
    counter = itertools.count()

    async def page(_: web.Request) -> web.Response:
        churn = f"{next(counter):08d}" + "x" * HUGE
        text = (
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m",build="{churn}"}} 0.3\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        )
        return web.Response(text=text)

    server = await serve({f"/pod-{i}/metrics": page for i in range(PODS)})
    config = {
        "interval": "400ms",
        "clusters": [
            {"name": "wide", "vllm_urls": [server.url(f"/pod-{i}/metrics") for i in range(PODS)]},
        ],
        "scrape": {"timeout": "300ms"},
        "server": {"bind": f"127.0.0.1:{free_port()}"},
        "log": {"level": "warning"},
    }
    child = await daemon(config, "run")
    await child.wait_ready()
    state = await child.wait_for_ticks(30, seconds=120)
    wide = state["clusters"]["wide"]
    assert wide["healthy"] is True, (wide["reason"], wide["errors"][:1])  # every page used
    assert child.process is not None
    assert rss_mb(child.process.pid) < 150
    async with aiohttp.ClientSession() as session, session.get(child.url + "/metrics") as got:
        exposed = await got.text()
    held = {
        sample.labels["cache"]: sample.value
        for family in text_string_to_metric_families(exposed)
        for sample in family.samples
        if sample.name == "weight_controller_cache_bytes"
    }
    assert 0 <= held["labels_vllm"] <= 2 * _CACHE_BYTES  # counted on /metrics, and bounded


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)  # a hung API is no CRD's
async def test_a_hung_api_server_leaves_the_daemon_live_and_scraping(
    apiserver: FakeAPIServer, tmp_path: Path, daemon: StartDaemon
) -> None:
    """With every patch hanging, a tick waited the API timeout for each write in turn and
    /healthz answered 503: a liveness probe would have restarted a controller whose only
    problem was the API. Now /healthz stays 200, ticks go on and every cluster is read."""
    seed(apiserver, [("east", 50), ("west", 50)])
    config = str(kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KUBERNETES_")}
    async with Fleet([SimCluster("east", kv=0.95), SimCluster("west", kv=0.2)]) as sims:
        child = await daemon(
            {
                "interval": "300ms",
                "clusters": sims.settings_clusters(),
                "scrape": {"timeout": "150ms"},
                "server": {"bind": f"127.0.0.1:{free_port()}"},
                "kubernetes": {"enabled": True, "api_timeout": "30s"},
                "log": {"format": "json"},
            },
            "run",
            "--kubeconfig",
            config,
            env=env,
        )
        apiserver.slow("PATCH", "externalmodels", 3600, times=10_000)  # every write hangs
        first = await child.wait_for_ticks(3)
        async with aiohttp.ClientSession() as session:
            for _ in range(20):  # about 6 s: many times the 900 ms a probe would allow
                async with session.get(child.url + "/healthz") as live:
                    assert live.status == 200, await live.text()
                await asyncio.sleep(0.3)
        state = await child.wait_for_ticks(first["ticks"] + 5)
        await child.stop(10)
    assert child.returncode == 0, child.err.decode()
    (target,) = state["targets"].values()
    assert (target["write"], target["reason"]) == ("failed", "api_timeout")
    assert all(c["healthy"] for c in state["clusters"].values())  # read as ever
    assert b"Traceback" not in child.out + child.err
