"""What each model-serving engine publishes: one row per engine, read by the page reader, the
fakes and the docs. Adding an engine is a row here, a page rendered from its upstream source
in ``tests/support/engines.py`` and a line in ``tests/unit/test_engines.py``.

A row names, for its pods' ``/metrics`` page: the KV-cache use (a fraction 0..1 of the pool),
the requests waiting and running, the end-to-end latency histogram (if any), the label that
names the served model, and how a pod's KV pool size in tokens is read. Where a signal has
several names, the first present on a page wins (newest first); a family may be read by
label (``Family.match``, matched as Prometheus matches ``{label="value"}``: ``""`` also
matches a series without the label).

The rows follow llm-d-router's metrics extractor, which picks one per pod by its
``llm-d.ai/engine-type`` label (``pkg/epp/framework/plugins/datalayer/extractor/metrics/
factories.go``, llm-d/llm-d-router at ebab6879 and PR #2619), and each engine's own source:

- vLLM: ``vllm/v1/metrics/loggers.py`` (``kv_cache_usage_perc`` from v0.9.2,
  ``gpu_cache_usage_perc`` before and removed in v0.12; ``cache_config_info``'s
  ``num_gpu_blocks`` and ``block_size`` labels, one series per engine).
- SGLang: ``python/sglang/srt/metrics/collector.py`` (sgl-project/sglang 00ae9c15;
  ``srt/observability/metrics_collector.py`` at 016d8605): ``token_usage`` is used/total
  (0..1), the queue and running gauges per scheduler (labels ``model_name``, ``engine_type``,
  ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, and ``dp_rank`` with data parallelism). With
  priority scheduling the totals carry ``priority=""`` beside one series per priority, so
  only ``priority=""`` (or none) counts. The pool: ``sglang:page_size`` × ``sglang:num_pages``
  (SGLang >= 0.5.11, llm-d-router #2619), the ``page_size``/``num_pages`` labels of
  ``sglang:cache_config_info`` before that, or ``sglang:max_total_num_tokens``.
- Triton with the TensorRT-LLM backend: ``inflight_batcher_llm/src/custom_metrics_reporter/
  custom_metrics_reporter.cc`` (triton-inference-server/tensorrtllm_backend c1e19638): two
  gauge families read by label, ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=
  "fraction"|"max"|"tokens_per"}`` and ``nv_trt_llm_request_metrics{request_type="waiting"|
  "scheduled"}``, labelled ``model`` and ``version``. No latency histogram.
- trtllm-serve: ``tensorrt_llm/metrics/collector.py`` (NVIDIA/TensorRT-LLM 050f80de), served on
  ``/prometheus/metrics`` (``/metrics`` is JSON there) when ``return_perf_metrics`` is set;
  labels ``model_name`` and ``engine_type``.

prometheus-client >= 0.23 serves a ``ns:`` name as ``ns_`` to a client that negotiates
OpenMetrics; every name with a colon is read under both spellings (``spellings``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

Match = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Family:
    """One signal's metric family: its names, newest first, and the labels a series must
    carry (``""``: absent or empty, as in PromQL)."""

    names: tuple[str, ...]
    match: Match = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key, "") == value for key, value in self.match)

    def __str__(self) -> str:
        matchers = ",".join(f'{k}="{v}"' for k, v in self.match)
        return " or ".join(f"{n}{{{matchers}}}" if matchers else n for n in self.names)


@dataclass(frozen=True, slots=True)
class Pool:
    """How a pod's KV pool size in tokens is read; each rule is tried in turn.

    ``info``: an info-style gauge whose labels ``block_label`` and ``count_label`` hold the
    block size and block count, one series per engine process (``engine_label``). ``block``
    and ``count``: two gauges multiplied, series by series. ``tokens``: one gauge in tokens."""

    info: str | None = None
    block_label: str = ""
    count_label: str = ""
    engine_label: str = ""
    block: Family | None = None
    count: Family | None = None
    tokens: Family | None = None


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    kv: Family
    waiting: Family
    running: Family
    latency: str | None  # a histogram family (``_bucket``, ``_count``, ``_sum``)
    model_label: str
    pools: tuple[Pool, ...] = ()
    # Requests a process has completed since it started, for a row without a latency
    # histogram (whose ``_count`` says it otherwise): a count that falls and comes back is
    # one URL answering as several processes (``sources.between.Continuity``).
    completed: str | None = None
    # A page that holds several serving processes, each with series of its own: a Ray node's
    # page holds every Ray Serve replica placed on it, of every model, told apart by
    # ``replica_label``. Each replica is read as a pod, whatever node page it is on; a replica
    # restarted keeps its id under a new ``process_label`` (Ray's ``WorkerId``).
    replica_label: str | None = None
    process_label: str | None = None
    # The label naming the node a page is served by, on every series of its: Ray's agent
    # tags each metric with its node's ``NodeAddress`` (with ``SessionName`` and
    # ``Version``). One URL's pages never change it: a URL whose pages do is several nodes.
    node_label: str | None = None

    def gauges(self) -> Iterator[str]:
        """Every gauge family name this row reads."""
        yield from self.kv.names
        yield from self.waiting.names
        yield from self.running.names
        if self.completed:
            yield self.completed
        for pool in self.pools:
            if pool.info:
                yield pool.info
            for family in (pool.block, pool.count, pool.tokens):
                if family is not None:
                    yield from family.names


def _sglang(name: str, prefix: str = "sglang:") -> Family:
    return Family((f"{prefix}{name}",), (("priority", ""),))


def _sglang_row(name: str, prefix: str, replica_label: str | None = None) -> Engine:
    """SGLang's names under ``prefix``: its own (``sglang:``), or as Ray exports them."""
    return Engine(
        name=name,
        kv=_sglang("token_usage", prefix),
        waiting=_sglang("num_queue_reqs", prefix),
        running=_sglang("num_running_reqs", prefix),
        latency=f"{prefix}e2e_request_latency_seconds",
        model_label="model_name",
        pools=(
            Pool(block=_sglang("page_size", prefix), count=_sglang("num_pages", prefix)),
            Pool(
                info=f"{prefix}cache_config_info", block_label="page_size", count_label="num_pages"
            ),
            Pool(tokens=_sglang("max_total_num_tokens", prefix)),
        ),
        replica_label=replica_label,
        node_label="NodeAddress" if replica_label else None,
    )


