"""Two real controller processes, one API server double, one hot cluster, one SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.fakes.clusters import Fleet, SimCluster
from tests.apiserver import FakeAPIServer
from tests.conftest import free_port
from tests.test_kubernetes import CRD, NS, seed, weights_of

LEASE_DURATION = 2.0
RETRY = 0.25


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": server}}],
                "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
                "contexts": [
                    {"name": "double", "context": {"cluster": "double", "user": "tester"}}
                ],
                "current-context": "double",
            }
        )
    )
    return path


async def leader_gauge(session: aiohttp.ClientSession, port: int) -> float | None:
    try:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "weight_controller_leader":
                return float(sample.value)
    return None


async def test_two_processes_elect_one_leader_and_fail_over(
    apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    async with Fleet([SimCluster("east", kv=0.2), SimCluster("west", kv=0.2)]) as sims:
        ports = [free_port(), free_port()]
        processes = []
        for index, port in enumerate(ports):
            config = {
                "interval": "300ms",
                "clusters": sims.settings_clusters(),
                "scrape": {"timeout": "150ms"},
                "server": {"bind": f"127.0.0.1:{port}"},
                "kubernetes": {"enabled": True, "api_timeout": "1s"},
                "leader_election": {
                    "identity": f"replica-{index}",
                    "lease_duration": f"{LEASE_DURATION}s",
                    "renew_deadline": "1500ms",
                    "retry_period": f"{int(RETRY * 1000)}ms",
                },
            }
            path = tmp_path / f"config-{index}.yaml"
            path.write_text(yaml.safe_dump(config))
            env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "controller",
                    "run",
                    "--config",
                    str(path),
                    "--leader-elect",
                    "--kubeconfig",
                    str(kubeconfig(tmp_path / "kubeconfig", apiserver.url)),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
        try:
            async with aiohttp.ClientSession() as session:
                leader = await _wait_for_one_leader(session, ports)
                follower = 1 - leader
                sims["east"].kv = 0.95
                await _wait(lambda: weights_of(apiserver)["west"] >= 80, 15)
                assert await leader_gauge(session, ports[follower]) == 0
                processes[leader].send_signal(signal.SIGKILL)
                await processes[leader].wait()
                loop = asyncio.get_running_loop()
                killed = loop.time()
                while await leader_gauge(session, ports[follower]) != 1:
                    assert loop.time() - killed < 10, "follower never took over"
                    await asyncio.sleep(0.05)
                took = loop.time() - killed
                print(f"follower took over {took:.2f}s after SIGKILL")
                # the follower waits out the lease from when it last saw a renewal
                assert took <= LEASE_DURATION + 2 * RETRY + 0.5, took
                sims["east"].kv, sims["west"].kv = 0.2, 0.95
                await _wait(lambda: weights_of(apiserver)["east"] >= 80, 15)
        finally:
            for process in processes:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(process.wait(), 10)
    lease = apiserver.get("coordination.k8s.io/v1", "leases", NS, "weight-controller")
    assert lease is not None and lease["spec"]["leaseTransitions"] >= 1
    assert apiserver.get(CRD, "externalmodels", NS, "llama") is not None


async def _wait_for_one_leader(session: aiohttp.ClientSession, ports: list[int]) -> int:
    for _ in range(200):
        gauges = [await leader_gauge(session, port) for port in ports]
        if sorted(g or 0 for g in gauges) == [0, 1]:
            return gauges.index(1)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no single leader: {gauges}")


async def _wait(check: object, seconds: float) -> None:
    assert callable(check)
    loop = asyncio.get_running_loop()
    began = loop.time()
    while not check():
        assert loop.time() - began < seconds, "condition not met in time"
        await asyncio.sleep(0.1)
