"""Two real controller processes, one API server double, one hot cluster, one SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.fakes.clusters import Fleet, SimCluster
from tests.conftest import StartDaemon
from tests.support.apiserver import FakeAPIServer
from tests.support.daemon import Daemon
from tests.support.kube import CRD, NS, kubeconfig, seed, weights_of
from tests.support.servers import free_port

LEASE_DURATION = 2.0
RETRY = 0.25


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


async def replica(
    daemon: StartDaemon, apiserver: FakeAPIServer, tmp_path: Path, sims: Fleet, index: int
) -> tuple[Daemon, int]:
    """One leader-electing daemon against the double (no in-cluster environment); its port."""
    port = free_port()
    child = await daemon(
        {
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
        },
        "run",
        "--leader-elect",
        "--kubeconfig",
        str(kubeconfig(tmp_path / "kubeconfig", apiserver.url)),
        env={k: None for k in os.environ if k.startswith("KUBERNETES_")},
    )
    return child, port


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)  # the Lease is no CRD's
async def test_two_processes_elect_one_leader_and_fail_over(
    apiserver: FakeAPIServer, tmp_path: Path, daemon: StartDaemon
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    async with Fleet([SimCluster("east", kv=0.2), SimCluster("west", kv=0.2)]) as sims:
        started = [await replica(daemon, apiserver, tmp_path, sims, i) for i in range(2)]
        replicas, ports = [c for c, _ in started], [p for _, p in started]
        async with aiohttp.ClientSession() as session:
            leader = await _wait_for_one_leader(session, ports)
            follower = 1 - leader
            sims["east"].kv = 0.95
            await _wait(lambda: weights_of(apiserver)["west"] >= 80, 15)
            assert await leader_gauge(session, ports[follower]) == 0
            await replicas[leader].kill()  # SIGKILL: no release of the Lease
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
        await replicas[follower].stop(10)
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


async def test_sighup_stops_cleanly_and_releases_the_lease(
    apiserver: FakeAPIServer, tmp_path: Path, daemon: StartDaemon
) -> None:
    """SIGHUP killed the daemon (Python's default) with the Lease still held, so the next
    leader waited out a whole lease. It now stops as SIGTERM does; settings are not reloaded
    (a restart reads them), and the log says so."""
    seed(apiserver, [("east", 50), ("west", 50)])
    async with Fleet([SimCluster("east", kv=0.2), SimCluster("west", kv=0.2)]) as sims:
        child, port = await replica(daemon, apiserver, tmp_path, sims, 0)
        async with aiohttp.ClientSession() as session:
            for _ in range(200):  # bounded: 10 s
                if await leader_gauge(session, port) == 1:
                    break
                await asyncio.sleep(0.05)
            assert await leader_gauge(session, port) == 1
        await child.stop(10, signal.SIGHUP)
    assert child.returncode == 0, child.err.decode()
    lease = apiserver.get("coordination.k8s.io/v1", "leases", NS, "weight-controller")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""
    events = child.events()
    hup = [e for e in events if e["event"] == "signal received"]
    assert hup and hup[0]["signal"] == "SIGHUP" and "restart" in hup[0]["note"]
    assert events[-1]["event"] == "stopped"
