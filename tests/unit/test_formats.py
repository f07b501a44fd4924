"""A page is read by the rules of the format it was served as; a repeated series keeps its
first sample; what the formats accept is read, and what would be a wrong value is skipped and
named. Each test here failed on the reader before it knew the two formats apart (#39)."""

from __future__ import annotations

import math

import pytest

from controller import exposition
from controller.exposition import OPENMETRICS, TEXT, Extractor, PageStream, go_float
from controller.histograms import collect
from controller.model import PodError, Reason
from controller.settings import ClusterSettings
from controller.sources.page import EPP_EXTRACTOR, POD_EXTRACTOR, Page, page_of, read_page
from controller.sources.reader import PageReader

KV = "vllm:kv_cache_usage_perc"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
EPP_LATENCY = "llm_d_epp_request_duration_seconds"
NOW = 1_764_860_000.25  # seconds: 2025-12-04


def page(text: str, content_type: str | None = TEXT, extractor: Extractor = POD_EXTRACTOR) -> Page:
    read = read_page("http://pod/metrics", text, extractor, content_type)
    assert isinstance(read, Page), read
    return read


def refused(text: str, content_type: str | None = TEXT) -> PodError:
    read = read_page("http://pod/metrics", text, POD_EXTRACTOR, content_type)
    assert isinstance(read, PodError), read
    return read


def reader() -> PageReader:
    return PageReader(ClusterSettings(name="c", vllm_urls=["http://pod/metrics"]), 1)


# ---- 1. OpenMetrics timestamps are seconds; the text format's milliseconds ----------------


@pytest.mark.parametrize(
    ("content_type", "stamp"),
    [
        (f"{OPENMETRICS}; version=1.0.0; charset=utf-8", f"{NOW}"),
        (OPENMETRICS, f"{NOW}"),
        (f"{TEXT}; version=0.0.4; charset=utf-8", f"{int(NOW * 1000)}"),
        (None, f"{int(NOW * 1000)}"),  # nothing said: the text format
    ],
)
def test_a_timestamp_is_read_in_the_unit_of_the_format_served(
    content_type: str | None, stamp: str
) -> None:
    eof = "# EOF\n" if content_type and content_type.startswith(OPENMETRICS) else ""
    found = page(f'{KV}{{engine="0"}} 0.5 {stamp}\n{eof}', content_type)
    (sample,) = found.samples[KV]
    assert sample.timestamp == pytest.approx(NOW, abs=1e-3)


def test_a_fresh_openmetrics_sample_keeps_its_cluster_fresh() -> None:
    """The reader's observed time is the sample's own: 55 years off made a healthy cluster
    stale."""
    found = page(f'{KV}{{engine="0"}} 0.5 {NOW}\n# EOF\n', OPENMETRICS)
    metrics = reader().read([found], None, started=NOW + 1, duration=0.01)
    assert metrics.observed_at == pytest.approx(NOW, abs=1e-3)
    assert metrics.kv_mean == 0.5 and metrics.errors == ()


def test_eof_in_a_text_page_is_a_comment_and_what_follows_it_is_read() -> None:
    found = page(f'{KV}{{engine="0"}} 0.5\n# EOF\n{WAITING}{{engine="0"}} 7\n')
    assert [s.value for s in found.samples[WAITING]] == [7]


def test_data_after_eof_refuses_an_openmetrics_page() -> None:
    error = refused(f'{KV}{{engine="0"}} 0.5\n# EOF\n{WAITING} 7\n', OPENMETRICS)
    assert error.reason is Reason.PARSE and "after '# EOF'" in error.detail


