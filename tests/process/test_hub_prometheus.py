"""Fifty clusters read through one real Prometheus, as a hub Thanos holds a fleet: the
queries a tick sends do not grow with the clusters, none fails, and every cluster reads what
its pods serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.render import report_json
from controller.settings import build_settings
from controller.sources.prometheus import Windows, queries_for
from tests.support.prometheus import Prometheus, job
from tests.support.servers import text_handler

CLUSTERS = 50


async def queries_answered(prometheus: Prometheus) -> float:
    """Instant queries Prometheus has answered, from its own /metrics."""
    async with aiohttp.ClientSession() as session, session.get(f"{prometheus.url}/metrics") as r:
        text = await r.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "prometheus_http_requests_total"
        and sample.labels.get("handler") == "/api/v1/query"
    )


async def test_fifty_clusters_through_one_prometheus_send_a_handful_of_queries(
    tmp_path: Path,
) -> None:
    sims = [SimCluster(f"c{i:02}", kv=0.1 + 0.015 * i, noise=0.0, pods=1) for i in range(CLUSTERS)]
    async with Fleet(sims):
        job: dict[str, Any] = {
            "job_name": "vllm",
            "metrics_path": "/pod-0/metrics",
            "scrape_interval": "1s",
            "scrape_timeout": "900ms",
            "static_configs": [
                {"targets": [f"127.0.0.1:{s.port}"], "labels": {"cluster": s.name}} for s in sims
            ],
        }
        async with Prometheus(tmp_path, [job]) as prometheus:
            await prometheus.wait_for(
                f"count(count by (cluster) (vllm_kv_cache_usage_perc)) == {CLUSTERS}"
            )
            await prometheus.wait_for(
                "count(rate(vllm_e2e_request_latency_seconds_count[5s]) > 0) > 40"
            )
            settings = build_settings(
                {
                    "interval": 5,
                    "queriers": [{"name": "hub", "url": prometheus.url, "push_interval": "1s"}],
                    "clusters": [{"name": s.name, "prometheus": {"querier": "hub"}} for s in sims],
                    "scrape": {"timeout": 3, "min_latency_requests": 1},
                }
            )
            async with Controller(settings, serve=False) as controller:
                await controller.once()
                before = await queries_answered(prometheus)
                ticks = 3
                for _ in range(ticks):
                    report = report_json(await controller.once())
                after = await queries_answered(prometheus)
            # each cluster's oldest KV sample time, as the hub's kv_oldest asks it of a server
            # at its default evaluation interval (1m): a subquery at that resolution had no
            # step within the 2 s lookback at most times (no answer: staleness unchecked)
            windows = Windows.of(settings.prometheus_queries, 1.0)
            oldest = queries_for(settings.prometheus_queries, {}, "cluster", windows)["kv_oldest"]
            for _ in range(3):
                answer = await prometheus.query(f"time() - ({oldest})")
                ages = [float(r["value"][1]) for r in answer["data"]["result"]]
                assert len(ages) == CLUSTERS and max(ages) < 3, (oldest, ages)
    per_tick = (after - before) / ticks
    assert per_tick <= 20, per_tick
    failing = {n: c["errors"] for n, c in report["clusters"].items() if c["errors"]}
    assert failing == {}
    for sim in sims:
        cluster = report["clusters"][sim.name]
        assert cluster["healthy"] is True, (sim.name, cluster)
        assert cluster["vram_utilization"] == pytest.approx(sim.kv, abs=1e-6)
    weights = report["targets"]["configured"]["applied"]
    assert sum(weights.values()) == 100


def _pod_page(kv: float, pools: list[int]) -> str:
    lines = [
        f'vllm:cache_config_info{{block_size="16",engine="{i}",num_gpu_blocks="{blocks}"}} 1'
        for i, blocks in enumerate(pools)
    ]
    lines += [
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0',
        'vllm:num_requests_running{engine="0",model_name="m"} 1',
    ]
    return "\n".join(lines) + "\n"


async def test_one_cluster_s_flood_of_pools_costs_its_own_pool_not_the_others(
    tmp_path: Path,
) -> None:
    """Found by an attack: one cluster of a shared querier answering 25,000 pool series had
    the whole kv_pools answer refused, and every other cluster's capacity fell back to pods.
    Each cluster may answer its share of scrape.max_page_samples (``topk``): past it, its own
    pool is refused by name."""
    pages = {
        "/east-0/metrics": _pod_page(0.3, [2048]),
        "/east-1/metrics": _pod_page(0.3, [2048]),
        "/north-0/metrics": _pod_page(0.3, list(range(1000, 2100))),  # 1,100 pool series
    }
    app = web.Application()
    for path, text in pages.items():
        app.router.add_get(path, text_handler(text))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    at = f"127.0.0.1:{runner.addresses[0][1]}"
    jobs = [job(p.strip("/").replace("/", "-"), [at], {"cluster": p[1:5]}, p) for p in pages]
    try:
        async with Prometheus(tmp_path, jobs) as prometheus:
            await prometheus.wait_for('count(vllm:cache_config_info{cluster="nort"}) == 1100')
            await prometheus.wait_for('count(vllm:cache_config_info{cluster="east"}) == 2')
            settings = build_settings(
                {
                    "interval": 5,
                    "queriers": [{"name": "hub", "url": prometheus.url, "push_interval": "1s"}],
                    "clusters": [
                        {"name": "east", "prometheus": {"querier": "hub"}},
                        {"name": "north", "prometheus": {"querier": "hub", "cluster": "nort"}},
                    ],
                    "scrape": {"timeout": 2, "max_page_samples": 1000},
                }
            )
            async with Controller(settings, serve=False) as controller:
                report = report_json(await controller.once())
    finally:
        await runner.cleanup()
    east, north = report["clusters"]["east"], report["clusters"]["north"]
    assert east["errors"] == [] and east["capacity_from"] == "kv_blocks"
    assert east["kv_tokens"] == 2 * 2048 * 16
    assert north["healthy"] is True and north["capacity_from"] != "kv_blocks"
    (named,) = north["errors"]
    assert named["reason"] == "too_many_samples" and named["url"].endswith("(kv_pools)")
    assert "500 pool series or more" in named["detail"]
