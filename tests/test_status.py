"""``/debug/state`` and ``weight-controller status`` against a running controller."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from kubernetes_asyncio import client

from controller.app import Controller
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.status import fetch_state, render
from tests.apiserver import FakeAPIServer
from tests.test_kubernetes import seed, settings_for


async def test_state_and_status_table_show_clusters_targets_and_leader() -> None:
    server = FakeAPIServer()
    await server.start()
    try:
        async with (
            Fleet([SimCluster("east", kv=0.9), SimCluster("west", kv=0.2)]) as sims,
            client.ApiClient(client.Configuration(host=server.url)) as api,
        ):
            seed(server, [("east", 50), ("west", 50)])
            settings = settings_for(sims, server={"bind": "127.0.0.1:0"})
            async with Controller(settings, api=api) as controller:
                sims["east"].fault = Fault.HTTP_500
                for _ in range(3):
                    await controller.once()
                url = f"http://127.0.0.1:{controller.port}"
                state = await fetch_state(url)
                done = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "controller",
                    "status",
                    "--url",
                    url,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                stdout, stderr = await asyncio.wait_for(done.communicate(), 30)
    finally:
        await server.stop()
    assert state["ticks"] == 3 and state["leader"] is True
    assert state["clusters"]["east"]["healthy"] is False
    assert state["clusters"]["east"]["reason"] == "http_status"
    refs = state["targets"]["ExternalModel/maas-system/llama"]["refs"]
    assert refs["west"] | {"goal": None} == {
        "cluster": "west",
        "desired": 100,
        "applied": 100,
        "share": 100.0,
        "goal": None,
    }
    assert refs["east"]["applied"] == 0
    table = render(state)
    assert "UNHEALTHY (http_status)" in table and "leader: yes" in table
    assert "ExternalModel/maas-system/llama" in table
    assert done.returncode == 0, stderr.decode()
    printed = stdout.decode()
    assert "CLUSTER" in printed and "east" in printed and "TARGET" in printed


async def test_status_of_nothing_running_is_a_clear_error() -> None:
    done = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controller",
        "status",
        "--url",
        "http://127.0.0.1:9",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(done.communicate(), 30)
    assert done.returncode == 1
    assert "cannot read http://127.0.0.1:9/debug/state" in stderr.decode()
