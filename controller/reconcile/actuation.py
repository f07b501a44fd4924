"""When does a change of weights start to act? Measured per target, from its realised share.

A gateway takes a while to route by new weights (an ExternalModel is reconciled into routes,
a route is propagated to every gateway replica): the *actuation delay*. A step taken before the
last one has acted stacks on it. So each change that moves a cluster's share of requests by at
least ``MIN_MOVE`` points is followed until the share its cluster receives (this tick's
arrivals, ``realised.Arrivals``) has moved, from what it received before the change, by at
least half of that and by more than the counting noise of both, over ``CONFIRM`` ticks in a
row pooled, the newest of them by half the move on its own (one misread tick beside a still
one would otherwise pass, and a delay read off them too short lets later steps stack).
Traffic the weights do not move (local requests, another target's) dilutes the move: a change
of weights moves the shares of requests by only the part the weights route (``_routed``, read
off the split before it). The moment it started to act is interpolated within the first of
those ticks; the delay is that moment less the change's.

Counting noise cuts both ways, and the law's own choices lean it one way: a cluster is shed
when it has been receiving more than its share, so its share falling back looks like the
change acting. Three things keep a misread delay from letting steps stack:
- the share before a change counts its noise (it is a few ticks' count, as noisy as those
  after), and starts once the last change acted (not halfway through its move);
- a change seen acting in less than half the delay measured so far is noted (the estimate
  follows a gateway that got faster) but not believed: the law waits on;
- a followed change not seen acting in all the time it was given (``wait_limit``) says the
  delay is at least that long, and counts as a delay of that length.

``settling`` is what the law is told. The configured ``settle`` is the floor. Past it, a change
not yet seen acting keeps the target settling up to ``wait_limit`` (a router that ignores the
weights must not freeze them), and one that acted waits ``settle`` from the moment it did:
``settle`` is the time a step needs to show in the readings once traffic has moved. A change
too small to see, or one of a target whose arrivals are not counted, waits for the longest
recent delay and ``settle`` (``wait_limit`` before any was measured). A change made while the
last one may still be on its way is not measured: the last one's effect would be taken for its
own.
``estimate``, the median of the last ``KEEP`` delays, is shown in ``/debug/state``,
``status --explain`` and ``weight_controller_target_actuation_delay_seconds``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

MIN_MOVE = 8.0  # points of share: a smaller move drowns in the counting noise
MIN_REQUESTS = 20.0  # in one tick, for its shares to say anything
KEEP = 5  # delays the estimate is the median of
BASELINE_TICKS = 3  # ticks of shares before a change that say where it started from
# A move smaller than this many binomial σ is not a move (arrivals counted from completions
# and the growth of what is in the system are noisier than a request counter's).
NOISE_SIGMAS = 2.5
CONFIRM = 2  # ticks in a row that must show the move, pooled (one can be noise)
MIN_WEIGHT = 10.0  # points of weight: a cluster with less says little of the routed part
MIN_ROUTED = 0.25  # the least part of the requests a change is taken to move
UNKNOWN = 6  # intervals a change may take to act before any delay was measured
LONGEST = 2 * UNKNOWN  # intervals: the most a change not seen acting adds to the estimate


@dataclass(frozen=True, slots=True)
class Change:
    at: float
    cluster: str  # the one whose share moves most
    before: float  # the share it received before (0..100), measured
    wanted: float  # how far its share of requests should move (points, signed; see routed)
    counted: float  # requests the share before was measured over (its counting noise)
    # the last ticks since: (time, span it counts, the cluster's share, requests)
    ticks: tuple[tuple[float, float, float, float], ...] = ()


@dataclass(slots=True)
class Actuation:
    """One target's actuation: the change being followed and the delays measured so far."""

    pending: Change | None = None
    acted_at: float | None = None  # when the last followed change started to act
    delays: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    # the last ticks: when each began counting, its shares (0..100 per counted cluster) and
    # how many requests it counted
    recent: deque[tuple[float, dict[str, float], float]] = field(
        default_factory=lambda: deque(maxlen=BASELINE_TICKS)
    )
    observed: float | None = None  # the tick last observed (a retried weighing sees it once)
    given_up: float | None = None  # when the last change given up (``_given_up``) was made
    last_change: float | None = None
    last_observed: float | None = None  # the tick before it: the span this tick's counts cover

    @property
    def estimate(self) -> float | None:
        """The measured actuation delay (median of the last few), or ``None`` before any."""
        return statistics.median(self.delays) if self.delays else None

    @property
    def longest(self) -> float:
        """The longest of the last few delays (a gateway's delay varies), or ``inf``."""
        return max(self.delays) if self.delays else math.inf

    def observe(self, now: float, arrived: Mapping[str, float | None], interval: float) -> None:
        """This tick's arrivals per cluster of the target (``None``: not counted)."""
        if self.observed == now:
            return
        self.last_observed, self.observed = self.observed, now
        shares = _shares(arrived)
        if shares is None:
            return
        shares_now, requests = shares
        span = now - self.last_observed if self.last_observed is not None else 0.0
        self.recent.append((now - span, shares_now, requests))
        change = self.pending
        if change is None or change.cluster not in shares_now:
            return
        tick = (now, span, shares_now[change.cluster], requests)
        ticks = (*change.ticks, tick)[-CONFIRM:]
        self.pending = replace(change, ticks=ticks)
        started = _started(change, ticks)
        if started is not None:
            self._acted(change, started)
        else:
            self._given_up(interval)

    def _acted(self, change: Change, started: float) -> None:
        """``change`` was seen acting from ``started``."""
        delay = started - change.at
        # Sooner than half the delay measured so far, it is more likely the counting noise
        # (see the module docstring): noted, so a gateway that got faster shows in the
        # estimate, but not believed, so the law waits on.
        plausible = self.estimate is None or delay >= self.estimate / 2
        self.delays.append(delay)
        self.acted_at = started if plausible else None
        self.pending = None
        # what the next change starts from: the ticks counted wholly under this one
        self.recent = deque((r for r in self.recent if r[0] >= started), BASELINE_TICKS)

    def changed(
        self,
        now: float,
        before: Mapping[str, float],
        after: Mapping[str, float],
        interval: float,
    ) -> None:
        """The weights in force changed at ``now`` (shares 0..100 per cluster)."""
        self._given_up(interval)
        # the last change may act meanwhile (followed or not): this one is not measured
        last, self.last_change = self.last_change, now
        on_its_way = self.longest if self.delays else UNKNOWN * interval
        confounded = last is not None and self.acted_at is None and now - last < on_its_way
        self.acted_at = None
        received = _pooled(self.recent)  # a dead cluster has no count
        self.recent.clear()
        routed = _routed(received, before)
        moves = {
            c: routed * (after.get(c, 0.0) - before.get(c, 0.0))
            for c in {*before, *after} & received.keys()
        }
        cluster = max(moves, key=lambda c: (abs(moves[c]), c), default=None)
        if confounded or cluster is None or abs(moves[cluster]) < MIN_MOVE:
            self.pending = None  # too small to see, or nothing to measure from
            return
        share, counted = received[cluster]
        self.pending = Change(now, cluster, share, moves[cluster], counted)

    def _given_up(self, interval: float) -> None:
        """The followed change, if any, not seen acting in all the time it was given (its
        cluster counted meanwhile: a dead one says nothing), is given up, once its time is
        out or when the next change replaces it. It says the delay is longer than the
        estimate allows for: the time it was given counts as a delay, so an estimate misread
        short grows back instead of letting every later step stack on the last, and one that
        is right is moved no further than its own limit. Given up, it is never confirmed by
        a move long after (local traffic shifting half an hour later was kept as a 1,796 s
        delay, and held the next step that long)."""
        change = self.pending
        limit = self.wait_limit(0.0, interval)
        if change is not None and change.ticks and change.ticks[-1][0] - change.at >= limit:
            self.delays.append(min(limit, LONGEST * interval))
            self.pending, self.given_up = None, change.at

    def wait_limit(self, settle: float, interval: float) -> float:
        """How long a change not yet seen acting keeps the target settling at most: twice
        the measured delay and a tick, or before any was measured ``UNKNOWN`` intervals."""
        if self.estimate is None:
            return max(settle, UNKNOWN * interval)
        return max(settle, 2 * self.estimate + interval)

    def settling(self, now: float, settle: float, interval: float) -> bool:
        """Whether the law should wait for the last change (see the module docstring);
        ``settle`` 0 never waits, not even for the measured delay."""
        last_change = self.last_change
        if last_change is None or settle <= 0:
            return False
        # Ticks land on the interval grid give or take how long a fetch took: a wait is over
        # within a quarter interval of its end, so the same story never turns on that jitter.
        slack = interval / 4
        elapsed = now - last_change + slack
        if elapsed < settle:
            return True
        if self.pending is not None and self.pending.at == last_change:
            return elapsed < self.wait_limit(settle, interval)
        if self.given_up == last_change:  # it had all its time: the law goes on
            return False
        if self.acted_at is not None and self.acted_at >= last_change:
            return now - self.acted_at + slack < settle
        if not self.delays:  # a change too small to see: as long as they take, at most
            return elapsed < self.wait_limit(settle, interval)
        return elapsed < self.longest + settle


