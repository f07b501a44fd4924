"""The scrape path beside its peers, in one process, round by round: what a page costs us
against what it costs any Python reader and what aiohttp alone costs.

    python benchmarks/bench_peers.py [--endpoints 400] [--rounds 14] [--no-epp]

The same page servers as ``bench_daemon`` (every pod on a loopback address of its own, every
connection closed after its page, an EPP page per cluster of 10 unless ``--no-epp``: then the
pods' own e2e histograms give latency, and their bucket lines are read), and four readers of
every page, taking turns round by round so that all see the machine as it is that minute:

- the floor: a raw asyncio ``Protocol`` GET on a new connection and ``str.splitlines`` of the
  body (``bench_daemon.floor_round``);
- aiohttp: ``ClientSession.get`` on a new connection, the body read and ``splitlines``;
- the least an exact reader on aiohttp pays: the same GET, the wanted lines found
  (``Extractor.find``, the pattern ours uses) and every one's number read (``float``), with
  nothing done with them;
- ours: every cluster's ``ScrapeSource.fetch``, as a tick does it (extraction, the cluster
  read, the limiter).

Each reads 32 pages at a time. Reported: CPU milliseconds per page (median over the rounds
after two of warm-up) and each reader's ratio to the floor (the median of the rounds' own
ratios). ``bench_daemon`` measures the daemon whole; this one says where its ratio comes from.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from benchmarks.bench_daemon import (  # noqa: E402
    FLOOR_CONCURRENCY,
    PODS_PER_CLUSTER,
    fleet_servers,
    floor_round,
)
from controller.app import settle_collector  # noqa: E402
from controller.exposition import Extractor  # noqa: E402
from controller.settings import ClusterSettings, ScrapeSettings  # noqa: E402
from controller.sources.limiter import Limiter  # noqa: E402
from controller.sources.page import (  # noqa: E402
    EPP_EXTRACTOR,
    POD_EXTRACTOR,
    POD_LEAN_EXTRACTOR,
)
from controller.sources.scrape import ScrapeSource  # noqa: E402

WARM_ROUNDS = 2
PAUSE = 0.2  # seconds between readers, so one's connections are closed before the next


async def measure(endpoints: int, rounds: int, epp: bool) -> dict[str, tuple[float, float]]:
    """Per reader: (median CPU ms per page, median ratio to the floor)."""
    with fleet_servers(endpoints, epp, False) as urls:
        await asyncio.sleep(2 + endpoints / 1000)  # the page servers start
        pods, epps = urls[:endpoints], urls[endpoints:]
        clusters = [
            ClusterSettings(
                name=f"c{c:04}",
                vllm_urls=pods[c * PODS_PER_CLUSTER : (c + 1) * PODS_PER_CLUSTER],
                epp_url=epps[c] if epp else None,
            )
            for c in range(endpoints // PODS_PER_CLUSTER)
        ]
        connector = aiohttp.TCPConnector(limit=FLOOR_CONCURRENCY + 8, limit_per_host=0)
        async with aiohttp.ClientSession(  # as the daemon's (controller.app)
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
        ) as session:
            limiter = Limiter(FLOOR_CONCURRENCY)
            scrape = ScrapeSettings(max_concurrency=FLOOR_CONCURRENCY)
            sources = [ScrapeSource(c, scrape, 10.0, session, limiter=limiter) for c in clusters]
            slots = asyncio.Semaphore(FLOOR_CONCURRENCY)

            async def bare(url: str) -> int:
                async with slots, session.get(url) as response:
                    return len((await response.read()).decode().splitlines())

            async def least(url: str, extractor: Extractor) -> int:
                async with slots, session.get(url) as response:
                    text = "\n" + (await response.read()).decode()
                    return len([float(line.rpartition(" ")[2]) for line in extractor.find(text)])

            async def floor_all() -> None:
                await floor_round(urls)

            async def bare_all() -> None:
                assert all(n > 0 for n in await asyncio.gather(*(bare(u) for u in urls)))

            async def least_all() -> None:
                lean = POD_LEAN_EXTRACTOR if epp else POD_EXTRACTOR  # as ours reads each
                jobs = [least(u, lean) for u in pods] + [least(u, EPP_EXTRACTOR) for u in epps]
                assert all(n > 0 for n in await asyncio.gather(*jobs))

            async def ours_all() -> None:
                read = await asyncio.gather(*(s.fetch() for s in sources))
                assert not any(m.errors for m in read), [m.errors[:1] for m in read if m.errors]

            readers: dict[str, Callable[[], Awaitable[None]]] = {
                "floor (raw GET + splitlines)": floor_all,
                "aiohttp GET + splitlines": bare_all,
                "aiohttp GET + find + float": least_all,
                "ours (ScrapeSource.fetch)": ours_all,
            }
            spent: dict[str, list[float]] = {name: [] for name in readers}
            # as the daemon once started: what exists is frozen, and young passes come
            # GC_THRESHOLD[0] new containers apart (every reader in this process alike)
            settle_collector()
            for round_ in range(WARM_ROUNDS + rounds):
                for name, read_all in readers.items():
                    cpu = time.process_time()
                    await read_all()
                    if round_ >= WARM_ROUNDS:
                        spent[name].append((time.process_time() - cpu) * 1000 / len(urls))
                    await asyncio.sleep(PAUSE)
    floors = next(iter(spent.values()))
    return {
        name: (
            statistics.median(ms),
            statistics.median(m / f for m, f in zip(ms, floors, strict=True)),
        )
        for name, ms in spent.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--no-epp", action="store_true", help="pods alone, no EPP page")
    args = parser.parse_args()
    epp = not args.no_epp
    result = asyncio.run(measure(args.endpoints, args.rounds, epp))
    epps = args.endpoints // PODS_PER_CLUSTER if epp else 0
    print(
        f"{args.endpoints} pods and {epps} EPPs ({args.endpoints + epps} pages a round), a"
        f" connection per page, {args.rounds} rounds, readers in turn:"
    )
    print(f"{'reader':<30} {'ms/page':>8} {'× floor':>8}")
    for name, (ms, ratio) in result.items():
        print(f"{name:<30} {ms:>8.3f} {ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
