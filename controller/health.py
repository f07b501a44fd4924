"""Pure: is a cluster's data usable? A per-cluster state machine with hysteresis both ways.

- A fetch is *good* when enough pods answered, the KV-cache signal is known and fresh.
- A healthy cluster turns unhealthy after ``failures_to_unhealthy`` bad fetches in a row, or at
  once when its data are stale or every page refused the connection (nothing listens: the
  servers are gone, and every request sent there fails); until then weighting keeps using its
  last good signals.
- A fetch that failed only by timing out is weaker evidence: a cluster that answered a moment
  ago and then does not answer in time may be serving while the path to its metrics is slow
  (a busy router, a hub far from its spoke). Timeouts count towards ``timeouts_to_unhealthy``
  instead, the way Envoy's outlier detection keeps local-origin failures (timeouts, resets)
  apart from the upstream's own 5xx (``split_external_local_origin_errors``,
  ``consecutive_local_origin_failure``: envoy docs, intro/arch_overview/upstream/
  outlier). Staleness still bounds it: the held reading is used until it is too old.
- An unhealthy cluster turns healthy again only after ``successes_to_healthy`` good fetches.
- At start-up there is no history to distrust: the first good fetch makes a cluster healthy,
  the first bad one unhealthy.
"""

from __future__ import annotations

from collections import Counter

from controller.model import ClusterHealth, ClusterMetrics, Reason
from controller.settings import HealthSettings


def failure_reason(metrics: ClusterMetrics, settings: HealthSettings, now: float) -> Reason | None:
    """Why this fetch cannot be used, or ``None`` when it can."""
    if metrics.pods_answering == 0:
        return _dominant(metrics) or Reason.NO_PODS
    if metrics.pods_answering < settings.min_pod_fraction * metrics.pods_scraped:
        return _dominant(metrics) or Reason.NO_PODS
    if metrics.kv_mean is None:
        return Reason.MISSING_METRIC
    if _age(metrics, now) > settings.max_staleness or _from_the_future(metrics, now):
        return Reason.STALE
    return None


def _dominant(metrics: ClusterMetrics) -> Reason | None:
    counts = Counter(error.reason for error in metrics.errors)
    return counts.most_common(1)[0][0] if counts else None


# A sample stamped this far ahead of our clock is not trusted to be fresh: its age cannot be
# known (a pod's clock is wrong, or a replayed page); small skews between clocks are normal.
CLOCK_SKEW = 5.0


def _from_the_future(metrics: ClusterMetrics, now: float) -> bool:
    newest = metrics.observed_newest
    return newest is not None and newest > now + CLOCK_SKEW


def _age(metrics: ClusterMetrics, now: float) -> float:
    observed = metrics.observed_at if metrics.observed_at is not None else metrics.scraped_at
    return now - observed


def judge(
    previous: ClusterHealth | None,
    metrics: ClusterMetrics,
    settings: HealthSettings,
    now: float,
) -> ClusterHealth:
    """The cluster's health after this fetch, given its health before it."""
    reason = failure_reason(metrics, settings, now)
    degraded = reason is None and (metrics.pods_answering < metrics.pods_scraped)
    if reason is None:
        return _after_success(previous, metrics, settings, degraded)
    return _after_failure(previous, reason, settings, now, _all_pages(metrics))


def all_refused(metrics: ClusterMetrics) -> bool:
    """No page answered and every one refused the connection."""
    return _all_pages(metrics) is Reason.REFUSED


def _all_pages(metrics: ClusterMetrics) -> Reason | None:
    """The reason every page failed by, when none answered and they all failed alike."""
    reasons = {e.reason for e in metrics.errors}
    if metrics.pods_answering == 0 and len(reasons) == 1:
        return reasons.pop()
    return None


def _after_success(
    previous: ClusterHealth | None,
    metrics: ClusterMetrics,
    settings: HealthSettings,
    degraded: bool,
) -> ClusterHealth:
    if previous is None or previous.healthy:
        successes = previous.successes + 1 if previous else 1
        return ClusterHealth(True, None, 0, successes, degraded, previous is None, metrics)
    successes = previous.successes + 1
    recovered = successes >= settings.successes_to_healthy
    reason = None if recovered else previous.reason
    return ClusterHealth(recovered, reason, 0, successes, degraded, recovered, metrics)


def _after_failure(
    previous: ClusterHealth | None,
    reason: Reason,
    settings: HealthSettings,
    now: float,
    every_page: Reason | None = None,
) -> ClusterHealth:
    failures = previous.failures + 1 if previous else 1
    timeouts = (previous.timeouts if previous else 0) + (every_page is Reason.TIMEOUT)
    if previous is None or not previous.healthy:
        return ClusterHealth(False, reason, failures, 0, False, previous is None, None, timeouts)
    held = previous.metrics
    if held is not None and _age(held, now) > settings.max_staleness:
        reason = Reason.STALE
    if (
        reason is Reason.STALE
        or every_page is Reason.REFUSED
        or failures - timeouts >= settings.failures_to_unhealthy
        or failures >= settings.timeouts_to_unhealthy
    ):
        return ClusterHealth(False, reason, failures, 0, False, True, None, timeouts)
    # Still healthy on the strength of the last good fetch; weighting keeps using it.
    return ClusterHealth(True, reason, failures, 0, True, False, held, timeouts)
