"""Run scenarios × policies × seeds; print medians and worst cases; write JSON.

Runs are independent, so ``run_all`` spreads them over processes (one per core).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any, TextIO

from controller.settings import Settings, build_settings
from controller.simulation.engine import Trace, run
from controller.simulation.policies import (
    Naive,
    Oracle,
    Ours,
    PodsOnly,
    Policy,
    Proportional,
    Seen,
    SeenCapped,
    Static,
)
from controller.simulation.scenarios import SCENARIOS, Scenario
from controller.simulation.scores import Scores, score
from controller.simulation.world import epp_url, pod_urls

POLICIES = ("ours", "integral", "proportional", "naive", "static", "oracle")
EXTRA_POLICIES = ("pods", "seen", "seen-capped")  # on request only (--policies)
SEEDS = (1, 2, 3, 4, 5)
# Where a lower value is better the worst case is the highest; these are reported as max.
COLUMNS = (
    ("overload_cluster_s", "overload cl-s"),
    ("ttft_p99_s", "TTFT p99 s"),
    ("e2e_p99_s", "e2e p99 s"),
    ("queued_s", "queued req-s"),
    ("lost", "lost"),
    ("writes_per_hour", "writes/h"),
    ("reversals_per_hour", "reversals/h"),
    ("largest_step", "max step"),
    ("recovery_s", "recover<80% s"),
    ("dead_share", "to dead"),
    ("return_step", "return step"),
)


@dataclass(frozen=True)
class Job:
    scenario: str
    policy: str
    seed: int
    interval: float = 10.0
    delay: float = 10.0
    overrides: tuple[tuple[str, object], ...] = ()
    duration: float | None = None


@dataclass(frozen=True)
class Outcome:
    job: Job
    scores: Scores
    trace: Trace | None


def sim_settings(scenario: Scenario, interval: float, overrides: Mapping[str, object]) -> Settings:
    """Settings for ``scenario``'s clusters: the shipped defaults plus ``overrides``."""
    clusters = [
        {"name": c.name, "epp_url": epp_url(c.name)}
        if c.read == "epp"
        else {"name": c.name, "vllm_urls": pod_urls(c)}
        for c in scenario.clusters
    ]
    return build_settings(
        {
            "interval": interval,
            "clusters": clusters,
            "scrape": {"timeout": interval / 2},
            "weights": dict(overrides),
        },
        environment=False,
    )


def make_policy(name: str, settings: Settings, scenario: Scenario) -> Policy:
    if name == "ours":
        return Ours(settings)
    if name == "integral":
        law = settings.weights.model_copy(update={"law": "integral"})
        return Ours(settings.model_copy(update={"weights": law}), "integral")
    if name == "proportional":
        return Proportional(settings)
    if name == "naive":
        return Naive(settings)
    if name == "static":
        return Static()
    if name == "oracle":
        return Oracle(scenario)
    if name == "pods":
        return PodsOnly(settings)
    if name == "seen":
        return Seen(scenario, settings.weights.pressure)
    if name == "seen-capped":
        w = settings.weights
        return SeenCapped(scenario, w.pressure, w.max_step, settings.settle)
    known = ", ".join((*POLICIES, *EXTRA_POLICIES))
    raise ValueError(f"unknown policy {name!r}; known: {known}")


def scenario_of(job: Job) -> Scenario:
    scenario = SCENARIOS[job.scenario]()
    if job.duration is not None:
        scenario = replace(scenario, duration=job.duration)
    return scenario


async def run_job(job: Job, keep_trace: bool = False) -> Outcome:
    scenario = scenario_of(job)
    delay = scenario.delay if scenario.delay is not None else job.delay
    settings = sim_settings(scenario, job.interval, dict(job.overrides))
    policy = make_policy(job.policy, settings, scenario)
    trace = await run(scenario, policy, settings, job.seed, delay)
    detect = settings.health.failures_to_unhealthy
    scores = score(job.policy, scenario, trace, job.interval, detect, delay)
    return Outcome(job, scores, trace if keep_trace else None)


