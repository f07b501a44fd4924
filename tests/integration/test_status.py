"""``/debug/state`` and ``weight-controller status`` against a running controller."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from kubernetes_asyncio import client

from controller.app import Controller
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.kube.objects import PAUSE_ANNOTATION, PIN_ANNOTATION
from controller.render import state_json
from controller.status import fetch_state, render
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import CRD, model, provider, seed, settings_for, ticks


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
                as_json = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "controller",
                    "status",
                    "--url",
                    url.removeprefix("http://"),  # no scheme: http is meant
                    "-o",
                    "json",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                printed_json, _ = await asyncio.wait_for(as_json.communicate(), 30)
    finally:
        await server.stop()
    assert state["ticks"] == 3 and state["leader"] is True
    assert state["clusters"]["east"]["healthy"] is False
    assert state["clusters"]["east"]["reason"] == "http_status"
    refs = state["targets"]["ExternalModel/maas-system/llama"]["refs"]
    assert refs["west"] | {"goal": None, "factors": None, "realised": None} == {
        "cluster": "west",
        "desired": 100,
        "applied": 100,
        "share": 100.0,
        "goal": None,
        "factors": None,
        "capacity_from": "kv_blocks",  # its pods publish vllm:cache_config_info
        "realised": None,
        "intended": None,
    }
    assert "score" in refs["west"]["factors"] and refs["east"]["factors"] is None  # unhealthy
    assert state["kubernetes"] == {"reachable": True, "error": None}
    assert refs["east"]["applied"] == 0
    table = render(state)
    assert "UNHEALTHY (http_status)" in table and "leader: yes" in table
    assert "kubernetes: reachable" in table
    assert any(
        "east: http://127.0.0.1:" in line and "http_status: HTTP 500" in line
        for line in table.splitlines()
    )
    explained = render(state, explain=True)
    assert "DEMAND SHARE" in explained and "score = capacity share" in explained
    assert "law: capacity" in explained
    assert "REALISED" in explained
    # where its capacity came from: its pods' KV pools
    assert any("west" in line and "kv_blocks" in line for line in explained.splitlines())
    assert "actuation delay not measured yet" in explained
    assert "ExternalModel/maas-system/llama" in table
    assert done.returncode == 0, stderr.decode()
    assert json.loads(printed_json)["ticks"] == 3
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


def test_status_json_and_unreachable_kubernetes() -> None:
    state = {
        "ticks": 3,
        "leader": None,
        "clusters": {},
        "targets": {},
        "kubernetes": {"reachable": False, "error": "list externalmodels: HTTP 503"},
    }
    assert "kubernetes: UNREACHABLE (list externalmodels: HTTP 503)" in render(state, now=0)


def test_explain_names_the_law_from_each_decision_not_from_its_factors() -> None:
    refs = {
        ref: {"cluster": ref, "desired": w, "applied": w, "share": float(w), "factors": None}
        for ref, w in (("a", 60), ("b", 40))
    }

    def target(law: str, mode: str) -> dict[str, object]:
        return {"law": law, "mode": mode, "write": "none", "last_write": None, "refs": refs}

    state = {
        "ticks": 1,
        "leader": True,
        "clusters": {},
        "kubernetes": {"reachable": None},
        # every cluster unhealthy in one: no factors at all, the law is still the decision's
        "targets": {
            "ExternalModel/ns/old": target("integral", "fail_static"),
            "ExternalModel/ns/new": target("capacity", "hold"),
        },
    }
    explained = render(state, now=0, explain=True).splitlines()
    assert "KV HEADROOM" in explained[explained.index("law: integral") + 1]
    assert "DEMAND SHARE" in explained[explained.index("law: capacity") + 1]


ESC = "\x1b"
FORGED = f"{ESC}]2;owned\a{ESC}[2J{ESC}[H{ESC}[1;31mALL CLUSTERS HEALTHY{ESC}[8m"


async def test_a_tenant_s_annotations_reach_status_printable_and_short(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Found by an attack: a pause note and a pin's keys of escape sequences came out raw in
    ``status`` (a cleared screen, a window title, hidden text: a forged picture in an
    incident), and a pin of many unknown keys listed them all, up to 16 KB."""
    async with Fleet([SimCluster("east", kv=0.5), SimCluster("west", kv=0.2)]) as sims:
        for ref in ("east", "west"):
            apiserver.put_object(CRD, "externalproviders", provider(ref, namespace="team-b"))
        refs = [("east", 50), ("west", 50)]
        pins = {FORGED: 10, **{f"ref-{i}": 1 for i in range(40)}}
        for name, annotations in (
            ("paused", {PAUSE_ANNOTATION: f"incident 42{FORGED}\nsee #ops"}),
            ("pinned", {PIN_ANNOTATION: json.dumps(pins)}),
        ):
            apiserver.put_object(
                CRD,
                "externalmodels",
                model(name, refs, namespace="team-b", annotations=annotations),
            )
        async with Controller(settings_for(sims), serve=False, api=api) as controller:
            await ticks(controller, 2)
            served = json.dumps(state_json(controller.snapshot.report, True, False))
    text = render(json.loads(served), explain=True)
    assert all(c.isprintable() for line in text.splitlines() for c in line)
    notes = [line for line in text.splitlines() if line.startswith("note: ")]
    paused = next(n for n in notes if "team-b/paused" in n)
    assert "incident 42 ]2;owned  [2J [H [1;31mALL CLUSTERS HEALTHY [8m see #ops" in paused
    pinned = next(n for n in notes if "team-b/pinned" in n)
    assert "'\\x1b]2;owned\\x07" in pinned and "(+36 more)" in pinned and len(pinned) < 600