def _started(change: Change, ticks: Sequence[tuple[float, float, float, float]]) -> float | None:
    """When ``change`` started to act, if ``ticks`` (the newest ``CONFIRM`` since it) show it
    acting: each moved its cluster's share the change's way, the newest by half the move on
    its own, and pooled (their counts together are less noisy than either) by half the move
    and by more than the counting noise of both them and the share before."""
    if (
        len(ticks) < CONFIRM
        or not all(_towards(change, t[2]) for t in ticks)
        or not _halfway(change, ticks[-1][2])
    ):
        return None
    n = sum(t[3] for t in ticks)
    seen = sum(t[2] * t[3] for t in ticks) / n
    p = min(max(seen / 100.0, 0.01), 0.99)
    noise = NOISE_SIGMAS * 100.0 * math.sqrt(p * (1 - p) * (1 / n + 1 / change.counted))
    if abs(seen - change.before) < max(abs(change.wanted) / 2, noise):
        return None
    first_at, first_span, first_seen, _ = ticks[0]
    share_of_tick = min(1.0, abs(first_seen - change.before) / abs(change.wanted))
    return max(change.at, first_at - share_of_tick * first_span)


def _pooled(
    recent: Iterable[tuple[float, Mapping[str, float], float]],
) -> dict[str, tuple[float, float]]:
    """Each cluster's share (0..100) of the requests of the ticks it was counted in, pooled
    (weighted by their requests), and how many requests that was."""
    weighted: dict[str, float] = {}
    totals: dict[str, float] = {}
    for _, shares, requests in recent:
        for cluster, share in shares.items():
            weighted[cluster] = weighted.get(cluster, 0.0) + share * requests
            totals[cluster] = totals.get(cluster, 0.0) + requests
    return {c: (weighted[c] / totals[c], totals[c]) for c in weighted if totals[c] > 0}


