"""The targeted extractor agrees with prometheus_client.parser on every wanted sample."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from controller import exposition
from controller.engines import VLLM
from controller.errors import FetchError
from controller.exposition import (
    _CACHE_BYTES,
    _CACHE_GROWTH,
    _CACHE_LIMIT,
    OPENMETRICS,
    Extractor,
    Labels,
    PageStream,
    Sample,
    _Kept,
    bound_or_none,
)
from controller.model import PodError, Reason
from controller.sources.page import EPP_EXTRACTOR, POD_EXTRACTOR, Page, page_of, pool_tokens
from tests.support.pages import fixture_names, fixture_text

Row = tuple[str, tuple[tuple[str, str], ...], float | str, float | None]


def _row(name: str, labels: dict[str, str], value: float, timestamp: float | None) -> Row:
    number: float | str = "NaN" if math.isnan(value) else float(value)
    return name, tuple(sorted(labels.items())), number, timestamp


def reference(text: str, wanted: Iterable[str]) -> list[Row]:
    """The wanted samples as prometheus_client reads them, in the order an Extraction gives
    them: by sample name in order of first appearance, each name's samples in page order."""
    names = set(wanted)
    rows = [
        _row(s.name, s.labels, s.value, None if s.timestamp is None else float(s.timestamp))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in names and not _unbounded(s.name, s.labels)
    ]
    first = {row[0]: index for index, row in reversed(list(enumerate(rows)))}
    return sorted(rows, key=lambda row: first[row[0]])


def _unbounded(name: str, labels: dict[str, str]) -> bool:
    """A bucket whose ``le`` bounds nothing is skipped by our reader (and named), not read as
    a sample: it would be no bucket, or another one."""
    return name.endswith("_bucket") and bound_or_none(labels.get("le", "")) is None


def ours(samples: list[Sample]) -> list[Row]:
    return [_row(s.name, s.labels, s.value, s.timestamp) for s in samples]


def wanted_names(extractor: Extractor) -> set[str]:
    return set(extractor.sample_names)


@pytest.mark.parametrize("name", fixture_names())
@pytest.mark.parametrize("extractor", [POD_EXTRACTOR, EPP_EXTRACTOR], ids=["vllm", "epp"])
def test_every_shared_fixture_matches_the_reference(name: str, extractor: Extractor) -> None:
    text = fixture_text(name)
    found = extractor.extract(text)
    assert found.invalid_lines == 0
    assert ours(found.samples) == reference(text, wanted_names(extractor))


def test_fixtures_hold_the_families_we_rely_on() -> None:
    vllm = POD_EXTRACTOR.extract(fixture_text("vllm-v0-aibrix-docs.prom")).by_name()
    assert set(vllm) == {
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:cache_config_info",
    }
    # what the pod holds: num_gpu_blocks × block_size of its one (V0) engine
    assert pool_tokens(vllm, VLLM.pools) == 81767 * 16
    epp = EPP_EXTRACTOR.extract(fixture_text("epp-llmd-router-request-duration.prom")).by_name()
    assert len(epp["llm_d_epp_request_duration_seconds_bucket"]) > 50


KV = Extractor(gauges=["vllm:kv_cache_usage_perc"], histograms=["vllm:e2e_request_latency_seconds"])


@pytest.mark.parametrize(
    ("line", "labels", "value", "timestamp"),
    [
        ('vllm:kv_cache_usage_perc{engine="0"} 0.5', {"engine": "0"}, 0.5, None),
        (
            'vllm:kv_cache_usage_perc{engine="0", model_name="m"} 0.5',
            {"engine": "0", "model_name": "m"},
            0.5,
            None,
        ),
        ('vllm:kv_cache_usage_perc{a="x\\"y\\\\z\\nw"} 1', {"a": 'x"y\\z\nw'}, 1.0, None),
        ('vllm:kv_cache_usage_perc{a="} {,"} 2', {"a": "} {,"}, 2.0, None),
        ("vllm:kv_cache_usage_perc 0.25 1712345678901", {}, 0.25, 1712345678.901),
        ("vllm:kv_cache_usage_perc{} +Inf", {}, math.inf, None),
        ("vllm:kv_cache_usage_perc -Inf", {}, -math.inf, None),
        ("vllm:kv_cache_usage_perc\t3e-1", {}, 0.3, None),
        ('vllm_kv_cache_usage_perc{engine="1"} 0.7', {"engine": "1"}, 0.7, None),
        ('vllm:kv_cache_usage_perc{engine="0",} 0.5', {"engine": "0"}, 0.5, None),
    ],
)
def test_text_format_details(
    line: str, labels: dict[str, str], value: float, timestamp: float | None
) -> None:
    (sample,) = KV.extract(line + "\n").samples
    assert sample.name == "vllm:kv_cache_usage_perc"
    assert sample.labels == labels
    assert sample.value == value
    assert sample.timestamp == timestamp


