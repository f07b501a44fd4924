"""How many requests run at once, over every cluster, and in what order the rest wait.

A plain FIFO semaphore interleaves the clusters: each takes its first slots early, and a
cluster with more pods than ``scrape.max_concurrency_per_cluster`` sends its last pages to the
back of the queue, behind every other cluster's first ones. Then every cluster's read is
half done at once, and every answered page waits in memory for its cluster's last (the peak
of a tick's memory, measured in benchmarks/HISTORY.md).
``Limiter`` serves waiters by rank, first come first served within one: a cluster's fetch
takes a rank when it starts (``ranked``), so its later pages go ahead of clusters that
started after it, and clusters finish about in the order they began. Slots a cluster may
hold are still bounded by its own semaphore, so a cluster of hanging pods holds no more. But
pods that hang hold their slots until their timeout, and a dozen such clusters ranked ahead
took every slot for rounds of timeouts: a cluster's fetch that has waited ``grace`` for its
first slot goes ahead of the ranks (a page is read in milliseconds; only a queue of held slots
waits that long), so every cluster gets a first page in before the tick's deadline. And a
fetch one of whose pages has held its slot ``grace`` or more (pods that hang) waits behind
fetches whose pages answer: promoted once, a healthy cluster that began after 32 such
clusters (one namespace's annotations may define them) still had its other pages queued
behind theirs by rank, round after round of timeouts, and the tick's deadline cut its fetch
(found by an attack: its ten healthy pods read as ``timeout``). Among fetches whose pages
answer, the ranks hold.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import TracebackType


@dataclass(eq=False, slots=True)
class _Fetch:
    """One cluster's fetch as the limiter sees it: its rank, whether any of its requests has
    held a slot yet, and while none has, since when its first one waits and its waiters."""

    rank: int
    served: bool = False
    stuck: bool = False  # one of its pages held a slot ``grace`` or more (``Limiter._stuck``)
    since: float = 0.0
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)


# The fetch the current task belongs to (a lower rank goes first); tasks a fetch starts
# inherit it with their context. Outside any fetch: rank 0, never promoted.
_FETCH: ContextVar[_Fetch | None] = ContextVar("limiter_fetch", default=None)
_OUTSIDE = _Fetch(0, served=True)
_ranks = itertools.count(1)


def ranked() -> None:
    """Give the current task (a cluster's fetch) the next rank: after every fetch that
    started before it."""
    _FETCH.set(_Fetch(next(_ranks)))


class Limiter:
    """At most ``size`` holders at once (``async with``); waiters by rank, then arrival, but
    a fetch none of whose requests has held a slot, waiting ``grace`` seconds or more, goes
    first: clusters of pods that hang hold their slots until their timeout, and by rank alone
    a cluster that began after a dozen of them waited rounds of timeouts for its first page
    and missed the tick's deadline (found by an attack), its health blamed for theirs."""

    def __init__(
        self, size: int, grace: float = 1.0, clock: Callable[[], float] | None = None
    ) -> None:
        self._free = size
        # fetches marked stuck hold at most this many slots together: the rest stay for the
        # fetches whose pages answer, whenever they come (``_release``)
        self._stuck_cap = max(1, size // 2)
        self._waiting: list[tuple[int, int, asyncio.Future[None], _Fetch]] = []
        self._arrivals = itertools.count()
        self._grace = grace
        self._clock = clock
        self._fresh: dict[int, _Fetch] = {}  # waiting fetches not served a slot yet, by rank
        # the waiters of fetches marked stuck, served when no other waits: moved here from
        # ``_waiting`` once each, as they come to its top (``_release``)
        self._behind: list[tuple[int, int, asyncio.Future[None], _Fetch]] = []
        # who holds a slot, and since when, oldest first (``_stuck``): each request is a task
        self._held: dict[asyncio.Task[object] | None, tuple[_Fetch, float]] = {}

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def __aenter__(self) -> None:
        fetch = _FETCH.get() or _OUTSIDE
        if self._free > 0 and not self._queued(fetch):
            self._free -= 1
            fetch.served = True
            self._hold(fetch)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._behind if fetch.stuck else self._waiting
        heapq.heappush(queue, (fetch.rank, next(self._arrivals), future, fetch))
        if not fetch.served:
            if fetch.rank not in self._fresh:
                fetch.since, self._fresh[fetch.rank] = self._now(), fetch
            fetch.waiting.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if not future.cancelled():
                self._release()  # handed a slot as it was cancelled: pass it on
            raise
        self._hold(fetch)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        held = self._held.pop(asyncio.current_task(), None)
        if held is not None and self._now() - held[1] >= self._grace and held[0] is not _OUTSIDE:
            held[0].stuck = True  # this page held its slot that long: a pod that hangs
        self._release()

    def _hold(self, fetch: _Fetch) -> None:
        self._held[asyncio.current_task()] = (fetch, self._now())

    def _release(self) -> None:
        """Hand the slot to a fetch waiting ``grace`` for its first, else to the first live
        waiter by rank whose fetch has no page stuck in a slot, else to the first by rank of
        those that have, or free it. A stuck fetch's waiter reaching the top is moved behind
        for good: each is moved once, so a fleet whose every page is slow (a controller short
        of CPU) costs a heap operation a waiter, not a pass over all of them a release."""
        if self._fresh and self._starving():
            return
        self._stuck()
        while self._waiting:
            entry = heapq.heappop(self._waiting)
            if entry[2].done():
                continue
            if entry[3].stuck:  # behind the fetches whose pages answer
                heapq.heappush(self._behind, entry)
                continue
            self._grant(entry[2], entry[3])
            return
        while self._behind and not self._capped(self._behind[0][3]):
            _, _, future, fetch = heapq.heappop(self._behind)
            if not future.done():
                self._grant(future, fetch)
                return
        self._free += 1

    def _capped(self, fetch: _Fetch) -> bool:
        """``fetch`` is marked stuck and such fetches hold their share of the slots already:
        given every slot freed while no one else waited, clusters of hanging pods held them
        all for a timeout, and a healthy cluster's next page, a moment later, waited that
        round out (a simulation of an attack's fleet: a round more, 0.77 s of a 0.8 s tick)."""
        if not fetch.stuck:
            return False
        return sum(1 for held, _ in self._held.values() if held.stuck) >= self._stuck_cap

    def _stuck(self) -> None:
        """Mark the fetches holding a slot for ``grace`` or more: a page read in milliseconds
        holds one that long only when its pod hangs, and the fetch stays marked (it is one
        cluster's, for one tick). Nothing to look through while the oldest holder is younger
        (``_held`` keeps grant order)."""
        if not self._held:
            return
        now = self._now()
        _, oldest = next(iter(self._held.values()))
        if now - oldest < self._grace:
            return
        for fetch, since in self._held.values():
            if now - since >= self._grace and fetch is not _OUTSIDE:
                fetch.stuck = True

    def _starving(self) -> bool:
        """Serve the fetch that has waited longest for its first slot, if ``grace`` or more."""
        now = self._now()
        while self._fresh:  # oldest first: each is added as its first waiter comes
            fetch = next(iter(self._fresh.values()))
            if now - fetch.since < self._grace:
                return False
            while fetch.waiting:
                future = fetch.waiting.popleft()
                if not future.done():
                    self._grant(future, fetch)  # its heap entry stays, skipped as done
                    return True
            del self._fresh[fetch.rank]  # every waiter of it was cancelled
        return False

    def _queued(self, fetch: _Fetch) -> bool:
        """Someone ``fetch`` must queue behind: a waiter not yet served or cancelled ahead of
        it (a stuck fetch's waiters are ahead of no one else), or, for a stuck fetch, its
        kind's share of the slots held (``_capped``). Read off the heaps, cancelled and served
        entries at their tops dropped: a count kept beside them went stale between a
        waiter's cancellation and its task running again, and a slot freed then left a
        newcomer queued behind it with nobody to wake it (found by a review)."""
        for queue in (self._waiting, self._behind):
            while queue and queue[0][2].done():
                heapq.heappop(queue)
        if not fetch.stuck:
            return bool(self._waiting)
        return bool(self._waiting or self._behind) or self._capped(fetch)

    def _grant(self, future: asyncio.Future[None], fetch: _Fetch) -> None:
        future.set_result(None)
        if not fetch.served:
            fetch.served = True
            fetch.waiting.clear()
            self._fresh.pop(fetch.rank, None)
