"""The process-wide request limiter: bounded, clusters served in the order they began."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from controller.sources.limiter import Limiter, ranked

INSIDE = [0]  # pages holding a slot, after every change


async def _cluster(
    limiter: Limiter, name: str, pages: int, gate: asyncio.Event, log: list[str]
) -> None:
    """A cluster's fetch: ``pages`` pages, at most 2 of them at once (its own slots)."""
    ranked()
    own = asyncio.Semaphore(2)

    async def page(i: int) -> None:
        async with own, limiter:
            log.append(f"{name}{i}")
            INSIDE.append(INSIDE[-1] + 1)
            await gate.wait()
            await asyncio.sleep(0)  # a page takes a moment to read
            INSIDE.append(INSIDE[-1] - 1)

    await asyncio.gather(*(page(i) for i in range(pages)))


async def test_a_cluster_begun_first_is_served_first_and_never_more_than_the_bound() -> None:
    limiter, gate = Limiter(2), asyncio.Event()
    log: list[str] = []
    tasks = [
        asyncio.create_task(_cluster(limiter, n, 3, gate, log), context=contextvars.copy_context())
        for n in "abcd"
    ]
    for _ in range(10):
        await asyncio.sleep(0)
    assert log == ["a0", "a1"]  # two slots: a's first two pages
    gate.set()
    await asyncio.gather(*tasks)
    assert sorted(log) == sorted(f"{n}{i}" for n in "abcd" for i in range(3))
    # a's third page waited for a's own slot, behind every other cluster's first pages in a
    # FIFO queue; by rank it goes ahead of the clusters that began after a
    assert log.index("a2") < log.index("c0")
    assert log.index("b2") < log.index("d0")
    assert max(INSIDE) == 2 and INSIDE[-1] == 0


async def test_a_cancelled_waiter_gives_up_its_place_and_a_slot_handed_to_it_moves_on() -> None:
    limiter = Limiter(1)
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with limiter:
            held.set()
            await release.wait()

    async def waiter(log: list[str], name: str) -> None:
        async with limiter:
            log.append(name)

    log: list[str] = []
    first = asyncio.create_task(holder())
    await held.wait()
    doomed = asyncio.create_task(waiter(log, "doomed"))
    patient = asyncio.create_task(waiter(log, "patient"))
    await asyncio.sleep(0)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    release.set()
    await asyncio.wait_for(asyncio.gather(first, patient), 1)
    assert log == ["patient"]
    # handed the slot in the same step as it is cancelled: the slot is passed on, not lost
    async with limiter:
        late = asyncio.create_task(waiter(log, "late"))
        after = asyncio.create_task(waiter(log, "after"))
        await asyncio.sleep(0)
    late.cancel()  # its future already has the slot; cancelling must hand it to "after"
    await asyncio.gather(late, return_exceptions=True)
    await asyncio.wait_for(after, 1)
    assert log[-1] == "after"
    async with limiter:  # and the slot came back: nothing leaked
        pass


async def test_a_fetch_waiting_grace_for_its_first_slot_goes_ahead_of_the_ranks() -> None:
    """Found by an attack: clusters of pods that hang, ranked ahead, held every slot for
    rounds of timeouts, and a cluster that began after them never had its one page read
    before the tick's deadline. A fetch none of whose pages has held a slot goes first once
    it has waited ``grace``; before that, the ranks hold."""
    now = [0.0]
    limiter = Limiter(2, grace=1.0, clock=lambda: now[0])
    log: list[str] = []
    release = {name: asyncio.Event() for name in ("h0", "h1", "h2", "h3", "g0")}

    async def cluster(name: str, pages: int) -> None:
        ranked()

        async def page(i: int) -> None:
            async with limiter:
                log.append(f"{name}{i}")
                await release[f"{name}{i}"].wait()

        await asyncio.gather(*(page(i) for i in range(pages)))

    hung = asyncio.create_task(cluster("h", 4), context=contextvars.copy_context())
    for _ in range(5):
        await asyncio.sleep(0)
    good = asyncio.create_task(cluster("g", 1), context=contextvars.copy_context())
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["h0", "h1"]
    now[0] = 0.5  # a slot comes back before grace: by rank, h's next page
    release["h0"].set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["h0", "h1", "h2"]
    now[0] = 1.5  # g has waited past grace for its first page: it goes ahead of h3
    release["h1"].set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["h0", "h1", "h2", "g0"]
    for event in release.values():
        event.set()
    await asyncio.wait_for(asyncio.gather(hung, good), 1)
    assert log[-1] == "h3"
    async with limiter, limiter:  # both slots came back: nothing leaked
        pass


