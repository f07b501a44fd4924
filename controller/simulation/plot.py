"""``simulate --plot``: weight, KV and latency per cluster over time (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.simulation.report import Result


def plot(result: Result, path: Path, policies: tuple[str, ...] = ("ours", "naive")) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # an optional extra: say how to get it
        raise SystemExit(
            "plotting needs matplotlib: pip install 'weight-controller[plot]'"
        ) from exc
    shown = [p for p in policies if p in result.traces]
    fig, axes = plt.subplots(3, len(shown), figsize=(7 * len(shown), 9), sharex=True, squeeze=False)
    for column, policy in enumerate(shown):
        trace = result.traces[policy]
        minutes = [t / 60 for t in trace.seconds]
        weight_ax, kv_ax, latency_ax = (axes[row][column] for row in range(3))
        for name in trace.names:
            weight_ax.plot(minutes, trace.effective[name], label=name)
            kv_ax.plot(minutes, trace.kv[name], label=name)
            latency_ax.plot(minutes, trace.latency[name], label=name)
        weight_ax.set_title(f"{result.scenario.name} — {policy}")
        _style(weight_ax, "weight in force", (0, 100))
        _style(kv_ax, "KV-cache use", (0, 1.05))
        kv_ax.axhline(0.9, color="red", linestyle="--", linewidth=0.8)
        _style(latency_ax, "latency (s)", None)
        latency_ax.set_xlabel("minutes")
        weight_ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _style(ax: Any, label: str, limits: tuple[float, float] | None) -> None:
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    if limits is not None:
        ax.set_ylim(*limits)