def test_nan_is_read_as_nan() -> None:
    (sample,) = KV.extract("vllm:kv_cache_usage_perc NaN\n").samples
    assert math.isnan(sample.value)


def test_crlf_missing_help_type_and_eof() -> None:
    page = 'vllm:kv_cache_usage_perc{engine="0"} 0.1\r\nother 1\r\nvllm:kv_cache_usage_perc{engine="1"} 0.2\r\n# EOF\r\n'
    assert [s.value for s in KV.extract(page).samples] == [0.1, 0.2]


def test_name_prefixes_are_not_confused() -> None:
    page = "vllm:kv_cache_usage_perc_total 5\nvllm:kv_cache_usage_percent 6\nvllm:kv_cache_usage_perc 0.4\n"
    assert [s.value for s in KV.extract(page).samples] == [0.4]


def test_openmetrics_exemplar_is_ignored() -> None:
    page = (
        'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 3 # {trace_id="abc"} 0.5 1712345678.1\n'
    )
    (sample,) = KV.extract(page).samples
    assert sample.value == 3 and sample.labels == {"le": "1.0"}


@pytest.mark.parametrize(
    "line",
    [
        'vllm:kv_cache_usage_perc{engine="0" 0.5',
        'vllm:kv_cache_usage_perc{engine="0"}',
        "vllm:kv_cache_usage_perc 0.5 12 13",
        "vllm:kv_cache_usage_perc zero",
        "vllm:kv_cache_usage_perc 1_000",
        "vllm:kv_cache_usage_perc{engine=0} 0.5",
        'vllm:kv_cache_usage_perc{engine="0",engine="1"} 0.5',
    ],
)
def test_malformed_wanted_lines_are_counted_not_used(line: str) -> None:
    found = KV.extract(line + "\nvllm:kv_cache_usage_perc 0.3\n")
    assert found.invalid_lines == 1
    assert found.first_error is not None
    assert [s.value for s in found.samples] == [0.3]


# ---- differential property -------------------------------------------------------------------

label_names = st.sampled_from(["engine", "model_name", "le", "lora", "pod", "x_1"])
label_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
    | st.sampled_from(['"', "\\", "\n", "{", "}", ",", "="]),
    max_size=12,
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(-(10**12), 10**12),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float | int) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def sample_lines(draw: st.DrawFn, name: str) -> str:
    labels = draw(st.dictionaries(label_names, label_values, max_size=4))
    sep = draw(st.sampled_from([",", ", ", " , "]))
    body = sep.join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    braces: bool = draw(st.booleans())
    head = f"{name}{{{body}}}" if labels or braces else name
    gap = draw(st.sampled_from([" ", "\t", "  "]))
    line = f"{head}{gap}{_number(draw(values))}"
    if draw(st.booleans()):
        line += f" {draw(st.integers(0, 2**52))}"
    return line


WANTED_FAMILIES = [
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
]
NOISE = [
    "vllm:kv_cache_usage_perc_x",
    "vllm:prompt_tokens_total",
    "process_cpu_seconds_total",
    "up",
]


@st.composite
def pages(draw: st.DrawFn) -> str:
    blocks: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            family, kind = draw(st.sampled_from(WANTED_FAMILIES))
            names = (
                [family] if kind == "gauge" else [family + s for s in ("_bucket", "_sum", "_count")]
            )
        else:
            family, kind = draw(st.sampled_from(NOISE)), "untyped"
            names = [family]
        if draw(st.booleans()):
            blocks.append(f"# HELP {family} Some help text.")
        if draw(st.booleans()):
            blocks.append(f"# TYPE {family} {kind}")
        for _ in range(draw(st.integers(0, 4))):
            blocks.append(draw(sample_lines(draw(st.sampled_from(names)))))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    tail = draw(st.sampled_from(["", "# EOF" + newline]))
    return newline.join(blocks) + newline + tail


@settings(max_examples=400, deadline=None, derandomize=True)
@given(page=pages())
def test_generated_pages_match_the_reference(page: str) -> None:
    extractor = POD_EXTRACTOR
    found = extractor.extract(page)
    assert found.invalid_lines == 0
    assert ours(found.samples) == reference(page, wanted_names(extractor))