def _run_in_process(job: Job) -> Outcome:
    """One run in a worker process: its logs quiet, its own loop."""
    from controller import logs

    logs.configure("critical", "console", sys.stderr)
    return asyncio.run(run_job(job))


def run_all(
    jobs: Sequence[Job],
    workers: int | None = None,
    progress: TextIO | None = None,
) -> list[Outcome]:
    """Every job, in order, over ``workers`` processes (default: one per core)."""
    workers = workers or os.cpu_count() or 1
    results: dict[Job, Outcome] = {}
    if workers == 1:
        for i, job in enumerate(jobs, 1):
            results[job] = asyncio.run(run_job(job))
            _progress(progress, i, len(jobs), job)
        return [results[j] for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_in_process, job): job for job in jobs}
        for i, future in enumerate(as_completed(futures), 1):
            job = futures[future]
            results[job] = future.result()
            _progress(progress, i, len(jobs), job)
    return [results[j] for j in jobs]


def _progress(out: TextIO | None, done: int, total: int, job: Job) -> None:
    if out is not None:
        print(f"[{done}/{total}] {job.scenario} {job.policy} seed {job.seed}", file=out, flush=True)


@dataclass(frozen=True)
class Summary:
    """One scenario × policy over its seeds: median and worst of every score."""

    scenario: str
    policy: str
    median: dict[str, float | None]
    worst: dict[str, float | None]
    seeds: int


def summarise(outcomes: Sequence[Outcome]) -> list[Summary]:
    groups: dict[tuple[str, str], list[Scores]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.job.scenario, outcome.job.policy), []).append(outcome.scores)
    summaries = []
    for (scenario, policy), scores in groups.items():
        median: dict[str, float | None] = {}
        worst: dict[str, float | None] = {}
        for key, _ in COLUMNS:
            values = [getattr(s, key) for s in scores]
            known = [float(v) for v in values if v is not None]
            median[key] = statistics.median(known) if known else None
            worst[key] = max(known) if known else None
        summaries.append(Summary(scenario, policy, median, worst, len(scores)))
    return summaries


def _cell(median: float | None, worst: float | None) -> str:
    if median is None:
        return "-"
    text = _number(median)
    return text if worst is None or worst == median else f"{text} ({_number(worst)})"


def _number(value: float) -> str:
    if value % 1 == 0:
        return f"{value:.0f}"
    return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1 else f"{value:.1f}"


def table(summaries: Sequence[Summary], markdown: bool = False) -> str:
    """One block per scenario: median over seeds, worst in brackets."""
    lines: list[str] = []
    by_scenario: dict[str, list[Summary]] = {}
    for s in summaries:
        by_scenario.setdefault(s.scenario, []).append(s)
    for name, rows in by_scenario.items():
        scenario = SCENARIOS[name]()
        seeds = rows[0].seeds
        lines.append(f"\n{name}: {scenario.description} ({seeds} seeds: median (worst))")
        cells = [["policy", *(title for _, title in COLUMNS)]]
        for s in rows:
            cells.append([s.policy, *(_cell(s.median[k], s.worst[k]) for k, _ in COLUMNS)])
        if markdown:
            lines.append("")
            lines.append("| " + " | ".join(cells[0]) + " |")
            lines.append("|" + "---|" * len(cells[0]))
            lines += ["| " + " | ".join(r) + " |" for r in cells[1:]]
            continue
        widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
        lines += [
            "  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells
        ]
    return "\n".join(lines)


def as_json(summaries: Sequence[Summary]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in summaries:
        out.setdefault(s.scenario, {})[s.policy] = {
            "median": s.median,
            "worst": s.worst,
            "seeds": s.seeds,
        }
    return out


def jobs_for(
    scenarios: Sequence[str],
    policies: Sequence[str] = POLICIES,
    seeds: Sequence[int] = SEEDS,
    **common: Any,
) -> list[Job]:
    return [Job(s, p, seed, **common) for s in scenarios for p in policies for seed in seeds]
