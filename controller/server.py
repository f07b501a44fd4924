"""The aiohttp app: /metrics (our registry), /healthz (the loop is alive), /readyz (it has
decided at least once). Probes read the snapshot; they never trigger work."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from controller.exporter import Snapshot, state_json

# The loop is alive if it ticked within this many intervals.
LIVENESS_INTERVALS = 3


def make_app(registry: CollectorRegistry, snapshot: Snapshot, interval: float) -> web.Application:
    started = time.monotonic()

    async def healthz(_: web.Request) -> web.Response:
        last = snapshot.last_tick_monotonic or started
        age = time.monotonic() - last
        if age > LIVENESS_INTERVALS * interval:
            return web.Response(status=503, text=f"no tick for {age:.1f}s\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if snapshot.ticks == 0:
            return web.Response(status=503, text="first reconcile not done\n")
        return web.Response(text="ok\n")

    async def state(_: web.Request) -> web.Response:
        leader = registry.get_sample_value("weight_controller_leader")
        return web.json_response(state_json(snapshot, None if leader is None else leader == 1))

    app = web.Application()
    app.router.add_get("/debug/state", state)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app``; returns the runner and the bound port (``port=0`` picks a free one)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sockets = runner.addresses
    bound = int(sockets[0][1]) if sockets else port
    return runner, bound
