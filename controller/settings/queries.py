"""The PromQL templates for clusters read through a Prometheus or Thanos Querier, built from
the family catalogue (``controller.families``) so that a name is spelled in one place.

Placeholders: ``$selector`` becomes the matchers, each with a leading comma
(``,cluster=~"a|b"``) or nothing; ``$by`` the label the answer is grouped by (the querier's
cluster label, or nothing for a querier of one cluster's own) and ``$and_by`` the same after a
comma; ``$window`` the rate window and ``$lookback`` how far back a gauge's last sample is taken
(both follow the querier's push interval); ``$quantile`` the quantile. ``vllm:`` names are
matched as ``vllm[:_]…``: prometheus-client >= 0.23 serves ``vllm_…`` to a Prometheus that
negotiates OpenMetrics. Where a signal has several names, ``or`` keeps the first name's series
and adds the later names' only where the first has none (``or`` matches label sets without the
name).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from controller.families import (
    EPP_LATENCY,
    VLLM_CACHE_INFO,
    VLLM_E2E,
    VLLM_KV,
    VLLM_PREFIX,
    VLLM_RUNNING,
    VLLM_WAITING,
)


def series(family: str, suffix: str = "") -> str:
    """A selector of ``family`` (with ``suffix``: ``_bucket``, ``_count``) and ``$selector``."""
    if family.startswith(VLLM_PREFIX):
        rest = family.removeprefix(VLLM_PREFIX)
        return f'{{__name__=~"vllm[:_]{rest}{suffix}"$selector}}'
    return f'{{__name__="{family}{suffix}"$selector}}'


def any_series(families: tuple[str, ...]) -> str:
    """One selector for the series of any of ``families`` (all ``vllm:`` names)."""
    names = "|".join(family.removeprefix(VLLM_PREFIX) for family in families)
    return f'{{__name__=~"vllm[:_]({names})"$selector}}'


_KV = " or ".join(series(family) for family in VLLM_KV)
_KV_LAST = " or ".join(f"last_over_time({series(family)}[$lookback])" for family in VLLM_KV)
_LATENCY = (*EPP_LATENCY, VLLM_E2E)  # the EPP's histogram, newest name first, then vLLM's


class PrometheusQueries(BaseModel):
    """PromQL templates for clusters read through Prometheus (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: str = Field(
        default="1m",
        pattern=r"^[0-9]+(ms|s|m|h)$",
        description="Rate window for latency and requests, at least 4 of Prometheus' scrape "
        "intervals; a querier whose push interval is longer uses 4 of those instead.",
    )
    kv_mean: str = Field(
        default=f"avg by ($by) ({_KV_LAST})",
        description="Mean KV-cache use over pods and engines; the new name wins per series.",
    )
    kv_max: str = Field(
        default=f"max by ($by) ({_KV_LAST})", description="Highest KV-cache use of any engine."
    )
    kv_oldest: str = Field(
        default=f"min by ($by) (max_over_time(timestamp({_KV})[$lookback:]))",
        description="Time of the oldest pod's newest KV sample: older than "
        "health.max_staleness is stale (Prometheus keeps returning a dead pod's last sample "
        "for 5 minutes).",
    )
    pods: str = Field(
        default=f"count by ($by) (count by (job, instance$and_by) "
        f"(last_over_time({any_series(VLLM_KV)}[$lookback])))",
        description="Pods reporting KV-cache use.",
    )
    kv_pools: str = Field(
        default=f"count by (job, instance, num_gpu_blocks, block_size$and_by) "
        f"(last_over_time({series(VLLM_CACHE_INFO)}[$lookback]))",
        description="Engines by pod and KV pool (vllm:cache_config_info's num_gpu_blocks "
        "and block_size labels; PromQL cannot read a label as a number, so the controller "
        "sums engines × blocks × block size). Fewer pods here than pods reporting KV: "
        "capacity in pods.",
    )
    queue: str = Field(
        default=f"sum by ($by) (last_over_time({series(VLLM_WAITING)}[$lookback]))",
        description="Requests waiting, summed over pods.",
    )
    running: str = Field(
        default=f"sum by ($by) (last_over_time({series(VLLM_RUNNING)}[$lookback]))",
        description="Requests running, summed over pods.",
    )
    latency_quantile: str = Field(
        default=" or ".join(
            "histogram_quantile($quantile, sum by (le$and_by) "
            f"(rate({series(f, '_bucket')}[$window])))"
            for f in _LATENCY
        ),
        description="A latency quantile ($quantile): the EPP histogram, newest name first, "
        "then vLLM's e2e histogram.",
    )
    latency_requests: str = Field(
        default=" or ".join(
            f"sum by ($by) (increase({series(f, '_count')}[$window]))" for f in _LATENCY
        ),
        description="Requests in the window: below scrape.min_latency_requests latency is unknown.",
    )