NAME_CHARS = "ab:_"
short_names = st.text(alphabet=NAME_CHARS, min_size=0, max_size=5).map(lambda rest: "a" + rest)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    wanted=st.sets(short_names, min_size=1, max_size=8),
    others=st.lists(short_names, max_size=12),
    indents=st.lists(st.sampled_from(["", " ", "\t", " \t "]), min_size=1, max_size=4),
)
def test_exactly_the_wanted_names_are_read_whatever_they_share(
    wanted: set[str], others: list[str], indents: list[str]
) -> None:
    """The line pattern folds what names share (prefixes; branches that go on alike, as
    ``vllm:`` and ``vllm_`` spellings do, into one led by a character class): names that
    share a start, an end or both, their prefixes, names one character apart and longer ones
    are each read exactly when wanted, indented or not."""
    crossed = {w[:i] + c + w[i + 1 :] for w in wanted for i in range(len(w)) for c in NAME_CHARS}
    prefixes = {w[:i] for w in wanted for i in range(1, len(w))}
    candidates = sorted({*wanted, *others, *crossed, *prefixes, *(w + "b" for w in wanted)})
    lines = [f"{indents[i % len(indents)]}{name} {i}" for i, name in enumerate(candidates)]
    found = Extractor(gauges=sorted(wanted)).extract("\n".join(lines) + "\n")
    assert found.invalid_lines == 0
    read = {(s.name, s.value) for s in found.samples}
    # a wanted name's other spelling (a: served as a_) reads as it, unless wanted itself
    spelled = {w.replace(":", "_"): w for w in sorted(wanted)} | {w: w for w in wanted}
    assert read == {(spelled[n], float(i)) for i, n in enumerate(candidates) if n in spelled}


def test_wanted_name_inside_comments_or_label_values_is_not_a_sample() -> None:
    page = (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'other{note="vllm:kv_cache_usage_perc 0.9"} 1\n'
        "   vllm:kv_cache_usage_perc 0.6\n"
    )
    found = KV.extract(page)
    assert [s.value for s in found.samples] == [0.6]
    assert found.invalid_lines == 0
    assert ours(found.samples) == reference(page, KV.sample_names)


def test_label_cache_does_not_leak_between_different_bodies() -> None:
    page = 'vllm:kv_cache_usage_perc{engine="0"} 0.1\nvllm:kv_cache_usage_perc{engine="1"} 0.2\n'
    first = KV.extract(page).samples
    again = KV.extract(page).samples
    assert (
        [s.labels for s in first] == [s.labels for s in again] == [{"engine": "0"}, {"engine": "1"}]
    )


