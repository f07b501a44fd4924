"""Scenarios: small declarative descriptions of a fleet, its load and what happens to it.

Loads are fractions of what the clusters can serve: ``capacity(spec)`` is the rate (requests/s)
a replica completes when its KV cache is the limit, measured once on the token-level replica
with the scenario's request lengths (not assumed). Every scenario runs 30 simulated minutes.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from controller.simulation.vllm import Replica, ReplicaSpec, Request
from controller.simulation.world import (
    Arrivals,
    Cluster,
    ClusterSpec,
    Lengths,
    Rate,
    Scraper,
    constant,
)

Action = Callable[[Cluster, Scraper, float], None]
DURATION = 1800.0


@dataclass(frozen=True)
class Event:
    at: float
    cluster: str
    action: Action
    note: str


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    clusters: list[ClusterSpec]
    load: Rate
    events: list[Event] = field(default_factory=list)
    hot: str | None = None  # the cluster whose recovery from >90% KV is timed
    hot_from: float = 0.0  # ... after this moment
    duration: float = DURATION
    lengths: Lengths = field(default_factory=Lengths)
    scrape_age: float = 1.0
    delay: float | None = None  # a fixed actuation delay (the delay variants)
    start: dict[str, float] | None = None  # the split the router starts with (default even)


DEFAULT_REPLICA = ReplicaSpec()
DEFAULT_LENGTHS = Lengths()
# Unequal hardware for the same model: an 80 GB card holds 4× the default's KV blocks, batches
# twice as many sequences, decodes ~1.5× and prefills 2.5× as fast; a 48 GB one sits between.
BIG_GPU = ReplicaSpec(
    num_gpu_blocks=8192, max_num_seqs=256, itl_base=0.008, itl_per_seq=0.0001, prefill_rate=20000
)
MID_GPU = ReplicaSpec(
    num_gpu_blocks=4096, max_num_seqs=192, itl_base=0.010, itl_per_seq=0.00015, prefill_rate=12000
)


@functools.cache
def capacity(replica: ReplicaSpec = DEFAULT_REPLICA, lengths: Lengths = DEFAULT_LENGTHS) -> float:
    """Requests/s one replica completes when offered more than it can take (seeded, cached)."""
    rng = random.Random("capacity")
    server = Replica(replica)
    arrivals = Arrivals(constant(50.0), rng)
    done: list[tuple[Request, float]] = []
    ident, dt, warm, end = 0, 0.5, 300.0, 900.0
    t, counted = 0.0, 0
    while t < end:
        for arrival in arrivals.until(t + dt):
            ident += 1
            if len(server.waiting) < 200:  # keep it saturated, not drowning
                server.offer(Request(arrival, *lengths.draw(rng), True, ident))
        server.step(t, dt, done)
        if t >= warm:
            counted += len(done)
        done.clear()
        t += dt
    return counted / (end - warm)


def rate_for(fraction: float, *clusters: ClusterSpec) -> float:
    """Requests/s that are ``fraction`` of what ``clusters`` can serve together."""
    return fraction * sum(c.replicas * capacity(c.replica) for c in clusters)


def kill(cluster: Cluster, _: Scraper, __: float) -> None:
    cluster.kill()


def revive(cluster: Cluster, _: Scraper, __: float) -> None:
    cluster.alive = True


def flap(rate: float) -> Action:
    def action(cluster: Cluster, _: Scraper, __: float) -> None:
        cluster.scrape_failure_rate = rate

    return action


def noisy(sigma: float) -> Action:
    def action(cluster: Cluster, _: Scraper, __: float) -> None:
        cluster.noise = sigma

    return action


def freeze(cluster: Cluster, scraper: Scraper, now: float) -> None:
    scraper.freeze(cluster, now)


def restyle(style: Literal["v1", "v0"]) -> Action:
    def action(cluster: Cluster, _: Scraper, __: float) -> None:
        cluster.style = style

    return action


def ramp(start: float, end: float, low: float, high: float) -> Rate:
    """``low`` until ``start``, linearly to ``high`` at ``end``, then ``high``."""

    def rate(t: float) -> float:
        if t <= start:
            return low
        if t >= end:
            return high
        return low + (high - low) * (t - start) / (end - start)

    return rate


def window(start: float, end: float, base: float, extra: float) -> Rate:
    return lambda t: base + (extra if start <= t < end else 0.0)


def bursty(base: float, seed: str) -> Rate:
    """``base`` with bursts: for 20 s in every 2 minutes (at a seeded offset) 1.5× the rate."""
    offset = random.Random(seed).uniform(0, 120)
    return lambda t: base * (1.5 if (t + offset) % 120 < 20 else 1.0)


def daily(low: float, high: float, period: float) -> Rate:
    """A day's curve squeezed into ``period``: ``low`` at the start and end, ``high`` halfway."""
    return lambda t: low + (high - low) * 0.5 * (1.0 - math.cos(2.0 * math.pi * t / period))


