"""Pure: Prometheus text exposition → samples of just the families we want.

A full parser (``prometheus_client.parser``) tokenises every line of a page; a vLLM page is
mostly families we never read. One regular expression finds the lines that start with a wanted
sample name, and only those lines are split into labels, value and timestamp. The semantics match
the text format (and ``prometheus_client.parser``, which the tests use as the reference):
escaped label values, optional millisecond timestamps, ``NaN``/``+Inf``/``-Inf``, spaces around
label separators, CRLF line ends, missing HELP/TYPE, OpenMetrics ``# EOF`` and exemplars.

prometheus-client >= 0.23 rewrites ``vllm:`` names to ``vllm_`` for OpenMetrics clients, so each
``vllm:`` name is also found under that spelling and reported under its canonical ``vllm:`` name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from controller.engines import spellings

__all__ = [
    "OPENMETRICS",
    "Extraction",
    "Extractor",
    "Folding",
    "Labels",
    "PageStream",
    "Sample",
    "bound_or_none",
    "first_of_each",
    "go_float",
    "parse_le",
]

# Unrolled loops ("normal* (special normal*)*"): the regex engine eats runs of plain
# characters in one step instead of trying an alternation per character.
_QUOTED = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_BODY = r'[^"}\n]*(?:' + _QUOTED + r'[^"}\n]*)*'
# A value or timestamp; float() would also take "1_000", which the format does not.
_NUMBER = r"[^ \t\r\n_]+"
# After the name: [{labels}] value [timestamp] [# exemplar], to the end of the line.
# A value may follow the closing brace with no blank (``x{a="b"}6``: valid in both formats,
# as Prometheus's and client_python's parsers read it); a bare name needs one.
_REST = (
    r"(?:[ \t]*\{(" + _BODY + r")\}[ \t]*|[ \t]+)(" + _NUMBER + r")"
    r"(?:[ \t]+(" + _NUMBER + r"))??(?:[ \t]+#[^\n]*)?[ \t]*\r?$"
)
_REST_RE = re.compile(_REST)
# A native histogram's value written in text (``{count:24,sum:100,…}``, client_python's
# OpenMetrics parser reads it): not a classic sample, so skipped, never a malformed page.
# It follows the name or label set after a blank, as a value does.
_NATIVE_RE = re.compile(r"[ \t]*(?:\{" + _BODY + r"\})?[ \t]+\{[a-z_]+:")
# Pairs are separated by a comma, and Prometheus's text lexer also takes blanks alone
# (``{quantile="2.0" a="b"}``: promparse_test.go reads it; client_python refuses pairs with
# nothing between them, and so does this). A trailing comma, and a lone one (``{,}``,
# client_python's test_commas) are allowed. Every repeat is possessive, so a label text that
# fails is refused in linear time.
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*+"'
_SEP = r"(?:[ \t]*+,[ \t]*+|[ \t]++)"
_BODY_OK_RE = re.compile(rf"[ \t]*+(?:{_PAIR}(?:{_SEP}{_PAIR})*+[ \t]*+,?|,)?[ \t]*")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"')
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# Label sets and line heads repeat on every scrape and across the pods of one deployment;
# working each out once keeps the per-line cost at one regex match and a lookup. Kept in two
# generations (_Kept), each at first of at most this many entries ...
_CACHE_LIMIT = 16384
# ... and this much text (real label texts are a few hundred characters; 16,384 of them
# fit); a text longer than _CACHED_CHARS is not kept.
_CACHE_BYTES = 4 * 1024 * 1024
_CACHED_CHARS = 4096
# A wanted sample with more labels than this refuses its page, as Prometheus's scrape_config
# label_limit fails a scrape (a Ray replica's series has 11 and its bucket's 12, vLLM's 2 or
# 3): a label costs ~150 bytes parsed, so 3,300 samples of 400 short labels, 10 MB of text
# under every other cap, held 204 MiB (found by a review).
MAX_LABELS = 32
# ... and a label set of more than this many is never kept (nor a head that refers to one):
# parsed each time it is seen, it costs time, never memory. The caches' budgets count text,
# and a set of many short labels holds ~20 times its text.
_CACHED_LABELS = 16
# A generation grows (doubling) while what it drops keeps coming back, up to this many times
# its first size: 64 MiB of text a generation. Pods of one deployment share their lines, but
# a Ray node's page names its node, workers and replicas, so a fleet of them wants ~470
# bytes a line of each node (200 nodes of 16 replicas: 89,600 lines, 42 MB).
_CACHE_GROWTH = 16
# ... and only where the texts that filled a generation came from many pages, at most this
# many a page (a Ray node of 100 replicas wants ~2,800 lines): a page that repeats its own
# flood of series scrape after scrape is a cycle too, but one page, and grows nothing.
PAGE_LINES = 4096
# What a generation dropped is remembered by a bit of its hash in a filter of this many bits
# (256 KiB, made at the first rotation), cleared once a quarter of it is set: a text that
# is new is taken for one seen before at most a quarter of the time.
_GHOST_BITS = 1 << 21
# Every cache's rotations and growths, for the process: once they grew and stopped dropping
# anything, what they hold is kept for good (``app.CollectorSettler``).
rotations = 0
growths = 0
# Real label texts are a few hundred characters at most; a longer one (hostile, or broken) is
# parsed whole, never through the bucket shortcut, which would parse its series once more.
_SHORTCUT_CHARS = 4096


_T = TypeVar("_T")


class _Kept(Generic[_T]):
    """What was worked out from a text, kept for the next page: two generations, each
    bounded in entries and in bytes of text (``limit``, ``budget``; a label set kept for a
    text holds about as much again, while a head's entry refers to a label set it shares
    with that cache). When the young one is full it becomes the old one and the oldest is
    dropped; a hit in the old one moves back, so what is still in use survives and a page of
    a million new texts cannot evict the fleet's working set at once. A text longer than
    ``_CACHED_CHARS`` is never kept: worked out each time it is seen, it costs time, never
    memory. ``young`` is read directly on the hot path (a dict's ``get``); it is a new dict
    after each rotation.

    A working set larger than a generation is read in a cycle (every page, every tick), so
    each text is dropped before it comes round again and nothing is ever a hit: the cache
    churns at full cost. That is told from a flood of new texts by what comes back: the
    texts a rotation drops are marked in a filter (``_GHOST_BITS``), and when more than half
    of a generation's new entries were marked and they came from pages enough
    (``PAGE_LINES`` a page at most: ``pages`` counts the pages begun), the generation
    doubles (``_CACHE_GROWTH`` times at most). A flood never comes back, and a page's own
    repeats are one page: neither grows the cache; a fleet does, to its size."""

    __slots__ = (
        *("_ghosts", "_marked", "_old_size", "_pages_then", "_returned", "budget", "limit"),
        *("_grown", "old", "pages", "rotations", "size", "young"),
    )

    def __init__(
        self, seed: dict[str, _T] | None = None, grown: Callable[[int], None] | None = None
    ) -> None:
        """``grown``: told the new limit when a generation grows."""
        self.young: dict[str, _T] = dict(seed or {})
        self._grown = grown
        self.old: dict[str, _T] = {}
        self.size = 0  # text held by the young generation
        self._old_size = 0  # and by the old (its keys never change)
        self.rotations = 0  # generations dropped: churn, for tests and benchmarks
        self.limit, self.budget = _CACHE_LIMIT, _CACHE_BYTES  # a generation's, as grown
        self._ghosts: bytearray | None = None  # what rotations dropped (``_GHOST_BITS``)
        self._marked = 0  # texts marked in it since it was cleared
        self._returned = 0  # new entries of the young generation that had been dropped
        self.pages = 0  # pages begun on the cache's extractor (``Extractor.begin_page``)
        self._pages_then = 0  # ... when the young generation began

    def recall(self, text: str) -> _T | None:
        found = self.young.get(text)
        if found is None:
            found = self.old.get(text)
            if found is not None:
                self._put(text, found)
        return found

    def keep(self, text: str, value: _T) -> None:
        if len(text) > _CACHED_CHARS:
            return
        ghosts = self._ghosts
        if ghosts is not None:
            bit = hash(text) & (_GHOST_BITS - 1)
            self._returned += ghosts[bit >> 3] >> (bit & 7) & 1
        self._put(text, value)

    def _put(self, text: str, value: _T) -> None:
        if len(self.young) >= self.limit or self.size + len(text) > self.budget:
            self._rotate()
        self.young[text] = value
        self.size += len(text)

    def _rotate(self) -> None:
        global rotations, growths
        rotations += 1
        came_back = 2 * self._returned > len(self.young)
        many_pages = (self.pages - self._pages_then) * PAGE_LINES >= len(self.young)
        if came_back and many_pages and self.limit < _CACHE_LIMIT * _CACHE_GROWTH:
            self.limit, self.budget = 2 * self.limit, 2 * self.budget
            growths += 1
            if self._grown is not None:
                self._grown(self.limit)
        ghosts = self._ghosts
        if ghosts is None or self._marked + len(self.old) > _GHOST_BITS // 4:
            ghosts = self._ghosts = bytearray(_GHOST_BITS // 8)
            self._marked = 0
        for text in self.old:  # dropped now
            bit = hash(text) & (_GHOST_BITS - 1)
            ghosts[bit >> 3] |= 1 << (bit & 7)
        self._marked += len(self.old)
        self.old, self.young = self.young, {}
        self.rotations += 1
        self._old_size, self.size, self._returned = self.size, 0, 0
        self._pages_then = self.pages

    @property
    def entries(self) -> int:
        return len(self.young) + len(self.old)

    @property
    def bytes(self) -> int:
        return self.size + self._old_size


class _Idents:
    """A number for each (series, bound) worked out: equal pairs get the same number whatever
    label text they were parsed from (``{a="1",le="1"}``, ``{le="1.0",a="1"}``), so a page's
    repeated series are found by comparing small ints (``first_of_each``). Numbers are never
    reused; past ``limit`` pairs, or ``LABELS`` labels a pair on average (the table holds
    each series alive after the caches let its label sets go: a hostile series of 450 labels
    is ~80 KB), the table starts afresh, and a number given before it did (below ``first``)
    is no longer vouched for: ``first_of_each`` compares its group whole and numbers the label
    set again."""

    LIMIT = 1 << 15
    LABELS = 16  # a Ray replica's series has 11, vLLM's 2 or 3

    def __init__(self) -> None:
        self._numbers: dict[tuple[tuple[tuple[str, str], ...], float | None], int] = {}
        self._next = 0
        self._labels = 0  # the labels of the series held
        self.first = 0  # the first number of the table as it is
        self.limit = self.LIMIT  # raised with the label caches (``fit``)

    def fit(self, label_sets: int) -> None:
        """Hold as many pairs as the label caches hold label sets, once they have grown
        (``_Kept``): else a fleet that fits in them renumbers its groups every page."""
        self.limit = max(self.limit, label_sets)

    def number(self, series: tuple[tuple[str, str], ...], bound: float | None) -> int:
        found = self._numbers.get((series, bound))
        if found is not None:
            return found
        if len(self._numbers) >= self.limit or self._labels >= self.limit * self.LABELS:
            self._numbers.clear()
            self._labels = 0
            self.first = self._next
        found = self._numbers[series, bound] = self._next
        self._labels += len(series)
        self._next += 1
        return found


_IDENTS = _Idents()


def _fit_idents(limit: int) -> None:
    """A label cache grew to ``limit`` a generation: number as many pairs as it holds."""
    _IDENTS.fit(2 * limit)


class Labels(dict[str, str]):
    """A parsed label set, one object per distinct label text and shared by every sample that
    carries it (the extractor's cache hands out the same object). What histograms need from
    it is worked out on first use and kept: ``series``, the labels without ``le`` in order,
    ``bound``, ``le`` as a number (``None`` when absent or not a number), and ``ident``, the
    pair's number (``_Idents``). Read them through ``derived()``; until then the slots are
    empty, so a label set that is never a histogram bucket costs only its dict."""

    __slots__ = ("bound", "ident", "series")
    series: tuple[tuple[str, str], ...]
    bound: float | None
    ident: int

    def derived(self) -> tuple[tuple[tuple[str, str], ...], float | None]:
        try:
            return self.series, self.bound
        except AttributeError:
            pass
        series = tuple(sorted((k, v) for k, v in self.items() if k != "le"))
        self.settle(series, bound_or_none(self["le"]) if "le" in self else None)
        return self.series, self.bound

    def settle(self, series: tuple[tuple[str, str], ...], bound: float | None) -> None:
        """Keep what ``derived`` reads: the series, the bound and the pair's number."""
        self.series, self.bound = series, bound
        self.ident = _IDENTS.number(series, bound)

    def key(self) -> tuple[tuple[str, str], ...]:
        """``series`` alone, from its slot once worked out: what a series is keyed by."""
        try:
            return self.series
        except AttributeError:
            return self.derived()[0]


class Sample(NamedTuple):
    """One sample line. ``timestamp`` is in seconds (a text-format page writes milliseconds,
    an OpenMetrics page seconds: ``Extraction.openmetrics``).

    A NamedTuple: immutable like a frozen dataclass, and several times cheaper to build, which
    matters at a few hundred samples per page and thousands of pages per tick.
    """

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


_new_sample = tuple.__new__  # Sample's own __new__ is a Python function: twice the cost


class Folding(Protocol):
    """Where the samples of one name go instead of into an ``Extraction``'s groups: a page's
    histogram series summed once it is read (``histograms.Fold``), so its hundreds of bucket
    lines never become samples. Each line's label set and value are appended to ``labels``
    and ``values``, in page order: two appends a line, no call of ours."""

    @property
    def sample_name(self) -> str: ...

    @property
    def labels(self) -> list[dict[str, str]]: ...

    @property
    def values(self) -> list[float]: ...

    def settle(self) -> None:
        """Sum what was handed over so far: at the page's end, and every ``FOLD_BATCH``
        lines of a long page, so no page holds more than that many bucket lines."""


@dataclass(slots=True)
class Extraction:
    """The wanted samples of a page by sample name, each in page order, and how many
    wanted-looking lines could not be read; the samples ``fold`` takes go to it instead.

    ``openmetrics``: the page is read by OpenMetrics' rules (timestamps in seconds), not the
    text format's (milliseconds). ``skipped``: lines of the grammar whose value would be
    wrong, so not a value: a NaN or infinite timestamp, a bucket whose ``le`` bounds
    nothing, a native histogram (``first_skipped`` says the first and why). ``stamped``:
    some wanted line carried a timestamp."""

    grouped: dict[str, list[Sample]] = field(default_factory=dict)
    invalid_lines: int = 0
    first_error: str | None = None
    fold: Folding | None = None
    openmetrics: bool = False
    skipped: int = 0
    first_skipped: str | None = None
    stamped: bool = False

    @property
    def samples(self) -> list[Sample]:
        """Every wanted sample: by name (in order of first appearance), then in page order."""
        return [sample for group in self.grouped.values() for sample in group]

    def by_name(self) -> dict[str, list[Sample]]:
        return self.grouped


_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


class Extractor:
    """Finds the samples of the given gauge and histogram families in a page.

    Build one per set of families and reuse it: the patterns are compiled once and parsed label
    sets are remembered across pages.
    """

    def __init__(self, gauges: Iterable[str] = (), histograms: Iterable[str] = ()) -> None:
        wanted = [*gauges, *(f + end for f in histograms for end in _HISTOGRAM_SUFFIXES)]
        # A name's other spelling (``ns:x`` served as ``ns_x``) reads as the name, unless it
        # is itself a wanted name: then it reads as itself.
        canonical = {spelled: name for name in wanted for spelled in spellings(name)[1:]}
        canonical.update((name, name) for name in wanted)
        self._canonical = canonical
        # a bucket whose le bounds nothing is skipped, never read as another bucket
        self._buckets = frozenset(n for n in canonical.values() if n.endswith("_bucket"))
        names = _trie_pattern(canonical) or "(?!)"  # no names: a pattern that finds nothing
        # One pattern finds every wanted line: it is anchored at a newline (the regex engine
        # skips to the next one in C), so each line is tried once and a hostile line that
        # repeats a wanted name costs its length, not its length squared. The line is taken
        # whole, with the newline and blanks before its name, and split in Python (see
        # extract_lines). The pattern does nothing at a line that the engine may skip: no
        # group (a group is marked at every line tried), blanks taken possessively (a
        # backtracking repeat enters what follows it as a branch).
        self._line_re = re.compile(rf"\n[ \t]*+(?:{names})(?=[{{ \t])[^\n]*")
        # Where the name ends, in a found line or in its head (the line up to its last space).
        self._name_re = re.compile(rf"(?:{names})(?=[{{ \t]|\Z)")
        # Label sets, keyed by the label text as the line writes it, braces included ("" for
        # none); and in front of them, a line's head (its name and label text, as written)
        # to its sample name and label set, so a line seen before is one lookup.
        self._labels: _Kept[Labels] = _Kept({"": Labels()}, _fit_idents)
        self._heads: _Kept[tuple[str, Labels]] = _Kept()
        # le text → bound, shared by every series of a histogram; capped (past the cap a
        # bound is parsed each time, so a flood of odd bounds costs speed, never memory).
        self._bounds: dict[str, float | None] = {}
        self._refused: tuple[str, str] = ("", "")  # the last label text that failed, and why

    @property
    def sample_names(self) -> frozenset[str]:
        """The canonical sample names this extractor reports."""
        return frozenset(self._canonical.values())

    def extract(self, text: str) -> Extraction:
        result = Extraction()
        self.extract_into(text, result)
        return result

    def extract_into(self, text: str, result: Extraction) -> None:
        """The wanted samples of ``text`` (whole lines, from the start of one) appended to
        ``result``."""
        self.begin_page()
        self.extract_lines("\n" + text, result)

    def begin_page(self) -> None:
        """A page begins: its caches grow only with texts from many pages (``_Kept``)."""
        self._labels.pages += 1
        self._heads.pages += 1

    def extract_lines(
        self, text: str, result: Extraction, start: int = 0, end: int | None = None
    ) -> None:
        """``extract_into`` for the lines of ``text[start:end]``, which starts with the newline
        before its first line: ``PageStream`` reads its pieces in place, never copying them.

        Nearly every line is ``name{labels} value`` with a head (``name{labels}``) seen
        before: split at its last space, the head is a cache hit and the value a plain number,
        and the line is read without a regular expression of its own. That is exact, not a
        guess: a cached head's label text parsed as a whole label set, so a line of that shape
        reads only one way. Anything else (a timestamp, an exemplar, CRLF, odd spacing, a new
        label text, a bad line) goes through the full grammar in ``_read``."""
        heads, head_of = self._heads.young, self._head_of
        grouped, fold = result.grouped, result.fold
        folded = fold.sample_name if fold is not None else None
        fold_labels, fold_values = (fold.labels, fold.values) if fold is not None else ([], [])
        take_labels, take_value = fold_labels.append, fold_values.append
        for line in self.find(text, start, end):
            # No space at all gives head "" and the whole line as the value, which is then
            # never a number.
            head, _, value = line.rpartition(" ")
            known = heads.get(head)
            if known is None:
                known = head_of(head)
                heads = self._heads.young  # a new head may have started a new generation
            sample: Sample | None = None
            # ASCII, printable and without '_': the characters Prometheus's parser allows a
            # value (float() would also take other scripts' digits, and "1_0"; see _value)
            if known is not None and value.isascii() and value.isprintable() and "_" not in value:
                try:  # not contextlib.suppress: a context manager per line costs more than this
                    number = float(value)
                except ValueError:  # "zero": _read says why
                    pass
                else:
                    sample_name, labels = known
                    if sample_name == folded:
                        take_labels(labels)
                        take_value(number)
                        continue
                    sample = _new_sample(Sample, (sample_name, labels, number, None))
            if sample is None:
                sample = self._read(line, result)
                if sample is None:
                    continue
                heads = self._heads.young  # reading it may have started a new generation
                if sample.name == folded:
                    take_labels(sample.labels)
                    take_value(sample.value)
                    continue
            group = grouped.get(sample.name)
            if group is None:
                grouped[sample.name] = [sample]
            else:
                group.append(sample)

    def find(self, text: str, start: int = 0, end: int | None = None) -> list[str]:
        """The wanted lines of ``text[start:end]`` (which starts with the newline before its
        first line), found and not read: each with the newline before it and any blanks
        before its name (``_bare``)."""
        found: list[str] = self._line_re.findall(text, start, len(text) if end is None else end)
        return found

    def _head_of(self, head: str) -> tuple[str, Labels] | None:
        """A line's sample name and label set from its head (the newline and blanks before
        it, then ``name{labels}`` or ``name``), kept for the next time; ``None`` when the head
        is not that shape or its label text is not a label set (the line may still be one:
        ``_read`` decides)."""
        known = self._heads.recall(head)
        if known is not None:
            return known
        bare = _bare(head)
        named = self._name_re.match(bare)
        if named is None:
            return None
        text = bare[named.end() :]
        if text and (text[0] != "{" or text[-1] != "}"):
            return None
        try:
            labels = self._labels_of(text)
        except ValueError:
            return None
        known = (self._canonical[named.group()], labels)
        if known[0] in self._buckets and labels.derived()[1] is None:
            return None  # not a bucket: _read skips each such line and says why
        if len(labels) <= _CACHED_LABELS:  # a head holds its label set alive
            self._heads.keep(head, known)
        return known

    def _read(self, line: str, result: Extraction) -> Sample | None:
        """One wanted line (as ``find`` gives it) by the full grammar; ``None`` (and counted)
        when it is not one."""
        line = _bare(line)
        named = self._name_re.match(line)
        assert named is not None  # the line was found by its name
        name, rest = named.group(), line[named.end() :]
        if _NATIVE_RE.match(rest) is not None:
            self._skip(result, line, "a native histogram, not a classic sample")
            return None
        match = _REST_RE.fullmatch(rest)
        if match is None:
            self._invalid(result, line, "not 'name{labels} value [timestamp]'")
            return None
        body, value, stamp = match.groups()
        try:
            labels = self._labels_of("" if body is None else "{" + body + "}")
            number = _value(value)
            timestamp = _value(stamp) if stamp else None
        except ValueError as exc:
            self._invalid(result, line, str(exc))
            return None
        sample_name = self._canonical[name]
        if timestamp is not None:
            if not math.isfinite(timestamp):  # Prometheus refuses it; no time at all
                self._skip(result, line, "a timestamp that is not a time")
                return None
            result.stamped = True
            timestamp = timestamp if result.openmetrics else timestamp / 1000
        if sample_name in self._buckets and labels.derived()[1] is None:
            self._skip(result, line, "a bucket whose le is not a number Go reads")
            return None
        return _new_sample(Sample, (sample_name, labels, number, timestamp))

    @staticmethod
    def _invalid(result: Extraction, line: str, why: str) -> None:
        result.invalid_lines += 1
        if result.first_error is None:
            result.first_error = f"{why}: {line[:120]!r}"

    @staticmethod
    def _skip(result: Extraction, line: str, why: str) -> None:
        result.skipped += 1
        if result.first_skipped is None:
            result.first_skipped = f"{why}: {line[:120]!r}"

    def _labels_of(self, text: str, split: bool = True) -> Labels:
        """The label set written ``text`` (``{…}``, or ``""`` for none), from the cache or
        parsed; a ValueError says what is wrong with it. ``split=False`` never takes the bucket
        shortcut (a bucket's own series is parsed whole)."""
        labels = self._labels.recall(text)
        if labels is not None:
            return labels
        bad, why = self._refused
        if text == bad:  # the same text just failed (a line's head, then the line): once
            raise ValueError(why)
        try:
            shortcut = self._bucket_labels(text) if split else None
            labels = shortcut or _parse_labels(text[1:-1])
            if len(labels) > MAX_LABELS:
                raise ValueError(f"more than {MAX_LABELS} labels ({len(labels)})")
        except ValueError as exc:
            self._refused = (text, str(exc))
            raise
        if len(labels) <= _CACHED_LABELS:
            self._labels.keep(text, labels)
        return labels

    @property
    def cached_entries(self) -> int:
        return self._labels.entries + self._heads.entries

    @property
    def cached_bytes(self) -> int:
        """Text held by the caches (both generations' keys; the label sets kept hold about as
        much again, the heads' entries little: they refer to those label sets)."""
        return self._labels.bytes + self._heads.bytes

    @property
    def rotations(self) -> int:
        """Generations the caches (label sets, heads) have dropped: churn, for tests and
        benchmarks."""
        return self._labels.rotations + self._heads.rotations

    def forget(self) -> None:
        """Drop every label set and head kept: the next page reads as the first after a
        start does (benchmarks time that)."""
        self._labels, self._heads = _Kept({"": Labels()}, _fit_idents), _Kept()
        self._bounds = {}

    def _bucket_labels(self, text: str) -> Labels | None:
        """A bucket's label set (``{…,le="0.5",…}``) from its series' (the text without the
        ``le`` pair): the series is parsed once for all its buckets, its ``_sum`` and
        ``_count`` and the gauges with the same labels, so a bucket seen for the first time
        costs a dict copy instead of a parse. ``le`` may be last (client_python, vLLM) or
        anywhere (Ray writes its labels sorted, OpenTelemetry's scope after ``le``). ``None``
        where the text is not that shape; the general parse then decides.

        The split is exact. Write the text ``P,le="v"S``, with no quote or backslash in
        ``v`` and ``S`` either ``}`` or ``,…``. When ``P}`` parses on its own and ``P`` ends
        with a quote, that quote closes a value in the whole text too (a value ends at the
        first unescaped quote, so the text is tokenised through ``P`` as ``P}`` is); then
        ``,le="v"`` is one pair, and ``S`` follows a closed value in the text as it does in
        ``PS``. So the text parses exactly when ``PS`` does, to ``PS``'s pairs and ``le``."""
        if len(text) > _SHORTCUT_CHARS:
            return None
        at = text.find(',le="')
        if at < 0 or text[at - 1] != '"':
            return None
        close = text.find('"', at + 5)
        if close < 0:
            return None
        bound, rest = text[at + 5 : close], text[close + 1 :]
        if "\\" in bound or (rest != "}" and rest[:1] != ","):
            return None
        # Parsed whole, never split again: '{a="1",le="1",le="1",…}' would otherwise recurse
        # once per repeat (quadratic, and past Python's recursion limit).
        head = text[:at]
        try:
            series = self._labels_of(head + "}", split=False)
            if rest != "}":
                series = self._labels_of(head + rest, split=False)
        except ValueError:
            return None
        if "le" in series:
            return None  # a duplicate: the general parse says so
        labels = Labels(series)
        labels["le"] = bound
        try:  # a histogram's bounds recur in every one of its series
            number = self._bounds[bound]
        except KeyError:
            number = self._bound(bound)
        labels.settle(series.derived()[0], number)
        return labels

    def _bound(self, text: str) -> float | None:
        bound = bound_or_none(text)
        if len(self._bounds) < _CACHE_LIMIT:
            self._bounds[text] = bound
        return bound


def first_of_each(samples: list[Sample]) -> tuple[list[Sample], Sample | None, int]:
    """The samples of one name with each series kept once, at its first sample (as a
    Prometheus scrape stores a repeated series once, and counts the repeat), the first
    repeat, and how many were dropped. A series is its label set with ``le`` read as a
    number where it is one, so ``le="1"`` and ``le="1.0"`` are one bucket, as Prometheus
    normalises them."""
    if len(samples) < 2:
        return samples, None, 0
    try:  # the usual group: as many series (le as a number) as samples, in C from the slots
        idents = list(map(_IDENT, map(_LABELS, samples)))
        if min(idents) >= _IDENTS.first:
            if len(set(idents)) == len(samples):
                return samples, None, 0
        else:  # numbered before the table started afresh: number again, compare whole below
            for labels in map(_LABELS, samples):
                if type(labels) is Labels and labels.ident < _IDENTS.first:
                    labels.settle(labels.series, labels.bound)
    except AttributeError:  # a label set not worked out yet, or a plain dict: read below
        pass
    seen: set[tuple[tuple[tuple[str, str], ...], object]] = set()
    kept: list[Sample] = []
    first: Sample | None = None
    for sample in samples:
        labels = sample.labels
        series, bound = labels.derived() if type(labels) is Labels else _derived(labels)
        key = (series, labels.get("le") if bound is None else bound)
        if key in seen:
            first = first or sample
            continue
        seen.add(key)
        kept.append(sample)
    return kept, first, len(samples) - len(kept)


def _derived(labels: dict[str, str]) -> tuple[tuple[tuple[str, str], ...], float | None]:
    return Labels(labels).derived()


# A Sample's labels; their worked-out series and bound (distinct pairs are distinct keys below:
# a bound that is not a number is None, and its le text decides only where pairs are equal)
_LABELS, _IDENT = itemgetter(1), attrgetter("ident")


# No real sample line comes near this (labels are short); a longer "line" is a hostile or
# broken page, refused without being scanned.
MAX_LINE = 1024 * 1024
# The text is handed on in pieces of at most this size, so no single step holds the event
# loop for long whatever the page is like.
PIECE = 64 * 1024
# A fold's bucket lines are summed once this many wait (a real page has a few hundred; a
# hostile one of 10 MiB of bucket lines would otherwise hold 200,000 until its end).
FOLD_BATCH = 4096


OPENMETRICS = "application/openmetrics-text"
TEXT = "text/plain"


class PageStream:
    """A page fed in pieces as it arrives: each complete line is extracted once, so memory
    holds only the wanted samples and the one incomplete line, never the page.

    It is read by the rules of the format the server says it sent (``declare``): OpenMetrics
    (timestamps in seconds; ``# EOF`` required, final, its newline optional) or the text format
    (timestamps in milliseconds; ``# EOF`` is a comment like any other, and what follows it is
    read). ``finish`` reads a last line without a newline where the transport vouches that the
    body is whole, and says what a whole page would: whether it was empty, whether it ended as
    its format ends a page, whether a line was over-long, and its first bytes (to tell a metrics
    page from an HTML error page)."""

    def __init__(
        self,
        extractor: Extractor,
        max_line: int = MAX_LINE,
        fold: Folding | None = None,
        content_type: str | None = None,
    ) -> None:
        self._extractor = extractor
        extractor.begin_page()
        self._max_line = max_line
        self._parts: list[str] = []
        self._pending = 0
        self._skipping = False
        self.result = Extraction(fold=fold)
        self._folded = 0  # lines the fold has summed (``taken``)
        self.head = ""
        self.tail = ""  # the page's last few characters (``ends_with_eof``)
        self.size = 0
        self.long_line = False
        self.last_char = ""
        self.eof = False  # OpenMetrics: "# EOF" was read; nothing may follow it
        self.after_eof = False
        # The transport knows the body is whole (a Content-Length or chunked framing it
        # checked): a last line without a newline is then the page's own, not a cut one.
        self.whole = True
        self.media_type: str | None = None
        self.declare(content_type)

    def declare(self, content_type: str | None, whole: bool = True) -> None:
        """What the server said it sent (its ``Content-Type``; ``None``: nothing, read as the
        text format), and whether the transport framed the body; before the first piece."""
        media = (content_type or "").partition(";")[0].strip().lower()
        self.media_type = media or None
        self.result.openmetrics = media == OPENMETRICS
        self.whole = whole

    @property
    def openmetrics(self) -> bool:
        return self.result.openmetrics

    @property
    def alike(self) -> Extractor | None:
        """What any other stream reading the same page would get from it: its extractor, when
        nothing of the reader's own is folded in as it reads (``None`` otherwise)."""
        return self._extractor if self.result.fold is None else None

    def feed(self, text: str) -> None:
        fold = self.result.fold
        for start in range(0, len(text), PIECE):
            self._piece(text[start : start + PIECE])
            if fold is not None and len(fold.values) >= FOLD_BATCH:
                self._folded += len(fold.values)
                fold.settle()

    @property
    def taken(self) -> int:
        """The wanted samples read so far, folded ones too (a page's size in what it costs to
        hold: ``http.get_page`` caps it)."""
        fold = self.result.fold
        held = sum(map(len, self.result.grouped.values()))
        return held + self._folded + (len(fold.values) if fold is not None else 0)

    def _piece(self, text: str) -> None:
        if not text:
            return
        self.size += len(text)
        if self.eof:  # past "# EOF": not read, and the page is not valid OpenMetrics
            self.after_eof = True
            return
        self.last_char = text[-1]
        self.tail = (self.tail + text[-16:])[-16:]
        if len(self.head) < 4096:
            self.head += text[: 4096 - len(self.head)]
        if self._skipping:  # inside an over-long line: drop it up to its end
            newline = text.find("\n")
            if newline < 0:
                return
            self._skipping, text = False, text[newline + 1 :]
        newline = text.rfind("\n")
        if newline < 0:
            self._parts.append(text)
            self._pending += len(text)
            if self._pending > self._max_line:
                self.long_line, self._skipping = True, True
                self._parts, self._pending = [], 0
            return
        # The complete lines are the pending parts and text up to its last newline. Only the
        # first of them is joined (with the newline before it, as extract_lines wants); the
        # others are read where they lie, between the first newline and the last, never
        # copied: a piece is 64 KiB and a page several.
        first = text.find("\n")
        line = "".join(["\n", *self._parts, text[: first + 1]])
        rest = text[newline + 1 :]
        self._parts, self._pending = ([rest], len(rest)) if rest else ([], 0)
        if len(line) - 2 > self._max_line:  # only the first line can exceed a piece
            self.long_line = True
            return
        if not self.openmetrics or (
            _eof_at(line) is None and _eof_at(text, first, newline + 1) is None
        ):
            self._extract(line)
            self._extract(text, first, newline + 1)
            return
        # OpenMetrics' last line: read up to it, and note whatever follows
        complete = line + text[first + 1 : newline + 1]
        end = _eof_at(complete)
        assert end is not None
        self.eof = True
        complete, after = complete[:end], complete[end:].split("\n", 1)[1]
        if after or rest:
            self.after_eof = True
        self._parts, self._pending = [], 0
        self._extract(complete)

    def _extract(self, text: str, start: int = 0, end: int | None = None) -> None:
        """The wanted lines of ``text[start:end]`` into the result, until a line was found
        malformed: the page is then refused whatever follows (``sources.page.page_of``), so
        the rest is not read, only measured (its size, its ending). Read on, a page of 3,300
        lines of 400 labels each, every one refused, cost 1.4 s of CPU a scrape."""
        if not self.result.invalid_lines:
            self._extractor.extract_lines(text, self.result, start, end)

    def finish(self) -> None:
        """The page has all arrived: a text-format page's last line without a newline is read
        where the transport vouches that the body is whole. The format ends every line with a
        newline, and a cut line's value may be a prefix of the real one (``0.`` of ``0.97``);
        but Prometheus and client_python read such a page whole, and a body that HTTP framed
        (Content-Length, chunked) and that arrived whole was not cut in transit. An unframed
        body (read until the connection closed) may have been: its last line is not read, and
        the page is refused as cut short (``ended``)."""
        if self._parts and self.whole and not self.openmetrics and not self.long_line:
            last = "".join(["\n", *self._parts])
            self._parts, self._pending = [], 0
            self._extract(last)
            self.last_char = "\n"  # read as if it had its newline

    @property
    def ended_with_newline(self) -> bool:
        return self.last_char == "\n"

    @property
    def ended(self) -> bool:
        """The page ended as a whole page of its format does: a text page with a newline (or
        a last line ``finish`` read), an OpenMetrics page with its final ``# EOF`` (whose
        newline the format makes optional)."""
        if not self.openmetrics:
            return self.ended_with_newline
        return self.eof or "".join(self._parts).rstrip("\r") == EOF_LINE

    @property
    def ends_with_eof(self) -> bool:
        """The page's last line is OpenMetrics' ``# EOF`` (read as a comment in a text page)."""
        return self.tail.rstrip("\r\n").endswith("\n" + EOF_LINE) or self.tail.strip() == EOF_LINE


EOF_LINE = "# EOF"


def _eof_at(text: str, begin: int = 0, end: int | None = None) -> int | None:
    """Where the ``# EOF`` line starts in ``text[begin:end]`` (whole lines, the first after a
    newline or at the start of ``text``), if it has one.

    Every page passes through here, so the search runs on its rarest letter: ``F`` is found by
    ``memchr`` (~1 µs for 88 KB, against ~70 µs for a search of the whole line) and each one
    checked in place. A page with more than ``F_CHECKED`` of them is searched line-wise from
    there: a hostile page costs one more linear pass, never a Python step per character."""
    end = len(text) if end is None else end
    at = begin - 1
    for _ in range(F_CHECKED):
        at = text.find("F", at + 1, end)
        if at < 0:
            return None
        start = at - len(EOF_LINE) + 1
        if start >= begin and _is_eof_line(text, start):
            return start
    return _eof_search(text, max(begin, at - len(EOF_LINE) + 1), end)


F_CHECKED = 64


def _is_eof_line(text: str, start: int) -> bool:
    """``# EOF`` stands at ``start``, alone on its line, whose newline ``text`` holds."""
    if start < 0 or not text.startswith(EOF_LINE, start):
        return False
    if start > 0 and text[start - 1] != "\n":
        return False
    tail = text[start + len(EOF_LINE) : start + len(EOF_LINE) + 2]
    return tail[:1] == "\n" or tail == "\r\n"


def _eof_search(text: str, start: int, end: int) -> int | None:
    """The ``# EOF`` line at or after ``start`` (before ``end``), by a search of the whole
    line."""
    if _is_eof_line(text, start):
        return start
    at = start
    while (at := text.find("\n" + EOF_LINE, at, end)) >= 0:
        if _is_eof_line(text, at + 1):
            return at + 1
        at += 1
    return None


def _bare(found: str) -> str:
    """A line as ``Extractor.find`` gives it, from its name on."""
    return found[1:].lstrip(" \t")


def _trie_pattern(words: Iterable[str]) -> str:
    """An alternation with shared prefixes factored out (``vllm[:_](?:kv…|num…)``): the regex
    engine then never re-reads a prefix once per alternative. Branches that go on alike are
    one branch led by a character class (``vllm:`` and ``vllm_`` names, spelled both ways):
    the engine tries a class in place, where it enters each branch it may take."""
    trie: dict[str, dict[str, Any]] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict[str, dict[str, Any]]) -> str:
        leads: dict[str, list[str]] = {}  # what follows → the characters it follows
        for ch, child in sorted(node.items()):
            if ch:
                leads.setdefault(build(child), []).append(re.escape(ch))
        branches = [
            (chars[0] if len(chars) == 1 else "[" + "".join(chars) + "]") + rest
            for rest, chars in leads.items()
        ]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(trie)


# The label text nearly every exporter writes: name="value" pairs, no spaces, no escapes, at
# most one trailing comma. No value then holds a quote, so splitting at quotes alternates
# names and values: several times faster than the general pattern (this is the cost of a
# label set seen for the first time).
_SIMPLE_BODY_RE = re.compile(
    r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*",)*[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*",?'
)


def _parse_labels(body: str) -> Labels:
    if _SIMPLE_BODY_RE.fullmatch(body) is not None:
        parts = body.split('"')  # name=, value, ,name=, value, … [,]
        simple = Labels(zip(map(str.strip, parts[0:-1:2], repeat(",=")), parts[1::2], strict=True))
        if len(simple) == len(parts) // 2:
            return simple
        # a name given twice: the general path below says which
    if _BODY_OK_RE.fullmatch(body) is None:
        raise ValueError("malformed label set")
    labels: dict[str, str] = {}
    for name, value in _PAIR_RE.findall(body):
        if name in labels:
            raise ValueError(f"duplicate label {name!r}")
        labels[name] = _ESCAPE_RE.sub(_unescape, value) if "\\" in value else value
    return Labels(labels)


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPE[match.group(0)]


# A number as Go's strconv.ParseFloat reads it, which is what Prometheus compares ``le``
# bounds with (histogram_quantile, and its scrape's normalisation of ``le``): decimal, or
# hexadecimal with a binary exponent, or Inf/Infinity/NaN in any case, each with an optional
# sign, and ``_`` only between digits ("1_0" is 10; atof.go: readFloat, underscoreOK, and
# atof_test.go's "1_23.50_0_0e+1_2"). Python's float() also takes blanks around the number and
# digits of other scripts; Go refuses those, and a bound Go cannot read is no bound at all,
# never another one. Every repeat is possessive: a text that fails is refused in linear time.
_GO_DECIMAL = re.compile(r"[+-]?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?")
_GO_HEX = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F]++(?:\.[0-9a-fA-F]*+)?|\.[0-9a-fA-F]++)[pP][+-]?[0-9]++"
)
_GO_SPECIAL = frozenset(
    ("nan", *(sign + w for sign in ("", "+", "-") for w in ("inf", "infinity")))
)


