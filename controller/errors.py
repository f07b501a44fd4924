"""Our error tree. Library errors are translated at the boundary (``raise ... from exc``).

WeightControllerError
├── ConfigError            bad settings; the CLI exits 2
└── FetchError             one answer (a page, a PromQL query) could not be fetched or
    │                      read into samples; carries a Reason
    ├── FetchTimeoutError
    ├── FetchConnectError
    │   ├── FetchRefusedError
    │   └── FetchForbiddenAddressError
    ├── FetchHTTPStatusError
    ├── FetchTruncatedError
    ├── FetchAuthError
    ├── FetchRedirectError
    ├── FetchTooLargeError
    ├── FetchTooManySamplesError
    ├── FetchContentTypeError
    └── FetchParseError
"""

from __future__ import annotations

from controller.model import Reason


class WeightControllerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(WeightControllerError):
    """The settings are invalid; ``lines`` holds one ``field: reason`` per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


# What one peer's answer may cost us in an error's detail: a hostile answer (3 MB where a
# sample value belongs) was copied into every cluster's error and the log whole.
DETAIL_MAX = 1024


def printable(text: str, instead: str = " ") -> str:
    """``text`` with every character that is not printable (a control character, an escape
    sequence's ESC, a newline) as ``instead``: what a peer or a tenant wrote, made safe for
    one line of a log or a terminal."""
    return "".join(c if c.isprintable() else instead for c in text)


def capped(text: str, limit: int, keep_end: bool = False) -> str:
    """``text`` at most ``limit`` characters, saying how much was cut (and where: its head,
    or with ``keep_end`` its tail, as a traceback's last frames are what matter)."""
    if len(text) <= limit:
        return text
    room = max(0, limit - 40)  # what the note takes
    kept, cut = (text[-room:], text[:-room]) if keep_end else (text[:room], text[room:])
    note = f"… ({len(cut.encode('utf-8', 'replace'))} more bytes cut)"
    return note + kept if keep_end else kept + note


class FetchError(WeightControllerError):
    """An answer (a metrics page, a PromQL query) could not be fetched or read: what a
    ``ClusterMetricsSource.fetch`` turns into the cluster's errors. ``reason`` feeds health
    and the error counter; ``detail`` is capped (``DETAIL_MAX``), whatever the peer sent."""

    reason: Reason = Reason.PARSE

    def __init__(self, url: str, detail: str) -> None:
        detail = capped(detail, DETAIL_MAX)
        super().__init__(f"{url}: {detail}")
        self.url = url
        self.detail = detail


class FetchTimeoutError(FetchError):
    reason = Reason.TIMEOUT


class FetchConnectError(FetchError):
    reason = Reason.CONNECT


class FetchRefusedError(FetchConnectError):
    """The connection was refused: the host is there and nothing listens on the port (the
    server process is gone), unlike a timeout, which may be a slow network."""

    reason = Reason.REFUSED


class FetchForbiddenAddressError(FetchConnectError):
    """A name from annotations resolved only to addresses it may not be dialled at
    (``sources.dns.GuardedResolver``): nothing was sent."""

    reason = Reason.FORBIDDEN_ADDRESS


class FetchHTTPStatusError(FetchError):
    reason = Reason.HTTP_STATUS


class FetchTruncatedError(FetchError):
    """A body that ended early: empty, cut mid-line, or a gzip stream that stopped. Never
    read as values (``…usage_perc 0.`` cut from ``0.97`` would be a lie)."""

    reason = Reason.TRUNCATED


class FetchAuthError(FetchError):
    """The token could not be read, or the endpoint refused it (401/403)."""

    reason = Reason.AUTH


class FetchRedirectError(FetchError):
    """A 3xx: never followed (a redirect could point anywhere, the API server included)."""

    reason = Reason.REDIRECT


class FetchTooLargeError(FetchError):
    reason = Reason.TOO_LARGE


class FetchTooManySamplesError(FetchError):
    reason = Reason.TOO_MANY_SAMPLES


class FetchParseError(FetchError):
    reason = Reason.PARSE


class FetchContentTypeError(FetchError):
    """The answer is not a metrics format (its ``Content-Type``), or its body contradicts the
    format it was served as (OpenMetrics without ``# EOF``): named, never read by a guess at
    what was meant."""

    reason = Reason.CONTENT_TYPE
