"""The PromQL source's handling of the Prometheus HTTP API's answers, good and bad, served by a
loopback server speaking the API's JSON (the real Prometheus is in test_prometheus.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from controller.errors import FetchHTTPStatusError, FetchParseError
from controller.model import Reason
from controller.settings import build_settings
from controller.sources.prometheus import (
    PrometheusQuerySource,
    Windows,
    prometheus_source,
    queries_for,
    scalar,
    selector,
)
from tests.support.servers import Handler, Server

Serve = Callable[[dict[str, Handler]], Awaitable[Server]]


def vector(value: str | None) -> dict[str, Any]:
    result = [] if value is None else [{"metric": {}, "value": [1712345678.5, value]}]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def source(url: str, session: aiohttp.ClientSession, timeout: str = "1s") -> PrometheusQuerySource:
    settings = build_settings(
        {
            "clusters": [
                {
                    "name": "b",
                    "prometheus": {"url": url, "matchers": {"cluster": "b"}, "timeout": timeout},
                }
            ]
        }
    )
    return prometheus_source(
        settings.clusters[0], settings.prometheus_queries, settings.scrape, session
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (vector("0.42"), 0.42),
        (vector(None), None),
        (vector("NaN"), None),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}}, 3.0),
    ],
)
def test_scalar_answers(body: dict[str, Any], expected: float | None) -> None:
    assert scalar(json.dumps(body), "u") == expected


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("not json", FetchParseError),
        (
            json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}),
            FetchHTTPStatusError,
        ),
        (
            json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}),
            FetchParseError,
        ),
        (
            json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": [{"value": []}]}}
            ),
            FetchParseError,
        ),
    ],
)
def test_bad_answers_are_errors(body: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        scalar(body, "u")


def test_selector_and_templates() -> None:
    assert selector({"cluster": "b", "ns": 'a"b'}) == ',cluster="b",ns="a\\"b"'
    assert selector({}) == ""
    settings = build_settings({"clusters": [{"name": "x", "epp_url": "http://127.0.0.1/"}]})
    queries = settings.prometheus_queries
    built = queries_for(queries, {"cluster": "b"}, windows=Windows.of(queries, 15.0))
    assert 'vllm:kv_cache_usage_perc",cluster="b"}[30s]' in built["kv_mean"]  # 2 pushes
    assert 'vllm_kv_cache_usage_perc",cluster="b"}[30s]' in built["kv_mean"]  # both spellings
    assert "histogram_quantile(0.9," in built["p90"] and "[60s]" in built["p90"]  # the 1m
    assert "$" not in "".join(built.values())
    # samples that arrive every 5 minutes: gauges over 10, rates over 20 (two samples at least)
    slow = queries_for(queries, {}, windows=Windows.of(queries, 300.0))
    assert "[600s]" in slow["kv_mean"] and "[1200s]" in slow["p90"]


async def test_answers_become_cluster_metrics(serve: Serve, session: aiohttp.ClientSession) -> None:
    answers = {  # the first needle a query holds answers it (pods counts KV series too)
        "count by (job, instance": "3",
        'kv_cache_usage_perc"': "0.5",
        "num_requests_waiting": "6",
        "histogram_quantile(0.9": "1.5",
        "histogram_quantile(0.5": "0.7",
        "increase(": "40",
    }
    seen: list[str] = []

    async def api(request: web.Request) -> web.Response:
        query = request.query["query"]
        seen.append(query)
        if query.startswith("min by () (max_over_time((timestamp("):
            return web.json_response(vector("1712345678.5"))
        for needle, value in answers.items():
            if needle in query and not query.startswith("max by"):
                return web.json_response(vector(value))
        return web.json_response(vector("0.9" if query.startswith("max by") else None))

    server = await serve({"/api/v1/query": api})
    metrics = await source(server.url(""), session).fetch()
    assert metrics.errors == ()
    assert (metrics.kv_mean, metrics.kv_max, metrics.queue_depth) == (0.5, 0.9, 6.0)
    assert metrics.pods_answering == 3 and metrics.queue_per_pod == 2.0
    assert metrics.observed_at == 1712345678.5
    assert metrics.latency is not None and (metrics.latency.p50, metrics.latency.p90) == (0.7, 1.5)
    assert all('cluster="b"' in q for q in seen)


async def test_a_slow_prometheus_is_a_timeout(serve: Serve, session: aiohttp.ClientSession) -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(vector("0.5"))

    server = await serve({"/api/v1/query": slow})
    metrics = await source(server.url(""), session, timeout="200ms").fetch()
    assert metrics.pods_answering == 0
    assert [e.reason for e in metrics.errors] == [Reason.TIMEOUT]


async def test_a_failing_optional_query_keeps_the_cluster_usable(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    async def api(request: web.Request) -> web.Response:
        if "histogram_quantile" in request.query["query"]:
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "boom"}, status=422
            )
        return web.json_response(vector("0.3"))

    server = await serve({"/api/v1/query": api})
    metrics = await source(server.url(""), session).fetch()
    assert metrics.kv_mean == 0.3 and metrics.pods_answering >= 1
    assert {e.reason for e in metrics.errors} == {Reason.HTTP_STATUS}
    assert "boom" in metrics.errors[0].detail
