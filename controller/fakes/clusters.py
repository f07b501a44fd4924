"""Simulated clusters on loopback: each serves realistic /metrics pages whose numbers a test or
the demo script sets (KV-cache use, queue, faults). One port per cluster; paths
``/pod-N/metrics`` for vLLM pods and ``/epp/metrics`` for the EPP."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from aiohttp import web

from controller.fakes.pages import CumulativeHistogram, epp_page, vllm_v0_page, vllm_v1_page


class Fault(StrEnum):
    NONE = "none"
    HTTP_500 = "http_500"
    HANG = "hang"  # never answers: the scrape times out
    GARBAGE = "garbage"


@dataclass(slots=True)
class _Pod:
    """One pod's counters, with random sources of its own: the KV noise of its n-th page
    depends only on (cluster, seed, pod, n), never on the order pods happen to be scraped in
    or on how many requests completed meanwhile (which follows wall time)."""

    histograms: list[CumulativeHistogram]
    noise: random.Random
    latency: random.Random
    last: float | None = None
    carry: float = 0.0


@dataclass
class SimCluster:
    """A cluster's knobs. Change them at any time; the next scrape shows the new state."""

    name: str
    style: Literal["v1", "v0"] = "v1"
    pods: int = 2
    engines: int = 2
    kv: float = 0.2  # KV use from load of its own (scripted by the demo or a test)
    routed_kv: float = 0.0  # KV use the routable traffic adds at an equal share of it
    share: float = 1.0  # its weight relative to an equal share (1.0 = 100 / clusters): the
    # routed KV and the requests it completes both scale with it
    fault: Fault = Fault.NONE
    with_epp: bool = False
    epp_only: bool = False  # read through its EPP alone (its pods are not listed)
    epp_generation: Literal["llm-d", "gie"] = "llm-d"
    ready_endpoints: int | None = None  # what the EPP reports as ready (default: its pods)
    requests_per_second: float = 20.0
    blocks: int | None = 2048  # each engine's KV pool (None: the pages publish no cache config)
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    seed: int = 0
    noise: float = 0.02  # ± jitter on each engine's KV reading, like a busy server's
    # Requests completed between two scrapes follow this many seconds per scrape instead of
    # the wall clock, so a seed replays exactly (the demo sets it to its interval).
    seconds_per_scrape: float | None = None
    port: int | None = None
    _pods: list[_Pod] = field(default_factory=list, repr=False)
    _epp: CumulativeHistogram = field(default_factory=CumulativeHistogram, repr=False)

    def __post_init__(self) -> None:
        engines = self.engines if self.style == "v1" else 1
        self._pods = [
            _Pod(
                [CumulativeHistogram() for _ in range(engines)],
                random.Random(f"{self.name}-{self.seed}-pod-{i}-kv"),
                random.Random(f"{self.name}-{self.seed}-pod-{i}-latency"),
            )
            for i in range(self.pods)
        ]

    # ---- what the pages say ------------------------------------------------------------------
    def load(self) -> float:
        """KV use: its own load plus what the routed traffic adds at its current share."""
        return min(1.0, self.kv + self.routed_kv * self.share)

    def latency(self) -> float:
        """Requests slow down as the KV cache fills and requests start queueing."""
        return 0.8 + 8.0 * float(max(0.0, self.load() - 0.6) ** 1.5)

    def waiting(self) -> float:
        return round(max(0.0, self.load() - 0.85) * 100, 1)

    def _engine_kv(self, rng: random.Random) -> float:
        jitter = rng.uniform(-self.noise, self.noise) if self.noise else 0.0
        return min(1.0, max(0.0, self.load() + jitter))

    def _advance(self, pod: _Pod, now: float) -> int:
        elapsed = 0.0 if pod.last is None else now - pod.last
        if self.seconds_per_scrape is not None:  # virtual time: the same story every run
            elapsed = 0.0 if pod.last is None else self.seconds_per_scrape
        pod.last = now
        # the requests follow the weights as the KV does: realised share answers intended
        pod.carry += elapsed * self.requests_per_second * self.share / self.pods
        done, pod.carry = int(pod.carry), pod.carry - int(pod.carry)
        for _ in range(done):
            seconds = self.latency() * pod.latency.uniform(0.7, 1.3)
            pod.latency.choice(pod.histograms).observe(seconds)
            self._epp.observe(seconds)
        return done

    def pod_page(self, index: int, now: float) -> str:
        pod = self._pods[index]
        self._advance(pod, now)
        running = 8.0 * self.load()
        if self.style == "v0":
            value = round(self._engine_kv(pod.noise), 4)
            return vllm_v0_page(
                self.model, value, self.waiting(), running, pod.histograms[0], blocks=self.blocks
            )
        n = len(pod.histograms)
        kv = [round(self._engine_kv(pod.noise), 4) for _ in range(n)]
        return vllm_v1_page(
            self.model,
            kv,
            [self.waiting() / n] * n,
            [running / n] * n,
            pod.histograms,
            blocks=self.blocks,
        )

    def epp_page(self, now: float) -> str:
        # In virtual time only pod pages move the traffic on, so the EPP's page does not
        # depend on whether it was fetched before or after them.
        if self.seconds_per_scrape is None or self.epp_only:  # nobody else moves it on
            for pod in self._pods:
                self._advance(pod, now)
        ready = self.pods if self.ready_endpoints is None else self.ready_endpoints
        return epp_page(
            self.model,
            f"{self.name}-pool",
            self.load(),
            self.waiting(),
            self._epp,
            ready=ready,
            running=8.0 * self.load(),
            generation=self.epp_generation,
        )

    # ---- where to find it --------------------------------------------------------------------
    def base_url(self, host: str = "127.0.0.1") -> str:
        assert self.port is not None, "start the fleet first"
        return f"http://{host}:{self.port}"

    def vllm_urls(self) -> list[str]:
        return [f"{self.base_url()}/pod-{i}/metrics" for i in range(self.pods)]

    def epp_url(self) -> str | None:
        return f"{self.base_url()}/epp/metrics" if self.with_epp or self.epp_only else None

    def cluster_settings(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name}
        if not self.epp_only:
            entry["vllm_urls"] = self.vllm_urls()
        if self.with_epp or self.epp_only:
            entry["epp_url"] = self.epp_url()
        return entry


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def as_openmetrics(text: str) -> str:
    """What prometheus-client >= 0.23 serves an OpenMetrics client: ``vllm:`` names become
    ``vllm_`` (OpenMetrics 1.0 names have no colons), and the page ends with ``# EOF``."""
    return text.replace("vllm:", "vllm_") + "# EOF\n"


