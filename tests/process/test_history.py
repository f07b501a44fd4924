"""A querier's history (``Querier.history``, what replay reads, #43) against a real Prometheus
whose TSDB was backfilled with ``promtool tsdb create-blocks-from openmetrics``: two hours of
two clusters' vLLM gauges, one running hot for twenty minutes. A range read at each step is
what an instant query at that time answers, read in chunks or in one; a range Prometheus
refuses is that query's named error at each of its times, never a value."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from controller.app import Controller
from controller.errors import FetchError
from controller.replay import replay
from controller.settings import Settings, build_settings
from controller.sources.answers import Asked, cluster_metrics, split
from controller.sources.prometheus import (
    RANGE_AT_ONCE,
    Querier,
    answer_series,
    shared_queriers,
)
from controller.state import TickReport
from controller.testing import VirtualClock
from tests.support.prometheus import Prometheus, binary
from tests.support.servers import Server, free_port

STEP = 10.0
HOURS = 2
HOT = (3000.0, 4200.0)  # east's episode, seconds into the history


def kv(cluster: str, offset: float) -> float:
    if cluster == "east" and HOT[0] <= offset < HOT[1]:
        return 0.95
    return 0.30 if cluster == "east" else 0.20


def openmetrics(start: float) -> str:
    """Two pods a cluster, a sample every STEP seconds: vLLM's own names and labels
    (vllm/v1/metrics/loggers.py), job and instance as a scrape would add them."""
    lines: list[str] = []
    families: dict[str, Callable[[str, float], float]] = {
        "vllm:kv_cache_usage_perc": lambda c, o: kv(c, o),
        "vllm:num_requests_waiting": lambda c, o: 12.0 if kv(c, o) > 0.9 else 0.0,
        "vllm:num_requests_running": lambda c, o: 8.0,
        "vllm:cache_config_info": lambda c, o: 1.0,
    }
    for name, value in families.items():
        lines.append(f"# TYPE {name} gauge")
        for cluster in ("east", "west"):
            for pod in range(2):
                labels = (
                    f'cluster="{cluster}",job="vllm",instance="{cluster}-{pod}:8000",'
                    'engine="0",model_name="llama"'
                )
                if name == "vllm:cache_config_info":
                    labels += ',block_size="16",num_gpu_blocks="2048"'
                for i in range(int(HOURS * 3600 / STEP) + 1):
                    offset = i * STEP
                    lines.append(
                        f"{name}{{{labels}}} {value(cluster, offset)} {start + offset:.3f}"
                    )
    return "\n".join(lines) + "\n# EOF\n"


LLAMA, OTHER = "ExternalModel/llm/llama", "HTTPRoute/llm/other"


def east_share(offset: float) -> float:
    """East's share of llama's traffic as the live controller held it: shed to 10 from just
    after the episode began until five minutes after it ended."""
    return 10.0 if HOT[0] + 30 <= offset < HOT[1] + 300 else 50.0


def own_series(start: float) -> str:
    """The controller's own series as its /metrics writes them (``render.REF``,
    ``exporter``), scraped from three replicas: the leader (``cluster`` ours); a follower
    whose scrape gave the target a ``cluster`` label of its own, so ours is kept as
    ``exported_cluster``; a replica in dry run, whose shares are what it would have held (all
    of llama on west). The first twenty minutes only the follower was scraped (the leader not
    yet up). The leader holds a second target too."""

    def share(instance: str, target: str, cluster: str, offset: float) -> float:
        if target == OTHER:
            return 80.0 if cluster == "east" else 20.0
        if instance == "wc-dry":
            return 100.0 if cluster == "west" else 0.0
        return east_share(offset) if cluster == "east" else 100.0 - east_share(offset)

    steps = int(HOURS * 3600 / STEP) + 1
    lines = ["# TYPE weight_controller_target_share gauge"]
    for instance, target in (("wc-0", LLAMA), ("wc-0", OTHER), ("wc-1", LLAMA), ("wc-dry", LLAMA)):
        for ref, cluster in enumerate(("east", "west")):
            named = f'cluster="hub",exported_cluster="{cluster}"'
            labels = (
                f'job="weight-controller",instance="{instance}:8080",target="{target}",'
                f'ref="/spec/refs/{ref}",'
                + (named if instance == "wc-1" else f'cluster="{cluster}"')
            )
            for i in range(steps):
                if instance == "wc-0" and i * STEP < 1200:
                    continue
                value = share(instance, target, cluster, i * STEP)
                at = start + i * STEP
                lines.append(f"weight_controller_target_share{{{labels}}} {value} {at:.3f}")
    # what the leader measured: requests served a little off the split (realised share, over
    # its window), and its changes acting after 40 s, once it had seen one act
    lines.append("# TYPE weight_controller_target_realised_share gauge")
    for ref, cluster in enumerate(("east", "west")):
        labels = (
            f'job="weight-controller",instance="wc-0:8080",target="{LLAMA}",'
            f'ref="/spec/refs/{ref}",cluster="{cluster}"'
        )
        for i in range(120, steps):
            east = east_share(i * STEP) + 2.0
            value = east if cluster == "east" else 100.0 - east
            lines.append(
                f"weight_controller_target_realised_share{{{labels}}} {value} {start + i * STEP:.3f}"
            )
    lines.append("# TYPE weight_controller_target_actuation_delay_seconds gauge")
    for instance, delay in (("wc-0", 40.0), ("wc-dry", 5.0)):
        labels = f'job="weight-controller",instance="{instance}:8080",target="{LLAMA}"'
        for i in range(int((HOT[0] + 300) / STEP), steps):
            lines.append(
                "weight_controller_target_actuation_delay_seconds"
                f"{{{labels}}} {delay} {start + i * STEP:.3f}"
            )
    lines.append("# TYPE weight_controller_dry_run gauge")
    for instance, dry in (("wc-0", 0), ("wc-1", 0), ("wc-dry", 1)):
        labels = f'job="weight-controller",instance="{instance}:8080"'
        for i in range(steps):
            lines.append(f"weight_controller_dry_run{{{labels}}} {dry} {start + i * STEP:.3f}")
    return "\n".join(lines) + "\n"


def backfill(tmp_path: Path, own: bool = False) -> float:
    """Two hours of history ending half an hour ago (Prometheus keeps the head's range for
    samples it scrapes), as blocks in ``tmp_path/data``; the history's start. ``own``: with
    the controller's own series."""
    start = time.time() - (HOURS * 3600 + 1800)
    start -= start % STEP
    source = tmp_path / "history.om"
    page = openmetrics(start)
    if own:
        page = page.removesuffix("# EOF\n") + own_series(start) + "# EOF\n"
    source.write_text(page)
    data = tmp_path / "data"
    done = subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return start


