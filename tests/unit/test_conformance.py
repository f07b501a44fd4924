"""The reader held to parser suites other people wrote: the OpenMetrics project's test pages,
Prometheus's text and OpenMetrics parser tests, and prometheus/client_python's parser tests,
as extracted into ``../shared/conformance`` (its README says from where, at which commit).

Every case is read through ``PageStream`` as a scrape reads it (served as its format's
Content-Type), wanting every family the reference finds on the page, and classified against
the case's stated expectation and against prometheus_client's parser for the format:
agree, wrong value, valid refused, invalid accepted. Wrong values and valid pages refused must
be none; invalid pages accepted are counted, not failed: the reader reads only the lines it
wants and refuses a page only where a wanted line cannot be read.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.conformance import (
    Row,
    Verdict,
    client_python,
    line_names,
    ours,
    reference_rows,
    verdict,
)

CONFORMANCE = Path(__file__).resolve().parents[3] / "shared" / "conformance"
SUITES = {"openmetrics.json": 211, "prometheus_textparse.json": 113, "client_python.json": 293}

pytestmark = pytest.mark.skipif(
    not CONFORMANCE.is_dir(),
    reason=f"the conformance cases are other projects' data, kept in ../shared ({CONFORMANCE})",
)


def cases(suite: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads((CONFORMANCE / suite).read_text())["cases"]
    return loaded


def page_text(case: dict[str, Any]) -> str:
    if "page" in case:
        text: str = case["page"]
        return text
    return base64.b64decode(case["page_b64"]).decode("utf-8", errors="replace")


def variants(case: dict[str, Any]) -> list[str]:
    """Prometheus's text parser appends a newline to its input, so its text-format tests give
    pages without one: each such page is read as given and with the newline."""
    text = page_text(case)
    if case["id"].startswith("prom/") and case["format"] == "text" and not text.endswith("\n"):
        return [text, text + "\n"]
    return [text]


def stated(case: dict[str, Any], text: str) -> list[Row] | None:
    """The case's own expected samples (``timestamp_ms`` or ``timestamp_s``; a value may be
    written "+Inf"), as the controller would keep them."""
    if "expected" not in case:
        return None
    samples = []
    for sample in case["expected"]:
        value = sample["value"]
        if isinstance(value, str) and value.lower().lstrip("+-") in ("inf", "nan"):
            value = float(value)
        stamp = sample.get("timestamp_s")
        if sample.get("timestamp_ms") is not None:
            stamp = sample["timestamp_ms"] / 1000
        samples.append((sample["name"], sample["labels"], value, stamp))
    return reference_rows(samples, text)


def referenced(case: dict[str, Any], text: str) -> list[Row] | None:
    """prometheus_client's reading of the page (``None`` where it refuses it)."""
    try:
        samples = client_python(text, case["format"])
    except Exception:  # its parsers raise ValueError and others on a page they refuse
        return None
    return reference_rows(samples, text)


def wanted(text: str, *readings: list[Row] | None) -> set[str]:
    """The families to want: those a reference read, else every name a line starts with."""
    names = {found[0] for reading in readings if reading for found in reading}
    return names or line_names(text)


def classify(suite: str) -> tuple[Counter[str], list[str]]:
    """Each case (and variant) against its expectation and against prometheus_client."""
    tally: Counter[str] = Counter()
    wrong: list[str] = []
    for case in cases(suite):
        for text in variants(case):
            expected, reference = stated(case, text), referenced(case, text)
            got = ours(text, case["format"], wanted(text, expected, reference))
            against = {"stated": expected}
            if reference is not None or not case["should_parse"]:
                against["client_python"] = reference
            for who, rows in against.items():
                found = verdict(case["should_parse"], rows, got)
                tally[f"{who}: {found.value}"] += 1
                if found is Verdict.AGREE and got.rows is not None and rows:
                    tally[f"{who}: samples compared"] += len(rows)
                if found in (Verdict.WRONG_VALUE, Verdict.VALID_REFUSED):
                    wrong.append(f"{case['id']} vs {who}: {found.value} ({got.error or got.rows})")
    return tally, wrong


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_case_reads_as_the_references_read_it(suite: str) -> None:
    assert len(cases(suite)) == SUITES[suite]  # the whole suite, not a part of it
    tally, wrong = classify(suite)
    assert not wrong, "\n".join(wrong)
    # not agreement on empty readings: the references' samples were compared with ours
    assert tally["client_python: samples compared"] > 0, tally


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in (CONFORMANCE / "prometheus_testdata").glob("*.txt"))
    if CONFORMANCE.is_dir()
    else ["(none)"],
)
def test_real_pages_of_prometheus_read_as_client_python_reads_them(name: str) -> None:
    """Prometheus's parser benchmark pages: 237 families of a real Prometheus /metrics, with
    and without HELP/TYPE, and OpenMetrics pages: every family wanted at once."""
    text = (CONFORMANCE / "prometheus_testdata" / name).read_text(encoding="utf-8")
    page_format = "openmetrics" if name.endswith(".om.txt") else "text"
    reference = referenced({"format": page_format}, text)
    if reference is None:
        # client_python's OpenMetrics parser refuses alltypes.5mfs.om.txt for a negative
        # histogram sum (Prometheus reads it). Its text parser reads the same samples, but
        # takes an exemplar's timestamp for the sample's: the page's samples carry none.
        reference = [(*found[:3], None) for found in referenced({"format": "text"}, text) or []]
    assert reference, name
    got = ours(text, page_format, {found[0] for found in reference})
    assert got.error is None
    assert sorted(map(repr, got.rows or [])) == sorted(map(repr, reference))