def _routed(received: Mapping[str, tuple[float, float]], weights: Mapping[str, float]) -> float:
    """The part of the requests the weights route, as the split before a change tells it:
    traffic they do not move (local requests, another target's) lands on top of some
    clusters' shares, so the least share per point of weight is what routing alone gives.
    A change of weights moves the shares of requests by only that much of itself."""
    ratios = [received[c][0] / w for c, w in weights.items() if c in received and w >= MIN_WEIGHT]
    return min(1.0, max(MIN_ROUTED, min(ratios, default=1.0)))


def _halfway(change: Change, seen: float) -> bool:
    """The share moved the way the change moves it, by half the change's move or more."""
    return (seen - change.before) * change.wanted >= change.wanted**2 / 2


def _towards(change: Change, seen: float) -> bool:
    """The share moved the way the change moves it."""
    return (seen - change.before) * change.wanted > 0


def _shares(arrived: Mapping[str, float | None]) -> tuple[dict[str, float], float] | None:
    """Each counted cluster's share (0..100) of this tick's arrivals, and how many there were."""
    counts = {c: float(v) for c, v in arrived.items() if v is not None}
    total = sum(counts.values())
    if total < MIN_REQUESTS:
        return None
    return {c: 100.0 * v / total for c, v in counts.items()}, total
