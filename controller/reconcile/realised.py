"""Realised share: did the router send each cluster the share its weight asked for?

Each tick adds, per cluster, the requests that reached it since its last fetch (``Arrivals``):
what its EPP's request counter says (``ClusterMetrics.arrived``), else the ones that completed
(``ClusterMetrics.completed``) plus the growth of those still running or waiting — completions
alone undercount a saturated cluster, which finishes only what it can. The first count
after a fetch that failed is dropped: a counter's increase then spans every interval since the
last good fetch, and would read as a burst of traffic.
Per target, a ``Window`` keeps those counts for its mapped refs beside the share the weights in
force intended, over ``weights.realised_window``. A tick where a cluster holding weight could
not be read is left out rather than counted as 0.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.model import ClusterMetrics, TargetDecision

MIN_REQUESTS = 50  # fewer requests in the window say nothing about a split


class Arrivals:
    """Requests that reached each cluster since its previous fetch (``None``: unknown)."""

    def __init__(self) -> None:
        self._in_system: dict[str, float] = {}  # running + waiting at the last counted fetch
        self.latest: dict[str, float | None] = {}
        self._failed: set[str] = set()  # clusters not counted since a fetch that failed

    def count(self, name: str, metrics: ClusterMetrics) -> None:
        counted = self._count(name, metrics)
        self.latest[name] = None if name in self._failed else counted
        if counted is not None:
            self._failed.discard(name)
        elif metrics.errors:
            self._failed.add(name)

    def _count(self, name: str, metrics: ClusterMetrics) -> float | None:
        if metrics.arrived is not None:  # the source counts arrivals itself (the EPP)
            return metrics.arrived
        if metrics.completed is None:
            return None
        in_system = None
        if metrics.running is not None and metrics.queue_depth is not None:
            in_system = metrics.running + metrics.queue_depth
        before = self._in_system.get(name)
        growth = in_system - before if in_system is not None and before is not None else 0.0
        if in_system is not None:
            self._in_system[name] = in_system
        return max(0.0, metrics.completed + growth)

    def forget(self, name: str) -> None:
        self._in_system.pop(name, None)
        self.latest.pop(name, None)
        self._failed.discard(name)


@dataclass(slots=True)
class Window:
    """One target's counts over the window: (time, requests per mapped ref, share intended per
    mapped ref), oldest first, and their sums kept as ticks come and go (a tick costs its own
    refs, not the window's; the sums are worked out afresh whenever the window empties)."""

    served: deque[tuple[float, dict[str, float], dict[str, float]]] = field(default_factory=deque)
    _requests: dict[str, float] = field(default_factory=dict)
    _intended: dict[str, float] = field(default_factory=dict)
    _present: dict[str, int] = field(default_factory=dict)  # ticks of the window counting a ref
    _shares: tuple[dict[str, float], dict[str, float]] | None = None  # as the last add left it

    def add(
        self,
        now: float,
        window: float,
        outcome: TargetDecision,
        arrived: Mapping[str, float | None],
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Count this tick for ``outcome``'s mapped refs; the realised and intended shares
        (0..100 over the mapped refs) over the window, or nothing while too few requests."""
        served = self.served
        while served and served[0][0] <= now - window:
            _, counts, shares = served.popleft()
            self._count(counts, shares, -1.0)
        if not served:  # start the sums afresh: nothing carried over but rounding
            self._requests, self._intended, self._present = {}, {}, {}
        mapped = {ref: c for ref, c in outcome.target.clusters.items() if c is not None}
        weights = {ref: outcome.applied.get(ref, 0) for ref in mapped}
        total = sum(weights.values())
        counts = _counts(mapped, weights, arrived)
        if counts and total > 0:
            shares = {ref: 100.0 * w / total for ref, w in weights.items()}
            served.append((now, counts, shares))
            self._count(counts, shares, 1.0)
        self._shares = None
        return self.shares()

    def _count(self, counts: Mapping[str, float], shares: Mapping[str, float], sign: float) -> None:
        requests, intended, present = self._requests, self._intended, self._present
        for ref, n in counts.items():
            requests[ref] = requests.get(ref, 0.0) + sign * n
            present[ref] = present.get(ref, 0) + int(sign)
            if present[ref] <= 0:  # in none of the window's ticks any more
                del requests[ref], present[ref]
        for ref, share in shares.items():
            intended[ref] = intended.get(ref, 0.0) + sign * share

    def shares(self) -> tuple[dict[str, float], dict[str, float]]:
        """The realised and intended shares over the window as the last ``add`` left it
        (worked out once: the report shows them, and the next tick's law reads them)."""
        if self._shares is None:
            self._shares = self._worked_out()
        return self._shares

    def _worked_out(self) -> tuple[dict[str, float], dict[str, float]]:
        requests = self._requests
        seen = sum(requests.values())
        if seen < MIN_REQUESTS or not self.served:
            return {}, {}
        ticks = len(self.served)
        realised = {ref: 100.0 * n / seen for ref, n in requests.items()}
        return realised, {ref: self._intended.get(ref, 0.0) / ticks for ref in realised}


def _counts(
    mapped: Mapping[str, str],
    weights: Mapping[str, int],
    arrived: Mapping[str, float | None],
) -> dict[str, float]:
    """This tick's arrivals per mapped ref; nothing if a ref holding weight has no count."""
    counts: dict[str, float] = {}
    for ref, cluster in mapped.items():
        count = arrived.get(cluster)
        if count is None:
            if weights[ref] > 0:
                return {}
            continue
        counts[ref] = count
    return counts
