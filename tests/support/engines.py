"""A pod's /metrics page as each engine of the table writes it, rendered from the engines'
upstream sources (names, types, labels and layouts; the numbers are the test's):

- vLLM: ``vllm/v1/metrics/loggers.py`` (labels ``model_name``, ``engine``; one
  ``cache_config_info`` series per engine, its CacheConfig fields as label strings).
- SGLang: ``python/sglang/srt/metrics/collector.py`` (sgl-project/sglang 00ae9c15) and
  ``srt/observability/metrics_collector.py`` (016d8605): gauges in prometheus_client's
  multiprocess mode ``mostrecent``, labelled ``model_name``, ``engine_type``, ``tp_rank``,
  ``pp_rank``, ``moe_ep_rank`` and ``dp_rank`` with data parallelism (one scheduler each);
  with priority scheduling the totals carry ``priority=""`` beside one series per priority;
  ``page_size``/``num_pages``/``max_total_num_tokens`` set once at start; the e2e histogram's
  default buckets.
- Triton's TensorRT-LLM backend: ``custom_metrics_reporter.cc`` (tensorrtllm_backend
  c1e19638) and the README's "Triton Metrics" example: ``nv_trt_llm_request_metrics`` by
  ``request_type`` and ``nv_trt_llm_kv_cache_block_metrics`` by ``kv_cache_block_type``, both
  gauges labelled ``model`` and ``version``, beside Triton's own ``nv_inference_*`` families.
- trtllm-serve: ``tensorrt_llm/metrics/collector.py`` (NVIDIA/TensorRT-LLM 050f80de): the
  ``trtllm_`` gauges and e2e histogram, labelled ``model_name`` and ``engine_type`` as
  ``serve/openai_server.py`` sets them (``"undefined"`` unless a caller names them).
- Ray Serve LLM's vLLM: ``vllm/v1/metrics/ray_wrappers.py`` (``RayPrometheusStatLogger``:
  each ``vllm:`` name with ``:`` made ``_``, a ``ReplicaId`` tag beside ``model_name`` and
  ``engine``), exported by the Ray node's metrics agent with a ``ray_`` prefix and the
  worker's ``Component``, ``NodeAddress``, ``SessionName``, ``Version`` and ``WorkerId``, as a
  real Ray 2.60 head served it (labels sorted, OpenTelemetry's scope labels last).
- Ray Serve LLM's SGLang: ``sglang/srt/observability/ray_wrappers.py`` (sglang 0.5.23:
  ``sglang:`` made ``sglang_``, a ``ReplicaId`` tag read in the Serve replica's context) and
  ray 2.60's ``sglang_engine.py`` (``extra_metric_labels``: ``application``, ``deployment``,
  ``replica``), exported as Ray exports vLLM's; the scheduler's gauges from the rank-0
  scheduler actor (its own ``WorkerId``; ``ReplicaId`` empty there, as its context is not the
  replica's: inferred, not yet seen on a live Ray), the e2e histogram from the replica's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SGLANG_E2E_BOUNDS: tuple[float, ...] = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40)
SGLANG_E2E_BOUNDS += (60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
TRTLLM_E2E_BOUNDS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0)
TRTLLM_E2E_BOUNDS += (20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_E2E_BOUNDS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0)
VLLM_E2E_BOUNDS += (20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class Load:
    """What one pod's engine process(es) report: KV use, waiting and running requests (each
    split evenly over ``processes``), KV pool blocks per process, and completed requests."""

    kv: float
    waiting: int = 0
    running: int = 0
    blocks: int = 10_000
    block_size: int = 16
    completed: int = 100
    processes: int = 1


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in pairs)
    return f"{{{text}}}" if text else ""


def _family(name: str, kind: str, help_text: str, rows: Iterable[tuple[str, float]]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value!r}" for labels, value in rows]
    return "\n".join(lines) + "\n"


def _histogram(
    name: str, help_text: str, labels: list[tuple[str, str]], bounds: Iterable[float], count: int
) -> str:
    """A histogram with every request under its third bound (the rest of the layout empty)."""
    bounds = list(bounds)
    rows = [
        (f"{name}_bucket{_labels([*labels, ('le', repr(float(b)))])}", 0 if i < 2 else count)
        for i, b in enumerate(bounds)
    ]
    rows.append((f"{name}_bucket{_labels([*labels, ('le', '+Inf')])}", count))
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    lines += [f"{head} {float(value)!r}" for head, value in rows]
    lines.append(f"{name}_sum{_labels(labels)} {count * 0.7!r}")
    lines.append(f"{name}_count{_labels(labels)} {float(count)!r}")
    return "\n".join(lines) + "\n"


def vllm_page(load: Load, model: str = "llama") -> str:
    out = []
    engines = [[("engine", str(i)), ("model_name", model)] for i in range(load.processes)]
    share = load.processes
    for name, kind, value in (
        ("vllm:num_requests_running", "gauge", load.running / share),
        ("vllm:num_requests_waiting", "gauge", load.waiting / share),
        ("vllm:kv_cache_usage_perc", "gauge", load.kv),
        ("vllm:prompt_tokens_total", "counter", 12345.0),
    ):
        out.append(_family(name, kind, name, [(_labels(e), value) for e in engines]))
    info = [
        (
            _labels(
                [
                    ("block_size", str(load.block_size)),
                    ("cache_dtype", "auto"),
                    ("engine", str(i)),
                    ("num_gpu_blocks", str(load.blocks)),
                ]
            ),
            1.0,
        )
        for i in range(load.processes)
    ]
    out.append(
        _family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", info)
    )
    for e in engines:
        out.append(
            _histogram(
                "vllm:e2e_request_latency_seconds",
                "e2e",
                e,
                VLLM_E2E_BOUNDS,
                load.completed // share,
            )
        )
    return "".join(out)


def sglang_page(
    load: Load, model: str = "llama", priority: bool = False, spelling: str = "sglang:"
) -> str:
    """One scheduler per data-parallel rank (``processes``); ``priority``: the totals under
    ``priority=""`` and one series per priority beside them, as SGLang writes them."""
    ranks = [
        [
            ("dp_rank", str(i)),
            ("engine_type", "unified"),
            ("model_name", model),
            ("moe_ep_rank", "0"),
            ("pp_rank", "0"),
            ("tp_rank", "0"),
        ]
        for i in range(load.processes)
    ]
    share = load.processes
    out = []

    def gauge(name: str, value: float, split: bool = False) -> None:
        rows = []
        for r in ranks:
            if priority:
                rows.append((_labels([*r, ("priority", "")]), value))
                if split:  # per-priority series: a part each, never to be added to the total
                    rows += [(_labels([*r, ("priority", p)]), value / 2) for p in ("0", "1")]
            else:
                rows.append((_labels(r), value))
        out.append(_family(spelling + name, "gauge", name, rows))

    gauge("num_running_reqs", load.running / share, split=True)
    gauge("num_queue_reqs", load.waiting / share, split=True)
    gauge("num_used_tokens", load.kv * load.blocks * load.block_size)
    gauge("token_usage", load.kv)
    gauge("gen_throughput", 512.5)
    gauge("cache_hit_rate", 0.25)
    gauge("page_size", load.block_size)
    gauge("num_pages", load.blocks)
    gauge("max_total_num_tokens", load.blocks * load.block_size)
    tokenizer = [("engine_type", "unified"), ("model_name", model)]
    out.append(
        _family(
            spelling + "prompt_tokens_total",
            "counter",
            "prompt tokens",
            [(_labels(tokenizer), 4567.0)],
        )
    )
    out.append(
        _histogram(
            spelling + "e2e_request_latency_seconds",
            "e2e",
            tokenizer,
            SGLANG_E2E_BOUNDS,
            load.completed,
        )
    )
    return "".join(out)


def triton_trtllm_page(load: Load, model: str = "tensorrt_llm") -> str:
    base = [("model", model), ("version", "1")]
    requests = {
        "active": load.running + load.waiting,
        "max": 256,
        "scheduled": load.running,
        "context": 1,
        "waiting": load.waiting,
    }
    used = round(load.kv * load.blocks)
    blocks = {
        "max": load.blocks,
        "free": load.blocks - used,
        "used": used,
        "tokens_per": load.block_size,
        "reused": 0,
        "fraction": load.kv,
    }
    return "".join(
        [
            _family(
                "nv_trt_llm_request_metrics",
                "gauge",
                "TRT LLM request metrics",
                [
                    (_labels([*base[:1], ("request_type", k), *base[1:]]), float(v))
                    for k, v in requests.items()
                ],
            ),
            _family(
                "nv_trt_llm_kv_cache_block_metrics",
                "gauge",
                "TRT LLM KV cache block metrics",
                [
                    (_labels([("kv_cache_block_type", k), *base]), float(v))
                    for k, v in blocks.items()
                ],
            ),
            _family(
                "nv_inference_request_success",
                "counter",
                "Number of successful inference requests, all batch sizes",
                [(_labels(base), float(load.completed))],
            ),
            _family(
                "nv_inference_pending_request_count",
                "gauge",
                "Instantaneous number of pending requests awaiting execution per-model.",
                [(_labels(base), float(load.waiting))],
            ),
            _family(
                "nv_gpu_utilization",
                "gauge",
                "GPU utilization rate [0.0 - 1.0)",
                [(_labels([("gpu_uuid", "GPU-1b7e")]), 0.5)],
            ),
        ]
    )


def trtllm_serve_page(load: Load, model: str = "undefined") -> str:
    labels = [("engine_type", "undefined"), ("model_name", model)]
    out = []
    for name, value in (
        ("trtllm_kv_cache_utilization", load.kv),
        ("trtllm_kv_cache_hit_rate", 0.1),
        ("trtllm_num_requests_waiting", float(load.waiting)),
        ("trtllm_num_requests_running", float(load.running)),
        ("trtllm_kv_cache_max_blocks", float(load.blocks)),
        ("trtllm_kv_cache_free_blocks", float(load.blocks - round(load.kv * load.blocks))),
        ("trtllm_kv_cache_tokens_per_block", float(load.block_size)),
    ):
        out.append(_family(name, "gauge", name, [(_labels(labels), value)]))
    out.append(
        _family(
            "trtllm_request_success_total",
            "counter",
            "successes",
            [(_labels([*labels, ("finished_reason", "stop")]), load.completed)],
        )
    )
    out.append(
        _histogram(
            "trtllm_e2e_request_latency_seconds", "e2e", labels, TRTLLM_E2E_BOUNDS, load.completed
        )
    )
    return "".join(out)


@dataclass(frozen=True)
class Replica:
    """One Ray Serve replica of ``model`` on a node: its id, the worker process it runs in
    (a restart keeps the id under a new worker), its load, and whether its pool's info gauge
    is still on the page (Ray drops a gauge not set again; vLLM sets this one once)."""

    model: str
    load: Load
    replica: str = "llama-replica-0"
    worker: str = "01" * 28
    info: bool = True
    gauges: bool = True  # False: idle, its gauges dropped by Ray (vLLM sets them as it steps)


RAY_SESSION = "session_2026-12-04_21-29-38_098586_7125"


def ray_node_page(replicas: Iterable[Replica], node: str = "10.0.0.5") -> str:
    """A Ray node's metrics-export page holding ``replicas`` (of any models), beside some of
    Ray's own series for the node."""
    replicas = list(replicas)
    scope = [
        ("otel_scope_name", "ray._private.telemetry.open_telemetry_metric_recorder"),
        ("otel_scope_schema_url", ""),
        ("otel_scope_version", ""),
    ]

    def tags(
        r: Replica, engine: int, *more: tuple[str, str], model: bool = True
    ) -> list[tuple[str, str]]:
        return (
            sorted(
                [
                    ("Component", "core_worker"),
                    ("NodeAddress", node),
                    ("ReplicaId", r.replica),
                    ("SessionName", RAY_SESSION),
                    ("Version", "2.60.0"),
                    ("WorkerId", r.worker),
                    ("engine", str(engine)),
                    *([("model_name", r.model)] if model else []),
                    *more,
                ]
            )
            + scope
        )

    def engines(r: Replica) -> range:
        return range(r.load.processes)

    out = [
        _family(
            "ray_node_cpu_utilization",
            "gauge",
            "Total CPU usage on a ray node",
            [(_labels([("InstanceId", ""), ("ip", node), ("SessionName", RAY_SESSION)]), 12.5)],
        )
    ]

    def per_engine(load: Load) -> tuple[float, float, float]:
        return load.running / load.processes, load.waiting / load.processes, load.kv

    for at, name in enumerate(
        (
            "ray_vllm_num_requests_running",
            "ray_vllm_num_requests_waiting",
            "ray_vllm_kv_cache_usage_perc",
        )
    ):
        rows = [
            (_labels(tags(r, e)), per_engine(r.load)[at])
            for r in replicas
            if r.gauges
            for e in engines(r)
        ]
        out.append(_family(name, "gauge", name, rows))
    info = [
        (
            _labels(
                tags(  # the cache config's fields and the engine, as vLLM's info gauge
                    r,
                    e,
                    ("block_size", str(r.load.block_size)),
                    ("cache_dtype", "auto"),
                    ("num_gpu_blocks", str(r.load.blocks)),
                    model=False,
                )
            ),
            1.0,
        )
        for r in replicas
        if r.info
        for e in engines(r)
    ]
    out.append(_family("ray_vllm_cache_config_info", "gauge", "cache config", info))
    for r in replicas:
        for e in engines(r):
            out.append(
                _histogram(
                    "ray_vllm_e2e_request_latency_seconds",
                    "e2e",
                    tags(r, e),
                    VLLM_E2E_BOUNDS,
                    r.load.completed // r.load.processes,
                )
            )
    return "".join(out)


