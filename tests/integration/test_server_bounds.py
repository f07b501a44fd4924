"""Our own HTTP server against clients that hold on: too many connections, a request that
never finishes. 1,100 such connections took the default 1,024 descriptors, made /healthz
unreachable and wrote ~60 MB of logs in 34 s."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from structlog.testing import capture_logs

from controller import server
from controller.state import Snapshot
from tests.integration.test_secure_metrics import self_signed

CLOSED_WITHIN = 5.0  # bound for waiting on the server to close a connection


class Counted:
    def __init__(self) -> None:
        self.closed: list[str] = []
        self.open_now = 0

    def change(self, open_now: int) -> None:
        self.open_now = open_now

    def close(self, reason: str) -> None:
        self.closed.append(reason)


@pytest.fixture
async def counted() -> Counted:
    return Counted()


async def serving(
    counted: Counted, limit: int, header_timeout: float, idle_grace: float = server.IDLE_GRACE
) -> AsyncIterator[tuple[server.Serving, int]]:
    connections = server.Connections(
        limit, header_timeout, counted.change, counted.close, idle_grace
    )
    app = server.make_app(CollectorRegistry(), Snapshot(), 10.0, connections=connections)
    serving, port = await server.start(app, "127.0.0.1", 0)
    try:
        yield serving, port
    finally:
        await serving.cleanup()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """The server closed (or reset) the connection within the bound."""
    try:
        async with asyncio.timeout(CLOSED_WITHIN):
            return await reader.read() == b""
    except ConnectionResetError:
        return True


async def get(session: aiohttp.ClientSession, port: int) -> int:
    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
        return response.status


async def test_past_the_limit_the_oldest_without_a_request_makes_room(
    counted: Counted,
) -> None:
    """Clients that hold a slot and never send a request cannot keep the probes out for their
    header deadline: the oldest of them is closed for the newcomer."""
    async for _, port in serving(counted, limit=4, header_timeout=60):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        for _ in range(100):  # bounded: the server has seen all four
            if counted.open_now == 4:
                break
            await asyncio.sleep(0.01)
        assert counted.open_now == 4
        async with aiohttp.ClientSession() as session:
            assert await get(session, port) == 200  # at the limit, answered all the same
        assert await closed_by_server(held[0][0])  # the oldest made room
        assert counted.closed == ["limit"]
        for _, w in held:
            w.close()


async def test_past_the_limit_of_answered_clients_a_new_one_is_closed_at_once(
    counted: Counted,
) -> None:
    """Every slot held by a client that sent its request (keep-alive) within ``idle_grace``
    of its answer: none is taken from it, the newcomer is closed."""
    async for _, port in serving(counted, limit=2, header_timeout=60):
        sessions = [aiohttp.ClientSession() for _ in range(2)]
        try:
            for session in sessions:  # each keeps its connection alive after its answer
                assert await get(session, port) == 200
            assert counted.open_now == 2
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await closed_by_server(reader)
            writer.close()
            assert counted.closed == ["limit"]
        finally:
            for session in sessions:
                await session.close()


async def test_past_the_limit_the_client_idle_longest_after_its_answer_makes_room(
    counted: Counted,
) -> None:
    """An attack: 256 clients each sent one request and stayed idle (keep-alive), and every
    probe on both ports was closed unanswered for the idle timeout, renewable with one
    request a minute. At the limit, the client idle longest past ``idle_grace`` makes room."""
    async for _, port in serving(counted, limit=2, header_timeout=60, idle_grace=0.05):
        sessions = [aiohttp.ClientSession() for _ in range(2)]
        try:
            for session in sessions:  # each keeps its connection alive after its answer
                assert await get(session, port) == 200
            await asyncio.sleep(0.1)  # past the grace
            async with aiohttp.ClientSession() as probe:
                assert await get(probe, port) == 200
            assert counted.closed == ["limit"]
            for session in sessions:  # the one closed reconnects for its next request
                assert await get(session, port) == 200
        finally:
            for session in sessions:
                await session.close()


class _Big(Collector):
    """One family whose help text is 16 MB: a /metrics page larger than kernel buffers."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("big", "x" * (16 << 20), value=1.0)


