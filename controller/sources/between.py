"""Pure: what a cluster's reader keeps between scrapes. Latency and arrivals come from the
increase of cumulative counters between two scrapes, never from since-start totals; one URL
must be one process (a load-balanced URL is named as such)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller import histograms
from controller.engines import Family
from controller.exposition import Sample
from controller.histograms import Folded, Histogram, SeriesKey
from controller.model import Latency
from controller.sources.page import ByName, series_of


class LatencyWindow:
    """Turns successive cumulative histograms into latency over the last scrape interval.

    A series whose count fell is not counted this interval: a restart and another process
    behind the same URL look alike at first, and neither's counts are an increase."""

    def __init__(self, min_requests: float) -> None:
        self._min_requests = min_requests
        self._previous: dict[str, dict[tuple[str, SeriesKey], Histogram]] = {}
        self._folded: dict[str, Folded] = {}

    def observe(
        self, family: str, pages: Sequence[tuple[str, dict[SeriesKey, Histogram]]]
    ) -> tuple[Latency | None, bool]:
        """Latency over the interval, and whether some series fell (its count is unknown)."""
        increases: list[Histogram] = []
        fell = False
        for url, series in pages:
            before = self._previous.get(url, {})
            now = {(family, key): histogram for key, histogram in series.items()}
            for key, histogram in now.items():
                if key not in before:
                    continue
                if histogram.count < before[key].count:
                    fell = True
                    continue
                increases.append(histograms.increase(before[key], histogram))
            self._previous[url] = now  # a page that did not answer keeps its old baseline
        return self._latency(family, increases), fell

    def observe_folded(
        self, family: str, pages: Sequence[tuple[str, Folded | None]]
    ) -> tuple[Latency | None, bool]:
        """``observe`` for pages whose series were folded into one each (``Fold``)."""
        increases: list[Histogram] = []
        fell = False
        for url, now in pages:
            before = self._folded.pop(url, None)
            if now is None:
                continue
            self._folded[url] = now
            if before is None:
                continue
            follows = now.follows(before)
            if follows:
                increases.append(histograms.increase(before.histogram, now.histogram))
            elif follows is not None:
                fell = True
        return self._latency(family, increases), fell

    def _latency(self, family: str, increases: Sequence[Histogram]) -> Latency | None:
        merged = histograms.merge(increases)
        if merged is None:
            return None  # no baseline yet: the first scrape only sets one
        if merged.count < self._min_requests:
            return Latency(None, None, None, requests=merged.count, family=family)
        mean = merged.sum / merged.count if math.isfinite(merged.sum) else None
        return Latency(
            p50=histograms.quantile(0.5, merged),
            p90=histograms.quantile(0.9, merged),
            mean=mean,
            requests=merged.count,
            family=family,
        )

    def retain(self, urls: set[str]) -> None:
        self._previous = {u: v for u, v in self._previous.items() if u in urls}
        self._folded = {u: v for u, v in self._folded.items() if u in urls}


class Counters:
    """The increase of counters (by URL and series) since the previous scrape; ``None``
    when there is no baseline yet or some counter fell (unknown rather than a guess)."""

    def __init__(self) -> None:
        self._previous: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}

    def increase(self, url: str, samples: Sequence[Sample]) -> float | None:
        now = {series_of(s): s.value for s in samples if math.isfinite(s.value)}
        before = self._previous.get(url)
        self._previous[url] = now
        if before is None:
            return None
        total = 0.0
        for key, value in now.items():
            if key in before:
                if value < before[key]:
                    return None
                total += value - before[key]
        return total


@dataclass(slots=True)
class _Identity:
    total: float | None = None  # the page's cumulative request count at the last scrape
    fell_from: float | None = None  # the count before it last fell
    since_fall: int = 0
    starts: list[float] = field(default_factory=list)  # recent process start times
    nodes: dict[str, int] = field(default_factory=dict)  # Ray nodes its page said it was, when
    scrapes: int = 0  # scrapes of this URL
    evidence: str = ""
    flagged: int = 0  # scrapes the URL stays named load-balanced without new evidence


# Scrapes a URL stays named load-balanced after the last sign of it (a load balancer picks
# at random, so a few consistent scrapes in a row prove nothing), and how soon after a fall a
# count back above it is a sign (a restarted process cannot catch up with its old total).
FLAGGED_SCRAPES = 30
FALL_WINDOW = 2


class Continuity:
    """One URL must be one process. A page whose cumulative request count falls and then comes
    back above where it fell from, or whose process start time returns to one it had before,
    is several processes behind one address (a Service, a load balancer): its numbers flip
    between pods from scrape to scrape and its counters look like resets. Such a URL is named
    for what it is (``Reason.LOAD_BALANCED``) rather than read."""

    def __init__(self) -> None:
        self._urls: dict[str, _Identity] = {}

    def retain(self, urls: set[str]) -> None:
        self._urls = {u: v for u, v in self._urls.items() if u in urls}

    def check(
        self, url: str, total: float | None, started: float | None, node: str | None = None
    ) -> str | None:
        """Why ``url`` is several processes (or, a Ray node's page, several nodes: ``node``
        its address, as its series say), or ``None``."""
        state = self._urls.setdefault(url, _Identity())
        evidence = (
            _node_evidence(state, node)
            or _start_evidence(state, started)
            or _count_evidence(state, total)
        )
        if evidence:
            state.evidence, state.flagged = evidence, FLAGGED_SCRAPES
        elif state.flagged:
            state.flagged -= 1
        return state.evidence if state.flagged else None


