"""Every engine of the table through a real Prometheus with the default templates: a hot and
a cool cluster of each engine scraped by Prometheus, read back by PromQL, one querier's
clusters running different engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from controller.app import Controller
from controller.engines import ENGINES
from controller.render import report_json
from controller.settings import build_settings
from tests.support.engines import PAGES, Load
from tests.support.prometheus import Prometheus, job
from tests.support.servers import Server, text_handler

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOT, COOL = Load(kv=0.95, waiting=6, running=8, blocks=4000), Load(kv=0.20, blocks=4000)
PODS = 2


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prometheus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Prometheus]:
    workdir: Path = tmp_path_factory.mktemp("engines-prometheus")
    pages = {
        f"/{engine}/{heat}/{pod}": PAGES[engine](load)
        for engine in ENGINES
        for heat, load in (("hot", HOT), ("cool", COOL))
        for pod in range(PODS)
    }
    server = await Server().start({path: text_handler(text) for path, text in pages.items()})
    target = [f"127.0.0.1:{server.port}"]
    jobs = [
        job(
            path.strip("/").replace("/", "-"),
            target,
            {"cluster": "-".join(path.split("/")[1:3])},
            path=path,
        )
        for path in pages
    ]
    try:
        async with Prometheus(workdir, jobs) as running:
            # every pod scraped at least twice: last_over_time sees each
            await running.wait_for(f"count(count_over_time(up[1m]) >= 2) >= {len(jobs)}")
            yield running
    finally:
        await server.stop()


@pytest.mark.parametrize("engine", list(ENGINES))
async def test_each_engine_read_through_prometheus_with_the_default_templates(
    prometheus: Prometheus, engine: str
) -> None:
    names = [f"{engine}-hot", f"{engine}-cool"]
    settings = build_settings(
        {
            "queriers": [{"name": "hub", "url": prometheus.url, "push_interval": "1s"}],
            "clusters": [
                {"name": n, "prometheus": {"querier": "hub", "cluster": n}} for n in names
            ],
            "scrape": {"timeout": 2},
        }
    )
    async with Controller(settings, serve=False, dry_run=True) as controller:
        report = report_json(await controller.once())
    hot, cool = (report["clusters"][n] for n in names)
    assert hot["healthy"] and cool["healthy"], (hot["errors"], cool["errors"])
    assert (hot["vram_utilization"], hot["queue_depth"]) == (0.95, 12.0)
    assert (cool["vram_utilization"], cool["queue_depth"]) == (0.20, 0.0)
    assert hot["pods_answering"] == cool["pods_answering"] == PODS
    assert hot["kv_tokens"] == cool["kv_tokens"] == PODS * 4000 * 16  # the engine's pool
    assert cool["weight"] >= 60, report


async def test_a_cluster_with_no_series_names_the_query_that_came_back_empty(
    prometheus: Prometheus,
) -> None:
    settings = build_settings(
        {
            "queriers": [{"name": "hub", "url": prometheus.url, "push_interval": "1s"}],
            "clusters": [
                {"name": n, "prometheus": {"querier": "hub", "cluster": n}}
                for n in ("vllm-hot", "nowhere")
            ],
            "scrape": {"timeout": 2},
        }
    )
    async with Controller(settings, serve=False, dry_run=True) as controller:
        report = report_json(await controller.once())
    nowhere = report["clusters"]["nowhere"]
    assert nowhere["healthy"] is False and nowhere["reason"] == "missing_metric"
    (error,) = [e for e in nowhere["errors"] if e["reason"] == "missing_metric"]
    assert error["url"].endswith("(kv_mean)")
    assert error["detail"].startswith("kv_mean came back empty for cluster='nowhere'")
    assert "avg by (cluster)" in error["detail"]


async def test_a_row_of_your_own_with_a_backslash_or_a_dollar_leaves_the_queries_whole(
    prometheus: Prometheus,
) -> None:
    """Found by an audit: a row whose matcher value held a backslash passed check-config,
    then every query of the querier carried it unescaped and Prometheus refused them all
    (HTTP 400: every cluster of the querier unhealthy, an SGLang one too); one holding a
    ``$`` was refused at start-up as an unknown placeholder, pages-only configs too. Each
    value is now a PromQL string, escaped."""
    rows = [
        {"name": "acme", "kv": r"acme_kv{kind=a\q}", "waiting": "acme_queue", "running": "r"},
        {"name": "zeta", "kv": 'zeta_kv{kind="fr$ction"}', "waiting": "zq", "running": "zr"},
    ]
    names = ["sglang-hot", "sglang-cool"]
    settings = build_settings(
        {
            "engines": rows,
            "queriers": [{"name": "hub", "url": prometheus.url, "push_interval": "1s"}],
            "clusters": [
                {"name": n, "prometheus": {"querier": "hub", "cluster": n}} for n in names
            ],
            "scrape": {"timeout": 2},
        }
    )
    assert r'kind="a\\q"' in settings.prometheus_queries.kv_mean
    async with Controller(settings, serve=False, dry_run=True) as controller:
        report = report_json(await controller.once())
    hot, cool = (report["clusters"][n] for n in names)
    assert hot["healthy"] and cool["healthy"], (hot["errors"], cool["errors"])
    assert (hot["vram_utilization"], cool["vram_utilization"]) == (0.95, 0.20)