def _trt(family: str, label: str, value: str) -> Family:
    return Family((family,), ((label, value),))


_TRT_BLOCKS, _TRT_REQUESTS = "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"

VLLM = Engine(
    name="vllm",
    kv=Family(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    waiting=Family(("vllm:num_requests_waiting",)),
    running=Family(("vllm:num_requests_running",)),
    latency="vllm:e2e_request_latency_seconds",
    model_label="model_name",
    pools=(
        Pool(
            info="vllm:cache_config_info",
            block_label="block_size",
            count_label="num_gpu_blocks",
            engine_label="engine",
        ),
    ),
)
SGLANG = _sglang_row("sglang", "sglang:")
TRITON_TENSORRT_LLM = Engine(
    name="triton-tensorrt-llm",
    kv=_trt(_TRT_BLOCKS, "kv_cache_block_type", "fraction"),
    waiting=_trt(_TRT_REQUESTS, "request_type", "waiting"),
    running=_trt(_TRT_REQUESTS, "request_type", "scheduled"),
    latency=None,
    model_label="model",
    # Triton's own counter ("Number of successful inference requests, all batch sizes"),
    # labelled model and version (triton-inference-server/server docs/user_guide/metrics.md)
    completed="nv_inference_request_success",
    pools=(
        Pool(
            block=_trt(_TRT_BLOCKS, "kv_cache_block_type", "tokens_per"),
            count=_trt(_TRT_BLOCKS, "kv_cache_block_type", "max"),
        ),
    ),
)
TRTLLM_SERVE = Engine(
    name="trtllm-serve",
    kv=Family(("trtllm_kv_cache_utilization",)),
    waiting=Family(("trtllm_num_requests_waiting",)),
    running=Family(("trtllm_num_requests_running",)),
    latency="trtllm_e2e_request_latency_seconds",
    model_label="model_name",
    pools=(
        Pool(
            block=Family(("trtllm_kv_cache_tokens_per_block",)),
            count=Family(("trtllm_kv_cache_max_blocks",)),
        ),
    ),
)

RAY_VLLM = Engine(
    name="ray-vllm",
    kv=Family(("ray_vllm_kv_cache_usage_perc", "ray_vllm_gpu_cache_usage_perc")),
    waiting=Family(("ray_vllm_num_requests_waiting",)),
    running=Family(("ray_vllm_num_requests_running",)),
    latency="ray_vllm_e2e_request_latency_seconds",
    model_label="model_name",
    pools=(
        Pool(
            info="ray_vllm_cache_config_info",
            block_label="block_size",
            count_label="num_gpu_blocks",
            engine_label="engine",
        ),
    ),
    replica_label="ReplicaId",
    process_label="WorkerId",
    node_label="NodeAddress",
)


# SGLang inside Ray Serve LLM (ray 2.60 ``llm/_internal/serve/engines/sglang/
# sglang_engine.py``: ``sglang.srt.ray.engine.RayEngine`` with ``enable_metrics`` and
# ``extra_metric_labels`` {application, deployment, replica: the Serve replica's id}). SGLang
# reports through ``ray.util.metrics`` (sglang 0.5.23 ``srt/observability/ray_wrappers.py``:
# ``sglang:`` made ``sglang_``, a ``ReplicaId`` tag), and Ray's agent adds ``ray_`` and its
# ``WorkerId`` (the names ray's own Serve LLM SGLang dashboard queries:
# ``serve_llm_sglang_dashboard_panels.py``). The scheduler's gauges come from the rank-0
# scheduler actor, the e2e histogram from the replica's: two workers of one replica, and
# ``ReplicaId`` is read only in the replica's context, so the replica is told by the
# ``replica`` label both carry, and a worker is not a process of its own (no process_label:
# a replica restarted under the same id is not told apart while its old series linger).
RAY_SGLANG = _sglang_row("ray-sglang", "ray_sglang_", replica_label="replica")

# The built-in rows, in the order ``auto`` tries them on a page.
ENGINES: dict[str, Engine] = {
    e.name: e for e in (VLLM, SGLANG, TRITON_TENSORRT_LLM, TRTLLM_SERVE, RAY_VLLM, RAY_SGLANG)
}
AUTO = "auto"


def spellings(name: str) -> list[str]:
    """``name`` as a page may write it: ``ns:rest`` also as ``ns_rest``."""
    return [name, name.replace(":", "_")] if ":" in name else [name]


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SPEC = re.compile(rf"({_NAME})(?:\{{(.*)\}})?")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?:"([^"\\]*)"|([^,"\s]*))\s*(?:,|$)')


def parse_family(text: str) -> Family:
    """A family as llm-d-router's engine configs write one: ``name`` or
    ``name{label="value",…}`` (a value quoted or not; no escapes, no other operator than
    ``=``). A ValueError says what is wrong."""
    spec = _SPEC.fullmatch(text.strip())
    if spec is None:
        raise ValueError(f"{text!r} is not 'name' or 'name{{label=\"value\",...}}'")
    name, body = spec.group(1), (spec.group(2) or "").strip()
    match: list[tuple[str, str]] = []
    at = 0
    while at < len(body):
        matcher = _MATCHER.match(body, at)
        if matcher is None or matcher.end() == at:
            raise ValueError(f'{text!r}: {body[at:].strip()!r} is not label="value"')
        label, quoted, bare = matcher.groups()
        if any(label == k for k, _ in match):
            raise ValueError(f"{text!r}: label {label!r} given twice")
        match.append((label, quoted if quoted is not None else bare))
        at = matcher.end()
    return Family((name,), tuple(match))
