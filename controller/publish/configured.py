"""The implicit target: the configured clusters weighed as one traffic split, when nothing is
published to (no Kubernetes: the demo, the simulator, a plain ``run``).

No object holds it, so it always reads as holding nothing, and it is only ever used wrapped in
a ``DryRun`` (``implicit()``): what it would hold lives in the loop's dry-run shadow, logged,
exported and shown, never written. With Kubernetes on there is no implicit target: a target is
an object someone opted in.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.model import IMPLICIT_TARGET, Ref, Target
from controller.publish import Discovery, Publisher
from controller.publish.dryrun import DryRun


class Configured:
    def __init__(self, clusters: Iterable[str]) -> None:
        refs = tuple(Ref("", "", name, 0, name) for name in clusters)
        self._found = Discovery((Target(IMPLICIT_TARGET, "", IMPLICIT_TARGET, "", "", refs),))

    async def discover(self) -> Discovery:
        return self._found


def implicit(clusters: Iterable[str]) -> Publisher:
    """The implicit target over ``clusters``, as a publisher that writes nothing."""
    return DryRun(Configured(clusters))
