"""Reading a real fleet: a cluster seen only through its EPP, pods found by DNS or
EndpointSlices instead of listed, a token to an in-cluster EPP over plain HTTP, and a URL that
turns out to be several pods behind a load balancer."""

from __future__ import annotations

import asyncio
import itertools
import math
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from controller.app import Controller
from controller.errors import ConfigError
from controller.fakes.clusters import Fleet, SimCluster
from controller.fakes.pages import CumulativeHistogram, vllm_v1_page
from controller.kube.endpoints import SERVICE_LABEL, addresses
from controller.model import Reason, Signals
from controller.render import report_json
from controller.settings import Settings, build_settings
from controller.signals import on_one_basis
from controller.sources import dns
from controller.sources.scrape import ScrapeSource
from controller.testing import VirtualClock
from tests.support.apiserver import FakeAPIServer
from tests.support.dns import DNSServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def settings_for(clusters: list[dict[str, Any]], **extra: Any) -> Settings:
    return build_settings(
        {
            "interval": 1,
            "server": {"bind": "127.0.0.1:0"},
            "clusters": clusters,
            "scrape": {"timeout": 0.5, "min_latency_requests": 1},
            "weights": {"settle": 0},
            **extra,
        }
    )


# ---- the EPP alone --------------------------------------------------------------------------


@pytest.mark.parametrize("generation", ["llm-d", "gie"])
async def test_epp_only_clusters_are_weighed_by_their_ready_endpoints(generation: str) -> None:
    sims = [
        SimCluster(name, kv=0.3, noise=0.0, epp_only=True, ready_endpoints=ready, pods=1)
        for name, ready in (("small", 2), ("large", 8))
    ]
    for sim in sims:
        sim.epp_generation = "gie" if generation == "gie" else "llm-d"
    async with Fleet(sims) as fleet:
        settings = settings_for(fleet.settings_clusters())
        async with Controller(settings, serve=False) as controller:
            report = report_json(await controller.once())
    target = report["targets"]["configured"]
    assert target["mode"] == "initial"
    assert target["applied"] == {"small": 20, "large": 80}
    small = report["clusters"]["small"]
    assert (small["capacity"], small["capacity_from"]) == (2, "ready_endpoints")
    if generation == "llm-d":  # GIE has no average running requests; llm-d-router has
        assert small["running"] == pytest.approx(2 * 8 * 0.3)


async def test_an_epp_with_no_ready_endpoint_is_stale_not_idle() -> None:
    sims = [
        SimCluster("frozen", kv=0.1, epp_only=True, ready_endpoints=0),
        SimCluster("fine", kv=0.5, epp_only=True),
    ]
    async with Fleet(sims) as fleet, Controller(settings_for(fleet.settings_clusters())) as c:
        report = report_json(await c.once())
    frozen = report["clusters"]["frozen"]
    assert frozen["healthy"] is False and frozen["reason"] == "stale"
    assert "frozen" in frozen["errors"][0]["detail"]
    assert report["targets"]["configured"]["applied"] == {"frozen": 0, "fine": 100}


@pytest.mark.parametrize("ready", [10**12, -5])
async def test_an_epp_counting_endpoints_no_cluster_has_is_refused_never_capacity(
    ready: int,
) -> None:
    sims = [
        SimCluster("odd", kv=0.1, epp_only=True, ready_endpoints=ready),
        SimCluster("fine", kv=0.5, epp_only=True),
    ]
    async with Fleet(sims) as fleet, Controller(settings_for(fleet.settings_clusters())) as c:
        report = report_json(await c.once())
    odd = report["clusters"]["odd"]
    assert odd["healthy"] is False and odd["reason"] == "out_of_range"
    assert odd["errors"][0]["detail"].startswith(f"llm_d_epp_ready_endpoints={ready:g}")
    assert report["targets"]["configured"]["applied"] == {"odd": 0, "fine": 100}


async def test_realised_share_counts_the_epps_arrivals() -> None:
    sims = [SimCluster(n, kv=0.2, epp_only=True, seconds_per_scrape=1.0) for n in ("a", "b")]
    async with Fleet(sims) as fleet, Controller(settings_for(fleet.settings_clusters())) as c:
        for _ in range(8):
            report = await c.once()
    view = report.targets["configured"]
    # each EPP counts the requests it scheduled; with equal clusters the split is even
    assert view.realised and abs(view.realised["a"] - 50) < 10, view.realised
    metrics = report.clusters["a"].metrics
    assert metrics is not None and metrics.arrived == pytest.approx(20.0, abs=1)


