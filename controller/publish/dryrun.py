"""The publisher that writes nothing: logs and gauges only (no Kubernetes, the demo, tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

from controller.model import Decision, Signals
from controller.settings import ClusterSettings

log = structlog.get_logger("controller.publish")


class DryRunPublisher:
    def __init__(self) -> None:
        self.published: list[Decision] = []

    async def discover(self) -> Sequence[ClusterSettings]:
        return ()

    async def publish(self, signals: Mapping[str, Signals | None], fleet: Decision) -> None:
        if not fleet.changed or fleet.weights is None:
            return
        self.published.append(fleet)
        del self.published[:-100]  # bounded: a long-running dry run must not grow
        weights = " ".join(f"{n}={w}" for n, w in sorted(fleet.weights.items()))
        log.info("weights published", dry_run=True, mode=fleet.mode.value, weights=weights)
