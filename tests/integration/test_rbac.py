"""RBAC is exactly the verbs the code uses: every API call the controller makes — reading and
writing targets, a conflict's re-read, Events, the CRD's minimum, leader election, reviewing a
metrics client — is recorded by the API-server double and compared with the rules that
``kubectl kustomize manifests`` renders. A verb granted but never used fails, and so does one
used but not granted."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.kube.leader import LeaderElector
from controller.settings import LeaderSettings, build_settings
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import CRD, GATEWAY, NS, model, provider, route, wait_until
from tests.support.manifests import render

PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?P<sub>/status)?$"
)
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "WATCH": "watch"}
Use = tuple[str, str, str]  # (apiGroup, resource, verb)


def uses(requests: list[tuple[str, str, str, Any]]) -> dict[Use, set[str | None]]:
    """What was called, with the object names (``None``: a collection)."""
    found: dict[Use, set[str | None]] = {}
    for method, path, _, _ in requests:
        match = PATH.match(path)
        assert match, path
        name = match["name"]
        verb = VERBS.get(method) or ("get" if name else "list")
        found.setdefault((match["group"] or "", match["resource"], verb), set()).add(name)
    return found


def granted() -> dict[Use, set[str] | None]:
    """Each (group, resource, verb) the controller's Roles grant, with resourceNames."""
    return granted_by(render("manifests"))


def granted_by(rendered: list[dict[str, Any]]) -> dict[Use, set[str] | None]:
    """Each (group, resource, verb) the Roles among ``rendered`` grant, with resourceNames
    (the non-resource ``get /metrics`` aside)."""
    rules = [
        rule
        for obj in rendered
        if obj["kind"] in ("ClusterRole", "Role")
        and obj["metadata"]["name"] != "weight-controller-metrics-reader"
        for rule in obj["rules"]
    ]
    result: dict[Use, set[str] | None] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    names = set(rule["resourceNames"]) if "resourceNames" in rule else None
                    result[(group, resource, verb)] = names
    return result


async def test_the_roles_grant_exactly_what_the_controller_calls() -> None:
    apiserver = FakeAPIServer(users={"t": "prometheus"}, grants={("prometheus", "/metrics")})
    await apiserver.start()
    try:
        await exercise(apiserver)
    finally:
        await apiserver.stop()
    used, allowed = uses(apiserver.requests), granted()
    assert set(used) == set(allowed), (
        f"used, not granted: {sorted(set(used) - set(allowed))}; "
        f"granted, not used: {sorted(set(allowed) - set(used))}"
    )
    for key, names in allowed.items():
        if names is not None:  # limited by resourceNames: every call named one of them
            assert used[key] <= names, (key, used[key])


async def exercise(apiserver: FakeAPIServer) -> None:
    for name in ("east", "west"):
        apiserver.put_object(CRD, "externalproviders", provider(name))
    apiserver.put_object(CRD, "externalmodels", model("llama", [("east", 50), ("west", 50)]))
    apiserver.put_object(GATEWAY, "httproutes", route([[("svc-east", 50), ("svc-west", 50)]]))
    # someone else writes at the worst moment once: the conflict's re-read is a call too
    apiserver.before(
        "PATCH",
        "externalmodels",
        lambda: apiserver.edit(CRD, "externalmodels", NS, "llama", "someone", lambda o: None),
    )
    async with (
        Fleet([SimCluster("east", kv=0.95), SimCluster("west", kv=0.1)]) as sims,
        client.ApiClient(client.Configuration(host=apiserver.url)) as api,
    ):
        backends = {"svc-east": "east", "svc-west": "west"}
        settings = build_settings(
            {
                "interval": 1,
                "clusters": sims.settings_clusters(),
                "scrape": {"timeout": 0.5},
                "server": {"bind": "127.0.0.1:0", "authenticate": True},
                "kubernetes": {
                    "enabled": True,
                    "httproutes": [{"namespace": "apps", "name": "llama", "backends": backends}],
                },
            }
        )
        async with Controller(settings, api=api) as controller:
            for _ in range(3):
                await controller.once()
            url = f"http://127.0.0.1:{controller.port}/metrics"
            async with (
                aiohttp.ClientSession() as session,
                session.get(url, headers={"Authorization": "Bearer t"}) as response,
            ):
                assert response.status == 200
        lease = LeaderSettings(identity="a", lease_duration=1.5, renew_deadline=1, retry_period=0.2)
        elector = LeaderElector(api, lease)
        stop = asyncio.Event()
        task = asyncio.create_task(elector.run(stop))
        await wait_until(elector.is_leader, 3)
        await asyncio.sleep(0.5)  # a renewal or two
        stop.set()
        await task
    assert apiserver.writes("PATCH", "externalmodels") and apiserver.writes("PATCH", "httproutes")
