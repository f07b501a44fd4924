"""structlog set-up: JSON when stdout is not a terminal, key=value when it is.

The standard library's loggers (aiohttp's among them) go through the same processors, so an
operator greps one format. Secrets are masked before anything is rendered.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

_SECRET_KEYS = frozenset({"token", "authorization", "password", "bearer_token"})
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def redact(_: object, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask values of secret-looking keys and credentials embedded in URLs."""
    for key, value in event.items():
        if key.lower() in _SECRET_KEYS:
            event[key] = "***"
        elif isinstance(value, str) and "://" in value:
            event[key] = _URL_CREDENTIALS.sub("***@", value)
    return event


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0, sort_keys=False)
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
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every request at INFO; keep its warnings and errors only.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
