"""Pure: one answered /metrics page → its wanted samples (``Page``), or why it is unusable.

Split from the HTTP part (``scrape``) so that anything holding page texts (the simulator)
reads them exactly as a scrape does. A pod page is read for every engine's families (the
engine table, ``controller.engines``); which engine wrote it is decided by the cluster's
reader (``sources.reader``). Here too: a pod's signals by its engine's row (``of_family``,
``pod_kv``) and its KV pool by the row's rules (``pool_tokens``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from controller.engines import ENGINES, Engine, Family, Pool
from controller.errors import (
    FetchContentTypeError,
    FetchError,
    FetchParseError,
    FetchTruncatedError,
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
from controller.families import EPP_GAUGES, EPP_HISTOGRAMS, PROCESS_START
from controller.histograms import Fold
from controller.model import PodError, Reason


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
    split: dict[str, Split] = field(default_factory=dict, compare=False, repr=False)


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
    except FetchError as exc:
        return PodError(url=url, reason=exc.reason, detail=exc.detail)


def page_of(url: str, stream: PageStream) -> Page:
    """What a whole page fed through ``stream`` amounts to, or why it is unusable."""
    if stream.media_type not in _METRICS_TYPES:
        raise FetchContentTypeError(
            url, f"served as {stream.media_type!r}, which is not a Prometheus metrics format"
        )
    stream.finish()
    if stream.size == 0:
        raise FetchTruncatedError(url, "empty body")
    if not looks_like_exposition(stream.head):
        raise FetchParseError(url, "not Prometheus text format")
    if stream.long_line:
        raise FetchParseError(url, f"a line longer than {MAX_LINE} bytes: not a metrics page")
    _check_ending(url, stream)
    found = stream.result
    if found.invalid_lines:
        # counted up to the piece the first was found in (``PageStream._extract``)
        raise FetchParseError(
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
        raise FetchParseError(url, "data after '# EOF': not an OpenMetrics page")
    if stream.openmetrics and not stream.ended:
        if stream.whole:
            raise FetchContentTypeError(
                url, "served as OpenMetrics, but the whole body has no final '# EOF'"
            )
        raise FetchTruncatedError(url, f"no '# EOF' after {stream.size} bytes: cut short")
    if not stream.ended:
        # A last line without its newline on a body that may have been cut in transit
        # (PageStream.finish): its value may be a prefix of the real one (0. of 0.97).
        raise FetchTruncatedError(url, f"no final newline after {stream.size} bytes: cut short")
    if not stream.openmetrics and stream.result.stamped and stream.ends_with_eof:
        raise FetchContentTypeError(
            url,
            "served as text/plain, but the body ends with OpenMetrics' '# EOF' and its samples "
            "carry timestamps: whether they are seconds (OpenMetrics) or milliseconds (text) "
            "cannot be told",
        )
    if not stream.openmetrics and stream.result.invalid_lines and stream.ends_with_eof:
        # read no further than its first malformed line (``PageStream._extract``), whether
        # later samples carried timestamps is not known; a text page with OpenMetrics' ending
        # and lines the text format refuses (an exemplar, say) is one served under the wrong
        # type, as the timestamps above say (a review: it read as a parse error)
        raise FetchContentTypeError(
            url,
            "served as text/plain, but the body ends with OpenMetrics' '# EOF' and has lines "
            f"the text format refuses (first: {stream.result.first_error}): an OpenMetrics "
            "page served as text?",
        )


def _deduplicated(url: str, by_name: ByName, fold: Fold | None, found: Extraction) -> Page:
    """The page with each series kept at its first sample, and what was read past named."""
    duplicates, first = 0, ""
    if fold is not None and fold.duplicates:
        duplicates = fold.duplicates
        first = f"{fold.sample_name}{{{labels_text(fold.first_duplicate)}}}"
    for name, samples in by_name.items():
        kept, repeat, dropped = first_of_each(samples)
        if repeat is not None:
            by_name[name] = kept
            duplicates += dropped
            first = first or f"{name}{{{labels_text(series_of(repeat))}}}"
    notices = []
    if duplicates:
        detail = f"{duplicates} repeated series, each kept at its first sample; first: {first}"
        notices.append(PodError(url, Reason.DUPLICATE_SERIES, detail))
    if found.skipped:
        detail = f"{found.skipped} line(s) skipped as not values; first: {found.first_skipped}"
        notices.append(PodError(url, Reason.SKIPPED_LINES, detail))
    return Page(url, by_name, fold, duplicates, found.skipped, tuple(notices))


# A replica's series on a node page, by process: its samples by name, and the models they name
Split = dict[str, dict[str, tuple["ByName", frozenset[str]]]]


def replicas_on(page: Page, engine: Engine) -> Split:
    """A node page's samples by replica and process (``Engine.replica_label``,
    ``process_label``), each name's in page order, with the models each process's series
    name; the node's own series (without the replica label) belong to none. Worked out once
    per page and row, whichever clusters read it (a Ray node's page is every model's:
    ``SharedPages`` hands the same page to each model's cluster). Read-only."""
    found = page.split.get(engine.name)
    if found is None:
        found = page.split[engine.name] = _by_replica(page.samples, engine)
    return found


def _by_replica(page: ByName, engine: Engine) -> Split:
    """``replicas_on``'s split. A name's samples come in runs of one replica and process (a
    replica's buckets, one after another), so each sample costs its labels' lookups and an
    append; the groups are looked up where a run starts."""
    assert engine.replica_label is not None
    label, process, model = engine.replica_label, engine.process_label, engine.model_label
    units: dict[str, dict[str, ByName]] = {}
    models: dict[tuple[str, str], set[str]] = {}
    for name, samples in page.items():
        run: tuple[str, str] | None = None
        group: list[Sample] = []
        named: set[str] = set()
        for sample in samples:
            labels = sample.labels
            replica = labels.get(label)
            if replica is None:
                continue
            worker = labels.get(process, "") if process else ""
            if run is None or replica != run[0] or worker != run[1]:
                run = (replica, worker)
                unit = units.setdefault(replica, {}).setdefault(worker, {})
                group = unit.setdefault(name, [])
                named = models.setdefault(run, set())
            group.append(sample)
            value = labels.get(model, "")
            if value not in named:
                named.add(value)
    return {
        replica: {w: (series, frozenset(models[replica, w])) for w, series in workers.items()}
        for replica, workers in units.items()
    }


def kept(samples: Sequence[Sample], keep: Mapping[str, str] | None) -> list[Sample]:
    if not keep:
        return list(samples)
    if len(keep) == 1:  # a model's label, mostly: no generator per sample
        ((label, value),) = keep.items()
        return [s for s in samples if s.labels.get(label) == value]
    return [s for s in samples if all(s.labels.get(k) == v for k, v in keep.items())]


def series_of(sample: Sample) -> tuple[tuple[str, str], ...]:
    """A sample's labels in order: worked out once per label set the extractor hands out
    (``Labels.derived``, shared by every sample and scrape that carries it)."""
    labels = sample.labels
    if isinstance(labels, Labels) and "le" not in labels:
        return labels.key()
    return tuple(sorted(labels.items()))


def labels_text(series: tuple[tuple[str, str], ...]) -> str:
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
        fallback.update((series_of(s), s) for s in older if valid_fraction(s.value))
    chosen = [s if valid_fraction(s.value) else fallback.get(series_of(s), s) for s in newest]
    return name, chosen


def of_family(
    page: ByName, family: Family, keep: Mapping[str, str] | None
) -> tuple[str, list[Sample]] | None:
    """The samples of ``family``'s first name with any on the page, by its label matchers
    and ``keep`` (the model)."""
    for name in family.names:
        samples = matching(kept(page.get(name, ()), keep), family)
        if samples:
            return name, samples
    return None


def matching(samples: list[Sample], family: Family) -> list[Sample]:
    """The samples whose labels carry ``family``'s matchers (most families have none)."""
    if not family.match:
        return samples
    return [s for s in samples if family.matches(s.labels)]


def first_family(
    page: ByName, families: Sequence[str], keep: Mapping[str, str] | None
) -> tuple[str, list[Sample]] | None:
    for family in families:
        samples = kept(page.get(family, ()), keep)
        if samples:
            return family, samples
    return None


def valid_fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0  # NaN and the infinities compare false


def finite(samples: Sequence[Sample]) -> list[float]:
    return [s.value for s in samples if math.isfinite(s.value)]


def pool_tokens(
    page: ByName, pools: Sequence[Pool], keep: Mapping[str, str] | None = None
) -> float | None:
    """What a pod's KV cache holds, in tokens, by the first of its engine's ``pools`` rules
    the page has, for the model ``keep`` names (a gauge rule's series carry the model's
    label; vLLM's info gauge does not, and is one pool per engine process whatever it
    serves); ``None`` when it says nothing usable (vLLM's ``num_gpu_blocks="None"`` before
    profiling, a zero, a fraction, a NaN)."""
    for pool in pools:
        if pool.info is not None and pool.info in page:
            return _info_tokens(page[pool.info], pool)
        if pool.block is not None and pool.count is not None:
            block, count = of_family(page, pool.block, keep), of_family(page, pool.count, keep)
            if block is not None and count is not None:
                return _product_tokens(block[1], count[1], pool)
        if pool.tokens is not None and (found := of_family(page, pool.tokens, keep)):
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
        try:
            engines[sample.labels.get(pool.engine_label, "")] = float(blocks * size)
        except OverflowError:  # a label of 400 digits (an attack's): a pool no GPU holds,
            return math.inf  # refused by name as out of range (``kv_tokens_problem``)
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
