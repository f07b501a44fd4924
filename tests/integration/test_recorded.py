"""The controller's own record, read for replay (``controller.recorded``) from queriers on
loopback: one that refuses is passed over and named, the first that holds it is read, and
none holding it is said, never fatal."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

from controller.recorded import QUERY, read_record
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


def holding(shares: dict[str, float]) -> web.Response:
    result = [
        {
            "metric": {"target": "ExternalModel/llm/llama", "ref": f"/r/{i}", "cluster": c},
            "values": [[t, str(v)] for t in (100.0, 110.0, 120.0)],
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
            found = await read_record(
                queriers(order, session), ["east", "west"], 100, 120, 10, None
            )
            none = await read_record(
                queriers(order[:2], session), ["east", "west"], 100, 120, 10, None
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
