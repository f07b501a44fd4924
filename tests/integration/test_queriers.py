"""A querier shared by many clusters (a hub Thanos): one query per signal per tick for all of
them, split by the cluster label; a failing query fails only what it feeds. Against a loopback
server speaking the Prometheus HTTP API (the real Prometheus is in tests/process)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
from aiohttp import web

from controller.app import Controller
from controller.errors import ConfigError
from controller.render import report_json
from controller.settings import build_settings
from tests.conftest import Serve

CLUSTERS = {"east": 0.2, "west": 0.6, "north": 0.4}
POOLS = {"east": 8192, "west": 2048, "north": 2048}  # each of a cluster's 4 pods: blocks of 16


def pools(blocks: dict[str, int]) -> dict[str, Any]:
    result = [
        {
            "metric": {
                "cluster": c,
                "job": "vllm",
                "instance": f"10.0.0.{pod}:8000",
                "num_gpu_blocks": str(n),
                "block_size": "16",
            },
            "value": [1712345678.5, "1"],
        }
        for c, n in blocks.items()
        for pod in range(4)
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def vector(rows: dict[str, float]) -> dict[str, Any]:
    result = [{"metric": {"cluster": c}, "value": [1712345678.5, str(v)]} for c, v in rows.items()]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def unwrapped(query: str) -> str:
    """A pool query without the cap on its series a cluster (``Querier.per_cluster``)."""
    return re.sub(r"^topk by \(cluster\) \(\d+, ", "", query)


class HubThanos:
    """Answers each template for every cluster it is asked about (``cluster=~"a|b"``),
    grouped by ``cluster``; a query may be made to fail."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.failing: str | None = None

    async def handle(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        self.queries.append(query)
        query = unwrapped(query)
        if self.failing and self.failing in query:
            body = {"status": "error", "errorType": "timeout", "error": "query timed out"}
            return web.json_response(body, status=503)
        grouped = ("by (cluster)", "le, cluster", "block_size, cluster", "replica, cluster")
        assert 'cluster=~"' in query and any(g in query for g in grouped), query
        if query.startswith("min by (cluster) (max_over_time((timestamp("):
            fresh = time.time() - 5  # each cluster's newest sample: a push 5 s ago
            return web.json_response(vector(dict.fromkeys(CLUSTERS, fresh)))
        if "histogram_quantile" in query:
            return web.json_response(vector(dict.fromkeys(CLUSTERS, 1.5)))
        if "increase(" in query:
            return web.json_response(vector(dict.fromkeys(CLUSTERS, 600)))
        if query.startswith(
            "count by (job, instance, ReplicaId, replica, num_gpu_blocks"
        ):  # engines by pod and pool
            return web.json_response(pools(POOLS))
        if query.startswith("count by (cluster)"):
            return web.json_response(vector(dict.fromkeys(CLUSTERS, 4)))
        if query.startswith(
            "sum by (job, instance, ReplicaId, replica, cluster)"
        ):  # no other engine's pools
            return web.json_response(vector({}))
        if "num_requests" in query:
            return web.json_response(vector(dict.fromkeys(CLUSTERS, 2)))
        return web.json_response(vector(CLUSTERS))  # KV mean and max


def hub_settings(url: str) -> Any:
    return build_settings(
        {
            "interval": 10,
            "queriers": [{"name": "hub", "url": url, "push_interval": "30s"}],
            "clusters": [{"name": name, "prometheus": {"querier": "hub"}} for name in CLUSTERS],
            "scrape": {"timeout": 1, "min_latency_requests": 1},
        }
    )


async def test_one_query_per_signal_for_every_cluster_of_a_querier(serve: Serve) -> None:
    hub = HubThanos()
    server = await serve({"/api/v1/query": hub.handle})
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        first = report_json(await controller.once())
        asked = len(hub.queries)
        second = report_json(await controller.once())
    assert asked == 12 and len(hub.queries) == 24  # 12 templates per tick, whatever the fleet
    assert all('cluster=~"east|north|west"' in q for q in hub.queries)
    for name, kv in CLUSTERS.items():
        assert first["clusters"][name]["vram_utilization"] == kv
        assert first["clusters"][name]["pods_answering"] == 4
        assert first["clusters"][name]["kv_tokens"] == 4 * POOLS[name] * 16
        assert first["clusters"][name]["capacity_from"] == "kv_blocks"
        assert second["clusters"][name]["healthy"] is True
    assert second["targets"]["configured"]["applied"]["east"] > 33  # the coolest gets most


async def test_a_failing_query_fails_only_what_it_feeds(serve: Serve) -> None:
    hub = HubThanos()
    hub.failing = "histogram_quantile(0.9"
    server = await serve({"/api/v1/query": hub.handle})
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        report = report_json(await controller.once())
    east = report["clusters"]["east"]
    assert east["healthy"] is True and east["vram_utilization"] == 0.2  # KV is fine
    assert east["latency_p90_seconds"] is None and east["latency_p50_seconds"] == 1.5
    # Prometheus's own query timeout (503, errorType timeout) is a slow querier: a timeout
    assert [e["reason"] for e in east["errors"]] == ["timeout"]
    assert "p90" in east["errors"][0]["url"] and "timed out" in east["errors"][0]["detail"]

    hub.failing = "avg by (cluster)"  # the KV query: without it no cluster can be weighed
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        blind = report_json(await controller.once())
    assert all(c["healthy"] is False for c in blind["clusters"].values())
    assert blind["targets"]["configured"]["mode"] == "no_data"


async def test_a_querier_s_own_query_timeouts_count_as_timeouts_not_failures(
    serve: Serve,
) -> None:
    """Found by an attack: Prometheus answering its --query.timeout (503, errorType timeout)
    read as http_status, and the whole fleet behind a slow hub went unhealthy on the second
    such tick (failures_to_unhealthy) where a timeout waits for timeouts_to_unhealthy."""
    hub = HubThanos()
    server = await serve({"/api/v1/query": hub.handle})
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        await controller.once()
        hub.failing = "avg by (cluster)"  # the KV query
        reports = [report_json(await controller.once()) for _ in range(3)]
    for report in reports:
        east = report["clusters"]["east"]
        assert east["healthy"] is True, east  # held: 3 timeouts of the 5 allowed
        assert {e["reason"] for e in east["errors"]} == {"timeout"}


class FloodingHub(HubThanos):
    """A hub whose pool query answers 25,000 tiny series (~2 MB, under the byte cap), and
    which notes the parameters it is asked with."""

    def __init__(self, keyless: bool = False) -> None:
        super().__init__()
        self.params: list[dict[str, str]] = []
        flood = [{"metric": {"instance": str(i)}, "value": [1.0, "1"]} for i in range(25_000)]
        # and 45,000 series without a "metric" key, or with it escaped: not counted by key
        flood += [{"value": [1.0, "1"]} for _ in range(45_000 if keyless else 0)]
        data = {"resultType": "vector", "result": flood}
        # built once, before the controller's tick: encoded on the loop the tick shares, it
        # cost a busy machine more than the querier's 1 s timeout (a busy-core run failed)
        self.flood = json.dumps({"status": "success", "data": data}).encode()

    async def handle(self, request: web.Request) -> web.Response:
        self.params.append(dict(request.query))
        if unwrapped(request.query["query"]).startswith("count by (job, instance, ReplicaId"):
            return web.Response(body=self.flood, content_type="application/json")
        return await super().handle(request)


@pytest.mark.parametrize("keyless", [False, True], ids=["metric-keys", "and-keyless"])
async def test_an_answer_of_too_many_series_is_refused_before_it_is_parsed(
    serve: Serve, keyless: bool
) -> None:
    """An attack: 10 MB of tiny series under the byte cap took 12-19 s of the event loop a
    tick to parse, and 600-800 MB; the probes failed and another querier's clusters timed
    out. An answer of more series than ``scrape.max_page_samples`` fails its query alone,
    by name. And Thanos is asked never to answer in part (``partial_response=false``)."""
    hub = FloodingHub(keyless)
    server = await serve({"/api/v1/query": hub.handle})
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        report = report_json(await controller.once())
    east = report["clusters"]["east"]
    assert east["healthy"] is True and east["vram_utilization"] == 0.2  # the rest is read
    (error,) = east["errors"]
    assert error["reason"] == "too_many_samples" and "kv_pools" in error["url"]
    series = 47_500 if keyless else 25_000  # two objects a series with its labels, one without
    assert f"~{series} series, more than 20000 (scrape.max_page_samples)" in error["detail"]
    assert all(p.get("partial_response") == "false" for p in hub.params)


class BracedHub(HubThanos):
    """A hub whose pool answer carries a label value of 50,000 '{': one series, not 25,000
    (a tenant's label, in a shared querier's answer for every cluster)."""

    async def handle(self, request: web.Request) -> web.Response:
        if unwrapped(request.query["query"]).startswith("count by (job, instance, ReplicaId"):
            series = [{"metric": {"instance": "{" * 50_000}, "value": [1.0, "1"]}]
            data = {"resultType": "vector", "result": series}
            return web.json_response({"status": "success", "data": data})
        return await super().handle(request)


async def test_braces_in_a_label_value_are_no_series(serve: Serve) -> None:
    """The series cap counts the answer's objects by its '{': a label value of braces read
    as 25,000 series and refused the pool answer of every cluster the querier serves. The
    braces inside strings are counted out when the quick count is over the cap."""
    server = await serve({"/api/v1/query": BracedHub().handle})
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        report = report_json(await controller.once())
    assert all(c["errors"] == [] for c in report["clusters"].values()), report["clusters"]


async def test_pods_that_hang_and_a_slow_querier_never_starve_a_sane_querier(
    serve: Serve,
) -> None:
    """An attack: 32 pods that hang held the page slots of a shared connection pool and a
    slow hub 11 more; a sane querier's queries then waited for a connection until their
    timeout, every tick. PromQL sources have connections of their own."""

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return await HubThanos().handle(request)

    hub = HubThanos()
    pods = await serve({"/hang": hang, "/slow/api/v1/query": slow})
    good = await serve({"/api/v1/query": hub.handle})
    hanging = [pods.url(f"/hang?p={i}") for i in range(8)]
    settings = build_settings(
        {
            "interval": 4,
            "queriers": [
                {"name": "hub", "url": good.url(""), "push_interval": "30s"},
                {"name": "slow", "url": pods.url("/slow"), "push_interval": "30s"},
            ],
            "clusters": [
                *({"name": f"pods{i}", "vllm_urls": hanging} for i in range(2)),
                {"name": "stuck", "prometheus": {"querier": "slow", "cluster": "stuck"}},
                *({"name": n, "prometheus": {"querier": "hub"}} for n in CLUSTERS),
            ],
            "scrape": {"timeout": 1, "max_concurrency": 4, "min_latency_requests": 1},
        }
    )
    async with Controller(settings, serve=False) as controller:
        report = report_json(await controller.once())
    assert all(report["clusters"][n]["errors"] == [] for n in CLUSTERS), report["clusters"]
    assert report["clusters"]["east"]["vram_utilization"] == 0.2
    assert report["clusters"]["pods0"]["healthy"] is False  # its own pods, its own fault


class HostileHub(HubThanos):
    """A hub whose pod counts no cluster can have, and a 3 MB string where one KV value
    belongs (#40: the 1e12 became 96 points of capacity; the string was copied whole into
    every cluster's error and the log)."""

    def __init__(self, huge: bool = False) -> None:
        super().__init__()
        self.pods = {"east": "NaN", "west": "1e12", "north": "-5"}
        self.huge = huge

    async def handle(self, request: web.Request) -> web.Response:
        query = unwrapped(request.query["query"])
        if query.startswith("count by (cluster)"):
            self.queries.append(query)
            rows = [
                {"metric": {"cluster": c}, "value": [1712345678.5, v]} for c, v in self.pods.items()
            ]
            return web.json_response(
                {"status": "success", "data": {"resultType": "vector", "result": rows}}
            )
        if query.startswith(
            "count by (job, instance, ReplicaId, replica, num_gpu_blocks"
        ):  # same GPUs
            self.queries.append(query)
            return web.json_response(pools(dict.fromkeys(CLUSTERS, 2048)))
        if self.huge and query.startswith("max by (cluster)"):  # KV max
            self.queries.append(query)
            rows = [{"metric": {"cluster": "east"}, "value": [1712345678.5, "9" * 3_000_000 + "x"]}]
            return web.json_response(
                {"status": "success", "data": {"resultType": "vector", "result": rows}}
            )
        return await super().handle(request)


async def test_pod_counts_no_cluster_can_have_are_refused_never_capacity(serve: Serve) -> None:
    hub = HostileHub()
    hub_kv = {"east": 0.3, "west": 0.5, "north": 0.7}
    CLUSTERS.update(hub_kv)
    try:
        server = await serve({"/api/v1/query": hub.handle})
        async with Controller(hub_settings(server.url("")), serve=False) as controller:
            await controller.once()
            report = report_json(await controller.once())
    finally:
        CLUSTERS.update({"east": 0.2, "west": 0.6, "north": 0.4})
    applied = report["targets"]["configured"]["applied"]
    assert max(applied.values()) <= 50, applied
    for name in hub_kv:
        details = [
            e["detail"] for e in report["clusters"][name]["errors"] if e["reason"] == "out_of_range"
        ]
        assert len(details) == 1 and details[0].startswith("pods="), report["clusters"][name][
            "errors"
        ]
    assert (
        "more pods than a Kubernetes cluster holds"
        in report["clusters"]["west"]["errors"][0]["detail"]
    )


async def test_a_huge_hostile_answer_costs_a_bounded_log(
    serve: Serve, capfd: pytest.CaptureFixture[str]
) -> None:
    """The daemon's own logging (JSON lines on stdout), after a 3 MB string where a KV value
    belongs: no line over 8 KB, under 64 KB of log for the tick."""
    from controller.logs import configure

    hub = HostileHub(huge=True)
    server = await serve({"/api/v1/query": hub.handle})
    configure("debug", "json")
    capfd.readouterr()
    async with Controller(hub_settings(server.url("")), serve=False) as controller:
        report = report_json(await controller.once())
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert lines and max(map(len, lines)) <= 8 * 1024, max(map(len, lines))
    assert len(out + err) < 64 * 1024, len(out + err)
    (error,) = [e for e in report["clusters"]["east"]["errors"] if "(kv_max)" in e["url"]]
    assert len(error["detail"]) <= 1024 and "more bytes cut" in error["detail"]


def test_a_querier_must_exist_and_its_push_interval_fit_the_staleness() -> None:
    cluster = {"name": "a", "prometheus": {"querier": "hub"}}
    with pytest.raises(ConfigError, match="no querier named 'hub'"):
        build_settings({"clusters": [cluster]})
    acm = {"name": "hub", "url": "https://thanos.example", "push_interval": "5m"}
    with pytest.raises(ConfigError) as stale:
        build_settings({"clusters": [cluster], "queriers": [acm]})
    assert any(
        "health.max_staleness: 60s is shorter than twice queriers[0].push_interval (300s)" in line
        and "at least 600s" in line
        for line in stale.value.lines
    ), stale.value.lines
    fits = build_settings(
        {"clusters": [cluster], "queriers": [acm], "health": {"max_staleness": "10m"}}
    )
    assert fits.queriers[0].push_interval == 300
    with pytest.raises(ConfigError, match="matchers, credentials"):
        build_settings(
            {"clusters": [{"name": "a", "prometheus": {"querier": "hub", "matchers": {}}}]}
        )
