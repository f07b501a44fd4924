"""The scraping source against real aiohttp servers on loopback, good pages and bad."""

from __future__ import annotations

import asyncio
import gzip
import os
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from benchmarks.vllm_page import vllm_v1_page
from controller.model import ClusterMetrics, Reason
from controller.settings import ClusterSettings, ScrapeSettings
from controller.sources.page import (
    EPP_EXTRACTOR,
    POD_EXTRACTOR,
    POD_LEAN_EXTRACTOR,
    Page,
    read_page,
)
from controller.sources.reader import PageReader
from controller.sources.scrape import ScrapeSource
from tests.support.pages import fixture_text
from tests.support.servers import Handler, Server, free_port, text_handler

Serve = Callable[[dict[str, Handler]], Awaitable[Server]]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def source(session: aiohttp.ClientSession, timeout: float = 1.0, **cluster: Any) -> ScrapeSource:
    scrape = ScrapeSettings(**cluster.pop("scrape", {}))
    return ScrapeSource(ClusterSettings(name="c", **cluster), scrape, timeout, session)


def v1_page(
    kv: list[float], waiting: float = 0.0, model: str = "m", name: str = "vllm:kv_cache_usage_perc"
) -> str:
    lines = [f"# TYPE {name} gauge"]
    lines += [f'{name}{{engine="{i}",model_name="{model}"}} {v}' for i, v in enumerate(kv)]
    lines += [f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}']
    return "\n".join(lines) + "\n"


async def test_real_vllm_v0_fixture(serve: Serve, session: aiohttp.ClientSession) -> None:
    server = await serve({"/metrics": text_handler(fixture_text("vllm-v0-aibrix-docs.prom"))})
    metrics = await source(session, vllm_urls=[server.url("/metrics")]).fetch()
    assert metrics.kv_mean == 0.0  # the capture's real value: an idle server, known, not None
    assert metrics.kv_family == "vllm:gpu_cache_usage_perc"
    assert metrics.queue_depth == 0.0 and metrics.running == 0.0
    assert (metrics.pods_scraped, metrics.pods_answering, metrics.errors) == (1, 1, ())


