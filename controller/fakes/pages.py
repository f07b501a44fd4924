"""Realistic /metrics pages for simulated pods: vLLM V1 (``engine`` label,
``vllm:kv_cache_usage_perc``), vLLM V0 (``vllm:gpu_cache_usage_perc``), any other engine as its
row of the engine table says it writes (``engine_page``), and an llm-d EPP.

Latency histograms are cumulative counters that grow as simulated requests complete, the way
real ones do, so the controller's between-scrape latency has something to difference.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.engines import Engine, Family

LATENCY_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


@dataclass(slots=True)
class CumulativeHistogram:
    """Counts per bucket (not yet cumulative), plus sum and count, like a client library."""

    bounds: Sequence[float] = LATENCY_BOUNDS
    counts: list[float] = field(default_factory=lambda: [0.0] * (len(LATENCY_BOUNDS) + 1))
    total: float = 0.0
    sum: float = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += times
        self.total += times
        self.sum += seconds * times

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# HELP {name} Request latency in seconds.", f"# TYPE {name} histogram"]
        running = 0.0
        for bound, count in zip([*self.bounds, math.inf], self.counts, strict=True):
            running += count
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.total}")
        return out


@dataclass(frozen=True, slots=True)
class Served:
    """One server's signals as a page shows them: a pod, or a Ray Serve replica on a node."""

    kv: float
    waiting: float
    running: float
    e2e: CumulativeHistogram | None = None
    blocks: int | None = 2048  # its KV pool (None: it publishes none)
    replica: str = "replica-0"


def engine_page(
    engine: Engine,
    model: str,
    kv: float,
    waiting: float,
    running: float,
    e2e: CumulativeHistogram | None = None,
    timestamp_ms: int | None = None,
    blocks: int | None = 2048,
    block_size: int = 16,
    replica: str = "replica-0",
) -> str:
    """One server of ``engine`` as its row reads it: each signal under its newest name and
    label matchers (a matcher of ``""`` is a label left out), the model under the row's model
    label, the pool by the row's first rule (``blocks=None``: a server that publishes none),
    and the e2e histogram where the row has one. A row whose pages hold replicas (Ray Serve's)
    gets a node page of one, ``replica``, run by one worker: every series carries both."""
    served = Served(kv, waiting, running, e2e, blocks, replica)
    return node_page(engine, model, [served], timestamp_ms, block_size)


def node_page(
    engine: Engine,
    model: str,
    servers: Sequence[Served],
    timestamp_ms: int | None = None,
    block_size: int = 16,
) -> str:
    """``engine_page`` for several servers on one page, each family once with every
    server's series under it: a Ray node's metrics-export page holding several replicas
    (each tagged with its ``ReplicaId`` and a worker of its own)."""
    stamp = "" if timestamp_ms is None else f" {timestamp_ms}"
    model_label = (engine.model_label, model)
    families: dict[str, list[str]] = {}
    histograms: list[str] = []

    def gauge(family: Family, value: float, labels: Sequence[tuple[str, str]]) -> None:
        name = family.names[0]
        pairs = [*((k, v) for k, v in family.match if v), *labels]
        text = ",".join(f'{k}="{v}"' for k, v in sorted(pairs))
        families.setdefault(name, []).append(f"{name}{{{text}}} {value}{stamp}")

    for server in servers:
        unit = [(engine.replica_label, server.replica)] if engine.replica_label else []
        if engine.process_label:
            unit.append((engine.process_label, f"{server.replica}-worker"))
        gauge(engine.kv, server.kv, [model_label, *unit])
        gauge(engine.waiting, server.waiting, [model_label, *unit])
        gauge(engine.running, server.running, [model_label, *unit])
        blocks = server.blocks
        pool = engine.pools[0] if engine.pools and blocks is not None else None
        if pool is not None and blocks is not None:
            if pool.info is not None:
                sizes = [(pool.block_label, str(block_size)), (pool.count_label, str(blocks))]
                gauge(Family((pool.info,)), 1.0, [*sizes, *unit])
            if pool.block is not None and pool.count is not None:
                gauge(pool.block, block_size, [model_label, *unit])
                gauge(pool.count, blocks, [model_label, *unit])
            if pool.tokens is not None:
                gauge(pool.tokens, blocks * block_size, [model_label, *unit])
        if engine.latency is not None and server.e2e is not None:
            named = ",".join(f'{k}="{v}"' for k, v in [model_label, *unit])
            lines = server.e2e.lines(engine.latency, named)
            histograms += lines if not histograms else lines[2:]  # HELP and TYPE once
    out: list[str] = []
    for name, lines in families.items():
        out += [f"# HELP {name} {name}", f"# TYPE {name} gauge", *lines]
    return "\n".join([*out, *histograms]) + "\n"


def cache_config(blocks: int, block_size: int, engine: str | None) -> list[str]:
    """vLLM's ``vllm:cache_config_info``: an info-style gauge (always 1) whose labels are the
    CacheConfig's fields, as strings (vllm/v1/metrics/loggers.py ``log_metrics_info``; V1 adds
    ``engine``, and there is no ``model_name``). A subset of the real label set, as the V0
    capture in ../shared/fixtures shows it."""
    labels = (
        f'block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",'
        f'gpu_memory_utilization="0.9",num_cpu_blocks="0",num_gpu_blocks="{blocks}",'
        'num_gpu_blocks_override="None"'
    )
    if engine is not None:
        labels += f',engine="{engine}"'
    return [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f"vllm:cache_config_info{{{labels}}} 1.0",
    ]


