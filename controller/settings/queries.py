"""The PromQL templates for clusters read through a Prometheus or Thanos Querier, built from
the family catalogue (``controller.families``) so that a name is spelled in one place.

``$selector`` becomes the cluster's matchers, each with a leading comma (``,cluster="b"``) or
nothing; ``$window`` the rate window; ``$quantile`` the quantile. ``vllm:`` names are matched as
``vllm[:_]…``: prometheus-client >= 0.23 serves ``vllm_…`` to a Prometheus that negotiates
OpenMetrics. Where a signal has several names, ``or`` keeps the first name's series and adds the
later names' only where the first has none (``or`` matches label sets without the name).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from controller.families import (
    EPP_LATENCY,
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
_LATENCY = (*EPP_LATENCY, VLLM_E2E)  # the EPP's histogram, newest name first, then vLLM's


class PrometheusQueries(BaseModel):
    """PromQL templates for clusters read through Prometheus (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: str = Field(
        default="1m",
        pattern=r"^[0-9]+(ms|s|m|h)$",
        description="Rate window for latency: at least 4 of Prometheus' scrape intervals.",
    )
    kv_mean: str = Field(
        default=f"avg({_KV})",
        description="Mean KV-cache use over pods and engines; the new name wins per series.",
    )
    kv_max: str = Field(default=f"max({_KV})", description="Highest KV-cache use of any engine.")
    kv_oldest: str = Field(
        default=f"min(timestamp({_KV}))",
        description="Time of the oldest KV sample: older than health.max_staleness is stale "
        "(Prometheus keeps returning a dead pod's last sample for 5 minutes).",
    )
    pods: str = Field(
        default=f"count(count by (job, instance) ({any_series(VLLM_KV)}))",
        description="Pods reporting KV-cache use.",
    )
    queue: str = Field(
        default=f"sum({series(VLLM_WAITING)})", description="Requests waiting, summed over pods."
    )
    running: str = Field(
        default=f"sum({series(VLLM_RUNNING)})", description="Requests running, summed over pods."
    )
    latency_quantile: str = Field(
        default=" or ".join(
            f"histogram_quantile($quantile, sum by (le) (rate({series(f, '_bucket')}[$window])))"
            for f in _LATENCY
        ),
        description="A latency quantile ($quantile): the EPP histogram, newest name first, "
        "then vLLM's e2e histogram.",
    )
    latency_requests: str = Field(
        default=" or ".join(f"sum(increase({series(f, '_count')}[$window]))" for f in _LATENCY),
        description="Requests in the window: below scrape.min_latency_requests latency is unknown.",
    )
