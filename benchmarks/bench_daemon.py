"""The daemon itself at fleet scale: CPU share of a core, peak RSS, tick durations, failures,
and its CPU per page against the Python floor measured in the same run on the same pages.

    python benchmarks/bench_daemon.py [--endpoints 200 2000 10000] [--seconds 60]
        [--concurrency N] [--epp] [--keep-alive] [--ray]

Separate processes serve the ~150 KiB vLLM V1 page on loopback (their CPU is not counted),
every pod on a loopback address of its own (127.1.x.y), every connection closed after its
page, as a fleet of default vLLMs does (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` is 5 s, under a 10 s
interval) unless ``--keep-alive``. ``--epp`` gives every cluster of 10 pods an EPP page too
(the llm-d-router request-duration capture), as a cluster behind llm-d has. ``--ray`` serves
a Ray node's page instead (``ray_page``: 16 Ray Serve replicas of 3 models, ~374 KiB), each
node's its own (its address, its workers' and replicas' ids, as a real fleet's pages differ),
and each 10 nodes are three clusters, one per model, each scraping all 10.
``weight-controller run`` scrapes them every 10 s for ``--seconds``. Its CPU comes from
/proc/<pid>/stat, its peak RSS from VmHWM, tick durations from its own reconcile histogram on
/metrics, and failing pages (first tick and last) from /debug/state.

The floor: in the same run, this process reads the same pages from the same addresses with
a raw asyncio ``Protocol`` (a GET, a new connection each, the body kept) and
``str.splitlines`` of each body, 32 at a time: what any Python reader pays for a page. It
reads every page once in each gap between the daemon's ticks (seen from /proc), so the two
are measured under the same load on the machine. The daemon's CPU per page is divided by it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from benchmarks.bench_fetch import free_port  # noqa: E402
from benchmarks.ray_page import MODELS  # noqa: E402

SERVERS = 2  # page servers, so serving is not the bottleneck on a 2-core machine
TICKS = os.sysconf("SC_CLK_TCK")
PODS_PER_CLUSTER = 10
INTERVAL = 10.0
FLOOR_CONCURRENCY = 32  # as the daemon's scrape.max_concurrency
# A tick is over once the daemon's CPU has moved less than BUSY of a core for QUIET seconds,
# polled every POLL seconds from /proc (nothing asks the daemon itself).
POLL, BUSY, QUIET = 0.1, 0.05, 0.5
EPP_FIXTURE = ROOT.parent / "shared" / "fixtures" / "epp-llmd-router-request-duration.prom"

# One process serves the pods (and EPPs) given to it, each on an address of its own, all on
# one port. The EPP page's counters grow between scrapes, so the daemon reads latency from it.
SERVER = """
import sys, json
from aiohttp import web
sys.path.insert(0, {root!r})
from benchmarks.vllm_page import vllm_v1_page
from benchmarks.ray_page import ray_node_page
hosts = json.loads(sys.stdin.read())
# a Ray node's page names the node, its workers and its replicas: each host serves its own
ray = {ray!r}
bodies = {{h: ray_node_page(node=h, seed=i).encode() for i, h in enumerate(hosts) if ray}}
body = vllm_v1_page().encode()
epp = [line.rsplit(" ", 1) if line and not line.startswith("#") else [line]
       for line in open({epp!r}).read().splitlines()]
keep = {keep!r}
hits = 0
async def page(request):
    host = request.transport.get_extra_info("sockname")[0]
    response = web.Response(body=bodies.get(host, body), content_type="text/plain")
    if not keep:
        response.force_close()
    return response
async def epp_page(request):
    global hits
    hits += 1
    # every count scaled by the scrapes so far: a histogram that grows, still cumulative
    text = "\\n".join(f"{{p[0]}} {{float(p[1]) * hits:g}}" if len(p) == 2 else p[0]
                       for p in epp) + "\\n"
    response = web.Response(text=text, content_type="text/plain")
    if not keep:
        response.force_close()
    return response
app = web.Application()
app.router.add_get("/metrics", page)
app.router.add_get("/epp/metrics", epp_page)
web.run_app(app, host=hosts, port={port}, print=None, access_log=None, backlog=4096,
            keepalive_timeout=75)
