"""Logs an operator can run the controller by: every event catalogued, one line per change,
conditions instead of repeats, the same typed keys in JSON and logfmt, and the runbooks'
cookbook answered from the demo's scripted story."""

from __future__ import annotations

import ast
import asyncio
import collections
import io
import itertools
import json
import logging
import random
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from controller import logs
from controller.app import Controller
from controller.conditions import Conditions
from controller.demo.runner import apply_scenario, demo_fleet
from controller.fakes.pages import CumulativeHistogram, vllm_v1_page
from controller.kube.leader import LeaderElector
from controller.model import ClusterMetrics, PodError, Reason
from controller.reconcile.journal import Journal
from controller.settings import LeaderSettings, build_settings
from controller.testing import Driver, VirtualClock
from tests.conftest import Serve
from tests.support import crds
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import CRD, NS, model, provider, wait_until

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


# ---- the catalogue ---------------------------------------------------------------------------


def emitted_events() -> set[str]:
    """Every event name the package logs: ``log.<level>("…")``, ``Conditions.observe("…")``
    and the publisher's ``_problem("…")`` and ``_unreadable("…")`` (conditions)."""
    found = set()
    for path in (ROOT / "controller").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr in LEVELS | {"observe", "_problem", "_unreadable"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
                elif node.func.attr in LEVELS:
                    raise AssertionError(f"{path}:{node.lineno}: an event name must be a literal")
    return found


def catalogued_events() -> set[str]:
    runbooks = (ROOT / "manifests" / "RUNBOOKS.md").read_text()
    section = runbooks.split("### Event catalogue", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.M))


def test_every_emitted_event_is_in_the_catalogue_and_back() -> None:
    emitted, catalogued = emitted_events(), catalogued_events()
    assert emitted - catalogued == set(), "emitted but not in RUNBOOKS.md's event catalogue"
    assert catalogued - emitted == set(), "in RUNBOOKS.md's event catalogue but never emitted"


# ---- conditions ------------------------------------------------------------------------------


def test_a_condition_logs_when_it_starts_at_most_every_repeat_and_when_it_ends() -> None:
    clock = VirtualClock(1000.0)
    log = structlog.get_logger("test")
    conditions = Conditions(log, repeat=300, clock=clock)
    with capture_logs() as lines:
        for _ in range(60):  # ten minutes of ticks every 10 s
            conditions.observe("cannot read targets", ("api",), error="refused")
            clock.now += 10
        conditions.clear(("api",))
        conditions.clear(("api",))  # already ended: nothing more
    # seen at 0, 10, ..., 590 s: logged at 0 and again at 300; ended at 600
    assert [e["event"] for e in lines] == [
        "cannot read targets",
        "cannot read targets",
        "condition ended",
    ]
    assert "repeated" not in lines[0]
    assert lines[1]["repeated"] is True and lines[1]["occurrences"] == 31
    assert lines[1]["since_seconds"] == 300
    ended = lines[-1]
    assert ended["condition"] == "cannot read targets" and ended["occurrences"] == 60
    assert ended["duration_seconds"] == 600 and "error" not in ended


def test_retain_ends_only_the_conditions_of_that_scope_not_seen_again() -> None:
    conditions = Conditions(structlog.get_logger("test"), clock=VirtualClock(1000.0))
    with capture_logs() as lines:
        for key in (("pod", "a", "u1"), ("pod", "a", "u2"), ("pod", "b", "u1")):
            conditions.observe("pod failing", key, cluster=key[1], pod=key[2])
        conditions.retain(("pod", "a"), {("pod", "a", "u2")})
    ended = [e for e in lines if e["event"] == "condition ended"]
    assert [(e["cluster"], e["pod"]) for e in ended] == [("a", "u1")]
    assert conditions.active(("pod", "b", "u1")) and conditions.active(("pod", "a", "u2"))


