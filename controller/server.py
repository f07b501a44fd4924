"""The aiohttp app: /metrics (our registry), /debug/state, /healthz (the loop is alive),
/readyz (it has decided at least once). Probes read the snapshot; they never trigger work.

The server bounds what a client can hold (``Connections``), counted from accept: at most
``MAX_CONNECTIONS`` open (past it, the oldest without a whole request makes room, else the
one idle longest after its answer, else the new one is closed at once, so the process never
runs out of file descriptors and the probes stay reachable), ``HEADER_TIMEOUT`` to finish a
TLS handshake and send a whole request, ``IDLE_TIMEOUT`` of keep-alive.

Outside a cluster it is plain HTTP on the bind address. In one (the manifests set it) it is
HTTPS with the service CA's serving certificate, re-read when it rotates, and /metrics and
/debug/state ask the API server who the caller is and whether it may ``get`` the path
(``controller.kube.access``); the probes stay open."""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from controller.render import state_json
from controller.settings.files import regular
from controller.state import Snapshot

# The loop is alive if it finished a stage within this many intervals (each stage ends by its
# deadline, so a hung API server does not make a live loop look dead).
LIVENESS_INTERVALS = 3


# What one client may hold of the server. Prometheus keeps one connection per target alive
# between scrapes (every 30 s by default), so idle connections live a little over two scrapes.
MAX_CONNECTIONS = 256
# /metrics and /debug/state are rendered off the loop, a few at a time: rendered on it, 16
# scrapers of a 200-cluster fleet (470 KB) held the probe port's /healthz for up to 2.15 s,
# past the kubelet's 1 s, and the loop ticked 4 times in 20 s (found by an attack). A thread
# gives the GIL back every 5 ms, so the loop answers probes and ticks between.
RENDERS_AT_ONCE = 2
HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 65.0
# At the limit, a connection idle after its answer for this long may be closed for a new one.
IDLE_GRACE = 1.0


