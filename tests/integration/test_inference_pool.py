"""A cluster attached by its InferencePool (``clusters[].inference_pool``): the controller finds
the EPP's /metrics page from the pool and the Service its ``endpointPickerRef`` names, through
the real kubernetes-asyncio client and the API double's LIST and WATCH, and follows them as
they change. A pool that leads to no page is a named condition of that cluster, never a
traceback, and never another cluster's problem.

The objects are what the inferencepool chart renders (kubernetes-sigs/
gateway-api-inference-extension ``config/charts/inferencepool/templates/inferencepool.yaml``
and ``epp-service.yaml``): the pool named after the release, its endpointPickerRef the EPP
Service and its gRPC port 9002, the Service's ports ``grpc-ext-proc`` 9002 and
``http-metrics`` 9090. Here the Service's cluster IP is loopback and its metrics port the
simulated EPP's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from controller.app import Controller
from controller.errors import ConfigError
from controller.fakes.clusters import Fleet, SimCluster
from controller.kube.pools import POOLS, SERVICES, epp_url
from controller.render import report_json
from controller.settings import InferencePoolRef, Settings, build_settings
from controller.sources.discovery import PoolError, Problem
from tests.integration.test_rbac import granted_by, uses
from tests.support.apiserver import FakeAPIServer
from tests.support.crds import weight_minimum
from tests.support.kube import seed, wait_until, weights_of
from tests.support.manifests import render

NS = "llm"
POOL_PREFIX = "/".join(POOLS[:2])


def pool(name: str, picker: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "targetPorts": [{"number": 8000}],
        "selector": {"matchLabels": {"app": name}},
    }
    if picker is not None:
        spec["endpointPickerRef"] = picker
    return {
        "apiVersion": "/".join(POOLS[:2]),
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def service(name: str, metrics_port: int, **spec: Any) -> dict[str, Any]:
    ports = [
        {"name": "grpc-ext-proc", "protocol": "TCP", "port": 9002, "appProtocol": "http2"},
        {"name": "http-metrics", "protocol": "TCP", "port": metrics_port},
    ]
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "127.0.0.1",
            "selector": {"app": f"{name}-epp"},
            "ports": ports,
            **spec,
        },
    }


def picker(name: str) -> dict[str, Any]:
    return {"name": name, "port": {"number": 9002}}


def settings_of(fleet: Fleet, watch: bool, **cluster: Any) -> Settings:
    """Each simulated cluster attached by its pool (named as its EPP page names it)."""
    clusters = [
        {
            "name": name,
            "inference_pool": {"namespace": NS, "name": f"{name}-pool", "path": "/epp/metrics"},
            **cluster,
        }
        for name in fleet.clusters
    ]
    return build_settings(
        {
            "interval": 1,
            "clusters": clusters,
            "scrape": {"timeout": 0.5},
            "kubernetes": {"enabled": True, "api_timeout": 1, "watch": watch},
        }
    )


def attach(apiserver: FakeAPIServer, fleet: Fleet) -> None:
    """Each cluster's pool and EPP Service, as the chart renders them."""
    for name, sim in fleet.clusters.items():
        assert sim.port is not None
        apiserver.put_object(POOL_PREFIX, "inferencepools", pool(f"{name}-pool", picker(name)))
        apiserver.put_object("v1", "services", service(name, sim.port))


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    sims = [
        SimCluster("east", kv=0.9, noise=0.0, epp_only=True),
        SimCluster("west", kv=0.2, noise=0.0, epp_only=True),
    ]
    async with Fleet(sims) as started:
        yield started