def test_a_condition_logs_its_exception_once_and_holds_none_of_its_frames() -> None:
    """A condition lasts as long as its cause: the exception it was raised with (and every
    frame under it) must not live that long."""
    import gc
    import weakref

    class Big:
        pass

    conditions = Conditions(structlog.get_logger("test"), clock=VirtualClock(1000.0))
    held = Big()
    witness = weakref.ref(held)

    def failing(local: Big) -> None:
        raise RuntimeError("bug")

    with capture_logs() as lines:
        try:
            failing(held)
        except RuntimeError as exc:
            conditions.observe("fetch raised", ("fetch", "a"), "error", exc_info=exc)
        del held
    assert isinstance(lines[0]["exc_info"], RuntimeError)  # logged with it, once
    lines.clear()  # what the log had written is gone; the condition stays
    gc.collect()
    assert witness() is None  # the frame that held it is gone with the exception
    assert conditions.active(("fetch", "a"))


# ---- rendering -------------------------------------------------------------------------------


@pytest.fixture
def rendered() -> Iterator[Any]:
    """Configure the real pipeline into a buffer; put the test defaults back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def render(fmt: str) -> io.StringIO:
        stream = io.StringIO()
        logs.configure("info", fmt, stream)
        return stream

    yield render
    root.handlers[:], root.level = saved
    structlog.reset_defaults()


def logfmt(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in shlex.split(line))


def test_json_and_logfmt_carry_the_same_typed_keys(rendered: Any) -> None:
    fields = {"cluster": "b", "vram_util": 0.2, "healthy": True, "weight": 80, "reason": None}
    out = {}
    for fmt in ("json", "console"):
        stream = rendered(fmt)
        with structlog.contextvars.bound_contextvars(tick=7):
            structlog.get_logger("controller.journal").info("cluster status", **fields)
        out[fmt] = stream.getvalue().strip()
    as_json = json.loads(out["json"])
    assert as_json["vram_util"] == 0.2 and as_json["weight"] == 80 and as_json["healthy"] is True
    assert as_json["tick"] == 7 and as_json["level"] == "info"
    stamp = as_json["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", stamp), stamp
    as_logfmt = logfmt(out["console"])
    assert set(as_logfmt) == set(as_json)
    assert out["console"].startswith("timestamp=")
    assert "cluster=b vram_util=0.2 healthy=true weight=80" in out["console"]


# ---- quiet steady state ----------------------------------------------------------------------


def steady(names: list[str], now: float) -> dict[str, ClusterMetrics]:
    """Clusters whose KV never moves: the world of a quiet night."""
    return {n: ClusterMetrics(n, now, 0.01, 2, 2, kv_mean=0.4, kv_max=0.45) for n in names}


async def test_two_hundred_steady_clusters_write_only_the_summaries() -> None:
    names = [f"c{i:03}" for i in range(200)]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in names],
        }
    )
    driver, now = Driver(settings), 1000.0
    await driver.tick(now, steady(names, now))  # every cluster's first status, the weights
    with capture_logs() as lines:
        for _ in range(60):  # ten minutes
            now += 10
            await driver.tick(now, steady(names, now))
    info = [e for e in lines if e["log_level"] != "debug"]
    summaries = [e for e in info if e["event"] == "target summary" or e.get("summary")]
    besides = [e for e in info if e not in summaries]
    assert besides == []
    # two summaries in ten minutes: one line per target and per cluster each
    assert len([e for e in summaries if e["event"] == "target summary"]) == 2
    assert len(summaries) == 2 * (1 + 200)
    assert sum(1 for e in lines if e["event"] == "cluster status") == 60 * 200  # debug: all


async def test_a_latency_no_millisecond_can_hold_is_logged_unknown_and_ticks_go_on(
    serve: Serve,
) -> None:
    """Found by an attack: a bucket bound of 1e306 (a valid page) made the p50 1e306 s, whose
    milliseconds overflowed ``round`` in the status line; every tick failed from then on, and
    /metrics kept the tick before, a dead cluster still healthy in it."""
    latency = CumulativeHistogram(bounds=(0.3, 1e306), counts=[0.0, 0.0, 0.0])

    async def pod(_: web.Request) -> web.Response:
        latency.observe(1e305, times=50)  # requests completed since the last scrape
        page = vllm_v1_page("m", [0.3], [0], [1], [latency])
        return web.Response(text=page, content_type="text/plain")

    server = await serve({"/metrics": pod})
    settings = build_settings(
        {
            "interval": 10,
            "scrape": {"min_latency_requests": 1},
            "clusters": [
                {"name": "huge", "vllm_urls": [server.url("/metrics")]},
                {"name": "gone", "vllm_urls": [server.url("/missing")]},
            ],
        }
    )
    async with Controller(settings, serve=False) as controller:
        with capture_logs() as lines:
            for tick in (1, 2):
                report = await controller.once()
                assert report.tick == controller.snapshot.report.tick == tick
    status = {e["cluster"]: e for e in lines if e["event"] == "cluster status"}
    assert status["huge"]["healthy"] is True and status["huge"]["p50_ms"] is None
    huge = report.clusters["huge"].metrics
    assert huge is not None and huge.latency is not None  # read, shown unknown in ms
    assert status["gone"]["healthy"] is False


async def test_a_log_line_that_fails_never_holds_the_report_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in the journal is a failed tick (counted, 'tick failed'), but the tick's report
    is served first: /metrics and /debug/state never freeze on an old tick behind it."""

    def broken(*_: object) -> None:
        raise OverflowError("a field the line cannot hold")

    settings = build_settings(
        {"interval": 10, "clusters": [{"name": "a", "vllm_urls": ["http://127.0.0.1:1/"]}]}
    )
    driver = Driver(settings)
    await driver.tick(1000, steady(["a"], 1000))
    monkeypatch.setattr(Journal, "write", broken)
    with pytest.raises(OverflowError):
        await driver.tick(1010, {"a": ClusterMetrics("a", 1010, 0.01, 2, 2, kv_mean=0.9)})
    assert driver.snapshot.report.tick == 2
    served = driver.snapshot.report.clusters["a"].metrics
    assert served is not None and served.kv_mean == 0.9


