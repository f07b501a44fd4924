"""Many teams, one controller (the real daemon as a child process): what one tenant's pages or
objects hold must not reach the others, nor the process."""

from __future__ import annotations

import itertools
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from controller.exposition import _CACHE_BYTES
from tests.conftest import Serve, StartDaemon
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
