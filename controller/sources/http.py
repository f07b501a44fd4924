"""HTTP for sources: one GET with a timeout, a size cap enforced while reading, auth and TLS.

aiohttp's exceptions are translated here into our FetchError tree, so callers catch one type.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from yarl import URL

from controller.errors import (
    FetchAuthError,
    FetchConnectError,
    FetchError,
    FetchForbiddenAddressError,
    FetchHTTPStatusError,
    FetchRedirectError,
    FetchRefusedError,
    FetchTimeoutError,
    FetchTooLargeError,
    FetchTooManySamplesError,
    FetchTruncatedError,
    printable,
)
from controller.exposition import PageStream
from controller.settings.files import read_token
from controller.sources.dns import AddressRefusedError
from controller.sources.limiter import Limiter

# The classic text format: prometheus-client >= 0.23 would rename vllm: metrics for OpenMetrics.
ACCEPT_TEXT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
_CHUNK = 64 * 1024
# Give the event loop back after this much body: a typical vLLM page goes through in one go,
# and the largest page allowed in a few dozen steps, so no page holds the loop for long.
_YIELD_EVERY = 256 * 1024
_ERROR_BODY = 300  # bytes of an error response kept for the log


class TokenFile:
    """A bearer token read from a file and re-read whenever the file changes.

    Projected service-account tokens are rotated in place by the kubelet; a cached token would
    start failing with 401 an hour later. A stat per request is cheap next to the request.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def header(self) -> str:
        stat = os.stat(self._path)
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._token = read_token(self._path)  # never blocks: a FIFO is refused
            self._stamp = stamp
        return f"Bearer {self._token}"

    def __repr__(self) -> str:  # never show the token
        return f"TokenFile({str(self._path)!r})"


def ssl_context(ca_file: Path | None, insecure: bool) -> ssl.SSLContext | bool:
    """``True`` (verify with the system store) unless a CA file or an explicit opt-out says."""
    if insecure:
        return False
    if ca_file is not None:
        return ssl.create_default_context(cafile=str(ca_file))
    return True


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How to GET one URL: its timeout, size caps (bytes, and a page's wanted samples),
    credentials and TLS settings, and the limiter shared by every endpoint of the process
    (how many requests may run at once)."""

    url: str
    timeout: float
    max_bytes: int
    token: TokenFile | None = None
    tls: ssl.SSLContext | bool = True
    limiter: Limiter | None = None
    max_samples: int | None = None  # a page's (``get_page``); None: no cap (queriers' JSON)
    server_name: str | None = None  # what the certificate must name, if not the URL's host
    # Parsed once: yarl keeps a small cache of parsed strings, which a fleet of distinct pod
    # URLs misses on every request (~14 µs a page; benchmarks/HISTORY.md).
    target: URL | str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            target: URL | str = URL(self.url)
        except ValueError:  # aiohttp refuses it when asked, as a failed page of its own
            target = self.url
        object.__setattr__(self, "target", target)


async def get_text(session: aiohttp.ClientSession, endpoint: Endpoint, accept: str) -> str:
    """The body of a 200 response as text, or a FetchError saying what went wrong."""
    chunks: list[str] = []
    await _get(session, endpoint, accept, chunks.append)
    return "".join(chunks)


async def get_page(
    session: aiohttp.ClientSession, endpoint: Endpoint, accept: str, stream: PageStream
) -> PageStream:
    """A 200 response fed into ``stream`` as it arrives (the page is never held whole), read
    by the format its ``Content-Type`` names. A page with more wanted samples than
    ``endpoint.max_samples`` is refused as soon as a piece takes it past (Prometheus's
    ``sample_limit`` fails such a scrape whole, docs/configuration/configuration.md): its
    samples cost ~1 KB each while held, so a few megabytes of tiny series would hold over a
    hundred, the body cap alone bounds text, not what it becomes."""
    limit = endpoint.max_samples
    if limit is None:
        await _get(session, endpoint, accept, stream.feed, stream.declare)
        return stream

    def feed(text: str) -> None:
        stream.feed(text)
        if stream.taken > limit:
            detail = f"more than {limit} wanted samples (scrape.max_page_samples)"
            raise FetchTooManySamplesError(endpoint.url, detail)

    await _get(session, endpoint, accept, feed, stream.declare)
    return stream


async def _get(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    accept: str,
    sink: Callable[[str], None],
    declare: Declare | None = None,
) -> None:
    """GET ``endpoint`` and hand its decoded body to ``sink`` piece by piece (and, first, its
    Content-Type and whether HTTP framed it to ``declare``). The request's timeout starts
    once the limiter lets it run, so time spent queued behind other pages never counts
    against it (the tick deadline bounds the whole)."""
    if endpoint.limiter is None:
        await _request(session, endpoint, accept, sink, declare)
        return
    async with endpoint.limiter:
        await _request(session, endpoint, accept, sink, declare)


# What a body was served as (its Content-Type, if any), and whether HTTP framed it
# (Content-Length or chunked: a body cut in transit is then an error, not a shorter page).
Declare = Callable[[str | None, bool], None]


async def _request(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    accept: str,
    sink: Callable[[str], None],
    declare: Declare | None = None,
) -> None:
    url = endpoint.url
    headers = {"Accept": accept, "Accept-Encoding": "gzip"}
    if endpoint.token is not None:
        try:
            headers["Authorization"] = endpoint.token.header()
        except (OSError, ValueError) as exc:
            # the kind of failure, never the file's content
            what = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            if isinstance(exc, ValueError) and not isinstance(exc, UnicodeDecodeError):
                what = str(exc)
            raise FetchAuthError(url, f"cannot read the bearer token file: {what}") from None
    try:
        async with asyncio.timeout(endpoint.timeout):
            async with session.get(
                endpoint.target,
                headers=headers,
                ssl=endpoint.tls,
                allow_redirects=False,
                server_hostname=endpoint.server_name,
            ) as response:
                if 300 <= response.status < 400:
                    where = snippet(response.headers.get("Location", ""), 80)
                    detail = f"HTTP {response.status} to {where or '(no Location)'}: not followed"
                    raise FetchRedirectError(url, detail)
                if response.status in (401, 403):
                    detail = await _status_detail(response)
                    raise FetchAuthError(url, f"{detail} (is the bearer token valid and allowed?)")
                if response.status != 200:
                    raise FetchHTTPStatusError(url, await _status_detail(response))
                if declare is not None:
                    declare(response.headers.get("Content-Type"), _framed(response))
                await _read_capped(response, endpoint, sink)
    except TimeoutError as exc:
        raise FetchTimeoutError(url, f"no complete answer within {endpoint.timeout:g}s") from exc
    except aiohttp.ClientPayloadError as exc:
        detail = f"body cut short or badly encoded: {type(exc).__name__}"
        raise FetchTruncatedError(url, detail) from exc
    except (aiohttp.ClientConnectionError, OSError) as exc:
        if _refused(exc):
            raise FetchRefusedError(url, f"connection refused: {exc}") from exc
        if isinstance(refused := getattr(exc, "os_error", exc), AddressRefusedError):
            raise FetchForbiddenAddressError(url, str(refused)) from exc
        raise FetchConnectError(url, f"{type(exc).__name__}: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc
    except UnicodeError as exc:  # a host the IDNA codec refuses (a name found, not configured)
        raise FetchConnectError(url, f"not a host name: {exc}") from exc


def _framed(response: aiohttp.ClientResponse) -> bool:
    """The body's end is known to HTTP (aiohttp then raises ClientPayloadError on a cut
    one), rather than read until the connection closes. A compressed body is never taken as
    whole: the framing vouches for the compressed bytes, and aiohttp does not check that a
    gzip stream ended (a cut one decoded to ``…usage_perc 0.`` of ``0.97``)."""
    if response.headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
        return False
    chunked = "chunked" in response.headers.get("Transfer-Encoding", "").lower()
    return response.content_length is not None or chunked


def _refused(exc: BaseException) -> bool:
    """ECONNREFUSED, raised as itself or inside aiohttp's connector error."""
    cause = getattr(exc, "os_error", exc)
    return isinstance(cause, ConnectionRefusedError)


