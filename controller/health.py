"""Pure: is a cluster's data usable? A per-cluster state machine with hysteresis both ways.

- A fetch is *good* when enough pods answered, the KV-cache signal is known and fresh.
- A healthy cluster turns unhealthy after ``failures_to_unhealthy`` bad fetches in a row, or at
  once when its data are stale or every page refused the connection (nothing listens: the
  servers are gone, and every request sent there fails); until then weighting keeps using its
  last good signals. A timeout may be a slow network, so it waits for the second.
- An unhealthy cluster turns healthy again only after ``successes_to_healthy`` good fetches.
- At start-up there is no history to distrust: the first good fetch makes a cluster healthy,
  the first bad one unhealthy.
"""

from __future__ import annotations

from collections import Counter

from controller.model import ClusterHealth, ClusterMetrics, Reason
from controller.settings import HealthSettings


def failure_reason(
    metrics: ClusterMetrics, min_pod_fraction: float, max_staleness: float, now: float
) -> Reason | None:
    """Why this fetch cannot be used, or ``None`` when it can."""
    if metrics.pods_answering == 0:
        return _dominant(metrics) or Reason.NO_PODS
    if metrics.pods_answering < min_pod_fraction * metrics.pods_scraped:
        return _dominant(metrics) or Reason.NO_PODS
    if metrics.kv_mean is None:
        return Reason.MISSING_METRIC
    if _age(metrics, now) > max_staleness or _from_the_future(metrics, now):
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
    min_pod_fraction: float,
    now: float,
) -> ClusterHealth:
    """The cluster's health after this fetch, given its health before it."""
    reason = failure_reason(metrics, min_pod_fraction, settings.max_staleness, now)
    degraded = reason is None and (metrics.pods_answering < metrics.pods_scraped)
    if reason is None:
        return _after_success(previous, metrics, settings, degraded)
    return _after_failure(previous, reason, settings, now, refused=all_refused(metrics))


def all_refused(metrics: ClusterMetrics) -> bool:
    """No page answered and every one refused the connection."""
    errors = metrics.errors
    return (
        metrics.pods_answering == 0
        and bool(errors)
        and all(e.reason is Reason.REFUSED for e in errors)
    )


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
    refused: bool = False,
) -> ClusterHealth:
    failures = previous.failures + 1 if previous else 1
    if previous is None or not previous.healthy:
        return ClusterHealth(False, reason, failures, 0, False, previous is None, None)
    held = previous.metrics
    if held is not None and _age(held, now) > settings.max_staleness:
        reason = Reason.STALE
    if reason is Reason.STALE or refused or failures >= settings.failures_to_unhealthy:
        return ClusterHealth(False, reason, failures, 0, False, True, None)
    # Still healthy on the strength of the last good fetch; weighting keeps using it.
    return ClusterHealth(True, reason, failures, 0, True, False, held)