async def test_a_pool_is_read_from_its_epp_and_followed_by_watch(
    apiserver: FakeAPIServer, api: client.ApiClient, fleet: Fleet
) -> None:
    attach(apiserver, fleet)
    seed(apiserver, [("east", 50), ("west", 50)])
    settings = settings_of(fleet, watch=True)
    assert settings.clusters[0].pool_name == "east-pool"  # the pool's name, unless given
    async with Controller(settings, serve=False, api=api) as controller:
        report = report_json(await controller.once())
        for name, kv in (("east", 0.9), ("west", 0.2)):
            cluster = report["clusters"][name]
            assert cluster["healthy"] is True, cluster
            assert cluster["vram_utilization"] == pytest.approx(kv)
        assert weights_of(apiserver)["west"] > 50  # away from east's 90%

        # A new EPP for east's pool (a release renamed its Service): the watch brings the
        # new Service and the pool's new reference, no LIST per tick.
        listed = len(apiserver.listed)
        async with Fleet([SimCluster("east", kv=0.5, noise=0.0, epp_only=True)]) as moved_to:
            port = moved_to.clusters["east"].port
            assert port is not None
            apiserver.put_object("v1", "services", service("east-v2", port))
            apiserver.edit(
                POOL_PREFIX,
                "inferencepools",
                NS,
                "east-pool",
                "helm",
                lambda obj: obj["spec"].update(endpointPickerRef=picker("east-v2")),
            )
            await until(controller, lambda east: east["vram_utilization"] == pytest.approx(0.5))
            assert len(apiserver.listed) == listed

            # Its metrics port renamed: a named condition of east alone.
            apiserver.edit(
                "v1",
                "services",
                NS,
                "east-v2",
                "helm",
                lambda obj: obj["spec"]["ports"][1].update(name="metrics"),
            )
            with capture_logs() as logs:
                await until(controller, lambda east: east["healthy"] is False)
                report = report_json(await controller.once())
    east = report["clusters"]["east"]
    assert east["reason"] == "inference_pool"
    assert east["errors"][0]["url"] == f"inferencepool:{NS}/east-pool"
    detail = east["errors"][0]["detail"]
    assert detail.startswith("no_metrics_port: Service llm/east-v2 has no port named http-metrics")
    assert report["clusters"]["west"]["healthy"] is True
    least = weight_minimum(apiserver.crd_version)  # the CRD's lowest weight: 0, or 1 in v0.2.0
    assert weights_of(apiserver) == {"east": least, "west": 100 - least}
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")]


async def until(controller: Controller, check: Callable[[dict[str, Any]], bool]) -> None:
    """Ticks until ``check`` holds for east: bounded, as a watch event is asynchronous."""
    for _ in range(100):
        if check(report_json(await controller.once())["clusters"]["east"]):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not within 100 ticks")


