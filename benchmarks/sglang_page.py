"""A large SGLang /metrics page, for comparing what an SGLang page costs to read with a vLLM
page of the same size (``vllm_page``).

Shaped after SGLang's metrics collector (``python/sglang/srt/metrics/collector.py``,
sgl-project/sglang 00ae9c15): gauges and counters prefixed ``sglang:``, each scheduler's
series labelled ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` and
``dp_rank`` (one scheduler per data-parallel rank), the tokenizer's histograms labelled
``model_name`` and ``engine_type``; the e2e histogram with its default buckets. The other
histograms reuse that layout (their sizes matter here, not their bounds); the numbers are made
up. Data-parallel ranks set the size: the default 90 give ~150 KiB, as ``vllm_v1_page()`` is
(a real server has far fewer; the page is scaled to compare like with like).
"""

from __future__ import annotations

import random

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
GAUGES = (
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
COUNTERS = ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests")
HISTOGRAMS = (
    "e2e_request_latency_seconds",
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
)


def sglang_page(seed: int = 0, ranks: int = 90, model: str = "meta-llama/Llama-3.1-8B") -> str:
    rng = random.Random(seed)
    schedulers = [
        f'dp_rank="{r}",engine_type="unified",model_name="{model}",moe_ep_rank="0",'
        f'pp_rank="0",tp_rank="0"'
        for r in range(ranks)
    ]
    tokenizer = f'engine_type="unified",model_name="{model}"'
    out: list[str] = []
    for name in GAUGES:
        out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} gauge"]
        out += [f"sglang:{name}{{{labels}}} {rng.random():.4f}" for labels in schedulers]
    for name in COUNTERS:
        out += [f"# HELP sglang:{name}_total {name}", f"# TYPE sglang:{name}_total counter"]
        out += [f"sglang:{name}_total{{{tokenizer}}} {rng.randint(0, 10**7)}.0"]
    for name in HISTOGRAMS:
        out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} histogram"]
        for labels in (tokenizer,):
            count = 0
            for bound in E2E:
                count += rng.randint(0, 50)
                out.append(f'sglang:{name}_bucket{{{labels},le="{float(bound)}"}} {count}.0')
            out.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {count}.0')
            out.append(f"sglang:{name}_sum{{{labels}}} {count * rng.uniform(0.5, 3):.3f}")
            out.append(f"sglang:{name}_count{{{labels}}} {count}.0")
    return "\n".join(out) + "\n"
