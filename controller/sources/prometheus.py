"""The PromQL ClusterMetricsSource: clusters' signals from a Prometheus or Thanos Querier.

Used where the controller cannot reach a cluster's pods. A ``Querier`` sends each template of
``Settings.prometheus_queries`` once per tick, for every cluster it holds: grouped by its
cluster label (``$by``) and split here, so a hub Thanos holding 200 clusters answers the same
twelve queries as one holding two. Every cluster read through it awaits the same answers. A
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
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from yarl import URL

from controller.errors import (
    FetchConnectError,
    FetchError,
    FetchForbiddenAddressError,
    FetchHTTPStatusError,
    FetchParseError,
    FetchTimeoutError,
    FetchTooLargeError,
    FetchTooManySamplesError,
    FetchTruncatedError,
)
from controller.model import ClusterMetrics
from controller.settings import ClusterSettings, PrometheusQueries, ScrapeSettings
from controller.settings import Querier as QuerierSettings
from controller.settings.durations import seconds
from controller.settings.queries import quoted, render
from controller.sources.answers import (
    NAMES,
    POOL_PODS,
    POOL_SERIES,
    Answers,
    Asked,
    Pool,
    Series,
    cluster_metrics,
    counted,
    pool_of,
    pooled,
    split,
    vectors,
)
from controller.sources.http import Endpoint, TokenFile, get_text, snippet, ssl_context

ACCEPT_JSON = "application/json"
# Prometheus refuses a range query of more than 11,000 steps ("exceeded maximum resolution of
# 11,000 points per timeseries", prometheus/prometheus web/api/v1/api.go, queryRange): a
# history is read in chunks of at most this many steps.
MAX_STEPS = 11_000
# A range read is history, not a tick: it may take as long as the server lets a query run
# (Prometheus's --query.timeout, 2m by default: cmd/prometheus/main.go), never the live
# per-query timeout (a week of 20 clusters read nothing at 3 s: found by an attack). A few at
# once per querier, and one that failed on the way (a timeout, a 5xx, a reset) is asked
# again after a pause: one 503 cost a whole chunk, 30 hours of a 10 s replay.
RANGE_TIMEOUT = 120.0
RANGE_AT_ONCE = 4
RANGE_RETRIES = (0.5, 2.0)  # the pauses before the second and third try
_T = TypeVar("_T")


def _passing(error: FetchError) -> bool:
    """A failure another try may not meet: a timeout, a connection lost or refused (a
    restarting server), a body cut short, a 5xx. Not a 4xx (the query is wrong), nor an
    answer too large (read in halves instead)."""
    if isinstance(error, FetchTimeoutError | FetchTruncatedError):
        return True
    if isinstance(error, FetchConnectError):
        return not isinstance(error, FetchForbiddenAddressError)
    return isinstance(error, FetchHTTPStatusError) and error.detail.startswith("HTTP 5")


def selector(matchers: Mapping[str, str]) -> str:
    """``{cluster: "b"}`` → ``,cluster="b"``: appended inside a template's ``{…}``."""
    return "".join(f",{name}={quoted(value)}" for name, value in sorted(matchers.items()))


def one_of(label: str, values: Sequence[str]) -> str:
    """``,cluster=~"a|b"``: any of ``values`` (RE2, fully anchored by PromQL)."""
    pattern = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", v) for v in sorted(values))
    return f",{label}=~{quoted(pattern)}"


@dataclass(frozen=True, slots=True)
class Windows:
    """How far back a querier's gauges and rates look, from how often its samples arrive."""

    window: str
    lookback: str
    resolution: str  # a subquery's over the lookback: 8 steps, a quarter push interval apart

    @classmethod
    def of(cls, queries: PrometheusQueries, push_interval: float) -> Windows:
        configured = seconds(queries.window) or 60.0  # settings refuse 0
        rate = max(configured, 4 * push_interval)
        lookback, resolution = 2 * push_interval, push_interval / 4
        return cls(promql_duration(rate), promql_duration(lookback), promql_duration(resolution))


