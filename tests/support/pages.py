"""The real /metrics captures in ``../shared/fixtures`` (vLLM, GIE and llm-d-router EPPs)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def fixture_names() -> list[str]:
    names = sorted(p.name for p in FIXTURES.glob("*.prom"))
    assert names, f"no fixtures found under {FIXTURES}"
    return names