def three(replicas: int = 2) -> list[ClusterSpec]:
    return [ClusterSpec(n, replicas=replicas) for n in ("a", "b", "c")]


def steady() -> Scenario:
    clusters = three()
    return Scenario(
        "steady", "three equal clusters at 50%", clusters, constant(rate_for(0.5, *clusters))
    )


def heterogeneous() -> Scenario:
    clusters = [ClusterSpec("small", 2), ClusterSpec("medium", 4), ClusterSpec("large", 8)]
    return Scenario(
        "heterogeneous",
        "2, 4 and 8 replicas at 60% of the total, from an even split",
        clusters,
        constant(rate_for(0.6, *clusters)),
        hot="small",
    )


def ten_x() -> Scenario:
    clusters = [ClusterSpec("small", 1), ClusterSpec("big", 10)]
    return Scenario(
        "ten-x",
        "1 replica beside 10 at 60% of the total, with bursts",
        clusters,
        bursty(rate_for(0.6, *clusters), "ten-x"),
        hot="small",
    )


def b_gets_local(name: str, description: str, end: float, fraction: float) -> Scenario:
    """Three equal clusters at 50%; from 10 min until ``end`` cluster b also gets local
    traffic worth ``fraction`` of its capacity, which no weight can move."""
    a, b, c = three()
    extra = fraction * b.replicas * capacity(b.replica)
    return Scenario(
        name,
        description,
        [a, replace(b, local=window(600, end, 0.0, extra)), c],
        constant(rate_for(0.5, a, b, c)),
        hot="b",
        hot_from=600,
    )


def spike() -> Scenario:
    return b_gets_local(
        "spike", "b's local traffic takes it to 130% for 5 minutes (routed: 50% each)", 900, 0.8
    )


def hot_hard() -> Scenario:
    return b_gets_local(
        "hot-hard",
        "b is offered 120% of its capacity from 10 min (70% local on its 50% share)",
        1800,
        0.7,
    )


def ramp_up() -> Scenario:
    clusters = [ClusterSpec("a", 2), ClusterSpec("b", 3), ClusterSpec("c", 4)]
    total = rate_for(1.0, *clusters)
    return Scenario(
        "ramp",
        "2, 3 and 4 replicas; load ramps from 40% to 110% of the total over 20 minutes",
        clusters,
        ramp(300, 1500, 0.4 * total, 1.1 * total),
    )


def all_hot() -> Scenario:
    clusters = three()
    return Scenario(
        "all-hot",
        "120% of the fleet's capacity, all the time",
        clusters,
        constant(rate_for(1.2, *clusters)),
    )


def dead_return() -> Scenario:
    clusters = three()
    events = [Event(600, "c", kill, "c dies"), Event(1200, "c", revive, "c returns")]
    return Scenario(
        "dead-return",
        "c dies at 10 min and returns at 20 min; 50% load",
        clusters,
        constant(rate_for(0.5, *clusters)),
        events,
    )


def flapping() -> Scenario:
    clusters = three()
    return Scenario(
        "flapping",
        "b is fine but 30% of its scrapes fail",
        clusters,
        constant(rate_for(0.5, *clusters)),
        [Event(300, "b", flap(0.3), "30% of b's scrapes fail")],
    )


def noisy_stale() -> Scenario:
    clusters = [ClusterSpec("small", 2), ClusterSpec("large", 4)]
    events = [Event(0, n, noisy(0.05), "KV gauges ±5% noise") for n in ("small", "large")]
    events.append(Event(1200, "small", freeze, "small's exporter freezes (stamped)"))
    return Scenario(
        "noisy-stale",
        "2 and 4 replicas at 60%: gauges up to 20 s old with ±5% noise; small freezes at 20 min",
        clusters,
        constant(rate_for(0.6, *clusters)),
        events,
        scrape_age=20.0,
        hot="small",
    )


def rename() -> Scenario:
    clusters = [ClusterSpec("a", 2), ClusterSpec("b", 2, style="v0")]
    events = [Event(900, "b", restyle("v1"), "b upgrades vLLM: gpu_ -> kv_cache_usage_perc")]
    return Scenario(
        "rename",
        "b's KV metric is renamed mid-run (vLLM upgrade)",
        clusters,
        constant(rate_for(0.5, *clusters)),
        events,
    )


def gpus() -> list[ClusterSpec]:
    return [
        ClusterSpec("h100", 2, BIG_GPU),
        ClusterSpec("l40s", 2, MID_GPU),
        ClusterSpec("a10", 2),
    ]


