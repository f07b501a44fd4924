"""Reading a page as the controller does, and as a reference does, and saying how they differ.

The conformance check (``tests/unit/test_conformance.py``, over ``../shared/conformance``) and
the differential fuzz (``tests/unit/test_fuzz_exposition.py``) share it. Each page is read by
our reader through ``PageStream``, with an extractor built for the names the reference found
(so every family of the page is a wanted one), and compared sample by sample.

What the comparison takes from the references, and why:
- A series repeated on a page is kept at its first sample, as a Prometheus scrape stores it
  (the parsers themselves hand every line on; the scrape loop keeps the first).
- ``le`` and ``quantile`` are compared as numbers: Prometheus normalises them (``"1"`` is
  ``"1.0"``).
- Samples the controller could never read are left out: a name that is not a classic metric
  name (``{"a.b"}``, UTF-8 names quoted inside the braces) and a value that is not a number
  (a native histogram): no family in ``controller/families.py`` is either.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import SupportsFloat

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from controller.errors import FetchError
from controller.exposition import OPENMETRICS, TEXT, Extractor, PageStream
from controller.sources.page import page_of

LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
NUMERIC_LABELS = ("le", "quantile")

# name, labels (sorted, le/quantile as numbers), value ("NaN" for NaN), timestamp in seconds
Row = tuple[str, tuple[tuple[str, str], ...], float | str, float | None]


class Verdict(StrEnum):
    AGREE = "agree"
    WRONG_VALUE = "wrong value"
    VALID_REFUSED = "valid refused"
    INVALID_ACCEPTED = "invalid accepted"


@dataclass(frozen=True)
class Read:
    """Our reading of a page: its rows, or why it was refused."""

    rows: list[Row] | None
    error: str | None = None


def _number_text(value: str) -> str:
    try:
        return repr(float(value))
    except ValueError:
        return value


def row(name: str, labels: dict[str, str], value: float, timestamp: float | None) -> Row:
    labelled = tuple(
        sorted((k, _number_text(v) if k in NUMERIC_LABELS else v) for k, v in labels.items())
    )
    number: float | str = "NaN" if math.isnan(value) else float(value)
    return name, labelled, number, None if timestamp is None else float(timestamp)


_LINE_NAME = re.compile(r"(?m)^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)")


def line_names(text: str) -> set[str]:
    """The names lines of ``text`` start with, unquoted."""
    return set(_LINE_NAME.findall(text))


def readable(name: str, value: object, names: set[str]) -> bool:
    """A sample the controller could read: a number for a value, and a classic name that
    some line starts with (``names``). The controller asks for text 0.0.4, in which a server
    never quotes a name (Prometheus 3 quotes names inside the braces only for a scraper that
    asks for ``escaping=allow-utf-8``), and a native histogram is no classic sample."""
    return LEGACY_NAME.match(name) is not None and isinstance(value, int | float) and name in names


def first_of_each(rows: Iterable[Row]) -> list[Row]:
    """Each series at its first sample, in page order."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    kept = []
    for found in rows:
        if (found[0], found[1]) not in seen:
            seen.add((found[0], found[1]))
            kept.append(found)
    return kept


def content_type(page_format: str) -> str:
    return OPENMETRICS if page_format == "openmetrics" else TEXT


def ours(text: str, page_format: str, names: Iterable[str], pieces: Sequence[int] = ()) -> Read:
    """Our reader over ``text`` (fed cut at ``pieces``), wanting ``names``."""
    stream = PageStream(Extractor(gauges=sorted(names)), content_type=content_type(page_format))
    cuts = [0, *sorted(pieces), len(text)]
    for start, end in itertools.pairwise(cuts):
        stream.feed(text[start:end])
    try:
        page = page_of("conformance", stream)
    except FetchError as exc:
        return Read(None, f"{exc.reason.value}: {exc.detail}")
    found = [row(s.name, s.labels, s.value, s.timestamp) for g in page.samples.values() for s in g]
    return Read(found)


def client_python(text: str, page_format: str) -> list[tuple[str, dict[str, str], object, object]]:
    """prometheus_client's parser for the format: every sample, as it gives them (raises
    where it refuses the page)."""
    parse = openmetrics_families if page_format == "openmetrics" else text_families
    return [
        (s.name, dict(s.labels), s.value, s.timestamp)
        for family in parse(text)
        for s in family.samples
    ]


def seconds(stamp: object) -> float | None:
    """A reference's timestamp (a float, or client_python's Timestamp) in seconds."""
    if stamp is None:
        return None
    assert isinstance(stamp, SupportsFloat)
    return float(stamp)


def reference_rows(
    samples: Iterable[tuple[str, dict[str, str], object, object]], text: str
) -> list[Row]:
    """What the controller would keep of a reference's samples (readable, first of each),
    each named as the wire names it (``wire_name``)."""
    names = line_names(text)
    rows = []
    for name, labels, value, stamp in samples:
        spelled = wire_name(name, names)
        if readable(spelled, value, names):
            assert isinstance(value, int | float)
            rows.append(row(spelled, labels, value, seconds(stamp)))
    return first_of_each(rows)


def wire_name(name: str, names: set[str]) -> str:
    """client_python names a text-format counter's samples ``x_total`` where the page writes
    ``x`` (its data model): compared by the name on the wire."""
    if name.endswith("_total") and name not in names and name.removesuffix("_total") in names:
        return name.removesuffix("_total")
    return name


def verdict(should_parse: bool, expected: list[Row] | None, got: Read) -> Verdict:
    """How our reading compares with a reference's: ``expected`` is what it reads (``None``
    where it gives no samples to compare with)."""
    if not should_parse:
        return Verdict.INVALID_ACCEPTED if got.rows is not None else Verdict.AGREE
    if got.rows is None:
        return Verdict.VALID_REFUSED
    if expected is not None and sorted(map(repr, got.rows)) != sorted(map(repr, expected)):
        return Verdict.WRONG_VALUE
    return Verdict.AGREE
