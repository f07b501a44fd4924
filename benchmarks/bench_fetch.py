"""The whole fetch-and-extract path: CPU per endpoint, to check 2,000 endpoints / 10 s / core.

    python benchmarks/bench_fetch.py [--endpoints 200] [--rounds 5]

A separate process serves the ~150 KB vLLM V1 page on loopback (so its CPU is not counted);
this process scrapes ``--endpoints`` URLs per round through one ScrapeSource, exactly as a tick
does, and reports CPU milliseconds per endpoint and the endpoints one core could handle per 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from controller.settings import ClusterSettings, ScrapeSettings  # noqa: E402
from controller.sources.scrape import ScrapeSource  # noqa: E402

# Every page on a connection of its own, as production sees it: each pod is its own host, so
# no connection serves two pods, and vLLM closes an idle connection after 5 s
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, vllm/envs.py), before the next 10 s tick. Served with
# keep-alive, the pods here (all on one host:port) would share a few connections and each
# page would skip a TCP connect it pays for in a real fleet.
SERVER = """
import sys
from aiohttp import web
sys.path.insert(0, {root!r})
from benchmarks.vllm_page import vllm_v1_page
body = vllm_v1_page().encode()
async def page(_):
    response = web.Response(body=body, content_type="text/plain")
    response.force_close()
    return response
app = web.Application()
app.router.add_get("/{{pod}}/metrics", page)
web.run_app(app, host="127.0.0.1", port={port}, print=None, access_log=None)
"""


@contextlib.contextmanager
def page_servers(count: int = 1) -> Iterator[list[int]]:
    """``count`` separate processes serving the page on loopback; yields their ports."""
    ports = [free_port() for _ in range(count)]
    servers = [
        subprocess.Popen([sys.executable, "-c", SERVER.format(root=str(ROOT), port=port)])
        for port in ports
    ]
    try:
        yield ports
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    raise RuntimeError("benchmark server did not start")


async def measure(port: int, endpoints: int, rounds: int) -> None:
    per_endpoint_ms, wall = await cpu_per_endpoint(port, endpoints, rounds)
    print(f"{endpoints} endpoints x {rounds} rounds, 150 KiB pages")
    print(f"client CPU: {per_endpoint_ms:.2f} ms per endpoint scrape")
    print(f"wall: {wall / rounds:.2f} s per round (one server process)")
    print(f"one core keeps up with ~{10_000 / per_endpoint_ms:,.0f} endpoints per 10 s tick")


async def cpu_per_endpoint(port: int, endpoints: int, rounds: int) -> tuple[float, float]:
    """CPU milliseconds per endpoint scrape (fetch + extract) and the wall seconds in all."""
    urls = [f"http://127.0.0.1:{port}/pod-{i}/metrics" for i in range(endpoints)]
    await wait_up(urls[0])
    cluster = ClusterSettings.model_validate({"name": "bench", "vllm_urls": urls})
    connector = aiohttp.TCPConnector(limit=endpoints)
    async with aiohttp.ClientSession(connector=connector) as session:
        source = ScrapeSource(cluster, ScrapeSettings(), 10.0, session)
        await source.fetch()  # warm: connections open, label sets seen
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            metrics = await source.fetch()
            assert metrics.pods_answering == endpoints, metrics.errors[:3]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu * 1000 / (endpoints * rounds), wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with page_servers() as (port,):
        asyncio.run(measure(port, args.endpoints, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