async def test_engines_are_averaged_not_summed_and_pods_combined(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    server = await serve(
        {
            "/p0": text_handler(v1_page([0.2, 0.4], waiting=3)),
            "/p1": text_handler(v1_page([0.9], waiting=5)),
        }
    )
    metrics = await source(session, vllm_urls=[server.url("/p0"), server.url("/p1")]).fetch()
    assert metrics.kv_mean == pytest.approx(0.5)
    assert metrics.kv_max == pytest.approx(0.9)
    assert metrics.queue_depth == 8 and metrics.queue_per_pod == 4


async def test_new_name_preferred_and_openmetrics_spelling_accepted(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    both = v1_page([0.7]) + v1_page([0.1], name="vllm:gpu_cache_usage_perc")
    underscored = v1_page([0.3]).replace("vllm:", "vllm_")
    server = await serve({"/both": text_handler(both), "/om": text_handler(underscored)})
    assert (await source(session, vllm_urls=[server.url("/both")]).fetch()).kv_mean == 0.7
    metrics = await source(session, vllm_urls=[server.url("/om")]).fetch()
    assert metrics.kv_mean == 0.3 and metrics.kv_family == "vllm:kv_cache_usage_perc"


async def test_model_name_filter(serve: Serve, session: aiohttp.ClientSession) -> None:
    server = await serve(
        {"/p": text_handler(v1_page([0.8], model="a") + v1_page([0.2], model="b"))}
    )
    metrics = await source(session, vllm_urls=[server.url("/p")], model_name="b").fetch()
    assert metrics.kv_mean == 0.2


async def test_epp_only_cluster_uses_pool_averages(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    for fixture in ("epp-gie-v1.5.0-pool-averages.prom", "epp-llmd-router-pool-averages.prom"):
        server = await serve({"/m": text_handler(fixture_text(fixture))})
        metrics = await source(session, epp_url=server.url("/m"), pool_name="p1").fetch()
        assert metrics.kv_mean == 0.3 and metrics.queue_per_pod == 0.4
        assert (metrics.pods_scraped, metrics.pods_answering) == (1, 1)


class Mutable:
    """A page whose text the test changes between scrapes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.headers: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        return web.Response(text=self.text)


def histogram(
    name: str, buckets: dict[str, float], total_sum: float, labels: str = 'model_name="m"'
) -> str:
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets.items()]
    count = buckets["+Inf"]
    lines += [f"{name}_sum{{{labels}}} {total_sum}", f"{name}_count{{{labels}}} {count}"]
    return "\n".join(lines) + "\n"


EPP = "inference_objective_request_duration_seconds"


async def test_latency_comes_from_the_difference_between_scrapes(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    kv = v1_page([0.5])
    epp = Mutable(histogram(EPP, {"0.5": 1000, "1.0": 1000, "2": 1000, "+Inf": 1000}, 300.0))
    server = await serve({"/kv": text_handler(kv), "/epp": epp.handle})
    src = source(session, vllm_urls=[server.url("/kv")], epp_url=server.url("/epp"))
    first = await src.fetch()
    assert first.latency is None  # one scrape is only a baseline
    # 100 new requests, all between 1 and 2 seconds: since-start totals would say < 0.5 s.
    epp.text = histogram(EPP, {"0.5": 1000, "1": 1000, "2.0": 1100, "+Inf": 1100}, 450.0)
    second = await src.fetch()
    assert second.latency is not None
    assert second.latency.family == EPP
    assert second.latency.requests == 100
    assert second.latency.p50 == pytest.approx(1.5)
    assert second.latency.p90 == pytest.approx(1.9)
    assert second.latency.mean == pytest.approx(1.5)


async def test_counter_reset_and_minimum_requests(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    epp = Mutable(histogram(EPP, {"1": 500, "+Inf": 1000}, 900.0))
    server = await serve({"/kv": text_handler(v1_page([0.5])), "/epp": epp.handle})
    src = source(session, vllm_urls=[server.url("/kv")], epp_url=server.url("/epp"))
    await src.fetch()
    epp.text = histogram(EPP, {"1": 10, "+Inf": 10}, 5.0)  # the EPP restarted
    after_reset = await src.fetch()
    # a fall is a restart or another process behind the URL: at first the two look alike,
    # so the interval is unknown rather than counted (neither latency nor realised share)
    assert after_reset.latency is None and after_reset.completed is None
    epp.text = histogram(EPP, {"1": 22, "+Inf": 22}, 11.0)  # counting on from 10: a restart
    restarted = await src.fetch()
    assert restarted.latency is not None and restarted.latency.requests == 12
    assert restarted.latency.p90 == pytest.approx(0.9) and restarted.completed == 12
    epp.text = histogram(EPP, {"1": 24, "+Inf": 24}, 12.0)  # 2 requests: too few to judge
    quiet = await src.fetch()
    assert quiet.latency is not None and quiet.latency.requests == 2 and quiet.latency.p90 is None


async def test_vllm_e2e_histogram_is_the_fallback(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    name = "vllm:e2e_request_latency_seconds"
    page = Mutable(v1_page([0.4]) + histogram(name, {"1": 0, "4": 0, "+Inf": 0}, 0.0))
    server = await serve({"/p": page.handle})
    src = source(session, vllm_urls=[server.url("/p")])
    await src.fetch()
    page.text = v1_page([0.4]) + histogram(name, {"1": 0, "4": 20, "+Inf": 20}, 50.0)
    metrics = await src.fetch()
    assert metrics.latency is not None and metrics.latency.family == name
    assert metrics.latency.p50 == pytest.approx(2.5)


async def test_real_epp_fixture_histograms_are_read(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    for fixture in (
        "epp-gie-v1.5.0-request-duration.prom",
        "epp-llmd-router-request-duration.prom",
    ):
        page = Mutable(fixture_text(fixture))
        server = await serve({"/kv": text_handler(v1_page([0.5])), "/epp": page.handle})
        src = source(session, vllm_urls=[server.url("/kv")], epp_url=server.url("/epp"))
        await src.fetch()
        metrics = await src.fetch()
        assert metrics.latency is not None  # same page twice: a window with no requests
        assert metrics.latency.requests == 0 and metrics.latency.p50 is None


async def test_sends_classic_text_accept_and_reads_gzip(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    seen: list[str] = []

    async def gzipped(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept", ""))
        body = gzip.compress(v1_page([0.6]).encode())
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"}
        )

    server = await serve({"/p": gzipped})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    assert metrics.kv_mean == 0.6
    assert seen[0].startswith("text/plain;version=0.0.4")


async def test_bearer_token_is_reread_when_rotated(
    serve: Serve, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    page = Mutable(v1_page([0.5]))
    server = await serve({"/p": page.handle})
    src = source(
        session,
        vllm_urls=[server.url("/p")],
        bearer_token_file=str(token),
        allow_token_over_http=True,  # loopback
    )
    await src.fetch()
    token.write_text("second-and-longer\n")
    await src.fetch()
    assert [h["Authorization"] for h in page.headers] == [
        "Bearer first",
        "Bearer second-and-longer",
    ]


# ---- failure modes ---------------------------------------------------------------------------


async def _hang(_: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.Response(text="late")


async def _truncated(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Length": "4096"})
    await response.prepare(request)
    await response.write(b'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_')
    assert request.transport is not None
    request.transport.close()
    return response


FAILURES: list[tuple[str, Handler | None, Reason]] = [
    ("timeout", _hang, Reason.TIMEOUT),
    ("http-500", text_handler("oops", status=500), Reason.HTTP_STATUS),
    (
        "garbage-html",
        text_handler("<html><body>Bad Gateway</body></html>", content_type="text/html"),
        Reason.CONTENT_TYPE,
    ),
    (
        "html-as-text",  # a proxy's error page served as text/plain
        text_handler("<html><body>Bad Gateway</body></html>"),
        Reason.PARSE,
    ),
    (
        "openmetrics-without-eof",
        text_handler(
            'vllm:kv_cache_usage_perc{engine="0"} 0.5\n',
            content_type="application/openmetrics-text",
        ),
        Reason.CONTENT_TYPE,
    ),
    (
        "malformed-last-line",  # whole (Content-Length), its last line without a newline
        text_handler('vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engi'),
        Reason.PARSE,
    ),
    ("empty", text_handler(""), Reason.TRUNCATED),
    ("cut-body", _truncated, Reason.TRUNCATED),
    ("unauthorized", text_handler("denied", status=401), Reason.AUTH),
    ("forbidden", text_handler("denied", status=403), Reason.AUTH),
    ("redirect", text_handler("moved", status=302), Reason.REDIRECT),
    (
        "percent",
        text_handler('vllm:kv_cache_usage_perc{engine="0"} 95\n'),
        Reason.OUT_OF_RANGE,
    ),
    (
        "nan",
        text_handler('vllm:kv_cache_usage_perc{engine="0"} NaN\n'),
        Reason.OUT_OF_RANGE,
    ),
    (
        "negative",
        text_handler('vllm:kv_cache_usage_perc{engine="0"} -0.1\n'),
        Reason.OUT_OF_RANGE,
    ),
    (
        "oversized",
        text_handler(v1_page([0.5]) + "# padding " + "x" * 5000 + "\n"),
        Reason.TOO_LARGE,
    ),
    ("refused", None, Reason.REFUSED),
]


@pytest.mark.parametrize(("case", "handler", "reason"), FAILURES, ids=[f[0] for f in FAILURES])
async def test_failure_modes_become_pod_errors(
    serve: Serve, session: aiohttp.ClientSession, case: str, handler: Handler | None, reason: Reason
) -> None:
    if handler is None:
        url = f"http://127.0.0.1:{free_port()}/metrics"
    else:
        url = (await serve({"/p": handler})).url("/p")
    src = source(session, timeout=0.3, vllm_urls=[url], scrape={"max_body_bytes": 4096})
    metrics: ClusterMetrics = await src.fetch()
    assert metrics.pods_answering == 0
    assert [e.reason for e in metrics.errors] == [reason]
    assert metrics.errors[0].url == url and metrics.errors[0].detail
    assert metrics.kv_mean is None


async def _unframed(body: bytes) -> tuple[asyncio.Server, str]:
    """A server that answers 200 with neither Content-Length nor chunked framing: the body
    ends where the connection closes, so a cut one cannot be told from a whole one."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        writer.write(body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/metrics"


@pytest.mark.parametrize(
    "body",
    [
        b'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engi',
        b'vllm:kv_cache_usage_perc{engine="0"} 0.',  # '0.' of '0.97': never read as 0.0
    ],
    ids=["cut-mid-line", "cut-mid-value"],
)
async def test_an_unframed_body_without_its_final_newline_is_cut_short(
    session: aiohttp.ClientSession, body: bytes
) -> None:
    server, url = await _unframed(body)
    async with server:
        metrics = await source(session, vllm_urls=[url]).fetch()
    assert metrics.pods_answering == 0
    assert [e.reason for e in metrics.errors] == [Reason.TRUNCATED]


async def test_a_cut_gzip_body_with_a_content_length_is_cut_short(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """The Content-Length vouches for the compressed bytes, and aiohttp does not check that
    a gzip stream ended: a cut one decoded to "... 0." of "0.97" and was read as 0.0."""
    whole = gzip.compress(b'vllm:num_requests_waiting{engine="0"} 0.97\n')
    cut = whole[: len(whole) - 12]  # the stream stops inside its last deflate block

    async def handler(_: web.Request) -> web.Response:
        return web.Response(
            body=cut, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"}
        )

    server = await serve({"/p": handler})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    assert metrics.queue_depth is None
    assert [e.reason for e in metrics.errors] == [Reason.TRUNCATED]


async def test_an_unframed_whole_page_is_read(session: aiohttp.ClientSession) -> None:
    server, url = await _unframed(v1_page([0.4], waiting=2).encode())
    async with server:
        metrics = await source(session, vllm_urls=[url]).fetch()
    assert (metrics.kv_mean, metrics.queue_depth, metrics.errors) == (0.4, 2, ())


async def test_an_openmetrics_page_is_read_by_its_own_rules(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """Its timestamps are seconds: read as milliseconds, a fresh sample was 55 years old and
    its healthy cluster stale. Its "# EOF" ends it."""
    now = time.time()
    page = f'vllm:kv_cache_usage_perc{{engine="0"}} 0.3 {now:.3f}\n# EOF\n'
    kind = "application/openmetrics-text; version=1.0.0; charset=utf-8"

    async def typed(_: web.Request) -> web.Response:
        return web.Response(body=page.encode(), headers={"Content-Type": kind})

    server = await serve({"/om": typed})
    metrics = await source(session, vllm_urls=[server.url("/om")]).fetch()
    assert metrics.errors == () and metrics.kv_mean == 0.3
    assert metrics.observed_at == pytest.approx(now, abs=0.01)


async def test_a_repeated_series_keeps_its_first_sample_and_is_counted(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    kv = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"}'
    waiting = 'vllm:num_requests_waiting{engine="0",model_name="m"}'
    page = f"{kv} 0.1\n{kv} 0.99\n{waiting} 3\n{waiting} 3\n"
    server = await serve({"/p": text_handler(page)})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    assert (metrics.kv_mean, metrics.queue_depth, metrics.pods_answering) == (0.1, 3, 1)
    assert metrics.duplicate_samples == 2
    assert [n.reason for n in metrics.notices] == [Reason.DUPLICATE_SERIES]


async def test_invalid_kv_values_are_counted_never_used(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    server = await serve({"/p": text_handler(v1_page([float("nan"), -0.1, 1.5, 0.4]))})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    assert metrics.kv_mean == 0.4 and metrics.kv_max == 0.4
    assert metrics.invalid_samples == 3


async def test_a_character_cut_between_two_pieces_of_the_body_is_read_whole(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """The body arrives in pieces that cut 2-, 3- and 4-byte UTF-8 characters in two (and one
    byte that is no UTF-8 at all): each cut character is decoded once both halves are in, so
    the model filter, which only the exact name passes, keeps every engine; the bad byte
    becomes U+FFFD in a series of its own, which the filter drops."""
    model = "é€😀" * 50
    kv = [0.1 * (1 + i) for i in range(8)]  # a value each: an engine lost moves the mean
    lines = [
        f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="{model}"}} {v}'
        for i, v in enumerate(kv)
    ]
    lines.append('vllm:kv_cache_usage_perc{engine="x",model_name="bad\udcff"} 0.9')
    body = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
    emoji = body.index("😀".encode())
    euro = body.index("€".encode(), emoji + 1000)
    accent = body.index("é".encode(), euro + 1000)
    cuts = [emoji + 1, emoji + 3, euro + 2, accent + 1, body.index(b"\xff")]
    assert all(body[cut] >> 6 == 0b10 for cut in cuts[:-1])  # each inside a character

    async def in_pieces(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for start, end in pairwise([0, *cuts, len(body)]):
            await response.write(body[start:end])
            await asyncio.sleep(0.02)  # each piece its own read (it would still read whole)
        return response

    server = await serve({"/p": in_pieces})
    metrics = await source(session, vllm_urls=[server.url("/p")], model_name=model).fetch()
    assert metrics.kv_mean == pytest.approx(sum(kv) / len(kv))
    assert (metrics.errors, metrics.invalid_samples) == ((), 0)
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    assert metrics.kv_max == 0.9  # the line with the bad byte was read, as U+FFFD


@pytest.mark.parametrize("page", ["vllm:kv_cache_usage_ratio 0.5\n", "# nothing here\n"])
async def test_missing_or_renamed_metric_is_unknown_not_zero(
    serve: Serve, session: aiohttp.ClientSession, page: str
) -> None:
    server = await serve({"/p": text_handler(page)})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    assert metrics.pods_answering == 1
    (missing,) = metrics.errors  # said, with what was looked for; never read as 0
    assert missing.reason is Reason.MISSING_METRIC and "vllm:kv_cache_usage_perc" in missing.detail
    assert metrics.kv_mean is None and metrics.queue_depth is None and metrics.running is None


async def test_one_pod_down_keeps_the_others(serve: Serve, session: aiohttp.ClientSession) -> None:
    server = await serve(
        {"/ok": text_handler(v1_page([0.3])), "/bad": text_handler("x", status=503)}
    )
    metrics = await source(session, vllm_urls=[server.url("/ok"), server.url("/bad")]).fetch()
    assert metrics.kv_mean == 0.3
    assert (metrics.pods_scraped, metrics.pods_answering) == (2, 1)
    assert [e.reason for e in metrics.errors] == [Reason.HTTP_STATUS]


def _series_flood(size: int) -> bytes:
    """``size`` bytes of tiny wanted series, each its own (a label counting up): the page a
    broken exporter or a hostile pod serves, ~120,000 samples in 9 MB."""
    lines, total, i = [v1_page([0.3])], 0, 0
    while total < size:
        line = f'vllm:num_requests_waiting{{engine="{i}",model_name="m"}} 1\n'
        lines.append(line)
        total, i = total + len(line), i + 1
    return "".join(lines).encode()


@pytest.mark.parametrize("cap", [None, 1000], ids=["default", "floor"])
async def test_a_flood_of_tiny_series_is_refused_before_it_is_held(
    serve: Serve, session: aiohttp.ClientSession, cap: int | None
) -> None:
    """9 MB of tiny series, under the body cap, would hold ~110 MB as samples (~1 KB each):
    refused while reading once past ``scrape.max_page_samples``, by name, the pod beside it
    read, and the peak of what the fetch allocates a small part of that."""
    body = _series_flood(9 * 1024 * 1024)

    async def flood(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    server = await serve({"/flood": flood, "/ok": text_handler(v1_page([0.4]))})
    scrape = {"max_body_bytes": 16 * 1024 * 1024, **({"max_page_samples": cap} if cap else {})}
    urls = [server.url("/flood"), server.url("/ok")]
    src = source(session, timeout=5.0, vllm_urls=urls, scrape=scrape)
    tracemalloc.start()
    try:
        metrics = await src.fetch()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (error,) = metrics.errors
    limit = cap or ScrapeSettings().max_page_samples
    assert (error.url, error.reason) == (urls[0], Reason.TOO_MANY_SAMPLES)
    assert (
        f"more than {limit} wanted samples" in error.detail and "max_page_samples" in error.detail
    )
    assert (metrics.pods_answering, metrics.kv_mean) == (1, 0.4)
    assert peak < 40 * 1024 * 1024, peak  # read whole, the samples alone held ~110 MB


async def test_a_page_of_many_labelled_series_holds_neither_the_page_nor_the_process(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """A review: 3,300 samples of 400 short labels each, 10 MB under every other cap, held
    204 MiB while read and after (the label caches count text, and such a set holds ~20
    times its text). A wanted sample of more than ``exposition.MAX_LABELS`` labels refuses
    its page, as Prometheus's ``label_limit`` does."""
    labels = ",".join(f'a{j}=""' for j in range(400))
    line = 'vllm:num_requests_waiting{%s,engine="%d",model_name="m"} 1\n'
    body = (v1_page([0.3]) + "".join(line % (labels, i) for i in range(3300))).encode()

    async def page(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    server = await serve({"/p": page})
    scrape = {"max_body_bytes": 16 * 1024 * 1024}
    src = source(session, timeout=5.0, vllm_urls=[server.url("/p")], scrape=scrape)
    tracemalloc.start()
    try:
        metrics = await src.fetch()
        _, peak = tracemalloc.get_traced_memory()
        (error,) = metrics.errors
        del metrics
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error.reason is Reason.PARSE and "more than 32 labels (402)" in error.detail
    assert peak < 40 * 1024 * 1024, peak  # read whole and kept, 204 MiB
    assert held < 4 * 1024 * 1024, held  # nothing of it kept in the caches


async def test_a_nan_in_the_new_kv_name_falls_back_to_the_old_name_for_that_series(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    page = (
        'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.2\n'
        'vllm:gpu_cache_usage_perc{engine="0"} 0.6\n'
        'vllm:gpu_cache_usage_perc{engine="1"} 0.9\n'
    )
    server = await serve({"/p": text_handler(page)})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    # engine 0 from the old name (its new value is NaN), engine 1 from the new one
    assert metrics.kv_mean == pytest.approx(0.4) and metrics.kv_max == 0.6
    assert metrics.errors == () and metrics.invalid_samples == 0


async def test_an_out_of_range_kv_names_the_value(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    server = await serve({"/p": text_handler('vllm:kv_cache_usage_perc{engine="0"} 95\n')})
    metrics = await source(session, vllm_urls=[server.url("/p")]).fetch()
    (error,) = metrics.errors
    assert error.reason is Reason.OUT_OF_RANGE
    assert 'engine="0"' in error.detail and "=95 is outside 0..1" in error.detail
    assert "percentage" in error.detail


async def test_a_token_that_cannot_be_read_is_an_auth_fault_without_the_token(
    serve: Serve, session: aiohttp.ClientSession, tmp_path: Any
) -> None:
    token = tmp_path / "token"
    token.write_bytes(b"s3cr\xff\xfet")  # not UTF-8
    server = await serve({"/p": text_handler(v1_page([0.3]))})
    src = source(
        session,
        vllm_urls=[server.url("/p")],
        bearer_token_file=str(token),
        allow_token_over_http=True,  # loopback
    )
    (error,) = (await src.fetch()).errors
    assert error.reason is Reason.AUTH and "s3cr" not in error.detail
    token.write_text("line\nbreak")
    (error,) = (await src.fetch()).errors
    assert error.reason is Reason.AUTH and "line" not in error.detail
    token.unlink()
    (error,) = (await src.fetch()).errors
    assert error.reason is Reason.AUTH and "No such file" in error.detail
    os.mkfifo(token)  # no writer: a blocking read would hold the event loop for ever
    (error,) = (await asyncio.wait_for(src.fetch(), 5)).errors
    assert error.reason is Reason.AUTH and "not a regular file" in error.detail
    token.unlink()
    token.write_text("x" * 70_000)  # no token: it would go in every request's header
    (error,) = (await src.fetch()).errors
    assert error.reason is Reason.AUTH and "larger than 65536 bytes" in error.detail


def test_a_token_over_plain_http_or_credentials_in_a_url_are_refused_at_start_up() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="plain http"):
        ClusterSettings(name="c", vllm_urls=["http://pod:8000/metrics"], bearer_token_file="/t")
    with pytest.raises(ValidationError, match="credentials in a URL"):
        ClusterSettings(name="c", vllm_urls=["https://u:p@pod:8000/metrics"])
    # the EPP's token goes to the (https) EPP only: fine beside plain-http pods
    ClusterSettings(
        name="c",
        vllm_urls=["http://pod:8000/metrics"],
        epp_url="https://epp:9090/metrics",
        epp_bearer_token_file="/t",
    )


async def test_pods_behind_an_epp_with_latency_are_read_without_their_e2e_buckets(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """The same pages read as before (every pod's e2e histogram kept) give the same cluster
    read, tick by tick: latency, completions, arrivals, KV, queue and what the pods hold."""
    pods = {f"/p{i}": vllm_v1_page(seed=i) for i in range(3)}
    epp = Mutable("")
    server = await serve({**{p: text_handler(t) for p, t in pods.items()}, "/epp": epp.handle})
    settings: dict[str, Any] = {
        "vllm_urls": [server.url(p) for p in pods],
        "epp_url": server.url("/epp"),
    }
    src = source(session, **settings)
    reference = PageReader(ClusterSettings(name="c", **settings), 10.0)
    for tick in range(4):
        done = 1000 + 150 * tick * tick
        epp.text = histogram(EPP, {"0.5": 400, "1": 700, "2": done, "+Inf": done}, 1.4 * done)
        epp.text += f'inference_objective_request_total{{model_name="m"}} {done + 7}\n'
        lean = src._reader.pod_extractor
        got = await src.fetch()
        full = reference.read(
            [read_page(server.url(p), t, POD_EXTRACTOR) for p, t in pods.items()],
            read_page(server.url("/epp"), epp.text, EPP_EXTRACTOR),
            got.scraped_at,
            got.duration,
        )
        assert got == full
        assert got.errors == () and got.pods_answering == 3
        assert (lean is POD_LEAN_EXTRACTOR) == (tick > 0)  # known from the EPP's first page
        if tick > 0:
            assert got.latency is not None and got.latency.family == EPP
            assert got.completed == 150 * (2 * tick - 1) and got.arrived == got.completed
    page = read_page(server.url("/p0"), pods["/p0"], POD_LEAN_EXTRACTOR)
    assert isinstance(page, Page)
    assert "vllm:e2e_request_latency_seconds_count" in page.samples
    assert not any(name.endswith("_bucket") for name in page.samples)
    # an EPP that stops giving latency: the pods' own histograms are read again
    epp.text = 'inference_objective_request_total{model_name="m"} 9999\n'
    await src.fetch()
    assert src._reader.pod_extractor is POD_EXTRACTOR
