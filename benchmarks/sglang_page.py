"""A large SGLang /metrics page, for comparing what an SGLang page costs to read with a vLLM
page of the same size (``vllm_page``).

Rendered from SGLang's metrics collector (``python/sglang/srt/metrics/collector.py``,
sgl-project/sglang 00ae9c15), one scheduler per data-parallel rank, each as its
``SchedulerMetricsCollector`` writes itself once it has logged stats and served requests:
the gauges ``log_stats`` sets on every log (``SCHEDULER_GAUGES``; the ones it sets only on a
condition are left out), ``page_size`` and ``num_pages`` (SGLang >= 0.5.11, read for the pool),
the ``queue_time_seconds`` histogram with its buckets, ``per_stage_req_latency_seconds`` for the
one stage every request passes (``prefill_waiting``, as ``Scheduler.get_new_batch_prefill``
observes it; ``exponential_buckets(0.001, 1.62, 30)``)
and the counters labelled by mode (``realtime_tokens_total``, ``cuda_graph_passes_total``).
Each scheduler's series carry ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
``moe_ep_rank`` and ``dp_rank``. The tokenizer's series (labels ``model_name`` and
``engine_type``) come once a server: its counters and latency histograms, the e2e one with
its default buckets. Histograms and counters carry ``_created`` as prometheus_client writes
them. The numbers are made up. Data-parallel ranks set the size: the default 7 give
~150 KiB, as ``vllm_v1_page()`` is.

``gauges_only=True`` renders the page the reader likes least: only the scheduler gauges the
engine table names and a few others, no scheduler histograms, so that most of its lines are
wanted (the shape of this benchmark before 2026-12-06; 90 ranks give the same size).
"""

from __future__ import annotations

import random

CREATED = 1.7382173358407154e09
E2E: tuple[float, ...] = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
)
E2E += (1800, 2400)
# SchedulerMetricsCollector.log_stats at 00ae9c15, in its order (unconditional sets only)
SCHEDULER_GAUGES = (
    "num_running_reqs",
    "num_used_tokens",
    "token_usage",
    "pending_prealloc_token_usage",
    "swa_token_usage",
    "mamba_usage",
    "decode_sum_seq_lens",
    "gen_throughput",
    "num_queue_reqs",
    "num_grammar_queue_reqs",
    "num_running_reqs_offline_batch",
    "cache_hit_rate",
    "max_total_num_tokens",
    "spec_accept_length",
    "spec_accept_rate",
    "num_prefill_prealloc_queue_reqs",
    "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "kv_transfer_speed_gb_s",
    "kv_transfer_latency_ms",
    "kv_transfer_bootstrap_ms",
    "kv_transfer_alloc_ms",
    "kv_transfer_total_mb",
    "num_retracted_reqs",
    "num_paused_reqs",
    "utilization",
    "engine_startup_time",
    "new_token_ratio",
    "is_cuda_graph",
    "num_unique_running_routing_keys",
    "page_size",
    "num_pages",
)
# the benchmark's earlier page: the gauges the engine table reads, and five others
FEW_GAUGES = (
    "num_running_reqs",
    "num_used_tokens",
    "token_usage",
    "gen_throughput",
    "num_queue_reqs",
    "cache_hit_rate",
    "spec_accept_length",
    "num_grammar_queue_reqs",
    "page_size",
    "num_pages",
    "max_total_num_tokens",
)
QUEUE_TIME: tuple[float, ...] = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50)
QUEUE_TIME += (60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400)
QUEUE_TIME += (1600, 1800, 2000, 2500, 3000)
PER_STAGE = tuple(0.001 * 1.62**i for i in range(30))  # exponential_buckets(0.001, 1.62, 30)
SCHEDULER_COUNTERS = {
    "realtime_tokens": ("mode", ("prefill_compute", "prefill_cache", "decode")),
    "cuda_graph_passes": ("mode", ("decode_cuda_graph", "decode_none")),
}
COUNTERS = ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests")
HISTOGRAMS = (
    "e2e_request_latency_seconds",
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
)


def _histogram(
    rng: random.Random, name: str, labels: str, bounds: tuple[float, ...], created: bool
) -> list[str]:
    count, out = 0, []
    for bound in bounds:
        count += rng.randint(0, 50)
        out.append(f'sglang:{name}_bucket{{{labels},le="{float(bound)!r}"}} {count}.0')
    out.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {count}.0')
    out.append(f"sglang:{name}_count{{{labels}}} {count}.0")
    out.append(f"sglang:{name}_sum{{{labels}}} {count * rng.uniform(0.5, 3):.3f}")
    if created:
        out.append(f"sglang:{name}_created{{{labels}}} {CREATED!r}")
    return out


def sglang_page(
    seed: int = 0,
    ranks: int | None = None,
    model: str = "meta-llama/Llama-3.1-8B",
    gauges_only: bool = False,
) -> str:
    rng = random.Random(seed)
    ranks = ranks if ranks is not None else 90 if gauges_only else 7
    schedulers = [
        f'dp_rank="{r}",engine_type="unified",model_name="{model}",moe_ep_rank="0",'
        f'pp_rank="0",tp_rank="0"'
        for r in range(ranks)
    ]
    tokenizer = f'engine_type="unified",model_name="{model}"'
    created = not gauges_only
    out: list[str] = []
    for name in FEW_GAUGES if gauges_only else SCHEDULER_GAUGES:
        out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} gauge"]
        out += [f"sglang:{name}{{{labels}}} {rng.random():.4f}" for labels in schedulers]
    if not gauges_only:
        for name, bounds in (("queue_time_seconds", QUEUE_TIME),):
            out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} histogram"]
            for labels in schedulers:
                out += _histogram(rng, name, labels, bounds, created)
        name = "per_stage_req_latency_seconds"
        out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} histogram"]
        for labels in schedulers:
            out += _histogram(rng, name, labels + ',stage="prefill_waiting"', PER_STAGE, created)
        for name, (label, values) in SCHEDULER_COUNTERS.items():
            out += [f"# HELP sglang:{name}_total {name}", f"# TYPE sglang:{name}_total counter"]
            for labels in schedulers:
                for value in values:
                    head = f'sglang:{name}_%s{{{labels},{label}="{value}"}}'
                    out.append(head % "total" + f" {rng.randint(0, 10**7)}.0")
                    out.append(head % "created" + f" {CREATED!r}")
    for name in COUNTERS:
        out += [f"# HELP sglang:{name}_total {name}", f"# TYPE sglang:{name}_total counter"]
        out += [f"sglang:{name}_total{{{tokenizer}}} {rng.randint(0, 10**7)}.0"]
        if created:
            out += [f"sglang:{name}_created{{{tokenizer}}} {CREATED!r}"]
    for name in HISTOGRAMS:
        out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} histogram"]
        out += _histogram(rng, name, tokenizer, E2E, created)
    return "\n".join(out) + "\n"