async def unread_scrape(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A GET /metrics from a client with a small receive buffer that reads nothing yet."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**16)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return reader, writer


async def test_an_answer_still_being_written_is_never_cut_to_make_room(
    counted: Counted,
) -> None:
    """A review: the connection was marked idle when the handler returned, before aiohttp
    wrote the body, so a newcomer at the limit cut a slow scrape of 25 MB at 3.7 MB. A
    connection with an answer still going out is busy: the newcomer is closed instead."""
    registry = CollectorRegistry()
    registry.register(_Big())
    connections = server.Connections(1, 60, counted.change, counted.close, idle_grace=0.05)
    app = server.make_app(registry, Snapshot(), 10.0, connections=connections)
    serving, port = await server.start(app, "127.0.0.1", 0)
    try:
        reader, writer = await unread_scrape(port)  # a scraper reading slowly
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        got = len(await reader.read(65536))
        await asyncio.sleep(0.2)  # past the grace, the rest of the answer still going out
        probe_reader, probe = await asyncio.open_connection("127.0.0.1", port)
        probe.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await closed_by_server(probe_reader)  # the newcomer, not the scrape
        probe.close()
        while chunk := await reader.read(1 << 20):
            got += len(chunk)
            if got >= length:
                break
        writer.close()
        assert got == length and counted.closed == ["limit"]
    finally:
        await serving.cleanup()


async def test_a_request_that_never_finishes_is_closed_and_a_finished_one_is_kept(
    counted: Counted,
) -> None:
    async for _, port in serving(counted, limit=8, header_timeout=0.2):
        slow_reader, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        await slow.drain()
        # a client that finished its request keeps its connection past the header deadline
        async with aiohttp.ClientSession() as session:
            assert await get(session, port) == 200
            assert await closed_by_server(slow_reader)
            await asyncio.sleep(0.3)
            assert await get(session, port) == 200
        assert counted.closed == ["header_timeout"]
        slow.close()


async def test_the_probe_port_serves_the_probes_alone_without_a_token() -> None:
    """Probes shared the HTTPS, token-protected metrics port; the kubelet should need neither."""
    from controller.app import Controller
    from controller.fakes.clusters import Fleet, SimCluster
    from controller.settings import build_settings

    async with Fleet([SimCluster("a", kv=0.3)]) as sims:
        settings = build_settings(
            {
                "interval": 1,
                "clusters": sims.settings_clusters(),
                "scrape": {"timeout": 0.5},
                "server": {"bind": "127.0.0.1:0", "probe_bind": "127.0.0.1:0"},
            }
        )
        async with Controller(settings) as controller, aiohttp.ClientSession() as session:
            await controller.once()
            assert controller.probe_port and controller.probe_port != controller.port
            base = f"http://127.0.0.1:{controller.probe_port}"
            for path, code in (("/healthz", 200), ("/readyz", 200), ("/metrics", 404)):
                async with session.get(base + path) as response:
                    assert response.status == code, path


def test_the_bind_flags_override_the_file_and_are_checked_as_it_is() -> None:
    import argparse

    from controller.cli import with_flags
    from controller.errors import ConfigError
    from controller.settings import build_settings

    settings = build_settings({"clusters": [{"name": "a", "vllm_urls": ["http://a:1/"]}]})
    flags = {"kubeconfig": None, "context": None, "leader_elect": False}
    given = argparse.Namespace(
        **flags, metrics_bind_address="0.0.0.0:9443", health_probe_bind_address=":8081"
    )
    with pytest.raises(ConfigError) as raised:
        with_flags(settings, given)
    assert raised.value.lines == ["--health-probe-bind-address: expected host:port, got ':8081'"]
    given.health_probe_bind_address = "0.0.0.0:8081"
    served = with_flags(settings, given).server
    assert (served.bind, served.probe_bind) == ("0.0.0.0:9443", "0.0.0.0:8081")


def test_a_fifo_swapped_in_for_the_serving_certificate_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    """A review: the certificate is reloaded on the event loop when its files change; one
    replaced by a FIFO (no writer) blocked the reload, and with it the probes and the ticks."""
    cert, key = self_signed(tmp_path)
    serving = server.ServingCertificate(cert, key)
    cert.unlink()
    os.mkfifo(cert)
    with pytest.raises(OSError, match="not a regular file"):
        serving.reload()  # at once: nothing opened the FIFO


async def test_a_tls_handshake_never_started_is_counted_and_cut_at_the_header_deadline(
    counted: Counted, tmp_path: Path
) -> None:
    """Left to asyncio, a TLS connection was seen only once its handshake was done: 1,100
    that never started one were neither counted nor timed out before asyncio's own 60 s, took
    every descriptor, and the probe and an authorised scrape timed out."""
    cert, key = self_signed(tmp_path)
    tls = server.ServingCertificate(cert, key).context
    connections = server.Connections(4, 0.3, counted.change, counted.close)
    app = server.make_app(CollectorRegistry(), Snapshot(), 10.0, connections=connections)
    serving, port = await server.start(app, "127.0.0.1", 0, tls)
    try:
        stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        for _ in range(100):  # bounded: counted from accept, before any handshake
            if counted.open_now == 4:
                break
            await asyncio.sleep(0.01)
        assert counted.open_now == 4
        assert all([await closed_by_server(r) for r, _ in stalled])
        assert counted.closed == ["header_timeout"] * 4
        client_tls = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{port}/healthz"
            async with session.get(url, ssl=client_tls) as response:
                assert response.status == 200  # a real handshake, answered
        for _, w in stalled:
            w.close()
    finally:
        await serving.cleanup()


async def test_accept_errors_are_one_line_a_burst_with_their_count() -> None:
    """Descriptors run out: asyncio reports every failed accept (273,598 lines, 94 MB, in a
    minute once). One line when a burst starts, one when it ends, with the count."""
    loop = asyncio.get_running_loop()
    others: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: others.append(context))
    try:
        with capture_logs() as logs:
            errors = server.AcceptErrors(structlog.get_logger("test"), quiet=0.05)
            errors.install(loop)
            failed = {"message": errors.PREFIX, "exception": OSError(24, "Too many open files")}
            for _ in range(1000):
                loop.call_exception_handler(dict(failed))
            loop.call_exception_handler({"message": "something else"})
            for _ in range(100):  # bounded: until the burst is over
                if errors.count == 0:
                    break
                await asyncio.sleep(0.02)
    finally:
        loop.set_exception_handler(None)
    events = [(e["event"], e.get("occurrences")) for e in logs]
    assert events == [("accept failing", None), ("accept failing ended", 1000)]
    assert "Too many open files" in logs[0]["error"]
    assert [c["message"] for c in others] == ["something else"]  # to the handler it replaced


