"""How many requests run at once, over every cluster, and in what order the rest wait.

A plain FIFO semaphore interleaves the clusters: each takes its first slots early, and a
cluster with more pods than ``scrape.max_concurrency_per_cluster`` sends its last pages to the
back of the queue, behind every other cluster's first ones. Then every cluster's read is
half done at once, and every answered page waits in memory for its cluster's last (the peak
of a tick's memory, measured in benchmarks/HISTORY.md).
``Limiter`` serves waiters by rank, first come first served within one: a cluster's fetch
takes a rank when it starts (``ranked``), so its later pages go ahead of clusters that
started after it, and clusters finish about in the order they began. Slots a cluster may
hold are still bounded by its own semaphore, so a cluster of hanging pods holds no more.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from contextvars import ContextVar
from types import TracebackType

# The rank of the fetch the current task belongs to (lower goes first); tasks a fetch starts
# inherit it with their context.
_RANK: ContextVar[int] = ContextVar("limiter_rank", default=0)
_ranks = itertools.count(1)


def ranked() -> None:
    """Give the current task (a cluster's fetch) the next rank: after every fetch that
    started before it."""
    _RANK.set(next(_ranks))


class Limiter:
    """At most ``size`` holders at once (``async with``); waiters by rank, then arrival."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._live = 0  # waiters not yet served or cancelled (the heap keeps cancelled ones)
        self._arrivals = itertools.count()

    async def __aenter__(self) -> None:
        if self._free > 0 and self._live == 0:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (_RANK.get(), next(self._arrivals), future))
        self._live += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.cancelled():
                self._live -= 1
            else:
                self._release()  # handed a slot as it was cancelled: pass it on
            raise

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._release()

    def _release(self) -> None:
        """Hand the slot to the first live waiter, or free it."""
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                self._live -= 1
                return
        self._free += 1