def flaky(names: list[str], now: float, down: dict[str, list[int]]) -> dict[str, ClusterMetrics]:
    """Clusters of 50 pods, those ``down`` of each failing this tick (timeouts)."""
    return {
        n: ClusterMetrics(
            n,
            now,
            0.01,
            50,
            50 - len(down[n]),
            kv_mean=0.4,
            kv_max=0.45,
            errors=tuple(PodError(f"http://{n}-{i}/metrics", Reason.TIMEOUT, "x") for i in down[n]),
            pages=50,
        )
        for n in names
    }


async def test_pods_missing_a_scrape_at_random_are_counted_and_a_pod_down_is_logged() -> None:
    """Found by an attack: 2 pods of 50 missing at random each tick (a usable cluster) wrote a
    'pod failing' and a 'condition ended' each, 77 lines a tick for 20 clusters (28,000 an
    hour). A pod is logged from its second miss in a row, and once back, its end."""
    names = [f"c{i:02}" for i in range(20)]
    settings = build_settings(
        {
            "interval": 10,
            "clusters": [{"name": n, "vllm_urls": ["http://127.0.0.1:1/"]} for n in names],
        }
    )
    driver, now, rng = Driver(settings), 1000.0, random.Random(7)
    await driver.tick(now, steady(names, now))
    with capture_logs() as lines:
        for _ in range(60):
            now += 10
            await driver.tick(now, flaky(names, now, {n: rng.sample(range(50), 2) for n in names}))
    said = [e for e in lines if e["log_level"] != "debug"]
    # 2 of 50 again the next tick: about 0.08 pods a cluster a tick, two lines each
    assert len(said) <= 60 * 20 * 0.25, collections.Counter(e["event"] for e in said)
    with capture_logs() as lines:
        for tick in range(4):  # pod 3 of c00 misses twice, then answers
            now += 10
            down = {n: [3] if n == "c00" and tick < 2 else [] for n in names}
            await driver.tick(now, flaky(names, now, down))
    failing = [e for e in lines if e["event"] == "pod failing"]
    ended = [
        e
        for e in lines
        if e["event"] == "condition ended" and e.get("pod") == "http://c00-3/metrics"
    ]
    assert [(e["cluster"], e["pod"]) for e in failing] == [("c00", "http://c00-3/metrics")]
    assert len(ended) == 1 and ended[0]["occurrences"] == 1  # said from its second miss


# ---- the cookbook against the demo's story ---------------------------------------------------