def test_a_hostile_long_line_costs_linear_time_in_its_size() -> None:
    """One line that repeats a wanted name over and over (the extractor used to scan back to
    the line start from every hit: 1 MB took 1.6 s, 10 MB minutes). Quadrupling the size must
    cost about four times as much, not sixteen: measured in this process's CPU time, the best
    of three, so other load on the machine barely matters."""
    import time

    from controller.sources.page import POD_EXTRACTOR

    def cost(size: int) -> float:
        line = "x " + 'vllm:kv_cache_usage_perc{a="b"} 1 ' * (size // 34) + "\n"
        best = float("inf")
        for _ in range(3):
            began = time.process_time()
            found = POD_EXTRACTOR.extract(line)
            best = min(best, time.process_time() - began)
        assert found.samples == []  # none of it is a sample: it is all one line
        return max(best, 1e-4)

    small, large = cost(500_000), cost(2_000_000)
    assert large / small < 8, (small, large)


def test_the_label_cache_keeps_what_is_in_use_when_a_flood_of_new_series_fills_it() -> None:
    from controller import exposition

    extractor = exposition.Extractor(gauges=["g"])
    working = "".join(f'g{{pod="p{i}"}} 1\n' for i in range(100))
    extractor.extract(working)
    first = extractor.extract(working).samples[0].labels
    flood = "".join(f'g{{x="{i}"}} 1\n' for i in range(exposition._CACHE_LIMIT + 10))
    extractor.extract(flood)  # fills the young generation: the working set moves to the old
    again = extractor.extract(working).samples[0].labels
    assert again is first  # reused from the cache, not parsed again


def test_label_sets_seen_again_after_a_new_generation_starts_on_the_same_page_move_back() -> None:
    from controller import exposition

    extractor = exposition.Extractor(gauges=["g"])
    working = "".join(f'g{{pod="p{i}"}} 1\n' for i in range(100))
    first = extractor.extract(working).samples[0].labels
    # one page: new series start a new generation part way, then the working set comes again
    flood = "".join(f'g{{x="a{i}"}} 1\n' for i in range(exposition._CACHE_LIMIT - 50))
    extractor.extract(flood + working)
    # a second flood starts another generation: what the last page used must survive it
    extractor.extract("".join(f'g{{x="b{i}"}} 1\n' for i in range(exposition._CACHE_LIMIT)))
    assert extractor.extract(working).samples[0].labels is first


def test_a_kept_text_survives_one_rotation_and_moves_back_when_used() -> None:
    from controller.exposition import _CACHE_LIMIT, _CACHED_CHARS, _Kept

    kept: _Kept[int] = _Kept()
    kept.keep("working", 1)
    for i in range(_CACHE_LIMIT):  # fills the young generation: "working" goes to the old
        kept.keep(f"new{i}", i)
    assert kept.rotations == 1 and kept.recall("working") == 1  # found, and moved back
    for i in range(_CACHE_LIMIT):  # another rotation drops the old generation
        kept.keep(f"newer{i}", i)
    assert kept.recall("working") == 1 and kept.recall("new0") is None
    kept.keep("x" * (_CACHED_CHARS + 1), 2)  # too long to keep: worked out each time
    assert kept.recall("x" * (_CACHED_CHARS + 1)) is None


def test_a_flood_of_new_series_holds_both_caches_to_two_generations() -> None:
    """Label sets and line heads are each kept in two bounded generations, in entries and
    in bytes, however many new series a page brings (here three generations' worth, each
    line a new head and a new label text)."""
    from controller import exposition

    extractor = exposition.Extractor(gauges=["g", "h"])
    flood = "".join(
        f'{name}{{x="{i:0200}"}} 1\n' for i in range(3 * exposition._CACHE_LIMIT) for name in "gh"
    )
    found = extractor.extract(flood)
    assert len(found.samples) == 6 * exposition._CACHE_LIMIT and found.invalid_lines == 0
    assert extractor.cached_entries <= 4 * exposition._CACHE_LIMIT + 1
    assert extractor.cached_bytes <= 4 * exposition._CACHE_BYTES


def _cycle(kept: _Kept[Labels], texts: list[str], page: int = 100) -> int:
    """One pass over ``texts`` as the extractor reads a fleet's pages of ``page`` lines:
    recalled, or worked out (a label set, as the collector sees one) and kept. Returns the
    misses."""
    misses = 0
    for i, text in enumerate(texts):
        if i % page == 0:
            kept.pages += 1  # as ``Extractor.begin_page``
        if kept.recall(text) is None:
            kept.keep(text, Labels(t=text))
            misses += 1
    return misses


def test_a_working_set_larger_than_a_generation_grows_the_cache_until_it_is_all_hits() -> None:
    """A Ray node's page names its node, workers and replicas, so a fleet's wanted lines
    outnumber a generation; read in a cycle, each was dropped before it came round and none
    was ever a hit (200 nodes: 16 ms a page, 1 for the floor). What comes back after a
    rotation dropped it grows the generation, until a pass is read from the cache alone."""
    texts = [f"line{i}" for i in range(3 * _CACHE_LIMIT)]
    limits: list[int] = []
    kept: _Kept[Labels] = _Kept(grown=limits.append)
    misses = [_cycle(kept, texts) for _ in range(5)]
    assert misses[0] == len(texts) and misses[-1] == 0, misses
    assert _CACHE_LIMIT < kept.limit <= 4 * _CACHE_LIMIT and limits[-1] == kept.limit
    assert kept.bytes == sum(map(len, kept.young)) + sum(map(len, kept.old))
    rotations = kept.rotations
    assert _cycle(kept, texts) == 0 and kept.rotations == rotations  # read, nothing dropped


def test_the_collector_keeps_a_grown_cache_for_good_once_it_stops_dropping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Grown to a fleet, the caches hold hundreds of thousands of label sets, and every full
    pass of the collector walked them (over 200 Ray nodes, ~5% of a node page's cost). Once a
    tick goes by without a rotation they are frozen, as start-up's objects are: not while
    they still churn, and once per growth."""
    import gc

    from controller.app import CollectorSettler

    passes: list[tuple[bool, bool]] = []  # each pass: rotated, grew
    freezes: list[int] = []  # the pass each freeze came after
    real = gc.freeze

    def freeze() -> None:
        freezes.append(len(passes))
        real()

    monkeypatch.setattr(gc, "freeze", freeze)
    settle = CollectorSettler()
    texts = [f"line{i}" for i in range(3 * _CACHE_LIMIT)]
    kept: _Kept[Labels] = _Kept()
    try:
        for _ in range(8):
            rotations, limit = kept.rotations, kept.limit
            _cycle(kept, texts)
            settle()
            passes.append((kept.rotations > rotations, kept.limit > limit))
        assert len(freezes) == 1, (freezes, passes)  # once
        settled = freezes[0]
        assert any(grew for _, grew in passes[:settled])  # it grew first
        assert not passes[settled][0] and passes[settled - 1][0]  # the first still pass
        assert gc.get_freeze_count() >= len(texts)  # every label set kept, frozen
    finally:
        gc.unfreeze()


def test_one_page_repeating_its_own_flood_never_grows_the_cache() -> None:
    """A page that serves the same flood of series every scrape is a cycle too, but one
    page (the default body cap holds ~280,000 such lines): growth asks for texts from many
    pages, so it rotates at the first size however often it comes back."""
    texts = [f"flood{i}" for i in range(3 * _CACHE_LIMIT)]
    kept: _Kept[Labels] = _Kept()
    for _ in range(6):
        _cycle(kept, texts, page=len(texts))
    assert kept.rotations >= 15 and (kept.limit, kept.budget) == (_CACHE_LIMIT, _CACHE_BYTES)


def test_a_flood_of_new_texts_never_grows_the_cache() -> None:
    """Texts that never come back (a page inventing series) rotate the generations at their
    first size, however many: only what a rotation dropped and is asked for again grows it."""
    kept: _Kept[Labels] = _Kept()
    for n in range(8):
        assert _cycle(kept, [f"new{n}-{i}" for i in range(_CACHE_LIMIT)]) == _CACHE_LIMIT
    assert kept.rotations >= 7 and (kept.limit, kept.budget) == (_CACHE_LIMIT, _CACHE_BYTES)


def test_a_working_set_past_the_growth_cap_churns_within_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Growth stops at ``_CACHE_GROWTH`` times the first size: a set larger still is read at
    the parse's cost, rotating the generations, never held whole."""
    from controller import exposition

    monkeypatch.setattr(exposition, "_CACHE_LIMIT", 64)
    texts = [f"line{i}" for i in range(3 * 64 * _CACHE_GROWTH)]  # past two generations
    kept: _Kept[Labels] = _Kept()
    for _ in range(12):
        _cycle(kept, texts)
        assert kept.limit <= 64 * _CACHE_GROWTH and kept.entries <= 2 * 64 * _CACHE_GROWTH
    assert kept.limit == 64 * _CACHE_GROWTH and _cycle(kept, texts) == len(texts)


# ---- the shortcuts: a cached label text split at the last space, a bucket from its series ----

HIST = "vllm:e2e_request_latency_seconds"
LABEL_PIECES = st.sampled_from(
    [
        *('a="1"', 'le="2"', 'le="+Inf"', ",", ", ", " ", '"', "\\", '\\"', "le=", "}", "{"),
        *('b="x,le=\\"3\\""', 'le="NaN"', 'c=""', "\t", 'le="1"}', 'le="1_0"', 'le=" 1"'),
    ]
)
VALUES = st.sampled_from(
    [
        *("1", "1_0", "NaN", "+Inf", "5\r", "5\r\r", "5\t", "5 \t", "5\u2003", "zero", "1e3"),
        *("5 1712345678901", '5 # {x="y"} 1', "\t5", "5\x0c", "", " ", "5 1 2", "5\r\t", "-0"),
    ]
)


@st.composite
def odd_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from([HIST + "_bucket", HIST + "_count", "vllm:kv_cache_usage_perc"]))
    body = "".join(draw(st.lists(LABEL_PIECES, max_size=5)))
    head = draw(st.sampled_from(["", " "])) + "{" + body + "}" if draw(st.booleans()) else ""
    return name + head + draw(st.sampled_from(["", " ", "  ", "\t", " \t"])) + draw(VALUES)


def _read(extractor: Extractor, page: str) -> tuple[int, list[Row]]:
    found = extractor.extract(page)
    return found.invalid_lines, ours(found.samples)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(line=odd_lines())
def test_any_line_reads_the_same_first_time_and_from_the_cache_and_as_the_reference(
    line: str,
) -> None:
    """First sight parses the label text (a bucket through its series), later sights take it
    from the cache after splitting the line at its last space; neither may read a line
    differently, and whatever is read agrees with prometheus_client."""
    page = line + "\n"
    extractor = Extractor(gauges=["vllm:kv_cache_usage_perc"], histograms=[HIST])
    first = _read(extractor, page)
    assert _read(extractor, page) == first
    assert _read(extractor, page + page) == (2 * first[0], 2 * first[1])
    invalid, rows = first
    assert invalid + len(rows) <= 1  # "name1" is another metric, not a wanted line
    if rows and "#" not in line:  # exemplars are OpenMetrics; the text parser misreads them
        try:
            expected = reference(page, extractor.sample_names)
        except ValueError:  # pairs with blanks alone between them: Prometheus reads them
            return
        assert rows == expected


@pytest.mark.parametrize(
    "line",
    [
        f'{HIST}_bucket{{a="1",,le="2"}} 1',  # the series alone would pass
        f'{HIST}_bucket{{,le="2"}} 1',
        f'{HIST}_bucket{{ ,le="2"}} 1',
        f'{HIST}_bucket{{le="1",le="2"}} 1',  # a duplicate le
        f'{HIST}_bucket{{a="x,le="1"}} 1',
        f'{HIST}_bucket{{a="1",le="2"}} 5\r\r',  # float() would take it, the grammar does not
        f'{HIST}_bucket{{a="1",le="2"}} 5\r\t',
        f'{HIST}_bucket{{a="1",le="2"}} 1_0',
    ],
)
def test_lines_the_shortcuts_must_not_take_are_refused_cold_and_warm(line: str) -> None:
    extractor = Extractor(histograms=[HIST])
    extractor.extract(f'{HIST}_bucket{{a="1",le="2"}} 1\n')  # the label texts, cached
    for _ in range(2):
        found = extractor.extract(line + "\n")
        assert (found.invalid_lines, found.samples) == (1, [])


def test_a_bucket_label_set_comes_from_its_series_and_carries_its_bound() -> None:
    extractor = Extractor(gauges=["vllm:num_requests_running"], histograms=[HIST])
    page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        f'{HIST}_bucket{{engine="0",model_name="m",le="0.5"}} 3\n'
        f'{HIST}_bucket{{engine="0",model_name="m",le="+Inf"}} 4\n'
        f'{HIST}_bucket{{engine="0",model_name="m",le="oops"}} 5\n'
        f'{HIST}_count{{engine="0",model_name="m"}} 4\n'
        'other{a="} 5"} 1\n'
        'vllm:num_requests_running{a="} 5"} 7\n'  # a brace and a space inside a value
    )
    extraction = extractor.extract(page)
    grouped = extraction.grouped
    (gauge, odd) = grouped["vllm:num_requests_running"]
    half, inf = grouped[HIST + "_bucket"]
    (count,) = grouped[HIST + "_count"]
    assert gauge.labels is count.labels  # one label set, parsed once
    assert isinstance(half.labels, Labels) and isinstance(inf.labels, Labels)
    assert half.labels == {"engine": "0", "model_name": "m", "le": "0.5"}
    assert half.labels.derived() == ((("engine", "0"), ("model_name", "m")), 0.5)
    assert inf.labels.derived()[1] == math.inf
    assert extraction.skipped == 1  # le="oops" bounds nothing: skipped, not another bucket
    assert (odd.labels, odd.value) == ({"a": "} 5"}, 7.0)
    assert ours(list(extractor.extract(page).samples)) == reference(page, extractor.sample_names)