@pytest.mark.parametrize(
    ("text", "content_type", "says"),
    [
        (f'{KV}{{engine="0"}} 0.5\n', OPENMETRICS, "no final '# EOF'"),
        (f'{KV}{{engine="0"}} 0.5 {int(NOW)}\n# EOF\n', TEXT, "cannot be told"),
        (f'{KV}{{engine="0"}} 0.5\n', "application/json", "'application/json'"),
        (f'{KV}{{engine="0"}} 0.5\n', "text/html; charset=utf-8", "'text/html'"),
        # a line the text format refuses, the timestamps a piece later: not read past it,
        # the page still named for its type (a review: it read as a parse error)
        (
            f'{KV}{{engine="0"}} 0,5\n'
            + "# a comment of a piece's length\n" * 4000
            + f'{KV}{{engine="1"}} 0.5 {int(NOW)}\n# EOF\n',
            TEXT,
            "OpenMetrics page served as text",
        ),
    ],
    ids=["openmetrics-without-eof", "text-with-eof-and-timestamps", "json", "html", "malformed"],
)
def test_a_body_its_content_type_contradicts_is_named(
    text: str, content_type: str, says: str
) -> None:
    error = refused(text, content_type)
    assert error.reason is Reason.CONTENT_TYPE
    assert says in error.detail


def test_a_text_page_with_eof_and_no_timestamps_is_read() -> None:
    """``# EOF`` is a comment in the text format: only with timestamps is the unit unknown."""
    found = page(f'{KV}{{engine="0"}} 0.5\n# EOF\n')
    assert [s.value for s in found.samples[KV]] == [0.5]


# ---- 2. a series repeated on a page keeps its first sample ---------------------------------


def test_a_repeated_gauge_keeps_its_first_sample_and_is_counted() -> None:
    text = (
        f'{KV}{{engine="0"}} 0.1\n{KV}{{engine="0"}} 0.99\n'
        f'{WAITING}{{engine="0"}} 3\n{WAITING}{{engine="0"}} 3\n'
        f'{RUNNING}{{engine="0",model_name="m"}} 2\n{RUNNING}{{model_name="m",engine="0"}} 5\n'
    )
    found = page(text)
    metrics = reader().read([found], None, started=NOW, duration=0.01)
    assert (metrics.kv_mean, metrics.queue_depth, metrics.running) == (0.1, 3, 2)
    assert metrics.pods_answering == 1 and metrics.errors == ()
    assert metrics.duplicate_samples == 3
    (notice,) = metrics.notices
    assert notice.reason is Reason.DUPLICATE_SERIES
    assert notice.detail.startswith("3 repeated series") and KV in notice.detail


def _epp_histogram(counts: list[int], repeat_bucket: int | None = None) -> str:
    bounds = ["0.5", "1", "+Inf"]
    lines = []
    for i, (bound, count) in enumerate(zip(bounds, counts, strict=True)):
        lines.append(f'{EPP_LATENCY}_bucket{{model_name="m",le="{bound}"}} {count}')
        if i == repeat_bucket:
            lines.append(f'{EPP_LATENCY}_bucket{{model_name="m",le="{bound}.0"}} {count * 10}')
    lines.append(f'{EPP_LATENCY}_count{{model_name="m"}} {counts[-1]}')
    if repeat_bucket is not None:
        lines.append(f'{EPP_LATENCY}_count{{model_name="m"}} {counts[-1] * 10}')
    lines.append(f'{EPP_LATENCY}_sum{{model_name="m"}} {counts[-1] * 0.4}')
    return "\n".join(lines) + "\n"


def test_a_repeated_histogram_series_keeps_its_first_buckets_and_count() -> None:
    """A bucket given twice (``le="1"`` and ``le="1.0"`` are one bucket) doubled before."""
    plain = collect(page(_epp_histogram([2, 5, 6]), extractor=EPP_EXTRACTOR).samples, EPP_LATENCY)
    twice = page(_epp_histogram([2, 5, 6], repeat_bucket=1), extractor=EPP_EXTRACTOR)
    assert collect(twice.samples, EPP_LATENCY) == plain
    assert twice.duplicates == 2