@pytest.fixture
async def backfilled(tmp_path: Path) -> AsyncIterator[tuple[Prometheus, float]]:
    start = backfill(tmp_path)
    async with Prometheus(tmp_path, [], retention="30d") as prometheus:
        yield prometheus, start


def hub_settings(url: str, cap: int | None = None, timeout: str = "3s") -> Settings:
    querier = {"name": "hub", "url": url, "push_interval": "10s", "timeout": timeout}
    return build_settings(
        {
            "interval": STEP,
            "scrape": {"max_body_bytes": cap or 10 * 1024 * 1024},
            "health": {"max_staleness": "10m"},
            "queriers": [querier],
            "clusters": [
                {"name": c, "prometheus": {"querier": "hub", "cluster": c}}
                for c in ("east", "west")
            ],
        }
    )


def hub(prometheus: Prometheus, session: aiohttp.ClientSession, cap: int | None = None) -> Querier:
    """``cap``: the body cap (``scrape.max_body_bytes``), the default if not given."""
    settings = hub_settings(prometheus.url, cap)
    querier = shared_queriers(
        settings.queriers, settings.prometheus_queries, settings.scrape, session
    )["hub"]
    for cluster in ("east", "west"):
        querier.hold(cluster)
    return querier


async def instant(
    prometheus: Prometheus, session: aiohttp.ClientSession, querier: Querier, at: float
) -> dict[str, object]:
    """Every query as an instant query at ``at``, split as the querier splits it."""
    found: dict[str, object] = {}
    for name, promql in querier.queries.items():
        params = {"query": promql, "time": f"{at:.3f}"}
        async with session.get(f"{prometheus.url}/api/v1/query", params=params) as r:
            body = await r.text()
        found.update(split(name, answer_series(body, "instant"), "cluster"))
    return found


