"""Where decided weights go. Publishers read and write objects; they never decide.

Each tick the loop asks the publisher for the routing targets (``discover``) and, for every
target whose decided weights differ from what it holds, asks it to ``write`` them. The answer
says what happened (a ``WriteResult``): written, refused, a conflict with the object as read
afresh (the loop decides again from it), and so on.

- ``kubernetes``: ExternalModels and HTTPRoutes, found by ``controller.kube.discovery``;
- ``configured``: the implicit target over the configured clusters, when nothing is published;
- ``dryrun``: any of them writing nothing — the one place that answers "would write".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from controller.kube.discovery import Discovery
from controller.model import Target, WriteResult

__all__ = ["MAY_HAVE_LANDED", "Discoverer", "Discovery", "Publisher"]

# What a write sent and never answered leaves: the object read next tick says what it holds,
# and one that landed settles from the time its record carries (``reconcile.memory``).
MAY_HAVE_LANDED = "the next read shows it, and settle counts from its record if it did"


class Discoverer(Protocol):
    async def discover(self) -> Discovery:
        """The targets to weigh this tick; on an API failure, the last known ones."""
        ...


class Publisher(Discoverer, Protocol):
    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        """Make ``target`` hold ``desired`` (by ref name); ``why`` goes into the audit trail."""
        ...