def test_a_bucket_with_le_between_its_labels_comes_from_its_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray writes its labels sorted, ``le`` among them and OpenTelemetry's scope after it: a
    bucket seen for the first time still costs a dict copy, not a parse. Counted, not timed:
    the page's two series (and the prefix that proves each split) are parsed, no bucket is;
    what is read agrees with the reference, escapes and a quoted ',le=' included."""
    from controller import exposition

    parses: list[str] = []
    real = exposition._parse_labels

    def counting(body: str) -> Labels:
        parses.append(body)
        return real(body)

    monkeypatch.setattr(exposition, "_parse_labels", counting)
    series = ['ReplicaId="r1",WorkerId="w"', 'ReplicaId="r\\\\2",WorkerId="x\\",le=\\"9\\""']
    page = "".join(
        f'{HIST}_bucket{{{labels},le="{bound}",otel_scope_name="ray"}} {n}\n'
        for labels in series
        for n, bound in enumerate(("0.3", "1.0", "+Inf"))
    ) + "".join(f'{HIST}_count{{{labels},otel_scope_name="ray"}} 2\n' for labels in series)
    extractor = Extractor(histograms=[HIST])
    found = extractor.extract(page)
    assert found.invalid_lines == 0
    assert ours(found.samples) == reference(page, extractor.sample_names)
    assert len(parses) == 2 * len(series)  # each series, and its prefix: never a bucket
    buckets, counts = found.grouped[HIST + "_bucket"], found.grouped[HIST + "_count"]
    bucket, count = buckets[4].labels, counts[1].labels
    assert isinstance(bucket, Labels) and isinstance(count, Labels)
    assert bucket == {**count, "le": "1.0"}
    assert bucket.derived() == (count.derived()[0], 1.0)


def test_a_bucket_label_text_repeating_le_is_parsed_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """'{a="1",le="1",le="1",…}': the bucket shortcut splits off one le and must not split
    the rest again (it once recursed per repeat: quadratic, and past 500 repeats a
    RecursionError escaped the extractor and took the whole fetch with it). Counted, not
    timed: however many repeats, the text is parsed at most twice, and the line is refused."""
    from controller import exposition

    parses: list[int] = []
    real = exposition._parse_labels

    def counting(body: str) -> Labels:
        parses.append(len(body))
        return real(body)

    monkeypatch.setattr(exposition, "_parse_labels", counting)
    for repeats in (10, 1_000, 80_000):
        parses.clear()
        line = f'{HIST}_bucket{{a="1"' + ',le="1"' * repeats + "} 1\n"
        found = Extractor(histograms=[HIST]).extract(line + f'{HIST}_bucket{{a="1",le="1"}} 2\n')
        assert found.invalid_lines == 1 and found.first_error is not None
        assert "duplicate label 'le'" in found.first_error
        assert [s.value for s in found.samples] == [2.0]  # the next line still read
        long_parses = [n for n in parses if n > 20]
        assert len(long_parses) <= 2, (repeats, len(long_parses))


def test_a_long_label_text_is_read_whole_and_still_right() -> None:
    """Past the shortcut's length the general parse reads it: same samples as the reference."""
    value = "v" * 5000
    page = (
        f'{HIST}_bucket{{model_name="{value}",le="0.5"}} 3\n'
        f'{HIST}_bucket{{model_name="{value}",le="+Inf"}} 4\n'
    )
    extractor = Extractor(histograms=[HIST])
    for _ in range(2):  # first sight, then from the cache
        found = extractor.extract(page)
        assert found.invalid_lines == 0
        assert ours(found.samples) == reference(page, extractor.sample_names)


