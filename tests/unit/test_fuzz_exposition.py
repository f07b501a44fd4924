"""A seeded differential fuzz of the reader against prometheus_client's parsers: pages of both
formats, built from what each format allows (spacing, comments, HELP/TYPE in either order or
none, escapes, label order with ``le`` anywhere, every float spelling Go takes, timestamps,
repeated series), fed in pieces cut anywhere. Every page the reference reads must read the
same through ``PageStream`` (``tests/support/conformance.py`` says how rows compare)."""

from __future__ import annotations

import random

from tests.support.conformance import client_python, ours, reference_rows

PAGES = 20_000
SEED = 39

NAMES = ["vllm:kv_cache_usage_perc", "llm_d_epp_average_queue_size", "a", "b_c", "x:y_z"]
LABELS = ["engine", "model_name", "name", "pool", "le", "_x"]
TEXT_VALUES = ["0", "1", "-1", "3.5", "1e3", "1E-3", ".5", "5.", "007", "+Inf", "-Inf", "NaN"]
TEXT_VALUES += ["Inf", "inf", "+inf", "-inf", "Infinity", "1.7976931348623157e308", "4.9e-324"]
OM_VALUES = ["0", "1", "3.5", "1e3", "1E-3", "0.25", "+Inf", "NaN", "12345678901"]
BOUNDS = ["0.005", "0.5", "1", "1.0", "2.5", "1e1", "10"]
ESCAPES = [
    "plain",
    'q\\"uote',
    "back\\\\slash",
    "new\\nline",
    "b{r}ace",
    "com,ma",
    "é",
    "sp ace",
    "",
]


def _label_text(rng: random.Random, pairs: list[tuple[str, str]], om: bool) -> str:
    if not pairs and rng.random() < 0.5:
        return ""
    if om:
        return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
    blank = rng.choice(["", "", " ", "\t"])
    eq = rng.choice(["=", "=", " = "]) if rng.random() < 0.2 else "="
    body = ("," + blank).join(f"{k}{eq}{blank}" + f'"{v}"' for k, v in pairs)
    trailing = "," if pairs and rng.random() < 0.2 else ""
    return "{" + blank + body + trailing + "}"


def _pairs(rng: random.Random, bound: str | None) -> list[tuple[str, str]]:
    names = rng.sample([n for n in LABELS if n != "le"], rng.randint(0, 3))
    pairs = [(n, rng.choice(ESCAPES)) for n in names]
    if bound is not None:
        pairs.insert(rng.randint(0, len(pairs)), ("le", bound))  # le anywhere
    return pairs


def _value(rng: random.Random, om: bool, counting: bool) -> str:
    if counting:
        return rng.choice(["0", "1", "7", "42.5", "1e3"])
    return rng.choice(OM_VALUES if om else TEXT_VALUES)


def _stamp(rng: random.Random, om: bool) -> str:
    if rng.random() < 0.7:
        return ""
    if om:
        return " " + rng.choice(["1764860000", "1764860000.5", "0", "1.25e9"])
    return " " + str(rng.randint(-(10**12), 2 * 10**12))


def _family(rng: random.Random, om: bool) -> tuple[str, list[str]]:
    name = rng.choice(NAMES)
    kind = rng.choice(
        ["gauge", "counter", "histogram", "untyped"] if not om else ["gauge", "histogram"]
    )
    meta = [f"# TYPE {name} {kind}", f"# HELP {name} some help \\\\ with \\n escapes"]
    rng.shuffle(meta)
    lines = meta if om or rng.random() < 0.7 else meta[: rng.randint(0, 1)]
    for _ in range(rng.randint(1, 3)):
        if kind == "histogram":
            pairs = _pairs(rng, None)
            bounds = sorted(set(rng.sample(BOUNDS, rng.randint(1, 3))), key=float)
            if om:  # OpenMetrics: each bound once, ascending, numbers as written
                bounds = sorted({str(float(b)) for b in bounds}, key=float)
            for count, bound in enumerate([*bounds, "+Inf"]):
                labels = _label_text(rng, _pairs_with(rng, pairs, bound), om)
                lines.append(f"{name}_bucket{labels} {count}{_stamp(rng, om)}")
            labels = _label_text(rng, pairs, om)
            lines.append(f"{name}_count{labels} {len(bounds)}")
            lines.append(f"{name}_sum{labels} {_value(rng, om, True)}")
        else:
            labels = _label_text(rng, _pairs(rng, None), om)
            lines.append(f"{name}{labels} {_value(rng, om, False)}{_stamp(rng, om)}")
        if not om and rng.random() < 0.1:
            lines.append(lines[-1].replace(" ", "  ", 1) if rng.random() < 0.5 else lines[-1])
        if not om and rng.random() < 0.1:
            lines.append(rng.choice(["", "# a comment", "#", "# TYPE", "  "]))
    return name, lines


def _pairs_with(
    rng: random.Random, pairs: list[tuple[str, str]], bound: str
) -> list[tuple[str, str]]:
    placed = list(pairs)
    placed.insert(rng.randint(0, len(placed)), ("le", bound))
    return placed


def page(rng: random.Random) -> tuple[str, str]:
    om = rng.random() < 0.4
    used: set[str] = set()
    lines: list[str] = []
    for _ in range(rng.randint(1, 3)):
        name, family = _family(rng, om)
        if om and name in used:  # OpenMetrics: a family once per page
            continue
        used.add(name)
        lines += family
    if om:
        lines.append("# EOF")
    return "\n".join(lines) + "\n", "openmetrics" if om else "text"


def test_the_reader_agrees_with_client_python_on_seeded_pages() -> None:
    rng = random.Random(SEED)
    compared = refused_by_reference = 0
    while compared < PAGES:
        text, page_format = page(rng)
        try:
            reference = reference_rows(client_python(text, page_format), text)
        except Exception:  # a page the reference refuses is not compared
            refused_by_reference += 1
            assert refused_by_reference < PAGES // 2, "the generator makes mostly invalid pages"
            continue
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 4))))
        got = ours(text, page_format, {r[0] for r in reference}, cuts)
        assert got.error is None, (text, page_format, got.error)
        assert sorted(map(repr, got.rows or [])) == sorted(map(repr, reference)), (text, cuts)
        compared += 1
