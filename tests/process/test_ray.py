"""A real Ray head on loopback (``tests/support/ray_node.py``) whose actors report as vLLM's
Ray stat logger does: two models, three replicas on one node, one replica restarted. Its node
page is read through the real scrape path, and through a real Prometheus with the default
templates: two clusters by ``model_name``, replicas counted per model, capacity from their
pools while Ray shows them and after it drops them, a restart neither doubled nor read as a
load-balanced URL."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from controller.app import Controller
from controller.model import CapacityFrom, ClusterMetrics, Reason
from controller.render import report_json
from controller.settings import ClusterSettings, ScrapeSettings, build_settings
from controller.sources.scrape import ScrapeSource
from tests.support.engines import VLLM_E2E_BOUNDS
from tests.support.prometheus import Prometheus, job
from tests.support.servers import free_port

pytest.importorskip("ray", reason="ray is in the test extra (make test installs it)")
pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
A, B = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
REPLICAS = [
    {"replica": "a-1", "model": A, "kv": 0.95, "waiting": 8, "running": 4, "blocks": 20_000},
    {"replica": "a-2", "model": A, "kv": 0.85, "waiting": 4, "running": 2, "blocks": 30_000},
    {"replica": "b-1", "model": B, "kv": 0.20, "waiting": 0, "running": 1, "blocks": 50_000},
]
BLOCK = 16
START, WAIT = 120.0, 60.0  # bounds, seconds: Ray's start, and each wait for the page


@dataclass
class RayNode:
    process: asyncio.subprocess.Process
    url: str
    workers: dict[str, str]
    prometheus: Prometheus

    async def say(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), WAIT)
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def page_until(self, pattern: str, count: int) -> str:
        """The node page once ``pattern`` (a regex per line) matches ``count`` lines."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(self.url) as response:
                    text = await response.text()
                if len(re.findall(pattern, text, re.MULTILINE)) == count:
                    return text
                assert loop.time() - began < WAIT, f"{pattern!r} never on {count} lines"
                await asyncio.sleep(0.2)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ray_node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RayNode]:
    workdir = tmp_path_factory.mktemp("ray")
    port = free_port()
    spec = {
        "port": port,
        "report_ms": 1000,
        "bounds": list(VLLM_E2E_BOUNDS),
        "replicas": [{**r, "block_size": BLOCK, "completed": 100} for r in REPLICAS],
    }
    with (workdir / "ray.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.ray_node",
            json.dumps(spec),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), START)
        assert line, f"the Ray node ended at start-up: {(workdir / 'ray.log').read_text()[-2000:]}"
        workers = json.loads(line)["ready"]
        url = f"http://127.0.0.1:{port}/metrics"
        target = job("ray", [f"127.0.0.1:{port}"], {"cluster": "ray"})
        async with Prometheus(workdir, [target]) as prometheus:
            yield RayNode(process, url, workers, prometheus)
    finally:
        if process.returncode is None:
            assert process.stdin is not None
            process.stdin.write(b'{"quit": true}\n')
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


def scraping(model: str, url: str, session: aiohttp.ClientSession) -> ScrapeSource:
    cluster = ClusterSettings(name="c", vllm_urls=[url], model_name=model)
    return ScrapeSource(cluster, ScrapeSettings(), 5.0, session)


async def through_prometheus(node: RayNode) -> dict[str, dict[str, Any]]:
    settings = build_settings(
        {
            "clusters": [
                {
                    "name": name,
                    "prometheus": {"url": node.prometheus.url, "matchers": {"model_name": model}},
                }
                for name, model in (("a", A), ("b", B))
            ],
            "scrape": {"timeout": 5},
        }
    )
    async with Controller(settings, serve=False, dry_run=True) as controller:
        clusters: dict[str, dict[str, Any]] = report_json(await controller.once())["clusters"]
    return clusters