def _value(text: str) -> float:
    """A sample's value or timestamp: ``float`` on what Prometheus's parser also takes
    (ASCII, no ``_``: its lexer refuses "1_2"; the line's grammar already keeps blanks out)."""
    if not text.isascii() or "_" in text:
        raise ValueError(f"{text[:40]!r} is not a number")
    return float(text)


def go_float(text: str) -> float:
    """``text`` as Go's ``strconv.ParseFloat(text, 64)`` reads it; a ValueError where Go
    refuses it (any case of Inf, Infinity and NaN; a sign on Inf only)."""
    if "_" in text:
        if not _underscores_ok(text):
            raise ValueError(f"{text[:40]!r} is not a number")
        text = text.replace("_", "")
    if text.lower() in _GO_SPECIAL:
        return float(text)
    try:
        if _GO_DECIMAL.fullmatch(text) is not None:
            number = float(text)
        elif _GO_HEX.fullmatch(text) is not None:
            number = float.fromhex(text)
        else:
            raise ValueError(f"{text[:40]!r} is not a number")
    except OverflowError:  # fromhex raises where float() gives inf
        number = math.inf
    if math.isinf(number):  # Go: ±Inf and ErrRange, an error Prometheus does not read past
        raise ValueError(f"{text[:40]!r} is out of range")
    return number


def _underscores_ok(text: str) -> bool:
    """Go's underscoreOK: each ``_`` between two digits (a base prefix counts as one)."""
    i = 1 if text[:1] in ("+", "-") else 0
    hexa = text[i : i + 2].lower() == "0x"
    saw = "0" if hexa else "^"
    for char in text[i + 2 if hexa else i :]:
        if "0" <= char <= "9" or (hexa and char.lower() in "abcdef"):
            saw = "0"
        elif char == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def parse_le(text: str) -> float:
    """A histogram bound as a number, so ``"1"`` and ``"1.0"`` name the same bucket. ``NaN``
    bounds nothing (and is never equal to itself), nor does a text Go cannot read as a number
    (``go_float``): a ValueError."""
    bound = go_float(text)
    if bound != bound:
        raise ValueError(f"le={text!r} is not a bound")
    return bound


def bound_or_none(text: str) -> float | None:
    """``parse_le``, with ``None`` for a text that bounds nothing (the sample is then no
    bucket)."""
    try:
        return parse_le(text)
    except ValueError:
        return None