def ray_vllm_page(load: Load, model: str = "llama") -> str:
    """A Ray node holding one replica of ``model``, its id by its pool (two nodes of
    different pools hold two replicas; the same node read twice, one)."""
    return ray_node_page([Replica(model, load, f"{model}-{load.blocks}")])


def ray_sglang_page(load: Load, model: str = "llama") -> str:
    """A Ray node holding one SGLang replica of ``model`` (its id by its pool, as
    ``ray_vllm_page``): the scheduler's gauges and pool from one worker, the tokenizer's e2e
    histogram from another."""
    replica = f"{model}-{load.blocks}"
    ray = [
        ("NodeAddress", "10.0.0.5"),
        ("SessionName", RAY_SESSION),
        ("Version", "2.60.0"),
        ("application", "llm-app"),
        ("deployment", "LLMServer:llama"),
        ("replica", replica),
    ]
    scheduler = sorted(
        [
            *ray,
            ("Component", "core_worker"),
            ("ReplicaId", ""),
            ("WorkerId", "0a" * 28),
            ("engine_type", "unified"),
            ("model_name", model),
            ("moe_ep_rank", "0"),
            ("pp_rank", "0"),
            ("tp_rank", "0"),
        ]
    )
    tokenizer = sorted(
        [
            *ray,
            ("Component", "core_worker"),
            ("ReplicaId", replica),
            ("WorkerId", "0b" * 28),
            ("engine_type", "unified"),
            ("model_name", model),
        ]
    )

    def gauge(name: str, value: float) -> str:
        full = f"ray_sglang_{name}"
        return _family(full, "gauge", name, [(_labels(scheduler), value)])

    return "".join(
        [
            gauge("num_running_reqs", load.running),
            gauge("num_queue_reqs", load.waiting),
            gauge("token_usage", load.kv),
            gauge("page_size", load.block_size),
            gauge("num_pages", load.blocks),
            gauge("max_total_num_tokens", load.blocks * load.block_size),
            _histogram(
                "ray_sglang_e2e_request_latency_seconds",
                "e2e",
                tokenizer,
                SGLANG_E2E_BOUNDS,
                load.completed,
            ),
        ]
    )


