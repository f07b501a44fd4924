"""The real /metrics captures in ``../shared/fixtures`` (vLLM, GIE and llm-d-router EPPs).

They are other projects' data, kept beside the repository, not in it: a clone without
``../shared`` skips the checks that read them, saying why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
ABSENT = f"the real /metrics captures are other projects' data, kept in ../shared ({FIXTURES})"


def fixture_text(name: str) -> str:
    if not FIXTURES.is_dir():
        pytest.skip(ABSENT)
    return (FIXTURES / name).read_text(encoding="utf-8")


def fixture_names() -> list[Any]:
    """Every capture's name, for ``parametrize``: one skipped case when there are none here."""
    if not FIXTURES.is_dir():
        return [pytest.param("absent", marks=pytest.mark.skip(reason=ABSENT))]
    names = sorted(p.name for p in FIXTURES.glob("*.prom"))
    assert names, f"no fixtures found under {FIXTURES}"
    return names
