"""The scraping ClusterMetricsSource: a cluster's vLLM and EPP /metrics pages, read directly.

All pages of a cluster are fetched concurrently through the one shared ClientSession. A page
that fails becomes a ``PodError``; the cluster's numbers come from the pages that answered.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import aiohttp

from controller import histograms
from controller.errors import ScrapeError, ScrapeParseError, ScrapeTruncatedError
from controller.exposition import MAX_LINE, Extractor, PageStream, Sample
from controller.families import (
    EPP_GAUGES,
    EPP_HISTOGRAMS,
    EPP_KV,
    EPP_LATENCY,
    EPP_QUEUE,
    EPP_READY,
    VLLM_E2E,
    VLLM_GAUGES,
    VLLM_HISTOGRAMS,
    VLLM_KV,
    VLLM_RUNNING,
    VLLM_WAITING,
)
from controller.histograms import Histogram, SeriesKey
from controller.model import ClusterMetrics, Latency, PodError, Reason
from controller.settings import ClusterSettings, ScrapeSettings
from controller.sources.http import ACCEPT_TEXT, Endpoint, TokenFile, get_page, ssl_context

# Preference order matters (controller.families): the first name present on a page wins.
VLLM_EXTRACTOR = Extractor(gauges=VLLM_GAUGES, histograms=VLLM_HISTOGRAMS)
EPP_EXTRACTOR = Extractor(gauges=EPP_GAUGES, histograms=EPP_HISTOGRAMS)

ByName = dict[str, list[Sample]]


@dataclass(frozen=True, slots=True)
class Page:
    url: str
    samples: ByName


def looks_like_exposition(text: str) -> bool:
    """Cheap guard against an HTML error page or other garbage served with status 200."""
    for line in text.split("\n", 50)[:50]:
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            return True
        head = line[0]
        return head.isascii() and (head.isalpha() or head in "_:")
    return True  # an empty page is valid text format; it just has no metrics


async def fetch_page(
    session: aiohttp.ClientSession, endpoint: Endpoint, extractor: Extractor
) -> Page | PodError:
    try:
        stream = await get_page(session, endpoint, ACCEPT_TEXT, PageStream(extractor))
        return _page(endpoint.url, stream)
    except ScrapeError as exc:
        return PodError(url=endpoint.url, reason=exc.reason, detail=exc.detail)


def _kept(samples: Sequence[Sample], keep: Mapping[str, str] | None) -> list[Sample]:
    if not keep:
        return list(samples)
    return [s for s in samples if all(s.labels.get(k) == v for k, v in keep.items())]


def _series(sample: Sample) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(sample.labels.items()))


def _labels_text(series: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in series)


def pod_kv(page: ByName, keep: Mapping[str, str] | None) -> tuple[str | None, list[Sample]]:
    """A pod's KV series: the newer name's, each replaced by the older name's same series
    when its own value is unusable (NaN, out of range) and the older one is good."""
    newer, older = (_kept(page.get(f, ()), keep) for f in VLLM_KV)
    if not newer:
        return (VLLM_KV[1], older) if older else (None, [])
    fallback = {_series(s): s for s in older if valid_fraction(s.value)}
    chosen = [s if valid_fraction(s.value) else fallback.get(_series(s), s) for s in newer]
    return VLLM_KV[0], chosen


def first_family(
    page: ByName, families: Sequence[str], keep: Mapping[str, str] | None
) -> tuple[str, list[Sample]] | None:
    for family in families:
        samples = _kept(page.get(family, ()), keep)
        if samples:
            return family, samples
    return None


def valid_fraction(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 1.0


@dataclass(frozen=True, slots=True)
class Summary:
    """The cluster-level numbers from the pages that answered; ``None`` is unknown."""

    kv_mean: float | None
    kv_max: float | None
    kv_family: str | None
    queue_depth: float | None
    queue_per_pod: float | None
    running: float | None
    observed_at: float | None
    invalid_samples: int


@dataclass(slots=True)
class _KV:
    values: list[float]
    invalid: int = 0
    family: str | None = None
    oldest: float | None = None

    def add(self, family: str, samples: Sequence[Sample]) -> None:
        self.family = self.family or family
        for sample in samples:
            if not valid_fraction(sample.value):
                self.invalid += 1
                continue
            # One series per engine: each is a fraction of its own cache; never summed.
            self.values.append(sample.value)
            if sample.timestamp is not None:
                self.oldest = min(self.oldest or sample.timestamp, sample.timestamp)


class LatencyWindow:
    """Turns successive cumulative histograms into latency over the last scrape interval."""

    def __init__(self, min_requests: float) -> None:
        self._min_requests = min_requests
        self._previous: dict[str, dict[tuple[str, SeriesKey], Histogram]] = {}

    def observe(
        self, family: str, pages: Sequence[tuple[str, dict[SeriesKey, Histogram]]]
    ) -> Latency | None:
        increases: list[Histogram] = []
        for url, series in pages:
            before = self._previous.get(url, {})
            now = {(family, key): histogram for key, histogram in series.items()}
            for key, histogram in now.items():
                if key in before:
                    increases.append(histograms.increase(before[key], histogram))
            self._previous[url] = now  # a page that did not answer keeps its old baseline
        merged = histograms.merge(increases)
        if merged is None:
            return None  # no baseline yet: the first scrape only sets one
        if merged.count < self._min_requests:
            return Latency(None, None, None, requests=merged.count, family=family)
        mean = merged.sum / merged.count if math.isfinite(merged.sum) else None
        return Latency(
            p50=histograms.quantile(0.5, merged),
            p90=histograms.quantile(0.9, merged),
            mean=mean,
            requests=merged.count,
            family=family,
        )


class PageReader:
    """Turns a cluster's answered pages into ClusterMetrics. Holds the latency baseline.

    Split from the HTTP part so that anything holding page texts (the simulator) reads them
    exactly as a scrape does.
    """

    def __init__(self, cluster: ClusterSettings, min_latency_requests: float) -> None:
        self._name = cluster.name
        self._has_pods = bool(cluster.vllm_urls)
        self._model_keep = {"model_name": cluster.model_name} if cluster.model_name else None
        self._pool_keep = {"name": cluster.pool_name} if cluster.pool_name else None
        self._latency = LatencyWindow(min_latency_requests)

    def read(
        self,
        results: Sequence[Page | PodError],
        epp: Page | PodError | None,
        started: float,
        duration: float,
    ) -> ClusterMetrics:
        """``results``: one entry per configured vLLM pod; ``epp``: the EPP's, if configured."""
        if self._has_pods:
            results = [self._check(r) if isinstance(r, Page) else r for r in results]
        pods = [r for r in results if isinstance(r, Page)]
        errors = [r for r in (*results, epp) if isinstance(r, PodError)]
        epp_page = epp if isinstance(epp, Page) else None
        if self._has_pods:
            values = self._from_vllm(pods)
            scraped, answering = len(results), len(pods)
        else:
            values = self._from_epp_pool(epp_page)
            scraped, answering = 1, int(epp_page is not None)
        answered = pods if self._has_pods else ([epp_page] if epp_page else [])
        if answered and values.kv_mean is None:
            # pages came back but none carries KV use: say which names were looked for
            names = " or ".join(VLLM_KV if self._has_pods else EPP_KV)
            scope = (
                f" for {self._model_keep or self._pool_keep}"
                if (self._model_keep or self._pool_keep)
                else ""
            )
            detail = f"no {names} series{scope} on {len(answered)} page(s) that answered"
            errors.append(PodError("*", Reason.MISSING_METRIC, detail))
        latency = self._latency_from(epp_page, pods)
        return ClusterMetrics(
            cluster=self._name,
            scraped_at=started,
            duration=duration,
            pods_scraped=scraped,
            pods_answering=answering,
            kv_mean=values.kv_mean,
            kv_max=values.kv_max,
            kv_family=values.kv_family,
            queue_depth=values.queue_depth,
            queue_per_pod=values.queue_per_pod,
            running=values.running,
            latency=latency,
            observed_at=values.observed_at,
            invalid_samples=values.invalid_samples,
            errors=tuple(errors),
            pages=len(results) + (epp is not None),
            # the increase between two scrapes: what completed since the last one
            completed=latency.requests if latency is not None else None,
        )

    def _from_vllm(self, pods: Sequence[Page]) -> Summary:
        kv = _KV(values=[])
        waiting: list[float] = []
        running: list[float] = []
        for pod in pods:
            family, samples = pod_kv(pod.samples, self._model_keep)
            if family is not None:
                kv.add(family, samples)
            waiting += _pod_total(pod.samples, VLLM_WAITING, self._model_keep)
            running += _pod_total(pod.samples, VLLM_RUNNING, self._model_keep)
        return _summary(kv, waiting, running, per_pod=len(waiting) or None)

    def _check(self, page: Page) -> Page | PodError:
        """A vLLM page whose KV series repeat, or are all out of range, is an error of its
        own: its pod does not count as answering."""
        for family in VLLM_KV:
            samples = _kept(page.samples.get(family, ()), self._model_keep)
            keys = [_series(s) for s in samples]
            if len(set(keys)) != len(keys):
                twice = next(k for k in keys if keys.count(k) > 1)
                detail = f"{family}{{{_labels_text(twice)}}} appears more than once"
                return PodError(page.url, Reason.DUPLICATE_SERIES, detail)
        name, chosen = pod_kv(page.samples, self._model_keep)
        if name is not None and chosen and not any(valid_fraction(s.value) for s in chosen):
            bad = chosen[0]
            hint = " (a percentage? it must be a fraction 0..1)" if 1 < bad.value <= 100 else ""
            detail = f"{name}{{{_labels_text(_series(bad))}}}={bad.value:g} is outside 0..1{hint}"
            return PodError(page.url, Reason.OUT_OF_RANGE, detail)
        return page

    def _from_epp_pool(self, page: Page | None) -> Summary:
        kv = _KV(values=[])
        if page is None:
            return _summary(kv, [], [], per_pod=None)
        found = first_family(page.samples, EPP_KV, self._pool_keep)
        if found is not None:
            kv.add(*found)
        queue = first_family(page.samples, EPP_QUEUE, self._pool_keep)
        ready = _kept(page.samples.get(EPP_READY, []), self._pool_keep)
        averages = [s.value for s in queue[1] if math.isfinite(s.value)] if queue else []
        per_pod = sum(averages) / len(averages) if averages else None
        pods = sum(s.value for s in ready if math.isfinite(s.value)) if ready else None
        depth = per_pod * pods if per_pod is not None and pods is not None else None
        return replace(_summary(kv, [], [], per_pod=None), queue_per_pod=per_pod, queue_depth=depth)

    def _latency_from(self, epp: Page | None, pods: Sequence[Page]) -> Latency | None:
        if epp is not None:
            for family in EPP_LATENCY:
                series = histograms.collect(epp.samples, family, self._model_keep)
                if series:
                    return self._latency.observe(family, [(epp.url, series)])
        pages = [(p.url, histograms.collect(p.samples, VLLM_E2E, self._model_keep)) for p in pods]
        if not any(series for _, series in pages):
            return None
        return self._latency.observe(VLLM_E2E, pages)


