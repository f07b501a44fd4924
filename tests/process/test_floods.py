"""The daemon as a child process at 1,024 open files, its metrics port HTTPS behind the API
server's TokenReview, against 1,100 connections that never start a TLS handshake (#40: they
were neither counted nor timed out before asyncio's own 60 s, took every descriptor, the probe
port and an authorised scrape timed out, and 273,598 accept-error lines were logged in a
minute)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from controller.fakes.clusters import Fleet, SimCluster
from tests.conftest import StartDaemon
from tests.integration.test_secure_metrics import self_signed
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import kubeconfig
from tests.support.servers import free_port

STALLED = 1_100
DAEMON_FILES = 1_024
PROMETHEUS = "system:serviceaccount:openshift-monitoring:prometheus-k8s"


@contextlib.contextmanager
def open_files(limit: int) -> Iterator[None]:
    """This process's soft limit of open files, for as long as it needs more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def status(url: str, trust: ssl.SSLContext | bool = False, token: str = "") -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=3)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, headers=headers, ssl=trust) as response,
    ):
        await response.read()
        return response.status


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            return await reader.read() == b""
    except (ConnectionResetError, TimeoutError):
        return False


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)  # no CRD is read here
async def test_stalled_tls_handshakes_cannot_blind_the_daemon(
    daemon: StartDaemon, apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    apiserver.users = {"prom-token": PROMETHEUS}
    apiserver.grants = {(PROMETHEUS, "/metrics")}
    cert, key = self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    port, probe = free_port(), free_port()
    async with Fleet([SimCluster("a", kv=0.3)]) as sims:
        child = await daemon(
            {
                "interval": "1s",
                "clusters": sims.settings_clusters(),
                "server": {
                    "bind": f"127.0.0.1:{port}",
                    "probe_bind": f"127.0.0.1:{probe}",
                    "tls_cert_file": str(cert),
                    "tls_key_file": str(key),
                    "authenticate": True,
                },
                "log": {"format": "json"},
            },
            "run",
            "--kubeconfig",
            str(kubeconfig(tmp_path / "kubeconfig", apiserver.url)),
            env={k: None for k in os.environ if k.startswith("KUBERNETES_")},
        )
        for _ in range(200):  # bounded: up and serving
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if await status(f"http://127.0.0.1:{probe}/readyz") == 200:
                    break
            await asyncio.sleep(0.1)
        # The daemon raises its soft limit to the hard one as it starts: held to 1,024 now.
        assert child.process is not None
        resource.prlimit(child.process.pid, resource.RLIMIT_NOFILE, (DAEMON_FILES, DAEMON_FILES))
        with open_files(4 * STALLED):
            stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(STALLED)]
            loop = asyncio.get_running_loop()
            began = loop.time()
            assert await status(f"http://127.0.0.1:{probe}/healthz") == 200
            assert await status(f"https://127.0.0.1:{port}/metrics", trust, "prom-token") == 200
            assert loop.time() - began <= 3.0
            closed = await asyncio.gather(*(closed_within(r, 15.0) for r, _ in stalled))
            for _, writer in stalled:
                writer.close()
        await child.stop()
    assert sum(closed) >= 0.9 * STALLED, sum(closed)
    log = (child.out + child.err).decode(errors="replace").splitlines()
    accept_errors = [line for line in log if "accept" in line.lower()]
    assert len(accept_errors) <= 100, accept_errors[:3]
