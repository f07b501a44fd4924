"""The publisher that writes nothing: logs and gauges only (``--dry-run``, the demo, tests)."""

from __future__ import annotations

import structlog

from controller.model import Decision

log = structlog.get_logger("controller.publish")


class DryRunPublisher:
    def __init__(self) -> None:
        self.published: list[Decision] = []

    async def publish(self, decision: Decision) -> None:
        self.published.append(decision)
        del self.published[:-100]  # bounded: a long-running dry run must not grow
        weights = " ".join(f"{n}={w}" for n, w in sorted((decision.weights or {}).items()))
        log.info("weights published", dry_run=True, mode=decision.mode.value, weights=weights)
