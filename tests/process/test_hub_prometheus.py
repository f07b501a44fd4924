"""Fifty clusters read through one real Prometheus, as a hub Thanos holds a fleet: the
queries a tick sends do not grow with the clusters, none fails, and every cluster reads what
its pods serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.render import report_json
from controller.settings import build_settings
from tests.support.prometheus import Prometheus

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