def read_page(url: str, text: str, extractor: Extractor) -> Page | PodError:
    """One page's text → its wanted samples, or the PodError a scrape would report."""
    stream = PageStream(extractor)
    stream.feed(text)
    try:
        return _page(url, stream)
    except ScrapeError as exc:
        return PodError(url=url, reason=exc.reason, detail=exc.detail)


def _page(url: str, stream: PageStream) -> Page:
    """What a whole page fed through ``stream`` amounts to, or why it is unusable."""
    if stream.size == 0:
        raise ScrapeTruncatedError(url, "empty body")
    if not looks_like_exposition(stream.head):
        raise ScrapeParseError(url, "not Prometheus text format")
    if stream.long_line:
        raise ScrapeParseError(url, f"a line longer than {MAX_LINE} bytes: not a metrics page")
    if not stream.ended_with_newline:
        # The text format ends every line with a newline: a last line without one was cut,
        # and its value may be a prefix of the real one (``0.`` of ``0.97``).
        raise ScrapeTruncatedError(url, f"no final newline after {stream.size} bytes: cut short")
    found = stream.result
    if found.invalid_lines:
        raise ScrapeParseError(
            url, f"{found.invalid_lines} malformed line(s), first: {found.first_error}"
        )
    return Page(url, found.by_name())