def parsed(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


async def test_the_cookbook_answers_what_the_story_did(
    apiserver: FakeAPIServer, rendered: Any
) -> None:
    granite = "ExternalModel/maas-system/granite"
    for name in ("cluster-a", "cluster-b", "cluster-c"):
        apiserver.put_object(CRD, "externalproviders", provider(name))
    refs = [("cluster-a", 34), ("cluster-b", 33), ("cluster-c", 33)]
    apiserver.put_object(CRD, "externalmodels", model("granite", refs))
    stream = rendered("json")
    clock = VirtualClock(1000.0)
    async with (
        demo_fleet() as fleet,
        client.ApiClient(client.Configuration(host=apiserver.url)) as api,
    ):
        settings = build_settings(
            {
                "interval": 1,
                "clusters": fleet.settings_clusters(),
                "scrape": {"timeout": 0.5, "min_latency_requests": 3},
                "kubernetes": {"enabled": True, "namespaces": [NS]},
            }
        )
        apply_scenario(fleet, 0)
        async with Controller(settings, serve=False, api=api, clock=clock) as controller:
            for tick in range(1, 41):  # the story: b heats from tick 5, c fails at 25..34
                if tick == 10:
                    apiserver.fail("PATCH", "externalmodels", 403, times=2)
                report = await controller.once()
                only = report.only
                apply_scenario(fleet, tick, dict(only.outcome.applied) if only else None)
                clock.now += 1
        await leadership_moves(api)
    lines = parsed(stream)
    final = {r["ref"]["name"]: r["weight"] for r in object_refs(apiserver)}

    # which cluster went unhealthy, and why
    unhealthy = {(e["cluster"], e["reason"]) for e in lines if e["event"] == "cluster unhealthy"}
    assert unhealthy == {("cluster-c", "http_status")}

    # every weight change of model X: a chain that ends in what the object holds
    changes = [
        e
        for e in lines
        if e["event"] in ("weights written", "would write") and e["target"] == granite
    ]
    assert changes and all(e["write"] == "done" for e in changes)
    for before, after in itertools.pairwise(changes):
        assert after["weights_from"] == before["weights_to"]
    assert changes[-1]["weights_to"] == final
    landed = len(apiserver.writes("PATCH", "externalmodels")) - 2  # two were refused
    assert len(changes) == landed
    assert min(e["weights_to"]["cluster-b"] for e in changes) <= 5  # b was shed while hot
    lowest = crds.weight_minimum(apiserver.crd_version)  # 1 on MaaS v0.2.0, else 0
    assert any(e["weights_to"]["cluster-c"] == lowest for e in changes)  # c while it failed
    assert all(min(e["weights_to"].values()) >= lowest for e in changes)

    # is anything being refused by the API: one condition, started and ended
    refused = [
        e
        for e in lines
        if e["event"] == "write refused"
        or (e["event"] == "condition ended" and e["condition"] == "write refused")
    ]
    assert [e["event"] for e in refused] == ["write refused", "condition ended"]
    assert refused[0]["target"] == granite and refused[0]["reason"] == "forbidden"
    assert refused[1]["occurrences"] == 2

    # did leadership move
    moves = [
        (e["event"], e["identity"])
        for e in lines
        if e["event"] in ("leadership acquired", "leadership lost")
    ]
    assert moves[0] == ("leadership acquired", "a")
    assert ("leadership acquired", "b") in moves
    assert moves.index(("leadership acquired", "b")) > 0

    # typed keys throughout: ticks are numbers, every line has the stable keys
    assert all({"timestamp", "level", "event"} <= set(e) for e in lines)
    assert all(isinstance(e["tick"], int) for e in lines if "tick" in e)


def object_refs(apiserver: FakeAPIServer) -> list[dict[str, Any]]:
    obj = apiserver.get(CRD, "externalmodels", NS, "granite")
    assert obj is not None
    refs: list[dict[str, Any]] = obj["spec"]["externalProviderRefs"]
    return refs


async def leadership_moves(api: client.ApiClient) -> None:
    """a leads, then stops (releasing the Lease), and b takes over."""
    lease = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.1}
    a = LeaderElector(api, LeaderSettings(identity="a", **lease))
    b = LeaderElector(api, LeaderSettings(identity="b", **lease))
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    task_a = asyncio.create_task(a.run(stop_a))
    await wait_until(a.is_leader, 5)
    task_b = asyncio.create_task(b.run(stop_b))
    stop_a.set()
    await task_a
    await wait_until(b.is_leader, 5)  # raises if b does not lead within 5 s
    stop_b.set()
    await task_b