# ---- tokens inside one cluster --------------------------------------------------------------


def test_a_token_may_reach_an_in_cluster_service_over_http_when_told() -> None:
    def epp(url: str, **flags: Any) -> dict[str, Any]:
        return {"name": "a", "epp_url": url, "epp_bearer_token_file": "/t", **flags}

    with pytest.raises(ConfigError) as refused:
        build_settings({"clusters": [epp("http://epp.llm.svc:9090/metrics")]})
    assert "token_over_cluster_network" in refused.value.lines[0]
    allowed = build_settings(
        {"clusters": [epp("http://epp.llm.svc:9090/metrics", token_over_cluster_network=True)]}
    )
    assert allowed.clusters[0].token_over_cluster_network
    for outside in ("http://epp.example.com:9090/metrics", "http://10.0.0.5:9090/metrics"):
        with pytest.raises(ConfigError, match="plain http to"):
            build_settings({"clusters": [epp(outside, token_over_cluster_network=True)]})


async def test_the_in_cluster_token_is_warned_about_and_exported(tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("t0k3n")
    settings = settings_for(
        [
            {
                "name": "a",
                "epp_url": "http://epp.llm.svc.cluster.local:9090/metrics",
                "epp_bearer_token_file": str(token),
                "token_over_cluster_network": True,
            }
        ]
    )
    with capture_logs() as lines:
        async with Controller(settings, serve=False) as controller:
            gauge = controller.registry.get_sample_value(
                "weight_controller_cluster_insecure", {"cluster": "a", "risk": "token_in_cluster"}
            )
    assert gauge == 1
    warned = [e for e in lines if e["event"] == "bearer token over the cluster network"]
    assert warned and warned[0]["hosts"] == ["epp.llm.svc.cluster.local"]


# ---- pods found, not listed -----------------------------------------------------------------


class Pods:
    """vLLM pages on their own loopback addresses, one port for all (like pod IPs)."""

    def __init__(self) -> None:
        self.port = 0
        self._runners: dict[str, web.AppRunner] = {}

    async def add(self, address: str, kv: float, tls: ssl.SSLContext | None = None) -> None:
        async def page(_: web.Request) -> web.Response:
            text = vllm_v1_page(MODEL, [kv], [0.0], [1.0], [CumulativeHistogram()])
            return web.Response(text=text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", page)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, address, self.port, ssl_context=tls).start()
        self.port = self.port or int(runner.addresses[0][1])
        self._runners[address] = runner

    async def remove(self, address: str) -> None:
        await self._runners.pop(address).cleanup()

    async def stop(self) -> None:
        for runner in self._runners.values():
            await runner.cleanup()


@pytest.fixture
async def pods() -> AsyncIterator[Pods]:
    found = Pods()
    yield found
    await found.stop()


@pytest.fixture
async def nameserver() -> AsyncIterator[DNSServer]:
    server = await DNSServer(ttl=0).start()
    yield server
    server.stop()


async def test_https_pods_dialed_by_address_are_checked_against_the_name_they_are_found_by(
    pods: Pods, nameserver: DNSServer, tmp_path: Path
) -> None:
    """Pods are dialed by address, which their certificates do not name (an OpenShift serving
    certificate names service.namespace.svc): every https pod failed verification. Each is
    checked against the name it was found by, or pods.server_name."""
    name = "vllm-llama.llm.svc"
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    await asyncio.to_thread(
        subprocess.run,
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    await pods.add("127.0.0.2", 0.2, served)
    nameserver.records[name] = ["127.0.0.2"]
    found = {"dns": name, "port": pods.port, "nameserver": nameserver.address, "scheme": "https"}
    settings = settings_for(
        [
            {"name": "by-name", "pods": found, "ca_file": str(cert)},
            {"name": "other", "pods": {**found, "server_name": "b.llm.svc"}, "ca_file": str(cert)},
        ]
    )
    async with aiohttp.ClientSession() as session:
        read = [
            await ScrapeSource(c, settings.scrape, 1.0, session).fetch() for c in settings.clusters
        ]
    assert read[0].errors == () and read[0].kv_mean == pytest.approx(0.2)
    assert read[0].discovered == (f"https://127.0.0.2:{pods.port}/metrics",)
    assert [e.reason for e in read[1].errors] == [Reason.CONNECT], read[1].errors  # refused
    assert "certificate" in read[1].errors[0].detail, read[1].errors


async def test_pods_behind_a_headless_name_come_and_go_without_a_restart(
    pods: Pods, nameserver: DNSServer
) -> None:
    name = "vllm-llama.llm.svc.cluster.local"
    await pods.add("127.0.0.2", 0.2)
    await pods.add("127.0.0.3", 0.4)
    nameserver.records[name] = ["127.0.0.2", "127.0.0.3"]
    discovery = {"dns": name, "port": pods.port, "nameserver": nameserver.address, "refresh": 5}
    settings = settings_for([{"name": "a", "pods": discovery}])
    clock = VirtualClock()
    async with aiohttp.ClientSession() as session:
        source = ScrapeSource(settings.clusters[0], settings.scrape, 1.0, session, monotonic=clock)
        first = await source.fetch()
        assert first.pods_answering == 2 and first.kv_mean == pytest.approx(0.3)
        assert first.discovered == (
            f"http://127.0.0.2:{pods.port}/metrics",
            f"http://127.0.0.3:{pods.port}/metrics",
        )
        # a scale-up: the new pod is read once the name is looked up again
        await pods.add("127.0.0.4", 0.9)
        nameserver.records[name].append("127.0.0.4")
        assert (await source.fetch()).pods_scraped == 2  # not due yet
        clock.now += 5
        grown = await source.fetch()
        assert grown.pods_answering == 3 and grown.kv_mean == pytest.approx(0.5)
        # a scale-down: the pod leaves the record set and is no longer read (nor failing)
        nameserver.records[name] = ["127.0.0.2", "127.0.0.4"]
        await pods.remove("127.0.0.3")
        clock.now += 5
        shrunk = await source.fetch()
        assert shrunk.pods_scraped == 2 and shrunk.errors == ()
        # DNS goes away: the last pods found are still read, and the failure is reported
        nameserver.stop()
        clock.now += 5
        blind = await source.fetch()
    assert blind.pods_answering == 2
    assert [e.reason for e in blind.errors] == [Reason.DISCOVERY]


async def test_a_name_in_another_script_is_asked_for_as_idna_writes_it(
    pods: Pods, nameserver: DNSServer
) -> None:
    """A review: ``bücher.llm.svc`` passed the check (it encodes as IDNA) and the system
    resolver asks for it as ``xn--bcher-kva``, but the nameserver's question was encoded as
    ASCII and raised UnicodeEncodeError out of the fetch on every tick."""
    await pods.add("127.0.0.2", 0.2)
    nameserver.records["xn--bcher-kva.llm.svc"] = ["127.0.0.2"]
    discovery = {"dns": "bücher.llm.svc", "port": pods.port, "nameserver": nameserver.address}
    settings = settings_for([{"name": "a", "pods": discovery}])
    async with aiohttp.ClientSession() as session:
        found = await ScrapeSource(settings.clusters[0], settings.scrape, 1.0, session).fetch()
    assert (found.pods_answering, found.errors) == (1, ())


def test_status_lists_the_pods_discovery_found() -> None:
    from controller.status import render

    found = [f"http://10.0.0.{i}:8000/metrics" for i in range(10)]
    cluster = {
        "vram_utilization": 0.3,
        "vram_utilization_max": 0.3,
        "queue_depth": 0.0,
        "latency_p50_seconds": None,
        "latency_p90_seconds": None,
        "pods_answering": 10,
        "pods_scraped": 10,
        "healthy": True,
        "degraded": False,
        "reason": None,
        "weight": 100,
        "discovered_pods": found,
        "errors": [],
    }
    state = {"ticks": 1, "leader": True, "clusters": {"a": cluster}, "targets": {}}
    table = render(state, now=0)
    assert "a: 10 pods discovered: http://10.0.0.0:8000/metrics" in table
    assert "(+2 more)" in table


async def test_no_record_at_all_is_no_pods(nameserver: DNSServer) -> None:
    discovery = {"dns": "gone.llm.svc", "nameserver": nameserver.address}
    settings = settings_for([{"name": "a", "pods": discovery}])
    async with Controller(settings, serve=False) as controller:
        report = report_json(await controller.once())
    cluster = report["clusters"]["a"]
    assert cluster["healthy"] is False and cluster["reason"] == "no_pods"
    assert cluster["discovered_pods"] == []


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"\x12\x34\x81\x80\x00\x01\x00\x01", "impossible size"),
        (b"\x12\x34\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\x03abc", "runs past"),
        # a compression pointer that points at itself is cut short, never followed for ever
        (b"\x12\x34\x81\x80\x00\x00\x00\x01\x00\x00\x00\x00\xc0\x0c", "cut short"),
        (b"\x12\x34\x81\x82\x00\x00\x00\x00\x00\x00\x00\x00", "error code 2"),
        (b"\x00\x00\x81\x80\x00\x00\x00\x00\x00\x00\x00\x00", "not the answer"),
    ],
)
def test_hostile_dns_answers_are_refused_cleanly(answer: bytes, why: str) -> None:
    with pytest.raises(dns.DNSError, match=why):
        dns.parse_answer(answer, 0x1234, dns.A, 10)


