"""Many teams, one controller, through the real kubernetes-asyncio client and the API double
that enforces the upstream CRDs: one team's objects never reach another's routing."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.fakes.pages import CumulativeHistogram, vllm_v1_page
from controller.kube import objects
from controller.kube.discovery import KEPT_UNREAD
from controller.kube.objects import (
    PAUSE_ANNOTATION,
    PIN_ANNOTATION,
    TOKEN_ANNOTATION,
    VLLM_URLS_ANNOTATION,
)
from controller.render import report_json, state_json
from controller.settings import build_settings
from controller.status import render
from tests.conftest import Serve
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import (
    CRD,
    GATEWAY,
    hot_and_cool,
    model,
    provider,
    route,
    settings_for,
    ticks,
    weights_of,
)
from tests.support.servers import text_handler

TEAM_A, TEAM_B = "team-a", "team-b"
REFS = [("east", 50), ("west", 50)]
LOOPBACK_OK = {"annotation_urls": {"allow_loopback": True}}  # the test's pods are local


async def test_same_name_providers_in_two_namespaces_are_two_clusters(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Both teams call their provider "gpu": team A's model is weighed from team A's pages
    (hot), never from team B's (cool)."""
    async with Fleet(
        [
            SimCluster("a-gpu", kv=0.97, noise=0.0),
            SimCluster("b-gpu", kv=0.10, noise=0.0),
            SimCluster("spare", kv=0.10, noise=0.0),
        ]
    ) as sims:
        for team, sim in ((TEAM_A, "a-gpu"), (TEAM_B, "b-gpu")):
            urls = {VLLM_URLS_ANNOTATION: ",".join(sims[sim].vllm_urls())}
            apiserver.put_object(CRD, "externalproviders", provider("gpu", urls, team))
            spare = {VLLM_URLS_ANNOTATION: ",".join(sims["spare"].vllm_urls())}
            apiserver.put_object(CRD, "externalproviders", provider("spare", spare, team))
            apiserver.put_object(
                CRD, "externalmodels", model("llama", [("gpu", 50), ("spare", 50)], namespace=team)
            )
        settings = settings_for(sims, kubernetes=LOOPBACK_OK)
        async with Controller(settings, serve=False, api=api) as controller:
            await ticks(controller, 3)
            clusters = controller.snapshot.report.clusters
            assert clusters[f"{TEAM_A}/gpu"].metrics is not None
            kv_a = clusters[f"{TEAM_A}/gpu"].metrics.kv_mean  # type: ignore[union-attr]
            kv_b = clusters[f"{TEAM_B}/gpu"].metrics.kv_mean  # type: ignore[union-attr]
    assert kv_a is not None and kv_a > 0.9 and kv_b is not None and kv_b < 0.2
    assert weights_of(apiserver, namespace=TEAM_A)["gpu"] < 50  # shed: its own page is hot
    assert weights_of(apiserver, namespace=TEAM_B)["gpu"] >= 50  # cool: not shed


