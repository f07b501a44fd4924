"""The scraping ClusterMetricsSource: a cluster's vLLM and EPP /metrics pages, read directly.

All pages of a cluster are fetched concurrently through the one shared ClientSession. A page
that fails becomes a ``PodError``; the cluster's numbers come from the pages that answered
(``reader.PageReader``, the pure part the simulator shares).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace

import aiohttp

from controller.engines import ENGINES, Engine
from controller.errors import FetchError
from controller.exposition import PageStream
from controller.model import ClusterMetrics, PodError
from controller.settings import ClusterSettings, ScrapeSettings
from controller.sources.discovery import PodFinder, PoolFinder, PoolLookup, SliceLister
from controller.sources.http import ACCEPT_TEXT, Endpoint, TokenFile, get_page, ssl_context
from controller.sources.limiter import Limiter, ranked
from controller.sources.page import EPP_EXTRACTOR, Page, page_of
from controller.sources.reader import PageReader


async def fetch_page(
    session: aiohttp.ClientSession, endpoint: Endpoint, stream: PageStream
) -> Page | PodError:
    """One page read into ``stream``, or the PodError saying why it could not be."""
    try:
        await get_page(session, endpoint, ACCEPT_TEXT, stream)
        return page_of(endpoint.url, stream)
    except FetchError as exc:
        return PodError(url=endpoint.url, reason=exc.reason, detail=exc.detail)


@dataclass(slots=True)
class _Round:
    answer: asyncio.Future[Page | PodError]
    asked: set[str] = field(default_factory=set)
    waiting: int = 0  # clusters awaiting it now
    finished: float | None = None  # when it was answered (the clock's)
    forget: asyncio.TimerHandle | None = None


class SharedPages:
    """A page several clusters read is fetched once a round: a Ray node holding replicas of
    several models (one cluster per model), an EPP serving several pools. Every cluster that
    asks for it within a round shares the answer (as ``prometheus.Querier`` shares a round's
    queries): while it is in flight, and for the page's timeout after it was answered (a
    tick's clusters ask within moments of each other, ticks are an interval apart), when it
    is forgotten. A cluster asking again starts the next round. A round whose every waiter
    left (cancelled at its tick's deadline) is cancelled with them, never left to run into
    the next tick; ``close`` cancels what is in flight. Only pages read the same way for
    everyone are shared (``PageStream.alike``), with the same credentials and limits (the
    key)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rounds: dict[Hashable, _Round] = {}
        self.fetched = 0  # rounds begun: for tests and benchmarks

    async def read(
        self,
        key: Hashable,
        cluster: str,
        fresh_for: float,
        fetch: Callable[[], Awaitable[Page | PodError]],
    ) -> Page | PodError:
        round_ = self._rounds.get(key)
        if round_ is None or cluster in round_.asked or not self._shareable(round_, fresh_for):
            round_ = self._begin(key, fresh_for, fetch)
        round_.asked.add(cluster)
        round_.waiting += 1
        try:
            # a cluster cancelled at its deadline leaves the round to the others
            return await asyncio.shield(round_.answer)
        finally:
            round_.waiting -= 1
            if round_.waiting == 0 and not round_.answer.done():
                round_.answer.cancel()  # nobody is left to read it

    def _shareable(self, round_: _Round, fresh_for: float) -> bool:
        if not round_.answer.done():
            return True
        if round_.answer.cancelled() or round_.finished is None:
            return False
        return self._clock() - round_.finished <= fresh_for

    def _begin(
        self, key: Hashable, fresh_for: float, fetch: Callable[[], Awaitable[Page | PodError]]
    ) -> _Round:
        round_ = _Round(asyncio.ensure_future(fetch()))
        self._rounds[key] = round_
        self.fetched += 1

        def answered(_: object) -> None:
            round_.finished = self._clock()
            loop = asyncio.get_running_loop()
            round_.forget = loop.call_later(fresh_for, self._forget, key, round_)

        round_.answer.add_done_callback(answered)
        return round_

    def _forget(self, key: Hashable, round_: _Round) -> None:
        # the handle's arguments hold the round: let go of it, or the round, its task and its
        # page live on as a reference cycle until a full collection, a tick's pages at a time
        round_.forget = None
        if self._rounds.get(key) is round_:
            del self._rounds[key]

    async def close(self) -> None:
        """Cancel the rounds in flight and forget every round (before the session closes)."""
        rounds, self._rounds = list(self._rounds.values()), {}
        for round_ in rounds:
            round_.answer.cancel()
            if round_.forget is not None:
                round_.forget.cancel()
        await asyncio.gather(*(r.answer for r in rounds), return_exceptions=True)


class ScrapeSource:
    """Reads one cluster by scraping its vLLM pods (listed, or discovered) and, if
    configured, its EPP (at its URL, or found from its InferencePool)."""

    def __init__(
        self,
        cluster: ClusterSettings,
        scrape: ScrapeSettings,
        timeout: float,
        session: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
        limiter: Limiter | None = None,
        slices: SliceLister | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        engines: Mapping[str, Engine] = ENGINES,
        pools: PoolLookup | None = None,
        shared: SharedPages | None = None,
    ) -> None:
        """``clock`` stamps what is read; ``monotonic`` paces pod discovery; ``engines`` is
        the table pages are read by (``Settings.engine_table``); ``pools`` finds an
        InferencePool's EPP (``controller.kube.pools``); ``shared`` reads a page other
        clusters read once for all of them."""
        self._token = TokenFile(cluster.bearer_token_file) if cluster.bearer_token_file else None
        self._epp_token = (
            TokenFile(cluster.epp_bearer_token_file)
            if cluster.epp_bearer_token_file
            else self._token
        )
        self._tls = ssl_context(cluster.ca_file, cluster.tls_insecure_skip_verify)
        self._shared = shared
        # what a page's reading depends on beside its URL and extractor: shared only alike
        self._reading = (
            str(cluster.bearer_token_file),
            str(cluster.epp_bearer_token_file),
            str(cluster.ca_file),
            cluster.tls_insecure_skip_verify,
            timeout,
            scrape.max_body_bytes,
            scrape.max_page_samples,
        )
        self._timeout, self._max_bytes, self._limiter = timeout, scrape.max_body_bytes, limiter
        self._max_samples = scrape.max_page_samples
        self._name = cluster.name
        self._vllm = {str(url): self._endpoint(url, self._token) for url in cluster.vllm_urls}
        self._epp = self._endpoint(cluster.epp_url, self._epp_token) if cluster.epp_url else None
        pool = cluster.inference_pool
        self._pool = PoolFinder(pool, pools) if pool is not None else None
        pods = cluster.pods
        self._finder = PodFinder(pods, timeout, slices, monotonic) if pods else None
        self._session = session
        self._clock = clock
        self._reader = PageReader(cluster, scrape.min_latency_requests, engines)
        # this cluster's share of the process's slots (see fetch)
        self._slots = asyncio.Semaphore(scrape.max_concurrency_per_cluster)

    def _endpoint(
        self, url: object, credential: TokenFile | None, server_name: str | None = None
    ) -> Endpoint:
        return Endpoint(
            str(url),
            self._timeout,
            self._max_bytes,
            credential,
            self._tls,
            self._limiter,
            self._max_samples,
            server_name,
        )

    @property
    def cluster(self) -> str:
        return self._name

    async def fetch(self) -> ClusterMetrics:
        ranked()  # this cluster's pages go ahead of clusters whose fetch began later
        started, began = self._clock(), time.perf_counter()
        pods, found = await self._pods()
        unresolved = await self._find_epp()
        jobs = [self._fetch(e, self._reader.pod_stream) for e in pods]
        if self._epp is not None:
            jobs.append(self._fetch(self._epp, lambda: PageStream(EPP_EXTRACTOR)))
        results = await asyncio.gather(*jobs)
        epp: Page | PodError | None = results.pop() if self._epp is not None else None
        lookups = [found] if found is not None else []
        if unresolved is not None and self._epp is None:  # the pool gave no EPP: that is why
            epp = unresolved
        elif unresolved is not None:  # the EPP found before is read; the lookup failed
            lookups.append(unresolved)
        took = time.perf_counter() - began
        metrics = self._reader.read(results, epp, started, took, lookup=lookups)
        if self._finder is None:
            return metrics
        return replace(metrics, discovered=tuple(e.url for e in pods))

    async def _fetch(self, endpoint: Endpoint, stream: Callable[[], PageStream]) -> Page | PodError:
        """One page, once this cluster has a slot of its own free: a cluster queues its pages
        behind each other, not in front of the other clusters' (the process-wide limiter then
        serves them first come, first served)."""
        async with self._slots:
            fresh = stream()
            if self._shared is None or (extractor := fresh.alike) is None:
                return await fetch_page(self._session, endpoint, fresh)
            key = (endpoint.url, id(extractor), self._reading)
            return await self._shared.read(
                key,
                self._name,
                self._timeout,
                lambda: fetch_page(self._session, endpoint, fresh),
            )

    async def _find_epp(self) -> PodError | None:
        """Where the InferencePool's EPP is now (a new URL is a new endpoint; what the reader
        kept of the old one is forgotten with the next retain)."""
        if self._pool is None:
            return None
        error = await self._pool.find()
        url = self._pool.url
        if url is None:
            self._epp = None
        elif self._epp is None or self._epp.url != url:
            self._epp = self._endpoint(url, self._epp_token)
            self._reader.retain([*self._vllm, url])
        return error

    async def _pods(self) -> tuple[list[Endpoint], PodError | None]:
        """The pods to read this tick: the listed ones, or the ones discovery finds now
        (endpoints are kept per URL, and forgotten with the pod)."""
        if self._finder is None:
            return list(self._vllm.values()), None
        urls, error = await self._finder.find()
        named = self._finder.tls_name  # pods are dialed by address
        self._vllm = {u: self._vllm.get(u) or self._endpoint(u, self._token, named) for u in urls}
        self._reader.retain([*urls, *([self._epp.url] if self._epp else [])])
        return list(self._vllm.values()), error
