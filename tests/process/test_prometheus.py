"""Prometheus both ways, against a real Prometheus on loopback: it scrapes the controller and
simulated vLLM pods; the PromQL source reads the pods back through it; every dashboard and
alert expression runs on it; promtool checks our /metrics and unit-tests the alerts."""

from __future__ import annotations

import asyncio
import itertools
import math
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes_asyncio import client

from controller import health
from controller.app import Controller
from controller.cgroup import memory_limit
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.fakes.pages import LATENCY_BOUNDS
from controller.model import Reason
from controller.render import report_json
from controller.settings import HealthSettings, Settings, build_settings
from controller.sources.prometheus import PrometheusQuerySource, prometheus_source
from controller.sources.scrape import ScrapeSource
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import seed
from tests.support.observability import alert_rules, dashboard_queries
from tests.support.prometheus import Prometheus, binary, job
from tests.support.servers import text_handler

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONTROLLER_JOB = "weight-controller-metrics"

MINUTE = HealthSettings(max_staleness=60)
BRIEF = HealthSettings(max_staleness=0.001)


@dataclass
class Stack:
    sims: Fleet
    controller: Controller
    prometheus: Prometheus
    settings: Settings
    session: aiohttp.ClientSession
    mixed: list[str]  # the page URLs of cluster "mixed" (MIXED_KV), read by no controller


# One pod of three whose KV-cache use is no fraction: averaged in, a 95%-full cluster read 0.33
# through a querier (found by an attack); read directly, that pod is left out by name. Spelled
# as the sims are stored (``vllm_``: test_openmetrics_spelling_is_what_prometheus_stored).
# Two engine processes a pod (vLLM's data parallel: a series each): a pod answers while one
# of its samples is a fraction, as a page read directly does (a review: counted by series, one
# broken pod of three read as two, and the cluster was shed).
MIXED_KV = (("0.95", "0.95"), ("0.95", "NaN"), ("-0.9", "2.5"))


def _mixed_page(kv: tuple[str, ...]) -> str:
    lines = [
        f'vllm_{name}{{engine="{engine}",model_name="m"}} {value}\n'
        for engine, use in enumerate(kv)
        for name, value in (
            ("kv_cache_usage_perc", use),
            ("num_requests_waiting", "0"),
            ("num_requests_running", "1"),
        )
    ]
    return "".join(sorted(lines))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir = tmp_path_factory.mktemp("prometheus")
    api_server = FakeAPIServer()
    await api_server.start()
    seed(api_server, [("east", 34), ("west", 33), ("hot", 33)])
    clusters = [
        SimCluster("east", kv=0.25, noise=0.0),
        SimCluster("west", kv=0.45, noise=0.0, style="v0", pods=1),
        SimCluster("hot", kv=0.93, noise=0.0, with_epp=True),
        SimCluster("broken", kv=0.3, noise=0.0, fault=Fault.HTTP_500),
    ]
    mixed = web.Application()
    for index, kv in enumerate(MIXED_KV):
        mixed.router.add_get(f"/mixed-{index}/metrics", text_handler(_mixed_page(kv)))
    mixed_runner = web.AppRunner(mixed, access_log=None)
    await mixed_runner.setup()
    mixed_site = web.TCPSite(mixed_runner, "127.0.0.1", 0)
    await mixed_site.start()
    mixed_port = mixed_runner.addresses[0][1]
    async with (
        Fleet(clusters) as sims,
        client.ApiClient(client.Configuration(host=api_server.url)) as api,
        aiohttp.ClientSession() as session,
    ):
        settings = build_settings(
            {
                "interval": 0.5,
                "clusters": sims.settings_clusters(),
                "scrape": {"timeout": 0.25, "min_latency_requests": 1},
                "server": {"bind": "127.0.0.1:0"},
                "kubernetes": {"enabled": True, "api_timeout": 1},
            }
        )
        async with Controller(settings, api=api) as controller:
            stop = asyncio.Event()
            loop_task = asyncio.create_task(controller.run(stop))
            jobs = [job(CONTROLLER_JOB, [f"127.0.0.1:{controller.port}"])]
            for sim in sims.clusters.values():
                port = f"127.0.0.1:{sim.port}"
                for index in range(sim.pods):
                    jobs.append(
                        job(
                            f"vllm-{sim.name}-{index}",
                            [port],
                            {"cluster": sim.name},
                            path=f"/pod-{index}/metrics",
                        )
                    )
                if sim.with_epp:
                    jobs.append(
                        job(f"epp-{sim.name}", [port], {"cluster": sim.name}, "/epp/metrics")
                    )
            mixed_at = f"127.0.0.1:{mixed_port}"
            for index in range(len(MIXED_KV)):
                path = f"/mixed-{index}/metrics"
                jobs.append(job(f"vllm-mixed-{index}", [mixed_at], {"cluster": "mixed"}, path))
            async with Prometheus(workdir, jobs, evaluation_interval="1s") as prometheus:
                # enough history for rate() windows and for every panel to have data
                await prometheus.wait_for(f'up{{job="{CONTROLLER_JOB}"}} == 1')
                await prometheus.wait_for(
                    'count(rate({__name__=~"vllm[:_]e2e_request_latency_seconds_count"}[1m]) > 0) >= 3'
                )
                await prometheus.wait_for("weight_controller_applied_weight")
                await prometheus.wait_for(
                    'count({__name__=~"vllm[:_]kv_cache_usage_perc", cluster="mixed"}) == 6'
                )
                await asyncio.sleep(4)
                urls = [f"http://{mixed_at}/mixed-{i}/metrics" for i in range(len(MIXED_KV))]
                yield Stack(sims, controller, prometheus, settings, session, urls)
            stop.set()
            await asyncio.wait_for(loop_task, 5)
    await mixed_runner.cleanup()
    await api_server.stop()


