"""Pure: a cluster's answered /metrics pages → its ``ClusterMetrics``.

Split from the HTTP part (``scrape``) so that anything holding page texts (the simulator)
reads them exactly as a scrape does. A ``PageReader`` keeps what reading needs between scrapes:
the cumulative counters of every page (latency and arrivals come from their increase between
two scrapes, never from since-start totals) and each URL's identity (one URL must be one
process; a load-balanced URL is named as such).

- Pods, read by their engine's row (``controller.engines``: found on each page by its KV
  family, or the one the cluster names): KV use is the mean (and max) over every pod and
  engine process, one series each, never summed; queue and running requests are summed; what
  the cluster holds is the sum of its pods' KV pools when every answering pod publishes one.
- The EPP alone: the pool's averages (KV, queue and running per endpoint), its ready endpoints
  (times ``kv_tokens_per_pod`` where the operator knows a pod's pool), its request counter as
  arrivals. An EPP with 0 ready endpoints has no fresh pod
  and its averages are frozen: stale, never idle.
- Latency: the EPP's request-duration histogram (newest name first), else the pods' engine's
  e2e one, each pod's series summed into one as it is read (``histograms.Fold``: one array
  kept per pod between scrapes, not one per engine and model).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from controller import histograms
from controller.engines import AUTO, ENGINES, Engine, Family, Pool
from controller.errors import (
    ScrapeContentTypeError,
    ScrapeError,
    ScrapeParseError,
    ScrapeTruncatedError,
)
from controller.exposition import (
    MAX_LINE,
    OPENMETRICS,
    TEXT,
    Extraction,
    Extractor,
    Labels,
    PageStream,
    Sample,
    first_of_each,
)
from controller.families import (
    EPP_GAUGES,
    EPP_HISTOGRAMS,
    EPP_KV,
    EPP_LATENCY,
    EPP_QUEUE,
    EPP_READY,
    EPP_REQUESTS,
    EPP_RUNNING,
    PROCESS_START,
)
from controller.histograms import Fold, Folded, Histogram, Layouts, SeriesKey
from controller.model import CapacityFrom, ClusterMetrics, Latency, PodError, Reason
from controller.settings import ClusterSettings
from controller.sources import pod_count_problem


# A pod page is read for the families of every engine's row: which engine wrote it is found
# on the page (``PageReader``). Preference order within a row matters: its first name present
# on a page wins.
def _gauges(engines: Iterable[Engine]) -> tuple[str, ...]:
    return (*dict.fromkeys(g for e in engines for g in e.gauges()), PROCESS_START)


def _histograms(engines: Iterable[Engine]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.latency for e in engines if e.latency))


POD_GAUGES, POD_HISTOGRAMS = _gauges(ENGINES.values()), _histograms(ENGINES.values())
POD_EXTRACTOR = Extractor(gauges=POD_GAUGES, histograms=POD_HISTOGRAMS)
# A pod of a cluster whose EPP gives the request-duration histogram: latency comes from the
# EPP, once per cluster, so the pods' e2e buckets (most of a V1 page's wanted samples) are
# skipped at extraction; their ``_count`` stays, one per series: it says whether a URL is one
# process (``Continuity``).
POD_LEAN_EXTRACTOR = Extractor(gauges=(*POD_GAUGES, *(f + "_count" for f in POD_HISTOGRAMS)))


@functools.cache
def pod_extractors(engines: tuple[Engine, ...]) -> tuple[Extractor, Extractor]:
    """The extractors (whole, and lean: see ``POD_LEAN_EXTRACTOR``) of a table of engines:
    the built-in rows' own, or one pair per table with the config's own engines (built once
    and shared, so their caches serve every cluster of that table)."""
    if set(engines) <= set(ENGINES.values()):
        return POD_EXTRACTOR, POD_LEAN_EXTRACTOR
    gauges, histograms = _gauges(engines), _histograms(engines)
    lean = Extractor(gauges=(*gauges, *(f + "_count" for f in histograms)))
    return Extractor(gauges=gauges, histograms=histograms), lean


EPP_EXTRACTOR = Extractor(gauges=EPP_GAUGES, histograms=EPP_HISTOGRAMS)

ByName = dict[str, list[Sample]]


@dataclass(frozen=True, slots=True)
class Page:
    url: str
    samples: ByName
    fold: Fold | None = None  # its e2e buckets, summed as it was read (``PageReader.pod_stream``)
    # What was read past, the page still usable: repeated series (each kept at its first
    # sample) and lines skipped as not values, counted, and a notice naming the first of each.
    duplicates: int = 0
    skipped: int = 0
    notices: tuple[PodError, ...] = ()


# ---- one page ---------------------------------------------------------------------------------


def looks_like_exposition(text: str) -> bool:
    """Cheap guard against an HTML error page or other garbage served with status 200: the
    first character of the first of its first 50 lines that is not blank."""
    stripped = text.lstrip()
    if not stripped or text.count("\n", 0, len(text) - len(stripped)) >= 50:
        return True  # an empty page is valid text format; it just has no metrics
    head = stripped[0]
    return head == "#" or (head.isascii() and (head.isalpha() or head in "_:"))


def read_page(
    url: str, text: str, extractor: Extractor, content_type: str | None = None
) -> Page | PodError:
    """One page's text → its wanted samples, or the PodError a scrape would report."""
    stream = PageStream(extractor, content_type=content_type)
    stream.feed(text)
    try:
        return page_of(url, stream)
    except ScrapeError as exc:
        return PodError(url=url, reason=exc.reason, detail=exc.detail)