BROKEN: dict[str, tuple[Callable[[FakeAPIServer, int], object], Problem]] = {
    "no pool": (lambda api, port: None, Problem.NO_POOL),
    "no endpointPickerRef": (
        lambda api, port: api.put_object(POOL_PREFIX, "inferencepools", pool("east-pool", None)),
        Problem.NO_EPP_REF,
    ),
    "a picker that is no Service": (
        lambda api, port: api.put_object(
            POOL_PREFIX,
            "inferencepools",
            pool("east-pool", {"group": "example.com", "kind": "Picker", "name": "east"}),
        ),
        Problem.NO_EPP_REF,
    ),
    "no Service": (
        lambda api, port: api.put_object(
            POOL_PREFIX, "inferencepools", pool("east-pool", picker("east"))
        ),
        Problem.NO_SERVICE,
    ),
    "a Service that selects no pods": (
        lambda api, port: (
            api.put_object(POOL_PREFIX, "inferencepools", pool("east-pool", picker("east"))),
            api.put_object("v1", "services", service("east", port, selector={})),
        ),
        Problem.NO_SELECTOR,
    ),
    "another Service than the one pinned": (
        lambda api, port: (
            api.put_object(POOL_PREFIX, "inferencepools", pool("east-pool", picker("mine"))),
            api.put_object("v1", "services", service("mine", port)),
        ),
        Problem.NOT_PINNED,
    ),
    "an ExternalName Service": (
        lambda api, port: (
            api.put_object(POOL_PREFIX, "inferencepools", pool("east-pool", picker("east"))),
            api.put_object("v1", "services", service("east", port, type="ExternalName")),
        ),
        Problem.EXTERNAL_NAME,
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_a_pool_that_leads_nowhere_is_a_named_condition_of_its_cluster(
    apiserver: FakeAPIServer, api: client.ApiClient, fleet: Fleet, case: str
) -> None:
    """west is attached properly; east's pool is broken in one way: east is unhealthy for
    that named reason, west is read, and weight goes to west."""
    west = fleet.clusters["west"]
    assert west.port is not None and fleet.clusters["east"].port is not None
    apiserver.put_object(POOL_PREFIX, "inferencepools", pool("west-pool", picker("west")))
    apiserver.put_object("v1", "services", service("west", west.port))
    setup, problem = BROKEN[case]
    setup(apiserver, fleet.clusters["east"].port)
    seed(apiserver, [("east", 50), ("west", 50)])
    # east's pool is pinned to its Service "east", as a token's should be
    pinned = {"inference_pool": {"namespace": NS, "name": "east-pool", "service": "east"}}
    settings = settings_of(fleet, watch=False)
    data = settings.model_dump(mode="json", exclude_unset=True)
    data["clusters"][0]["inference_pool"] = {
        **data["clusters"][0]["inference_pool"],
        **pinned["inference_pool"],
    }
    async with Controller(build_settings(data), serve=False, api=api) as controller:
        report = report_json(await controller.once())
    east, west_view = report["clusters"]["east"], report["clusters"]["west"]
    assert (east["healthy"], east["reason"]) == (False, "inference_pool")
    assert east["errors"][0]["detail"].startswith(f"{problem.value}: ")
    assert west_view["healthy"] is True
    least = weight_minimum(apiserver.crd_version)  # the CRD's lowest weight: 0, or 1 in v0.2.0
    assert weights_of(apiserver) == {"east": least, "west": 100 - least}


async def test_an_unreadable_api_keeps_the_epp_found_before(
    apiserver: FakeAPIServer, api: client.ApiClient, fleet: Fleet
) -> None:
    attach(apiserver, fleet)
    async with Controller(settings_of(fleet, watch=False), serve=False, api=api) as controller:
        await controller.once()
        apiserver.fail("GET", "inferencepools", 503, times=1000)
        report = report_json(await controller.once())
    east = report["clusters"]["east"]
    assert east["healthy"] is True and east["vram_utilization"] == pytest.approx(0.9)
    assert [e["reason"] for e in east["errors"]] == ["discovery"]
    assert east["errors"][0]["detail"].startswith("api: ")


def test_the_url_is_the_cluster_ip_over_http_and_the_name_over_https() -> None:
    pools, services = [pool("p", picker("epp"))], [service("epp", 9090)]
    plain = InferencePoolRef(namespace=NS, name="p")
    assert epp_url(plain, pools, services) == "http://127.0.0.1:9090/metrics"
    tls = InferencePoolRef(namespace=NS, name="p", scheme="https")
    assert epp_url(tls, pools, services) == "https://epp.llm.svc:9090/metrics"
    headless = [service("epp", 9090, clusterIP="None")]
    assert epp_url(plain, pools, headless) == "http://epp.llm.svc:9090/metrics"
    # a headless name resolves to the pods: their port is the targetPort
    retargeted = service("epp", 9090, clusterIP="None")
    retargeted["spec"]["ports"][1]["targetPort"] = 19090
    assert epp_url(plain, pools, [retargeted]) == "http://epp.llm.svc:19090/metrics"
    retargeted["spec"]["ports"][1]["targetPort"] = "metrics"
    with pytest.raises(PoolError, match="leads to 'metrics', not a port number"):
        epp_url(plain, pools, [retargeted])
    v6 = [service("epp", 9090, clusterIP="fd00::1")]
    assert epp_url(plain, pools, v6) == "http://[fd00::1]:9090/metrics"
    other = InferencePoolRef(namespace=NS, name="p", metrics_port="grpc-ext-proc")
    assert epp_url(other, pools, services) == "http://127.0.0.1:9002/metrics"
    with pytest.raises(PoolError, match=r"no_metrics_port: .*grpc-ext-proc=9002, http-metrics"):
        epp_url(InferencePoolRef(namespace=NS, name="p", metrics_port="x"), pools, services)


def test_an_object_against_its_schema_is_named_for_what_it_lacks_never_a_crash() -> None:
    """Found by an audit: a pool whose spec was a string raised AttributeError, and its
    cluster was ``internal`` with a traceback in the log; an empty EPP name was looked up as
    the Service "". A real API server's schema stops most of these; the controller does not
    lean on it."""
    ref = InferencePoolRef(namespace=NS, name="p")
    services = [service("epp", 9090)]
    for spec in ("oops", ["x"], {"endpointPickerRef": "epp"}, {"endpointPickerRef": {"name": ""}}):
        broken = {"metadata": {"name": "p"}, "spec": spec}
        with pytest.raises(PoolError, match=r"no_endpoint_picker: .* has no endpointPickerRef"):
            epp_url(ref, [broken], services)
    odd: list[Any] = ["a string", {"metadata": "p"}, pool("p", picker("epp"))]
    odd_services: list[Any] = ["x", *services]
    assert epp_url(ref, odd, odd_services) == "http://127.0.0.1:9090/metrics"
    spec_less = {"metadata": "epp", "spec": "x"}
    with pytest.raises(PoolError, match="no_service"):
        epp_url(ref, [pool("p", picker("epp"))], [spec_less])
    # found by a review: ports that are not a list raised TypeError, a port of True was read
    # as a number, an empty group as the core group, and a name no Service can have went
    # into the URL
    pools = [pool("p", picker("epp"))]
    for ports in (9090, True, "http-metrics", {"name": "http-metrics"}, ["x", 1]):
        odd_ports = service("epp", 9090)
        odd_ports["spec"]["ports"] = ports
        with pytest.raises(PoolError, match="no_metrics_port"):
            epp_url(ref, pools, [odd_ports])
    flagged = service("epp", 9090)
    flagged["spec"]["ports"][1]["port"] = True
    with pytest.raises(PoolError, match="leads to True, not a port number"):
        epp_url(ref, pools, [flagged])
    grouped = {"metadata": {"name": "p"}, "spec": {"endpointPickerRef": {"name": "e", "group": {}}}}
    with pytest.raises(PoolError, match=r"of group \{\}, not a Service"):
        epp_url(ref, [grouped], services)
    evil = "evil.example:443/x?"
    with pytest.raises(PoolError, match="which is no Service's name"):
        epp_url(ref, [pool("p", picker(evil))], [service(evil, 9090)])


def test_a_pool_needs_kubernetes_and_names_the_epp_once() -> None:
    base = {"interval": 1, "scrape": {"timeout": 0.5}}
    ref = {"namespace": NS, "name": "p"}
    with pytest.raises(ConfigError, match=r"clusters\[0\].inference_pool: needs kubernetes"):
        build_settings({**base, "clusters": [{"name": "a", "inference_pool": ref}]})
    # leader election alone brings the Kubernetes client too (app.Controller)
    build_settings(
        {
            **base,
            "leader_election": {"enabled": True},
            "clusters": [{"name": "a", "inference_pool": ref}],
        }
    )
    with pytest.raises(ConfigError, match="not both"):
        build_settings(
            {
                **base,
                "kubernetes": {"enabled": True},
                "clusters": [
                    {"name": "a", "inference_pool": ref, "epp_url": "http://e.llm.svc:9090/"}
                ],
            }
        )
    token = {"epp_bearer_token_file": "/dev/null"}
    with pytest.raises(ConfigError, match="plain http to the EPP Service of InferencePool"):
        build_settings(
            {
                **base,
                "kubernetes": {"enabled": True},
                "clusters": [{"name": "a", "inference_pool": ref, **token}],
            }
        )
    settings = build_settings(
        {
            **base,
            "kubernetes": {"enabled": True},
            "clusters": [
                {
                    "name": "a",
                    "inference_pool": ref,
                    "token_over_cluster_network": True,
                    "pool_name": "other",
                    **token,
                }
            ],
        }
    )
    assert settings.clusters[0].pool_name == "other"  # a name given is kept


async def test_the_attach_role_grants_exactly_what_resolving_a_pool_calls(
    apiserver: FakeAPIServer, api: client.ApiClient, fleet: Fleet
) -> None:
    attach(apiserver, fleet)

    def watching(plural: str) -> bool:
        return any(m == "WATCH" and f"/{plural}" in path for m, path, *_ in apiserver.requests)

    for watch in (True, False):
        async with Controller(settings_of(fleet, watch), serve=False, api=api) as controller:
            await controller.once()
            if watch:  # each informer opens its watch after its LIST, in its own time
                await wait_until(lambda: all(map(watching, (POOLS[2], SERVICES[2]))), 10)
    pool_calls = {
        use: names
        for use, names in uses(apiserver.requests).items()
        if use[1] in (POOLS[2], SERVICES[2])
    }
    rules = granted_by(render("manifests/topologies/llm-d-attach/model-namespace"))
    assert set(pool_calls) == set(rules), (sorted(pool_calls), sorted(rules))


async def test_a_pool_the_api_forbids_is_said_at_once_while_watching(
    apiserver: FakeAPIServer, api: client.ApiClient, fleet: Fleet
) -> None:
    """With watching on, an informer whose first LIST is refused says why at once: the tick
    does not wait out kubernetes.api_timeout (here as long as the interval, which would end
    the fetch as ``timeout`` and hide the cause)."""
    attach(apiserver, fleet)
    apiserver.fail("GET", "inferencepools", 403, times=1000)
    async with Controller(settings_of(fleet, watch=True), serve=False, api=api) as controller:
        report = report_json(await controller.once())
    east = report["clusters"]["east"]
    assert (east["healthy"], east["reason"]) == (False, "discovery")
    assert "forbidden" in east["errors"][0]["detail"]