def prometheus_settings(stack: Stack, names: list[str], **queries: str) -> Settings:
    return build_settings(
        {
            "interval": 5,
            "clusters": [
                {
                    "name": n,
                    "prometheus": {
                        "url": stack.prometheus.url,
                        "matchers": {"cluster": n},
                        "push_interval": "1s",  # the test Prometheus scrapes every second
                    },
                }
                for n in names
            ],
            "scrape": {"timeout": 2, "min_latency_requests": 1},
            "prometheus_queries": {"window": "30s", **queries},
        }
    )


def promql_source(stack: Stack, settings: Settings, name: str) -> PrometheusQuerySource:
    cluster = next(c for c in settings.clusters if c.name == name)
    return prometheus_source(cluster, settings.prometheus_queries, settings.scrape, stack.session)


def bucket_of(seconds: float) -> tuple[float, float]:
    bounds = [0.0, *LATENCY_BOUNDS, math.inf]
    for lower, upper in itertools.pairwise(bounds):
        if lower <= seconds <= upper:
            return lower, upper
    raise AssertionError(seconds)


# ---- the PromQL source against the direct scrape ---------------------------------------------


@pytest.mark.parametrize("name", ["east", "west", "hot"])
async def test_promql_source_agrees_with_the_direct_scrape(stack: Stack, name: str) -> None:
    settings = prometheus_settings(stack, [name])
    via_prometheus = await promql_source(stack, settings, name).fetch()
    cluster = next(c for c in stack.settings.clusters if c.name == name)
    direct_source = ScrapeSource(cluster, stack.settings.scrape, 1.0, stack.session)
    await direct_source.fetch()  # a baseline for the between-scrapes latency
    await asyncio.sleep(1.5)
    direct = await direct_source.fetch()
    assert via_prometheus.errors == (), via_prometheus.errors
    assert via_prometheus.kv_mean == pytest.approx(direct.kv_mean)
    assert via_prometheus.kv_max == pytest.approx(direct.kv_max)
    assert via_prometheus.queue_depth == pytest.approx(direct.queue_depth)
    assert via_prometheus.pods_answering == direct.pods_answering
    assert via_prometheus.latency is not None and direct.latency is not None
    for ours, theirs in (
        (via_prometheus.latency.p50, direct.latency.p50),
        (via_prometheus.latency.p90, direct.latency.p90),
    ):
        assert ours is not None and theirs is not None
        lower, upper = bucket_of(theirs)
        assert abs(ours - theirs) <= upper - lower, (ours, theirs)  # within bucket resolution