# An engine of one's own (``engines[]`` in the config), and a page it writes.
OWN = {
    "name": "acme",
    "kv": 'acme_kv_blocks{kind="fraction"}',
    "waiting": "acme_queue",
    "running": 'acme_batch{state="active"}',
    "latency": "acme_request_seconds",
    "model_label": "served",
    "pool": {"block": 'acme_kv_blocks{kind="size"}', "count": 'acme_kv_blocks{kind="total"}'},
}


def acme_page(kv: float, waiting: int, running: int, served: str = "m") -> str:
    series = f'served="{served}"'
    return (
        "# TYPE acme_kv_blocks gauge\n"
        f'acme_kv_blocks{{kind="fraction",{series}}} {kv}\n'
        f'acme_kv_blocks{{kind="size",{series}}} 32\n'
        f'acme_kv_blocks{{kind="total",{series}}} 1000\n'
        f"acme_queue{{{series}}} {waiting}\n"
        f'acme_batch{{state="active",{series}}} {running}\n'
        f'acme_batch{{state="idle",{series}}} 99\n'
    )


PAGES = {
    "vllm": vllm_page,
    "sglang": sglang_page,
    "triton-tensorrt-llm": triton_trtllm_page,
    "trtllm-serve": trtllm_serve_page,
    "ray-vllm": ray_vllm_page,
    "ray-sglang": ray_sglang_page,
}
# The engines whose page gives latency (Triton's TensorRT-LLM backend has no histogram).
WITH_LATENCY = ("vllm", "sglang", "trtllm-serve", "ray-vllm", "ray-sglang")
