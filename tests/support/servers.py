"""aiohttp servers on 127.0.0.1 with routes a test adds, and ports nothing listens on."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def free_port() -> int:
    """A loopback port nothing listens on (for 'connection refused' and child processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """An aiohttp server on 127.0.0.1 with routes added per test."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.runner: web.AppRunner | None = None
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self, routes: dict[str, Handler]) -> Server:
        for path, handler in routes.items():
            self.app.router.add_get(path, handler)
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=0.1
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runner = runner
        self.port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def text_handler(text: str, status: int = 200, content_type: str = "text/plain") -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=text, status=status, content_type=content_type)

    return handler
