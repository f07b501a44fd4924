"""What a replayed tick costs (#43), without the querier's own time: a history of 20 clusters
read through one hub querier, replayed by ``controller.replay.run`` itself
(``answers.cluster_metrics`` for each cluster, the closed loop's response, then
``testing.Driver.tick``: the real Reconciler), and reading the querier's range answers as
``Querier.history`` reads them (``prometheus.range_answers``: the JSON as Prometheus writes
it, one body per query, into each tick's answers), timed apart in the same rounds. Its floor,
on the same inputs in the same run: the pure stages alone (``health.judge``,
``signals.remember`` and ``derive``, ``weights.weigh``), with no loop around them.

    python benchmarks/bench_replay.py [--clusters 20] [--ticks 3000]

The pure stages are given the inputs replay gave them: their calls are recorded from one
replay (each call of ``health.judge``, ``signals.remember``, ``signals.derive`` and
``weights.weigh`` with its arguments: the metrics as the closed loop moved them, the weights
in force, the realised shares, whether the target was settling), then made again, alone, in
the timed rounds. Until 2026-12-06 the floor weighed a target whose weights never moved and
had no realised shares on the unmoved answers, which skips work the law does in replay (its
fair shares at rest); that floor is still printed.

Prints ms per replayed tick and per tick of reading the answers, ms per tick of the pure
stages, the ratios (#43: at most 3×) and the time a week at a 10 s interval (60,480 ticks)
would take at that rate (#43: at most 60 s), with the reading and without it. Until
2026-12-07 the reading was not timed (the answers were held as ``Querier.history`` hands them
over): it is our work, not the querier's.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller import health, signals, weights  # noqa: E402
from controller.app import settle_collector  # noqa: E402
from controller.logs import configure  # noqa: E402
from controller.model import (  # noqa: E402
    IMPLICIT_TARGET,
    ClusterHealth,
    ClusterMetrics,
    Ref,
    Signals,
    Target,
)
from controller.replay import History, recorded_split, run  # noqa: E402
from controller.settings import Settings, build_settings  # noqa: E402
from controller.signals import SignalMemory  # noqa: E402
from controller.sources.answers import Answers, Asked, cluster_metrics  # noqa: E402
from controller.sources.prometheus import range_answers  # noqa: E402

STEP = 10.0
WEEK = 7 * 24 * 3600 / STEP


def history(clusters: list[str], ticks: int, seed: int = 0) -> list[Answers]:
    """Each tick's answers as the hub querier splits them: KV drifting, one cluster hot now
    and then, pools, pods, queue and requests."""
    rng = random.Random(seed)
    found: list[Answers] = []
    for tick in range(ticks):
        hot = clusters[(tick // 360) % len(clusters)] if tick % 720 < 120 else None
        kv = {
            c: (0.95 if c == hot else 0.3 + 0.1 * math.sin(tick / 50 + i))
            for i, c in enumerate(clusters)
        }
        kv = {c: min(1.0, max(0.0, v + rng.uniform(-0.02, 0.02))) for c, v in kv.items()}
        stamp = tick * STEP
        found.append(
            {
                "kv_mean": kv,
                "kv_max": {c: min(1.0, v + 0.03) for c, v in kv.items()},
                "kv_oldest": dict.fromkeys(clusters, stamp - 5),
                "pods": dict.fromkeys(clusters, 4.0),
                "kv_pools": dict.fromkeys(clusters, 4 * 8192 * 16.0),
                "kv_pool_pods": dict.fromkeys(clusters, 4.0),
                "kv_tokens": {},
                "kv_token_pods": {},
                "queue": {c: (12.0 if c == hot else 0.0) for c in clusters},
                "running": dict.fromkeys(clusters, 8.0),
                "latency_requests": dict.fromkeys(clusters, 600.0),
                "p50": dict.fromkeys(clusters, 1.2),
                "p90": dict.fromkeys(clusters, 2.5),
            }
        )
    return found


def bodies(clusters: list[str], answers: list[Answers]) -> dict[str, str]:
    """Each query's range answer over the ticks as Prometheus writes it (a matrix: a series
    per cluster, ``[time, "value"]`` pairs; the pool query's series carry its pool labels)."""
    import json

    found: dict[str, str] = {}
    for name in answers[0]:
        if name in ("kv_pool_pods", "kv_token_pods"):  # read off the pool queries, not asked
            continue
        result = []
        for cluster in clusters:
            points = [
                [tick * STEP, repr(value)]
                for tick, at in enumerate(answers)
                if isinstance(numbers := at[name], dict)
                and (value := numbers.get(cluster)) is not None
            ]
            if not points:
                continue
            if name != "kv_pools":
                result.append({"metric": {"cluster": cluster}, "values": points})
                continue
            for pod in range(4):  # a series per pod and pool, each holding one engine
                pool = {"cluster": cluster, "pod": f"p{pod}", "num_gpu_blocks": "8192"}
                ones = [[when, "1"] for when, _ in points]
                result.append({"metric": pool | {"block_size": "16"}, "values": ones})
        answer = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        found[name] = json.dumps(answer)
    return found