def _start_evidence(state: _Identity, started: float | None) -> str | None:
    if started is None:
        return None
    seen = state.starts
    returned = bool(seen) and started != seen[-1] and started in seen
    if not seen or started != seen[-1]:
        state.starts = [*(s for s in seen if s != started), started][-4:]
    return f"its process start time went back to {started:.0f}" if returned else None


# Scrapes within which a URL's page going back to a node it left is a Service's flip.
NODE_WINDOW = 10


def _node_evidence(state: _Identity, node: str | None) -> str | None:
    """A Ray node's page that says it is a node it said it was before another: a Service in
    front of the nodes, its pages flipping between them (found by an attack: read as one
    node whose replicas changed every scrape). A node replaced once is no evidence."""
    if node is None:
        return None
    state.scrapes += 1
    seen, now = state.nodes, state.scrapes
    last = max(seen, key=seen.__getitem__) if seen else None
    before = seen.get(node)
    returned = node != last and before is not None and now - before <= NODE_WINDOW
    # only nodes seen lately count: a stable name whose pod was replaced twice, the third
    # reusing the first's address hundreds of scrapes on, is no Service (a review)
    state.nodes = {n: at for n, at in seen.items() if now - at < NODE_WINDOW}
    state.nodes[node] = now
    return f"its Ray node went back to {node}" if returned else None


def _count_evidence(state: _Identity, total: float | None) -> str | None:
    before, state.total = state.total, total
    if total is None or before is None:
        return None
    if total < before:
        state.fell_from, state.since_fall = before, 0
        return None
    if state.fell_from is not None:
        state.since_fall += 1
        fell_from = state.fell_from
        if total >= fell_from:
            state.fell_from = None
            return f"its request count fell from {fell_from:.0f} and came back to {total:.0f}"
        if state.since_fall >= FALL_WINDOW:
            state.fell_from = None  # a restart, counting up from where it fell to
    return None


# Reads a replica is remembered after it was last seen on a page: a node page that fails a
# scrape or two does not forget the pools of the replicas on it.
REPLICA_READS = 30
# Processes remembered per replica: its own and those whose series may linger after restarts.
_PROCESSES = 4
# Reads in which a replica's gauges are off every page while its model is busy (as many
# requests in flight at the replicas that step as the model has replicas), before it no
# longer counts, until it steps again. Ray drops a dead worker's gauges after their time to
# live (two report intervals, ~20 s) but keeps its histograms and counters on the page for
# good; Ray Serve's router sends each request to the less loaded of two replicas drawn at
# random (ray serve/_private/request_router/pow_2_router.py), so a live one with nothing in
# flight is sent work within a few requests: six busy reads bring it tens. At low load one
# may wait minutes for a request: it counts, idle.
QUIET_READS = 6


@dataclass(slots=True)
class _Replica:
    order: dict[str, int] = field(default_factory=dict)  # process: when first seen (a count)
    last: dict[str, int] = field(default_factory=dict)  # process: the read it was last on
    pools: dict[str, float] = field(default_factory=dict)  # by process: its pool, last seen
    gauges: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)  # likewise
    pool: float | None = None  # the last pool seen of any of its processes
    unseen: int = 0  # reads since it was last on a page
    quiet: int = 0  # busy reads since its gauges were last on one
    own: str | None = None  # the process whose gauges were, then


