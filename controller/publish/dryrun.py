"""The publisher with nothing to write to: no Kubernetes (the demo, tests, a plain ``run``).

It finds no targets, so the loop weighs the configured clusters as one implicit target whose
weights exist only in the controller: logged, exported and shown, never written.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.model import Target, Write, WriteResult
from controller.publish import Discovery


class DryRunPublisher:
    async def discover(self) -> Discovery:
        return Discovery()

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        return WriteResult(Write.WOULD, target.holding(desired))