async def test_a_client_that_reads_none_of_its_answer_gives_its_slot_up(
    counted: Counted,
) -> None:
    """Found by an attack: clients that sent one GET of a large /metrics and read none of it
    held every slot past both timeouts, and every probe and scrape was refused until they
    closed. At the limit, one whose client has read nothing for the header deadline is
    closed for the newcomer; a slow reader (the test above) keeps its slot."""
    registry = CollectorRegistry()
    registry.register(_Big())
    connections = server.Connections(1, 0.5, counted.change, counted.close, idle_grace=0.05)
    app = server.make_app(registry, Snapshot(), 10.0, connections=connections)
    serving, port = await server.start(app, "127.0.0.1", 0)
    try:
        _, writer = await unread_scrape(port)  # and never read
        for _ in range(100):  # until its answer is going out and has stalled
            await asyncio.sleep(0.1)
            if connections._stalled(asyncio.get_running_loop().time()) is not None:
                break
        else:
            raise AssertionError("the answer never stalled")
        async with aiohttp.ClientSession() as session:
            assert await get(session, port) == 200  # the newcomer is served
        assert counted.closed == ["limit"]
        writer.close()
    finally:
        await serving.cleanup()


class _Held(Collector):
    """A collector that holds its render until told: the loop must answer meanwhile."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.released = False

    def collect(self) -> Iterator[Metric]:
        self.started.set()
        self.released = self.release.wait(30)
        yield GaugeMetricFamily("held", "rendered once released", value=1.0)


async def test_a_render_of_metrics_or_state_leaves_the_loop_free_for_probes() -> None:
    """Found by an attack: /metrics and /debug/state were rendered on the loop, so 16
    scrapers of a 200-cluster fleet (470 KB each) held /healthz, on its own port too, for up
    to 2.15 s (the kubelet's probe times out at 1 s) and the loop ticked 4 times in 20 s.
    Here a render is held until a probe has been answered: on the loop, it never would be."""
    held = _Held()
    registry = CollectorRegistry()
    registry.register(held)
    app = server.make_app(registry, Snapshot(), 10.0)
    serving, port = await server.start(app, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/debug/state"):
                held.started.clear()
                held.release.clear()

                async def fetch(path: str = path) -> tuple[int, str]:
                    async with session.get(base + path) as answer:
                        return answer.status, await answer.text()

                rendering = asyncio.create_task(fetch())
                assert await asyncio.to_thread(held.started.wait, 30), path
                async with session.get(base + "/healthz") as probe:
                    assert probe.status == 200, path  # answered while the render is held
                assert not rendering.done(), path
                held.release.set()
                status, text = await asyncio.wait_for(rendering, 30)
                assert held.released, path  # released by us, not by its own timeout
                assert status == 200 and ("held 1.0" in text or '"ticks"' in text), path
    finally:
        held.release.set()
        await serving.cleanup()
