"""The simulated world: clusters whose KV cache fills with the traffic they get.

A fluid model, stepped once per simulated second. Each cluster holds ``capacity`` concurrent
requests (GPUs × requests per GPU); a request occupies one slot — its KV cache — for
``service_time`` seconds; arrivals beyond free slots wait in a queue, and waiting adds to the
latency users see. Routable traffic is split by the weights in force; a cluster may also get
load of its own that no weight can move (``external``). KV-cache use is ``running / capacity``.

Each scrape renders the cluster's real /metrics pages (vLLM V1 or V0 style, with measurement
noise) so the controller reads them through the same extractor and PageReader as in a pod.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from controller.fakes.pages import CumulativeHistogram, vllm_v0_page, vllm_v1_page
from controller.model import PodError, Reason
from controller.sources.scrape import VLLM_EXTRACTOR, Page, read_page

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
Rate = Callable[[float], float]


def constant(value: float) -> Rate:
    return lambda _t: value


@dataclass
class ClusterSpec:
    """A cluster in a scenario. ``external`` is load (req/s) that routing cannot move."""

    name: str
    gpus: int = 4
    per_gpu: int = 32
    service_time: float = 20.0
    pods: int = 2
    style: Literal["v1", "v0"] = "v1"
    external: Rate = field(default_factory=lambda: constant(0.0))

    @property
    def capacity(self) -> float:
        return float(self.gpus * self.per_gpu)

    @property
    def throughput(self) -> float:
        """Requests per second it completes when full."""
        return self.capacity / self.service_time


@dataclass
class ClusterState:
    spec: ClusterSpec
    running: float = 0.0
    queue: float = 0.0
    alive: bool = True
    style: Literal["v1", "v0"] = "v1"
    scrape_failure_rate: float = 0.0
    frozen_page: list[Page | PodError] | None = None
    histogram: CumulativeHistogram = field(default_factory=CumulativeHistogram)
    _done: float = 0.0

    @property
    def kv(self) -> float:
        return self.running / self.spec.capacity

    def latency(self) -> float:
        """Seconds a request that completes now took: decoding slows as the batch (and KV cache)
        fills, and waiting in the queue adds its share."""
        slowdown = 1.0 + self.kv**4
        return self.spec.service_time * (slowdown + self.queue / self.spec.capacity)

    def step(self, t: float, routed: float, dt: float = 1.0) -> float:
        """Advance by ``dt``; returns the routed traffic that was lost (dead cluster)."""
        if not self.alive:
            self.running = self.queue = 0.0
            return routed * dt
        self.queue += (routed + self.spec.external(t)) * dt
        done = self.running * dt / self.spec.service_time
        self.running -= done
        admitted = min(self.queue, self.spec.capacity - self.running)
        self.running += admitted
        self.queue -= admitted
        self._done += done
        whole = int(self._done)
        if whole:
            self.histogram.observe(self.latency(), whole)
            self._done -= whole
        return 0.0


class Scraper:
    """Renders a cluster's pages as its pods would serve them, and reads them back."""

    def __init__(self, rng: random.Random, noise: float = 0.02) -> None:
        self._rng = rng
        self._noise = noise

    def pages(self, state: ClusterState, now: float) -> list[Page | PodError]:
        spec = state.spec
        urls = [f"http://{spec.name}-pod-{i}:8000/metrics" for i in range(spec.pods)]
        if not state.alive:
            return [PodError(u, Reason.CONNECT, "connection refused") for u in urls]
        if state.frozen_page is not None:
            return state.frozen_page
        if state.scrape_failure_rate and self._rng.random() < state.scrape_failure_rate:
            return [PodError(u, Reason.TIMEOUT, "no answer in time") for u in urls]
        return [read_page(u, self._text(state, i), VLLM_EXTRACTOR) for i, u in enumerate(urls)]

    def freeze(self, state: ClusterState, now: float) -> None:
        """From now on the exporter serves this moment's values, stamped with this moment."""
        spec = state.spec
        stamp = int(now * 1000)
        state.frozen_page = [
            read_page(
                f"http://{spec.name}-pod-{i}:8000/metrics",
                self._text(state, i, stamp),
                VLLM_EXTRACTOR,
            )
            for i in range(spec.pods)
        ]

    def _text(self, state: ClusterState, pod: int, stamp: int | None = None) -> str:
        spec = state.spec
        kv = min(1.0, max(0.0, state.kv + self._rng.uniform(-self._noise, self._noise)))
        waiting = state.queue / spec.pods
        running = state.running / spec.pods
        # The whole cluster's latency histogram sits on pod 0: summed across pods, the same.
        histogram = state.histogram if pod == 0 else CumulativeHistogram()
        if state.style == "v0":
            return vllm_v0_page(MODEL, round(kv, 4), waiting, running, histogram, stamp)
        return vllm_v1_page(MODEL, [round(kv, 4)], [waiting], [running], [histogram], stamp)