async def test_a_history_at_each_step_is_what_an_instant_query_answered_then(
    backfilled: tuple[Prometheus, float],
) -> None:
    prometheus, start = backfilled
    end = start + HOURS * 3600
    async with aiohttp.ClientSession() as session:
        querier = hub(prometheus, session)
        whole = await querier.history(start, end, STEP)
        chunked = await querier.history(start, end, STEP, max_steps=100)
        assert chunked == whole
        # an answer past the body cap is asked again in halves (an attack: a 30-hour window
        # of 40 clusters answered 13 MB, and replay read none of it)
        capped = hub(prometheus, session, cap=20_000)
        assert await capped.history(start, end, STEP) == whole
        assert capped.sent > len(capped.queries)  # some were cut: the test means something
        assert len(whole) == HOURS * 360 + 1
        for offset in (600.0, HOT[0] + 300.0, HOT[1] + 600.0, HOURS * 3600.0):
            assert whole[start + offset] == await instant(
                prometheus, session, querier, start + offset
            )
        asked = Asked(querier.base, "cluster", "east", querier.queries, 60.0, 1.0)
        for offset, expected in ((1200.0, 0.30), (HOT[0] + 600.0, 0.95), (HOT[1] + 900.0, 0.30)):
            at = start + offset
            metrics = cluster_metrics("east", whole[at], asked, at, 0.0, at - STEP)
            assert metrics.kv_mean == pytest.approx(expected)
            assert metrics.kv_tokens == 2 * 2048 * 16 and metrics.pods_answering == 2
        before = await querier.history(start - 3600, start - 1800, STEP)
        assert all(answers["kv_mean"] == {} for answers in before.values())  # no data: unknown


async def test_a_range_read_outlasts_the_live_timeout_and_is_asked_again_after_a_5xx(
    backfilled: tuple[Prometheus, float],
) -> None:
    """Found by an attack: range reads ran under the live per-query timeout (a week of 20
    clusters read nothing at 3 s, and 10 s is refused for a 10 s interval), all at once, and
    one 503 cost its query a whole chunk: 11,000 ticks read as no data, and exit 0. Here
    every answer comes later than the querier's timeout, and the first of each query is a
    503 (as a restarting server, or a frontend shedding load, answers)."""
    prometheus, start = backfilled
    end = start + 1800
    seen: dict[str, int] = {}
    at_once = [0, 0]

    async def behind(request: web.Request) -> web.Response:
        query = request.query["query"]
        seen[query] = seen.get(query, 0) + 1
        at_once[0] += 1
        at_once[1] = max(at_once)
        try:
            await asyncio.sleep(0.3)  # past the querier's 0.1 s
            if seen[query] == 1:
                return web.Response(status=503, text="upstream restarting")
            async with aiohttp.ClientSession() as session:
                target = f"{prometheus.url}/api/v1/query_range"
                async with session.get(target, params=request.query) as answer:
                    text = await answer.text()
            return web.Response(text=text, content_type="application/json")
        finally:
            at_once[0] -= 1

    proxy = await Server().start({"/api/v1/query_range": behind})
    try:
        async with aiohttp.ClientSession() as session:
            direct = await hub(prometheus, session).history(start, end, STEP)
            settings = hub_settings(proxy.url("").rstrip("/"), timeout="100ms")
            through = shared_queriers(
                settings.queriers, settings.prometheus_queries, settings.scrape, session
            )["hub"]
            for cluster in ("east", "west"):
                through.hold(cluster)
            assert await through.history(start, end, STEP) == direct
    finally:
        await proxy.stop()
    assert set(seen.values()) == {2} and len(seen) == len(through.queries)
    assert at_once[1] == RANGE_AT_ONCE  # a few at a time, never all the queries at once


