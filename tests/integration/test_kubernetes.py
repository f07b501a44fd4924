"""Publishing to Kubernetes with the real kubernetes-asyncio client over HTTP, against the
API-server double in tests/support/apiserver.py (its docstring lists the behaviours it implements)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from controller import weights
from controller.app import Controller
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.kube.objects import LAST_APPLIED, VLLM_URLS_ANNOTATION
from controller.model import Signals
from controller.settings import Settings, build_settings
from tests.conftest import StartDaemon
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import (
    CRD,
    GATEWAY,
    NS,
    model,
    provider,
    route,
    seed,
    settings_for,
    ticks,
    wait_until,
    weights_of,
)


@pytest.fixture
async def sims() -> AsyncIterator[Fleet]:
    async with Fleet([SimCluster("east", kv=0.2), SimCluster("west", kv=0.2)]) as fleet:
        yield fleet


# ---- the pure part ---------------------------------------------------------------------------


def test_weigh_keeps_unmapped_refs_and_shares_the_rest() -> None:
    from controller.kube.objects import Ref, Target

    refs = (
        Ref("/spec/externalProviderRefs/0", "/ref/name", "east", 40, "east"),
        Ref("/spec/externalProviderRefs/1", "/ref/name", "west", 40, "west"),
        Ref("/spec/externalProviderRefs/2", "/ref/name", "saas", 20, None),
    )
    target = Target("ExternalModel", NS, "m", "uid", "1", refs, {}, None)
    signals: dict[str, Signals | None] = {"east": Signals(kv=0.95), "west": Signals(kv=0.1)}
    desired, decision = weights.weigh(
        target,
        signals,
        build_settings({"clusters": [{"name": "x", "epp_url": "http://127.0.0.1/"}]}).weights,
    )
    assert decision.changed
    assert desired["saas"] == 20
    assert desired["east"] + desired["west"] == 80
    assert desired["west"] > desired["east"]


# ---- publishing ------------------------------------------------------------------------------


async def test_moves_weights_away_from_the_hot_cluster_with_guarded_patches(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    apiserver.put_object(
        CRD, "externalmodels", model("unmanaged", [("east", 50), ("west", 50)], managed=False)
    )
    # west has little room below pressure: even the emergency step off a saturated east whose
    # queue grows is max_step, so the shift takes several writes under one or two Events
    sims["west"].kv = 0.6
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 2)
        assert apiserver.writes("PATCH") == []  # balanced already: nothing to write
        sims["east"].kv = 0.95
        await ticks(controller, 6)
    final = weights_of(apiserver)
    assert final["west"] >= 80 and sum(final.values()) == 100
    assert weights_of(apiserver, "unmanaged") == {"east": 50, "west": 50}
    patches = apiserver.writes("PATCH", "externalmodels")
    assert patches
    for _, _, content_type, ops in patches:
        assert content_type == "application/json-patch+json"
        tests = {op["path"]: op["value"] for op in ops if op["op"] == "test"}
        for op in ops:
            if op["path"].endswith("/weight"):
                index = op["path"].split("/")[3]
                assert tests[f"/spec/externalProviderRefs/{index}/ref/name"] in ("east", "west")
    obj = apiserver.get(CRD, "externalmodels", NS, "llama")
    assert obj is not None
    recorded = json.loads(obj["metadata"]["annotations"][LAST_APPLIED])
    assert recorded["weights"] == final and recorded["time"].endswith("Z")
    assert obj["metadata"]["managedFields"][-1]["manager"] == "weight-controller"
    events = apiserver.writes("POST", "events")
    assert events[0][3]["involvedObject"]["name"] == "llama"
    assert events[0][3]["reason"] == "WeightsChanged"
    # an Event when the mode changes, not one per write: each names a mode the last did not
    modes = [e[3]["message"].removeprefix("Weights changed (").partition(":")[0] for e in events]
    assert 1 <= len(events) < len(patches)
    assert all(a != b for a, b in itertools.pairwise(modes))
    assert "more write(s) since the last Event" not in events[0][3]["message"]


async def test_writes_only_on_change(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 90), ("west", 10)])
    # east is busier but under no pressure: west, far below its capacity share, is brought
    # back towards it, and then nothing more is written
    sims["east"].kv = 0.7
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        quiet = 0
        for _ in range(40):  # bounded: until three ticks in a row write nothing
            before = len(apiserver.writes("PATCH"))
            await controller.once()
            quiet = quiet + 1 if len(apiserver.writes("PATCH")) == before else 0
            if quiet == 3:
                break
        settled = len(apiserver.writes("PATCH"))
        await ticks(controller, 5)
    assert settled >= 3 and quiet == 3
    params = controller.settings.weights
    # the pods split evenly: back within `rebalance` of 50, and no further write
    assert abs(weights_of(apiserver)["west"] - 50) < params.rebalance
    assert len(apiserver.writes("PATCH")) == settled


async def test_a_human_edit_is_replaced_from_a_fresh_read_and_logged(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    sims["west"].kv = 0.6  # little room: any step, an emergency's too, is at most max_step
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 6)

        def edit(obj: dict[str, Any]) -> None:
            obj["spec"]["externalProviderRefs"][0]["weight"] = 70
            obj["spec"]["externalProviderRefs"][1]["weight"] = 30

        apiserver.advance(60)  # a minute later, someone edits the weights by hand
        apiserver.edit(CRD, "externalmodels", NS, "llama", "kubectl-edit", edit)
        with capture_logs() as logs:
            await controller.once()
    replaced = [e for e in logs if e["event"] == "replacing weights changed outside the controller"]
    assert replaced and replaced[0]["changed_by"] == "kubectl-edit"
    assert replaced[0]["found"] == "east=70 west=30"
    after = weights_of(apiserver)
    # one bounded step down from the human's value, not a jump back to what we had written
    assert 70 - 25 <= after["east"] < 70 - 3


async def test_a_tug_of_war_is_one_line_while_it_lasts_and_one_when_it_ends(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """GitOps self-healing the weights every tick made every write a 'replacing weights
    changed outside the controller' line: 19 in 20 ticks (found by an attack). A condition
    of the target now: one line when it starts, one when a write finds our own weights."""

    def revert(obj: dict[str, Any]) -> None:
        for ref in obj["spec"]["externalProviderRefs"]:
            ref["weight"] = 50

    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            for _ in range(10):
                apiserver.advance(1)  # a second after our write: managedFields keep seconds
                apiserver.edit(CRD, "externalmodels", NS, "llama", "argocd-controller", revert)
                await controller.once()
            sims["east"].kv = sims["west"].kv  # the fight ends; the next write finds ours
            await ticks(controller, 4)
    replaced = [e for e in logs if e["event"] == "replacing weights changed outside the controller"]
    ended = [
        e for e in logs if e.get("condition") == "replacing weights changed outside the controller"
    ]
    assert len(apiserver.writes("PATCH")) >= 10
    assert [e["changed_by"] for e in replaced] == ["argocd-controller"]
    assert len(ended) == 1 and ended[0]["occurrences"] >= 9


async def test_a_second_person_s_edit_during_a_tug_of_war_is_logged_too(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """A review: alice set 90/10, the controller replaced it; bob set 10/90 a tick later and
    was replaced without a line, alice's condition still open. A writer with other weights
    is a condition of its own; the one before it ends."""

    def setting(east: int) -> Any:
        def change(obj: dict[str, Any]) -> None:
            obj["spec"]["externalProviderRefs"][0]["weight"] = east
            obj["spec"]["externalProviderRefs"][1]["weight"] = 100 - east

        return change

    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 2)
        with capture_logs() as logs:
            for who, east in (("alice", 90), ("bob", 10)):
                apiserver.advance(1)  # a second after our write: managedFields keep seconds
                apiserver.edit(CRD, "externalmodels", NS, "llama", who, setting(east))
                await controller.once()
    replaced = [e for e in logs if e["event"] == "replacing weights changed outside the controller"]
    assert [(e["changed_by"], e["found"]) for e in replaced] == [
        ("alice", "east=90 west=10"),
        ("bob", "east=10 west=90"),
    ]
    assert [e["changed_by"] for e in logs if e["event"] == "condition ended"] == ["alice"]


async def test_reordered_refs_never_get_the_wrong_weights(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95

    def reorder(obj: dict[str, Any]) -> None:
        refs = obj["spec"]["externalProviderRefs"]
        refs.reverse()
        refs[0]["weight"], refs[1]["weight"] = 60, 40  # west=60, east=40 now

    # someone reorders the refs after we read the object and before our patch lands
    apiserver.before(
        "PATCH",
        "externalmodels",
        lambda: apiserver.edit(CRD, "externalmodels", NS, "llama", "someone", reorder),
    )
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        report = await controller.once()
    patches = apiserver.writes("PATCH")
    assert len(patches) == 2  # the first was refused (422) by its test op, the second landed
    final = weights_of(apiserver)
    assert final["west"] > 60 and final["east"] < 40  # moved from the reordered values, by name
    obj = apiserver.get(CRD, "externalmodels", NS, "llama")
    assert obj is not None
    assert [r["ref"]["name"] for r in obj["spec"]["externalProviderRefs"]] == ["west", "east"]
    view = report.targets["ExternalModel/maas-system/llama"].outcome
    assert view.write.value == "done" and dict(view.applied) == final


async def test_a_target_deleted_mid_tick_is_forgotten(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95

    def delete() -> None:
        del apiserver.objects[(CRD, "externalmodels", NS, "llama")]

    apiserver.before("PATCH", "externalmodels", delete)
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await controller.once()
        assert any(e["event"] == "target gone" for e in logs)
        assert "ExternalModel/maas-system/llama" not in controller.snapshot.report.targets
        await controller.once()  # and the next tick goes on without it


async def test_api_down_keeps_deciding_and_applies_the_latest_once_back(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 2)
        await apiserver.stop()
        sims["east"].kv = 0.95
        with capture_logs() as logs:
            await ticks(controller, 3)
        # one line when it starts, not one per tick; and one when it ends (below)
        assert [e["event"] for e in logs].count("cannot read targets") == 1
        view = controller.snapshot.report.targets["ExternalModel/maas-system/llama"].outcome
        assert view.desired["west"] > view.applied["west"] == 50
        api_errors = controller.registry.get_sample_value(
            "weight_controller_api_errors_total", {"reason": "unavailable"}
        )
        assert api_errors is not None and api_errors >= 3
        await apiserver.start()
        before = len(apiserver.writes("PATCH"))
        with capture_logs() as back:
            await controller.once()
        ended = {e["condition"]: e for e in back if e["event"] == "condition ended"}
        # the API was unreadable for three ticks, and the write failed on each of them
        assert set(ended) == {"cannot read targets", "write failed"}
        assert ended["cannot read targets"]["occurrences"] == 3
        assert len(apiserver.writes("PATCH")) == before + 1
        assert weights_of(apiserver)["west"] > 50


async def test_dry_run_writes_nothing_but_exports_what_it_would_apply(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    # and a route a live leader would be told by a Warning Event it will not write (an
    # attack saw a dry run post it: without election, or with, it counted as the leader)
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1", "controller": True}
    apiserver.put_object(GATEWAY, "httproutes", route([[("svc-east", 1)]], ownerReferences=[owner]))
    routes = [{"namespace": "apps", "name": "llama", "backends": {"svc-east": "east"}}]
    election = {"leader_election": {"enabled": True}, "kubernetes": {"httproutes": routes}}
    async with Controller(
        settings_for(sims, **election), serve=False, api=api, dry_run=True
    ) as controller:
        with capture_logs() as logs:
            await ticks(controller, 3)
        labels = {"target": "ExternalModel/maas-system/llama", "ref": "west", "cluster": "west"}
        desired = controller.registry.get_sample_value("weight_controller_desired_weight", labels)
        applied = controller.registry.get_sample_value("weight_controller_applied_weight", labels)
        dry = controller.registry.get_sample_value("weight_controller_dry_run")
    assert apiserver.writes() == []  # no PATCH, no Event, no Lease: GETs and LISTs only
    assert weights_of(apiserver) == {"east": 50, "west": 50}
    would = [e for e in logs if e["event"] == "would write"]
    assert len(would) >= 2  # a dry run moves as a live run would, one step per tick
    steps = [dict(p.split("=") for p in e["change"].split()) for e in would]
    assert steps[0]["west"].startswith("50->")
    for before, after in itertools.pairwise(steps):  # each step starts where the last one ended
        assert after["west"].split("->")[0] == before["west"].split("->")[1]
    final_west = int(steps[-1]["west"].split("->")[1])
    assert desired == applied == final_west and final_west > 60 and dry == 1


async def test_forbidden_names_the_missing_verb(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    apiserver.fail("PATCH", "externalmodels", 403)
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await controller.once()
    denied = [e for e in logs if e["event"] == "write refused"]
    assert (
        denied
        and denied[0]["reason"] == "forbidden"
        and "grant verb 'patch' on externalmodels.inference.opendatahub.io" in denied[0]["detail"]
    )


async def test_a_server_error_is_retried_next_tick(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    apiserver.fail("PATCH", "externalmodels", 500)
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await controller.once()
        assert weights_of(apiserver) == {"east": 50, "west": 50}
        assert any(e["event"] == "write failed" for e in logs)
        errors = controller.registry.get_sample_value(
            "weight_controller_api_errors_total", {"reason": "server_error"}
        )
        assert errors == 1
        await controller.once()
    assert weights_of(apiserver)["west"] > 50


async def test_unmapped_ref_keeps_its_weight_and_is_counted(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 40), ("west", 40), ("saas", 20)])
    sims["east"].kv = 0.95
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 4)
        unmapped = controller.registry.get_sample_value(
            "weight_controller_target_unmapped_refs",
            {"target": "ExternalModel/maas-system/llama"},
        )
    final = weights_of(apiserver)
    assert final["saas"] == 20 and final["east"] + final["west"] == 80
    assert unmapped == 1
    assert any(e["event"] == "ref unmapped" for e in logs)


async def test_providers_can_define_clusters_by_annotation(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    async with Fleet([SimCluster("remote", kv=0.9)]) as extra:
        apiserver.put_object(CRD, "externalproviders", provider("east"))
        apiserver.put_object(
            CRD,
            "externalproviders",
            provider("remote-llm", {VLLM_URLS_ANNOTATION: ",".join(extra["remote"].vllm_urls())}),
        )
        apiserver.put_object(
            CRD, "externalmodels", model("llama", [("east", 50), ("remote-llm", 50)])
        )
        loopback_ok = {"annotation_urls": {"allow_loopback": True}}  # the test's pods are local
        settings = settings_for(sims, kubernetes=loopback_ok)
        async with Controller(settings, serve=False, api=api) as controller:
            await ticks(controller, 4)
            assert f"{NS}/remote-llm" in controller.snapshot.report.clusters
    final = weights_of(apiserver)
    assert final["east"] > final["remote-llm"]


async def test_a_cluster_or_target_that_goes_takes_its_series_with_it(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """An attack: providers renamed every tick (51 clusters live) grew /metrics from 230 KB
    to 1.5 MB, and 300 models written then deleted left 1,800 series with no target behind
    them. A cluster no longer referenced, and a target gone, drop their labelled series."""
    async with Fleet([SimCluster("remote", kv=0.9)]) as extra:
        urls = {VLLM_URLS_ANNOTATION: ",".join(extra["remote"].vllm_urls())}
        apiserver.put_object(CRD, "externalproviders", provider("east"))
        apiserver.put_object(CRD, "externalproviders", provider("remote-llm", urls))
        apiserver.put_object(
            CRD, "externalmodels", model("llama", [("east", 50), ("remote-llm", 50)])
        )
        settings = settings_for(sims, kubernetes={"annotation_urls": {"allow_loopback": True}})
        async with Controller(settings, serve=False, api=api) as controller:
            await ticks(controller, 2)
            text = generate_latest(controller.registry).decode()
            assert f'cluster="{NS}/remote-llm"' in text and 'target="ExternalModel/' in text
            del apiserver.objects[(CRD, "externalmodels", NS, "llama")]
            del apiserver.objects[(CRD, "externalproviders", NS, "remote-llm")]
            await ticks(controller, 2)
            text = generate_latest(controller.registry).decode()
    assert f'cluster="{NS}/remote-llm"' not in text
    assert 'target="ExternalModel/maas-system/llama"' not in text
    assert 'cluster="east"' in text  # a configured cluster keeps its own


async def test_httproute_backend_weights(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    route = {
        "metadata": {"name": "llama", "namespace": "apps"},
        "spec": {
            "rules": [
                {
                    "backendRefs": [
                        {"name": "svc-east", "port": 8000, "weight": 500},
                        {"name": "svc-west", "port": 8000, "weight": 500},
                    ]
                }
            ]
        },
    }
    apiserver.put_object("gateway.networking.k8s.io/v1", "httproutes", route)
    sims["west"].kv = 0.95
    httproutes = [
        {"namespace": "apps", "name": "llama", "backends": {"svc-east": "east", "svc-west": "west"}}
    ]
    async with Controller(
        settings_for(sims, kubernetes={"httproutes": httproutes}), serve=False, api=api
    ) as controller:
        await ticks(controller, 4)
    obj = apiserver.get("gateway.networking.k8s.io/v1", "httproutes", "apps", "llama")
    assert obj is not None
    backends = {b["name"]: b["weight"] for b in obj["spec"]["rules"][0]["backendRefs"]}
    # HTTPRoute weights are relative within the rule: it keeps the total it had
    assert backends["svc-east"] > backends["svc-west"] and sum(backends.values()) == 1000


# ---- leader election -------------------------------------------------------------------------

LEASE = {"enabled": True, "lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.2}


def elector_settings(identity: str) -> Any:
    from controller.settings import LeaderSettings

    return LeaderSettings(identity=identity, **LEASE)


def elector(api: client.ApiClient, settings: Any) -> Any:
    """An elector on the loop's clock: under looptime, the loop's virtual time (the API
    double's answers take none of it), so its waits and deadlines are exact, never the CPU's."""
    from controller.kube.leader import LeaderElector

    return LeaderElector(api, settings, monotonic=asyncio.get_running_loop().time)


@contextlib.asynccontextmanager
async def leading(api: client.ApiClient, identity: str = "a") -> AsyncIterator[Any]:
    """An elector that has taken the Lease; stopped (and the Lease released) on exit."""
    leader = elector(api, elector_settings(identity))
    stop = asyncio.Event()
    task = asyncio.create_task(leader.run(stop))
    await wait_until(leader.is_leader, 3)
    try:
        yield leader
    finally:
        stop.set()
        await task


@pytest.mark.parametrize(
    "held", [None, "replica-0", "by-hand"], ids=["lease-free", "lease-held", "same-identity"]
)
async def test_once_apply_with_election_writes_only_holding_the_lease(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet, held: str | None
) -> None:
    """A review: with election on in the file (as the manifests' config has it), ``once
    --apply`` never started the elector, so every write was ``follower``'s and nothing said
    why. It now takes the Lease for its tick if no replica renewed it lately (and gives it
    back), or says who holds it and writes nothing. Run by ``kubectl exec`` in the leading
    pod it shares that replica's identity: it neither writes beside it nor releases its
    Lease (a review found two leaders after)."""
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.97
    election = {"enabled": True, "identity": "by-hand", "lease_duration": 15}
    settings = settings_for(sims, leader_election=election)
    async with contextlib.AsyncExitStack() as stack:
        if held:
            await stack.enter_async_context(leading(api, held))
        with capture_logs() as logs:
            async with Controller(settings, serve=False, dry_run=False, api=api) as c:
                report = await c.once()
        lease = apiserver.get(
            "coordination.k8s.io/v1", "leases", "maas-system", "weight-controller"
        )
    write = report.targets["ExternalModel/maas-system/llama"].outcome.write.value
    said = [e for e in logs if e["event"] == "not the leader: nothing will be written"]
    if held:
        assert (write, weights_of(apiserver)) == ("follower", {"east": 50, "west": 50})
        assert [e["holder"] for e in said] == [held]
        assert lease is not None and lease["spec"]["holderIdentity"] == held  # still theirs
    else:
        assert write == "done" and weights_of(apiserver)["west"] > 50 and not said
        assert lease is not None and not lease["spec"].get("holderIdentity")  # given back


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)  # a Lease is no CRD's
@pytest.mark.parametrize(
    "body",
    [
        "<html><body>503 upstream restarting</body></html>",
        {},
        {
            "kind": "Lease",
            "metadata": {"name": "weight-controller", "resourceVersion": "9"},
            "spec": {"holderIdentity": "solo", "leaseDurationSeconds": "fifteen"},
        },
    ],
    ids=["a-proxy-page", "an-empty-object", "a-field-no-client-reads"],
)
@pytest.mark.looptime
async def test_a_lease_read_that_is_no_lease_is_a_failed_attempt_and_retried(
    apiserver: FakeAPIServer, api: client.ApiClient, body: object
) -> None:
    """Found by an attack: one 200 to the Lease's GET that was no Lease (a proxy's page while
    the API server restarts, ``{}``) or that the client could not decode ended the elector's
    task for good: it never renewed again, nothing was written, and its gauge and
    /debug/state kept saying it led until SIGTERM raised the AttributeError. Now it is a
    failed attempt, said, and the next one renews within the fence."""
    leader = elector(api, elector_settings("solo"))
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(leader.run(stop))
        await wait_until(leader.is_leader, 3)
        apiserver.fail("GET", "leases", 200, times=1, body=body)
        for _ in range(60):  # 6 s: three leases' worth of renewals, always leading
            await asyncio.sleep(0.1)
            assert leader.is_leader() and not task.done()
        stop.set()
        await task
    failed = [e for e in logs if e["event"] == "lease attempt failed"]
    assert len(failed) == 1, failed
    if isinstance(body, str | dict) and "spec" not in body:
        assert (
            "get lease maas-system/weight-controller: the answer is no Lease" in failed[0]["error"]
        )
    else:
        assert failed[0]["error"].startswith("ValueError")  # no API call should raise it
    assert [e for e in logs if e["event"] == "condition ended"]
    lease = apiserver.get("coordination.k8s.io/v1", "leases", "maas-system", "weight-controller")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # released at the end


@pytest.mark.looptime
async def test_two_electors_race_and_exactly_one_leads(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    a = elector(api, elector_settings("a"))
    b = elector(api, elector_settings("b"))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(e.run(stop)) for e in (a, b)]
    await wait_until(lambda: a.is_leader() or b.is_leader(), 3)
    for _ in range(20):  # never both, for a few renew cycles
        assert not (a.is_leader() and b.is_leader())
        await asyncio.sleep(0.1)
    assert a.is_leader() != b.is_leader()
    stop.set()
    await asyncio.gather(*tasks)


@pytest.mark.looptime
async def test_two_processes_given_one_identity_never_both_lead(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Found by an attack: two replicas reading one config whose leader_election.identity is
    set both led in 29 of 30 samples, each taking the other's renewal for its own. A renewal
    under our name that we did not write is another process's: the last to write leads, the
    other follows and says why; when that one stops, the other takes over."""
    twins = [elector(api, elector_settings("weight-controller")) for _ in range(2)]
    stops = [asyncio.Event(), asyncio.Event()]
    with capture_logs() as logs:
        tasks = [asyncio.create_task(e.run(stop)) for e, stop in zip(twins, stops, strict=True)]
        await wait_until(lambda: any(e.is_leader() for e in twins), 3)
        for _ in range(30):  # a few renew cycles: never both
            assert not all(e.is_leader() for e in twins)
            await asyncio.sleep(0.1)
        leader = next(i for i, e in enumerate(twins) if e.is_leader())
        tasks[leader].cancel()  # the leading twin crashes: the other takes over
        await wait_until(twins[1 - leader].is_leader, 5)
    stops[1 - leader].set()
    await tasks[1 - leader]
    said = [e for e in logs if e["event"] == "lease held under this identity by another process"]
    assert said and said[0]["identity"] == "weight-controller"


@pytest.mark.looptime
async def test_a_renewal_whose_answer_is_lost_is_still_the_leader_s_own(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """A review: the elector knew its renewals by the answers it got, so one the server
    applied but answered too late (a slow reply, a reset) read on the next attempt as
    another process's under its name, and the only replica deposed itself for a lease."""
    leader = elector(api, elector_settings("solo"))
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(leader.run(stop))
        await wait_until(leader.is_leader, 3)
        apiserver.answer_late("PUT", "leases", 5.0)  # applied, answered past its fence
        out = 0
        for _ in range(40):  # 4 s: more than two leases
            out += not leader.is_leader()
            await asyncio.sleep(0.1)
        stop.set()
        await task
    # the fence ran out while it waited; its next read finds its own renewal and it leads
    # again a retry later, where the renewal read as a twin's kept it out for a lease
    assert out <= 4, out
    assert not any(e["event"] == "lease held under this identity by another process" for e in logs)


@pytest.mark.looptime
async def test_lease_expiry_takeover_and_release(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    a = elector(api, elector_settings("a"))
    b = elector(api, elector_settings("b"))
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    task_a = asyncio.create_task(a.run(stop_a))
    await wait_until(a.is_leader, 3)
    task_b = asyncio.create_task(b.run(stop_b))
    await asyncio.sleep(0.5)
    assert not b.is_leader()
    task_a.cancel()  # a crash: no release; b must wait out the lease
    took = await wait_until(b.is_leader, 5)
    assert not a.is_leader()  # a's fence expired before b could take over
    # on the loop's virtual clock: never before a's last renewal could have run out
    duration, retry = LEASE["lease_duration"], LEASE["retry_period"]
    assert duration - retry <= took <= duration + 2 * retry + 0.1, took
    lease = await client.CoordinationV1Api(api).read_namespaced_lease("weight-controller", NS)
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
    # a graceful stop releases the lease: a new candidate gets it at once
    c = elector(api, elector_settings("c"))
    stop_c = asyncio.Event()
    task_c = asyncio.create_task(c.run(stop_c))
    stop_b.set()
    await task_b
    took_c = await wait_until(c.is_leader, 3)
    assert took_c < LEASE["lease_duration"]
    stop_c.set()
    await task_c


@pytest.mark.looptime
async def test_a_leader_that_reads_another_holder_stops_leading_at_once(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """``kubectl delete lease`` forces a failover: another replica creates it anew. The old
    leader kept leading until its own fence ran out (renew_deadline), two replicas writing
    at once for seconds (found by an attack); as client-go's ``IsLeader``, it stops the moment
    it reads another holder (a failed write of the Lease deposes no one: the next read tells)."""
    a = elector(api, elector_settings("a"))
    b = elector(api, elector_settings("b"))
    await a._attempt()
    assert a.is_leader()
    apiserver.delete("coordination.k8s.io/v1", "leases", NS, "weight-controller")
    await b._attempt()  # creates it: b holds it
    assert b.is_leader() and a.is_leader()  # a has not looked yet
    await a._attempt()
    assert not a.is_leader() and b.is_leader()
    # the race on a write: a reads the Lease as its own, b takes it before a's update lands
    a._valid_until = b._valid_until = -math.inf
    apiserver.delete("coordination.k8s.io/v1", "leases", NS, "weight-controller")
    await a._attempt()
    assert a.is_leader()

    def b_takes_it() -> None:
        apiserver.edit("coordination.k8s.io/v1", "leases", NS, "weight-controller", "b", take)

    def take(lease: dict[str, Any]) -> None:
        lease["spec"]["holderIdentity"] = "b"

    apiserver.before("PUT", "leases", b_takes_it)
    await a._attempt()  # its renewal meets b's write: 409, and who wrote it is not known yet
    assert a.is_leader()
    await a._attempt()  # the next read shows b
    assert not a.is_leader()
    # someone labels the Lease between a leader's read and its renewal: a 409, no depose
    a._valid_until = b._valid_until = -math.inf
    apiserver.delete("coordination.k8s.io/v1", "leases", NS, "weight-controller")
    await a._attempt()

    def labelled(lease: dict[str, Any]) -> None:
        lease["metadata"].setdefault("labels", {})["audit"] = "seen"

    apiserver.before(
        "PUT",
        "leases",
        lambda: apiserver.edit(
            "coordination.k8s.io/v1", "leases", NS, "weight-controller", "x", labelled
        ),
    )
    await a._attempt()
    assert a.is_leader()
    await a._attempt()  # read as its own: renewed
    assert a.is_leader()


@pytest.mark.looptime
async def test_leader_stops_writing_when_it_cannot_renew(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    async with leading(api) as a:
        await apiserver.stop()  # the API server goes away: renewals fail
        took = await wait_until(lambda: not a.is_leader(), 3)
        # its fence is renew_deadline from its last renewal, at most a retry period ago
        assert took <= LEASE["renew_deadline"] + 0.05, took
        await apiserver.start()
        await wait_until(a.is_leader, 3)


async def test_missing_kubeconfig_is_a_config_error_not_a_traceback(
    daemon: StartDaemon, tmp_path: Path
) -> None:
    config = (
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:9/metrics']}]\n"
        "kubernetes: {enabled: true}\nserver: {bind: '127.0.0.1:0'}\n"
    )
    child = await daemon(config, "run", "--kubeconfig", str(tmp_path / "absent"))
    assert await child.finish() == 2
    stderr = child.err.decode()
    assert "config error: kubernetes: cannot load credentials" in stderr
    assert "Traceback" not in stderr


# ---- the upstream schemas --------------------------------------------------------------------


async def test_a_dead_cluster_goes_to_the_schema_minimum_never_below(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    from tests.support import crds

    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].fault = Fault.HTTP_500
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 5)
    lowest = crds.weight_minimum(apiserver.crd_version)
    assert weights_of(apiserver) == {"east": lowest, "west": 100 - lowest}
    assert apiserver.rejected == []  # no write broke the schema, so none was retried
    assert len(apiserver.writes("PATCH")) == 1  # one write moved it; then nothing to do
    known = [e for e in logs if e["event"] == "weight minimum"]
    assert [(e["minimum"], e["source"]) for e in known] == [(lowest, "crd")]


# Only MaaS v0.2.0's CRD rejects weight 0 (``minimum: 1``): the double runs that install alone.
@pytest.mark.parametrize("apiserver", ["v0.2.0"], indirect=True)
async def test_a_schema_rejection_is_told_from_a_conflict_and_not_retried(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    assert apiserver.crd_version == "v0.2.0"
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].fault = Fault.HTTP_500
    forced = settings_for(sims, kubernetes={"min_weight": 0})  # wrong for this install
    async with Controller(forced, serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 4)
        rejected = controller.registry.get_sample_value(
            "weight_controller_schema_rejections_total",
            {
                "target": "ExternalModel/maas-system/llama",
                "field": "spec.externalProviderRefs[0].weight",
            },
        )
        view = controller.snapshot.report.targets["ExternalModel/maas-system/llama"].outcome
    assert len(apiserver.writes("PATCH")) == 1  # refused once, never sent again
    assert rejected == 1
    refused = [e for e in logs if e["event"] == "write refused"]
    assert len(refused) == 1 and refused[0]["reason"] == "schema"
    assert "spec.externalProviderRefs[0].weight" in refused[0]["detail"]
    assert "Invalid value: 0" in refused[0]["detail"]
    assert not any(e["event"] == "write conflict" for e in logs)
    assert view.write.value == "refused" and view.applied == {"east": 50, "west": 50}


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)
async def test_a_crd_whose_minimum_rose_while_running_is_read_again_on_a_refusal(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """Found by an attack: the CRD's minimum was read once. MaaS rolled back (v0.2.1 to
    v0.2.0, minimum 0 to 1) while the controller ran: a dead cluster's 0 was refused by the
    schema, never sent again, and the cluster kept half the traffic until a restart."""
    seed(apiserver, [("east", 50), ("west", 50)])
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 2)
        apiserver.crd_version = "v0.2.0"  # the rollback: weights of 0 are refused now
        sims["east"].fault = Fault.HTTP_500
        with capture_logs() as logs:
            await ticks(controller, 4)
    assert weights_of(apiserver) == {"east": 1, "west": 99}
    known = [(e["minimum"], e["source"]) for e in logs if e["event"] == "weight minimum"]
    assert known == [(1, "crd")]


async def test_an_unreadable_crd_means_a_minimum_of_one(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    apiserver.crd_readable = False  # no grant on customresourcedefinitions
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].fault = Fault.HTTP_500
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 3)
    assert weights_of(apiserver) == {"east": 1, "west": 99}
    known = [e for e in logs if e["event"] == "weight minimum"]
    assert [(e["minimum"], e["source"]) for e in known] == [(1, "assumed")]


async def test_status_updates_by_the_payload_processor_do_not_hide_who_edited(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    apiserver.status_writer = "payload-processor"
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 3)
        obj = apiserver.get(CRD, "externalmodels", NS, "llama")
        assert obj is not None and obj["status"]["phase"] == "Ready"  # it did write status

        def edit(obj: dict[str, Any]) -> None:
            obj["spec"]["externalProviderRefs"][0]["weight"] = 70
            obj["spec"]["externalProviderRefs"][1]["weight"] = 30

        apiserver.advance(60)
        apiserver.edit(CRD, "externalmodels", NS, "llama", "kubectl-edit", edit)
        apiserver.advance(1)
        apiserver.payload_processor_status(
            ("inference.opendatahub.io/v1alpha1", "externalmodels", NS, "llama")
        )
        with capture_logs() as logs:
            await controller.once()
    replaced = [e for e in logs if e["event"] == "replacing weights changed outside the controller"]
    assert replaced and replaced[0]["changed_by"] == "kubectl-edit"


def test_last_writer_is_unknown_on_a_tie_and_never_ourselves() -> None:
    from controller.kube.objects import last_writer

    t = "2026-12-01T08:00:00Z"
    assert last_writer([("a", t), ("b", "2026-12-01T08:00:01Z")], "us") == "b"
    assert last_writer([("a", t), ("b", t)], "us") == "unknown"
    assert last_writer([("us", "2026-12-01T09:00:00Z"), ("a", t)], "us") == "a"
    assert last_writer([], "us") == "unknown"


def test_every_sample_and_fixture_object_passes_the_upstream_schemas() -> None:
    from tests.support import crds

    samples = Path(__file__).resolve().parents[2] / "manifests" / "samples"
    objects_ = [
        doc
        for path in sorted(samples.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") in ("ExternalModel", "ExternalProvider")
    ]
    assert {o["kind"] for o in objects_} == {"ExternalModel", "ExternalProvider"}
    objects_ += [provider("east"), model("llama", [("east", 50), ("west", 50)])]
    for version in crds.VERSIONS:
        for obj in objects_:
            kind = obj.get("kind") or (
                "ExternalProvider" if "provider" in obj["spec"] else "ExternalModel"
            )
            plural = kind.lower() + "s"
            _, causes = crds.admit(version, plural, obj)
            assert causes == [], (version, obj["metadata"]["name"], causes)


# ---- leader election, the client-go way ------------------------------------------------------


def test_lease_times_always_carry_six_fractional_digits() -> None:
    from datetime import UTC, datetime

    from controller.kube.leader import micro_time

    on_the_second = datetime(2026, 12, 1, 8, 0, 0, 0, tzinfo=UTC)
    assert micro_time(on_the_second) == "2026-12-01T08:00:00.000000Z"
    assert micro_time(on_the_second.replace(microsecond=42)) == "2026-12-01T08:00:00.000042Z"


async def test_the_fence_refuses_a_write_that_could_outlive_it() -> None:
    from controller.kube.leader import LeaderElector

    now = [100.0]
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as unused:
        elector = LeaderElector(unused, elector_settings("a"), monotonic=lambda: now[0])
        elector._valid_until = 101.0  # renewed; 1 s of the fence left
        assert elector.is_leader() and elector.is_leader(0.5)
        assert not elector.is_leader(1.0)  # a write of up to api_timeout=1 s might land after
        now[0] = 101.0
        assert not elector.is_leader()


@pytest.mark.looptime
async def test_a_rolling_update_that_shortens_the_lease_never_gives_two_writers(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    from controller.settings import LeaderSettings

    # the old replica promises 3 s; the new one is configured with 1.5 s
    old = elector(
        api, LeaderSettings(identity="old", lease_duration=3, renew_deadline=2, retry_period=0.2)
    )
    new = elector(api, elector_settings("new"))
    stop_old, stop_new = asyncio.Event(), asyncio.Event()
    task_old = asyncio.create_task(old.run(stop_old))
    await wait_until(old.is_leader, 3)
    task_new = asyncio.create_task(new.run(stop_new))
    await asyncio.sleep(0.5)
    task_old.cancel()  # killed mid-rollout: no release
    began = asyncio.get_running_loop().time()
    while not new.is_leader():  # bounded by wait_until below
        assert not (old.is_leader() and new.is_leader())
        await asyncio.sleep(0.05)
        assert asyncio.get_running_loop().time() - began < 6
    took = asyncio.get_running_loop().time() - began
    # the record said 3 s: waiting only our own 1.5 s would have meant two writers
    assert took >= 3 - 0.5 - 0.1, took
    stop_new.set()
    await task_new


@pytest.mark.looptime
async def test_taking_a_released_lease_counts_a_transition(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    counts = []
    for identity in ("a", "b", "c"):
        leader = elector(api, elector_settings(identity))
        stop = asyncio.Event()
        task = asyncio.create_task(leader.run(stop))
        await wait_until(leader.is_leader, 3)
        lease = await client.CoordinationV1Api(api).read_namespaced_lease("weight-controller", NS)
        counts.append(lease.spec.lease_transitions)
        stop.set()  # graceful: releases the Lease
        await task
    assert counts == [0, 1, 2]


@pytest.mark.looptime
async def test_a_renewal_is_retried_until_the_renew_deadline(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    async with leading(api) as a:
        apiserver.fail("PUT", "leases", 500, times=2)  # two renewals fail, well inside 1 s
        with capture_logs() as logs:
            for _ in range(12):  # 1.2 s: the failures, then renewals that land again
                assert a.is_leader(), "a leader that renews within renew_deadline stays leader"
                await asyncio.sleep(0.1)
    assert [e["event"] for e in logs].count("lease attempt failed") == 1  # one condition
    assert not any(e["event"] == "leadership lost" for e in logs)


@pytest.mark.looptime
async def test_a_slow_renewal_is_waited_for_within_the_renew_deadline(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    async with leading(api) as a:
        # every renewal takes 1.5 retry periods, but well under the renew deadline: cutting
        # each attempt at retry_period would never renew and lose the lease
        apiserver.slow("PUT", "leases", 1.5 * LEASE["retry_period"], times=6)
        with capture_logs() as logs:
            for _ in range(20):  # 2 s: twice the renew deadline
                assert a.is_leader()
                await asyncio.sleep(0.1)
    assert not any(e["event"] in ("leadership lost", "lease attempt failed") for e in logs)


# ---- namespaces ------------------------------------------------------------------------------


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    return obj


def one_model_in_each_of_two_namespaces(apiserver: FakeAPIServer) -> None:
    """ExternalModel ``m`` over providers east and west (50/50) in ``llm`` and ``team-b``."""
    for namespace in ("llm", "team-b"):
        for name in ("east", "west"):
            apiserver.put_object(CRD, "externalproviders", in_namespace(provider(name), namespace))
        refs = [("east", 50), ("west", 50)]
        apiserver.put_object(CRD, "externalmodels", in_namespace(model("m", refs), namespace))


async def test_models_in_every_namespace_are_found_with_no_namespace_configured(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    one_model_in_each_of_two_namespaces(apiserver)
    sims["east"].kv = 0.95
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await ticks(controller, 2)
        found = set(controller.snapshot.report.targets)
    assert found == {"ExternalModel/llm/m", "ExternalModel/team-b/m"}
    lists = [
        path
        for method, path, _, _ in apiserver.requests
        if method == "GET" and "/namespaces/" not in path
    ]
    assert any(p.endswith("/externalmodels") for p in lists)  # one LIST across the cluster
    events = apiserver.writes("POST", "events")
    assert {e[1].split("/")[4] for e in events} == {"llm", "team-b"}  # Events beside the model


async def test_an_explicit_namespace_list_reads_only_those(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    one_model_in_each_of_two_namespaces(apiserver)
    settings = settings_for(sims, kubernetes={"namespaces": ["llm"]})
    async with Controller(settings, serve=False, api=api) as controller:
        await ticks(controller, 1)
        assert set(controller.snapshot.report.targets) == {"ExternalModel/llm/m"}
    assert all("/namespaces/team-b/" not in path for _, path, _, _ in apiserver.requests)


# ---- HTTPRoute rules -------------------------------------------------------------------------


def rules_of(apiserver: FakeAPIServer) -> list[dict[str, int]]:
    obj = apiserver.get(GATEWAY, "httproutes", "apps", "llama")
    assert obj is not None
    return [{b["name"]: b["weight"] for b in r["backendRefs"]} for r in obj["spec"]["rules"]]


def route_settings(sims: Fleet) -> Settings:
    backends = {"svc-east": "east", "svc-west": "west", "east-only": "east", "west-only": "west"}
    httproutes = [{"namespace": "apps", "name": "llama", "backends": backends}]
    return settings_for(sims, kubernetes={"httproutes": httproutes})


async def test_each_rule_is_weighed_on_its_own_and_keeps_its_total(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    rules = [
        [("svc-east", 500), ("svc-west", 500), ("saas", 200)],  # unmapped backend, large weight
        [("svc-east", 1), ("svc-west", 1)],  # the defaults: all ours
        [("east-only", 1)],  # one backend: nothing to split
        [("west-only", 3)],
    ]
    apiserver.put_object(GATEWAY, "httproutes", route(rules))
    sims["west"].kv = 0.95
    sims["east"].fault = Fault.NONE
    async with Controller(route_settings(sims), serve=False, api=api) as controller:
        await ticks(controller, 4)
        keys = set(controller.snapshot.report.targets)
    first, second, third, fourth = rules_of(apiserver)
    assert keys == {"HTTPRoute/apps/llama/rule-0", "HTTPRoute/apps/llama/rule-1"}
    assert first["saas"] == 200 and first["svc-east"] + first["svc-west"] == 1000
    assert first["svc-east"] > first["svc-west"]  # the unmapped share (200/1200) is kept
    assert sum(second.values()) == 100 and second["svc-east"] > second["svc-west"] > 0
    assert third == {"east-only": 1} and fourth == {"west-only": 3}  # single backends untouched


async def test_a_rule_whose_backends_are_ours_never_ends_all_zero(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    apiserver.put_object(GATEWAY, "httproutes", route([[("svc-east", 500), ("svc-west", 500)]]))
    sims["east"].fault = Fault.HTTP_500
    sims["west"].fault = Fault.HTTP_500
    async with Controller(route_settings(sims), serve=False, api=api) as controller:
        await ticks(controller, 4)
    assert rules_of(apiserver) == [{"svc-east": 500, "svc-west": 500}]  # fail static


async def test_a_rule_past_the_schema_s_largest_weight_still_sheds_a_dead_backend(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """Two backends of 600,000 each: kept whole, the rule's total asked 1,200,000 of the
    survivor, which Gateway API's schema refuses (a backend weighs at most 1,000,000), and the
    dead backend kept half the traffic (found by an attack). Now the rule shares 1,000,000."""
    apiserver.put_object(
        GATEWAY, "httproutes", route([[("svc-east", 600000), ("svc-west", 600000)]])
    )
    async with Controller(route_settings(sims), serve=False, api=api) as controller:
        await ticks(controller, 2)
        sims["west"].fault = Fault.HTTP_500
        await ticks(controller, 3)
    (held,) = rules_of(apiserver)
    assert held["svc-west"] == 0 and 0 < held["svc-east"] <= weights.MAX_ROUTE_WEIGHT
    assert apiserver.rejected == []


async def test_a_route_owned_by_another_controller_is_refused(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    owner = {
        "apiVersion": "inference.opendatahub.io/v1alpha1",
        "kind": "ExternalModel",
        "name": "granite",
        "uid": "1234",
        "controller": True,
    }
    owned = route([[("svc-east", 50), ("svc-west", 50)]], ownerReferences=[owner])
    apiserver.put_object(GATEWAY, "httproutes", owned)
    sims["west"].kv = 0.95
    async with Controller(route_settings(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 3)
        refused = dict(controller.snapshot.report.refused)
    assert apiserver.writes("PATCH") == []
    assert rules_of(apiserver) == [{"svc-east": 50, "svc-west": 50}]
    assert refused == {
        "HTTPRoute/apps/llama": "owned by ExternalModel/granite, which rewrites its spec"
    }
    lines = [e for e in logs if e["event"] == "route refused: owned by another controller"]
    assert len(lines) == 1 and lines[0]["owner"] == "ExternalModel/granite"


# ---- where annotation URLs may point ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local address 169.254.169.254"),
        ("http://[fe80::1]/metrics", "link-local address fe80::1"),
        ("http://127.0.0.1:8000/metrics", "loopback address 127.0.0.1"),
        ("http://[::1]:8000/metrics", "loopback address ::1"),
        ("http://[::ffff:127.0.0.1]/metrics", "loopback address 127.0.0.1"),
        ("http://localhost:8000/metrics", "loopback (localhost)"),
        ("https://kubernetes.default.svc/metrics", "it is the Kubernetes API server"),
        ("https://10.96.0.1:443/metrics", "it is the Kubernetes API server"),
        ("http://[::ffff:10.96.0.1]:443/metrics", "it is the Kubernetes API server"),  # review
        ("http://0.0.0.0/metrics", "address 0.0.0.0 is not a host"),
        (
            "http://metrics.example.com/metrics",
            "host 'metrics.example.com' is not on the allow-list",
        ),
        ("http://8.8.8.8/metrics", "address 8.8.8.8 is not on the allow-list"),
        # metadata services inside the default ranges (a review)
        ("http://100.100.100.200/latest/meta-data/", "address 100.100.100.200, a cloud's"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "address fd00:ec2::254, a cloud's"),
        ("http://u:p@vllm.llm.svc/metrics", "credentials in the URL"),
        ("file:///etc/passwd", "scheme 'file' is not http or https"),
        ("http://vllm-0.vllm.llm.svc.cluster.local:8000/metrics", None),
        ("http://llama-epp.llm.svc:9090/metrics", None),
        ("http://10.128.2.7:8000/metrics", None),
        ("http://[fd00::7]:8000/metrics", None),
    ],
)
def test_annotation_urls_are_held_to_the_allow_list(url: str, why: str | None) -> None:
    from controller import addresses
    from controller.settings import AnnotationURLSettings

    hosts = addresses.api_server_hosts(["10.96.0.1"])
    found = addresses.refusal(url, AnnotationURLSettings(), hosts)
    assert (found is None) == (why is None), found
    if why is not None:
        assert found is not None and found.startswith(why)


def test_a_tenant_name_resolving_to_the_api_server_is_refused_in_either_address_form() -> None:
    """A review: the client's own address is kept as ``fd00::1:6443`` (no brackets) and the
    resolved check looked for ``[fd00::1]:6443``: a tenant's name resolving there passed."""
    from controller import addresses
    from controller.settings import AnnotationURLSettings

    for api, address in (("fd00::1:6443", "fd00::1"), ("10.0.0.9:6443", "::ffff:10.0.0.9")):
        tenants = addresses.TenantAddresses(AnnotationURLSettings(), frozenset({api}))
        why = tenants.refusal("epp.team-b.svc", address, 6443)
        assert why is not None and why.startswith("it resolves to the Kubernetes API server")
        assert tenants.refusal("epp.team-b.svc", address, 8000) is None  # another port


async def test_a_hostile_annotation_is_refused_and_never_fetched(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet, serve: Any
) -> None:
    from aiohttp import web

    hits: list[str] = []

    async def bounce(request: web.Request) -> web.Response:
        hits.append(request.path)
        raise web.HTTPFound(f"{apiserver.url}/api/v1/namespaces/kube-system/secrets")

    bouncer = await serve({"/metrics": bounce})
    hostile = {
        "metadata-ip": "http://169.254.169.254/latest/meta-data/",
        "api-server": f"{apiserver.url}/api/v1/namespaces/kube-system/secrets",
        "redirector": bouncer.url("/metrics"),
    }
    for name, url in hostile.items():
        apiserver.put_object(CRD, "externalproviders", provider(name, {VLLM_URLS_ANNOTATION: url}))
    apiserver.put_object(CRD, "externalproviders", provider("east"))
    refs = [("east", 40), ("metadata-ip", 20), ("api-server", 20), ("redirector", 20)]
    apiserver.put_object(CRD, "externalmodels", model("llama", refs))
    # loopback allowed (the test's servers are local): the API server is refused all the same
    settings = settings_for(sims, kubernetes={"annotation_urls": {"allow_loopback": True}})
    async with Controller(settings, serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 3)
        redirector = controller.snapshot.report.clusters[f"{NS}/redirector"]
    problems = [e["problem"] for e in logs if e["event"] == "ignoring provider annotations"]
    assert any("metadata-ip" in p and "link-local address 169.254.169.254" in p for p in problems)
    assert any("api-server" in p and "it is the Kubernetes API server" in p for p in problems)
    assert all("/secrets" not in path for _, path, _, _ in apiserver.requests)  # never fetched
    # the redirector is allowed as an address, but its redirect is an error, not followed
    assert redirector.health is not None and not redirector.health.healthy
    assert redirector.health.reason is not None and redirector.health.reason.value == "redirect"
    assert hits  # it was asked once per tick, and nothing beyond it was


# ---- during an incident: pause, pin, freeze --------------------------------------------------


def annotate(apiserver: FakeAPIServer, key: str, value: str | None) -> None:
    def change(obj: dict[str, Any]) -> None:
        notes = obj["metadata"].setdefault("annotations", {})
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value

    apiserver.edit(CRD, "externalmodels", NS, "llama", "oncall", change)


async def test_a_new_leader_waits_out_the_last_leader_s_step(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """The wait after a step lived in one process's memory: a replica taking over (a
    failover, every rollout) or a restarted one stepped again at once on top of the step just
    written, 50 → 25 → 2 in two ticks (found by an attack). The object's own record of the
    write says when it was made; the newcomer follows that write as its own: it waits until
    the step could have acted (6 intervals before any delay was measured), not ``settle``
    alone, which still let steps stack 20-60 s early at the defaults (a review)."""
    sims = [SimCluster("east", kv=0.95, noise=0.0), SimCluster("west", kv=0.2, noise=0.0)]
    async with Fleet(sims) as fleet:
        seed(apiserver, [("east", 50), ("west", 50)])
        config = settings_for(fleet, weights={"settle": 2})  # two intervals of 1 s
        async with Controller(config, serve=False, api=api) as first:
            await ticks(first, 3)
            stepped = weights_of(apiserver)
        assert stepped["east"] < 50

        def later(seconds: int) -> Controller:
            """A replica taking over ``seconds`` after the write (its record is stamped with
            the wall clock)."""
            return Controller(config, serve=False, api=api, clock=lambda: time.time() + seconds)

        for newcomer in (later(0), later(3)):  # within the wait (6 s), past settle (2 s)
            async with newcomer:
                await ticks(newcomer, 2)
                view = newcomer.snapshot.report.targets["ExternalModel/maas-system/llama"]
                assert weights_of(apiserver) == stepped
                assert view.outcome.decision.mode.value == "hold"
        async with later(9) as newcomer:  # past it: the law goes on
            await ticks(newcomer, 2)
    assert weights_of(apiserver)["east"] < stepped["east"]


async def test_a_write_that_lands_after_its_answer_timed_out_still_settles(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """A patch the API server applied but answered after ``api_timeout`` counted as failed,
    and the next tick stepped again on top of it (found by an attack)."""
    sims = [SimCluster("east", kv=0.95, noise=0.0), SimCluster("west", kv=0.2, noise=0.0)]
    async with Fleet(sims) as fleet:
        seed(apiserver, [("east", 50), ("west", 50)])
        config = settings_for(fleet, weights={"settle": 60})
        async with Controller(config, serve=False, api=api) as controller:
            apiserver.answer_late("PATCH", "externalmodels", config.kubernetes.api_timeout + 0.5)
            first = await controller.once()
            landed = weights_of(apiserver)
            await ticks(controller, 2)
    outcome = first.targets["ExternalModel/maas-system/llama"].outcome
    assert outcome.write.value == "failed" and landed["east"] < 50
    assert outcome.detail is not None and "may have landed" in outcome.detail
    assert weights_of(apiserver) == landed


async def test_a_paused_target_holds_its_weights_until_unpaused(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    from controller.kube.objects import PAUSE_ANNOTATION

    seed(apiserver, [("east", 50), ("west", 50)])
    annotate(apiserver, PAUSE_ANNOTATION, "INC-42: investigating east")
    sims["east"].kv = 0.95
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            await ticks(controller, 3)
            view = controller.snapshot.report.targets["ExternalModel/maas-system/llama"].outcome
            assert weights_of(apiserver) == {"east": 50, "west": 50}
            assert view.decision.mode.value == "paused"
            assert view.decision.notes == ("INC-42: investigating east",)
            mode = controller.registry.get_sample_value(
                "weight_controller_target_mode",
                {"target": "ExternalModel/maas-system/llama", "mode": "paused"},
            )
            assert mode == 1
            annotate(apiserver, PAUSE_ANNOTATION, None)
            await ticks(controller, 2)
    assert weights_of(apiserver)["west"] > 50  # released: back to steering
    paused = [e for e in logs if e["event"] == "target paused"]
    ended = [
        e for e in logs if e["event"] == "condition ended" and e["condition"] == "target paused"
    ]
    assert len(paused) == 1 and paused[0]["note"] == "INC-42: investigating east"
    assert len(ended) == 1


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)  # the log is no CRD's
async def test_each_change_of_a_hand_hold_is_said_and_each_end_by_its_name(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """Found by an attack: pause, pin and freeze were one condition per target, so a pin
    re-written to 110 (ignored, weights held), a pin swapped for a pause and a new pause note
    logged nothing, and the pause's end was 'condition ended: target pinned'."""
    from controller.kube.objects import PAUSE_ANNOTATION, PIN_ANNOTATION

    def said(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, object]]:
        lines = []
        for e in logs:
            if e["event"] in ("target paused", "target pinned"):
                lines.append((e["event"], e.get("note") or e.get("weights")))
            elif e["event"] == "condition ended" and e["condition"].startswith("target "):
                lines.append(("ended", e["condition"]))
        return lines

    seed(apiserver, [("east", 50), ("west", 50)])
    steps: list[tuple[str, str | None, str | None]] = [
        (PIN_ANNOTATION, '{"east": 10, "west": 90}', None),
        (PIN_ANNOTATION, '{"east": 20, "west": 90}', None),  # a typo: 110, ignored
        (PIN_ANNOTATION, None, "INC-42: east under investigation"),
        (PAUSE_ANNOTATION, "INC-43: west too", None),
        (PAUSE_ANNOTATION, None, None),
    ]
    seen = []
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        for annotation, value, pause in steps:
            annotate(apiserver, annotation, value)
            if pause is not None:
                annotate(apiserver, PAUSE_ANNOTATION, pause)
            with capture_logs() as logs:
                await ticks(controller, 2)
            seen.append(said(logs))
    pinned, retyped, paused, renoted, resumed = seen
    assert pinned == [("target pinned", {"east": 10, "west": 90})]
    assert retyped[0] == ("ended", "target pinned") and retyped[1][0] == "target paused"
    assert "must add up to 100" in str(retyped[1][1]) and len(retyped) == 2
    assert paused == [("ended", "target paused"), ("target paused", steps[2][2])]
    assert renoted == [("ended", "target paused"), ("target paused", "INC-43: west too")]
    assert resumed == [("ended", "target paused")]


@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "no-annotations"])
async def test_a_pause_set_after_the_read_is_never_written_over(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet, annotated: bool
) -> None:
    """A person pauses the model between the controller's read and its patch (a watch that
    lags): the patch's test of the annotations as read (or of the resourceVersion, where
    there were none) refuses it, and the fresh read shows the pause: nothing is written."""
    from controller.kube.objects import PAUSE_ANNOTATION

    seed(apiserver, [("east", 50), ("west", 50)])
    if annotated:
        annotate(apiserver, "owner", "team-a")  # someone else's annotation
    sims["east"].kv = 0.95
    apiserver.before(
        "PATCH", "externalmodels", lambda: annotate(apiserver, PAUSE_ANNOTATION, "INC-7")
    )
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        report = await controller.once()
        await ticks(controller, 2)
    obj = apiserver.get(CRD, "externalmodels", NS, "llama")
    assert obj is not None
    assert weights_of(apiserver) == {"east": 50, "west": 50}
    assert obj["metadata"]["annotations"][PAUSE_ANNOTATION] == "INC-7"
    assert LAST_APPLIED not in obj["metadata"]["annotations"]  # not one write landed
    assert len(apiserver.writes("PATCH")) == 1  # the refused one; none after the re-read
    view = report.targets["ExternalModel/maas-system/llama"].outcome
    assert view.decision.mode.value == "paused"  # decided again from the fresh read


@pytest.mark.parametrize("watch", [False, True], ids=["listed", "stalled-watch"])
async def test_a_model_opted_out_after_the_read_is_never_written(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet, watch: bool
) -> None:
    """A person takes the model out of the controller's hands (removes the opt-in label)
    between its read and its patch, or while the watch it reads through has stalled silently:
    the patch's test of the labels as read refuses each attempt, and the re-read, through the
    label selector as discovery lists, finds it no longer ours. Not one write lands."""
    from controller.kube.objects import MANAGED_LABEL

    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.97

    def unlabel() -> None:
        apiserver.edit(
            CRD,
            "externalmodels",
            NS,
            "llama",
            "oncall",
            lambda obj: obj["metadata"]["labels"].pop(MANAGED_LABEL),
        )

    kube: dict[str, Any] = {"watch": watch}
    if watch:
        apiserver.watch_fault = "silent"  # the watch says nothing from its start
        kube["watch_idle"] = 60  # and is not dropped while the test runs
    else:
        apiserver.before("PATCH", "externalmodels", unlabel)
    async with Controller(settings_for(sims, kubernetes=kube), serve=False, api=api) as c:
        if watch:
            await c.once()  # listed, then written: ours until the label goes
            unlabel()
            written = weights_of(apiserver)
        report = await c.once()
        await ticks(c, 3)
    obj = apiserver.get(CRD, "externalmodels", NS, "llama")
    assert obj is not None and MANAGED_LABEL not in obj["metadata"]["labels"]
    if watch:  # the stale cache offers it every tick; every patch is refused
        assert weights_of(apiserver) == written != {"east": 50, "west": 50}
    else:
        assert weights_of(apiserver) == {"east": 50, "west": 50}
        assert LAST_APPLIED not in (obj["metadata"].get("annotations") or {})
        assert "ExternalModel/maas-system/llama" not in report.targets  # gone for us


async def test_two_rules_of_one_route_are_written_in_one_tick(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """The second rule was read before the first rule's write changed the object's
    annotations: it is written from what that write left, not refused as a change."""
    rules = [[("svc-east", 500), ("svc-west", 500)], [("svc-east", 1), ("svc-west", 1)]]
    apiserver.put_object(GATEWAY, "httproutes", route(rules))
    sims["west"].kv = 0.95
    async with Controller(route_settings(sims), serve=False, api=api) as controller:
        report = await controller.once()
    writes = {key: view.outcome.write.value for key, view in report.targets.items()}
    assert writes == {"HTTPRoute/apps/llama/rule-0": "done", "HTTPRoute/apps/llama/rule-1": "done"}
    assert len(apiserver.writes("PATCH")) == 2  # no conflict, no re-read
    first, second = rules_of(apiserver)
    assert first["svc-east"] > first["svc-west"] and second["svc-east"] > second["svc-west"]


@pytest.mark.looptime
async def test_a_rule_waiting_on_another_rule_s_write_is_not_written_past_the_fence(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """Rules of one route are written one at a time. Leadership was checked before the wait:
    on a loaded API server (each patch and Event 1.8 s, under the 2 s api_timeout) the third
    rule's patch landed seconds after the replica's fence, past a follower's takeover (found
    by an attack). It is checked again once the rule's turn comes, and before the Event."""
    from controller.exporter import make_registry
    from controller.publish.kubernetes import KubernetesPublisher
    from controller.state import Snapshot

    apiserver.put_object(GATEWAY, "httproutes", route([[("svc-east", 50), ("svc-west", 50)]] * 3))
    backends = {"svc-east": "east", "svc-west": "west"}
    kube = {
        "api_timeout": 2,
        "httproutes": [{"namespace": "apps", "name": "llama", "backends": backends}],
    }
    loop = asyncio.get_running_loop()
    fence = loop.time() + 2.5  # what is left of this replica's lease

    def leading(margin: float) -> bool:
        return loop.time() + margin < fence

    _, metrics = make_registry(Snapshot())
    publisher = KubernetesPublisher(settings_for(sims, kubernetes=kube), api, metrics, leading)
    targets = (await publisher.discover()).targets
    apiserver.slow("PATCH", "httproutes", 1.8, times=3)
    apiserver.slow("POST", "events", 1.8, times=3)
    results = await asyncio.gather(
        *(publisher.write(t, {"svc-east": 30, "svc-west": 70}, "normal: x") for t in targets)
    )
    await publisher.discovery.close()
    assert [r.write.value for r in results] == ["done", "follower", "follower"]
    assert len(apiserver.writes("PATCH")) == 1 and apiserver.writes("POST", "events") == []


async def test_a_pin_sets_the_weights_and_a_bad_pin_holds(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    from controller.kube.objects import PIN_ANNOTATION

    seed(apiserver, [("east", 50), ("west", 50)])
    sims["west"].kv = 0.95  # the loop would move traffic to east; the pin says otherwise
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        annotate(apiserver, PIN_ANNOTATION, '{"east": 10, "west": 90}')
        await ticks(controller, 3)
        assert weights_of(apiserver) == {"east": 10, "west": 90}
        view = controller.snapshot.report.targets["ExternalModel/maas-system/llama"].outcome
        assert view.decision.mode.value == "pinned"
        annotate(apiserver, PIN_ANNOTATION, '{"east": 10, "west": 10}')  # adds up to 20
        await ticks(controller, 2)
        view = controller.snapshot.report.targets["ExternalModel/maas-system/llama"].outcome
    assert weights_of(apiserver) == {"east": 10, "west": 90}  # held, not half-applied
    assert view.decision.mode.value == "paused"
    assert "must add up to 100" in view.decision.notes[0]


async def test_a_global_freeze_holds_every_target(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    seed(apiserver, [("east", 50), ("west", 50)])
    sims["east"].kv = 0.95
    frozen = settings_for(sims, weights={"freeze": True})
    async with Controller(frozen, serve=False, api=api) as controller:
        await ticks(controller, 3)
        view = controller.snapshot.report.targets["ExternalModel/maas-system/llama"].outcome
    assert apiserver.writes("PATCH") == []
    assert view.decision.mode.value == "frozen"


async def test_events_say_when_the_mode_changes_and_count_the_writes_between(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """One Event per write made a target that steps every tick an Event every tick."""
    from controller.exporter import make_registry
    from controller.publish.kubernetes import KubernetesPublisher
    from controller.state import Snapshot

    seed(apiserver, [("east", 50), ("west", 50)])
    _, metrics = make_registry(Snapshot())
    publisher = KubernetesPublisher(settings_for(sims), api, metrics)
    (target,) = (await publisher.discover()).targets
    steps = [("normal", 45), ("normal", 40), ("normal", 35), ("saturated", 40), ("saturated", 45)]
    for mode, east in steps:
        done = await publisher.write(target, {"east": east, "west": 100 - east}, f"{mode}: ...")
        assert done.target is not None
        target = done.target
    await publisher.discovery.close()
    messages = [e[3]["message"] for e in apiserver.writes("POST", "events")]
    assert messages == [
        "Weights changed (normal: ...)",
        "Weights changed (saturated: ...); 2 more write(s) since the last Event",
    ]