# ---- OpenMetrics' "# EOF" ---------------------------------------------------------------------
KV_LINE = 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
LATE_LINE = 'vllm:kv_cache_usage_perc{engine="1"} 0.9\n'


def _fed(text: str, piece: int, whole: bool = True) -> Page | PodError:
    stream = PageStream(POD_EXTRACTOR)
    stream.declare(OPENMETRICS, whole)  # "# EOF" ends only an OpenMetrics page
    for start in range(0, len(text), piece):  # the page as the network hands it over
        stream.feed(text[start : start + piece])
    try:
        return page_of("http://pod/metrics", stream)
    except FetchError as exc:
        return PodError(url="http://pod/metrics", reason=exc.reason, detail=exc.detail)


@pytest.mark.parametrize("piece", [1, 3, 7, 4096])
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (KV_LINE + "# EOF\n", None),
        (KV_LINE + "# EOF", None),  # the newline after # EOF is optional (OpenMetrics ABNF)
        (KV_LINE + "# EOF\r\n", None),
        (KV_LINE + "# EOF\n" + LATE_LINE, Reason.PARSE),  # a series after # EOF was used
        (KV_LINE + "# EOF" + "\n" + "# HELP x\n", Reason.PARSE),
        # a comment, not the end: a whole body without it contradicts its type
        (KV_LINE + "# EOFX\n", Reason.CONTENT_TYPE),
        (KV_LINE[:-3], Reason.CONTENT_TYPE),
    ],
)
def test_eof_ends_the_page_exactly(text: str, reason: Reason | None, piece: int) -> None:
    read = _fed(text, piece)
    if reason is None:
        assert isinstance(read, Page), read
        assert [s.value for s in read.samples["vllm:kv_cache_usage_perc"]] == [0.5]
    else:
        assert isinstance(read, PodError) and read.reason is reason, read