async def test_a_range_prometheus_refuses_is_each_time_s_named_error(
    backfilled: tuple[Prometheus, float],
) -> None:
    prometheus, start = backfilled
    async with aiohttp.ClientSession() as session:
        querier = hub(prometheus, session)
        refused = await querier.history(start, start + 12_000, 1.0, max_steps=20_000)
    errors = [answers["kv_mean"] for answers in refused.values()]
    assert all(isinstance(e, FetchError) for e in errors)
    assert "11,000 points" in str(errors[0])


async def test_replay_sheds_the_hot_cluster_in_its_episode_and_holds_when_calm(
    backfilled: tuple[Prometheus, float], tmp_path: Path
) -> None:
    prometheus, start = backfilled
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "interval": "10s",
                "queriers": [{"name": "hub", "url": prometheus.url, "push_interval": "10s"}],
                "clusters": [
                    {"name": c, "prometheus": {"querier": "hub", "cluster": c}}
                    for c in ("east", "west")
                ],
            }
        )
    )
    out = tmp_path / "replay.json"
    end = start + HOURS * 3600
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "controller",
            "replay",
            "--config",
            str(config),
            "--start",
            f"{start:.0f}",
            "--end",
            f"{end:.0f}",
            "--json",
            str(out),
            "--compare",
            "max_step=10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "closed loop" in done.stdout
    assert "the config's" in done.stdout and "max_step=10" in done.stdout
    assert "  least weight each held: east 7, west 50" in done.stdout.splitlines()
    document = json.loads(out.read_text())["targets"][0]
    east = {
        t["time"] - start: t["targets"]["configured"]["applied"]["east"] for t in document["ticks"]
    }
    calm = [w for offset, w in east.items() if offset < HOT[0]]
    assert set(calm) == {50}  # the calm hour: held at the even split, nothing written
    shed = min(offset for offset, w in east.items() if w <= 25)
    assert HOT[0] <= shed <= HOT[0] + 60  # within a minute of the episode's start
    during = [w for offset, w in east.items() if HOT[0] + 60 <= offset < HOT[1]]
    assert max(during) <= 10  # shed, not nudged: its queue still there, it is not given back
    after = [w for offset, w in east.items() if offset >= HOT[1] + 120]
    # given back once it cools: the closed loop moved east's recorded load with its share, so
    # at 7 of 100 it read cool (at the recorded 50 it would still read busy: --open-loop)
    assert min(after) >= 25 and len(set(after)) == 1
    summary = document["summary"]
    assert summary["writes"] <= 6 and summary["reversals_per_hour"] <= 1  # shed, given back
    assert summary["health_changes"] == {"east": 1, "west": 1}  # each healthy once, at the start
    # a candidate on the same history: smaller steps. The first step off the saturated east
    # (its queue grows) is an emergency, bounded by west's room below pressure rather than
    # by max_step, so it is the same step in both; the next is 10, not 16: east is shed less
    # deep (13 against 7), which its moved load shows is enough
    candidate = document["compared"]["max_step=10"]
    assert candidate["ticks_per_mode"]["emergency"] == summary["ticks_per_mode"]["emergency"] == 1
    assert candidate["largest_step"] == summary["largest_step"] > 10
    assert summary["lowest"]["east"] < candidate["lowest"]["east"] <= 25
    assert document["loop"].startswith("closed loop") and "east 50%, west 50%" in document["loop"]


