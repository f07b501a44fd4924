"""Where decided weights go: the dry-run publisher (logs and gauges) or Kubernetes objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from controller.model import Decision, Signals
from controller.settings import ClusterSettings


class Publisher(Protocol):
    """Called every tick. ``discover`` runs before the fetch; ``publish`` after the decision.

    ``publish`` gets every cluster's signals (``None`` = unhealthy) and the fleet-wide decision;
    a publisher that writes objects decides per object from the same pure weights function.
    Raising means nothing was applied: the fleet weights in force stay the old ones.
    """

    async def discover(self) -> Sequence[ClusterSettings]:
        """Clusters to watch beyond the configured ones (e.g. defined by annotations)."""
        ...

    async def publish(self, signals: Mapping[str, Signals | None], fleet: Decision) -> None: ...
