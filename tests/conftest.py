"""Fixtures every tier shares: loopback servers, the API-server double, child daemons.

Helpers live in ``tests/support``; tests are in ``unit`` (pure, in-process), ``integration``
(real servers on loopback, the API-server double, the tools the manifests are checked with)
and ``process`` (the daemon as a child process, a real Prometheus, the built wheel).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

# Before any test imports kubernetes_asyncio: the tests then use the client loaded by the
# piece, exactly as the daemon does.
from controller.cli import lean_metrics
from controller.kube.client import tuned
from controller.kube.sdk import client
from tests.support.apiserver import FakeAPIServer
from tests.support.daemon import Daemon
from tests.support.servers import Handler, Server

# Controllers built in this process run as the daemon does: the CLI sets this at start-up.
lean_metrics()


StartDaemon = Callable[..., Awaitable[Daemon]]
Serve = Callable[[dict[str, Handler]], Awaitable[Server]]


@pytest.fixture(params=["v0.2.1", "v0.2.0"])
async def apiserver(request: pytest.FixtureRequest) -> AsyncIterator[FakeAPIServer]:
    """The Kubernetes API-server double (tests/support/apiserver.py) on loopback, admitting
    ExternalModels and ExternalProviders with the upstream CRDs of each MaaS version."""
    server = FakeAPIServer(crd_version=request.param)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def api(apiserver: FakeAPIServer) -> AsyncIterator[client.ApiClient]:
    """The real kubernetes-asyncio client, pointed at the double. Its session trusts the
    environment for proxies (``trust_env``, fixed in kubernetes-asyncio), which looks each
    request's proxy up on a thread: on loopback there is none to find, and under looptime a
    thread still in flight moves the loop's clock with the wall's, so the lookup is off."""
    configuration = tuned(client.Configuration(host=apiserver.url))  # as the daemon's is
    async with client.ApiClient(configuration) as api_client:
        api_client.rest_client.pool_manager._trust_env = False
        yield api_client


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    started: list[Server] = []

    async def start(routes: dict[str, Handler]) -> Server:
        server = await Server().start(routes)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[StartDaemon]:
    """Starts ``weight-controller <args>`` as a child process with ``config``; whatever is
    still running at the end of the test is killed."""
    started: list[Daemon] = []

    async def start(
        config: Mapping[str, Any] | str, *args: str, env: Mapping[str, str | None] | None = None
    ) -> Daemon:
        path = tmp_path / f"config-{len(started)}.yaml"
        child = await Daemon(path, config, *args, env=env).start()
        started.append(child)
        return child

    yield start
    for child in started:
        await child.kill()