async def test_openmetrics_spelling_is_what_prometheus_stored(stack: Stack) -> None:
    # Prometheus negotiated OpenMetrics, so the sims (like prometheus-client >= 0.23) answered
    # with vllm_ names; the default queries match both spellings.
    stored = await stack.prometheus.query('count({__name__="vllm_kv_cache_usage_perc"})')
    colon = await stack.prometheus.query('count({__name__="vllm:kv_cache_usage_perc"})')
    assert stored["data"]["result"] and not colon["data"]["result"]


async def test_a_cluster_read_through_prometheus_gets_the_same_weight(stack: Stack) -> None:
    names = ["east", "west", "hot"]
    direct_settings = build_settings(
        {
            "interval": 5,
            "scrape": {"timeout": 2, "min_latency_requests": 1},
            "clusters": [
                c.model_dump(mode="json") for c in stack.settings.clusters if c.name in names
            ],
        }
    )
    async with Controller(direct_settings, serve=False) as direct:
        await direct.once()
        await asyncio.sleep(1.5)
        direct_report = report_json(await direct.once())
    async with Controller(prometheus_settings(stack, names), serve=False) as via:
        via_report = report_json(await via.once())
    for name in names:
        ours, theirs = via_report["clusters"][name], direct_report["clusters"][name]
        assert ours["healthy"] and theirs["healthy"]
        assert ours["vram_utilization"] == pytest.approx(theirs["vram_utilization"])
        # what the pods hold, from vllm:cache_config_info either way
        assert ours["kv_tokens"] == theirs["kv_tokens"] and ours["capacity_from"] == "kv_blocks"
        # latency estimates differ within a bucket, which can move the rounding by a point
        assert abs(ours["weight"] - theirs["weight"]) <= 1, (name, ours, theirs)
    assert direct_report["clusters"]["hot"]["weight"] < direct_report["clusters"]["east"]["weight"]


async def test_a_pod_whose_kv_is_no_fraction_is_left_out_through_prometheus_as_directly(
    stack: Stack,
) -> None:
    via = await promql_source(stack, prometheus_settings(stack, ["mixed"]), "mixed").fetch()
    direct_settings = build_settings({"clusters": [{"name": "mixed", "vllm_urls": stack.mixed}]})
    cluster = direct_settings.clusters[0]
    direct = await ScrapeSource(cluster, direct_settings.scrape, 1.0, stack.session).fetch()
    assert direct.kv_mean == pytest.approx(0.95) and direct.pods_answering == 2, direct
    assert via.kv_mean == pytest.approx(direct.kv_mean)  # not 0.33, the three averaged
    assert via.kv_max == pytest.approx(0.95)
    assert (via.pods_scraped, via.pods_answering) == (3, 2)
    assert via.invalid_samples == 1  # the pod left out (a querier sees no sample of the others)
    (named,) = via.errors
    assert named.reason is Reason.OUT_OF_RANGE and named.url.endswith("(kv_valid_pods)")
    assert named.detail.startswith("1 of 3 pods' KV-cache use is no fraction 0..1")
    assert health.failure_reason(via, MINUTE, via.scraped_at) is None


