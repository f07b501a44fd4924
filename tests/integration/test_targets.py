"""The routing target is the unit of decision: each ExternalModel (and HTTPRoute rule) is weighed
over its own clusters, and every view — logs, /metrics, /debug/state, status, ``once`` — shows
exactly what was decided and what the object holds. Against the API-server double, with the
real kubernetes-asyncio client."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.status import render
from tests.conftest import StartDaemon
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import CRD, NS, kubeconfig, model, provider, settings_for, ticks, weights_of

PACKAGE = Path(__file__).resolve().parents[2] / "controller"
GRANITE = "ExternalModel/maas-system/granite"
LLAMA = "ExternalModel/maas-system/llama"


def three_clusters() -> Fleet:
    return Fleet(
        [
            SimCluster("east", kv=0.9, seed=1),
            SimCluster("west", kv=0.1, seed=2),
            SimCluster("north", kv=0.1, seed=3),
        ]
    )


def two_models(apiserver: FakeAPIServer) -> None:
    for name in ("east", "west", "north"):
        apiserver.put_object(CRD, "externalproviders", provider(name))
    apiserver.put_object(CRD, "externalmodels", model("granite", [("east", 50), ("west", 50)]))
    apiserver.put_object(CRD, "externalmodels", model("llama", [("north", 45), ("west", 55)]))


async def test_each_model_is_weighed_over_its_own_clusters_and_shown_as_written(
    apiserver: FakeAPIServer,
) -> None:
    two_models(apiserver)
    async with (
        three_clusters() as sims,
        client.ApiClient(client.Configuration(host=apiserver.url)) as api,
    ):
        settings = settings_for(sims, server={"bind": "127.0.0.1:0"})
        async with Controller(settings, api=api) as controller:
            with capture_logs() as logs:
                await ticks(controller, 3)
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{controller.port}/debug/state") as response,
            ):
                state = await response.json()
            registry = controller.registry
    granite, llama = weights_of(apiserver, "granite"), weights_of(apiserver, "llama")
    # granite's refs are east (hot) and west: weighed over those two only, away from east
    assert set(granite) == {"east", "west"} and sum(granite.values()) == 100
    assert granite["west"] > 50 > granite["east"]
    # llama (north, west, both cool, near their capacity shares) is its own decision: nothing
    # drove it, so it holds still
    assert llama == {"north": 45, "west": 55}
    assert apiserver.writes("PATCH", "externalmodels") and all(
        "granite" in path for _, path, _, _ in apiserver.writes("PATCH", "externalmodels")
    )
    for key, written in ((GRANITE, granite), (LLAMA, llama)):
        shown = state["targets"][key]
        assert shown["applied"] == written == shown["desired"]
        for ref, weight in written.items():
            labels = {"target": key, "ref": ref, "cluster": ref}
            assert registry.get_sample_value("weight_controller_applied_weight", labels) == weight
            assert registry.get_sample_value("weight_controller_desired_weight", labels) == weight
            assert shown["refs"][ref]["share"] == weight  # ExternalModel weights are percentages
    lines = [e for e in logs if e["event"] == "weights written"]
    assert {e["target"] for e in lines} == {GRANITE}
    last = dict(p.split("=") for p in lines[-1]["change"].split())
    assert {ref: int(change.split("->")[1]) for ref, change in last.items()} == granite
    # with two targets, no single cluster-level "weight" can be shown
    assert all(c["weight"] is None for c in state["clusters"].values())
    table = render(state)
    for ref, weight in granite.items():
        assert any(
            GRANITE in row and f" {weight} " in row and ref in row for row in table.split("\n")
        )


async def _once(daemon: StartDaemon, config: dict[str, Any], *flags: str) -> dict[str, Any]:
    """``weight-controller once`` as a child process (so the double keeps serving meanwhile)."""
    child = await daemon(config, "once", *flags)
    assert await child.finish() == 0, child.err.decode()
    result: dict[str, Any] = json.loads(child.out)
    return result


async def test_once_is_read_only_unless_told_to_apply(
    apiserver: FakeAPIServer, tmp_path: Path, daemon: StartDaemon
) -> None:
    for name in ("east", "west"):
        apiserver.put_object(CRD, "externalproviders", provider(name))
    apiserver.put_object(CRD, "externalmodels", model("granite", [("east", 50), ("west", 50)]))
    async with Fleet([SimCluster("east", kv=0.9, seed=1), SimCluster("west", kv=0.1)]) as sims:
        config = {
            "clusters": sims.settings_clusters(),
            "kubernetes": {
                "enabled": True,
                "namespaces": [NS],
                "kubeconfig": str(kubeconfig(tmp_path / "kubeconfig", apiserver.url)),
            },
        }
        looked = await _once(daemon, config)
        assert apiserver.writes() == []
        assert weights_of(apiserver, "granite") == {"east": 50, "west": 50}
        planned = looked["targets"][GRANITE]
        assert planned["write"] == "would" and planned["mode"] == "normal"
        assert planned["applied"]["west"] == planned["desired"]["west"] > 50
        assert looked["clusters"]["west"]["weight"] == planned["desired"]["west"]

        applied = await _once(daemon, config, "--apply")
    written = applied["targets"][GRANITE]
    assert written["write"] == "done"
    assert weights_of(apiserver, "granite") == written["applied"] == written["desired"]
    assert [m for m, *_ in apiserver.writes()] == ["PATCH", "POST"]  # the patch and its Event


def _calls(tree: ast.AST, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in names:
                found.append(name)
    return found


def test_weights_are_decided_in_one_place() -> None:
    """``weights.weigh``/``decide`` are called from the loop's weigh stage only (and ``decide``
    from ``weigh``, which hands it to one law's ``decide``); no publisher imports the weights
    module."""
    callers = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        found = _calls(tree, {"weigh", "decide"})
        if found:
            callers[str(path.relative_to(PACKAGE))] = sorted(found)
        if path.parent.name == "publish":
            imports = [
                n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            ]
            assert not any(m.startswith("controller.weights") for m in imports), path
            assert "from controller import weights" not in path.read_text(), path
    assert callers == {
        "reconcile/loop.py": ["weigh"],
        "weights/__init__.py": ["decide", "decide", "decide"],  # weigh → decide → the law's
    }