def reading(found: dict[str, str], ticks: int) -> float:
    """Seconds to read the range answers into each tick's answers, as ``Querier.history``
    reads a chunk."""
    times = [tick * STEP for tick in range(ticks)]
    began = time.perf_counter()
    answers: dict[float, Answers] = {t: {} for t in times}
    for name, body in found.items():
        read = range_answers(name, body, times, "cluster", "http://hub/api/v1/query_range")
        for t in times:
            answers[t].update(read[t])
    return time.perf_counter() - began


def asked(cluster: str) -> Asked:
    return Asked("http://hub/api/v1/query", "cluster", cluster, {"kv_mean": "…"}, 60.0, 1.0)


async def replayed(settings: Settings, clusters: list[str], answers: list[Answers]) -> float:
    """Seconds for ``replay.run`` over ``answers``, as ``replay`` runs by default: the recorded
    load moved with the replayed weights (``Response``, the even split recorded), each tick's
    answers read into metrics, the loop without its journal, the summary kept."""
    times = [tick * STEP for tick in range(len(answers))]
    read = dict(zip(times, answers, strict=True))
    history = History(
        times[0], times[-1], times, dict.fromkeys(clusters, read), {c: asked(c) for c in clusters}
    )
    response = recorded_split(None, clusters)
    began = time.perf_counter()
    await run(settings, history, None, response)
    return time.perf_counter() - began