@pytest.mark.parametrize("piece", [1, 3, 4096])
def test_an_openmetrics_page_cut_in_transit_is_cut_short(piece: int) -> None:
    """Without framing a missing "# EOF" may be a cut ("0." of "0.5"), not a contradiction."""
    read = _fed(KV_LINE[:-3], piece, whole=False)
    assert isinstance(read, PodError) and read.reason is Reason.TRUNCATED, read


def _eof_reference(text: str) -> int | None:
    """The first line (lines end at ``\\n``, as the format's do) that is ``# EOF`` with its
    newline, by the plain definition."""
    at = 0
    for line in text.split("\n")[:-1]:  # the last piece has no newline: not a whole line
        if line in ("# EOF", "# EOF\r"):
            return at
        at += len(line) + 1
    return None


def test_the_eof_search_agrees_with_the_definition_on_odd_texts() -> None:
    """Found by its rarest letter, and past F_CHECKED of them by a search of the line (a
    page full of F is not a Python step per letter)."""
    from controller.exposition import F_CHECKED, _eof_at

    rng = random.Random(11)
    pieces = ["F", "# EOF", "\n", "\r\n", "\r", "x", "#", " ", "EOF", "# E", "OF"]
    texts = ["".join(rng.choices(pieces, k=rng.randint(0, 60))) for _ in range(3000)]
    texts += [
        "F" * (F_CHECKED * 3) + "\n# EOF\n",
        "F\n" * F_CHECKED + "# EOF\n" + LATE_LINE,
        "# EOF",  # no newline: not a whole line here (PageStream.ended decides that)
    ]
    for text in texts:
        assert _eof_at(text) == _eof_reference(text), repr(text)


