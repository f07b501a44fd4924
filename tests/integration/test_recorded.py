"""The controller's own record, read for replay (``controller.recorded``) from queriers on
loopback: one that refuses is passed over and named, the one holding most of the chosen
target's steps is read, what could not be read is said, and none holding it is said, never
fatal."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

from controller.recorded import QUERY, read_records
from controller.settings import build_settings
from controller.sources.prometheus import Querier, shared_queriers
from tests.support.servers import Server, text_handler

REFUSED = json.dumps(
    {
        "status": "error",
        "errorType": "execution",
        "error": "query processing would load too many samples",
    }
)


def holding(
    shares: dict[str, float],
    target: str = "ExternalModel/llm/llama",
    times: tuple[float, ...] = (100.0, 110.0, 120.0),
) -> web.Response:
    result = [
        {
            "metric": {"target": target, "ref": f"/r/{i}", "cluster": c},
            "values": [[t, str(v)] for t in times],
        }
        for i, (c, v) in enumerate(shares.items())
    ]
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return web.json_response(body)


def queriers(urls: list[str], session: aiohttp.ClientSession) -> list[Querier]:
    settings = build_settings(
        {
            "interval": "10s",
            "queriers": [
                {"name": f"q{i}", "url": url, "push_interval": "10s"} for i, url in enumerate(urls)
            ],
            "clusters": [
                {"name": c, "prometheus": {"querier": "q0", "cluster": c}} for c in ("east", "west")
            ],
        }
    )
    found = shared_queriers(
        settings.queriers, settings.prometheus_queries, settings.scrape, session
    )
    return list(found.values())


async def test_a_refusing_querier_is_passed_over_and_named_and_the_next_one_read() -> None:
    asked: list[str] = []

    async def hub(request: web.Request) -> web.Response:
        asked.append(request.query["query"])
        if "realised" in request.query["query"]:
            return holding({"east": 25.0, "west": 75.0})
        if "delay" in request.query["query"]:
            return holding({"": 30.0})
        return holding({"east": 20.0, "west": 80.0})

    refusing = await Server().start(
        {"/api/v1/query_range": text_handler(REFUSED, 422, "application/json")}
    )
    empty = await Server().start(
        {
            "/api/v1/query_range": text_handler(
                '{"status":"success","data":{"resultType":"matrix","result":[]}}',
                content_type="application/json",
            )
        }
    )
    holder = await Server().start({"/api/v1/query_range": hub})
    try:
        async with aiohttp.ClientSession() as session:
            order = [refusing.url(""), empty.url(""), holder.url("")]
            [found] = await read_records(queriers(order, session), ["east", "west"], 100, 120, 10)
            [none] = await read_records(
                queriers(order[:2], session), ["east", "west"], 100, 120, 10
            )
    finally:
        for server in (refusing, empty, holder):
            await server.stop()
    assert asked[0] == QUERY and len(asked) == 3  # the split, then its realised share and delay
    assert found.record is not None
    assert found.record.shares == {t: {"east": 0.2, "west": 0.8} for t in (100.0, 110.0, 120.0)}
    assert found.record.source == holder.url("/api/v1/query_range")
    assert found.record.realised[110.0] == {"east": 0.25, "west": 0.75}
    assert found.record.delays == dict.fromkeys((100.0, 110.0, 120.0), 30.0)
    assert none.record is None
    assert none.note.startswith("no record of the controller's own weights")
    assert refusing.url("/api/v1/query_range") in none.note and "too many samples" in none.note


async def test_the_querier_holding_most_of_the_target_is_read_and_what_failed_is_said() -> None:
    """A Prometheus of short retention (one step of llama) before a Thanos of the whole
    window (llama and a second target, its delay refused): without a target named, both
    are read; with one, the Thanos is read, however the queriers are listed; a
    target only the second holds is found there; the refused delay is said."""

    async def short(request: web.Request) -> web.Response:
        return holding({"east": 90.0, "west": 10.0}, times=(120.0,))

    async def whole(request: web.Request) -> web.Response:
        query = request.query["query"]
        if "delay" in query:
            return web.Response(text=REFUSED, status=422, content_type="application/json")
        if "realised" in query:
            return holding({"east": 45.0, "west": 55.0})
        body = json.loads(holding({"east": 40.0, "west": 60.0}).text or "")
        other = json.loads(holding({"east": 70.0}, target="HTTPRoute/llm/other").text or "")
        body["data"]["result"] += other["data"]["result"]
        return web.json_response(body)

    servers = [
        await Server().start({"/api/v1/query_range": short}),
        await Server().start({"/api/v1/query_range": whole}),
    ]
    try:
        async with aiohttp.ClientSession() as session:
            listed = queriers([s.url("") for s in servers], session)
            names = ["east", "west"]
            both = await read_records(listed, names, 100, 120, 10)
            [llama] = await read_records(listed, names, 100, 120, 10, ["ExternalModel/llm/llama"])
            [backwards] = await read_records(
                listed[::-1], names, 100, 120, 10, ["ExternalModel/llm/llama"]
            )
            named = await read_records(
                listed, names, 100, 120, 10, ["HTTPRoute/llm/other", "x/y/z", "HTTPRoute/llm/other"]
            )
    finally:
        for server in servers:
            await server.stop()
    # none named: each target held, in order, each from where most of it is
    assert [f.record.target for f in both if f.record] == [
        "ExternalModel/llm/llama",
        "HTTPRoute/llm/other",
    ]
    assert both[0].record == llama.record
    for found in (llama, backwards):
        assert found.record is not None and len(found.record.shares) == 3
        assert found.record.source == servers[1].url("/api/v1/query_range")
        assert found.record.shares[120.0] == {"east": 0.4, "west": 0.6}
        assert found.record.realised[120.0] == {"east": 0.45, "west": 0.55}
        assert found.record.delays == {}
        assert "its delay not read at 3: " in found.note and "too many samples" in found.note
    # named: each once, in the order given; one not held said so, never fatal
    other, none = named
    assert other.record is not None and other.record.shares[100.0] == {"east": 1.0}
    assert other.record == both[1].record
    assert none.record is None and "holds no target x/y/z" in none.note
    assert "ExternalModel/llm/llama, HTTPRoute/llm/other" in none.note


async def test_a_target_over_clusters_the_config_does_not_read_is_said_not_dropped() -> None:
    """Found by a review: a target whose refs all map to clusters the config does not read
    vanished from the replay, and named, was said not to be held at all."""

    async def hub(request: web.Request) -> web.Response:
        body = json.loads(holding({"east": 40.0, "west": 60.0}).text or "")
        far = json.loads(
            holding({"north": 70.0, "south": 30.0}, target="HTTPRoute/llm/far").text or ""
        )
        body["data"]["result"] += far["data"]["result"]
        return web.json_response(body)

    server = await Server().start({"/api/v1/query_range": hub})
    try:
        async with aiohttp.ClientSession() as session:
            listed = queriers([server.url("")], session)
            every = await read_records(listed, ["east", "west"], 100, 120, 10)
            [named] = await read_records(
                listed, ["east", "west"], 100, 120, 10, ["HTTPRoute/llm/far"]
            )
    finally:
        await server.stop()
    far = "the record holds HTTPRoute/llm/far only over clusters the config does not read"
    assert [f.note for f in every if f.record is None] == [far]
    assert [f.record.target for f in every if f.record] == ["ExternalModel/llm/llama"]
    assert named.record is None and named.note == far


async def test_a_history_read_through_a_step_aligning_frontend_reads_every_step() -> None:
    """A query frontend (Thanos's, Cortex's, Mimir's ``step_align``, on by default) moves a
    range query's start down to a multiple of its step: a replay started between multiples
    got answers at times none of its steps had, and read nothing at all."""
    asked: list[tuple[float, float]] = []

    async def frontend(request: web.Request) -> web.Response:
        start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
        start, end = start // step * step, end // step * step  # as step_align does
        asked.append((start, end))
        times = tuple(start + i * step for i in range(int((end - start) / step) + 1))
        return holding({"east": 0.5, "west": 0.25}, times=times)

    server = await Server().start({"/api/v1/query_range": frontend})
    try:
        async with aiohttp.ClientSession() as session:
            (querier,) = queriers([server.url("")], session)
            for cluster in ("east", "west"):
                querier.hold(cluster)
            read = await querier.history(1_003.0, 1_041.0, 10.0)
    finally:
        await server.stop()
    assert sorted(read) == [1_010.0, 1_020.0, 1_030.0, 1_040.0]
    assert all(answers["kv_mean"] == {"east": 0.5, "west": 0.25} for answers in read.values())
    assert set(asked) == {(1_010.0, 1_040.0)}  # asked on the multiples: nothing moved
