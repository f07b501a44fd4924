"""A large vLLM V1-style /metrics page: three engines, LoRA adapters, HELP/TYPE, _created.

Shaped after a real vLLM 0.10+ server (family names and bucket layouts from vLLM's
``v1/metrics/loggers.py``); the numbers are made up but plausible. Its series are heavier than
vLLM's: each engine's series come once per model name, the base model's and each LoRA
adapter's, nine a family by default. vLLM labels a series with the served model's name and the
engine only (``labelnames = ["model_name", "engine"]`` in that file), and counts a LoRA
adapter's requests under the base model (vllm-project/vllm#10504). ``adapters=0`` gives vLLM's
own shape; the benchmarks keep the heavier page, on which #24's goals were set.
"""

from __future__ import annotations

import random

ENGINES = 3
MODELS = ("meta-llama/Llama-3.1-8B-Instruct",)
LORA = ("sql-lora", "chat-lora")
CREATED = 1.7382173358407154e09

GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage.",
}
COUNTERS = {
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
}
LATENCY = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKENS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)
HISTOGRAMS = {
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", LATENCY),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase.", LATENCY),
    "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase.", LATENCY),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT),
    "vllm:time_per_output_token_seconds": ("Histogram of time per output token.", TTFT),
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", TOKENS),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", TOKENS),
}


def _series(engines: int, lora: tuple[str, ...]) -> list[str]:
    return [
        f'engine="{engine}",model_name="{model}"'
        for engine in range(engines)
        for model in (*MODELS, *lora)
    ]


def vllm_v1_page(seed: int = 0, engines: int = ENGINES, adapters: int = len(LORA)) -> str:
    """The page of a server with ``engines`` data-parallel engines and ``adapters`` LoRA
    adapters (the defaults give ~150 KiB; 7 engines and 9 adapters 1,066 KiB)."""
    rng = random.Random(seed)
    lora = LORA[:adapters] + tuple(f"lora-{i}" for i in range(len(LORA), adapters))
    out: list[str] = []
    for name, doc in GAUGES.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        out += [f"{name}{{{labels}}} {rng.random():.4f}" for labels in _series(engines, lora)]
    for name, doc in COUNTERS.items():
        out += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter"]
        for labels in _series(engines, lora):
            out.append(f"{name}_total{{{labels}}} {rng.randint(0, 10**7)}.0")
            out.append(f"{name}_created{{{labels}}} {CREATED}")
    for name, (doc, bounds) in HISTOGRAMS.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
        for labels in _series(engines, lora):
            count = 0
            for bound in bounds:
                count += rng.randint(0, 50)
                out.append(f'{name}_bucket{{{labels},le="{bound}"}} {count}.0')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {count}.0')
            out.append(f"{name}_count{{{labels}}} {count}.0")
            out.append(f"{name}_sum{{{labels}}} {count * rng.uniform(0.5, 3):.3f}")
            out.append(f"{name}_created{{{labels}}} {CREATED}")
    running = ",".join(lora)
    out += [
        "# HELP vllm:lora_requests_info Running stats on lora requests.",
        "# TYPE vllm:lora_requests_info gauge",
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="{running}",'
        f'waiting_lora_adapters=""}} {CREATED}',
    ]
    return "\n".join(out) + "\n"
