"""Durations as settings take them, and the defaults other settings are derived from.

``500ms``, ``10s``, ``2m``, ``1h`` or a bare number of seconds. The defaults here are read
by the schema (as field defaults) and by the cross-field checks (on raw, unvalidated data), so
each is written once.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field

INTERVAL = 10.0
"""Reconcile period: fast enough to follow KV pressure, slow enough that a weight change shows
in the next scrape."""

SCRAPE_TIMEOUT = 3.0
"""Per-request timeout: well under the interval so a slow pod cannot stall a tick (and at most
half the interval when the interval is shorter)."""

MAX_STALENESS = 60.0
"""Data older than this is stale: a minute of a 10 s interval is six ticks without news."""

STALE_INTERVALS = 3
"""Unset, max_staleness is at least this many intervals (it must be longer than one)."""


def default_staleness(interval: float) -> float:
    """``health.max_staleness`` where it is not set: a minute, or three intervals when that
    is longer (a reading held through a failed fetch is an interval old)."""
    return max(MAX_STALENESS, STALE_INTERVALS * interval)


API_TIMEOUT = 5.0
"""Per Kubernetes API call: a server slower than this counts as down."""

RENEW_DEADLINE, RETRY_PERIOD = 10.0, 2.0
"""Leader election: the leader stops writing when it could not renew for ``RENEW_DEADLINE``;
it renews every ``RETRY_PERIOD``."""

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> object:
    """``"500ms"`` → 0.5; numbers pass through as seconds; anything else is left to fail."""
    if isinstance(value, bool):  # YAML's on/yes/true: no number of seconds (pydantic reads 1)
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 10s, 2m)")
    if isinstance(value, str):
        found = _DURATION_RE.match(value)
        if found is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 10s, 2m)")
        return float(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, allow_inf_nan=False)]
"""Seconds, written as ``10s``/``500ms``/``2m`` or a number."""

DurationOrZero = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, allow_inf_nan=False)]
"""A ``Duration`` where 0 means off, written as any duration is (``0``, ``"0"``, ``0s``): a
``Duration | Literal[0]`` refused the string forms, the environment's only one (found by an
attack), and took ``false`` for 0."""


def seconds(value: object) -> float | None:
    """``value`` as a positive number of seconds, or ``None`` if it is not one (lenient: for
    checks that run on raw data, beside the field errors)."""
    try:
        parsed = parse_duration(value)
    except ValueError:
        return None
    if isinstance(parsed, int | float) and not isinstance(parsed, bool) and parsed > 0:
        return float(parsed)
    return None