def promql_duration(value: float) -> str:
    """Seconds as PromQL writes a duration: whole units only (``model.ParseDuration``'s
    ``[0-9]+(ms|s|…)``), so ``2.5`` is ``2500ms`` and ``1.2e6`` is ``1200000s`` (``2.5s`` and
    ``1.2e+06s``, as ``:g`` wrote them, are a 400 on every query); at least ``1ms``."""
    ms = max(1, round(value * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


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
    spans = (w.window, w.lookback, w.resolution)
    built = {name: render(getattr(queries, name), selected, by, *spans) for name in NAMES}
    for label, q in (("p50", "0.5"), ("p90", "0.9")):
        built[label] = render(queries.latency_quantile, selected, by, *spans, quantile=q)
    return built


def answer_series(body: str, url: str) -> list[tuple[dict[str, str], float]]:
    """An instant query's answer: (labels, value) per series (one, unlabelled, for a scalar)."""
    data = _data(body, url)
    result: Any = data.get("result")
    try:
        if data.get("resultType") == "scalar":
            return [({}, _value(result[1]))]
        if data.get("resultType") == "vector":
            return [
                ({str(k): str(v) for k, v in (item.get("metric") or {}).items()}, _value(value[1]))
                for item in result
                for value in [item["value"]]
            ]
    except _MALFORMED as exc:
        raise FetchParseError(url, f"malformed result: {exc}") from exc
    raise FetchParseError(url, f"unexpected result type {data.get('resultType')!r}")


# What reading a query's answer raises where the answer is not the API's shape; a number
# past a float's range written as a JSON integer (10^400) is one (OverflowError), found by an
# attack that failed a shared querier's every cluster as ``internal`` with it.
_MALFORMED = (TypeError, KeyError, IndexError, ValueError, AttributeError, OverflowError)


def _value(text: Any) -> float:
    """A sample's value as the query API writes it, a string ("0.5", "NaN", "+Inf"): a JSON
    ``true`` read as 1.0 where a KV use is read (found by an attack), so anything else is
    malformed."""
    if not isinstance(text, str):
        raise TypeError(f"a value that is not a string: {text!r}")
    if "_" in text:  # Python's float() reads "0_9" as 9.0; Go's ParseFloat, no number
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _data(body: str, url: str) -> dict[str, Any]:
    """The ``data`` of a query API answer that says ``success``."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSON nested past the parser's depth too
        raise FetchParseError(url, f"not JSON: {exc}") from exc
    if not isinstance(answer, dict) or answer.get("status") != "success":
        kind = answer.get("errorType", "?") if isinstance(answer, dict) else "?"
        error = answer.get("error", body[:200]) if isinstance(answer, dict) else body[:200]
        detail = f"query failed ({snippet(str(kind), 40)}): {snippet(str(error))}"
        if kind == "timeout":  # the querier's own query timeout: slow, as ours would be
            raise FetchTimeoutError(url, detail)
        raise FetchHTTPStatusError(url, detail)
    data = answer.get("data") or {}
    if not isinstance(data, dict):
        raise FetchParseError(url, "malformed answer: data is not an object")
    return data


def steps(start: float, end: float, step: float) -> list[float]:
    """A range query's step times from ``start`` to ``end``: the multiples of ``step`` in
    the window, to the ms. Prometheus keeps time in whole milliseconds: a start or step finer
    than that would leave its answers' times and these apart, and every step unread; and a
    query frontend before the querier (Thanos's, Cortex's and Mimir's ``step_align``
    middleware, on by default: thanos-io/thanos#3353, ``--query-range.align-range-with-step``)
    moves a start between multiples down to one, so the answers' times were none of ours."""
    each = round(step * 1000)  # in whole ms, as Prometheus counts: a float's ceil at 1.7e9 s
    first = -(-round(start * 1000) // each) * each  # dropped a start on a multiple (a review)
    last = round(end * 1000)
    return [(first + i * each) / 1000 for i in range(max(0, (last - first) // each + 1))]


def matrix_series(body: str, url: str) -> dict[float, list[tuple[dict[str, str], float]]]:
    """A range query's answer as each step's series, by the step's time (to the ms, as
    Prometheus writes it)."""
    found: dict[float, list[tuple[dict[str, str], float]]] = {}
    try:
        for item in _matrix(body, url):
            labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
            for when, value in item["values"]:
                found.setdefault(round(float(when), 3), []).append((labels, _value(value)))
    except _MALFORMED as exc:
        raise FetchParseError(url, f"malformed result: {exc}") from exc
    return found


def _matrix(body: str, url: str) -> list[Any]:
    data = _data(body, url)
    if data.get("resultType") != "matrix":
        raise FetchParseError(url, f"unexpected result type {data.get('resultType')!r}")
    result = data.get("result") or []
    if not isinstance(result, list):
        raise FetchParseError(url, "malformed result: not a list")
    return result


def range_answers(
    name: str, body: str, times: Sequence[float], label: str, url: str
) -> dict[float, Answers]:
    """Query ``name``'s range answer at each of ``times``, as ``split`` reads its instant
    answer at that time (a time without a series: an empty answer). Most queries are one
    number a cluster: read straight into each time's numbers by the value of ``label``, the
    first finite one of each kept (``vectors``), without a list of series per time between;
    the pool queries, which read labels, go through ``split``. A week of 20 clusters is
    ~13 million numbers: this is most of replay's reading."""
    if name == "kv_pools":
        return _range_pools(body, times, label, url)
    if name == "kv_tokens":
        series = matrix_series(body, url)
        return {t: split(name, series.get(round(t, 3), []), label) for t in times}
    finite = name != "pods"  # a pod count NaN or infinite is refused by name (``_checked``)
    found: dict[float, dict[str, float]] = {}  # by the step's time, to the ms
    stamps: dict[Any, dict[str, float]] = {}  # the same, by the time as written
    try:
        for item in _matrix(body, url):
            metric = item.get("metric") or {}
            if not isinstance(metric, dict):
                raise FetchParseError(url, "malformed result: a series' metric is not an object")
            key = str(metric.get(label, "")) if label else ""
            for when, text in item["values"]:
                at = stamps.get(when)
                if at is None:
                    at = stamps[when] = found.setdefault(round(float(when), 3), {})
                value = _value(text)
                if finite and not math.isfinite(value):
                    continue
                if key not in at:
                    at[key] = value
    except _MALFORMED as exc:
        raise FetchParseError(url, f"malformed result: {exc}") from exc
    return {t: {name: found.get(round(t, 3), {})} for t in times}


def _range_pools(body: str, times: Sequence[float], label: str, url: str) -> dict[float, Answers]:
    """``range_answers`` for ``kv_pools``: each series' pool read off its labels once
    (``pool_of``), then each time's series pooled as ``split`` pools them, once for each set of
    series and values: a pool's engines change when it scales, not each step (a week of 20
    clusters of four pods pooled at every step was most of its reading)."""
    pools: list[Pool] = []
    at: dict[float, tuple[list[int], list[float]]] = {}  # by the step's time, to the ms
    stamps: dict[Any, tuple[list[int], list[float]]] = {}  # the same, by the time as written
    try:
        for item in _matrix(body, url):
            index = len(pools)
            pools.append(
                pool_of({str(k): str(v) for k, v in (item.get("metric") or {}).items()}, label)
            )
            for when, value in item["values"]:
                series = stamps.get(when)
                if series is None:
                    series = stamps[when] = at.setdefault(round(float(when), 3), ([], []))
                series[0].append(index)
                series[1].append(_value(value))
    except _MALFORMED as exc:
        raise FetchParseError(url, f"malformed result: {exc}") from exc
    done: dict[tuple[tuple[int, ...], tuple[float, ...]], tuple[dict[str, float], ...]] = {}
    found: dict[float, Answers] = {}
    for t in times:
        indices, values = at.get(round(t, 3), ((), ()))
        key = (tuple(indices), tuple(values))  # a NaN never equals itself: pooled afresh
        known = done.get(key)
        if known is None:
            known = done[key] = pooled(
                [(pools[i], v) for i, v in zip(indices, values, strict=True)]
            )
        tokens, pods = known
        by_cluster = counted(pools[i][0] for i in indices)  # as ``split`` counts them
        # each time its own
        found[t] = {"kv_pools": dict(tokens), POOL_PODS: dict(pods), POOL_SERIES: by_cluster}
    return found


def scalar(body: str, url: str) -> float | None:
    """The single value of an instant query's answer; ``None`` when the result is empty."""
    values = vectors(answer_series(body, url), "")
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
        self._ranges = asyncio.Semaphore(RANGE_AT_ONCE)

    def hold(self, value: str) -> None:
        """Read the cluster whose label has ``value`` through this querier."""
        self._clusters.add(value)

    @property
    def per_cluster(self) -> int | None:
        """How many pool series (one a pod) each cluster may answer: an even share of
        ``scrape.max_page_samples`` among the clusters of this querier. One cluster of 25,000
        pool series had the whole answer refused, every cluster's pool with it (found by an
        attack); now its own pool is cut (``topk``) and refused by name, the others' kept."""
        limit = self._endpoint.max_samples
        if limit is None:
            return None
        return max(1, limit // max(1, len(self._clusters))) if self.label else limit

    @property
    def queries(self) -> dict[str, str]:
        clusters = one_of(self.label, sorted(self._clusters)) if self.label else ""
        built = queries_for(self._queries, self._matchers, self.label or "", self.windows, clusters)
        cut = self.per_cluster
        if cut is not None:
            by = f"topk by ({self.label}) " if self.label else "topk "
            for name in ("kv_pools", "kv_tokens"):
                built[name] = f"{by}({cut}, {built[name]})"
        return built

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
            if isinstance(answer, FetchError):
                result[name] = answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                try:
                    result.update(self._parse(name, answer))
                except FetchError as exc:
                    result[name] = exc
        return result

    def _parse(self, name: str, body: str) -> Answers:
        return split(name, answer_series(body, self.base), self.label or "")

    async def history(
        self, start: float, end: float, step: float, max_steps: int = MAX_STEPS
    ) -> dict[float, Answers]:
        """Every query's answers at ``start``, ``start + step``, … up to ``end``: what an
        instant query would have answered at each of those times (a range query evaluates
        each step as one, lookback and rate windows included), read in chunks of at most
        ``max_steps`` steps. A chunk a query could not read leaves that query's error at each
        of the chunk's times; a time without a series is an empty answer: never a value."""
        step = round(step, 3)
        times = steps(start, end, step)
        found: dict[float, Answers] = {t: {} for t in times}
        built = self.queries
        label, url = self.label or "", self.base + "_range"
        for first in range(0, len(times), max_steps):
            chunk = times[first : first + max_steps]
            asked = [
                self._range_read(q, chunk, step, partial(range_answers, name, label=label, url=url))
                for name, q in built.items()
            ]
            reads = await asyncio.gather(*asked)
            for name, read in zip(built, reads, strict=True):
                for t in chunk:
                    answer = read[t]
                    if isinstance(answer, FetchError):
                        found[t][name] = answer
                    else:
                        found[t].update(answer)
        return found

    async def _range_read(
        self,
        promql: str,
        chunk: Sequence[float],
        step: float,
        read: Callable[[str, Sequence[float]], Mapping[float, _T]],
    ) -> dict[float, _T | FetchError]:
        """``promql`` over ``chunk``, each time's answer as ``read`` gives it, or the error
        that chunk was refused with at each of its times. An answer past the body cap
        (``scrape.max_body_bytes``) is asked again in halves: the steps the server allows
        fitted 11,000 points a series, not the bytes of 40 clusters' (found by an attack:
        a 30-hour window of an ordinary fleet answered 13 MB, and replay read none of it)."""
        try:
            body = await self._ask_range(promql, chunk[0], chunk[-1], step)
            return dict(read(body, chunk))
        except FetchTooLargeError as exc:
            if len(chunk) < 2:
                return dict.fromkeys(chunk, exc)
            half = len(chunk) // 2
            early = await self._range_read(promql, chunk[:half], step, read)
            return {**early, **await self._range_read(promql, chunk[half:], step, read)}
        except FetchError as exc:
            return dict.fromkeys(chunk, exc)

    async def series_over(
        self, promql: str, start: float, end: float, step: float, max_steps: int = MAX_STEPS
    ) -> dict[float, Series | FetchError]:
        """Any ``promql``'s series at each step of the window, read in ``history``'s chunks: a
        chunk that could not be read is its error at each of its times."""
        step = round(step, 3)
        times = steps(start, end, step)
        found: dict[float, Series | FetchError] = {}
        url = self.base + "_range"

        def read(body: str, chunk: Sequence[float]) -> dict[float, Series]:
            series = matrix_series(body, url)
            return {t: series.get(round(t, 3), []) for t in chunk}

        for first in range(0, len(times), max_steps):
            chunk = times[first : first + max_steps]
            found.update(await self._range_read(promql, chunk, step, read))
        return found

    async def _ask_range(self, promql: str, start: float, end: float, step: float) -> str:
        self.sent += 1
        query = {
            "query": promql,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step:.3f}",
            **_WHOLE,
        }
        url = str(URL(self.base + "_range").with_query(query))
        timeout = max(self._endpoint.timeout, RANGE_TIMEOUT)
        endpoint = replace(self._endpoint, url=url, timeout=timeout)
        for pause in RANGE_RETRIES:
            try:
                async with self._ranges:
                    return await self._get(endpoint)
            except FetchError as exc:
                if not _passing(exc):
                    raise
            await asyncio.sleep(pause)
        async with self._ranges:  # the last try
            return await self._get(endpoint)

    async def _ask(self, promql: str) -> str:
        self.sent += 1
        url = str(URL(self.base).with_query({"query": promql, **_WHOLE}))
        return await self._get(replace(self._endpoint, url=url))

    async def _get(self, endpoint: Endpoint) -> str:
        """An answer's body, refused before it is parsed when it holds more series than
        ``scrape.max_page_samples`` (``endpoint.max_samples``): 10 MB of tiny series, under
        the byte cap, took 12-19 s of the event loop a tick to parse and 600-800 MB (found
        by an attack: the probes failed, and every other querier's clusters timed out)."""
        try:
            body = await get_text(self._session, endpoint, ACCEPT_JSON)
        except FetchHTTPStatusError as exc:
            # Prometheus answers its own --query.timeout with a 503 and errorType timeout
            # (web/api/v1: errorTimeout): a slow querier, counted as timeouts are
            # (health.timeouts_to_unhealthy), not a failing one (found by an attack)
            if _TIMED_OUT.search(exc.detail):
                raise FetchTimeoutError(exc.url, exc.detail) from exc
            raise
        limit = endpoint.max_samples
        # Every series is a JSON object, and JSON writes every object with a '{' no escape
        # can hide (a count of "metric" keys was dodged by \u006detric, or no key at all: a
        # review); a series of labels is two of them, an answer's frame two more. A '{' in a
        # label value is no object: counted only when the quick count is over the cap (one
        # tenant's label of braces refused every cluster's answer of a shared querier).
        if limit is not None and body.count("{") > 2 * limit + 2:
            objects = _objects(body)
            if objects > 2 * limit + 2:
                detail = (
                    f"~{(objects - 2) // 2} series, more than {limit} (scrape.max_page_samples)"
                )
                raise FetchTooManySamplesError(endpoint.url.partition("?")[0], detail)
        return body


# A JSON string (escapes and all) or a lone escape (inside a string left open): what is left
# once they are taken out is the answer's structure. Linear: an unclosed string is scanned once.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|\\.')


def _objects(body: str) -> int:
    """The JSON objects in ``body``: its '{' outside strings (9 MB of series: ~0.25 s)."""
    return _STRINGS.sub("", body).count("{")


_TIMED_OUT = re.compile(r'"errorType"\s*:\s*"timeout"')


# Thanos answers with what the stores it reached hold, and says so only in a warning, unless
# asked not to (``partial_response``; Prometheus ignores the parameter): half a cluster's pods
# read as the cluster whole (found by an attack). A store down is then a failed query, named.
_WHOLE = {"partial_response": "false"}


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
    endpoint = Endpoint(
        url, timeout, scrape.max_body_bytes, token, tls, None, scrape.max_page_samples
    )
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

    def asked(self) -> Asked:
        """Whom this cluster's answers come from (``answers.cluster_metrics``)."""
        q = self._querier
        window = seconds(q.windows.window) or 60.0
        return Asked(
            q.base, q.label, self._value, q.queries, window, self._min_requests, q.per_cluster
        )

    async def fetch(self) -> ClusterMetrics:
        started, began = self._clock(), time.perf_counter()
        answers = await self._querier.answers(self._value)
        duration = time.perf_counter() - began
        since, self._previous = self._previous, started
        return cluster_metrics(self._name, answers, self.asked(), started, duration, since)