"""


def pod_host(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def epp_host(c: int) -> str:
    return f"127.2.{c // 250}.{c % 250 + 1}"


@contextlib.contextmanager
def fleet_servers(endpoints: int, epp: bool, keep: bool, ray: bool = False) -> Iterator[list[str]]:
    """Page servers for ``endpoints`` pods (and an EPP per cluster); yields the pods' URLs
    then the EPPs', every one on its own loopback address."""
    port = free_port()
    pods = [pod_host(i) for i in range(endpoints)]
    epps = [epp_host(c) for c in range(endpoints // PODS_PER_CLUSTER)] if epp else []
    hosts = pods + epps
    script = SERVER.format(root=str(ROOT), port=port, epp=str(EPP_FIXTURE), keep=keep, ray=ray)
    servers = []
    for k in range(SERVERS):
        server = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
        assert server.stdin is not None
        server.stdin.write(json.dumps(hosts[k::SERVERS]).encode())
        server.stdin.close()
        servers.append(server)
    try:
        urls = [f"http://{h}:{port}/metrics" for h in pods]
        urls += [f"http://{h}:{port}/epp/metrics" for h in epps]
        yield urls
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def state(port: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{port}/debug/state"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        found: dict[str, object] = await response.json()
        return found


async def tick_seconds(port: int) -> tuple[float, float]:
    """Ticks so far and their total seconds, from the daemon's own reconcile histogram."""
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    found = {"_count": 0.0, "_sum": 0.0}
    for line in text.splitlines():
        for suffix in found:
            if line.startswith(f"weight_controller_reconcile_duration_seconds{suffix} "):
                found[suffix] = float(line.split()[-1])
    return found["_count"], found["_sum"]


class _Get(asyncio.Protocol):
    """The least a page costs: one GET on a new connection, the response kept in pieces."""

    def __init__(self, host: str, path: str, done: asyncio.Future[bytes]) -> None:
        self._request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        self._pieces: list[bytes] = []
        self._done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._pieces.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(b"".join(self._pieces))


async def floor_read(url: str) -> int:
    """One page the floor's way: raw GET, new connection, ``splitlines`` of the body."""
    rest = url.split("://", 1)[1]
    hostport, path = rest.split("/", 1)
    host, port = hostport.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    transport, _ = await loop.create_connection(
        lambda: _Get(host, "/" + path, done), host, int(port)
    )
    try:
        raw = await asyncio.wait_for(done, 10)
    finally:
        transport.close()
    body = raw.split(b"\r\n\r\n", 1)[1]
    return len(body.decode().splitlines())


async def floor_round(urls: list[str]) -> float:
    """The floor's CPU seconds for one read of every URL, 32 at a time."""
    slots = asyncio.Semaphore(FLOOR_CONCURRENCY)

    async def one(url: str) -> int:
        async with slots:
            return await floor_read(url)

    cpu = time.process_time()
    lines = await asyncio.gather(*(one(u) for u in urls))
    assert all(n > 0 for n in lines)
    return time.process_time() - cpu


async def quiet(pid: int, deadline: float) -> bool:
    """Wait for the daemon to finish a tick: busy (CPU moving) and then idle for
    ``QUIET`` seconds. False if ``deadline`` (monotonic) comes first."""
    busy = False
    last, still = cpu_seconds(pid), 0.0
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL)
        now = cpu_seconds(pid)
        if now - last > BUSY * POLL:
            busy, still = True, 0.0
        elif busy:
            still += POLL
            if still >= QUIET:
                return True
        last = now
    return False


async def floor_in_gaps(pid: int, urls: list[str], seconds: float) -> float:
    """The floor's CPU per page, a round of every URL in each gap between the daemon's ticks
    over ``seconds``: both are measured under the same load on the machine, which drifts by
    up to 2× within a minute, so a floor read before or after the daemon is not its peer."""
    deadline = time.monotonic() + seconds
    cpu = 0.0
    rounds = 0
    while await quiet(pid, deadline):
        cpu += await floor_round(urls)
        rounds += 1
    return cpu * 1000 / (rounds * len(urls)) if rounds else float("nan")


async def run_one(
    endpoints: int, seconds: float, urls: list[str], concurrency: int | None, ray: bool = False
) -> dict[str, Any]:
    pods, epps = urls[:endpoints], urls[endpoints:]
    clusters = []
    models = MODELS if ray else (None,)  # a Ray node's page is read once per model's cluster
    for c in range(endpoints // PODS_PER_CLUSTER):
        mine = pods[c * PODS_PER_CLUSTER : (c + 1) * PODS_PER_CLUSTER]
        for m, model in enumerate(models):
            cluster: dict[str, Any] = {"name": f"c{c:05}-{m}", "vllm_urls": mine}
            if model:
                cluster["model_name"] = model
            if epps:
                cluster["epp_url"] = epps[c]
            clusters.append(cluster)
    metrics_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            json.dumps(
                {
                    "interval": INTERVAL,
                    "clusters": clusters,
                    "server": {"bind": f"127.0.0.1:{metrics_port}"},
                    "log": {"format": "json", "level": "warning"},
                    **({"scrape": {"max_concurrency": concurrency}} if concurrency else {}),
                }
            )
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controller",
            "run",
            "--config",
            str(config),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        try:
            first = None
            began = time.monotonic()
            while first is None and time.monotonic() - began < 120:
                await asyncio.sleep(0.5)
                try:
                    snapshot = await state(metrics_port)
                except aiohttp.ClientError:
                    continue
                if isinstance(snapshot["ticks"], int) and snapshot["ticks"] >= 1:
                    first = snapshot
            assert first is not None, "no first tick"
            clusters_state = first["clusters"]
            assert isinstance(clusters_state, dict)
            failures = sum(len(c["errors"]) for c in clusters_state.values())
            ticks0, took0 = await tick_seconds(metrics_port)
            await floor_round(urls[:FLOOR_CONCURRENCY])  # warm
            cpu0, wall0 = cpu_seconds(child.pid), time.monotonic()
            floor = await floor_in_gaps(child.pid, urls, seconds)
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - wall0)))
            cpu = cpu_seconds(child.pid) - cpu0
            wall = time.monotonic() - wall0
            rss = peak_rss_mb(child.pid)
            ticks1, took1 = await tick_seconds(metrics_port)
            last = await state(metrics_port)
            last_clusters = last["clusters"]
            assert isinstance(last_clusters, dict)
            failing = sum(len(c["errors"]) for c in last_clusters.values())
            reasons = Counter(e["reason"] for c in last_clusters.values() for e in c["errors"])
        finally:
            child.terminate()
            await asyncio.wait_for(child.wait(), 20)
    ticks = ticks1 - ticks0
    # A tick every interval reads every page: for Ray, each node page once for all of its
    # models' clusters (``SharedPages``), so a page's cost is all that its clusters spend on it.
    pages = wall / INTERVAL * len(urls)
    return {
        "endpoints": endpoints,
        "pages_per_tick": len(urls),
        "reads_per_tick": len(urls) * len(models),
        "cpu_percent": 100 * cpu / wall,
        "peak_rss_mb": rss,
        "first_tick_failures": failures,
        "last_tick_failures": failing,
        "ticks": ticks,
        "tick_seconds": (took1 - took0) / ticks if ticks else float("nan"),
        "ms_per_page": 1000 * cpu / pages if pages else float("nan"),
        "floor_ms_per_page": floor,
        "reasons": dict(reasons),
    }


