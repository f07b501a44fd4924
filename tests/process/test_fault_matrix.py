"""The fault matrix: the real daemon, as a subprocess, against hostile servers on loopback.

One daemon watches one cluster per fault plus an honest one. After a few ticks every row must
show its own reason, the weights must sum to 100 and never be all zero (the honest cluster
carries the traffic), and the process must still be alive; a SIGTERM while a request hangs
ends it with status 0.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.daemon import Daemon
from tests.support.servers import free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KV = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"}'
GOOD = f"# TYPE vllm:kv_cache_usage_perc gauge\n{KV} 0.3\n"
MAX_BODY = 64 * 1024
MAX_SAMPLES = 1000  # scrape.max_page_samples's floor
SERIES_FLOOD = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(1200))
TOKEN_NOW = ["first-token"]
FUTURE_MS = 4_102_444_800_000  # 2100-01-01, in the page's milliseconds


def page(text: str, status: int = 200, **headers: str) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=text, status=status, headers=headers, content_type="text/plain")

    return handler


def raw(body: bytes, **headers: str) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=body, headers=headers)

    return handler


async def hang(_: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    return web.Response(text=GOOD)


async def slow_headers(_: web.Request) -> web.Response:
    await asyncio.sleep(5)  # longer than the scrape timeout, shorter than forever
    return web.Response(text=GOOD)


async def slow_body(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(20):  # a byte every half second: the request timeout still ends it
        await response.write(b"#")
        await asyncio.sleep(0.5)
    return response


def cut(body: str) -> Handler:
    """A body that promises 4,096 bytes and stops: the connection closes mid-way."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "4096"})
        await response.prepare(request)
        await response.write(body.encode())
        assert request.transport is not None
        request.transport.close()
        return response

    return handler


def openmetrics(text: str) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=text.encode(), content_type="application/openmetrics-text")

    return handler


def histogram(buckets: list[tuple[str, float]], count: float) -> str:
    name = "vllm:e2e_request_latency_seconds"
    lines = [GOOD.rstrip("\n")]
    lines += [f'{name}_bucket{{model_name="m",le="{le}"}} {v}' for le, v in buckets]
    lines += [f'{name}_sum{{model_name="m"}} {count}', f'{name}_count{{model_name="m"}} {count}']
    return "\n".join(lines) + "\n"


def reset() -> Handler:
    """A histogram whose counters fall back to near zero (a restarted pod) on the third scrape."""
    calls = [0]

    async def handler(_: web.Request) -> web.Response:
        calls[0] += 1
        n = 1000.0 * calls[0] if calls[0] < 3 else 5.0 * calls[0]
        return web.Response(text=histogram([("1.0", n / 2), ("+Inf", n)], n))

    return handler


async def rotating_token(request: web.Request) -> web.Response:
    if request.headers.get("Authorization") != f"Bearer {TOKEN_NOW[0]}":
        return web.Response(status=401, text="bad token")
    return web.Response(text=GOOD)


# (cluster, handler or "refused", reason after a few ticks; None: healthy)
ROWS: list[tuple[str, Handler | str, str | None]] = [
    ("refused", "refused", "refused"),
    ("hang", hang, "timeout"),
    ("slowloris-headers", slow_headers, "timeout"),
    ("slowloris-body", slow_body, "timeout"),
    ("http-500", page("boom", status=500), "http_status"),
    ("redirect-loop", page("", status=302, Location="/redirect-loop"), "redirect"),
    ("redirect-cross-host", page("", status=302, Location="http://169.254.169.254/"), "redirect"),
    ("garbage", page("<html><body>Bad Gateway</body></html>\n"), "parse"),
    ("binary", raw(bytes(range(256)) * 8), "content_type"),  # application/octet-stream
    ("binary-as-text", page(bytes(range(256)).decode("latin-1") * 8), "parse"),
    ("cut-mid-line", cut(f"{KV} 0.3\nvllm:kv_cache_us"), "truncated"),
    ("cut-mid-value", cut(f"{KV} 0."), "truncated"),
    ("empty", page(""), "truncated"),
    ("oversized", page(GOOD + "# pad " + "x" * MAX_BODY + "\n"), "too_large"),
    # under the body cap, but more tiny series than scrape.max_page_samples (set at its floor)
    ("series-flood", page(GOOD + SERIES_FLOOD), "too_many_samples"),
    (
        "gzip-bomb",
        raw(gzip.compress(b"# " + b"0" * (20 * MAX_BODY) + b"\n"), **{"Content-Encoding": "gzip"}),
        "too_large",
    ),
    ("nan", page(f"{KV} NaN\n"), "out_of_range"),
    ("plus-inf", page(f"{KV} +Inf\n"), "out_of_range"),
    ("minus-inf", page(f"{KV} -Inf\n"), "out_of_range"),
    ("negative", page(f"{KV} -0.2\n"), "out_of_range"),
    ("above-one", page(f"{KV} 1.5\n"), "out_of_range"),
    ("percent", page(f"{KV} 95\n"), "out_of_range"),
    # a series repeated on a page: kept at its first sample (as Prometheus does), counted
    ("duplicate-series", page(f"{KV} 0.1\n{KV} 0.99\n"), None),
    ("renamed-metric", page('vllm:kv_cache_usage_ratio{engine="0"} 0.3\n'), "missing_metric"),
    ("counter-reset", reset(), None),
    ("non-monotonic-buckets", page(histogram([("1.0", 50), ("2.0", 10), ("+Inf", 40)], 40)), None),
    ("token-rotation", rotating_token, None),
    ("token-missing", page(GOOD), "auth"),  # its token file is deleted while it runs
    # OpenMetrics: a series after "# EOF" was used; a page ending "# EOF" unterminated refused
    ("after-eof", openmetrics(f"{GOOD}# EOF\n{KV} 0.99\n"), "parse"),
    ("eof-unterminated", openmetrics(f"{GOOD}# EOF"), None),
    ("openmetrics-without-eof", openmetrics(GOOD), "content_type"),
    ("future-timestamp", page(f"{KV} 0.3 {FUTURE_MS}\n"), "stale"),  # never aged, never stale
    ("listed-200-times", page(GOOD), None),  # one pod, not 200 (its URL is listed 200 times)
]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return asyncio.run(run_matrix(tmp_path_factory.mktemp("matrix")))


