"""The simulated world: discrete requests into clusters of token-level vLLM replicas.

- Arrivals are Poisson (``Rate`` in requests/s, which a scenario may vary or burst); prompt and
  output lengths are lognormal. Routable requests go to a cluster by weighted random choice over
  the weights *in force* (the gateway's weighted backends); local requests go to their own
  cluster whatever the weights say.
- Inside a cluster the endpoint picker sends each request to the replica with the shortest
  queue, then the lowest KV use (the EPP's queue and KV-cache scorers).
- A dead cluster loses what it was serving and every request sent to it until it returns.
- Each scrape renders the replicas' real /metrics pages (vLLM V1 or V0 style, each with its
  ``vllm:cache_config_info``) as they were a moment ago (``scrape_age``: gauges lag by up to
  that much), optionally with extra noise, failures or a frozen exporter, so the controller
  reads the world only through its own extractor and PageReader. A cluster read through its
  EPP (``read="epp"``) renders the EPP's page instead: the pool's averages over its replicas
  (refreshed every ``EPP_REFRESH`` seconds, as llm-d-router's datalayer logger does), its
  ready endpoints, its request counter (every arrival, routed or local) and its
  request-duration histogram.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from controller.engines import ENGINES, VLLM
from controller.fakes.pages import (
    CumulativeHistogram,
    Served,
    epp_page,
    node_page,
    vllm_v0_page,
    vllm_v1_page,
)
from controller.model import PodError, Reason
from controller.simulation.vllm import Replica, ReplicaSpec, Request
from controller.sources.page import EPP_EXTRACTOR, POD_EXTRACTOR, Page, read_page

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "vllm-llama"
# The EPP recomputes its pool averages this often (llm-d-router pkg/epp/datalayer/logger).
EPP_REFRESH = 5.0
Rate = Callable[[float], float]


def constant(value: float) -> Rate:
    return lambda _t: value


@dataclass(frozen=True)
class Lengths:
    """Lognormal token lengths (median, sigma of the log), capped as ``max_tokens`` would."""

    prompt_median: float = 1000.0
    prompt_sigma: float = 0.7
    output_median: float = 300.0
    output_sigma: float = 0.8
    prompt_cap: int = 8000
    output_cap: int = 2048

    def draw(self, rng: random.Random) -> tuple[int, int]:
        prompt = rng.lognormvariate(math.log(self.prompt_median), self.prompt_sigma)
        output = rng.lognormvariate(math.log(self.output_median), self.output_sigma)
        return (
            max(1, min(self.prompt_cap, int(prompt))),
            max(1, min(self.output_cap, int(output))),
        )


@dataclass
class ClusterSpec:
    """A cluster in a scenario: ``replicas`` servers of ``engine`` (a row of the engine table:
    its pages are rendered as the row reads them, ``style`` is vLLM's); ``pool``: its pages
    publish the KV pool; ``local`` is load (requests/s) that arrives there directly, which
    routing cannot move."""

    name: str
    replicas: int = 2
    replica: ReplicaSpec = field(default_factory=ReplicaSpec)
    style: Literal["v1", "v0"] = "v1"
    local: Rate = field(default_factory=lambda: constant(0.0))
    read: Literal["pods", "epp"] = "pods"  # how the controller sees it
    engine: str = "vllm"
    pool: bool = True
    # A row whose pages hold replicas (Ray Serve's): its replicas on this many node pages,
    # replica i on node i mod nodes, each page holding every replica of its node.
    nodes: int = 0

    def __post_init__(self) -> None:
        if self.nodes and ENGINES[self.engine].replica_label is None:
            raise ValueError(f"{self.name}: {self.engine}'s pages hold one server: no nodes")
        if not 0 <= self.nodes <= self.replicas:
            raise ValueError(f"{self.name}: {self.nodes} nodes for {self.replicas} replicas")


@dataclass
class Cluster:
    spec: ClusterSpec
    replicas: list[Replica]
    alive: bool = True
    style: Literal["v1", "v0"] = "v1"
    scrape_failure_rate: float = 0.0
    noise: float = 0.0  # extra gaussian noise on the KV gauge (σ, in fractions)
    scrape_age: float = 1.0  # gauges are up to this many seconds old
    frozen: list[Page | PodError] | None = None
    lost: int = 0
    received: int = 0  # routable requests that arrived here (the realised share)
    arrived: int = 0  # every request that arrived here, local ones too (the EPP's counter)
    epp: CumulativeHistogram = field(default_factory=CumulativeHistogram)  # its durations
    history: deque[tuple[float, list[tuple[float, int, int]]]] = field(default_factory=deque)

    @classmethod
    def build(cls, spec: ClusterSpec) -> Cluster:
        replicas = [Replica(spec.replica) for _ in range(spec.replicas)]
        return cls(spec, replicas, style=spec.style)

    @property
    def kv(self) -> float:
        return sum(r.kv for r in self.replicas) / len(self.replicas)

    @property
    def waiting(self) -> int:
        return sum(len(r.waiting) for r in self.replicas)

    def offer(self, request: Request) -> None:
        if request.routed:
            self.received += 1
        self.arrived += 1
        if not self.alive:
            self.lost += 1
            return
        best = min(self.replicas, key=lambda r: (len(r.waiting), r.blocks_used()))
        best.offer(request)

    def kill(self) -> None:
        self.alive = False
        self.lost += sum(r.drop_all() for r in self.replicas)

    def remember(self, now: float) -> None:
        """Keep what each replica's gauges said at ``now``, for scrapes that lag."""
        self.history.append((now, [(r.kv, len(r.waiting), len(r.running)) for r in self.replicas]))
        while self.history and self.history[0][0] < now - 60:
            self.history.popleft()

    def gauges_at(self, when: float) -> list[tuple[float, int, int]]:
        for stamp, values in reversed(self.history):
            if stamp <= when:
                return values
        return self.history[0][1]


class Scraper:
    """Renders a cluster's pages as its pods would serve them, and reads them back."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def epp(self, cluster: Cluster, now: float) -> Page | PodError | None:
        """The EPP's page of a cluster read through it (``None`` for one read by its pods):
        pool averages as of the EPP's last refresh, which itself read gauges a moment old."""
        spec = cluster.spec
        if spec.read != "epp":
            return None
        url = epp_url(spec.name)
        if not cluster.alive:
            return PodError(url, Reason.REFUSED, "connection refused")
        if cluster.scrape_failure_rate and self._rng.random() < cluster.scrape_failure_rate:
            return PodError(url, Reason.TIMEOUT, "no answer in time")
        refreshed = now - now % EPP_REFRESH
        gauges = cluster.gauges_at(refreshed - self._rng.uniform(0.0, cluster.scrape_age))
        n = len(gauges)
        kv = sum(g[0] for g in gauges) / n
        if cluster.noise:
            kv = min(1.0, max(0.0, kv + self._rng.gauss(0.0, cluster.noise)))
        text = epp_page(
            MODEL,
            POOL,
            round(kv, 4),
            sum(g[1] for g in gauges) / n,
            cluster.epp,
            ready=n,
            running=sum(g[2] for g in gauges) / n,
            requests=cluster.arrived,
        )
        return read_page(url, text, EPP_EXTRACTOR)

    def pages(self, cluster: Cluster, now: float) -> list[Page | PodError]:
        spec = cluster.spec
        if spec.read == "epp":
            return []
        urls = pod_urls(spec)
        if not cluster.alive:
            return [PodError(u, Reason.REFUSED, "connection refused") for u in urls]
        if cluster.frozen is not None:
            return cluster.frozen
        if cluster.scrape_failure_rate and self._rng.random() < cluster.scrape_failure_rate:
            return [PodError(u, Reason.TIMEOUT, "no answer in time") for u in urls]
        gauges = cluster.gauges_at(now - self._rng.uniform(0.0, cluster.scrape_age))
        return [
            read_page(u, self._page(cluster, i, gauges), POD_EXTRACTOR) for i, u in enumerate(urls)
        ]

    def freeze(self, cluster: Cluster, now: float) -> None:
        """From now on the exporter serves this moment's values, stamped with this moment."""
        spec = cluster.spec
        gauges = cluster.gauges_at(now)
        cluster.frozen = [
            read_page(url, self._page(cluster, i, gauges, int(now * 1000)), POD_EXTRACTOR)
            for i, url in enumerate(pod_urls(spec))
        ]

    def _page(
        self,
        cluster: Cluster,
        index: int,
        gauges: list[tuple[float, int, int]],
        stamp: int | None = None,
    ) -> str:
        """The page at ``pod_urls(spec)[index]``: a pod's, or a node's with its replicas."""
        spec = cluster.spec
        if spec.engine == VLLM.name:
            return self._vllm(cluster, index, gauges[index], stamp)
        held = range(index, spec.replicas, spec.nodes) if spec.nodes else [index]
        served = [self._served(cluster, i, gauges[i]) for i in held]
        size = cluster.replicas[0].spec.block_size
        return node_page(ENGINES[spec.engine], MODEL, served, stamp, size)

    def _served(self, cluster: Cluster, pod: int, gauges: tuple[float, int, int]) -> Served:
        """A server of a row other than vLLM's (its page as the row reads it)."""
        kv, waiting, running = gauges
        if cluster.noise:
            kv = min(1.0, max(0.0, kv + self._rng.gauss(0.0, cluster.noise)))
        replica = cluster.replicas[pod]
        blocks = replica.spec.num_gpu_blocks if cluster.spec.pool else None
        name = f"{cluster.spec.name}-replica-{pod}"
        return Served(round(kv, 4), waiting, running, replica.e2e, blocks, name)

    def _vllm(
        self,
        cluster: Cluster,
        pod: int,
        gauges: tuple[float, int, int],
        stamp: int | None = None,
    ) -> str:
        kv, waiting, running = gauges
        if cluster.noise:
            kv = min(1.0, max(0.0, kv + self._rng.gauss(0.0, cluster.noise)))
        replica = cluster.replicas[pod]
        size = replica.spec.block_size
        blocks = replica.spec.num_gpu_blocks if cluster.spec.pool else None
        if cluster.style == "v0":
            return vllm_v0_page(
                MODEL, round(kv, 4), waiting, running, replica.e2e, stamp, blocks, size
            )
        return vllm_v1_page(
            MODEL, [round(kv, 4)], [waiting], [running], [replica.e2e], stamp, blocks, size
        )


def pod_urls(spec: ClusterSpec) -> list[str]:
    """Its pods' pages, or its Ray nodes' (``ClusterSpec.nodes``)."""
    if spec.nodes:
        return [f"http://{spec.name}-node-{i}:8080/metrics" for i in range(spec.nodes)]
    return [f"http://{spec.name}-pod-{i}:8000/metrics" for i in range(spec.replicas)]


def epp_url(name: str) -> str:
    return f"http://{name}-epp:9090/metrics"


class Arrivals:
    """A Poisson process whose rate may change over time: each gap is drawn at the rate in
    force when it starts (a second of silence is checked again while the rate is 0)."""

    def __init__(self, rate: Rate, rng: random.Random) -> None:
        self._rate = rate
        self._rng = rng
        self._next, self._real = self._after(0.0)

    def _after(self, t: float) -> tuple[float, bool]:
        rate = self._rate(t)
        if rate <= 0:
            return t + 1.0, False
        return t + self._rng.expovariate(rate), True

    def until(self, end: float) -> list[float]:
        times = []
        while self._next < end:
            if self._real:
                times.append(self._next)
            self._next, self._real = self._after(self._next)
        return times