async def measure(
    sizes: list[int],
    seconds: float,
    concurrency: int | None,
    epp: bool,
    keep: bool,
    ray: bool = False,
) -> None:
    rows = []
    for n in sizes:
        with fleet_servers(n, epp, keep, ray) as urls:
            await asyncio.sleep(2 + n / 1000)  # the page servers start
            rows.append(await run_one(n, seconds, urls, concurrency, ray))
    limit = concurrency or "default"
    print(f"the daemon, 10 s interval, {seconds:g} s measured after the first tick,")
    print(
        f"scrape.max_concurrency {limit}, an EPP per cluster: {'yes' if epp else 'no'},"
        f" connections {'kept alive' if keep else 'closed after every page'}"
    )
    print(
        f"{'endpoints':>10} {'pages/tick':>10} {'reads/tick':>10} {'CPU % core':>10}"
        f" {'peak RSS MB':>12}"
        f" {'mean tick s':>12} {'1st-tick fail':>13} {'last-tick fail':>14}"
        f" {'ms/page':>8} {'floor ms/page':>13} {'× floor':>8}"
    )
    for r in rows:
        print(
            f"{r['endpoints']:>10.0f} {r['pages_per_tick']:>10.0f} {r['reads_per_tick']:>10.0f}"
            f" {r['cpu_percent']:>10.1f} {r['peak_rss_mb']:>12.0f} {r['tick_seconds']:>12.2f}"
            f" {r['first_tick_failures']:>13.0f} {r['last_tick_failures']:>14.0f}"
            f" {r['ms_per_page']:>8.2f} {r['floor_ms_per_page']:>13.2f}"
            f" {r['ms_per_page'] / r['floor_ms_per_page']:>8.2f}"
        )
    for r in rows:
        if r["reasons"]:
            print(
                f"{r['endpoints']:.0f} endpoints, the last tick's failing pages by reason:",
                r["reasons"],
            )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", type=int, nargs="+", default=[200, 2000, 10000])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, help="scrape.max_concurrency (default: ours)")
    parser.add_argument("--epp", action="store_true", help="an EPP page per cluster")
    parser.add_argument("--keep-alive", action="store_true", help="servers keep connections")
    parser.add_argument("--ray", action="store_true", help="Ray node pages, 3 models each")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(
        measure(args.endpoints, args.seconds, args.concurrency, args.epp, args.keep_alive, args.ray)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
