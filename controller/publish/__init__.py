"""Where decided weights go. Publishers read and write objects; they never decide.

Each tick the loop asks the publisher for the routing targets (``discover``) and, for every
target whose decided weights differ from what it holds, asks it to ``write`` them. The answer
says what happened (a ``WriteResult``): written, refused, a conflict with the object as read
afresh (the loop decides again from it), and so on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.model import Target, WriteResult
from controller.settings import ClusterSettings


@dataclass(frozen=True, slots=True)
class Discovery:
    """What a publisher found: the targets it can write (an empty tuple: none, so the loop
    weighs the configured clusters as one implicit target) and the clusters that objects
    define beyond the configured ones (e.g. by annotations)."""

    targets: Sequence[Target] = ()
    clusters: Sequence[ClusterSettings] = field(default=())
    refused: Mapping[str, str] = field(default_factory=dict)  # objects not written, and why
    # Could the Kubernetes API be read this time (None: no Kubernetes), and if not, why.
    reachable: bool | None = None
    error: str | None = None


class Publisher(Protocol):
    async def discover(self) -> Discovery:
        """The targets to weigh this tick; on an API failure, the last known ones."""
        ...

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        """Make ``target`` hold ``desired`` (by ref name); ``why`` goes into the audit trail."""
        ...