async def test_a_slot_freed_while_a_cancelled_waiter_has_not_run_again_is_taken() -> None:
    """Found by a review: a waiter cancelled after a holder's wake-up was queued, the holder
    released its slot before the waiter's task ran again, and the count of waiters was still
    up: the holder's next request queued behind the free slot, with nobody to wake it."""
    limiter = Limiter(1)
    go = asyncio.Event()

    async def holder() -> str:
        async with limiter:
            await go.wait()
        async with limiter:  # the next request, right after releasing
            return "second slot"

    async def waiter() -> None:
        async with limiter:
            pass

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    doomed = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    go.set()  # the holder's wake-up is queued first...
    doomed.cancel()  # ...then the waiter's future is cancelled, its task to run later
    assert await asyncio.wait_for(held, 1) == "second slot"
    await asyncio.gather(doomed, return_exceptions=True)


async def test_a_fetch_whose_pages_hang_waits_behind_one_whose_pages_answer() -> None:
    """Found by an attack: promoted for its first page only, a healthy cluster that began
    after clusters of hanging pods had its next pages queued behind theirs by rank, a round
    of timeouts each, and the tick's deadline cut its fetch (ten healthy pods read as
    ``timeout``). A fetch one of whose pages held its slot ``grace`` or more waits behind
    the fetches whose pages answer; with no one else waiting, it is served by rank."""
    now = [0.0]
    limiter = Limiter(2, grace=1.0, clock=lambda: now[0])
    log: list[str] = []
    release = {f"h{i}": asyncio.Event() for i in range(4)}

    async def cluster(name: str, pages: int) -> None:
        ranked()

        async def page(i: int) -> None:
            async with limiter:
                log.append(f"{name}{i}")
                if name == "h":
                    await release[f"h{i}"].wait()
                else:
                    await asyncio.sleep(0)  # a healthy page: read at once

        await asyncio.gather(*(page(i) for i in range(pages)))

    hung = asyncio.create_task(cluster("h", 4), context=contextvars.copy_context())
    for _ in range(5):
        await asyncio.sleep(0)
    good = asyncio.create_task(cluster("g", 2), context=contextvars.copy_context())
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["h0", "h1"]
    now[0] = 1.5  # h's pages time out, one after the other
    release["h0"].set()
    release["h1"].set()
    await asyncio.wait_for(good, 1)
    assert log[:4] == ["h0", "h1", "g0", "g1"]  # by rank alone: h0, h1, g0, h2
    release["h2"].set()
    release["h3"].set()
    await asyncio.wait_for(hung, 1)
    assert log[4:] == ["h2", "h3"]  # no one else waits: served by rank
    async with limiter, limiter:  # both slots came back: nothing leaked
        pass


async def test_fetches_whose_pages_hang_hold_at_most_half_the_slots() -> None:
    """Given every slot freed while no one else waited, clusters of hanging pods held them
    all for a timeout, and a healthy cluster's next page, a moment later, waited that round
    out. Once marked, they hold half the slots at most; the rest stay free for pages that
    answer, whenever those come."""
    now = [0.0]
    limiter = Limiter(4, grace=1.0, clock=lambda: now[0])
    holding: list[int] = []
    first, rest = asyncio.Event(), asyncio.Event()

    async def hung(pages: int) -> None:
        ranked()

        async def page(i: int) -> None:
            async with limiter:
                holding.append(i)
                await (first if i < 4 else rest).wait()
                holding.remove(i)

        await asyncio.gather(*(page(i) for i in range(pages)))

    task = asyncio.create_task(hung(12), context=contextvars.copy_context())
    for _ in range(5):
        await asyncio.sleep(0)
    assert holding == [0, 1, 2, 3]  # nothing known yet: by rank, every slot
    now[0] = 1.5  # they time out past grace, and are marked
    first.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert sorted(holding) == [4, 5]  # half the slots, the other half free

    async def healthy() -> None:
        ranked()
        async with limiter, limiter:  # its two pages, a moment later: at once
            pass

    await asyncio.wait_for(healthy(), 1)
    rest.set()
    await asyncio.wait_for(task, 1)
