"""structlog set-up: one format, one set of processors, secrets masked.

JSON when stdout is not a terminal, logfmt (``key=value``) when it is: the same keys either way —
``timestamp`` (RFC 3339, UTC), ``level``, ``event``, then the event's own (``tick``, ``target``,
``cluster``, ``reason``, ...), numbers as numbers. The standard library's loggers (aiohttp's
among them) go through the same processors, so an operator greps one format. Secrets are masked
before anything is rendered. Every event is listed in the event catalogue (manifests/RUNBOOKS.md).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from controller.errors import capped

_SECRET_KEYS = frozenset({"token", "authorization", "password", "bearer_token"})
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def mask_url(value: str) -> str:
    """A URL (or any text) with ``user:password@`` credentials masked."""
    return _URL_CREDENTIALS.sub("***@", value) if "://" in value else value


def redact(_: object, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask values of secret-looking keys and credentials embedded in URLs (also in lists)."""
    for key, value in event.items():
        if key.lower() in _SECRET_KEYS:
            event[key] = "***"
        elif isinstance(value, str):
            event[key] = mask_url(value)
        elif isinstance(value, list):
            event[key] = [mask_url(v) if isinstance(v, str) else v for v in value]
    return event


# No field of a log line renders longer than this (a list: this many items, each shorter),
# so no peer can make a line of megabytes; a traceback keeps its last frames. Sizes are of the
# text as JSON escapes it (a control character is six), so either renderer stays within them.
FIELD_MAX = 1024
ITEMS_MAX = 16
ITEM_MAX = 128
KEY_MAX = 64  # of a map's key (a ref's name): a map of ITEMS_MAX refs and their factors
TRACEBACK_MAX = 3072


def bound(_: object, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Cap every string field, and every list's and map's length and items (a map's keys
    too: a target's refs, by name), saying what was cut."""
    counts: dict[str, int] = {}
    for key, value in event.items():
        if isinstance(value, str):
            limit = TRACEBACK_MAX if key == "exception" else FIELD_MAX
            event[key] = _fit(value, limit, keep_end=key == "exception")
        elif isinstance(value, list | tuple | dict):
            event[key] = _items(value, depth=2)
            if isinstance(value, dict) and len(value) > ITEMS_MAX:
                # beside the map, not in it: a ref named "(more)" broke jq's '.weights_to|add'
                # and '.factors[]|.kv' (a review)
                counts[f"{key}_more"] = len(value) - ITEMS_MAX
    event.update(counts)
    return event


def _items(value: Any, depth: int) -> Any:
    """A list's or map's first ``ITEMS_MAX`` items, strings fitted to ``ITEM_MAX``, and one
    level of maps or lists inside (a ref's factors) capped alike; the count of the rest. A
    target of 64 refs of 253-character names wrote a 54 KB 'weights written' line, which
    container runtimes split (found by an attack)."""
    if isinstance(value, str):
        return _fit(value, ITEM_MAX)
    if not isinstance(value, list | tuple | dict):
        return value
    if depth <= 0:  # deeper still: as short text (a review: left whole, it was uncapped)
        return _fit(json.dumps(value, default=str), ITEM_MAX)
    more = len(value) - ITEMS_MAX
    if isinstance(value, dict):
        kept = itertools.islice(value.items(), ITEMS_MAX)
        capped_map: dict[str, Any] = {}
        for k, v in kept:
            # a long name's start and end (refs differ at either: llama-east, llama-west),
            # numbered where two cut alike
            key = k if len(k := str(k)) <= KEY_MAX else f"{k[: KEY_MAX // 2]}…{k[-KEY_MAX // 2 :]}"
            if key in capped_map:
                key = f"{key} ({len(capped_map) + 1})"
            capped_map[key] = _items(v, depth - 1)
        if more > 0 and depth < 2:  # a map inside: its count in it (a field's: beside it)
            capped_map["(more)"] = more
        return capped_map
    items = [_items(v, depth - 1) for v in value[:ITEMS_MAX]]
    if more > 0:
        items.append(f"(+{more} more)")
    return items


def _fit(text: str, limit: int, keep_end: bool = False) -> str:
    """``text`` capped so that it renders within ``limit`` characters once escaped."""
    if len(text) * 6 > limit:  # only a long text can escape past the limit
        escaped = len(json.dumps(text)) - 2
        if escaped > limit:
            limit = max(64, limit * len(text) // escaped)
    return capped(text, limit, keep_end)


def _compact_json(_: object, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """On the console, maps and lists as compact JSON (one logfmt value each), not Python repr."""
    for key, value in event.items():
        if isinstance(value, dict | list):
            event[key] = json.dumps(value, separators=(",", ":"), default=str)
    return event


def enabled(logger: Any, level: int) -> bool:
    """Whether ``logger`` writes lines at ``level`` (``configure``'s standard-library
    loggers say; structlog's default, before ``configure``, writes every level)."""
    check = getattr(logger, "isEnabledFor", None)
    return True if check is None else bool(check(level))


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderers: list[structlog.typing.Processor] = (
        [structlog.processors.JSONRenderer()]
        if use_json
        else [
            _compact_json,
            structlog.processors.LogfmtRenderer(
                key_order=["timestamp", "level", "event"], drop_missing=True, bool_as_flag=False
            ),
        ]
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact,
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            # bounded here, where ours and the standard library's lines meet
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                bound,
                *renderers,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every request at INFO; keep its warnings and errors only.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