class ScrapeSource:
    """Reads one cluster by scraping its vLLM pods and, if configured, its EPP."""

    def __init__(
        self,
        cluster: ClusterSettings,
        scrape: ScrapeSettings,
        timeout: float,
        session: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
        limiter: asyncio.Semaphore | None = None,
    ) -> None:
        token = TokenFile(cluster.bearer_token_file) if cluster.bearer_token_file else None
        epp_token = (
            TokenFile(cluster.epp_bearer_token_file) if cluster.epp_bearer_token_file else token
        )
        tls = ssl_context(cluster.ca_file, cluster.tls_insecure_skip_verify)

        def endpoint(url: object, credential: TokenFile | None) -> Endpoint:
            return Endpoint(str(url), timeout, scrape.max_body_bytes, credential, tls, limiter)

        self._name = cluster.name
        self._vllm = [endpoint(url, token) for url in cluster.vllm_urls]
        self._epp = endpoint(cluster.epp_url, epp_token) if cluster.epp_url else None
        self._session = session
        self._clock = clock
        self._reader = PageReader(cluster, scrape.min_latency_requests)

    @property
    def cluster(self) -> str:
        return self._name

    async def fetch(self) -> ClusterMetrics:
        started, began = self._clock(), time.perf_counter()
        jobs = [fetch_page(self._session, e, VLLM_EXTRACTOR) for e in self._vllm]
        if self._epp is not None:
            jobs.append(fetch_page(self._session, self._epp, EPP_EXTRACTOR))
        results = await asyncio.gather(*jobs)
        epp = results.pop() if self._epp is not None else None
        return self._reader.read(results, epp, started, time.perf_counter() - began)


def _pod_total(page: ByName, family: str, keep: Mapping[str, str] | None) -> list[float]:
    """A pod's total for an additive gauge (summed over its engines), or nothing if absent."""
    values = [s.value for s in _kept(page.get(family, ()), keep) if math.isfinite(s.value)]
    return [sum(values)] if values else []


def _summary(kv: _KV, waiting: list[float], running: list[float], per_pod: int | None) -> Summary:
    queue = sum(waiting) if waiting else None
    return Summary(
        kv_mean=sum(kv.values) / len(kv.values) if kv.values else None,
        kv_max=max(kv.values) if kv.values else None,
        kv_family=kv.family,
        queue_depth=queue,
        queue_per_pod=queue / per_pod if queue is not None and per_pod else None,
        running=sum(running) if running else None,
        observed_at=kv.oldest,
        invalid_samples=kv.invalid,
    )
