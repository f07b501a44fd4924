"""The routing target is the unit of decision: each ExternalModel (and HTTPRoute rule) is weighed
over its own clusters, and every view — logs, /metrics, /debug/state, status, ``once`` — shows
exactly what was decided and what the object holds. Against the API-server double, with the
real kubernetes-asyncio client."""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from controller import weights
from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.model import ClusterMetrics, Target, WriteResult
from controller.publish import Discovery
from controller.publish.configured import implicit
from controller.settings import build_settings
from controller.status import render
from controller.testing import Driver
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


class Recording:
    """The implicit target's publisher, with every write it is asked for kept."""

    def __init__(self, clusters: list[str]) -> None:
        self._inner = implicit(clusters)
        self.writes: list[tuple[str, dict[str, int]]] = []

    async def discover(self) -> Discovery:
        return await self._inner.discover()

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        self.writes.append((target.key, dict(desired)))
        return await self._inner.write(target, desired, why)


def _story(tick: int, now: float) -> dict[str, ClusterMetrics]:
    """East saturates with a growing queue, then cools well below the others; west holds;
    north fails for a while and comes back."""
    hot = 6 <= tick < 20
    east = 0.98 if hot else (0.1 if tick >= 20 else 0.3)
    north = None if 26 <= tick < 32 else 0.3
    return {
        "east": ClusterMetrics(
            "east",
            now,
            0.01,
            2,
            2,
            kv_mean=east,
            kv_max=east,
            queue_depth=10.0 * (tick - 5) if hot else 0.0,
            running=20.0,
        ),
        "west": ClusterMetrics("west", now, 0.01, 2, 2, kv_mean=0.3, kv_max=0.3, running=20.0),
        "north": ClusterMetrics(
            "north",
            now,
            0.01,
            2,
            0 if north is None else 2,
            kv_mean=north,
            kv_max=north,
            running=20.0,
        ),
    }


async def test_weights_are_decided_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a story that sheds, recovers and loses a cluster, every weight the loop writes and
    reports is what ``weights.weigh`` decided that tick, and nothing else: a second decider
    (a step that adjusts weights after it, a publisher or stage that works its own out, under
    any name) makes a write or the report differ from it."""
    names = ["east", "west", "north"]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in names],
        }
    )
    decided: list[dict[str, int]] = []  # this tick's weigh outputs
    real = weights.weigh

    def weigh(*args: Any, **kwargs: Any) -> Any:
        desired, decision = real(*args, **kwargs)
        decided.append(dict(desired))
        return desired, decision

    monkeypatch.setattr(weights, "weigh", weigh)
    publisher = Recording(names)
    driver = Driver(settings, publisher)
    seen: set[tuple[tuple[str, int], ...]] = set()
    for tick in range(45):
        decided.clear()
        written = len(publisher.writes)
        report = await driver.tick(1000.0 + 10 * tick, _story(tick, 1000.0 + 10 * tick))
        assert len(decided) == 1  # one target, weighed once (no conflict here)
        outcome = report.targets["configured"].outcome
        assert dict(outcome.desired) == decided[0]
        assert dict(outcome.applied) == decided[0]
        assert [w for _, w in publisher.writes[written:]] in ([], [decided[0]])
        assert {n: v.share for n, v in report.clusters.items()} == decided[0]
        seen.add(tuple(sorted(decided[0].items())))
    assert len(seen) >= 5, seen  # the story moved the weights: shed, given back, lost one
    assert len(publisher.writes) >= 3


def test_only_the_loop_weighs_and_only_weigh_decides() -> None:
    """Beside the behaviour above, where the deciding functions are called from: the loop's
    weigh stage calls ``weights.weigh``, which hands its inputs to one law's ``decide``."""
    callers: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        found = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("weigh", "decide"):
                    found.append(name)
        if found:
            callers[str(path.relative_to(PACKAGE))] = sorted(found)
    assert callers == {
        "reconcile/loop.py": ["weigh"],
        "weights/__init__.py": ["decide", "decide", "decide"],  # weigh → decide → the law's
    }


def test_no_publisher_imports_the_weights_module() -> None:
    """Publishers write what they are handed; deciding is not theirs."""
    for path in (PACKAGE / "publish").rglob("*.py"):
        tree = ast.parse(path.read_text())
        imports = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not any(m.startswith("controller.weights") for m in imports), path
        assert "from controller import weights" not in path.read_text(), path


async def test_the_law_reads_the_realised_share_the_report_showed() -> None:
    """The realised and intended shares a tick's report shows are what the next tick's law
    reads: b takes more requests than its weight sends it, and from the first tick whose
    window holds enough of them, the decision names b's own traffic as that window says."""
    names = ["a", "b", "c"]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in names],
        }
    )
    arrivals, kv = {"a": 20.0, "b": 60.0, "c": 20.0}, {"a": 0.3, "b": 0.6, "c": 0.3}
    driver = Driver(settings)
    shown: tuple[Mapping[str, float], Mapping[str, float]] | None = None
    for tick in range(4):
        now = 1000.0 + 10 * tick
        metrics = {
            n: ClusterMetrics(n, now, 0.01, 2, 2, kv_mean=kv[n], kv_max=kv[n], arrived=a)
            for n, a in arrivals.items()
        }
        view = (await driver.tick(now, metrics)).targets["configured"]
        notes = [n for n in view.outcome.decision.notes if "do not follow the weights" in n]
        if shown is None or not shown[0]:
            assert notes == []  # nothing counted yet: the law knows nothing of b's own
        else:
            realised, intended = shown
            routed = (realised["a"] + realised["c"]) / (intended["a"] + intended["c"])
            own = realised["b"] - intended["b"] * routed
            assert notes == [
                f"b: {own:.0f}% of arrivals do not follow the weights: at rest it gains "
                "no further than its fair share, 0.0"
            ]
        shown = (view.realised, view.intended)
    assert notes  # the window filled within the run