class Replicas:
    """Ray Serve's replicas across a cluster's node pages, by id: which process is each
    replica's own now, and each process's KV pool as last seen.

    A process restarted under the same id (a new ``WorkerId``) leaves the old process's
    series on the page: its gauges until Ray drops them (a gauge not set again within its
    time to live, two report intervals), its histograms and counters for good. The process
    whose gauges are on the page is the replica's, and of several, the one first seen most
    recently, so it never doubles the count. vLLM sets its gauges as its engine steps: a
    replica whose gauges are not on the page is not stepping, so nothing runs or waits there
    and it holds no blocks, and it reads so (``gauges``), whether it is idle or dead (a
    replaced one: Ray Serve gives its successor a new id), and whether or not it was ever
    seen stepping; one that stays so while its model is busy is gone until it steps
    (``gone``). vLLM sets its pool's gauge (``cache_config_info``) once, at start: a pool,
    once seen, is kept while the replica is seen (``REPLICA_READS``), for a process
    restarted under its id as well."""

    def __init__(self) -> None:
        self._replicas: dict[str, _Replica] = {}
        self._seen = 0  # processes first seen so far, of every replica: their order
        self._reads = 0

    def current(self, replica: str, processes: Sequence[str], live: Sequence[str]) -> str:
        """The process of ``processes`` (on the page now) that is ``replica``'s: of those
        whose gauges are on the page (``live``), the one first seen most recently; where none
        is (the replica is not stepping), the one that was last. A dead process's histograms
        stay on the page for good, so of two first seen at once (the controller started while
        both were on it) the one whose gauges stay is the replica's; until then, nothing tells
        which is new, and the last in sorted order is taken. Linear in the processes: one
        replica of 19,000 workers took 5.6 s of the event loop a read (an attack)."""
        state = self._replicas.setdefault(replica, _Replica())
        state.unseen = 0
        for process in sorted(processes):
            if process not in state.order:
                self._seen += 1
                state.order[process] = self._seen
            state.last[process] = self._reads
        order, steps = state.order.__getitem__, set(live)
        stepping = [p for p in processes if p in steps]
        if stepping:
            state.own = max(stepping, key=order)
            return state.own
        if state.own is not None and state.own in processes:
            return state.own
        return max(processes, key=order)

    def pool(self, replica: str, process: str, seen: float | None) -> tuple[float | None, bool]:
        """The process's pool: ``seen`` on the page now, else as last seen of it, else of
        its replica; and whether it was remembered rather than seen."""
        state = self._replicas.setdefault(replica, _Replica())
        if seen is not None:
            state.pools[process] = state.pool = seen
            return seen, False
        kept = state.pools.get(process, state.pool)
        return kept, kept is not None

    def gauges(
        self,
        replica: str,
        process: str,
        samples: ByName,
        families: Sequence[Family],
        busy: bool,
        model_label: str,
    ) -> ByName:
        """``samples`` with the gauges of ``families`` as the replica is: where none is on
        the page (Ray dropped them: the engine is not stepping), each at 0, nothing running,
        waiting or held: as last seen of the replica's process, or, never seen, by the
        labels of its other series (a replica idle since the controller started read as
        missing, was shed, and with no traffic never stepped again: an attack); where only
        some are, the others as last seen. What is on the page is kept for next time.
        ``busy``: the model was busy in this read (``gone`` counts those)."""
        state = self._replicas.setdefault(replica, _Replica())
        kept = state.gauges.setdefault(process, {})
        names = [n for f in families for n in f.names]
        if not any(n in samples for n in names):
            state.quiet += busy
            idle = {
                n: [s._replace(value=0.0, timestamp=None) for s in kept[n]]
                for n in names
                if n in kept
            }
            labels = _replica_labels(samples, model_label)
            for family in families:
                if labels is not None and not any(n in idle for n in family.names):
                    first = family.names[0]
                    idle[first] = [Sample(first, {**labels, **dict(family.match)}, 0.0, None)]
            return {**samples, **idle} if idle else samples
        state.quiet = 0
        missing = [n for n in names if n not in samples and n in kept]
        kept.update((n, samples[n]) for n in names if n in samples)
        return {**samples, **{n: kept[n] for n in missing}} if missing else samples

    def stepped(self, replica: str) -> bool:
        """Whether any process of ``replica`` was seen with its gauges (seen stepping)."""
        state = self._replicas.get(replica)
        return state is not None and any(state.gauges.values())

    def gone(self, replica: str) -> bool:
        """Its gauges have been off every page through ``QUIET_READS`` reads in which its
        model was busy (and it has not stepped since)."""
        state = self._replicas.get(replica)
        return state is not None and state.quiet >= QUIET_READS

    def read(self) -> None:
        """One more read done: forget replicas not seen for ``REPLICA_READS`` reads, and the
        processes a replica no longer runs: past the newest ``_PROCESSES``, those not on a
        page in this read (the replica's own is, whatever their number: cut to four, a
        replica of five workers lost its kept gauges and pool: an attack)."""
        for replica, state in list(self._replicas.items()):
            state.unseen += 1
            if state.unseen > REPLICA_READS:
                del self._replicas[replica]
            elif len(state.order) > _PROCESSES:
                newest = sorted(state.order, key=state.order.__getitem__)[-_PROCESSES:]
                keep = {*newest, *(p for p, n in state.last.items() if n == self._reads)}
                keep.update([state.own] if state.own else [])
                state.order = {p: n for p, n in state.order.items() if p in keep}
                state.last = {p: n for p, n in state.last.items() if p in keep}
                state.pools = {k: v for k, v in state.pools.items() if k in keep}
                state.gauges = {k: v for k, v in state.gauges.items() if k in keep}
        self._reads += 1


def _replica_labels(samples: ByName, model_label: str) -> dict[str, str] | None:
    """A replica's labels as its series carry them, from one that names its model (an info
    gauge need not: a review found an idle model missing when its pool's info came first;
    ``le`` and ``quantile`` left out): what a gauge of its would carry."""
    for series in samples.values():
        for sample in series:
            if model_label in sample.labels:
                return {k: v for k, v in sample.labels.items() if k not in ("le", "quantile")}
    return None