async def test_a_hostile_annotation_in_one_namespace_leaves_the_others_as_they_were(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Team B's pin is JSON nested 100,000 deep (it raised RecursionError and stopped discovery
    everywhere, so team A's new models went unfound and a write went over a pause)."""
    async with Fleet(
        [SimCluster("hot", kv=0.97, noise=0.0), SimCluster("cool", kv=0.1, noise=0.0)]
    ) as sims:
        for team in (TEAM_A, TEAM_B):
            for name, sim in (("hot", "hot"), ("cool", "cool")):
                urls = {VLLM_URLS_ANNOTATION: ",".join(sims[sim].vllm_urls())}
                apiserver.put_object(CRD, "externalproviders", provider(name, urls, team))
        refs = [("hot", 50), ("cool", 50)]
        deep = {PIN_ANNOTATION: "[" * 100_000 + "]" * 100_000}
        apiserver.put_object(
            CRD, "externalmodels", model("evil", refs, namespace=TEAM_B, annotations=deep)
        )
        paused = {PAUSE_ANNOTATION: "INC-7: hold"}
        apiserver.put_object(
            CRD, "externalmodels", model("held", refs, namespace=TEAM_A, annotations=paused)
        )
        apiserver.put_object(CRD, "externalmodels", model("llama", refs, namespace=TEAM_A))
        settings = settings_for(sims, kubernetes=LOOPBACK_OK)
        async with Controller(settings, serve=False, api=api) as controller:
            await ticks(controller, 2)
            apiserver.put_object(CRD, "externalmodels", model("late", refs, namespace=TEAM_A))
            await ticks(controller, 2)
            report = controller.snapshot.report
    assert report.kubernetes == (True, None)  # discovery went on
    targets = report.targets
    assert f"ExternalModel/{TEAM_A}/late" in targets  # found after the hostile object
    evil = targets[f"ExternalModel/{TEAM_B}/evil"].outcome.decision
    assert any("pin ignored" in note for note in evil.notes)
    assert weights_of(apiserver, "evil", TEAM_B) == {"hot": 50, "cool": 50}  # held, not moved
    assert weights_of(apiserver, "held", TEAM_A) == {"hot": 50, "cool": 50}  # still paused
    assert weights_of(apiserver, "llama", TEAM_A)["hot"] < 50  # weighed as ever


async def test_a_cluster_of_pods_that_never_answer_cannot_take_the_tick_from_another(
    serve: Serve,
) -> None:
    """200 hanging URLs in one cluster held every slot of the process: the healthy cluster
    beside it timed out and its weight went from 50 to 1. Each cluster now waits for its own
    slots (scrape.max_concurrency_per_cluster)."""

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    fine = vllm_v1_page("m", [0.3], [0], [2], [CumulativeHistogram()])
    server = await serve({"/hang": hang, "/fine": text_handler(fine)})
    settings = build_settings(
        {
            "interval": 1,
            "clusters": [
                {
                    "name": "wide",
                    "vllm_urls": [f"{server.url('/hang')}?pod={i}" for i in range(200)],
                },
                {"name": "fine", "vllm_urls": [server.url("/fine")]},
            ],
            "scrape": {"timeout": 0.4},
        }
    )
    async with Controller(settings, serve=False) as controller:
        report = report_json(await controller.once())
    assert report["clusters"]["fine"]["healthy"] is True
    assert report["clusters"]["wide"]["healthy"] is False
    assert report["targets"]["configured"]["applied"]["fine"] == 100


def test_a_url_listed_twice_is_one_pod() -> None:
    settings = build_settings(
        {"clusters": [{"name": "a", "vllm_urls": ["http://p:8000/metrics"] * 200}]}
    )
    assert len(settings.clusters[0].vllm_urls) == 1


def test_a_provider_listing_too_many_urls_is_refused_and_named() -> None:
    many = ",".join(f"http://10.0.0.{i % 250}:{8000 + i}/metrics" for i in range(65))
    found = objects.map_providers(
        [provider("wide", {VLLM_URLS_ANNOTATION: many}, TEAM_A)], set(), max_urls=64
    )
    assert found.defined == () and "wide" not in found.clusters
    assert "team-a/wide: 65 vLLM URLs, more than" in found.problems[0]


def test_a_cluster_annotation_that_is_no_cluster_name_is_refused_and_named() -> None:
    """A 100 KB cluster annotation became a label on its refs' series (/metrics 17 → 316 KB)."""
    huge = provider("gpu", {objects.CLUSTER_ANNOTATION: "x" * 100_000}, TEAM_A)
    fine = provider("spare", {objects.CLUSTER_ANNOTATION: "east"}, TEAM_A)
    found = objects.map_providers([huge, fine], {"east"})
    assert found.clusters == {"spare": "east"}  # the other provider is mapped as ever
    assert "is not a cluster name (100000 characters" in found.problems[0]
    assert len(found.problems[0]) < 300


def test_a_cluster_annotation_may_not_name_another_namespace_s_cluster() -> None:
    """Team B's provider named team A's annotation-defined cluster (``team-a/gpu``): team B's
    model was weighed from team A's pages, fetched with team A's token, and team A's load
    showed in team B's weights (found by an attack). A team names the config's clusters and
    its own, never another's."""
    spy = provider("spy", {objects.CLUSTER_ANNOTATION: "team-a/gpu"}, TEAM_B)
    sibling = provider("again", {objects.CLUSTER_ANNOTATION: "team-b/gpu"}, TEAM_B)
    shared = provider("shared", {objects.CLUSTER_ANNOTATION: "east"}, TEAM_B)
    found = objects.map_providers([spy, sibling, shared], {"east"})
    assert found.clusters == {"again": "team-b/gpu", "shared": "east"}
    (problem,) = found.problems
    assert "spy" in problem and "'team-a/gpu', a cluster of another namespace" in problem


async def test_clusters_of_pods_that_hang_cannot_starve_a_healthy_cluster_past_the_tick(
    serve: Serve,
) -> None:
    """32 clusters of hanging pods (one namespace's annotations may define as many), ranked
    ahead of a healthy cluster of 10 pods: its first page was promoted, its other nine
    queued behind theirs by rank, a round of timeouts each, and the tick's deadline cut its
    fetch: ten healthy pods read as ``timeout`` (found by an attack). A fetch whose pages
    held their slots past the limiter's grace now waits behind those whose pages answer."""

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    fine = vllm_v1_page("m", [0.3], [0], [2], [CumulativeHistogram()])
    server = await serve({"/hang": hang, "/fine": text_handler(fine)})
    hung = [
        {"name": f"h{c}", "vllm_urls": [f"{server.url('/hang')}?c={c}&pod={i}" for i in range(16)]}
        for c in range(32)
    ]
    healthy = {"name": "fine", "vllm_urls": [f"{server.url('/fine')}?pod={i}" for i in range(10)]}
    settings = build_settings(
        {"interval": 2, "clusters": [*hung, healthy], "scrape": {"timeout": 0.25}}
    )
    async with Controller(settings, serve=False) as controller:
        report = report_json(await controller.once())
    assert report["clusters"]["fine"]["healthy"] is True
    assert report["clusters"]["fine"]["pods_answering"] == 10
    assert report["targets"]["configured"]["applied"]["fine"] == 100


async def test_a_tenant_s_token_over_plain_http_is_shown_while_its_cluster_is_read(
    apiserver: FakeAPIServer, api: client.ApiClient, tmp_path: Path
) -> None:
    """Found by an attack: a provider's pages over http with a token annotation sent the
    token in the clear and said so nowhere (the gauge and warning were for configured
    clusters only, set at start-up). Shown while the cluster is read, gone with it."""
    token = tmp_path / "token"
    token.write_text("abc123")
    async with Fleet([SimCluster("fine", kv=0.2)]) as sims:
        plain = {VLLM_URLS_ANNOTATION: "http://vllm.team-b.svc:8000/metrics", TOKEN_ANNOTATION: "t"}
        apiserver.put_object(CRD, "externalproviders", provider("x", plain, TEAM_B))
        apiserver.put_object(CRD, "externalproviders", provider("fine", namespace=TEAM_B))
        refs = [("x", 50), ("fine", 50)]
        apiserver.put_object(CRD, "externalmodels", model("mine", refs, namespace=TEAM_B))
        kube = {"annotation_urls": {"allow_loopback": True, "tokens": {"team-b/t": str(token)}}}
        async with Controller(
            settings_for(sims, kubernetes=kube), serve=False, api=api
        ) as controller:
            with capture_logs() as lines:
                await ticks(controller, 2)
            shown = controller.registry.get_sample_value(
                "weight_controller_cluster_insecure",
                {"cluster": "team-b/x", "risk": "token_in_cluster"},
            )
            apiserver.delete(CRD, "externalproviders", TEAM_B, "x")
            apiserver.put_object(
                CRD, "externalmodels", model("mine", [("fine", 100)], namespace=TEAM_B)
            )
            await ticks(controller, 2)
            page = generate_latest(controller.registry).decode()
    assert shown == 1
    (warned,) = [e for e in lines if e["event"] == "bearer token over the cluster network"]
    assert warned["cluster"] == "team-b/x" and warned["hosts"] == ["vllm.team-b.svc"]
    assert 'cluster="team-b/x"' not in page  # forgotten with its cluster


@pytest.mark.parametrize("broken", ["route", "namespace"])
async def test_one_tenant_s_unreadable_objects_never_stop_another_s_discovery(
    apiserver: FakeAPIServer, api: client.ApiClient, broken: str
) -> None:
    """Found by an attack: one configured HTTPRoute answering 403 (its namespace's owner
    deleted our RoleBinding), or one configured namespace's LISTs, failed every discovery:
    another team's new ExternalModel was never found, the old targets reused. Now that
    scope is named and its targets kept as last read; the others are read on."""
    for team in (TEAM_A, TEAM_B):
        for ref, _ in REFS:
            apiserver.put_object(CRD, "externalproviders", provider(ref, namespace=team))
    apiserver.put_object(CRD, "externalmodels", model("llama", REFS, namespace=TEAM_A))
    apiserver.put_object(GATEWAY, "httproutes", route([[("svc-east", 50), ("svc-west", 50)]]))
    backends = {"svc-east": "east", "svc-west": "west"}
    kube = {
        "namespaces": [TEAM_A, TEAM_B],
        "httproutes": [{"namespace": "apps", "name": "llama", "backends": backends}],
    }
    async with hot_and_cool() as sims:
        settings = settings_for(sims, kubernetes=kube)
        async with Controller(settings, serve=False, api=api) as c:
            before = set((await c.once()).targets)
            if broken == "route":
                apiserver.fail("GET", "httproutes", 403, times=1000)
            else:
                for plural in ("externalproviders", "externalmodels"):
                    apiserver.fail("GET", plural, 403, times=1000, namespace=TEAM_A)
            apiserver.put_object(CRD, "externalmodels", model("granite", REFS, namespace=TEAM_B))
            with capture_logs() as lines:
                after = await c.once()
            for _ in range(KEPT_UNREAD):
                last = await c.once()
    scope = {"route": "route apps/llama", "namespace": f"namespace {TEAM_A}"}[broken]
    assert after.kubernetes == (True, f"{scope}: forbidden (kept)")
    assert set(after.targets) == before | {f"ExternalModel/{TEAM_B}/granite"}
    assert weights_of(apiserver, "granite", TEAM_B) != dict(REFS)  # weighed and written
    event = {"route": "cannot read HTTPRoute", "namespace": "cannot read namespace"}[broken]
    (named,) = [e for e in lines if e["event"] == event]
    assert named["reason"] == "forbidden" and named["kept_targets"] >= 1
    # for good (a namespace deleted with our RoleBinding): dropped after KEPT_UNREAD
    assert last.kubernetes == (True, f"{scope}: forbidden (dropped)")
    shown = render(json.loads(json.dumps(state_json(last, True, False))))
    assert f"kubernetes: reachable; unreadable: {scope}: forbidden (dropped)" in shown
    gone = {"route": "HTTPRoute/", "namespace": f"ExternalModel/{TEAM_A}/"}[broken]
    assert set(last.targets) == {k for k in after.targets if not k.startswith(gone)}
    assert set(last.targets) < set(after.targets)


async def test_a_tenant_s_name_that_resolves_to_a_forbidden_address_is_never_dialled(
    apiserver: FakeAPIServer, api: client.ApiClient, monkeypatch: pytest.MonkeyPatch, serve: Serve
) -> None:
    """Found by an attack: a name under the default allow-list (``*.svc``) was checked as
    text only, and a tenant's ExternalName Service makes ``x.team-b.svc`` answer loopback or
    the metadata server. The cluster's DNS is played by the system resolver answering for
    the tenant's names; the tenants' connector checks every address a name resolves to as a
    written one is (a review: a public address let a tenant's token out), and dials none
    that annotation URLs may not reach. The operator's own cluster reads the same host
    first, on its own connector (a review: its DNS cache and connection let the tenant's
    name through), and is read as before."""
    asked: list[str] = []

    async def page(request: web.Request) -> web.Response:
        asked.append(request.headers.get("X-Who", request.path))
        return web.Response(text=vllm_v1_page("m", [0.1], [0], [1], [CumulativeHistogram()]))

    server = await serve({"/metrics": page, "/mine": page})
    real = socket.getaddrinfo
    answers = {
        "hot.team-b.svc": "127.0.0.1",
        "meta.team-b.svc": "169.254.169.254",
        "far.team-b.svc": "192.0.2.7",  # no private range: a host outside the cluster
    }

    def cluster_dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real(answers.get(host, host), *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", cluster_dns)
    async with Fleet([SimCluster("cool", kv=0.1)]) as sims:
        hosts = {"hot": "hot.team-b.svc", "meta": "meta.team-b.svc", "far": "far.team-b.svc"}
        for name, host in hosts.items():
            urls = {VLLM_URLS_ANNOTATION: f"http://{host}:{server.port}/metrics"}
            apiserver.put_object(CRD, "externalproviders", provider(name, urls, TEAM_B))
        apiserver.put_object(CRD, "externalproviders", provider("cool", namespace=TEAM_B))
        refs = [("hot", 20), ("meta", 20), ("far", 20), ("cool", 40)]
        apiserver.put_object(CRD, "externalmodels", model("llama", refs, namespace=TEAM_B))
        mine = {"name": "mine", "vllm_urls": [f"http://hot.team-b.svc:{server.port}/mine"]}
        settings = settings_for(sims, clusters=[*sims.settings_clusters(), mine])
        assert settings.kubernetes.annotation_urls.allow_loopback is False
        async with Controller(settings, serve=False, api=api) as controller:
            report = report_json(await controller.once())
            report = report_json(await controller.once())
    for name, why in (
        ("hot", "loopback address 127.0.0.1"),
        ("meta", "link-local address"),
        ("far", "address 192.0.2.7 is not on the allow-list"),
    ):
        cluster = report["clusters"][f"{TEAM_B}/{name}"]
        assert cluster["healthy"] is False and cluster["vram_utilization"] is None
        (error,) = cluster["errors"]
        assert error["reason"] == "forbidden_address" and why in error["detail"], error
    assert set(asked) == {"/mine"}  # the operator's page alone: no tenant's was asked
    assert report["clusters"]["mine"]["healthy"] is True
    assert report["clusters"]["cool"]["healthy"] is True


async def test_a_provider_s_changed_urls_are_read_on_the_next_tick(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Providers are mapped to clusters again only when one of a namespace's changes (2,000
    of them mapped every tick cost about a second of the event loop: an attack); a change
    is still read on the next tick, and an unchanged namespace keeps its mapping."""
    async with Fleet(
        [SimCluster("old", kv=0.9, noise=0.0), SimCluster("new", kv=0.1, noise=0.0)]
    ) as sims:
        for name, sim in (("gpu", "old"), ("spare", "new")):
            urls = {VLLM_URLS_ANNOTATION: ",".join(sims[sim].vllm_urls())}
            apiserver.put_object(CRD, "externalproviders", provider(name, urls, TEAM_B))
        apiserver.put_object(
            CRD, "externalmodels", model("llama", [("gpu", 50), ("spare", 50)], namespace=TEAM_B)
        )
        settings = settings_for(sims, kubernetes={**LOOPBACK_OK, "watch": False})
        async with Controller(settings, serve=False, api=api) as controller:
            first = report_json(await controller.once())["clusters"][f"{TEAM_B}/gpu"]
            second = report_json(await controller.once())["clusters"][f"{TEAM_B}/gpu"]
            moved = ",".join(sims["new"].vllm_urls())

            def move(obj: dict[str, Any]) -> None:  # a tenant's edit: same uid, new version
                obj["metadata"]["annotations"][VLLM_URLS_ANNOTATION] = moved

            apiserver.edit(CRD, "externalproviders", TEAM_B, "gpu", "kubectl", move)
            third = report_json(await controller.once())["clusters"][f"{TEAM_B}/gpu"]
    assert first["vram_utilization"] == second["vram_utilization"] == 0.9
    assert third["vram_utilization"] == 0.1


async def test_an_api_server_that_hangs_is_asked_once_a_discovery_not_once_a_namespace(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """A review: with each namespace read on its own, an API server that hangs was waited
    for an api_timeout a namespace, in turn (6 namespaces: 3.0 s for 0.5), past the
    discovery stage's deadline. A server that does not answer is every namespace's: the
    first timeout ends the discovery, the last targets kept, as before."""
    names = [f"team-{i}" for i in range(6)]
    for ns in names:
        for ref, _ in REFS:
            apiserver.put_object(CRD, "externalproviders", provider(ref, namespace=ns))
        apiserver.put_object(CRD, "externalmodels", model("m", REFS, namespace=ns))
    async with hot_and_cool() as sims:
        settings = settings_for(sims, interval=10, kubernetes={"namespaces": names})
        async with Controller(settings, serve=False, api=api) as controller:
            before = await controller.once()
            apiserver.slow("GET", "externalproviders", 30, times=100)  # it hangs
            after = await controller.once()
    assert apiserver.most_waiting == 1  # one LIST left hanging, not one a namespace
    assert after.kubernetes[0] is False and "timed out" in str(after.kubernetes[1])
    assert set(after.targets) == set(before.targets) and len(before.targets) == len(names)


async def test_the_only_namespace_refusing_for_good_is_dropped_in_time(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """A review: when every configured namespace refused (a one-namespace config whose
    RoleBinding went), the discovery was failed whole and its targets kept for good."""
    for ref, _ in REFS:
        apiserver.put_object(CRD, "externalproviders", provider(ref, namespace=TEAM_A))
    apiserver.put_object(CRD, "externalmodels", model("llama", REFS, namespace=TEAM_A))
    async with hot_and_cool() as sims:
        settings = settings_for(sims, kubernetes={"namespaces": [TEAM_A]})
        async with Controller(settings, serve=False, api=api) as controller:
            assert len((await controller.once()).targets) == 1
            for plural in ("externalproviders", "externalmodels"):
                apiserver.fail("GET", plural, 403, times=1000)
            kept = await controller.once()
            for _ in range(KEPT_UNREAD):
                last = await controller.once()
    assert kept.kubernetes == (True, f"namespace {TEAM_A}: forbidden (kept)")
    assert len(kept.targets) == 1
    assert last.kubernetes == (True, f"namespace {TEAM_A}: forbidden (dropped)")
    assert last.targets == {}
