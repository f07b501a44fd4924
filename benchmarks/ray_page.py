"""A Ray node's metrics-export page holding Ray Serve LLM replicas of several models, for
``bench_exposition``'s Ray row (#42: a node page of 16 replicas of 3 models).

Shaped after a page a real Ray 2.60.0 head served (``tests/fixtures/README.md``): Ray's own
families make most of it (a 1,179-line page, median line 329 characters: the gRPC and
operation histograms by method, labelled ``Component``, ``NodeAddress``, ``SessionName``,
``Version`` and OpenTelemetry's scope), and each replica's vLLM series are named and tagged as
vLLM's Ray stat logger reports them (``vllm/v1/metrics/ray_wrappers.py``: ``ray_vllm_``,
``ReplicaId``, ``WorkerId``). Ray's own share is sized to the real page's; the numbers are
made up, and each node's page (``node``, ``seed``) names its own workers and replicas.
"""

from __future__ import annotations

import random

SESSION = "session_2026-12-04_21-29-38_098586_7125"
SCOPE = (
    'otel_scope_name="ray._private.telemetry.open_telemetry_metric_recorder",'
    'otel_scope_schema_url="",otel_scope_version=""'
)
E2E: tuple[float, ...] = (
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
)
E2E += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
MS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0)
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistral/Mistral-7B")
# Ray's own histograms by method, as the real page has them (gRPC server, operations)
RAY_HISTOGRAMS = {
    "ray_grpc_server_req_process_time_ms": 28,
    "ray_operation_run_time_ms": 10,
    "ray_operation_queue_time_ms": 10,
    "ray_gcs_storage_operation_latency_ms": 4,
}


def ray_node_page(
    replicas: int = 16, models: int = 3, node: str = "10.0.0.5", seed: int = 0
) -> str:
    rng = random.Random(seed)
    base = f'NodeAddress="{node}",SessionName="{SESSION}",Version="2.60.0"'
    out: list[str] = []
    for name, methods in RAY_HISTOGRAMS.items():
        out += [f"# HELP {name} Ray's own", f"# TYPE {name} histogram"]
        for m in range(methods):
            labels = f'Component="gcs_server",Method="ray.rpc.Service.Method{m}",{base}'
            count = rng.randint(10, 10_000)
            for bound in MS:
                out.append(f'{name}_bucket{{{labels},le="{bound}",{SCOPE}}} {float(count)}')
            out.append(f'{name}_bucket{{{labels},le="+Inf",{SCOPE}}} {float(count)}')
            out.append(f"{name}_count{{{labels},{SCOPE}}} {float(count)}")
            out.append(f"{name}_sum{{{labels},{SCOPE}}} {count * 1.5}")
    for m in range(66):
        out.append(
            f'ray_grpc_server_req_new_total{{Component="raylet",Method="M{m}",{base},{SCOPE}}}'
            f" {float(rng.randint(0, 9999))}"
        )
    # every node's replicas and workers are its own (Ray names them at random: an 8-character
    # replica id, a 56-hex-digit worker id), so no two nodes' pages share a wanted line
    units = [
        (
            f"{rng.getrandbits(32):08x}",
            MODELS[i % models],
            f"{rng.getrandbits(224):056x}",
            rng.random(),
        )
        for i in range(replicas)
    ]

    def tags(replica: str, worker: str, model: str | None) -> str:
        named = f',model_name="{model}"' if model else ""
        return (
            f'Component="core_worker",{base},ReplicaId="{replica}",WorkerId="{worker}",'
            f'engine="0"{named}'
        )

    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        out += [f"# HELP ray_vllm_{name} {name}", f"# TYPE ray_vllm_{name} gauge"]
        for replica, model, worker, kv in units:
            value = kv if name == "kv_cache_usage_perc" else float(rng.randint(0, 20))
            out.append(f"ray_vllm_{name}{{{tags(replica, worker, model)},{SCOPE}}} {value}")
    out += ["# HELP ray_vllm_cache_config_info info", "# TYPE ray_vllm_cache_config_info gauge"]
    for replica, _, worker, _ in units:
        out.append(
            f'ray_vllm_cache_config_info{{block_size="16",cache_dtype="auto",'
            f'{tags(replica, worker, None)},num_gpu_blocks="{rng.randint(10_000, 60_000)}",'
            f"{SCOPE}}} 1.0"
        )
    name = "ray_vllm_e2e_request_latency_seconds"
    out += [f"# HELP {name} e2e", f"# TYPE {name} histogram"]
    for replica, model, worker, _ in units:
        labels = tags(replica, worker, model)
        count = 0
        for bound in E2E:
            count += rng.randint(0, 50)
            out.append(f'{name}_bucket{{{labels},le="{bound}",{SCOPE}}} {float(count)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf",{SCOPE}}} {float(count)}')
        out.append(f"{name}_count{{{labels},{SCOPE}}} {float(count)}")
        out.append(f"{name}_sum{{{labels},{SCOPE}}} {count * 2.5}")
    return "\n".join(out) + "\n"
