"""Shared test helpers: real aiohttp servers on loopback and the shared real fixtures."""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

# Before any test imports kubernetes_asyncio: the tests then use the client loaded by the
# piece, exactly as the daemon does.
import controller.kube.sdk  # noqa: F401
from tests.apiserver import FakeAPIServer

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"

# The daemon as a child process, the way the image and the README run it.
CONTROLLER = (sys.executable, "-m", "controller")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def free_port() -> int:
    """A loopback port nothing listens on (for 'connection refused' and child processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["v0.2.1", "v0.2.0"])
async def apiserver(request: pytest.FixtureRequest) -> AsyncIterator[FakeAPIServer]:
    """The Kubernetes API-server double (tests/apiserver.py) on loopback, admitting
    ExternalModels and ExternalProviders with the upstream CRDs of each MaaS version."""
    server = FakeAPIServer(crd_version=request.param)
    await server.start()
    yield server
    await server.stop()


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def fixture_names() -> list[str]:
    names = sorted(p.name for p in FIXTURES.glob("*.prom"))
    assert names, f"no fixtures found under {FIXTURES}"
    return names


class Server:
    """An aiohttp server on 127.0.0.1 with routes added per test."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.runner: web.AppRunner | None = None
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[dict[str, Handler]], Awaitable[Server]]]:
    started: list[web.AppRunner] = []

    async def start(routes: dict[str, Handler]) -> Server:
        server = Server()
        for path, handler in routes.items():
            server.app.router.add_get(path, handler)
        runner = web.AppRunner(
            server.app, access_log=None, handle_signals=False, shutdown_timeout=0.1
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server.runner = runner
        server.port = int(runner.addresses[0][1])
        started.append(runner)
        return server

    yield start
    for runner in started:
        await runner.cleanup()


def text_handler(text: str, status: int = 200, content_type: str = "text/plain") -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=text, status=status, content_type=content_type)

    return handler