def page_of(url: str, stream: PageStream) -> Page:
    """What a whole page fed through ``stream`` amounts to, or why it is unusable."""
    if stream.media_type not in _METRICS_TYPES:
        raise ScrapeContentTypeError(
            url, f"served as {stream.media_type!r}, which is not a Prometheus metrics format"
        )
    stream.finish()
    if stream.size == 0:
        raise ScrapeTruncatedError(url, "empty body")
    if not looks_like_exposition(stream.head):
        raise ScrapeParseError(url, "not Prometheus text format")
    if stream.long_line:
        raise ScrapeParseError(url, f"a line longer than {MAX_LINE} bytes: not a metrics page")
    _check_ending(url, stream)
    found = stream.result
    if found.invalid_lines:
        raise ScrapeParseError(
            url, f"{found.invalid_lines} malformed line(s), first: {found.first_error}"
        )
    fold = found.fold if isinstance(found.fold, Fold) else None
    if fold is not None:
        fold.settle()  # while the page's numbers are still in the CPU's caches
    return _deduplicated(url, found.by_name(), fold, found)


# What a metrics page may be served as: text format (0.0.4, or Prometheus 3's 1.0.0),
# OpenMetrics, or nothing said (read as the text format, as every client library's
# text-format page can be).
_METRICS_TYPES = frozenset((None, TEXT, OPENMETRICS))


def _check_ending(url: str, stream: PageStream) -> None:
    """A page ends as its format says, or says why not: cut short, or a body that
    contradicts its Content-Type (named, never guessed at)."""
    if stream.openmetrics and stream.after_eof:  # Prometheus's parser: "data after # EOF"
        raise ScrapeParseError(url, "data after '# EOF': not an OpenMetrics page")
    if stream.openmetrics and not stream.ended:
        if stream.whole:
            raise ScrapeContentTypeError(
                url, "served as OpenMetrics, but the whole body has no final '# EOF'"
            )
        raise ScrapeTruncatedError(url, f"no '# EOF' after {stream.size} bytes: cut short")
    if not stream.ended:
        # A last line without its newline on a body that may have been cut in transit
        # (PageStream.finish): its value may be a prefix of the real one (0. of 0.97).
        raise ScrapeTruncatedError(url, f"no final newline after {stream.size} bytes: cut short")
    if not stream.openmetrics and stream.result.stamped and stream.ends_with_eof:
        raise ScrapeContentTypeError(
            url,
            "served as text/plain, but the body ends with OpenMetrics' '# EOF' and its samples "
            "carry timestamps: whether they are seconds (OpenMetrics) or milliseconds (text) "
            "cannot be told",
        )


