"""Where cluster signals come from. Every source answers the same question the same way."""

from __future__ import annotations

import math
from typing import Protocol

from controller.model import ClusterMetrics

# What one cluster can hold, so that no peer's answer becomes capacity beyond it. Kubernetes
# is built for no more than 150,000 pods a cluster ("Considerations for large clusters",
# kubernetes.io/docs/setup/best-practices/cluster-large). A pod's KV pool is GPU memory: eight
# 192 GB GPUs hold ~1.5 TB, and a token costs at least ~10 KB of KV cache even for a small
# model, so ~1.5e8 tokens; a billion is beyond any pod.
MAX_PODS = 150_000
MAX_KV_TOKENS_PER_POD = 1e9
# Requests waiting or running in one cluster: a thousand pods of a thousand each, a
# hundredfold (a queue of 1e300, from a querier or a page, moved traffic as if it were one:
# found by an attack, then on pages by a review). A latency quantile past a day is no
# request's either.
MAX_IN_FLIGHT = 1e8
MAX_LATENCY = 86400.0


def pod_count_problem(value: float, what: str) -> str | None:
    """Why ``value`` cannot be how many pods serve (``what`` says which answer it was)."""
    if not math.isfinite(value) or value < 0:
        return f"{what}={value:g}: not a number of pods"
    if value > MAX_PODS:
        return f"{what}={value:g}: more pods than a Kubernetes cluster holds ({MAX_PODS:,})"
    return None


def kv_tokens_problem(tokens: float, pods: float, what: str) -> str | None:
    """Why ``tokens`` cannot be what ``pods`` pods' KV caches hold."""
    if not math.isfinite(tokens) or tokens <= 0:
        return f"{what}={tokens:g}: not a KV-cache size"
    if tokens > MAX_KV_TOKENS_PER_POD * max(pods, 1.0):
        return f"{what}={tokens:g} tokens over {pods:g} pod(s): more than any pod's KV cache holds"
    return None


class ClusterMetricsSource(Protocol):
    """Reads one cluster's signals. ``fetch`` never raises for a bad endpoint: what went wrong
    is reported in ``ClusterMetrics.errors`` so one cluster cannot break a tick."""

    @property
    def cluster(self) -> str: ...

    async def fetch(self) -> ClusterMetrics: ...
