"""The PromQL ClusterMetricsSource: clusters' signals from a Prometheus or Thanos Querier.

Used where the controller cannot reach a cluster's pods. A ``Querier`` sends each template of
``Settings.prometheus_queries`` once per tick, for every cluster it holds: grouped by its
cluster label (``$by``) and split here, so a hub Thanos holding 200 clusters answers the same
ten queries as one holding two. Every cluster read through it awaits the same answers. A
cluster with a querier of its own (``prometheus.url``) is the same with one cluster and no
grouping. An empty result is unknown, never 0; ``status: error``, 4xx/5xx, timeouts and
unreachable servers become the usual health reasons, and one failing query fails only what it
feeds (a latency query that fails leaves latency unknown, not the cluster).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from controller.errors import ScrapeError, ScrapeHTTPStatusError, ScrapeParseError
from controller.model import CapacityFrom, ClusterMetrics, Latency, PodError, Reason
from controller.settings import ClusterSettings, PrometheusQueries, ScrapeSettings
from controller.settings import Querier as QuerierSettings
from controller.settings.durations import seconds
from controller.settings.queries import render
from controller.sources import kv_tokens_problem, pod_count_problem
from controller.sources.http import Endpoint, TokenFile, get_text, ssl_context

ACCEPT_JSON = "application/json"
REQUIRED = ("kv_mean",)  # without it a cluster cannot be weighed
NAMES = (
    "kv_mean",
    "kv_max",
    "kv_oldest",
    "pods",
    "kv_pools",
    "kv_tokens",
    "queue",
    "running",
    "latency_requests",
)
# Not queries: the pods kv_pools and kv_tokens found a pool on.
POOL_PODS = "kv_pool_pods"
TOKEN_PODS = "kv_token_pods"
Answers = dict[str, dict[str, float] | ScrapeError]  # query → {cluster label value: value}


def selector(matchers: Mapping[str, str]) -> str:
    """``{cluster: "b"}`` → ``,cluster="b"``: appended inside a template's ``{…}``."""
    return "".join(f',{name}="{_escape(value)}"' for name, value in sorted(matchers.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def one_of(label: str, values: Sequence[str]) -> str:
    """``,cluster=~"a|b"``: any of ``values`` (RE2, fully anchored by PromQL)."""
    pattern = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", v) for v in sorted(values))
    return f',{label}=~"{_escape(pattern)}"'


@dataclass(frozen=True, slots=True)
class Windows:
    """How far back a querier's gauges and rates look, from how often its samples arrive."""

    window: str
    lookback: str

    @classmethod
    def of(cls, queries: PrometheusQueries, push_interval: float) -> Windows:
        configured = seconds(queries.window) or 60.0  # the pattern admits "0m": never 0
        rate = max(configured, 4 * push_interval)
        return cls(f"{rate:g}s", f"{2 * push_interval:g}s")


def queries_for(
    queries: PrometheusQueries,
    matchers: Mapping[str, str],
    by: str = "",
    windows: Windows | None = None,
    clusters: str = "",
) -> dict[str, str]:
    """Every query one fetch sends, by name. ``clusters``: a matcher of the clusters asked
    for (``one_of``), grouped by ``by``."""
    w = windows or Windows.of(queries, 30.0)
    selected = clusters + selector(matchers)
    built = {
        name: render(getattr(queries, name), selected, by, w.window, w.lookback) for name in NAMES
    }
    for label, q in (("p50", "0.5"), ("p90", "0.9")):
        built[label] = render(
            queries.latency_quantile, selected, by, w.window, w.lookback, quantile=q
        )
    return built


def vectors(body: str, url: str, label: str, finite: bool = True) -> dict[str, float]:
    """An instant query's answer by the value of ``label`` (``""`` when it is not grouped);
    NaN and infinities are unknown, so left out (``finite=False``: kept, for a check that
    names them)."""
    found: dict[str, float] = {}
    for metric, value in answer_series(body, url):
        key = str(metric.get(label, "")) if label else ""
        if not finite or math.isfinite(value):
            found.setdefault(key, value)
    return found


_POOL_LABELS = frozenset(("num_gpu_blocks", "block_size"))


def pools(body: str, url: str, label: str) -> tuple[dict[str, float], dict[str, float]]:
    """The ``kv_pools`` answer (engines by pod and KV pool) as KV tokens and pods with a
    pool, by the value of ``label``; a series whose pool labels are not whole numbers > 0
    leaves its cluster out (unknown, never a guess)."""
    tokens: dict[str, float] = {}
    pods: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    broken: set[str] = set()
    for metric, engines in answer_series(body, url):
        key = str(metric.get(label, "")) if label else ""
        try:
            blocks, size = int(metric["num_gpu_blocks"]), int(metric["block_size"])
        except (KeyError, ValueError):
            broken.add(key)
            continue
        if blocks <= 0 or size <= 0 or not math.isfinite(engines) or engines <= 0:
            broken.add(key)
            continue
        tokens[key] = tokens.get(key, 0.0) + engines * blocks * size
        # a pod (or a replica of a Ray node's): every label but the pool's
        pod = tuple(sorted((k, str(v)) for k, v in metric.items() if k not in _POOL_LABELS))
        pods.setdefault(key, set()).add(pod)
    return (
        {k: v for k, v in tokens.items() if k not in broken},
        {k: float(len(v)) for k, v in pods.items() if k not in broken},
    )


def pod_tokens(body: str, url: str, label: str) -> tuple[dict[str, float], dict[str, float]]:
    """The ``kv_tokens`` answer (tokens by pod) as KV tokens and pods with a pool, by the
    value of ``label``; a pod whose pool is not a positive number leaves its cluster out."""
    tokens: dict[str, float] = {}
    pods: dict[str, float] = {}
    broken: set[str] = set()
    for metric, value in answer_series(body, url):
        key = str(metric.get(label, "")) if label else ""
        if not math.isfinite(value) or value <= 0:
            broken.add(key)
            continue
        tokens[key] = tokens.get(key, 0.0) + value
        pods[key] = pods.get(key, 0.0) + 1
    return (
        {k: v for k, v in tokens.items() if k not in broken},
        {k: v for k, v in pods.items() if k not in broken},
    )


def answer_series(body: str, url: str) -> list[tuple[dict[str, str], float]]:
    """An instant query's answer: (labels, value) per series (one, unlabelled, for a scalar)."""
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
            return [({}, float(result[1]))]
        if data.get("resultType") == "vector":
            return [
                ({str(k): str(v) for k, v in (item.get("metric") or {}).items()}, float(value[1]))
                for item in result
                for value in [item["value"]]
            ]
    except (TypeError, KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ScrapeParseError(url, f"malformed result: {exc}") from exc
    raise ScrapeParseError(url, f"unexpected result type {data.get('resultType')!r}")


def scalar(body: str, url: str) -> float | None:
    """The single value of an instant query's answer; ``None`` when the result is empty."""
    values = vectors(body, url, "")
    return next(iter(values.values()), None)


class Querier:
    """One Prometheus or Thanos querier, and the clusters read through it. Every query is
    sent once per round, and a round's answers are shared by every cluster that asks for
    them: a cluster asking again (the next tick) starts the next round."""

    def __init__(
        self,
        base: str,
        endpoint: Endpoint,
        queries: PrometheusQueries,
        matchers: Mapping[str, str],
        push_interval: float,
        label: str | None,
        session: aiohttp.ClientSession,
    ) -> None:
        self.base = base.rstrip("/") + "/api/v1/query"
        self._endpoint = endpoint
        self._queries = queries
        self._matchers = dict(matchers)
        self.windows = Windows.of(queries, push_interval)
        self.label = label
        self._session = session
        self._clusters: set[str] = set()
        self._round: asyncio.Task[Answers] | None = None
        self._asked: set[str] = set()  # the clusters that had this round's answers
        self.sent = 0  # queries sent, for benchmarks and tests

    def hold(self, value: str) -> None:
        """Read the cluster whose label has ``value`` through this querier."""
        self._clusters.add(value)

    @property
    def queries(self) -> dict[str, str]:
        clusters = one_of(self.label, sorted(self._clusters)) if self.label else ""
        return queries_for(self._queries, self._matchers, self.label or "", self.windows, clusters)

    async def answers(self, value: str) -> Answers:
        """This round's answers for the cluster ``value`` (waiting for them if they are
        still coming; a cancelled wait leaves the round to the others)."""
        if self._round is None or value in self._asked:
            self._round, self._asked = asyncio.ensure_future(self._ask_all()), set()
        self._asked.add(value)
        return await asyncio.shield(self._round)

    async def _ask_all(self) -> Answers:
        built = self.queries
        answers = await asyncio.gather(
            *(self._ask(q) for q in built.values()), return_exceptions=True
        )
        result: Answers = {}
        for name, answer in zip(built, answers, strict=True):
            if isinstance(answer, ScrapeError):
                result[name] = answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                try:
                    result.update(self._parse(name, answer))
                except ScrapeError as exc:
                    result[name] = exc
        return result

    def _parse(self, name: str, body: str) -> Answers:
        label = self.label or ""
        if name == "kv_pools":
            tokens, pods = pools(body, self.base, label)
            return {name: tokens, POOL_PODS: pods}
        if name == "kv_tokens":
            tokens, pods = pod_tokens(body, self.base, label)
            return {name: tokens, TOKEN_PODS: pods}
        # a pod count NaN or infinite is refused by name (PrometheusQuerySource._checked)
        return {name: vectors(body, self.base, label, finite=name != "pods")}

    async def _ask(self, promql: str) -> str:
        self.sent += 1
        endpoint = replace(self._endpoint, url=str(URL(self.base).with_query(query=promql)))
        return await get_text(self._session, endpoint, ACCEPT_JSON)


def make_querier(
    url: str,
    token_file: Path | None,
    ca_file: Path | None,
    insecure: bool,
    timeout: float,
    queries: PrometheusQueries,
    matchers: Mapping[str, str],
    push_interval: float,
    label: str | None,
    scrape: ScrapeSettings,
    session: aiohttp.ClientSession,
) -> Querier:
    token = TokenFile(token_file) if token_file is not None else None
    tls = ssl_context(ca_file, insecure)
    endpoint = Endpoint(url, timeout, scrape.max_body_bytes, token, tls)
    return Querier(url, endpoint, queries, matchers, push_interval, label, session)


def shared_queriers(
    queriers: Sequence[QuerierSettings],
    queries: PrometheusQueries,
    scrape: ScrapeSettings,
    session: aiohttp.ClientSession,
) -> dict[str, Querier]:
    """The configured queriers (``Settings.queriers``), by name."""
    return {
        q.name: make_querier(
            str(q.url),
            q.bearer_token_file,
            q.ca_file,
            q.tls_insecure_skip_verify,
            q.timeout or scrape.timeout,
            queries,
            q.matchers,
            q.push_interval,
            q.cluster_label,
            scrape,
            session,
        )
        for q in queriers
    }


def prometheus_source(
    cluster: ClusterSettings,
    queries: PrometheusQueries,
    scrape: ScrapeSettings,
    session: aiohttp.ClientSession,
    shared: Mapping[str, Querier] | None = None,
    clock: Callable[[], float] = time.time,
) -> PrometheusQuerySource:
    """The source of a cluster read through Prometheus: through its shared querier, or one
    of its own (``prometheus.url``)."""
    p = cluster.prometheus
    assert p is not None, "a cluster read through Prometheus"
    if p.querier is not None:
        querier = (shared or {})[p.querier]
        return PrometheusQuerySource(cluster, querier, p.cluster or cluster.name, scrape, clock)
    assert p.url is not None
    own = make_querier(
        str(p.url),
        p.bearer_token_file,
        p.ca_file,
        p.tls_insecure_skip_verify,
        p.timeout or scrape.timeout,
        queries,
        p.matchers,
        p.push_interval,
        None,
        scrape,
        session,
    )
    return PrometheusQuerySource(cluster, own, "", scrape, clock)


class PrometheusQuerySource:
    """Reads one cluster's signals from the answers of its querier."""

    def __init__(
        self,
        cluster: ClusterSettings,
        querier: Querier,
        value: str,
        scrape: ScrapeSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._name = cluster.name
        self._querier = querier
        self._value = value
        self._min_requests = scrape.min_latency_requests
        self._clock = clock
        self._previous: float | None = None  # when the last fetch started
        querier.hold(value)

    @property
    def cluster(self) -> str:
        return self._name

    @property
    def queries(self) -> Mapping[str, str]:
        return self._querier.queries

    @property
    def querier(self) -> Querier:
        return self._querier

    async def fetch(self) -> ClusterMetrics:
        started, began = self._clock(), time.perf_counter()
        answers = await self._querier.answers(self._value)
        values: dict[str, float | None] = {}
        errors: list[PodError] = []
        for name, answer in answers.items():
            if isinstance(answer, ScrapeError):
                url = f"{self._querier.base} ({name})"
                # a querier that refuses is down, which says nothing of the cluster
                reason = Reason.CONNECT if answer.reason is Reason.REFUSED else answer.reason
                errors.append(PodError(url, reason, answer.detail))
            else:
                values[name] = answer.get(self._value)
        duration = time.perf_counter() - began
        since, self._previous = self._previous, started
        pages = sum(1 for name in answers if name not in (POOL_PODS, TOKEN_PODS))
        if any(name not in values for name in REQUIRED):
            failed = tuple(errors[:1])
            return ClusterMetrics(self._name, started, duration, 1, 0, errors=failed, pages=pages)
        values, refused = self._checked(values)
        if values.get("kv_mean") is None:
            refused.append(self._empty("kv_mean"))
        metrics = self._metrics(values, started, duration, (*errors, *refused))
        return replace(metrics, pages=pages, completed=self._completed(values, since, started))

    def _completed(
        self, values: Mapping[str, float | None], since: float | None, now: float
    ) -> float | None:
        """Requests completed since the previous fetch, from the rate window's increase: the
        window's count scaled to the time since then (a fetch reads a whole window, so two
        fetches a tick apart share most of it). Unknown on the first fetch."""
        requests = values.get("latency_requests")
        window = seconds(self._querier.windows.window) or 60.0
        if requests is None or since is None:
            return None
        return requests * min(max(0.0, now - since), window) / window

    def _empty(self, name: str) -> PodError:
        """The query that answered nothing for this cluster, named with its start, so an
        operator can run it: a cluster the querier holds no such series for (its label
        value, its engine's names, the matchers)."""
        who = f"{self._querier.label}={self._value!r}" if self._querier.label else "this querier"
        query = self._querier.queries[name]
        shown = query if len(query) <= 300 else query[:299] + "…"
        detail = f"{name} came back empty for {who}: no KV-cache series of any engine; {shown}"
        return PodError(f"{self._querier.base} ({name})", Reason.MISSING_METRIC, detail)

    def _checked(
        self, values: dict[str, float | None]
    ) -> tuple[dict[str, float | None], list[PodError]]:
        """Pod counts and KV-pool sizes no cluster can have (NaN, negative, 1e12) are refused
        by name and read as unknown, never as capacity."""
        refused = []
        pods = values.get("pods")
        if pods is not None and (why := pod_count_problem(pods, "pods")):
            refused.append(PodError(f"{self._querier.base} (pods)", Reason.OUT_OF_RANGE, why))
            values = {**values, "pods": None}
        for name, counted in (("kv_pools", POOL_PODS), ("kv_tokens", TOKEN_PODS)):
            tokens, pool_pods = values.get(name), values.get(counted) or 0.0
            if tokens is not None and (why := kv_tokens_problem(tokens, pool_pods, name)):
                refused.append(PodError(f"{self._querier.base} ({name})", Reason.OUT_OF_RANGE, why))
                values = {**values, name: None, counted: None}
        return values, refused

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
        # every pod reporting KV says what it holds (by vLLM's labels or another engine's
        # gauges), or the capacity stays in pods
        pooled = (v.get(POOL_PODS) or 0) + (v.get(TOKEN_PODS) or 0)
        sizes = [t for t in (v.get("kv_pools"), v.get("kv_tokens")) if t is not None]
        tokens = sum(sizes) if sizes and pooled >= max(1, pods) else None
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
            kv_tokens=tokens,
            kv_tokens_from=CapacityFrom.KV_BLOCKS if tokens is not None else None,
        )

    def _latency(self, v: Mapping[str, float | None]) -> Latency | None:
        requests = v.get("latency_requests")
        if requests is None:
            return None
        if requests < self._min_requests:
            return Latency(None, None, None, requests=requests, family="promql")
        return Latency(v.get("p50"), v.get("p90"), None, requests=requests, family="promql")
