"""The aiohttp app: /metrics (our registry), /debug/state, /healthz (the loop is alive),
/readyz (it has decided at least once). Probes read the snapshot; they never trigger work.

Outside a cluster it is plain HTTP on the bind address. In one (the manifests set it) it is
HTTPS with the service CA's serving certificate, re-read when it rotates, and /metrics and
/debug/state ask the API server who the caller is and whether it may ``get`` the path
(``controller.kube.access``); the probes stay open."""

from __future__ import annotations

import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from controller.render import state_json
from controller.state import Snapshot

# The loop is alive if it finished a stage within this many intervals (each stage ends by its
# deadline, so a hung API server does not make a live loop look dead).
LIVENESS_INTERVALS = 3


# Paths that show what the controller sees and decides: behind authentication when it is on.
PROTECTED = frozenset({"/metrics", "/debug/state"})
Authorize = Callable[[str | None, str], Awaitable[int]]
_DENIED = {401: "Unauthorized\n", 403: "Forbidden\n", 503: "cannot review access now\n"}


def _guard(authorize: Authorize) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def guard(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.path in PROTECTED:
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            bearer = token.strip() if scheme.lower() == "bearer" else None
            code = await authorize(bearer, request.path)
            if code != 200:
                return web.Response(status=code, text=_DENIED.get(code, "denied\n"))
        return await handler(request)

    return guard


class ServingCertificate:
    """A TLS context whose certificate is re-read when its files change (the OpenShift
    service CA rotates serving certificates in place)."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._cert, self._key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] | None = None
        self.reload()

    def reload(self) -> bool:
        """Load the files if they changed since the last load; True if they did."""
        stamp = (self._cert.stat().st_mtime, self._key.stat().st_mtime)
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(str(self._cert), str(self._key))
        self._stamp = stamp
        return True


def make_app(
    registry: CollectorRegistry,
    snapshot: Snapshot,
    interval: float,
    authorize: Authorize | None = None,
) -> web.Application:
    started = time.monotonic()

    async def healthz(_: web.Request) -> web.Response:
        last = max(snapshot.report.finished_monotonic or started, snapshot.beat or started)
        age = time.monotonic() - last
        if age > LIVENESS_INTERVALS * interval:
            return web.Response(status=503, text=f"the loop has not turned for {age:.1f}s\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if snapshot.report.tick == 0:
            return web.Response(status=503, text="first reconcile not done\n")
        return web.Response(text="ok\n")

    async def state(_: web.Request) -> web.Response:
        leader = registry.get_sample_value("weight_controller_leader")
        known = None if leader is None else leader == 1
        return web.json_response(state_json(snapshot.report, known, snapshot.dry_run))

    app = web.Application(middlewares=[_guard(authorize)] if authorize is not None else [])
    app.router.add_get("/debug/state", state)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Serve ``app``; returns the runner and the bound port (``port=0`` picks a free one)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sockets = runner.addresses
    bound = int(sockets[0][1]) if sockets else port
    return runner, bound
