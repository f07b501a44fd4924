"""``simulate --plot``: weight in force, KV use and queue per cluster over time, one column per
policy, the same y-axes across columns, the scenario's events marked, and a dead cluster left
blank (not drawn at KV 0). matplotlib is an optional extra."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controller.simulation.engine import Trace
from controller.simulation.scenarios import Scenario

SMOOTH = 10.0  # seconds averaged for the KV and queue lines (the raw ones are a blur)


def plot(scenario: Scenario, traces: Mapping[str, Trace], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # an optional extra: say how to get it
        raise SystemExit(
            "plotting needs matplotlib: pip install 'weight-controller[plot]'"
        ) from exc
    shown = list(traces)
    fig, axes = plt.subplots(
        3, len(shown), figsize=(6 * len(shown), 8), sharex=True, sharey="row", squeeze=False
    )
    for column, policy in enumerate(shown):
        trace = traces[policy]
        minutes = [t / 60 for t in trace.seconds]
        weight_ax, kv_ax, queue_ax = (axes[row][column] for row in range(3))
        for name in trace.names:
            alive = trace.alive[name]
            weight_ax.plot(minutes, trace.effective[name], label=name)
            kv = _masked(_smooth(trace.kv[name], trace.dt), alive)
            queue = _masked(_smooth([float(q) for q in trace.waiting[name]], trace.dt), alive)
            kv_ax.plot(minutes, kv, label=name)
            queue_ax.plot(minutes, queue, label=name)
        marks = list(trace.events)
        if scenario.hot_from:
            marks.append((scenario.hot_from, f"{scenario.hot} offered more"))
        for at, note in marks:
            for ax in (weight_ax, kv_ax, queue_ax):
                ax.axvline(at / 60, color="grey", linestyle=":", linewidth=1)
            weight_ax.annotate(note, (at / 60, 98), fontsize=7, rotation=90, va="top")
        for at, _ in trace.published:
            weight_ax.axvline(at / 60, color="black", alpha=0.08, linewidth=0.6)
        weight_ax.set_title(f"{scenario.name} — {policy} ({len(trace.published)} writes)")
        _style(weight_ax, "weight in force", (0, 100))
        _style(kv_ax, f"KV use ({SMOOTH:g} s mean)", (0, 1.05))
        kv_ax.axhline(0.9, color="red", linestyle="--", linewidth=0.8)
        _style(queue_ax, "requests waiting", None)
        queue_ax.set_xlabel("minutes")
        weight_ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _smooth(values: list[float], dt: float) -> list[float]:
    width = max(1, int(SMOOTH / dt))
    out, running = [], 0.0
    for i, value in enumerate(values):
        running += value
        if i >= width:
            running -= values[i - width]
        out.append(running / min(i + 1, width))
    return out


def _masked(values: list[float], alive: list[bool]) -> list[float]:
    return [v if a else math.nan for v, a in zip(values, alive, strict=True)]


def _style(ax: Any, label: str, limits: tuple[float, float] | None) -> None:
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    if limits is not None:
        ax.set_ylim(*limits)