def _app(cluster: SimCluster) -> web.Application:
    loop_time = asyncio.get_event_loop().time

    async def respond(request: web.Request, text_of: Any) -> web.Response:
        if cluster.fault is Fault.HTTP_500:
            return web.Response(status=500, text="internal error\n")
        if cluster.fault is Fault.HANG:
            await asyncio.sleep(3600)
        if cluster.fault is Fault.GARBAGE:
            return web.Response(text="<html><body>502 Bad Gateway</body></html>\n")
        text = text_of(loop_time())
        if "application/openmetrics-text" in request.headers.get("Accept", ""):
            body, content_type = as_openmetrics(text), OPENMETRICS_TYPE
        else:
            body, content_type = text, CONTENT_TYPE
        return web.Response(body=body.encode(), headers={"Content-Type": content_type})

    async def pod(request: web.Request) -> web.Response:
        index = int(request.match_info["index"])
        if index >= cluster.pods:
            raise web.HTTPNotFound()
        return await respond(request, lambda now: cluster.pod_page(index, now))

    async def epp(request: web.Request) -> web.Response:
        if not (cluster.with_epp or cluster.epp_only):
            raise web.HTTPNotFound()
        return await respond(request, cluster.epp_page)

    app = web.Application()
    app.router.add_get(r"/pod-{index:\d+}/metrics", pod)
    app.router.add_get("/epp/metrics", epp)
    return app


class Fleet:
    """Starts every simulated cluster on its own loopback port."""

    def __init__(self, clusters: list[SimCluster], host: str = "127.0.0.1") -> None:
        self.clusters = {c.name: c for c in clusters}
        self._host = host
        self._runners: list[web.AppRunner] = []

    def __getitem__(self, name: str) -> SimCluster:
        return self.clusters[name]

    async def __aenter__(self) -> Fleet:
        for cluster in self.clusters.values():
            runner = web.AppRunner(
                _app(cluster), access_log=None, handle_signals=False, shutdown_timeout=0.1
            )
            await runner.setup()
            site = web.TCPSite(runner, self._host, cluster.port or 0)
            await site.start()
            cluster.port = int(runner.addresses[0][1])
            self._runners.append(runner)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def settings_clusters(self) -> list[dict[str, Any]]:
        return [c.cluster_settings() for c in self.clusters.values()]