def test_the_cookbooks_logql_asks_openshift_loggings_labels_for_the_jq_columns_events() -> None:
    """The LogQL used promtail's labels (`namespace`, `container`), which OpenShift Logging's
    LokiStack does not set; each query must select our container the way it labels streams
    and filter the same events as its jq twin."""
    from tests.support.manifests import render

    (deployment,) = [o for o in render("manifests") if o["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]["name"]
    runbooks = (ROOT / "manifests" / "RUNBOOKS.md").read_text()
    cookbook = runbooks[runbooks.index("### Cookbook") :]
    rows = [r for r in cookbook.splitlines() if r.startswith("| ") and "jq -c" in r]
    assert len(rows) == 4
    for row in rows:
        jq, logql = (c.strip().strip("`") for c in row.split(" | ")[-2:])
        selector = dict(re.findall(r'(\w+)="([^"]*)"', logql[: logql.index("}")]))
        assert selector == {
            "kubernetes_namespace_name": "maas-system",
            "kubernetes_container_name": container,
            "log_type": "application",
        }
        assert 'line_format "{{.message}}"' in logql  # our line, out of the ViaQ record
        events = "|".join(re.findall(r'event=~?"([^"]+)"', logql)).replace("\\|", "|")
        conditions = re.findall(r'condition="([^"]+)"', logql)
        for event in re.findall(r'\.event=="([^"]+)"', jq):
            if event == "condition ended":  # the jq twin asks which condition
                assert conditions == re.findall(r'\.condition=="([^"]+)"', jq), row
            else:
                assert re.fullmatch(events, event), (event, events)


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_no_field_makes_a_line_of_megabytes(fmt: str) -> None:
    """Ours and the standard library's lines alike: a string capped with the byte count cut,
    a list capped in length and items, a traceback keeping its last frames."""
    stream = io.StringIO()
    logs.configure("info", fmt, stream)
    try:
        raise ValueError("x" * 100_000 + "the last frame's words")
    except ValueError:
        structlog.get_logger("controller.test").exception(
            "huge", detail="é" * 3_000_000, pods=[f"http://p{i}" for i in range(5000)]
        )
    # 64 refs of 253 characters fit the CRD; these differ in the middle only
    refs = ["r" * 120 + f"{i:03}" + "r" * 130 for i in range(64)]
    structlog.get_logger("controller.test").info(
        "weights written",
        weights_from=dict.fromkeys(refs, 1),
        weights_to=dict.fromkeys(refs, 2),
        factors={ref: {"cluster": "c" * 253, "kv": 0.5, "healthy": True} for ref in refs},
        applied=dict.fromkeys(refs, 2),
    )
    logging.getLogger("aiohttp.server").warning("peer said %s", "y" * 1_000_000)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and max(map(len, lines)) <= 8 * 1024, max(map(len, lines))
    assert "more bytes cut" in lines[0] and "(+4984 more)" in lines[0]
    (refs_line,) = [line for line in lines if "weights written" in line]
    for field in ("weights_from", "weights_to", "factors", "applied"):  # the count beside
        assert re.search(rf'"?{field}_more"?[=:] ?48\b', refs_line), (field, refs_line[-300:])
    shown = json.loads(refs_line) if fmt == "json" else None
    assert shown is None or len(shown["weights_to"]) == 16  # 16 refs, each its own key
    assert shown is None or sum(shown["weights_to"].values()) == 32  # jq's 'add' reads refs
    # deeper than a ref's factors: short text, never whole
    structlog.get_logger("controller.test").info("deep", nested={"a": {"b": ["c" * 9000]}})
    (deep,) = [line for line in stream.getvalue().splitlines() if "deep" in line]
    assert len(deep) < 1024, len(deep)
    assert "the last frame's words" in stream.getvalue()
    assert "more bytes cut" in lines[-1]