def vllm_v1_page(
    model: str,
    kv: Sequence[float],
    waiting: Sequence[float],
    running: Sequence[float],
    e2e: Sequence[CumulativeHistogram],
    timestamp_ms: int | None = None,
    blocks: int | None = 2048,
    block_size: int = 16,
) -> str:
    """One vLLM V1 server with one series per data-parallel engine. ``timestamp_ms`` stamps the
    gauges, as a caching or federating exporter would; ``blocks`` is each engine's KV pool
    (``None``: a server that publishes no cache config)."""
    stamp = "" if timestamp_ms is None else f" {timestamp_ms}"
    lines: list[str] = []
    if blocks is not None:
        for engine in range(len(kv)):
            block = cache_config(blocks, block_size, str(engine))
            lines += block if engine == 0 else block[2:]
    for family, doc, values in (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv),
    ):
        lines += [f"# HELP {family} {doc}", f"# TYPE {family} gauge"]
        for engine, value in enumerate(values):
            lines.append(f'{family}{{engine="{engine}",model_name="{model}"}} {value}{stamp}')
    for engine, histogram in enumerate(e2e):
        block = histogram.lines(
            "vllm:e2e_request_latency_seconds", f'engine="{engine}",model_name="{model}"'
        )
        lines += block if engine == 0 else block[2:]
    return "\n".join(lines) + "\n"


def vllm_v0_page(
    model: str,
    kv: float,
    waiting: float,
    running: float,
    e2e: CumulativeHistogram | None = None,
    timestamp_ms: int | None = None,
    blocks: int | None = 2048,
    block_size: int = 16,
) -> str:
    """An older vLLM (V0): no engine label, the KV gauge under its deprecated name."""
    label = f'model_name="{model}"'
    stamp = "" if timestamp_ms is None else f" {timestamp_ms}"
    latency = [] if e2e is None else e2e.lines("vllm:e2e_request_latency_seconds", label)
    info = [] if blocks is None else cache_config(blocks, block_size, None)
    return (
        "\n".join(
            [
                *info,
                "# HELP vllm:num_requests_running Number of requests currently running on GPU.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{label}}} {running}{stamp}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{label}}} {waiting}{stamp}",
                "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:gpu_cache_usage_perc gauge",
                f"vllm:gpu_cache_usage_perc{{{label}}} {kv}{stamp}",
                *latency,
            ]
        )
        + "\n"
    )


def _gauge(name: str, help_text: str, labels: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]


def epp_page(
    model: str,
    pool: str,
    kv: float,
    queue: float,
    latency: CumulativeHistogram,
    ready: int = 1,
    running: float = 0.0,
    generation: str = "llm-d",
    requests: float | None = None,
) -> str:
    """An EPP's page: its request-duration histogram, request counter and pool gauges.

    ``generation`` ``llm-d`` is llm-d-router >= 0.9 (``llm_d_epp_*``, and the ``inference_pool_*``
    twins it still emits, marked deprecated); ``gie`` is the Gateway API Inference Extension
    >= 1.1 (``inference_objective_*`` and ``inference_pool_*`` only). Label sets as upstream's
    golden test files (``../shared/fixtures``). ``running`` is the average per endpoint;
    ``requests`` the request counter (requests received; default: the histogram's count)."""
    name = f'name="{pool}"'
    requests = latency.total if requests is None else requests
    if generation == "gie":
        labels = f'model_name="{model}",target_model_name="{model}"'
        lines = latency.lines("inference_objective_request_duration_seconds", labels)
        lines += [
            "# TYPE inference_objective_request_total counter",
            f"inference_objective_request_total{{{labels}}} {requests}",
        ]
    else:
        labels = f'fairness_id="",model_name="{model}",priority="0",target_model_name="{model}"'
        lines = latency.lines("llm_d_epp_request_duration_seconds", labels)
        lines += [
            "# TYPE llm_d_epp_request_total counter",
            f"llm_d_epp_request_total{{{labels}}} {requests}",
            *_gauge("llm_d_epp_average_kv_cache_utilization", "The average kv cache.", name, kv),
            *_gauge("llm_d_epp_average_queue_size", "The average queue size.", name, queue),
            *_gauge("llm_d_epp_average_running_requests", "The average running.", name, running),
            *_gauge("llm_d_epp_ready_endpoints", "The number of ready endpoints.", name, ready),
        ]
    lines += [
        *_gauge("inference_pool_average_kv_cache_utilization", "Deprecated twin.", name, kv),
        *_gauge("inference_pool_average_queue_size", "Deprecated twin.", name, queue),
        *_gauge("inference_pool_average_running_requests", "Deprecated twin.", name, running),
        *_gauge("inference_pool_ready_pods", "Deprecated twin.", name, ready),
    ]
    return "\n".join(lines) + "\n"