def _deduplicated(url: str, by_name: ByName, fold: Fold | None, found: Extraction) -> Page:
    """The page with each series kept at its first sample, and what was read past named."""
    duplicates, first = 0, ""
    if fold is not None and fold.duplicates:
        duplicates = fold.duplicates
        first = f"{fold.sample_name}{{{_labels_text(fold.first_duplicate)}}}"
    for name, samples in by_name.items():
        kept, repeat, dropped = first_of_each(samples)
        if repeat is not None:
            by_name[name] = kept
            duplicates += dropped
            first = first or f"{name}{{{_labels_text(_series(repeat))}}}"
    notices = []
    if duplicates:
        detail = f"{duplicates} repeated series, each kept at its first sample; first: {first}"
        notices.append(PodError(url, Reason.DUPLICATE_SERIES, detail))
    if found.skipped:
        detail = f"{found.skipped} line(s) skipped as not values; first: {found.first_skipped}"
        notices.append(PodError(url, Reason.SKIPPED_LINES, detail))
    return Page(url, by_name, fold, duplicates, found.skipped, tuple(notices))


def _kept(samples: Sequence[Sample], keep: Mapping[str, str] | None) -> list[Sample]:
    if not keep:
        return list(samples)
    return [s for s in samples if all(s.labels.get(k) == v for k, v in keep.items())]


def _series(sample: Sample) -> tuple[tuple[str, str], ...]:
    """A sample's labels in order: worked out once per label set the extractor hands out
    (``Labels.derived``, shared by every sample and scrape that carries it)."""
    labels = sample.labels
    if isinstance(labels, Labels) and "le" not in labels:
        return labels.key()
    return tuple(sorted(labels.items()))


def _labels_text(series: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in series)


def pod_kv(found: Sequence[list[Sample]], names: Sequence[str]) -> tuple[str | None, list[Sample]]:
    """A pod's KV series from those of each of its engine's KV names, newest first (``found``
    in the order of ``names``): the newest name's, each replaced by an older name's same series
    when its own value is unusable (NaN, out of range) and the older one is good."""
    present = [(name, samples) for name, samples in zip(names, found, strict=True) if samples]
    if not present:
        return None, []
    name, newest = present[0]
    if all(valid_fraction(s.value) for s in newest):  # nothing to replace: the usual page
        return name, newest
    fallback: dict[tuple[tuple[str, str], ...], Sample] = {}
    for _, older in reversed(present[1:]):
        fallback.update((_series(s), s) for s in older if valid_fraction(s.value))
    chosen = [s if valid_fraction(s.value) else fallback.get(_series(s), s) for s in newest]
    return name, chosen


def of_family(
    page: ByName, family: Family, keep: Mapping[str, str] | None
) -> tuple[str, list[Sample]] | None:
    """The samples of ``family``'s first name with any on the page, by its label matchers
    and ``keep`` (the model)."""
    for name in family.names:
        samples = [s for s in _kept(page.get(name, ()), keep) if family.matches(s.labels)]
        if samples:
            return name, samples
    return None


def first_family(
    page: ByName, families: Sequence[str], keep: Mapping[str, str] | None
) -> tuple[str, list[Sample]] | None:
    for family in families:
        samples = _kept(page.get(family, ()), keep)
        if samples:
            return family, samples
    return None


def valid_fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0  # NaN and the infinities compare false


def _finite(samples: Sequence[Sample]) -> list[float]:
    return [s.value for s in samples if math.isfinite(s.value)]


# ---- between scrapes ----------------------------------------------------------------------------


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
        now = {_series(s): s.value for s in samples if math.isfinite(s.value)}
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

    def check(self, url: str, total: float | None, started: float | None) -> str | None:
        """Why ``url`` is several processes, or ``None``."""
        state = self._urls.setdefault(url, _Identity())
        evidence = _start_evidence(state, started) or _count_evidence(state, total)
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


# ---- a cluster ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """The cluster-level numbers from the pages that answered; ``None`` is unknown."""

    kv_mean: float | None
    kv_max: float | None
    kv_family: str | None
    queue_depth: float | None
    queue_per_pod: float | None
    running: float | None
    observed_at: float | None
    invalid_samples: int
    observed_newest: float | None = None
    ready: float | None = None
    kv_tokens: float | None = None
    kv_tokens_from: str | None = None
    engine: str | None = None


class _PodKV(NamedTuple):
    """An answering pod's page, the engine that wrote it (``None``: no engine's KV family is
    on it) and its KV series (``pod_kv``)."""

    page: Page
    engine: Engine | None
    family: str | None
    samples: list[Sample]