async def _status_detail(response: aiohttp.ClientResponse) -> str:
    """``HTTP 400: <the start of the body>`` — Prometheus puts the query error there."""
    try:
        head = (await response.content.read(_ERROR_BODY)).decode("utf-8", errors="replace")
    except (aiohttp.ClientError, OSError):
        head = ""
    head = snippet(head)
    return f"HTTP {response.status}: {head}" if head else f"HTTP {response.status}"


_TAG = re.compile(r"<[^>]{0,200}>")
SNIPPET_CHARS = 120


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """A short, printable, one-line excerpt of an error body: markup dropped, control
    characters gone, whitespace collapsed, at most ``limit`` characters."""
    text = _TAG.sub(" ", text)
    text = printable(text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _read_capped(
    response: aiohttp.ClientResponse, endpoint: Endpoint, sink: Callable[[str], None]
) -> None:
    limit = endpoint.max_bytes
    declared = response.content_length
    if declared is not None and declared > limit:
        raise FetchTooLargeError(endpoint.url, f"Content-Length {declared} > {limit}")
    # UTF-8 decoded piece by piece as codecs' incremental decoder does (a character cut
    # between two chunks waits for the next), with the C function it wraps called directly
    # (what the wrapper costs: benchmarks/README.md).
    undecoded = b""
    size = since_yield = 0
    # Counted after decompression, so a small gzip bomb is refused too.
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise FetchTooLargeError(endpoint.url, f"body larger than {limit} bytes")
        since_yield += len(chunk)
        data = undecoded + chunk if undecoded else chunk
        text, used = codecs.utf_8_decode(data, "replace", False)
        undecoded = data[used:]
        sink(text)
        # Nothing of this chunk is held while the next is awaited: at a peak every slot
        # waits so, and would hold a chunk and its text each.
        del chunk, data, text
        if since_yield >= _YIELD_EVERY:  # /healthz and other pages go on between pieces
            since_yield = 0
            await asyncio.sleep(0)
    sink(codecs.utf_8_decode(undecoded, "replace", True)[0])
