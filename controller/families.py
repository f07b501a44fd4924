"""The metric families the controller reads from the EPP and any process, newest name first;
what each model-serving engine publishes is its row in ``controller.engines``.

Where a tuple lists several names for one signal, the first present on a page wins (a page in
the middle of an upgrade may carry both). The scrape source reads pages by these names and the
PromQL templates (``settings.queries``) are built from them, so a rename upstream is one edit
here. The names are checked against the upstream sources and the real captures in
``../shared/fixtures`` (their README lists where each comes from):

- EPP latency: llm-d-router >= 0.9, then the Gateway API Inference Extension >= 1.1, then <= 1.0
  (pkg/epp/metrics/metrics.go in each).
- EPP pool gauges (label ``name``, the pool): the llm-d names, then their ``inference_pool_*``
  twins, still emitted by llm-d-router and the only ones in GIE.
"""

from __future__ import annotations

EPP_LATENCY = (
    "llm_d_epp_request_duration_seconds",
    "inference_objective_request_duration_seconds",
    "inference_model_request_duration_seconds",
)
# Requests the EPP handled (counted as it schedules each one: arrivals, not completions).
EPP_REQUESTS = (
    "llm_d_epp_request_total",
    "inference_objective_request_total",
    "inference_model_request_total",
)
EPP_KV = ("llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization")
EPP_QUEUE = ("llm_d_epp_average_queue_size", "inference_pool_average_queue_size")
EPP_RUNNING = (
    "llm_d_epp_average_running_requests",
    "inference_pool_average_running_requests",
)
# Endpoints whose metrics are fresh (the EPP's staleness threshold, 2 s by default). With none,
# the EPP stops updating its averages: they freeze at the last fresh values
# (llm-d-router pkg/epp/datalayer/logger/logger.go, refreshPrometheusMetrics).
EPP_READY = ("llm_d_epp_ready_endpoints", "inference_pool_ready_pods")

# prometheus_client's process collector, when the server exports it (vLLM's multiprocess
# registry does not): a page whose start time alternates is several processes behind one URL.
PROCESS_START = "process_start_time_seconds"

EPP_GAUGES = (*EPP_KV, *EPP_QUEUE, *EPP_RUNNING, *EPP_READY, *EPP_REQUESTS, PROCESS_START)
EPP_HISTOGRAMS = EPP_LATENCY