async def run_matrix(tmp: Path) -> dict[str, Any]:
    app = web.Application()
    app.router.add_get("/honest", page(GOOD.replace(" 0.3", " 0.2")))
    for name, handler, _ in ROWS:
        if not isinstance(handler, str):
            app.router.add_get(f"/{name}", handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    token, doomed = tmp / "token", tmp / "doomed-token"
    token.write_text(TOKEN_NOW[0])
    doomed.write_text("soon-gone")  # present at start-up (run checks), deleted mid-run
    clusters: list[dict[str, Any]] = [
        {"name": "honest", "vllm_urls": [f"http://127.0.0.1:{port}/honest"]}
    ]
    for name, handler, _ in ROWS:
        where = (
            f"http://127.0.0.1:{free_port()}/metrics"
            if handler == "refused"
            else f"http://127.0.0.1:{port}/{name}"
        )
        cluster: dict[str, Any] = {
            "name": name,
            "vllm_urls": [where] * (200 if name == "listed-200-times" else 1),
        }
        if name.startswith("token-"):
            cluster["bearer_token_file"] = str(token if name == "token-rotation" else doomed)
            cluster["allow_token_over_http"] = True  # loopback
        clusters.append(cluster)
    config = {
        "interval": "2s",
        "clusters": clusters,
        "scrape": {
            "timeout": "1s",
            "max_body_bytes": MAX_BODY,
            "max_page_samples": MAX_SAMPLES,
            "min_latency_requests": 1,
        },
        "server": {"bind": f"127.0.0.1:{free_port()}"},
        "log": {"format": "json"},
    }
    child = await Daemon(tmp / "config.yaml", config, "run").start()
    try:
        state = await child.wait_for_ticks(3)
        TOKEN_NOW[0] = "second-token"  # rotated: file and server change together
        token.write_text(TOKEN_NOW[0])
        doomed.unlink()
        state = await child.wait_for_ticks(state["ticks"] + 3)
        alive = child.returncode is None
        took = await child.stop(20)  # the hang and slowloris requests are in flight
    finally:
        await child.kill()
        await runner.cleanup()
    return {
        "state": state,
        "alive": alive,
        "code": child.returncode,
        "took": took,
        "out": child.out + child.err,
    }


@pytest.mark.parametrize(
    ("name", "reason"), [(n, r) for n, _, r in ROWS], ids=[n for n, _, _ in ROWS]
)
def test_each_fault_has_its_own_reason(
    matrix: dict[str, Any], name: str, reason: str | None
) -> None:
    cluster = matrix["state"]["clusters"][name]
    assert cluster["reason"] == reason, cluster["errors"]
    assert cluster["healthy"] is (reason is None), cluster
    if reason not in (None, "stale"):  # stale is health's judgement of good pages: no error
        assert cluster["errors"] and cluster["errors"][0]["detail"]


def test_the_weights_always_send_traffic_somewhere(matrix: dict[str, Any]) -> None:
    target = matrix["state"]["targets"]["configured"]
    for weights in (target["desired"], target["applied"]):
        assert sum(weights.values()) == 100 and max(weights.values()) > 0
    faulty = {n for n, _, r in ROWS if r is not None}
    assert all(target["applied"][n] == 0 for n in faulty)
    assert target["applied"]["honest"] > 0


def test_a_url_listed_200_times_is_one_pod(matrix: dict[str, Any]) -> None:
    cluster = matrix["state"]["clusters"]["listed-200-times"]
    assert (cluster["pods_scraped"], cluster["pods_answering"]) == (1, 1)


def test_the_daemon_survives_all_of_it_and_stops_cleanly(matrix: dict[str, Any]) -> None:
    assert matrix["alive"]
    assert matrix["code"] == 0 and matrix["took"] < 5
    assert b"Traceback" not in matrix["out"]
    assert b"first-token" not in matrix["out"] and b"second-token" not in matrix["out"]