def test_the_eof_search_reads_only_its_window() -> None:
    """``PageStream`` searches a piece's complete lines where they lie: a window that starts
    at a newline and ends after one. The search agrees with the definition on the window."""
    from controller.exposition import _eof_at

    rng = random.Random(12)
    pieces = ["F", "# EOF", "\n", "\r\n", "x", "#", " ", "EOF"]
    for _ in range(3000):
        text = "".join(rng.choices(pieces, k=rng.randint(1, 40)))
        newlines = [i for i, c in enumerate(text) if c == "\n"]
        if len(newlines) < 2:
            continue
        begin, last = sorted(rng.sample(newlines, 2))
        window = text[begin : last + 1]
        found = _eof_reference(window)
        expected = None if found is None else begin + found
        assert _eof_at(text, begin, last + 1) == expected, (repr(text), begin, last)


def test_a_page_fed_in_any_pieces_reads_as_a_whole() -> None:
    """A page of several 64 KiB pieces, handed over in pieces of random sizes (as sockets
    do): the same samples, in the same order, as the page read at once."""
    rng = random.Random(13)
    lines = []
    for i in range(6000):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="{i}",le="0.1"}} {i}\n')
        if i % 7 == 0:
            lines.append(f'vllm:kv_cache_usage_perc{{engine="{i}"}} {i / 6000:.4f}\n')
        if i % 11 == 0:
            lines.append(f'vllm:num_requests_waiting{{engine="{i}"}} {i % 5}\n')
    page = "# HELP vllm:kv_cache_usage_perc KV\n" + "".join(lines)
    assert len(page) > 4 * 64 * 1024
    whole = POD_EXTRACTOR.extract(page)
    for _ in range(5):
        stream = PageStream(POD_EXTRACTOR)
        at = 0
        while at < len(page):
            size = rng.choice([1, 17, 4096, 65535, 65536, 65537, 200_000])
            stream.feed(page[at : at + size])
            at += size
        read = page_of("http://pod/metrics", stream)
        assert read.samples == whole.by_name()
        assert stream.result.invalid_lines == 0 and stream.ended


def test_a_label_set_of_many_labels_is_read_but_never_kept_and_too_many_refused() -> None:
    """More than ``_CACHED_LABELS`` labels: read, not kept (a set of many short labels holds
    ~20 times the text the caches' budgets count); more than ``MAX_LABELS``: the line is
    refused, as Prometheus's ``label_limit`` refuses a scrape."""
    extractor = Extractor(gauges=["g"])
    many = ",".join(f'l{i}="v"' for i in range(exposition._CACHED_LABELS + 1))
    before = extractor.cached_entries
    (sample,) = extractor.extract(f"g{{{many}}} 1\n").samples
    assert len(sample.labels) == exposition._CACHED_LABELS + 1
    assert extractor.cached_entries == before
    few = ",".join(f'l{i}="v"' for i in range(exposition._CACHED_LABELS))
    extractor.extract(f"g{{{few}}} 1\n")
    assert extractor.cached_entries > before
    too_many = ",".join(f'l{i}="v"' for i in range(exposition.MAX_LABELS + 1))
    refused = extractor.extract(f"g{{{too_many}}} 1\n")
    assert refused.samples == [] and refused.invalid_lines == 1
    assert refused.first_error is not None and "more than 32 labels (33)" in refused.first_error


def test_a_page_refused_for_a_malformed_line_is_not_read_past_it() -> None:
    """Any malformed wanted line refuses its page (``sources.page.page_of``), so reading on
    is work for nothing: a page of 3,300 lines of 400 labels each, every one refused, cost
    1.4 s of CPU a scrape (seen when a busy machine timed a test out). The stream stops
    extracting after the piece that held the first, and still measures the page's size and
    ending, so a refused page reads as refused, never as cut short."""
    labels = ",".join(f'a{j}=""' for j in range(exposition.MAX_LABELS + 1))
    bad = f"vllm:num_requests_waiting{{{labels}}} 1\n"
    good = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(20_000))
    stream = exposition.PageStream(
        Extractor(gauges=["vllm:num_requests_running", "vllm:num_requests_waiting"])
    )
    stream.feed(bad + good)
    stream.finish()
    assert stream.result.invalid_lines == 1 and stream.result.grouped == {}
    assert stream.size == len(bad + good) and stream.ended