def test_endpoint_slices_give_the_ready_addresses() -> None:
    slices: list[dict[str, Any]] = [
        {
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.3"]},  # no condition: ready
            ],
        },
        {"addressType": "FQDN", "endpoints": [{"addresses": ["x.example"]}]},
    ]
    assert addresses(slices) == ["10.0.0.1", "10.0.0.3"]


async def test_endpoint_slices_answered_with_no_list_keep_the_pods_found_before(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Found by an attack: a LIST of EndpointSlices answered 200 with a proxy's page raised
    AttributeError out of the lookup: the cluster failed as ``internal`` and lost its pods,
    where a failed lookup keeps the last ones and names why (``discovery``)."""
    async with Fleet([SimCluster("east", kv=0.2, noise=0.0, pods=1)]) as fleet:
        ready = {"addresses": ["127.0.0.1"], "conditions": {"ready": True}}
        meta = {"name": "vllm-abc", "namespace": "llm", "labels": {SERVICE_LABEL: "vllm"}}
        apiserver.put_object(
            "discovery.k8s.io/v1",
            "endpointslices",
            {"metadata": meta, "addressType": "IPv4", "endpoints": [ready]},
        )
        slices = {"namespace": "llm", "service": "vllm"}
        pods = {"endpoint_slices": slices, "port": fleet["east"].port, "path": "/pod-0/metrics"}
        settings = settings_for(
            [{"name": "east", "pods": {**pods, "refresh": 1}}],
            kubernetes={"enabled": True, "api_timeout": 1, "watch": False},
        )
        async with Controller(settings, serve=False, api=api) as controller:
            before = report_json(await controller.once())["clusters"]["east"]
            apiserver.fail("GET", "endpointslices", 200, body="<html>502 Bad Gateway</html>")
            await asyncio.sleep(1.05)  # pods.refresh: the next tick looks them up again
            after = report_json(await controller.once())["clusters"]["east"]
    assert before["pods_answering"] == after["pods_answering"] == 1
    assert after["healthy"] is True and after["vram_utilization"] == 0.2
    (error,) = after["errors"]
    assert error["reason"] == "discovery" and "the answer is no List" in error["detail"]


# ---- one URL, one pod -----------------------------------------------------------------------


class RoundRobin:
    """One URL in front of two vLLM pods, as a Service would be: each answer from the next."""

    def __init__(self) -> None:
        self.pods = [(0.92, CumulativeHistogram()), (0.05, CumulativeHistogram())]
        self.pods[0][1].observe(2.0, 1500)  # one has served far more than the other
        self.pods[1][1].observe(1.0, 300)
        self._next = itertools.cycle(range(2))

    async def handle(self, _: web.Request) -> web.Response:
        kv, histogram = self.pods[next(self._next)]
        histogram.observe(1.0, 10)
        text = vllm_v1_page(MODEL, [kv], [0.0], [1.0], [histogram])
        return web.Response(text=text, content_type="text/plain")


async def test_a_load_balanced_url_is_named_within_three_ticks_and_weights_hold() -> None:
    balancer = RoundRobin()
    app = web.Application()
    app.router.add_get("/metrics", balancer.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        async with Fleet([SimCluster("steady", kv=0.3, noise=0.0)]) as fleet:
            clusters = [{"name": "behind-lb", "vllm_urls": [url]}, *fleet.settings_clusters()]
            async with Controller(settings_for(clusters), serve=False) as controller:
                with capture_logs() as lines:
                    reports = [await controller.once() for _ in range(8)]
    finally:
        await runner.cleanup()
    reasons = [
        [e.reason for e in r.clusters["behind-lb"].metrics.errors]  # type: ignore[union-attr]
        for r in reports
    ]
    named = next(i for i, r in enumerate(reasons) if Reason.LOAD_BALANCED in r)
    assert named <= 2, reasons  # within 3 ticks
    assert all(Reason.LOAD_BALANCED in r for r in reasons[named:])  # and it stays named
    said = [e for e in lines if e["event"] == "url serves several processes"]
    assert len(said) == 1 and said[0]["pod"] == url and "came back" in said[0]["detail"]
    # its counters never counted as resets: no completions were made up from the other pod
    for report in reports[: named + 1]:
        metrics = report.clusters["behind-lb"].metrics
        assert metrics is not None
        assert metrics.completed is None or metrics.completed <= 20
    # once named, the weights hold: the lb cluster out, nothing flips back
    weights = [r.targets["configured"].outcome.applied["behind-lb"] for r in reports[named:]]
    assert max(weights[1:], default=0) == 0, weights


async def test_a_restart_is_not_a_load_balancer() -> None:
    histogram = CumulativeHistogram()
    histogram.observe(1.0, 1000)
    state = {"histogram": histogram}

    async def page(_: web.Request) -> web.Response:
        state["histogram"].observe(1.0, 10)
        text = vllm_v1_page(MODEL, [0.3], [0.0], [1.0], [state["histogram"]])
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        settings = settings_for([{"name": "a", "vllm_urls": [url]}])
        async with aiohttp.ClientSession() as session:
            source = ScrapeSource(settings.clusters[0], settings.scrape, 1.0, session)
            seen = [await source.fetch() for _ in range(3)]
            state["histogram"] = CumulativeHistogram()  # the pod restarted: counts from 0
            seen += [await source.fetch() for _ in range(6)]
    finally:
        await runner.cleanup()
    assert all(m.errors == () for m in seen)
    assert [m.completed for m in seen[2:5]] == [10, None, 10]  # the fall is unknown, once


# ---- capacity from what the GPUs hold -------------------------------------------------------


async def test_a_cluster_whose_pods_hold_4x_the_kv_gets_most_of_the_traffic() -> None:
    sims = [
        SimCluster("small", kv=0.4, noise=0.0, pods=2, blocks=2048),
        SimCluster("big", kv=0.4, noise=0.0, pods=2, blocks=4 * 2048),
    ]
    async with (
        Fleet(sims) as fleet,
        Controller(settings_for(fleet.settings_clusters()), serve=False) as c,
    ):
        report = report_json(await c.once())
    target = report["targets"]["configured"]
    assert target["applied"]["big"] >= 65  # 4 × the tokens at equal KV: 80 by capacity
    big = report["clusters"]["big"]
    assert big["capacity_from"] == "kv_blocks" and big["pods"] == 2
    assert big["kv_tokens"] == 2 * 2 * 4 * 2048 * 16  # 2 pods × 2 engines × blocks × 16
    assert target["refs"]["big"]["capacity_from"] == "kv_blocks"


async def test_one_cluster_without_its_kv_pool_is_measured_against_the_others() -> None:
    """#41: a cluster whose pages publish no pool no longer flattens its target to pods: the
    others keep their KV blocks, and its pool is measured from what they say a running
    request holds (here each cluster runs as many at the same KV use: the mean of theirs)."""
    sims = [
        SimCluster("old", kv=0.4, noise=0.0, pods=2, blocks=None),
        SimCluster("big", kv=0.4, noise=0.0, pods=2, blocks=4 * 2048),
        SimCluster("small", kv=0.4, noise=0.0, pods=2, blocks=2048),
    ]
    async with (
        Fleet(sims) as fleet,
        Controller(settings_for(fleet.settings_clusters()), serve=False) as c,
    ):
        report = report_json(await c.once())
    target = report["targets"]["configured"]
    refs = target["refs"]
    assert refs["big"]["capacity_from"] == refs["small"]["capacity_from"] == "kv_blocks"
    assert refs["old"]["capacity_from"] == "measured"
    # at equal KV, by capacity: big 4, old (measured) 2.5, small 1 (of 7.5)
    applied = target["applied"]
    assert applied["big"] > applied["old"] > applied["small"], applied
    assert applied["big"] >= 45 and applied["small"] <= 20, applied
    mean = 2 * 2 * (4 * 2048 + 2048) * 16 // 2  # 2 pods × 2 engines, blocks of 16: 327,680
    (note,) = target["notes"]
    assert note.startswith("capacity where no KV pool is published, against big, small: old:")
    assert f"{mean} tokens measured" in note, note
    assert report["clusters"]["old"]["capacity_from"] == "pods"  # what it knows itself


def test_before_any_load_a_cluster_without_its_pool_counts_as_the_smallest_pod() -> None:
    """Nothing running to measure yet: too little traffic is corrected at the next reading,
    too much overloads first."""
    healthy = {
        "big": Signals(kv=0.3, pods=2, kv_tokens=2 * 8192 * 16, occupied=0.3, running=10),
        "small": Signals(kv=0.3, pods=2, kv_tokens=2 * 2048 * 16, occupied=0.3, running=10),
        "new": Signals(kv=0.0, pods=3, occupied=0.0, running=0.0),
    }
    weighed, note = on_one_basis(healthy)
    assert weighed["new"].capacity == 3 * 2048 * 16
    assert weighed["new"].capacity_from == "learned_per_pod"
    assert weighed["big"] == healthy["big"]
    assert note is not None and "new: pods × 32768 tokens, the smallest pod" in note


async def test_a_configured_pod_size_stands_in_for_a_pool_the_pages_do_not_publish() -> None:
    sims = [
        SimCluster("old", kv=0.4, noise=0.0, pods=2, blocks=None),
        SimCluster("big", kv=0.4, noise=0.0, pods=2, blocks=4 * 2048),
    ]
    async with Fleet(sims) as fleet:
        clusters = fleet.settings_clusters()
        for cluster in clusters:
            if cluster["name"] == "old":
                cluster["kv_tokens_per_pod"] = 2 * 4 * 2048 * 16  # as big's pods hold
        async with Controller(settings_for(clusters), serve=False) as c:
            report = report_json(await c.once())
    target = report["targets"]["configured"]
    assert target["refs"]["old"]["capacity_from"] == "kv_tokens_per_pod"
    assert target["applied"] == {"old": 50, "big": 50}
    assert not any("no KV pool" in note for note in target["notes"])


async def test_an_epp_only_cluster_with_a_known_pod_size_is_weighed_in_tokens() -> None:
    sims = [
        SimCluster("pods", kv=0.3, noise=0.0, pods=2, engines=1, blocks=2048),
        SimCluster("epp", kv=0.3, noise=0.0, epp_only=True, ready_endpoints=2, pods=1),
    ]
    async with Fleet(sims) as fleet:
        clusters = fleet.settings_clusters()
        for cluster in clusters:
            if cluster["name"] == "epp":
                cluster["kv_tokens_per_pod"] = 3 * 2048 * 16
        async with Controller(settings_for(clusters), serve=False) as c:
            report = report_json(await c.once())
    assert report["clusters"]["epp"]["capacity_from"] == "kv_tokens_per_pod"
    assert report["clusters"]["epp"]["kv_tokens"] == 2 * 3 * 2048 * 16
    assert report["targets"]["configured"]["applied"] == {"pods": 25, "epp": 75}


def test_a_cluster_cannot_measure_itself_bigger_than_the_largest_pod_known() -> None:
    """Review of #41: KV use at the floor and 5,000 running made a 1-pod cluster 800M tokens
    and 96% of the traffic. Now at most its pods × the largest pod known."""
    known = {"occupied": 0.5, "running": 40.0, "pods": 4, "kv_tokens": 640_000.0}
    healthy = {
        "a": Signals(kv=0.5, **known),  # type: ignore[arg-type]
        "b": Signals(kv=0.5, **known),  # type: ignore[arg-type]
        "evil": Signals(kv=0.05, pods=1, occupied=0.05, running=5000.0),
    }
    weighed, note = on_one_basis(healthy)
    assert weighed["evil"].capacity == 160_000  # one pod of a or b
    assert note is not None and "(capped: its pods × the largest pod)" in note
    for running in (math.inf, math.nan, -3.0):
        odd = {**healthy, "evil": Signals(kv=0.5, pods=1, occupied=0.5, running=running)}
        assert on_one_basis(odd)[0]["evil"].capacity_from == "learned_per_pod"