@dataclass(slots=True)
class _KV:
    values: list[float]
    invalid: int = 0
    family: str | None = None
    oldest: float | None = None
    newest: float | None = None

    def add(self, family: str, samples: Sequence[Sample]) -> None:
        self.family = self.family or family
        for sample in samples:
            if not valid_fraction(sample.value):
                self.invalid += 1
                continue
            # One series per engine: each is a fraction of its own cache; never summed.
            self.values.append(sample.value)
            if sample.timestamp is not None:
                self.oldest = min(self.oldest or sample.timestamp, sample.timestamp)
                self.newest = max(self.newest or sample.timestamp, sample.timestamp)


class PageReader:
    """Turns a cluster's answered pages into ClusterMetrics; holds what it needs between
    scrapes (counter baselines, each URL's identity)."""

    def __init__(
        self,
        cluster: ClusterSettings,
        min_latency_requests: float,
        engines: Mapping[str, Engine] = ENGINES,
    ) -> None:
        """``engines``: the table to read pages by (``Settings.engine_table``)."""
        self._name = cluster.name
        self._has_pods = bool(cluster.vllm_urls) or cluster.pods is not None
        self._pod_tokens = cluster.kv_tokens_per_pod
        self._model = cluster.model_name
        self._model_keep = {"model_name": cluster.model_name} if cluster.model_name else None
        # The rows a pod page may be read by: the one the cluster names, or each in turn
        # until one's KV family is on the page (``engine: auto``).
        named = cluster.engine != AUTO
        self._engines = (engines[cluster.engine],) if named else tuple(engines.values())
        self._extractor, self._lean = pod_extractors(tuple(engines.values()))
        # The engine its pods' last pages were written by: whose e2e buckets are folded
        # as the next pages are read (``pod_stream``).
        self._engine = self._engines[0]
        self._pool_keep = {"name": cluster.pool_name} if cluster.pool_name else None
        self._latency = LatencyWindow(min_latency_requests)
        self._layouts = Layouts()  # how this cluster's pods lay out their e2e buckets
        self._requests = Counters()
        self._continuity = Continuity()
        # the EPP's last page carried the request-duration histogram (see ``pod_extractor``)
        self._epp_latency = False

    @property
    def pod_extractor(self) -> Extractor:
        """What to read this cluster's pod pages with: without their e2e buckets while its
        EPP gives latency (once it fails or stops, the next scrape reads them again; their
        latency then counts from the scrape after, as it would for a new pod)."""
        return self._lean if self._epp_latency else self._extractor

    def pod_stream(self) -> PageStream:
        """A pod page's stream: read with ``pod_extractor``, and where that reads the e2e
        buckets (the pods' own histograms give the latency), the buckets folded as they are
        read (``Fold``)."""
        extractor, latency = self.pod_extractor, self._engine.latency
        if extractor is self._lean or latency is None:
            return PageStream(extractor)
        return PageStream(extractor, fold=Fold(latency, self._keep(self._engine), self._layouts))

    def _keep(self, engine: Engine) -> dict[str, str] | None:
        """The labels a series of ``engine`` must carry: the cluster's model, if it names one."""
        return {engine.model_label: self._model} if self._model else None

    def read(
        self,
        results: Sequence[Page | PodError],
        epp: Page | PodError | None,
        started: float,
        duration: float,
        lookup: PodError | None = None,
    ) -> ClusterMetrics:
        """``results``: one entry per vLLM pod; ``epp``: the EPP's, if configured;
        ``lookup``: why finding the pods failed this tick (the pods found before are read)."""
        checked = [self._check(r) if isinstance(r, Page) else r for r in results]
        if isinstance(epp, Page):
            epp = self._identify(epp, EPP_LATENCY)
        kvs = [r for r in checked if isinstance(r, _PodKV)]
        pods = [kv.page for kv in kvs]
        errors = [r for r in (*checked, epp, lookup) if isinstance(r, PodError)]
        epp_page = epp if isinstance(epp, Page) else None
        if self._has_pods:
            values = self._from_pods(kvs)
            scraped, answering = len(results), len(pods)
        else:
            values, error = self._from_epp_pool(epp_page)
            errors += [error] if error else []
            scraped, answering = 1, int(epp_page is not None and error is None)
        answered = pods if self._has_pods else ([epp_page] if epp_page and answering else [])
        if answered and values.kv_mean is None:
            errors.append(self._missing(len(answered)))
        latency, fell = self._latency_from(epp_page, kvs)
        read = [*pods, *([epp_page] if epp_page else [])]
        return ClusterMetrics(
            cluster=self._name,
            scraped_at=started,
            duration=duration,
            pods_scraped=scraped,
            pods_answering=answering,
            kv_mean=values.kv_mean,
            kv_max=values.kv_max,
            kv_family=values.kv_family,
            queue_depth=values.queue_depth,
            queue_per_pod=values.queue_per_pod,
            running=values.running,
            latency=latency,
            observed_at=values.observed_at,
            observed_newest=values.observed_newest,
            invalid_samples=values.invalid_samples + sum(p.skipped for p in read),
            duplicate_samples=sum(p.duplicates for p in read),
            errors=tuple(errors),
            notices=tuple(n for p in read for n in p.notices),
            pages=len(results) + (epp is not None),
            # the increase between two scrapes: what completed since the last one (unknown
            # when a counter fell: a restart, or another process behind the URL)
            completed=latency.requests if latency is not None and not fell else None,
            arrived=self._arrivals(epp_page),
            ready=values.ready,
            kv_tokens=values.kv_tokens,
            kv_tokens_from=values.kv_tokens_from,
            engine=values.engine,
        )

    def retain(self, urls: Sequence[str]) -> None:
        """Forget what is kept of pages no longer read (pods discovery no longer finds)."""
        keep = set(urls)
        self._latency.retain(keep)
        self._continuity.retain(keep)

    def _missing(self, answered: int) -> PodError:
        """Pages came back but none carries KV use: say which names were looked for."""
        names = " or ".join([str(e.kv) for e in self._engines] if self._has_pods else list(EPP_KV))
        keep = self._model_keep or self._pool_keep
        scope = f" for {keep}" if keep else ""
        detail = f"no {names} series{scope} on {answered} page(s) that answered"
        return PodError("*", Reason.MISSING_METRIC, detail)

    def _from_pods(self, kvs: Sequence[_PodKV]) -> Summary:
        kv = _KV(values=[])
        waiting: list[float] = []
        running: list[float] = []
        pools: list[float | None] = []
        for pod, engine, family, samples in kvs:
            if family is not None:
                kv.add(family, samples)
            if engine is None:
                pools.append(None)
                continue
            keep = self._keep(engine)
            waiting += _pod_total(pod.samples, engine.waiting, keep)
            running += _pod_total(pod.samples, engine.running, keep)
            pools.append(pool_tokens(pod.samples, engine.pools))
        summary = _summary(kv, waiting, running, per_pod=len(waiting) or None)
        engines = sorted({e.name for _, e, _, _ in kvs if e is not None})
        summary = replace(summary, engine="+".join(engines) or None)
        if pools and all(p is not None for p in pools):  # every pod says what it holds
            tokens = sum(p for p in pools if p is not None)
            return replace(summary, kv_tokens=tokens, kv_tokens_from=CapacityFrom.KV_BLOCKS)
        if pools and self._pod_tokens:  # the operator says what one pod holds
            tokens = len(pools) * self._pod_tokens
            return replace(summary, kv_tokens=tokens, kv_tokens_from=CapacityFrom.KV_TOKENS_PER_POD)
        return summary

    def _check(self, page: Page) -> _PodKV | PodError:
        """A vLLM page whose KV series are all out of range is an error of its own: its pod
        does not count as answering. So is one URL that is several processes. An answering
        pod comes back with its KV series (``pod_kv``), worked out once; a series repeated on
        the page was kept at its first sample when the page was read (``page_of``)."""
        engine, name, chosen = self._engine_of(page)
        if name is not None and chosen and not any(valid_fraction(s.value) for s in chosen):
            bad = chosen[0]
            hint = " (a percentage? it must be a fraction 0..1)" if 1 < bad.value <= 100 else ""
            detail = f"{name}{{{_labels_text(_series(bad))}}}={bad.value:g} is outside 0..1{hint}"
            return PodError(page.url, Reason.OUT_OF_RANGE, detail)
        latency = (engine.latency,) if engine and engine.latency else ()
        identified = self._identify(page, latency)
        return _PodKV(page, engine, name, chosen) if isinstance(identified, Page) else identified

    def _engine_of(self, page: Page) -> tuple[Engine | None, str | None, list[Sample]]:
        """The engine whose KV family is on the page (the first of the cluster's rows that
        has one; with a single row, that row even without), its KV name and series."""
        for engine in self._engines:
            keep = self._keep(engine)
            found = [
                [s for s in _kept(page.samples.get(n, ()), keep) if engine.kv.matches(s.labels)]
                for n in engine.kv.names
            ]
            name, chosen = pod_kv(found, engine.kv.names)
            if name is not None:
                self._engine = engine
                return engine, name, chosen
        only = self._engines[0] if len(self._engines) == 1 else None
        return only, None, []

    def _identify(self, page: Page, latency: Sequence[str]) -> Page | PodError:
        """The page, or why its URL is several processes (``Continuity``)."""
        counts = first_family(page.samples, [f + "_count" for f in latency], None)
        total = sum(_finite(counts[1])) if counts else None
        start = _finite(page.samples.get(PROCESS_START, ()))
        why = self._continuity.check(page.url, total, start[0] if len(start) == 1 else None)
        if why is None:
            return page
        detail = (
            f"this URL answers as more than one process ({why}): a Service or load balancer "
            "in front of several pods? List each pod, discover them (pods.dns), or read the "
            "cluster through its EPP"
        )
        return PodError(page.url, Reason.LOAD_BALANCED, detail)

    def _from_epp_pool(self, page: Page | None) -> tuple[Summary, PodError | None]:
        kv = _KV(values=[])
        if page is None:
            return _summary(kv, [], [], per_pod=None), None
        ready = first_family(page.samples, EPP_READY, self._pool_keep)
        endpoints = sum(_finite(ready[1])) if ready else None
        if ready and endpoints is not None and (why := pod_count_problem(endpoints, ready[0])):
            return _summary(kv, [], [], per_pod=None), PodError(page.url, Reason.OUT_OF_RANGE, why)
        if endpoints is not None and endpoints <= 0:
            detail = (
                f"{ready[0] if ready else ''} is 0: no endpoint of the pool has fresh metrics, "
                "so the EPP's averages are frozen at their last values"
            )
            return _summary(kv, [], [], per_pod=None), PodError(page.url, Reason.STALE, detail)
        found = first_family(page.samples, EPP_KV, self._pool_keep)
        if found is not None:
            kv.add(*found)
        per_pod = _mean_of(page, EPP_QUEUE, self._pool_keep)
        running = _mean_of(page, EPP_RUNNING, self._pool_keep)
        tokens = endpoints * self._pod_tokens if endpoints and self._pod_tokens else None
        summary = replace(
            _summary(kv, [], [], per_pod=None),
            queue_per_pod=per_pod,
            queue_depth=per_pod * endpoints if per_pod is not None and endpoints else None,
            running=running * endpoints if running is not None and endpoints else None,
            ready=endpoints or None,
            kv_tokens=tokens,
            kv_tokens_from=CapacityFrom.KV_TOKENS_PER_POD if tokens else None,
        )
        return summary, None

    def _arrivals(self, epp: Page | None) -> float | None:
        """Requests the EPP scheduled since its last scrape (its request counter)."""
        if epp is None:
            return None
        found = first_family(epp.samples, EPP_REQUESTS, self._model_keep)
        return self._requests.increase(epp.url, found[1]) if found else None

    def _latency_from(
        self, epp: Page | None, pods: Sequence[_PodKV]
    ) -> tuple[Latency | None, bool]:
        if epp is not None:
            for family in EPP_LATENCY:
                series = histograms.collect(epp.samples, family, self._model_keep)
                if series:
                    self._epp_latency = True
                    return self._latency.observe(family, [(epp.url, series)])
        self._epp_latency = False
        pages = [(p.page.url, self._folded(p.page, p.engine)) for p in pods]
        if not any(folded for _, folded in pages):
            return None, False
        return self._latency.observe_folded(self._engine.latency or "", pages)

    def _folded(self, page: Page, engine: Engine | None) -> Folded | None:
        """A pod's e2e series as one (``Fold``): what is kept of it until the next scrape;
        folded as it was read, or here from its samples (a page read without ``pod_stream``,
        or whose engine was not yet known when it was)."""
        latency = engine.latency if engine is not None else None
        if latency is None:
            return None
        fold = page.fold
        if fold is None or fold.sample_name != latency + "_bucket":
            fold = Fold(latency, self._keep(engine) if engine else None)
            fold.add_all(page.samples.get(latency + "_bucket", ()))
        return fold.folded(page.samples)


