"""Fetching at scale and under attack: a bounded number of requests in flight with timeouts
that start when a request gets its turn, and pages read piece by piece so that a hostile page
costs its own cluster and nothing else (the event loop, /healthz and the honest cluster go on).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from controller.app import Controller
from controller.errors import FetchError
from controller.settings import build_settings
from controller.sources.http import ACCEPT_TEXT, Endpoint, get_text
from tests.support.servers import Server

Serve = Callable[
    [dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]], Awaitable[Server]
]
GOOD = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.3\n'


async def test_a_large_fleet_queues_instead_of_timing_itself_out(serve: Serve) -> None:
    in_flight, most = [0], [0]

    async def slow(_: web.Request) -> web.Response:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.05)  # each page takes 50 ms to answer
        in_flight[0] -= 1
        return web.Response(text=GOOD)

    server = await serve({"/{pod}/metrics": slow})
    # 40 clusters × 10 pods through 8 slots: ~2.5 s of queueing, each request well under its
    # 1 s timeout once it runs. Counting the wait as the request's own time would fail most.
    clusters = [
        {"name": f"c{c}", "vllm_urls": [server.url(f"/c{c}p{p}/metrics") for p in range(10)]}
        for c in range(40)
    ]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": clusters,
            "scrape": {"timeout": 1, "max_concurrency": 8},
            "server": {"bind": "127.0.0.1:0"},
        }
    )
    async with Controller(settings, serve=False) as controller:
        report = await controller.once()
    failures = [
        e
        for view in report.clusters.values()
        for e in (view.metrics.errors if view.metrics else ())
    ]
    assert failures == []
    assert all(v.health is not None and v.health.healthy for v in report.clusters.values())
    assert most[0] <= 8  # never more than the limit in flight


async def test_healthz_answers_while_a_hostile_ten_megabyte_page_is_read(serve: Serve) -> None:
    hostile = ("x " + 'vllm:kv_cache_usage_perc{engine="0"} 1 ' * 260_000 + "\n").encode()
    assert len(hostile) > 10_000_000

    async def attack(_: web.Request) -> web.Response:
        return web.Response(body=hostile, content_type="text/plain")

    async def honest(_: web.Request) -> web.Response:
        return web.Response(text=GOOD)

    server = await serve({"/hostile": attack, "/honest": honest})
    settings = build_settings(
        {
            "interval": 2,
            "clusters": [
                {"name": "hostile", "vllm_urls": [server.url("/hostile")]},
                {"name": "honest", "vllm_urls": [server.url("/honest")]},
            ],
            "scrape": {"timeout": 1.5, "max_body_bytes": 16 * 1024 * 1024},
            "server": {"bind": "127.0.0.1:0"},
        }
    )
    async with Controller(settings) as controller:
        stop = asyncio.Event()
        run = asyncio.create_task(controller.run(stop))
        slowest = 0.0
        async with aiohttp.ClientSession() as session:
            for _ in range(30):  # 3 s of probes while ticks read the hostile page
                began = time.monotonic()
                async with session.get(f"http://127.0.0.1:{controller.port}/healthz") as response:
                    await response.read()
                slowest = max(slowest, time.monotonic() - began)
                await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(run, 10)
        clusters = controller.snapshot.report.clusters
        target = controller.snapshot.report.targets["configured"].outcome
    assert slowest < 0.5, slowest
    hostile_view, honest_view = clusters["hostile"], clusters["honest"]
    assert honest_view.health is not None and honest_view.health.healthy
    assert hostile_view.metrics is not None
    assert [e.reason.value for e in hostile_view.metrics.errors] == ["parse"]
    assert "longer than" in hostile_view.metrics.errors[0].detail
    assert target.applied["honest"] == 100


async def test_a_url_no_parser_takes_fails_as_its_page_not_at_construction() -> None:
    """An endpoint is built before any request (its URL parsed once): one that does not
    parse is a failed page of its own when read, never an error that stops its cluster."""
    endpoint = Endpoint("http://[bad/metrics", 1.0, 1024)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(FetchError):
            await get_text(session, endpoint, ACCEPT_TEXT)