async def test_promql_failures_map_to_health_reasons(stack: Stack) -> None:
    # PromQL whose shape check-config takes (it is not a parser) and Prometheus refuses
    bad = prometheus_settings(
        stack, ["east"], kv_mean='avgg({__name__="vllm:kv_cache_usage_perc"$selector})'
    )
    broken = await promql_source(stack, bad, "east").fetch()
    assert broken.pods_answering == 0 and broken.errors[0].reason is Reason.HTTP_STATUS
    assert "bad_data" in broken.errors[0].detail

    nothing = await promql_source(stack, prometheus_settings(stack, ["nowhere"]), "nowhere").fetch()
    assert nothing.kv_mean is None  # and says which query came back empty
    assert [(e.reason, e.url.endswith("(kv_mean)")) for e in nothing.errors] == [
        (Reason.MISSING_METRIC, True)
    ]
    assert health.failure_reason(nothing, MINUTE, nothing.scraped_at) is Reason.MISSING_METRIC

    fine = await promql_source(stack, prometheus_settings(stack, ["east"]), "east").fetch()
    assert fine.observed_at is not None
    assert health.failure_reason(fine, MINUTE, fine.scraped_at) is None
    # Prometheus answers with a dead pod's last sample for 5 minutes: its age says stale
    assert health.failure_reason(fine, BRIEF, fine.observed_at + 5) is Reason.STALE

    offline = build_settings(
        {
            "clusters": [{"name": "x", "prometheus": {"url": "http://127.0.0.1:9"}}],
            "scrape": {"timeout": 1},
        }
    )
    unreachable = await promql_source(stack, offline, "x").fetch()
    assert unreachable.errors[0].reason is Reason.CONNECT


# ---- our /metrics, the dashboard and the alerts on a real Prometheus --------------------------


async def test_promtool_finds_no_problem_in_our_metrics(stack: Stack) -> None:
    async with stack.session.get(f"http://127.0.0.1:{stack.controller.port}/metrics") as response:
        text = await response.read()
    check = await asyncio.create_subprocess_exec(
        binary("promtool"),
        "check",
        "metrics",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(check.communicate(text), 60)
    assert check.returncode == 0 and not out.strip() and not err.strip(), (out + err).decode()


def concrete(expr: str) -> str:
    """Grafana's variables as Grafana would fill them for 'All clusters'."""
    return expr.replace("$__rate_interval", "5s").replace("$cluster", ".*").replace("$target", ".*")


@pytest.mark.parametrize(
    ("title", "expr"), dashboard_queries(), ids=[f"{t}:{e[:40]}" for t, e in dashboard_queries()]
)
async def test_every_dashboard_query_returns_data(stack: Stack, title: str, expr: str) -> None:
    if "memory_limit_bytes" in expr and memory_limit() is None:
        # absent where the process runs without a memory limit, as here (test_cgroup.py): the
        # query is valid and empty while the controller's other series are scraped
        await stack.prometheus.wait_for("weight_controller_build_info", seconds=15)
        answer = await stack.prometheus.query(concrete(expr))
        assert answer["status"] == "success" and answer["data"]["result"] == [], answer
        return
    result = await stack.prometheus.wait_for(concrete(expr), seconds=15)
    assert result, title


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
async def test_every_alert_expression_evaluates(stack: Stack, rule: dict[str, Any]) -> None:
    answer = await stack.prometheus.query(rule["expr"])
    assert answer["status"] == "success", answer


async def test_the_tick_saturation_alert_reads_what_the_controller_exports(stack: Stack) -> None:
    """Both sides of WeightControllerTickSaturated exist, from the running controller: its
    configured interval, and a mean tick that is well under it on this small fleet."""
    (interval,) = await stack.prometheus.wait_for("weight_controller_interval_seconds")
    assert float(interval["value"][1]) == stack.settings.interval
    mean = "max by (instance) (rate(weight_controller_reconcile_duration_seconds_sum[5s]) / "
    mean += "rate(weight_controller_reconcile_duration_seconds_count[5s]))"
    (tick,) = await stack.prometheus.wait_for(mean, seconds=30)
    assert 0 < float(tick["value"][1]) < 0.8 * stack.settings.interval


async def test_prometheus_loaded_every_rule_healthy(stack: Stack) -> None:
    answer = await stack.prometheus.get("/api/v1/rules")
    rules = [r for g in answer["data"]["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    assert all(r["health"] == "ok" for r in rules), rules


async def test_the_broken_cluster_shows_as_unhealthy_in_prometheus(stack: Stack) -> None:
    result = await stack.prometheus.wait_for(
        'weight_controller_cluster_unhealthy_reason{cluster="broken", reason="http_status"} == 1'
    )
    assert result[0]["metric"]["cluster"] == "broken"