def test_a_series_repeated_under_another_text_is_found_when_its_number_table_restarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Repeats are found by each (series, bound)'s number (``exposition._Idents``). When the
    table starts afresh, label sets numbered before it keep their old numbers: one of them
    beside the same series under another label text (numbered anew) is still a repeat."""
    monkeypatch.setattr(exposition._Idents, "LIMIT", 8)
    monkeypatch.setattr(exposition, "_IDENTS", exposition._Idents())
    extractor = Extractor(gauges=[RUNNING])
    first = f'{RUNNING}{{engine="0",model_name="m"}} 2\n{RUNNING}{{engine="1"}} 3\n'
    assert page(first, extractor=extractor).duplicates == 0  # numbered in the first table
    for i in range(3):  # enough other series to fill it and start afresh
        flood = "".join(f'{RUNNING}{{engine="{i}{j}"}} 1\n' for j in range(8))
        assert page(flood, extractor=extractor).duplicates == 0
    assert exposition._IDENTS.first > 0
    text = first + f'{RUNNING}{{model_name="m",engine="0"}} 5\n'
    for _ in range(2):  # the second time, every label set has its number
        again = page(text, extractor=extractor)
        assert again.duplicates == 1
        assert [s.value for s in again.samples[RUNNING]] == [2.0, 3.0]


def test_the_number_table_holds_series_by_their_labels_not_only_by_their_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table keeps each series alive after the label caches let it go: bounded only by
    entries, 32,768 hostile series of 450 labels held ~2.7 GB. Past ``LABELS`` labels a pair
    on average it starts afresh, while series of a few labels fill it by count."""
    monkeypatch.setattr(exposition._Idents, "LIMIT", 64)
    table = exposition._Idents()
    for i in range(64):  # two labels each: held by count
        table.number((("a", str(i)), ("b", "x")), None)
    assert table.first == 0
    table = exposition._Idents()
    wide = tuple((f"l{j}", "v") for j in range(450))
    for i in range(4):  # 1,800 labels in four series: past 64 x 16
        table.number((*wide, ("i", str(i))), None)
    assert table.first > 0


def test_a_repeated_pod_bucket_is_kept_at_its_first_value_when_folded() -> None:
    """A pod's e2e buckets are summed as they are read (``Fold``): a repeated one too."""
    e2e = "vllm:e2e_request_latency_seconds"
    head = f'{KV}{{engine="0"}} 0.5\n'
    series = [f'{e2e}_bucket{{engine="0",le="{b}"}} {c}' for b, c in (("1", 3), ("+Inf", 4))]
    tail = f'{e2e}_count{{engine="0"}} 4\n{e2e}_sum{{engine="0"}} 2\n'
    pods = reader()
    folded = []
    for lines in (series, [*series[:1], f'{e2e}_bucket{{engine="0",le="1"}} 99', *series[1:]]):
        stream = pods.pod_stream()
        stream.feed(head + "\n".join(lines) + "\n" + tail)
        read_ = page_of("http://pod/metrics", stream)
        assert read_.fold is not None
        folded.append((read_.fold.folded(read_.samples), read_.duplicates))
    (plain, none), (repeated, one) = folded
    assert repeated == plain and (none, one) == (0, 1)


# ---- 3. pages the formats accept -----------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        f'{KV}{{engine="0"}}0.5',  # a value straight after the brace
        f'{KV}{{engine="0" model_name="m"}} 0.5',  # pairs without a comma (Prometheus)
        f"{KV}{{,}} 0.5",  # a lone comma (client_python's test_commas)
    ],
)
def test_lines_the_formats_accept_are_read(line: str) -> None:
    (sample,) = page(line + "\n").samples[KV]
    assert sample.value == 0.5


def test_a_text_page_without_its_final_newline_is_read_whole() -> None:
    """Prometheus and client_python read it; the transport vouches the body is whole (an
    unframed body is refused: tests/integration/test_sources.py)."""
    found = page(f'{WAITING}{{engine="0"}} 3\n{KV}{{engine="0"}} 0.97')
    assert [s.value for s in found.samples[KV]] == [0.97]


def test_an_unframed_text_page_without_its_final_newline_is_cut_short() -> None:
    stream = PageStream(POD_EXTRACTOR)
    stream.declare(TEXT, whole=False)
    stream.feed(f'{KV}{{engine="0"}} 0.9')
    with pytest.raises(Exception, match="cut short"):
        page_of("http://pod/metrics", stream)


def test_an_extractor_wanting_nothing_reads_nothing() -> None:
    """Its name pattern matched the empty name, so a line that starts with its labels (no
    name at all) was taken for a wanted line and raised KeyError (found by an audit: the
    lines with names never reached it)."""
    for page in ("a 1\n b 2\n", '{a="b"} 1\n', 'a 1\n {a="b"} 1\n', " 1\n"):
        extraction = Extractor().extract(page)
        assert extraction.grouped == {} and extraction.invalid_lines == 0, page


