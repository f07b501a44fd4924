"""An API server that is slow, hung, throttling or edited under us, through the real
kubernetes-asyncio client and the API double: it costs writes, never the loop, liveness or
another target's turn, and nobody's edit is overwritten blind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from controller.app import Controller
from controller.fakes.clusters import Fleet
from controller.kube.errors import APIGate
from controller.model import Write
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import (
    CRD,
    NS,
    hot_and_cool,
    model,
    provider,
    seed,
    settings_for,
    weights_of,
)

MODELS = 20


@pytest.fixture
async def sims() -> AsyncIterator[Fleet]:
    async with hot_and_cool() as fleet:
        yield fleet


def many_models(apiserver: FakeAPIServer) -> None:
    for ref in ("east", "west"):
        apiserver.put_object(CRD, "externalproviders", provider(ref))
    for i in range(MODELS):
        apiserver.put_object(CRD, "externalmodels", model(f"m{i}", [("east", 50), ("west", 50)]))


def patches(apiserver: FakeAPIServer) -> int:
    return len(apiserver.writes("PATCH"))


async def test_a_hung_api_costs_the_writes_not_the_loop_or_liveness(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """Every patch hangs: the 20 writes were made one after another with no deadline (a tick
    stalled 19.8 s and /healthz answered 503). Now they go 8 at a time under one deadline;
    those cut off are failed with reason api_timeout, the clusters are read and judged, and the
    loop stays live."""
    many_models(apiserver)
    apiserver.slow("PATCH", "externalmodels", 3600, times=MODELS)
    settings = settings_for(sims, kubernetes={"api_timeout": 30, "max_parallel_writes": 8})
    async with Controller(settings, api=api) as controller:
        assert controller.port
        loop = asyncio.get_running_loop()
        began = loop.time()
        report = await controller.once()
        took = loop.time() - began
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{controller.port}/healthz") as live,
        ):
            assert live.status == 200
    # bounded by the publish deadline (80% of the 1 s interval), not 20 x the API timeout
    assert took < settings.interval * 3
    assert apiserver.most_waiting == 8  # in parallel, and no more than the bound at once
    outcomes = [view.outcome for view in report.targets.values()]
    assert len(outcomes) == MODELS
    assert {(o.write, o.reason) for o in outcomes} == {(Write.FAILED, "api_timeout")}
    assert report.clusters["east"].health is not None
    assert report.clusters["east"].health.healthy  # scraping went on
    assert weights_of(apiserver, "m0") == {"east": 50, "west": 50}  # nothing half-written


async def test_a_hung_list_is_a_named_condition_and_the_known_targets_are_kept(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """A hang while listing was logged as `discovery failed` with a traceback and the API
    still read as reachable."""
    seed(apiserver, [("east", 50), ("west", 50)])
    settings = settings_for(sims, kubernetes={"api_timeout": 30})
    async with Controller(settings, serve=False, api=api) as controller:
        await controller.once()
        apiserver.slow("GET", "externalmodels", 3600, times=5)
        with capture_logs() as logs:
            report = await controller.once()
    assert report.kubernetes[0] is False
    assert "no answer within the stage deadline" in (report.kubernetes[1] or "")
    events = {e["event"]: e for e in logs}
    assert "discovery failed" not in events
    assert events["cannot read targets"]["reason"] == "api_timeout"
    assert "exc_info" not in events["cannot read targets"]
    assert list(report.targets) == [f"ExternalModel/{NS}/llama"]  # kept, weighed again


async def test_a_429_is_waited_out_as_retry_after_says(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """The API server answered 429 with Retry-After: 5 and was sent 15 more requests in those
    5 seconds. Now nothing is sent until the wait is over; the targets are kept."""
    seed(apiserver, [("east", 50), ("west", 50)])
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        await controller.once()
        apiserver.fail("GET", "externalproviders", 429, headers={"Retry-After": "30"})
        await controller.once()
        sent = len(apiserver.requests)
        with capture_logs() as logs:
            reports = [await controller.once() for _ in range(3)]
    assert len(apiserver.requests) == sent  # three ticks, not one request
    throttled = [e for e in logs if e["event"] == "cannot read targets"]
    assert throttled == [] or throttled[0]["reason"] == "throttled"
    assert all(r.kubernetes[0] is False for r in reports)
    assert all("asked to wait" in (r.kubernetes[1] or "") for r in reports)
    assert all(list(r.targets) == [f"ExternalModel/{NS}/llama"] for r in reports)


def test_the_gate_opens_when_the_wait_is_over_and_backs_off_without_one() -> None:
    now = [100.0]
    gate = APIGate(lambda: now[0])
    assert gate.throttled(5.0) == 5.0 and gate.closed_for() == 5.0
    now[0] += 5.0
    assert gate.closed_for() == 0.0
    assert [gate.throttled(None) for _ in range(3)] == [2.0, 4.0, 8.0]  # a streak doubles
    assert gate.throttled(10_000) == 60.0  # never longer than a minute
    gate.answered()
    assert gate.throttled(None) == 1.0


async def test_a_hand_edit_between_read_and_patch_is_read_again_never_overwritten_blind(
    apiserver: FakeAPIServer, api: client.ApiClient, sims: Fleet
) -> None:
    """An operator's edit landing after our read and before our patch was overwritten from the
    stale read without a word. The patch now tests the weights it read: it is refused, the
    object is read again, the change is logged with who made it, and the step is taken from
    the operator's weights."""
    seed(apiserver, [("east", 50), ("west", 50)])

    def edit(obj: dict[str, Any]) -> None:
        obj["spec"]["externalProviderRefs"][0]["weight"] = 20
        obj["spec"]["externalProviderRefs"][1]["weight"] = 80

    def operator() -> None:
        apiserver.advance(60)  # later than the seed: the newest writer is the operator
        apiserver.edit(CRD, "externalmodels", NS, "llama", "kubectl-edit", edit)

    apiserver.before("PATCH", "externalmodels", operator)
    async with Controller(settings_for(sims), serve=False, api=api) as controller:
        with capture_logs() as logs:
            report = await controller.once()
    changed = [e for e in logs if e["event"] == "weights changed since they were read"]
    assert len(changed) == 1
    assert changed[0]["changed_by"] == "kubectl-edit"
    assert (changed[0]["read"], changed[0]["now"]) == ("east=50 west=50", "east=20 west=80")
    outcome = report.targets[f"ExternalModel/{NS}/llama"].outcome
    assert outcome.write is Write.DONE
    assert outcome.held == {"east": 20, "west": 80}  # weighed again from the edit
    after = weights_of(apiserver)
    assert after["east"] <= 20 and sum(after.values()) == 100