def unequal_gpus() -> Scenario:
    """Starts settled, at the split by KV pool (what the first write asks for): whether it
    stays settled is the question; starting from an even split is heterogeneous's."""
    clusters = gpus()
    return Scenario(
        "unequal-gpus",
        "2 pods each on 80, 48 and 24 GB GPUs (4×, 2× and 1× the KV, faster decode) at 60%,"
        " from the split by KV pool",
        clusters,
        constant(rate_for(0.6, *clusters)),
        hot="a10",
        start={c.name: c.replicas * c.replica.num_gpu_blocks for c in clusters},
    )


def mixed_engines() -> Scenario:
    """Three engines on three GPUs, one of which publishes no KV pool: the others keep what
    they know of their hardware, and its pool is measured against theirs (the tokens a running
    request holds there, ``CapacityFrom.MEASURED``; before it has load, their smallest pod)
    (#41)."""
    clusters = [
        ClusterSpec("h100", 2, BIG_GPU),
        ClusterSpec("l40s", 2, MID_GPU, engine="sglang"),
        ClusterSpec("a10", 2, engine="trtllm-serve", pool=False),
    ]
    return Scenario(
        "mixed-engines",
        "vLLM on 80 GB, SGLang on 48 GB and trtllm-serve on 24 GB GPUs (4×, 2×, 1× the KV), the"
        " last publishing no KV pool, at 60%, from an even split",
        clusters,
        constant(rate_for(0.6, *clusters)),
        hot="a10",
    )


def ray_serve() -> Scenario:
    """A Ray Serve LLM cluster among vLLM Deployments: its four replicas on two Ray nodes,
    each node's page holding two replicas, each replica read as a pod by its ReplicaId and
    its pool kept as Ray drops the info gauge (#42)."""
    clusters = [
        ClusterSpec("h100", 2, BIG_GPU),
        ClusterSpec("l40s-ray", 4, MID_GPU, engine="ray-vllm", nodes=2),
        ClusterSpec("a10", 2),
    ]
    return Scenario(
        "ray-serve",
        "vLLM on 2 pods of 80 GB, Ray Serve LLM with 4 replicas on 2 Ray nodes of 48 GB GPUs"
        " (each node's page holding 2), vLLM on 2 pods of 24 GB, at 60%, from an even split",
        clusters,
        constant(rate_for(0.6, *clusters)),
        hot="a10",
    )


def local_heavy() -> Scenario:
    a, b, c = three()
    extra = 0.6 * b.replicas * capacity(b.replica)
    return Scenario(
        "local-heavy",
        "three equal clusters, 50% routed; b also serves local traffic worth 60% of it, always",
        [a, replace(b, local=constant(extra)), c],
        constant(rate_for(0.5, a, b, c)),
        hot="b",
    )


def daily_curve() -> Scenario:
    clusters = [ClusterSpec("h100", 2, BIG_GPU), ClusterSpec("a", 2), ClusterSpec("b", 4)]
    total = rate_for(1.0, *clusters)
    return Scenario(
        "daily",
        "80 GB GPUs beside 2 and 4 pods of 24 GB; load from 30% to 95% and back over the run",
        clusters,
        daily(0.3 * total, 0.95 * total, DURATION),
    )


def epp_only() -> Scenario:
    clusters = [
        ClusterSpec("small", 2, read="epp"),
        ClusterSpec("medium", 4, read="epp"),
        ClusterSpec("large", 8, read="epp"),
    ]
    return Scenario(
        "epp-only",
        "heterogeneous (2, 4, 8 pods) read only through each EPP's pool averages, at 60%",
        clusters,
        constant(rate_for(0.6, *clusters)),
        hot="small",
    )


def at_delay(make: Callable[[], Scenario], delay: float) -> Callable[[], Scenario]:
    def scenario() -> Scenario:
        base = make()
        return replace(base, name=f"{base.name}@{delay:g}s", delay=delay)

    return scenario


BASE = (
    steady,
    heterogeneous,
    ten_x,
    spike,
    hot_hard,
    ramp_up,
    all_hot,
    dead_return,
    flapping,
    noisy_stale,
    rename,
    unequal_gpus,
    mixed_engines,
    ray_serve,
    local_heavy,
    daily_curve,
    epp_only,
)
DELAYED = tuple(
    at_delay(m, d)
    for m in (
        heterogeneous,
        spike,
        hot_hard,
        dead_return,
        flapping,
        unequal_gpus,
        mixed_engines,
        local_heavy,
        daily_curve,
        epp_only,
    )
    for d in (5.0, 30.0)
)
SCENARIOS: dict[str, Callable[[], Scenario]] = {s().name: s for s in (*BASE, *DELAYED)}