def replay_cli(
    config: Path, start: float, end: float, *more: str
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "controller", "replay", "--config", str(config)]
    argv += ["--start", f"{start:.0f}", "--end", f"{end:.0f}", *more]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_a_time_that_is_none_or_a_window_too_long_to_hold_is_refused_before_reading(
    tmp_path: Path,
) -> None:
    """An attack: ``--start nan`` was a 38-line traceback, ``--start 0 --end 1e11`` ran out
    of memory building its steps, a year at 10 s after a minute and 2.4 GB. Each is one
    line, exit 2, before any query (the querier here answers nothing)."""
    config = tmp_path / "hub.yaml"
    querier = {"name": "hub", "url": f"http://127.0.0.1:{free_port()}"}
    clusters = [{"name": "east", "prometheus": {"querier": "hub", "cluster": "east"}}]
    config.write_text(yaml.safe_dump({"queriers": [querier], "clusters": clusters}))
    argv = [sys.executable, "-m", "controller", "replay", "--config", str(config)]
    cases = {
        ("nan", "1700000000"): "--start 'nan': not a time",
        ("1700000000", "inf"): "--end 'inf': not a time",
        ("0", "100000000000"): "more than 300,000",
        # a review: ISO dates escaped the bound (year 10000 out of range, a traceback)
        ("9999-12-31T23:00:00-01:00", "9999-12-31T23:59:59-01:00"): "not a time from 1970",
        ("0001-01-01", "1700000000"): "--start '0001-01-01': not a time from 1970",
        ("1700000000", str(1700000000 + 366 * 86400)): "ticks at 10s, more than 300,000",
    }
    for (start, end), why in cases.items():
        done = subprocess.run(
            [*argv, "--start", start, "--end", end],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and why in lines[0], done.stderr


async def test_a_replay_that_cannot_run_says_why_in_one_line_and_exits_2(
    backfilled: tuple[Prometheus, float], tmp_path: Path
) -> None:
    prometheus, start = backfilled
    read = {"name": "east", "prometheus": {"querier": "hub", "cluster": "east"}}
    cases = {
        "no history in the window": (prometheus.url, [read], start - 7200, start - 3600),
        "a querier down": (f"http://127.0.0.1:{free_port()}", [read], start, start + 600),
        "a scraped cluster": (
            prometheus.url,
            [read, {"name": "west", "vllm_urls": ["http://127.0.0.1:1/metrics"]}],
            start,
            start + 600,
        ),
        "an empty window": (prometheus.url, [read], start + 600, start),
    }
    expected = {
        "no history in the window": "no KV-cache reading for any cluster",
        "a querier down": "_range answered no part of the window",
        "a scraped cluster": "clusters west are scraped, not read through a querier",
        "an empty window": "the window is empty",
    }
    for case, (url, clusters, begin, end) in cases.items():
        config = tmp_path / f"{case}.yaml"
        querier = {"name": "hub", "url": url, "push_interval": "10s"}
        config.write_text(
            yaml.safe_dump({"interval": "10s", "queriers": [querier], "clusters": clusters})
        )
        written = tmp_path / f"{case}.json"
        done = await asyncio.to_thread(replay_cli, config, begin, end, "--json", str(written))
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expected[case] in lines[0], (case, done.stderr)
        assert done.stdout == "" and not written.exists()
    # a recorded split that cannot be used, refused before anything is read
    config = tmp_path / "two.yaml"
    both = [read, {"name": "west", "prometheus": {"querier": "hub", "cluster": "west"}}]
    querier = {"name": "hub", "url": prometheus.url, "push_interval": "10s"}
    config.write_text(yaml.safe_dump({"interval": "10s", "queriers": [querier], "clusters": both}))
    # and a step the loop cannot take, refused too
    for given, why in {
        ("--recorded", "east=70"): "names no weight for west",
        ("--recorded", "east=70,west=x"): "expected NAME=WEIGHT",
        ("--recorded", "east=70,north=30"): "expected NAME=WEIGHT, each cluster of the config once",
        ("--recorded", "east=0,west=0"): "gives no traffic",
        ("--step", "5s"): "shorter than the config's interval",
        ("--step", "2h"): "longer than 3600s",
        ("--step", "soon"): "not a duration",
        # found by an attack: checked after the whole replay, every tick read was lost
        ("--json", str(tmp_path / "missing" / "r.json")): "no directory",
        ("--plot", str(tmp_path / "r.txt")): "no format matplotlib writes",
        ("--json", str(tmp_path)): "a directory",
    }.items():
        done = await asyncio.to_thread(replay_cli, config, start, start + 600, *given)
        assert done.returncode == 2 and done.stdout == "", (given, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and why in lines[0], (given, done.stderr)


async def test_a_coarser_step_ticks_every_step_over_the_window(
    backfilled: tuple[Prometheus, float], tmp_path: Path
) -> None:
    """``--step 1m``: a tick a minute over the two hours, on the minutes (as a query frontend
    aligns a range), each reading the history at its time; the hot episode is still seen,
    and shed."""
    prometheus, start = backfilled
    config = tmp_path / "config.yaml"
    querier = {"name": "hub", "url": prometheus.url, "push_interval": "10s"}
    clusters = [
        {"name": c, "prometheus": {"querier": "hub", "cluster": c}} for c in ("east", "west")
    ]
    config.write_text(
        yaml.safe_dump({"interval": "10s", "queriers": [querier], "clusters": clusters})
    )
    out = tmp_path / "coarse.json"
    end = start + HOURS * 3600
    done = await asyncio.to_thread(
        replay_cli, config, start, end, "--step", "1m", "--json", str(out)
    )
    assert done.returncode == 0, done.stderr
    times = [t["time"] for t in json.loads(out.read_text())["targets"][0]["ticks"]]
    first = math.ceil(start / 60) * 60  # ticks fall on the step's multiples
    assert times == [first + 60.0 * i for i in range(int((end - first) // 60) + 1)]
    east = {
        t["time"] - start: t["targets"]["configured"]["applied"]["east"]
        for t in json.loads(out.read_text())["targets"][0]["ticks"]
    }
    assert {w for offset, w in east.items() if offset < HOT[0]} == {50}
    assert min(w for offset, w in east.items() if HOT[0] <= offset < HOT[1]) <= 25
    # a candidate is the replay's own settings with its change: under --set floor=30 east
    # keeps 30 when shed, in the candidate too (on the config's own floor it went to 7)
    floored = tmp_path / "floored.json"
    given = ("--set", "floor=30", "--compare", "settle=30s", "--json", str(floored))
    done = await asyncio.to_thread(replay_cli, config, start, end, "--step", "1m", *given)
    assert done.returncode == 0, done.stderr
    document = json.loads(floored.read_text())["targets"][0]
    assert document["summary"]["lowest"]["east"] == 30
    assert document["compared"]["settle=30s"]["lowest"]["east"] == 30
    # a step finer than Prometheus's milliseconds is read on its millisecond grid: every tick
    # has its reading
    odd = await asyncio.to_thread(replay_cli, config, start, end, "--step", "61.2345678s")
    assert odd.returncode == 0, odd.stderr
    assert "cluster-ticks without a KV reading: 0" in odd.stdout, odd.stdout


async def test_a_window_larger_than_the_server_allows_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """A Prometheus that loads at most 2,000 samples a query (``--query.max-samples``: the
    operator's limit, as Thanos's query-frontend has one on a range's length) answers ten
    minutes of the history and refuses two hours: replay says so in one line, with the
    server's own reason, exit 2, nothing written."""
    start = backfill(tmp_path)
    config = tmp_path / "hub.yaml"
    flags = ["--query.max-samples=2000"]
    async with Prometheus(tmp_path, [], retention="30d", flags=flags) as prometheus:
        querier = {"name": "hub", "url": prometheus.url, "push_interval": "10s"}
        clusters = [
            {"name": c, "prometheus": {"querier": "hub", "cluster": c}} for c in ("east", "west")
        ]
        config.write_text(
            yaml.safe_dump({"interval": "10s", "queriers": [querier], "clusters": clusters})
        )
        short = await asyncio.to_thread(replay_cli, config, start, start + 600)
        assert short.returncode == 0, short.stderr
        written = tmp_path / "week.json"
        whole = start + HOURS * 3600
        done = await asyncio.to_thread(replay_cli, config, start, whole, "--json", str(written))
    assert done.returncode == 2 and done.stdout == "" and not written.exists(), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "answered no part of the window" in lines[0], done.stderr
    assert "too many samples" in lines[0] and len(lines[0]) < 400, lines[0]


async def test_replay_gives_the_weights_the_live_loop_gives_over_the_same_answers(
    backfilled: tuple[Prometheus, float], tmp_path: Path
) -> None:
    """The daemon itself, its PromQL source asking a loopback querier that answers each
    instant query as Prometheus answered it at the tick's (virtual) time, tick by tick; and
    replay over the same window: the same weights at every tick."""
    prometheus, start = backfilled
    clock = VirtualClock(start + 2700)  # the calm before east's episode, the episode, after

    async def at_the_tick(request: web.Request) -> web.Response:
        params = {"query": request.query["query"], "time": f"{clock.now:.3f}"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{prometheus.url}/api/v1/query", params=params) as answer,
        ):
            return web.Response(text=await answer.text(), content_type="application/json")

    querier = await Server().start({"/api/v1/query": at_the_tick})
    clusters = [
        {"name": c, "prometheus": {"querier": "hub", "cluster": c}} for c in ("east", "west")
    ]

    def settings_at(url: str) -> Settings:
        hub = {"name": "hub", "url": url, "push_interval": "10s"}
        return build_settings({"interval": STEP, "queriers": [hub], "clusters": clusters})

    first, last = clock.now, start + 4800
    live: list[dict[str, int]] = []
    try:
        async with Controller(settings_at(querier.url("")), serve=False, clock=clock) as daemon:
            while clock.now <= last:
                report = await daemon.once()
                assert report.only is not None
                live.append(dict(report.only.outcome.applied))
                clock.advance(STEP)
    finally:
        await querier.stop()
    replayed: list[dict[str, int]] = []

    def keep(at: float, report: TickReport) -> None:
        assert report.only is not None
        replayed.append(dict(report.only.outcome.applied))

    async with aiohttp.ClientSession() as session:
        await replay(settings_at(prometheus.url), first, last, session, keep)
    assert len(live) == len(replayed) == (last - first) / STEP + 1
    assert replayed == live
    assert min(w["east"] for w in live) <= 5  # the window holds a decision worth comparing


async def test_clusters_the_config_scrapes_are_replayed_through_a_querier_named_for_it(
    backfilled: tuple[Prometheus, float], tmp_path: Path
) -> None:
    """The shipped configs scrape (pods, EPPs): their history is in whatever Prometheus
    scraped them, named on the command line, each cluster by its name as a label value."""
    prometheus, start = backfilled
    config = tmp_path / "scraped.yaml"
    scraped = [
        {"name": c, "vllm_urls": [f"http://{c}.llm.svc:8000/metrics"]} for c in ("east", "west")
    ]
    config.write_text(yaml.safe_dump({"interval": "10s", "clusters": scraped}))
    out = tmp_path / "scraped.json"
    argv = [sys.executable, "-m", "controller", "replay", "--config", str(config)]
    argv += ["--start", f"{start:.0f}", "--end", f"{start + 4800:.0f}", "--json", str(out)]
    argv += ["--querier", prometheus.url, "--cluster-label", "cluster"]
    png = tmp_path / "replay.png"
    argv += ["--plot", str(png)]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    ticks = json.loads(out.read_text())["targets"][0]["ticks"]
    east = [t["targets"]["configured"]["applied"]["east"] for t in ticks]
    assert east[0] == 50 and min(east) <= 10  # read, and shed in its episode
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # weights and KV drawn


async def test_replay_is_set_beside_the_controller_s_own_record_and_moves_load_by_it(
    tmp_path: Path,
) -> None:
    """The history holds the live controller's own weights (``own_series``): replay reads them
    as the record, past the dry-run replica's and through the follower's renamed label; names
    the targets it holds when not told which; counts its changes beside the replay's; writes
    it at each tick; and moves the recorded load by the share the record says was in force,
    not by an even split."""
    start = backfill(tmp_path, own=True)
    config = tmp_path / "config.yaml"
    end = start + HOURS * 3600
    async with Prometheus(tmp_path, [], retention="30d") as prometheus:
        querier = {"name": "hub", "url": prometheus.url, "push_interval": "10s"}
        clusters = [
            {"name": c, "prometheus": {"querier": "hub", "cluster": c}} for c in ("east", "west")
        ]
        config.write_text(
            yaml.safe_dump({"interval": "10s", "queriers": [querier], "clusters": clusters})
        )
        every = tmp_path / "every.json"
        unnamed = await asyncio.to_thread(replay_cli, config, start, end, "--json", str(every))
        out = tmp_path / "record.json"
        named = await asyncio.to_thread(
            replay_cli, config, start, end, "--target", LLAMA, "--json", str(out)
        )
        wrong = await asyncio.to_thread(replay_cli, config, start, end, "--target", "x/y/z")
        one_split = await asyncio.to_thread(
            replay_cli, config, start, end, "--recorded", "east=50,west=50"
        )
    assert unnamed.returncode == 0, unnamed.stderr
    # a target named and not held is bad input, never a replay of another one
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert f"replay: the record holds no target x/y/z (it holds {LLAMA}, {OTHER})" in (wrong.stderr)
    # one split for two targets' records: which one it is for is asked, not guessed
    assert one_split.returncode == 2 and "name the one it is for with --target" in (
        one_split.stderr
    )
    assert named.returncode == 0, named.stderr
    document = json.loads(out.read_text())["targets"][0]
    # not named, every target the record holds is replayed, each weighed as it was held and
    # set beside its own record, on its own: llama's replay is the one --target gave
    both = json.loads(every.read_text())["targets"]
    assert [(b["target"], b["recorded"]["target"]) for b in both] == [
        (LLAMA, LLAMA),
        (OTHER, OTHER),
    ]
    assert both[1]["recorded"]["changes"] == 0  # other was held at 80/20 throughout
    assert both[0]["summary"] == document["summary"] and both[0]["ticks"] == document["ticks"]
    for key in (LLAMA, OTHER):
        assert f"weighed {key} as the record had it" in unnamed.stdout
    record = document["recorded"]
    assert record["target"] == LLAMA and record["steps_read"] == HOURS * 360 + 1
    # shed and given back: two changes, each cluster turning once, a step of 40
    assert (record["changes"], record["reversals_per_hour"], record["largest_step"]) == (2, 1.0, 40)
    assert f"the controller's own record (weight_controller_target_share of {LLAMA}" in named.stdout
    assert "2 changes (1.0/h)" in named.stdout
    assert f"from the controller's own weights for {LLAMA}" in document["loop"]
    ticks = {t["time"] - start: t for t in document["ticks"]}
    # the follower's shares alone, then the leader's and the follower's, one each; the dry-run
    # replica's left out (its delay too); what the leader measured, where it had
    assert ticks[600.0]["recorded"] == {"share": {"east": 50.0, "west": 50.0}}
    assert ticks[1800.0]["recorded"]["share"] == {"east": 50.0, "west": 50.0}
    episode = ticks[HOT[0] + 600]["recorded"]
    assert episode == {
        "share": {"east": 10.0, "west": 90.0},
        "realised": {"east": 12.0, "west": 88.0},
        "actuation_delay_seconds": 40.0,
    }
    assert record["actuation_delay_seconds"] == 40.0 and "acting after 40s" in named.stdout
    # east's reading at each tick of its episode is its recorded 0.95 moved by its replayed
    # share over the 10% the record says it held, both as they were when the load was made:
    # a tick before, and 40 s before once the record measured its changes take that long
    # llama is weighed as the record had it: its two refs, east's and west's, from 50/50
    # (not the implicit target's first write by capacity)
    assert document["target"] == LLAMA and "weighed ExternalModel/llm/llama" in named.stdout
    assert "initial" not in document["summary"]["ticks_per_mode"]
    first = ticks[0.0]["targets"][LLAMA]
    assert first["applied"] == {"/spec/refs/0": 50, "/spec/refs/1": 50}
    moved = 0
    for offset in range(int(HOT[0]) + 120, int(HOT[1]), 10):
        lag = 40.0 if offset >= HOT[0] + 300 else STEP
        applied = ticks[offset - lag]["targets"][LLAMA]["applied"]
        share = applied["/spec/refs/0"] / sum(applied.values())
        expected = min(1.0, 0.95 * share / 0.10)
        read = ticks[float(offset)]["clusters"]["east"]["vram_utilization"]
        assert read == pytest.approx(expected), offset
        moved += expected != pytest.approx(0.95)
    assert moved >= 10  # the replay held east away from its recorded 10%: the check bites
