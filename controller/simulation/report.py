"""Run scenarios under ours and the baselines; print the score table; write JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.simulation.engine import Naive, Ours, Policy, Static, Trace, run, sim_settings
from controller.simulation.scenarios import SCENARIOS, Scenario
from controller.simulation.scores import Scores, score

FORECAST = {"forecast_horizon": 20.0}


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    scores: list[Scores]
    traces: dict[str, Trace]


def policies(scenario: Scenario, interval: float, overrides: Mapping[str, object]) -> list[Policy]:
    ours = Ours(sim_settings(scenario, interval, overrides))
    forecast = Ours(sim_settings(scenario, interval, {**FORECAST, **overrides}), "ours+forecast")
    return [ours, forecast, Naive(), Static()]


async def run_scenario(
    name: str,
    seed: int = 1,
    interval: float = 10.0,
    delay: float = 10.0,
    overrides: Mapping[str, object] | None = None,
    duration: float | None = None,
) -> Result:
    scenario = SCENARIOS[name]()
    if duration is not None:
        scenario = Scenario(**{**scenario.__dict__, "duration": duration})
    overrides = dict(overrides or {})
    settings = sim_settings(scenario, interval, overrides)
    detect = settings.health.failures_to_unhealthy
    scores, traces = [], {}
    for policy in policies(scenario, interval, overrides):
        trace = await run(scenario, policy, settings, seed, delay)
        traces[policy.name] = trace
        scores.append(score(policy.name, scenario, trace, interval, detect))
    return Result(scenario, scores, traces)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"
    return str(value)


COLUMNS = (
    ("policy", "policy"),
    ("recovery_s", "recover<80% s"),
    ("peak_kv", "peak KV"),
    ("overload_s", "overload s"),
    ("overload_cluster_s", "overload cluster-s"),
    ("mean_latency_s", "latency s"),
    ("dead_traffic_share", "to dead"),
    ("reversals_per_hour", "reversals/h"),
    ("writes_per_hour", "writes/h"),
    ("recovery_jump", "return jump"),
    ("unhealthy_alive_s", "unhealthy-alive s"),
)


def table(results: Sequence[Result]) -> str:
    lines: list[str] = []
    for result in results:
        lines.append(f"\n{result.scenario.name}: {result.scenario.description}")
        rows = [[title for _, title in COLUMNS]]
        for s in result.scores:
            row = s.row()
            row["peak_kv"] = max(row["peak_kv"].values())
            rows.append([_cell(row[key]) for key, _ in COLUMNS])
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        lines += [
            "  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows
        ]
    return "\n".join(lines)


def as_json(results: Sequence[Result]) -> dict[str, Any]:
    return {r.scenario.name: {s.policy: s.row() for s in r.scores} for r in results}