class Connections:
    """The server's connections, counted and bounded from accept. A protocol factory around
    aiohttp's: past ``limit`` open a new connection is closed as it arrives; one that has not
    finished its TLS handshake and sent a whole request's headers ``header_timeout`` after it
    was accepted is closed (a slow client holding a descriptor). The handshake is done here,
    under the same count and deadline (``loop.start_tls``): left to ``create_server``, a
    connection was seen only once its handshake was done, so 1,100 that never started one
    were neither counted nor timed out before asyncio's own 60 s, and took every descriptor.
    ``on_close(reason)`` counts what we closed."""

    def __init__(
        self,
        limit: int = MAX_CONNECTIONS,
        header_timeout: float = HEADER_TIMEOUT,
        on_change: Callable[[int], None] = lambda open_now: None,
        on_close: Callable[[str], None] = lambda reason: None,
        idle_grace: float = IDLE_GRACE,
    ) -> None:
        self.limit, self.header_timeout, self.idle_grace = limit, header_timeout, idle_grace
        self._on_change, self._on_close = on_change, on_close
        self._open: dict[_Bounded, None] = {}  # in the order they were accepted
        self._by_transport: dict[object, _Bounded] = {}  # its raw and its TLS transport

    def protocol(
        self, make: Callable[[], asyncio.Protocol], tls: ssl.SSLContext | None = None
    ) -> asyncio.Protocol:
        """A new connection's protocol: ``make``'s (aiohttp's), behind a TLS handshake where
        ``tls`` is given, or past the limit one that closes it at once (and aiohttp never
        builds a handler for it)."""
        if len(self._open) >= self.limit and not self._make_room():
            self._on_close("limit")
            return _Refused()
        return _Bounded(make(), self, tls)

    def _make_room(self) -> bool:
        """At the limit, the oldest connection that has not sent a whole request yet (a
        stalled handshake, a slow client) is closed for the new one, so clients that hold
        slots without a request cannot keep the probes or a scrape out for their header
        deadline; else the one idle longest, kept alive after its answer for ``idle_grace``
        or more with nothing of it left to write (256 clients that each sent one request and
        stayed idle kept every probe out for the idle timeout, renewable: found by an attack;
        a client kept alive reconnects for its next request, as Prometheus does); else the
        one whose client has read nothing of its answer for longest (``_stalled``); ``False``
        when every open one is busy."""
        oldest = next((b for b in self._open if b.waiting), None)
        if oldest is None:
            now = asyncio.get_running_loop().time()
            idle = [(b.idle_since, b) for b in self._open if b.idle_since is not None]
            since, longest = min(
                ((t, b) for t, b in idle if not b.writing), key=lambda p: p[0], default=(now, None)
            )
            if longest is None or now - since < self.idle_grace:
                longest = self._stalled(now)
                if longest is None:
                    return False
            oldest = longest
        self._on_close("limit")
        oldest.abort()
        return True

    def _stalled(self, now: float) -> _Bounded | None:
        """The connection whose client has read nothing of its answer for longest, if for
        ``header_timeout`` or more: 16 clients that sent one GET of a 5.6 MB /metrics and read
        none of it held every slot past both timeouts, the probes shut out until they closed
        (found by an attack). A slow reader reads now and then, and keeps its slot."""
        stalled = [(b.stalled_since, b) for b in self._open if b.stalled_since is not None]
        since, longest = min(stalled, key=lambda p: p[0], default=(now, None))
        return longest if now - since >= self.header_timeout else None

    def answered(self, transport: object) -> None:
        """A whole request arrived on ``transport``: its header deadline no longer applies,
        and it is busy until ``idle``."""
        bounded = self._by_transport.get(transport)
        if bounded is not None:
            bounded.answered()
            bounded.idle_since = None

    def idle(self, transport: object) -> None:
        """``transport``'s request was handled: from now, it is kept alive idle."""
        bounded = self._by_transport.get(transport)
        if bounded is not None:
            bounded.idle_since = asyncio.get_running_loop().time()

    def _opened(self, transport: object, bounded: _Bounded) -> None:
        self._open[bounded] = None
        self._by_transport[transport] = bounded
        self._on_change(len(self._open))

    def _also(self, transport: object, bounded: _Bounded) -> None:
        """``bounded``'s TLS transport, once its handshake is done (what aiohttp sees)."""
        self._by_transport[transport] = bounded

    def _closed(self, bounded: _Bounded, *transports: object) -> None:
        for transport in transports:
            self._by_transport.pop(transport, None)
        if bounded in self._open:
            del self._open[bounded]
            self._on_change(len(self._open))

    def _timed_out(self) -> None:
        self._on_close("header_timeout")


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _Bounded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its TLS handshake, its header deadline
    and its count. Under TLS, ``start_tls`` makes this the protocol of the decrypted stream:
    the calls below then come from asyncio's SSL layer."""

    def __init__(
        self, inner: asyncio.Protocol, owner: Connections, tls: ssl.SSLContext | None = None
    ) -> None:
        self._inner, self._owner, self._tls = inner, owner, tls
        self._transport: asyncio.Transport | None = None  # as accepted
        self._secure: asyncio.Transport | None = None  # over TLS, once the handshake is done
        self._deadline: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._made = False  # aiohttp's protocol has its connection
        self.idle_since: float | None = None  # kept alive after an answer, since (loop time)
        # asyncio paused our writing (the client reads slowly), and has not resumed it since
        self.stalled_since: float | None = None  # (loop time)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._owner._opened(transport, self)
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._owner.header_timeout, self._expire)
        if self._tls is None:
            self._made = True
            self._inner.connection_made(transport)
            return
        transport.pause_reading()  # nothing read before start_tls takes the stream over
        self._handshake = loop.create_task(self._start_tls(transport, self._tls))

    async def _start_tls(self, transport: asyncio.Transport, tls: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            secure = await loop.start_tls(
                transport,
                self,
                tls,
                server_side=True,
                ssl_handshake_timeout=self._owner.header_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, asyncio.CancelledError):
            secure = None
        if secure is None or secure.is_closing():
            # A failed, cut or timed-out handshake. asyncio's SSL layer tells this protocol of
            # a connection lost only once its handshake is done, so it is let go of here.
            transport.abort()
            self.answered()
            self._owner._closed(self, transport)
            return
        self._secure = secure
        self._owner._also(secure, self)
        self._made = True
        self._inner.connection_made(secure)

    def answered(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    @property
    def waiting(self) -> bool:
        """Still within its header deadline: no whole request yet."""
        return self._deadline is not None

    def abort(self) -> None:
        """Closed by us to make room (``Connections._make_room``)."""
        self.answered()
        if self._transport is not None:
            self._transport.abort()
        self._owner._closed(self, self._transport, self._secure)

    def _expire(self) -> None:
        self._deadline = None
        if self._transport is not None and not self._transport.is_closing():
            self._owner._timed_out()
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self.stalled_since = asyncio.get_running_loop().time()
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self.stalled_since = None
        self._inner.resume_writing()

    @property
    def writing(self) -> bool:
        """An answer is still going out: the handler returned it, but aiohttp writes its body
        after (a review cut a slow scrape of 25 MB at 3.7 MB to make room)."""
        transport = self._secure or self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return self.stalled_since is not None or buffered > 0

    def connection_lost(self, exc: Exception | None) -> None:
        self.answered()
        self._owner._closed(self, self._transport, self._secure)
        if self._handshake is not None and not self._handshake.done():
            self._handshake.cancel()
        if self._made:  # aiohttp's protocol never saw a connection that failed its handshake
            self._made = False
            self._inner.connection_lost(exc)


class AcceptErrors:
    """asyncio's "socket.accept() out of system resource" (descriptors ran out) as one line
    when a burst starts and one when it ends, with how many there were: as a loop exception
    handler, in front of the one it replaces (or the default) for everything else. A burst
    ends ``quiet`` seconds after its last error."""

    PREFIX = "socket.accept() out of system resource"

    def __init__(self, logger: Any, quiet: float = 10.0) -> None:
        self._log, self._quiet = logger, quiet
        self.count = 0  # in the burst under way (0: none)
        self._ends: asyncio.TimerHandle | None = None
        self._previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self.handle)

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith(self.PREFIX):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        if self.count == 0:
            error = context.get("exception")
            self._log.error("accept failing", error=f"{type(error).__name__}: {error}")
        self.count += 1
        if self._ends is not None:
            self._ends.cancel()
        self._ends = loop.call_later(self._quiet, self._ended)

    def _ended(self) -> None:
        self._log.warning("accept failing ended", occurrences=self.count)
        self.count, self._ends = 0, None


CONNECTIONS = web.AppKey("connections", Connections)


@web.middleware
async def _mark_answered(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    connections = request.app[CONNECTIONS]
    connections.answered(request.transport)
    try:
        return await handler(request)
    finally:
        connections.idle(request.transport)


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
        regular(self._cert)  # a FIFO swapped in would block the event loop's reload
        regular(self._key)
        self.context.load_cert_chain(str(self._cert), str(self._key))
        self._stamp = stamp
        return True


Probe = Callable[[web.Request], Awaitable[web.Response]]


def probes(snapshot: Snapshot, interval: float) -> tuple[Probe, Probe]:
    """/healthz (the loop turns: a stage finished within ``LIVENESS_INTERVALS``) and /readyz
    (it has decided at least once)."""
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

    return healthz, readyz


def make_probe_app(
    snapshot: Snapshot, interval: float, connections: Connections | None = None
) -> web.Application:
    """The probes alone (``server.probe_bind``): plain HTTP, no token, nothing else to read."""
    healthz, readyz = probes(snapshot, interval)
    app = web.Application(middlewares=[_mark_answered])
    app[CONNECTIONS] = connections or Connections()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def make_app(
    registry: CollectorRegistry,
    snapshot: Snapshot,
    interval: float,
    authorize: Authorize | None = None,
    connections: Connections | None = None,
) -> web.Application:
    healthz, readyz = probes(snapshot, interval)

    renders = asyncio.Semaphore(RENDERS_AT_ONCE)

    async def state(_: web.Request) -> web.Response:
        report, dry_run = snapshot.report, snapshot.dry_run  # the tick's, whole

        def rendered() -> bytes:
            leader = registry.get_sample_value("weight_controller_leader")  # collects it all
            known = None if leader is None else leader == 1
            return json.dumps(state_json(report, known, dry_run)).encode()

        async with renders:
            body = await asyncio.to_thread(rendered)
        return web.Response(body=body, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        """As prometheus-client's aiohttp handler answers (its encoder for the Accept, gzip
        when asked), but rendered off the loop; ``name[]`` filtering is not offered."""
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        zipped = gzip_accepted(request.headers.get("Accept-Encoding", ""))

        def rendered() -> bytes:
            output = encoder(registry)
            return gzip.compress(output) if zipped else output

        async with renders:
            body = await asyncio.to_thread(rendered)
        headers = {"Content-Type": content_type}
        if zipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    guard = [_guard(authorize)] if authorize is not None else []
    app = web.Application(middlewares=[_mark_answered, *guard])
    app[CONNECTIONS] = connections or Connections()
    app.router.add_get("/debug/state", state)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None
) -> tuple[Serving, int]:
    """Serve ``app`` within its ``Connections``; returns what to close and the bound port
    (``port=0`` picks a free one)."""
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, keepalive_timeout=IDLE_TIMEOUT
    )
    await runner.setup()
    connections, handlers = app[CONNECTIONS], runner.server
    assert handlers is not None  # set by setup()
    loop = asyncio.get_running_loop()
    try:
        # plain sockets: the TLS handshake is the bounded protocol's (Connections)
        listening = await loop.create_server(
            lambda: connections.protocol(handlers, tls), host, port, reuse_address=True
        )
    except BaseException:
        await runner.cleanup()
        raise
    sockets = listening.sockets
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return Serving(runner, listening), bound


class Serving:
    """A started server: ``cleanup`` stops accepting, then lets aiohttp close what is open."""

    def __init__(self, runner: web.AppRunner, listening: asyncio.Server) -> None:
        self._runner, self._listening = runner, listening

    async def cleanup(self) -> None:
        self._listening.close()
        await self._runner.cleanup()
