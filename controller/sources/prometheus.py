"""The PromQL ClusterMetricsSource: a cluster's signals from a Prometheus or Thanos Querier.

Used where the controller cannot reach a cluster's pods. Each signal is one instant query
(``/api/v1/query``) built from the templates in ``Settings.prometheus_queries``; all of a
cluster's queries run concurrently. An empty result is unknown, never 0; ``status: error``,
4xx/5xx, timeouts and unreachable servers become the same health reasons as a failed scrape.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from string import Template
from typing import Any

import aiohttp
from yarl import URL

from controller.errors import ScrapeError, ScrapeHTTPStatusError, ScrapeParseError
from controller.model import ClusterMetrics, Latency, PodError
from controller.settings import (
    ClusterSettings,
    PrometheusQueries,
    PrometheusSource,
    ScrapeSettings,
)
from controller.settings.durations import seconds
from controller.sources.http import Endpoint, TokenFile, get_text, ssl_context

ACCEPT_JSON = "application/json"
REQUIRED = ("kv_mean",)  # without it the cluster cannot be weighed


def selector(matchers: Mapping[str, str]) -> str:
    """``{cluster: "b"}`` → ``,cluster="b"``: appended inside a template's ``{…}``."""
    return "".join(f',{name}="{_escape(value)}"' for name, value in sorted(matchers.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(template: str, matchers: Mapping[str, str], window: str, **extra: str) -> str:
    return Template(template).substitute(selector=selector(matchers), window=window, **extra)


def queries_for(queries: PrometheusQueries, matchers: Mapping[str, str]) -> dict[str, str]:
    """Every query one fetch sends, by name."""
    w = queries.window
    built = {
        name: render(getattr(queries, name), matchers, w)
        for name in ("kv_mean", "kv_max", "kv_oldest", "pods", "queue", "running")
    }
    built["latency_requests"] = render(queries.latency_requests, matchers, w)
    for label, q in (("p50", "0.5"), ("p90", "0.9")):
        built[label] = render(queries.latency_quantile, matchers, w, quantile=q)
    return built


def scalar(body: str, url: str) -> float | None:
    """The single value of an instant query's answer; ``None`` when the result is empty."""
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise ScrapeParseError(url, f"not JSON: {exc}") from exc
    if not isinstance(answer, dict) or answer.get("status") != "success":
        kind = answer.get("errorType", "?") if isinstance(answer, dict) else "?"
        error = answer.get("error", body[:200]) if isinstance(answer, dict) else body[:200]
        raise ScrapeHTTPStatusError(url, f"query failed ({kind}): {error}")
    data = answer.get("data") or {}
    result: Any = data.get("result")
    try:
        if data.get("resultType") == "scalar":
            value = float(result[1])
        elif data.get("resultType") == "vector":
            if not result:
                return None
            value = float(result[0]["value"][1])
        else:
            raise ScrapeParseError(url, f"unexpected result type {data.get('resultType')!r}")
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise ScrapeParseError(url, f"malformed result: {exc}") from exc
    return value if math.isfinite(value) else None


class PrometheusQuerySource:
    """Reads one cluster through the Prometheus HTTP API."""

    def __init__(
        self,
        cluster: ClusterSettings,
        prometheus: PrometheusSource,
        queries: PrometheusQueries,
        scrape: ScrapeSettings,
        session: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._name = cluster.name
        self._base = str(prometheus.url).rstrip("/") + "/api/v1/query"
        token = TokenFile(prometheus.bearer_token_file) if prometheus.bearer_token_file else None
        self._endpoint = Endpoint(
            self._base,
            prometheus.timeout or scrape.timeout,
            scrape.max_body_bytes,
            token,
            ssl_context(prometheus.ca_file, prometheus.tls_insecure_skip_verify),
        )
        self._queries = queries_for(queries, prometheus.matchers)
        self._window = seconds(queries.window) or 60.0  # the pattern admits "0m": never 0
        self._min_requests = scrape.min_latency_requests
        self._session = session
        self._clock = clock
        self._previous: float | None = None  # when the last fetch started

    @property
    def cluster(self) -> str:
        return self._name

    @property
    def queries(self) -> Mapping[str, str]:
        return self._queries

    async def query(self, promql: str) -> float | None:
        endpoint = replace(self._endpoint, url=str(URL(self._base).with_query(query=promql)))
        return scalar(await get_text(self._session, endpoint, ACCEPT_JSON), self._base)

    async def fetch(self) -> ClusterMetrics:
        started, began = self._clock(), time.perf_counter()
        names = list(self._queries)
        answers = await asyncio.gather(
            *(self.query(self._queries[n]) for n in names), return_exceptions=True
        )
        values: dict[str, float | None] = {}
        errors: list[PodError] = []
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, ScrapeError):
                errors.append(PodError(f"{self._base} ({name})", answer.reason, answer.detail))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                values[name] = answer
        duration = time.perf_counter() - began
        since, self._previous = self._previous, started
        if any(name in REQUIRED for name in names if name not in values):
            failed = tuple(errors[:1])
            return ClusterMetrics(
                self._name, started, duration, 1, 0, errors=failed, pages=len(names)
            )
        metrics = self._metrics(values, started, duration, tuple(errors))
        return replace(metrics, pages=len(names), completed=self._completed(values, since, started))

    def _completed(
        self, values: Mapping[str, float | None], since: float | None, now: float
    ) -> float | None:
        """Requests completed since the previous fetch, from the rate window's increase: the
        window's count scaled to the time since then (a fetch reads a whole window, so two
        fetches a tick apart share most of it). Unknown on the first fetch."""
        requests = values.get("latency_requests")
        if requests is None or since is None:
            return None
        return requests * min(max(0.0, now - since), self._window) / self._window

    def _metrics(
        self,
        v: Mapping[str, float | None],
        started: float,
        duration: float,
        errors: tuple[PodError, ...],
    ) -> ClusterMetrics:
        pods = int(v.get("pods") or 0)
        kv = v.get("kv_mean")
        if kv is not None and not 0.0 <= kv <= 1.0:
            kv = None  # an out-of-range fraction is unusable, as in a direct scrape
        queue = v.get("queue")
        return ClusterMetrics(
            cluster=self._name,
            scraped_at=started,
            duration=duration,
            pods_scraped=max(1, pods),
            pods_answering=max(1, pods),
            kv_mean=kv,
            kv_max=v.get("kv_max") if kv is not None else None,
            kv_family="promql" if kv is not None else None,
            queue_depth=queue,
            queue_per_pod=queue / pods if queue is not None and pods else None,
            running=v.get("running"),
            latency=self._latency(v),
            observed_at=v.get("kv_oldest"),
            invalid_samples=0,
            errors=errors,
        )

    def _latency(self, v: Mapping[str, float | None]) -> Latency | None:
        requests = v.get("latency_requests")
        if requests is None:
            return None
        if requests < self._min_requests:
            return Latency(None, None, None, requests=requests, family="promql")
        return Latency(v.get("p50"), v.get("p90"), None, requests=requests, family="promql")