def pool_tokens(page: ByName, pools: Sequence[Pool]) -> float | None:
    """What a pod's KV cache holds, in tokens, by the first of its engine's ``pools`` rules
    the page has; ``None`` when it says nothing usable (vLLM's ``num_gpu_blocks="None"``
    before profiling, a zero, a fraction, a NaN)."""
    for pool in pools:
        if pool.info is not None and pool.info in page:
            return _info_tokens(page[pool.info], pool)
        if pool.block is not None and pool.count is not None:
            block, count = of_family(page, pool.block, None), of_family(page, pool.count, None)
            if block is not None and count is not None:
                return _product_tokens(block[1], count[1], pool)
        if pool.tokens is not None and (found := of_family(page, pool.tokens, None)):
            values = [s.value for s in found[1]]
            return sum(values) if all(_a_size(v) for v in values) else None
    return None


def _info_tokens(samples: Sequence[Sample], pool: Pool) -> float | None:
    """An info gauge's block size × block count labels, one series per engine process
    (vLLM: ``vllm:cache_config_info``'s ``block_size`` and ``num_gpu_blocks``, by ``engine``)."""
    engines: dict[str, float] = {}
    for sample in samples:
        try:
            blocks = int(sample.labels[pool.count_label])
            size = int(sample.labels[pool.block_label])
        except (KeyError, ValueError):
            return None
        if blocks <= 0 or size <= 0:
            return None
        engines[sample.labels.get(pool.engine_label, "")] = float(blocks * size)
    return sum(engines.values()) if engines else None