def pools(*replicas: dict[str, Any]) -> float:
    return float(sum(r["blocks"] for r in replicas) * BLOCK)


def by_model(metrics: ClusterMetrics) -> tuple[Any, ...]:
    return (metrics.replicas, metrics.kv_mean, metrics.queue_depth, metrics.running)


async def test_a_real_ray_node_of_two_models_reads_as_two_clusters(ray_node: RayNode) -> None:
    a1, a2, b1 = REPLICAS
    kv = r"^ray_vllm_kv_cache_usage_perc\{"
    info = r"^ray_vllm_cache_config_info\{"
    await ray_node.page_until(kv, 3)
    await ray_node.page_until(info, 3)
    await ray_node.prometheus.wait_for("count(ray_vllm_cache_config_info) == 3")
    await ray_node.prometheus.wait_for("count(ray_vllm_kv_cache_usage_perc) == 3")
    async with aiohttp.ClientSession() as session:
        a, b = scraping(A, ray_node.url, session), scraping(B, ray_node.url, session)

        # while Ray shows the pools
        first_a, first_b = await a.fetch(), await b.fetch()
        assert first_a.errors == () and first_b.errors == (), (first_a.errors, first_b.errors)
        assert by_model(first_a) == (2, pytest.approx(0.90), 12.0, 6.0)
        assert by_model(first_b) == (1, 0.20, 0.0, 1.0)
        assert (first_a.engine, first_a.pods_answering) == ("ray-vllm", 1)
        assert (first_a.kv_tokens, first_a.kv_tokens_from) == (
            pools(a1, a2),
            CapacityFrom.KV_BLOCKS,
        )
        assert first_b.kv_tokens == pools(b1)
        promql = await through_prometheus(ray_node)
        assert promql["a"]["healthy"] and promql["b"]["healthy"], promql
        assert (promql["a"]["vram_utilization"], promql["a"]["queue_depth"]) == (
            pytest.approx(0.9),
            12.0,
        )
        assert (promql["b"]["vram_utilization"], promql["b"]["queue_depth"]) == (0.2, 0.0)
        assert (promql["a"]["pods_answering"], promql["b"]["pods_answering"]) == (2, 1)
        assert (promql["a"]["kv_tokens"], promql["b"]["kv_tokens"]) == (pools(a1, a2), pools(b1))

        # Ray drops the pools' info gauge (set once, as vLLM does): kept, and said so
        await ray_node.page_until(info, 0)
        later = await a.fetch()
        assert later.errors == () and later.kv_mean == pytest.approx(0.90)
        assert (later.kv_tokens, later.kv_tokens_from) == (
            pools(a1, a2),
            CapacityFrom.KV_BLOCKS_KEPT,
        )
        assert (await b.fetch()).kv_tokens == pools(b1)
        promql = await through_prometheus(ray_node)
        assert (promql["a"]["kv_tokens"], promql["b"]["kv_tokens"]) == (pools(a1, a2), pools(b1))

        # a-1 restarted under a new worker while the old one's series are still there
        restarted = await ray_node.say(restart="a-1", kv=0.5, waiting=2, completed=3)
        assert restarted["worker"] != restarted["was"]
        await ray_node.page_until(kv, 4)
        both = await a.fetch()
        assert both.errors == (), both.errors
        assert by_model(both) == (2, pytest.approx((0.5 + 0.85) / 2), 6.0, 6.0)
        promql = await through_prometheus(ray_node)
        assert promql["a"]["pods_answering"] == 2  # counted by ReplicaId, not by worker
        await ray_node.say(stop=restarted["was"])
        await ray_node.page_until(kv, 3)
        after = await a.fetch()
        assert Reason.LOAD_BALANCED not in [e.reason for e in after.errors]
        assert by_model(after) == (2, pytest.approx((0.5 + 0.85) / 2), 6.0, 6.0)
        assert after.kv_tokens == pools(a1, a2)  # the new worker's pool, seen at its start
