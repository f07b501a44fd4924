"""A dry run: any discoverer as a publisher that writes nothing.

The one place that decides "would write": ``run --dry-run`` and a read-only ``once`` wrap the
Kubernetes publisher in it (it sends only GETs and LISTs), and the implicit target, which no
object holds, is always wrapped in it. What a dry run would apply is remembered by the loop
(``reconcile.memory``), so it moves as a live run would.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.model import Target, Write, WriteResult
from controller.publish import Discoverer, Discovery


class DryRun:
    def __init__(self, inner: Discoverer) -> None:
        self._inner = inner

    async def discover(self) -> Discovery:
        return await self._inner.discover()

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        return WriteResult(Write.WOULD, target.holding(desired))
