"""``/debug/state`` and ``weight-controller status`` against a running controller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from controller.app import Controller
from controller.cli import main
from controller.fakes.clusters import Fault, Fleet, SimCluster
from controller.kube.objects import PAUSE_ANNOTATION, PIN_ANNOTATION
from controller.render import state_json
from controller.status import STATE_MAX_BYTES, StateError, fetch_state, render
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import CRD, model, provider, seed, settings_for, ticks
from tests.support.servers import Handler


async def test_state_and_status_table_show_clusters_targets_and_leader() -> None:
    server = FakeAPIServer()
    await server.start()
    try:
        async with (
            Fleet([SimCluster("east", kv=0.9), SimCluster("west", kv=0.2)]) as sims,
            client.ApiClient(client.Configuration(host=server.url)) as api,
        ):
            seed(server, [("east", 50), ("west", 50)])
            settings = settings_for(sims, server={"bind": "127.0.0.1:0"})
            async with Controller(settings, api=api) as controller:
                sims["east"].fault = Fault.HTTP_500
                for _ in range(3):
                    await controller.once()
                url = f"http://127.0.0.1:{controller.port}"
                state = await fetch_state(url)
                done = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "controller",
                    "status",
                    "--url",
                    url,
                    "--explain",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                stdout, stderr = await asyncio.wait_for(done.communicate(), 30)
                as_json = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "controller",
                    "status",
                    "--url",
                    url.removeprefix("http://"),  # no scheme: http is meant
                    "-o",
                    "json",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                printed_json, _ = await asyncio.wait_for(as_json.communicate(), 30)
    finally:
        await server.stop()
    assert state["ticks"] == 3 and state["leader"] is True
    assert state["clusters"]["east"]["healthy"] is False
    assert state["clusters"]["east"]["reason"] == "http_status"
    refs = state["targets"]["ExternalModel/maas-system/llama"]["refs"]
    assert refs["west"] | {"goal": None, "factors": None, "realised": None} == {
        "cluster": "west",
        "desired": 100,
        "applied": 100,
        "share": 100.0,
        "goal": None,
        "factors": None,
        "capacity_from": "kv_blocks",  # its pods publish vllm:cache_config_info
        "realised": None,
        "intended": None,
    }
    assert "score" in refs["west"]["factors"] and refs["east"]["factors"] is None  # unhealthy
    assert state["kubernetes"] == {"reachable": True, "error": None}
    assert refs["east"]["applied"] == 0
    table = render(state)
    assert "UNHEALTHY (http_status)" in table and "leader: yes" in table
    assert "kubernetes: reachable" in table
    assert any(
        "east: http://127.0.0.1:" in line and "http_status: HTTP 500" in line
        for line in table.splitlines()
    )
    explained = render(state, explain=True)
    assert "DEMAND SHARE" in explained and "score = capacity share" in explained
    assert "law: capacity" in explained
    assert "REALISED" in explained
    # where its capacity came from: its pods' KV pools
    assert any("west" in line and "kv_blocks" in line for line in explained.splitlines())
    assert "actuation delay not measured yet" in explained
    assert "ExternalModel/maas-system/llama" in table
    assert done.returncode == 0, stderr.decode()
    assert json.loads(printed_json)["ticks"] == 3
    printed = stdout.decode()
    assert "CLUSTER" in printed and "east" in printed and "TARGET" in printed
    # the CLI passes --explain as explain, and now as now (a review: "(-1796684676s ago)")
    assert "score = capacity share" in printed and "s ago)" in printed and "(-" not in printed


async def test_status_of_nothing_running_is_a_clear_error() -> None:
    done = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controller",
        "status",
        "--url",
        "http://127.0.0.1:9",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(done.communicate(), 30)
    assert done.returncode == 1
    assert "cannot read http://127.0.0.1:9/debug/state" in stderr.decode()


def test_status_json_and_unreachable_kubernetes() -> None:
    state = {
        "ticks": 3,
        "leader": None,
        "clusters": {},
        "targets": {},
        "kubernetes": {"reachable": False, "error": "list externalmodels: HTTP 503"},
    }
    assert "kubernetes: UNREACHABLE (list externalmodels: HTTP 503)" in render(state, now=0)


def test_explain_names_the_law_from_each_decision_not_from_its_factors() -> None:
    refs = {
        ref: {"cluster": ref, "desired": w, "applied": w, "share": float(w), "factors": None}
        for ref, w in (("a", 60), ("b", 40))
    }

    def target(law: str, mode: str) -> dict[str, object]:
        return {"law": law, "mode": mode, "write": "none", "last_write": None, "refs": refs}

    state = {
        "ticks": 1,
        "leader": True,
        "clusters": {},
        "kubernetes": {"reachable": None},
        # every cluster unhealthy in one: no factors at all, the law is still the decision's
        "targets": {
            "ExternalModel/ns/old": target("integral", "fail_static"),
            "ExternalModel/ns/new": target("capacity", "hold"),
        },
    }
    explained = render(state, now=0, explain=True).splitlines()
    assert "KV HEADROOM" in explained[explained.index("law: integral") + 1]
    assert "DEMAND SHARE" in explained[explained.index("law: capacity") + 1]


ESC = "\x1b"
FORGED = f"{ESC}]2;owned\a{ESC}[2J{ESC}[H{ESC}[1;31mALL CLUSTERS HEALTHY{ESC}[8m"


async def test_a_tenant_s_annotations_reach_status_printable_and_short(
    apiserver: FakeAPIServer, api: client.ApiClient
) -> None:
    """Found by an attack: a pause note and a pin's keys of escape sequences came out raw in
    ``status`` (a cleared screen, a window title, hidden text: a forged picture in an
    incident), and a pin of many unknown keys listed them all, up to 16 KB."""
    async with Fleet([SimCluster("east", kv=0.5), SimCluster("west", kv=0.2)]) as sims:
        for ref in ("east", "west"):
            apiserver.put_object(CRD, "externalproviders", provider(ref, namespace="team-b"))
        refs = [("east", 50), ("west", 50)]
        pins = {FORGED: 10, **{f"ref-{i}": 1 for i in range(40)}}
        for name, annotations in (
            ("paused", {PAUSE_ANNOTATION: f"incident 42{FORGED}\nsee #ops"}),
            ("pinned", {PIN_ANNOTATION: json.dumps(pins)}),
        ):
            apiserver.put_object(
                CRD,
                "externalmodels",
                model(name, refs, namespace="team-b", annotations=annotations),
            )
        async with Controller(settings_for(sims), serve=False, api=api) as controller:
            await ticks(controller, 2)
            served = json.dumps(state_json(controller.snapshot.report, True, False))
    text = render(json.loads(served), explain=True)
    assert all(c.isprintable() for line in text.splitlines() for c in line)
    notes = [line for line in text.splitlines() if line.startswith("note: ")]
    paused = next(n for n in notes if "team-b/paused" in n)
    assert "incident 42 ]2;owned  [2J [H [1;31mALL CLUSTERS HEALTHY [8m see #ops" in paused
    pinned = next(n for n in notes if "team-b/pinned" in n)
    assert "'\\x1b]2;owned\\x07" in pinned and "(+36 more)" in pinned and len(pinned) < 600


SMALL = {"ticks": 2, "leader": True, "clusters": {}, "targets": {}, "kubernetes": {}}


async def _answering(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _json(text: str) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(text=text, content_type="application/json")

    return answer


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("{}", "cannot read {url}/debug/state: not a controller's state: no ticks and clusters"),
        ("null", "cannot read {url}/debug/state: not a controller's state"),
        ("[" * 200_000 + "]" * 200_000, "cannot read {url}/debug/state: not JSON this reads"),
        ("<html>", "cannot read {url}/debug/state: not JSON: Expecting value"),
        (
            json.dumps({**SMALL, "clusters": {"a": {"vram_utilization": "x"}}}),
            "cannot show {url}/debug/state (ValueError: Unknown format code 'f'",
        ),
    ],
    ids=["empty", "null", "deep", "html", "another-version"],
)
async def test_a_state_that_is_no_state_is_one_line_and_exit_1(answer: str, said: str) -> None:
    """Found by an attack: ``{}``, ``null``, a field of another type or JSON nested 200,000
    deep printed a traceback of 32 lines (KeyError, AttributeError, ValueError,
    RecursionError). Now one line naming what was read, and exit 1."""
    runner, url = await _answering(_json(answer))
    try:
        done = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "controller", "status", "--url", url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, said_bytes = await asyncio.wait_for(done.communicate(), 30)
    finally:
        await runner.cleanup()
    err = said_bytes.decode()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("error: " + said.format(url=url)), err


async def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an attack: a 302 to another address was followed and rendered."""
    seen: list[str | None] = []

    async def elsewhere(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(SMALL)

    other, other_url = await _answering(elsewhere)

    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(f"{other_url}/debug/state")

    runner, url = await _answering(moved)
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    try:
        code = await asyncio.to_thread(main, ["status", "--url", url, "--token-file", str(token)])
    finally:
        await runner.cleanup()
        await other.cleanup()
    err = capsys.readouterr().err
    assert code == 1 and seen == []
    assert f"HTTP 302 to {other_url}/debug/state: not followed" in err


async def test_an_endless_or_silent_answer_is_bounded_and_named() -> None:
    """Found by an attack: an endless body grew the CLI to 1.5 GB before its timeout, and a
    silent server's error said nothing after its colon (``TimeoutError()`` prints empty)."""

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            await response.write(b'{"ticks": 1, "x": "')
            for _ in range(STATE_MAX_BYTES // (1 << 20) + 2):
                await response.write(b"a" * (1 << 20))
        return response

    done = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await done.wait()
        return web.json_response(SMALL)

    for handler, said in ((endless, "bytes: not read further"), (silent, "no answer within 0.2s")):
        runner, url = await _answering(handler)
        try:
            with pytest.raises(StateError, match=said):
                await fetch_state(url, seconds=0.2 if handler is silent else 30)
        finally:
            if handler is silent:
                done.set()
            await runner.cleanup()


async def test_watching_says_a_failed_frame_and_reads_again() -> None:
    """Found by an attack: ``--watch`` quit on the first answer that came late or failed (a
    restart of the controller it watches). Ctrl-C in a fetch that hangs ends the watch then,
    not when the fetch times out (a review of a first flag, which waited for it)."""
    answers = iter([web.Response(status=503), web.json_response(SMALL)])
    hanging, never = asyncio.Event(), asyncio.Event()

    async def flaky(request: web.Request) -> web.StreamResponse:
        answer = next(answers, None)
        if answer is None:  # the third fetch hangs until the test ends
            hanging.set()
            await never.wait()
        return answer or web.json_response(SMALL)

    runner, url = await _answering(flaky)
    watching = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "controller", "status", "--url", url, "--watch", "0.5", "-o", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints where it is
    )
    try:
        assert watching.stdout is not None and watching.stderr is not None
        failed = await asyncio.wait_for(watching.stderr.readline(), 30)
        frame = await asyncio.wait_for(watching.stdout.readline(), 30)
        await asyncio.wait_for(hanging.wait(), 30)
        watching.send_signal(signal.SIGINT)  # Ctrl-C: how watching ends
        try:
            _, rest = await asyncio.wait_for(watching.communicate(), 30)
        except TimeoutError:  # once, under load: say where it was (its stack on stderr)
            watching.send_signal(signal.SIGABRT)
            _, where = await asyncio.wait_for(watching.communicate(), 10)
            raise AssertionError(f"no exit 30 s after SIGINT: {where.decode()[-3000:]}") from None
    finally:
        if watching.returncode is None:
            watching.kill()
            await watching.wait()
        never.set()  # the hung answer ends: the server's clean-up would wait 60 s for it
        await runner.cleanup()
    assert b"503" in failed and frame.strip() == b"{"
    assert watching.returncode == 130 and b"Traceback" not in rest, rest
    assert b"no answer within" not in rest, rest  # ended in the fetch, not after its timeout