def _product_tokens(blocks: Sequence[Sample], counts: Sequence[Sample], pool: Pool) -> float | None:
    """Two gauges multiplied series by series (the labels that tell the families apart, such
    as TensorRT-LLM's ``kv_cache_block_type``, left out), summed; every series paired."""
    assert pool.block is not None and pool.count is not None
    drop = {k for k, _ in (*pool.block.match, *pool.count.match)}

    def key(sample: Sample) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, v) for k, v in sample.labels.items() if k not in drop))

    size = {key(s): s.value for s in blocks}
    count = {key(s): s.value for s in counts}
    if size.keys() != count.keys() or not all(map(_a_size, (*size.values(), *count.values()))):
        return None
    return sum(size[k] * count[k] for k in size)


def _a_size(value: float) -> bool:
    """A count of blocks or tokens: a positive whole number."""
    return math.isfinite(value) and value > 0 and value == int(value)


def _mean_of(page: Page, families: Sequence[str], keep: Mapping[str, str] | None) -> float | None:
    found = first_family(page.samples, families, keep)
    values = _finite(found[1]) if found else []
    return sum(values) / len(values) if values else None


def _pod_total(page: ByName, family: Family, keep: Mapping[str, str] | None) -> list[float]:
    """A pod's total for an additive gauge (summed over its engine processes), or nothing if
    absent."""
    found = of_family(page, family, keep)
    values = _finite(found[1]) if found else []
    return [sum(values)] if values else []


def _summary(kv: _KV, waiting: list[float], running: list[float], per_pod: int | None) -> Summary:
    queue = sum(waiting) if waiting else None
    return Summary(
        kv_mean=sum(kv.values) / len(kv.values) if kv.values else None,
        kv_max=max(kv.values) if kv.values else None,
        kv_family=kv.family,
        queue_depth=queue,
        queue_per_pod=queue / per_pod if queue is not None and per_pod else None,
        running=sum(running) if running else None,
        observed_at=kv.oldest,
        observed_newest=kv.newest,
        invalid_samples=kv.invalid,
    )
