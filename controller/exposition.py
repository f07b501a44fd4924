"""Pure: Prometheus text exposition → samples of just the families we want.

A full parser (``prometheus_client.parser``) tokenises every line of a page; a vLLM page is
mostly families we never read. One regular expression finds the lines that start with a wanted
sample name, and only those lines are split into labels, value and timestamp. The semantics match
the text format (and ``prometheus_client.parser``, which the tests use as the reference):
escaped label values, optional millisecond timestamps, ``NaN``/``+Inf``/``-Inf``, spaces around
label separators, CRLF line ends, missing HELP/TYPE, OpenMetrics ``# EOF`` and exemplars.

prometheus-client >= 0.23 rewrites ``vllm:`` names to ``vllm_`` for OpenMetrics clients, so each
``vllm:`` name is also found under that spelling and reported under its canonical ``vllm:`` name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Extraction", "Extractor", "Sample", "parse_le"]

_LABELS_RE = re.compile(r'\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}')
_PAIR_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line. ``timestamp`` is in seconds (the page carries milliseconds)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class Extraction:
    """The wanted samples of a page, and how many wanted-looking lines could not be read."""

    samples: list[Sample] = field(default_factory=list)
    invalid_lines: int = 0
    first_error: str | None = None

    def by_name(self) -> dict[str, list[Sample]]:
        grouped: dict[str, list[Sample]] = {}
        for sample in self.samples:
            grouped.setdefault(sample.name, []).append(sample)
        return grouped


def _spellings(name: str) -> list[str]:
    if name.startswith("vllm:"):
        return [name, "vllm_" + name[len("vllm:") :]]
    return [name]


class Extractor:
    """Finds the samples of the given gauge and histogram families in a page.

    Build one per set of families and reuse it: the pattern is compiled once.
    """

    def __init__(self, gauges: Iterable[str] = (), histograms: Iterable[str] = ()) -> None:
        canonical: dict[str, str] = {}
        for family in gauges:
            for spelled in _spellings(family):
                canonical[spelled] = family
        for family in histograms:
            for suffix in ("_bucket", "_sum", "_count"):
                for spelled in _spellings(family):
                    canonical[spelled + suffix] = family + suffix
        self._canonical = canonical
        names = sorted(canonical, key=len, reverse=True)
        alternation = "|".join(re.escape(n) for n in names)
        self._line_re = re.compile(rf"^[ \t]*({alternation})(?=[{{ \t])([^\n]*)", re.MULTILINE)

    def extract(self, text: str) -> Extraction:
        result = Extraction()
        canonical = self._canonical
        for match in self._line_re.finditer(text):
            spelled, rest = match.group(1, 2)
            try:
                labels, value, timestamp = _parse_rest(rest)
            except ValueError as exc:
                result.invalid_lines += 1
                if result.first_error is None:
                    result.first_error = f"{spelled}: {exc}"
                continue
            result.samples.append(Sample(canonical[spelled], labels, value, timestamp))
        return result


def _parse_rest(rest: str) -> tuple[dict[str, str], float, float | None]:
    """``{labels} value [timestamp]`` → parts; raises ValueError for anything malformed."""
    rest = rest.strip()
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        found = _LABELS_RE.match(rest)
        if found is None:
            raise ValueError("unterminated label set")
        labels = _parse_labels(found.group(1))
        rest = rest[found.end() :]
    exemplar = rest.find(" # ")
    if exemplar >= 0:
        rest = rest[:exemplar]
    parts = rest.split()
    if not parts or len(parts) > 2:
        raise ValueError(f"expected 'value [timestamp]', got {rest!r}")
    value = _parse_number(parts[0])
    timestamp = _parse_number(parts[1]) / 1000 if len(parts) == 2 else None
    return labels, value, timestamp


def _parse_labels(body: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    end = len(body.rstrip(" \t"))
    while pos < end:
        pair = _PAIR_RE.match(body, pos)
        if pair is None:
            raise ValueError(f"bad label at {body[pos : pos + 20]!r}")
        name, value = pair.group(1, 2)
        if name in labels:
            raise ValueError(f"duplicate label {name!r}")
        labels[name] = _ESCAPE_RE.sub(_unescape, value) if "\\" in value else value
        pos = pair.end()
    return labels


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPE[match.group(0)]


def _parse_number(text: str) -> float:
    if "_" in text:  # float() accepts 1_000; the exposition format does not
        raise ValueError(f"invalid number {text!r}")
    return float(text)


def parse_le(text: str) -> float:
    """A histogram bound as a number, so ``"1"`` and ``"1.0"`` name the same bucket."""
    return float(text)