def pure(settings: Settings, clusters: list[str], answers: list[Answers]) -> float:
    """The floor until 2026-12-06, still printed: the pure stages alone on the answers as
    recorded (not as the closed loop moved them), each cluster judged and remembered, its
    signals derived, and a target whose weights never move weighed with no realised shares."""
    who = {c: asked(c) for c in clusters}
    refs = tuple(Ref("", "", c, 100 // len(clusters), c) for c in clusters)
    target = Target(IMPLICIT_TARGET, "", IMPLICIT_TARGET, "", "", refs)
    states: dict[str, ClusterHealth] = {}
    memory: dict[str, SignalMemory] = {}
    inputs_at: list[dict[str, ClusterMetrics]] = []
    previous: float | None = None
    for tick, at_tick in enumerate(answers):  # the inputs, made before the clock starts
        at = tick * STEP
        inputs_at.append(
            {c: cluster_metrics(c, at_tick, who[c], at, 0.0, previous) for c in clusters}
        )
        previous = at
    health_settings = settings.health
    params = settings.weights
    began = time.perf_counter()
    for tick, metrics in enumerate(inputs_at):
        at = tick * STEP
        inputs: dict[str, Signals | None] = {}
        for c in clusters:
            after = health.judge(states.get(c), metrics[c], health_settings, at)
            states[c] = after
            memory[c] = signals.remember(memory.get(c), metrics[c], after, params.demand_smoothing)
            inputs[c] = signals.derive(after, memory[c], params)
        weights.weigh(target, inputs, params, False)
    return time.perf_counter() - began


Call = tuple[Callable[..., object], tuple[object, ...], dict[str, object]]
STAGES = ((health, "judge"), (signals, "remember"), (signals, "derive"), (weights, "weigh"))


def recorded(settings: Settings, clusters: list[str], answers: list[Answers]) -> list[Call]:
    """Every call replay makes of the pure stages over ``answers``, with its arguments, in
    order (each stage's module attribute wrapped for one untimed replay, then restored)."""
    calls: list[Call] = []
    originals = [(module, name, getattr(module, name)) for module, name in STAGES]

    def recording(stage: Callable[..., object]) -> Callable[..., object]:
        def record(*args: object, **kwargs: object) -> object:
            calls.append((stage, args, kwargs))
            return stage(*args, **kwargs)

        return record

    try:
        for module, name, stage in originals:
            setattr(module, name, recording(stage))
        asyncio.run(replayed(settings, clusters, answers))
    finally:
        for module, name, stage in originals:
            setattr(module, name, stage)
    # a stage called by another name than its module's would be missed, and the floor too low
    assert {stage.__name__ for stage, _, _ in calls} == {name for _, name in STAGES}
    return calls


def pure_as_replayed(calls: list[Call]) -> float:
    """Seconds for the pure stages alone, each call made on the inputs replay gave it."""
    began = time.perf_counter()
    for stage, args, kwargs in calls:
        stage(*args, **kwargs)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clusters", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    configure("critical", "console", sys.stderr)  # the loop's logs are not the measure
    clusters = [f"c{i:02}" for i in range(args.clusters)]
    settings = build_settings(
        {
            "interval": STEP,
            "health": {"max_staleness": "10m"},
            "queriers": [{"name": "hub", "url": "http://hub", "push_interval": "10s"}],
            "clusters": [
                {"name": c, "prometheus": {"querier": "hub", "cluster": c}} for c in clusters
            ],
        }
    )
    answers = history(clusters, args.ticks)
    written = bodies(clusters, answers)
    calls = recorded(settings, clusters, answers)
    # the bench's own inputs kept out of the collector's passes, as the daemon keeps what
    # start-up made and replay what it read (``settle_collector``): else every pass while
    # the answers are read walks the recorded calls too (0.65 against 0.25 ms a tick)
    settle_collector()
    rounds = [
        (
            asyncio.run(replayed(settings, clusters, answers)),
            pure_as_replayed(calls),
            pure(settings, clusters, answers),
            reading(written, args.ticks),
        )
        for _ in range(args.repeat)
    ]
    loop = min(r[0] for r in rounds) / args.ticks
    floor = min(r[1] for r in rounds) / args.ticks
    static = min(r[2] for r in rounds) / args.ticks
    read = min(r[3] for r in rounds) / args.ticks
    ratios = sorted(r[0] / r[1] for r in rounds)
    whole = sorted((r[0] + r[3]) / r[1] for r in rounds)
    print(f"replay, {args.clusters} clusters, {args.ticks} ticks, best of {args.repeat}:")
    print(f"  replayed tick {1000 * loop:.2f} ms, pure stages on its inputs {1000 * floor:.2f} ms,")
    print(f"  {ratios[len(ratios) // 2]:.2f}x the pure stages (median of rounds)")
    print(
        f"  (the floor until 2026-12-06, a static target on the unmoved answers:"
        f" {1000 * static:.2f} ms, {loop / static:.2f}x)"
    )
    print(f"  a week at {STEP:g} s ({WEEK:,.0f} ticks): {WEEK * loop:.0f} s")
    print(
        f"  reading the querier's range answers: {1000 * read:.2f} ms a tick; with it, "
        f"{whole[len(whole) // 2]:.2f}x the pure stages and a week in {WEEK * (loop + read):.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
