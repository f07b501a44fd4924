"""Where cluster signals come from. Every source answers the same question the same way."""

from __future__ import annotations

from typing import Protocol

from controller.model import ClusterMetrics


class ClusterMetricsSource(Protocol):
    """Reads one cluster's signals. ``fetch`` never raises for a bad endpoint: what went wrong
    is reported in ``ClusterMetrics.errors`` so one cluster cannot break a tick."""

    @property
    def cluster(self) -> str: ...

    async def fetch(self) -> ClusterMetrics: ...
