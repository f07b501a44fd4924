"""Where decided weights go. Kubernetes publishers arrive later; the protocol stays this one."""

from __future__ import annotations

from typing import Protocol

from controller.model import Decision


class Publisher(Protocol):
    """Applies a decision. Called only when the weights changed past the deadband.

    Raising means nothing was applied: the loop keeps the old weights as "in force" and the
    next tick decides again from them.
    """

    async def publish(self, decision: Decision) -> None: ...
