"""A page several clusters read is fetched once a tick: a Ray node's page holds replicas of
several models, each model its own cluster (``SharedPages``). Only pages read alike are
shared: the same credentials and limits, and nothing of a cluster's own folded in as the page
is read (a pod page whose e2e buckets a cluster folds is read by each)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controller.app import Controller
from controller.fakes.pages import CumulativeHistogram, vllm_v1_page
from controller.render import report_json
from controller.settings import build_settings
from controller.sources.scrape import SharedPages
from tests.support.servers import Server
from tests.unit.test_ray import CAPTURE, A, B


class Counted:
    """A page on loopback that counts its reads."""

    def __init__(self, text: str) -> None:
        self.text, self.reads = text, 0

    async def handle(self, _: web.Request) -> web.Response:
        self.reads += 1
        return web.Response(text=self.text, content_type="text/plain")


def settings_for(clusters: list[dict[str, Any]]) -> Any:
    return build_settings(
        {
            "interval": 1,
            "server": {"bind": "127.0.0.1:0"},
            "clusters": clusters,
            "scrape": {"timeout": 0.5},
            "weights": {"settle": 0},
        }
    )


async def test_a_ray_node_is_read_once_a_tick_for_each_model_s_cluster(tmp_path: Path) -> None:
    node = Counted(CAPTURE.read_text())
    server = await Server().start({"/metrics": node.handle})
    url = server.url("/metrics")
    token = tmp_path / "token"
    token.write_text("t\n")
    clusters: list[dict[str, Any]] = [
        # (under engine auto alike from the second read on, once the page's row is known)
        {"name": "llama", "vllm_urls": [url], "model_name": A, "engine": "ray-vllm"},
        {"name": "qwen", "vllm_urls": [url], "model_name": B, "engine": "ray-vllm"},
        # another cluster's credentials: read on its own
        {
            "name": "other",
            "vllm_urls": [url],
            "model_name": B,
            "engine": "ray-vllm",
            "bearer_token_file": str(token),
            "allow_token_over_http": True,
        },
    ]
    try:
        async with Controller(settings_for(clusters), serve=False) as controller:
            first = report_json(await controller.once())
            assert node.reads == 2  # llama and qwen once, other once
            second = report_json(await controller.once())
            assert node.reads == 4  # a tick later: read again, not last tick's page
    finally:
        await server.stop()
    for report in (first, second):
        views = report["clusters"]
        assert (views["llama"]["replicas"], views["qwen"]["replicas"]) == (2, 1)
        assert views["llama"]["vram_utilization"] == pytest.approx(0.90)
        assert views["qwen"]["vram_utilization"] == pytest.approx(0.20)
        assert views["other"]["vram_utilization"] == pytest.approx(0.20)


async def test_a_page_a_cluster_folds_as_it_reads_is_read_by_each() -> None:
    histogram = CumulativeHistogram()
    histogram.observe(1.0, 10)
    pod = Counted(vllm_v1_page(A, [0.5], [0.0], [1.0], [histogram]))
    server = await Server().start({"/metrics": pod.handle})
    url = server.url("/metrics")
    clusters = [{"name": "a", "vllm_urls": [url]}, {"name": "b", "vllm_urls": [url]}]
    try:
        async with Controller(settings_for(clusters), serve=False) as controller:
            await controller.once()
    finally:
        await server.stop()
    assert pod.reads == 2


async def test_a_round_is_shared_once_per_cluster_and_never_past_its_timeout() -> None:
    now = [0.0]
    shared = SharedPages(clock=lambda: now[0])
    answers = iter(range(100))

    async def fetch() -> Any:
        return next(answers)

    async def read(cluster: str) -> Any:
        return await shared.read("node", cluster, 3.0, fetch)

    assert [await read("a"), await read("b")] == [0, 0]  # one round for both
    assert await read("a") == 1  # a asks again: the next tick's round
    now[0] = 3.5
    assert await read("b") == 2  # b has not had round 1, but it is past its timeout
    assert shared.fetched == 3


async def test_a_cluster_cancelled_at_its_deadline_leaves_the_round_to_the_others() -> None:
    shared = SharedPages()
    release = asyncio.Event()

    async def fetch() -> Any:
        await release.wait()
        return "page"

    first = asyncio.ensure_future(shared.read("node", "a", 3.0, fetch))
    second: asyncio.Future[Any] = asyncio.ensure_future(shared.read("node", "b", 3.0, fetch))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "page"
    assert first.cancelled() and shared.fetched == 1


async def test_a_round_every_waiter_left_is_cancelled_and_close_cancels_the_rest() -> None:
    """A tick's deadline cancels its clusters' fetches: a round nobody awaits any more must
    not run on into the next tick (nor, at shutdown, into a closed session)."""
    shared = SharedPages()
    cancelled: list[str] = []
    started = asyncio.Event()

    def hanging(name: str) -> Any:
        async def fetch() -> Any:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        return fetch

    a = asyncio.ensure_future(shared.read("node", "a", 3.0, hanging("node")))
    b = asyncio.ensure_future(shared.read("node", "b", 3.0, hanging("node")))
    await started.wait()
    a.cancel()
    await asyncio.sleep(0)
    assert cancelled == []  # b still waits for it
    b.cancel()
    await asyncio.gather(a, b, return_exceptions=True)
    await asyncio.sleep(0)
    assert cancelled == ["node"]
    started.clear()
    c = asyncio.ensure_future(shared.read("other", "a", 3.0, hanging("other")))
    await started.wait()
    await shared.close()
    assert cancelled == ["node", "other"]
    assert isinstance((await asyncio.gather(c, return_exceptions=True))[0], asyncio.CancelledError)


async def test_a_round_in_flight_is_shared_however_long_it_takes() -> None:
    """Freshness counts from the answer: a round still queued behind a saturated limiter
    past the timeout is joined, never fetched a second time in the same tick."""
    now = [0.0]
    shared = SharedPages(clock=lambda: now[0])
    release = asyncio.Event()

    async def slow() -> Any:
        await release.wait()
        return "page"

    first: asyncio.Future[Any] = asyncio.ensure_future(shared.read("node", "a", 3.0, slow))
    await asyncio.sleep(0)
    now[0] = 10.0
    second: asyncio.Future[Any] = asyncio.ensure_future(shared.read("node", "b", 3.0, slow))
    await asyncio.sleep(0)
    release.set()
    assert [await first, await second] == ["page", "page"]
    assert shared.fetched == 1


async def test_a_forgotten_round_leaves_no_cycle_behind() -> None:
    """Once forgotten, a round's page is freed at once, not by a later full collection:
    the daemon collects rarely (``settle_collector``), and a tick's pages held in a cycle
    until then cost a node's page each (+26 MB at 200 Ray nodes, bench_daemon --ray)."""

    class Answer:  # a page stand-in that can be watched
        pass

    shared = SharedPages()

    async def fetch() -> Any:
        return Answer()

    gc.disable()
    try:
        page = weakref.ref(await shared.read("node", "a", 0.0, fetch))
        for _ in range(3):  # the answer's callback, then the forget it schedules
            await asyncio.sleep(0)
        assert page() is None
    finally:
        gc.enable()
