"""Every engine of the table, end to end: pods of each serve their own engine's page on
loopback, the controller reads two clusters of it with a config that names no engine, and
moves traffic from the hot one to the cool one."""

from __future__ import annotations

import pytest
import structlog

from controller.app import Controller
from controller.engines import ENGINES
from controller.render import report_json
from controller.settings import build_settings
from tests.conftest import Serve
from tests.support.engines import OWN, PAGES, Load, acme_page
from tests.support.servers import text_handler

HOT, COOL = Load(kv=0.95, waiting=6, running=8, blocks=4000), Load(kv=0.20, blocks=4000)


@pytest.mark.parametrize("engine", list(ENGINES))
async def test_once_moves_traffic_from_the_hot_cluster_of_each_engine(
    serve: Serve, engine: str
) -> None:
    render, label = PAGES[engine], ENGINES[engine].replica_label

    def pod(load: Load, i: int) -> str:
        # a Ray node of each pod: a replica of its own (one id on two nodes is one replica)
        return render(load).replace(f'{label}="', f'{label}="{i}-') if label else render(load)

    server = await serve(
        {
            f"/{c}/{i}": text_handler(pod(load, i))
            for c, load in (("hot", HOT), ("cool", COOL))
            for i in range(2)
        }
    )
    settings = build_settings(
        {
            "clusters": [
                {"name": c, "vllm_urls": [server.url(f"/{c}/{i}") for i in range(2)]}
                for c in ("hot", "cool")
            ]
        }
    )
    with structlog.testing.capture_logs() as logs:
        async with Controller(settings, serve=False, dry_run=True) as controller:
            report = report_json(await controller.once())
    hot, cool = report["clusters"]["hot"], report["clusters"]["cool"]
    assert hot["healthy"] and cool["healthy"], (hot["errors"], cool["errors"])
    assert (hot["engine"], cool["engine"]) == (engine, engine)
    assert (hot["vram_utilization"], hot["queue_depth"]) == (0.95, 12.0)
    assert (cool["vram_utilization"], cool["queue_depth"]) == (0.20, 0.0)
    assert hot["kv_tokens"] == cool["kv_tokens"] == 2 * 4000 * 16  # the engine's pool
    assert cool["weight"] >= 60, report
    found = [e for e in logs if e["event"] == "cluster engine"]
    assert sorted((e["cluster"], e["engine"], e["was"]) for e in found) == [
        ("cool", engine, None),
        ("hot", engine, None),
    ]


async def test_once_reads_an_engine_of_your_own_from_the_config(serve: Serve) -> None:
    """A row in the config (engines[]), read over loopback with no engine named: the same
    as a built-in one."""
    server = await serve(
        {"/hot": text_handler(acme_page(0.95, 12, 8)), "/cool": text_handler(acme_page(0.2, 0, 2))}
    )
    settings = build_settings(
        {
            "engines": [OWN],
            "clusters": [{"name": c, "vllm_urls": [server.url(f"/{c}")]} for c in ("hot", "cool")],
        }
    )
    async with Controller(settings, serve=False, dry_run=True) as controller:
        report = report_json(await controller.once())
    hot, cool = report["clusters"]["hot"], report["clusters"]["cool"]
    assert (hot["engine"], hot["vram_utilization"], hot["queue_depth"]) == ("acme", 0.95, 12.0)
    assert (cool["engine"], cool["vram_utilization"], cool["kv_tokens"]) == ("acme", 0.2, 32000)
    assert cool["weight"] >= 60, report