# ---- 4. what would be a wrong value is skipped and named -----------------------------------


@pytest.mark.parametrize("bound", ["1__0", "_1", " 1", "1 ", "0x1", "١", "0x1p99999", "1e999"])
def test_a_bucket_whose_le_go_cannot_read_is_skipped_not_moved(bound: str) -> None:
    text = (
        f'{EPP_LATENCY}_bucket{{model_name="m",le="{bound}"}} 4\n'
        f'{EPP_LATENCY}_bucket{{model_name="m",le="+Inf"}} 6\n'
        f'{EPP_LATENCY}_count{{model_name="m"}} 6\n{EPP_LATENCY}_sum{{model_name="m"}} 1\n'
    )
    found = page(text, extractor=EPP_EXTRACTOR)
    (histogram,) = collect(found.samples, EPP_LATENCY).values()
    assert histogram.bounds == (math.inf,)
    assert found.skipped == 1
    (notice,) = found.notices
    assert notice.reason is Reason.SKIPPED_LINES and "le" in notice.detail


@pytest.mark.parametrize("stamp", ["NaN", "+Inf", "-Inf"])
def test_a_timestamp_that_is_not_a_time_skips_its_line(stamp: str) -> None:
    """Taken, it switched the staleness test off."""
    found = page(f'{KV}{{engine="0"}} 0.5 {stamp}\n{KV}{{engine="1"}} 0.7\n')
    assert [s.value for s in found.samples[KV]] == [0.7]
    assert found.skipped == 1


def test_a_native_histogram_line_is_skipped_not_a_malformed_page() -> None:
    """client_python's OpenMetrics parser reads a native histogram written in text; it is no
    classic sample, so a wanted name carrying one is skipped, and the page still read."""
    wanted = Extractor(gauges=["nh", "g"])
    text = 'g 0.5\nnh{a="b"} {count:4,sum:2,schema:0,positive_spans:[0:2]}\nnh {count:1}\n# EOF\n'
    found = page(text, OPENMETRICS, extractor=wanted)
    assert found.skipped == 2 and [s.value for s in found.samples["g"]] == [0.5]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1.0),
        ("-2.5e3", -2500.0),
        (".5", 0.5),
        ("5.", 5.0),
        ("+Inf", math.inf),
        ("-infinity", -math.inf),
        ("0x1p-3", 0.125),
        ("0X.8P1", 1.0),
        ("1_0", 10.0),  # Go takes "_" between digits (atof_test.go: "1_23.50_0_0e+1_2")
        ("1_23.50_0_0e+1_2", 1.235e14),
        ("0x1_ep-1", 15.0),
    ],
)
def test_go_float_reads_what_go_reads(text: str, value: float) -> None:
    assert go_float(text) == value


@pytest.mark.parametrize(
    "text",
    [" 1", "1 ", "0x1", "+nan", "infinit", "١", "", "1e", "1__0", "_1", "1_", "1e_5", "1e999"],
)
def test_go_float_refuses_what_go_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a number|out of range"):
        go_float(text)


def test_an_le_go_reads_out_of_range_is_skipped_not_a_crash() -> None:
    """float.fromhex raised OverflowError for "0x1p99999", which failed the whole cluster's
    fetch (internal, every tick); Go reads it as out of range: no bound."""
    text = f'{EPP_LATENCY}_bucket{{model_name="m",le="0x1p99999"}} 1\n'
    found = page(text, extractor=EPP_EXTRACTOR)
    assert found.skipped == 1


@pytest.mark.parametrize("shape", ["1{n}e", "0x1{n}x", "1.{n}e+"])
def test_a_hostile_le_is_refused_in_linear_time(shape: str) -> None:
    """A run of digits that fails at its end was split every way by the number pattern: 16k
    digits held the loop 17 s. 200k digits here, refused as no bound: read in linear time, or
    this test takes hours."""
    bound = shape.format(n="1" * 200_000)
    text = f'{EPP_LATENCY}_bucket{{model_name="m",le="{bound}"}} 1\n'
    read = read_page("http://pod/metrics", text, EPP_EXTRACTOR, TEXT)
    assert isinstance(read, Page) and read.skipped == 1
