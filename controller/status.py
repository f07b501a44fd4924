"""``weight-controller status``: a running controller's ``/debug/state`` as readable tables."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from controller.errors import printable
from controller.logs import mask_url
from controller.render import health_words
from controller.settings.files import read_token

STATE_PATH = "/debug/state"
DISCOVERED_SHOWN = 8


STATE_MAX_BYTES = 64 << 20
"""A ``/debug/state`` larger than this is refused: a bound on what an answer can make the CLI
hold (an endless body grew it to 1.5 GB before its timeout: found by an attack)."""


class StateError(Exception):
    """What was read is no controller's state, or nothing was read in time: one line."""


async def fetch_state(
    base_url: str,
    seconds: float = 5.0,
    token_file: Path | None = None,
    ca_file: Path | None = None,
) -> dict[str, Any]:
    """``/debug/state`` of a running controller. A deployed one serves HTTPS with the service
    CA's certificate and asks for a token (``server.authenticate``): ``token_file`` is sent as
    a bearer token (read at each call: projected tokens rotate), ``ca_file`` verifies it. A
    redirect is not followed: the state is at the address given, and the token goes nowhere
    else."""
    if "://" not in base_url:  # 127.0.0.1:8080 means http://127.0.0.1:8080
        base_url = "http://" + base_url
    url = base_url.rstrip("/") + STATE_PATH
    headers, tls = _access(token_file, ca_file)
    try:
        async with (
            asyncio.timeout(seconds),
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers, ssl=tls, allow_redirects=False) as response,
        ):
            if 300 <= response.status < 400:
                where = mask_url(printable(response.headers.get("Location", "nowhere")))
                raise StateError(f"HTTP {response.status} to {where}: not followed")
            response.raise_for_status()
            body = await _bounded(response)
    except TimeoutError:
        raise StateError(f"no answer within {seconds:g}s") from None
    return parse_state(body)


async def _bounded(response: aiohttp.ClientResponse) -> bytes:
    if (response.content_length or 0) > STATE_MAX_BYTES:
        raise StateError(f"{response.content_length} bytes: more than {STATE_MAX_BYTES} read")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > STATE_MAX_BYTES:
            raise StateError(f"more than {STATE_MAX_BYTES} bytes: not read further")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_state(body: bytes) -> dict[str, Any]:
    """A state as ``render`` reads it: a JSON object with its ``ticks`` and ``clusters``."""
    try:
        state = json.loads(body)
    except RecursionError:
        raise StateError("not JSON this reads: nested too deeply") from None
    except ValueError as exc:
        raise StateError(f"not JSON: {exc}") from None
    if not (
        isinstance(state, dict)
        and isinstance(state.get("ticks"), int)
        and isinstance(state.get("clusters"), dict)
    ):
        raise StateError("not a controller's state: no ticks and clusters")
    return state


def _access(
    token_file: Path | None, ca_file: Path | None
) -> tuple[dict[str, str], ssl.SSLContext | bool]:
    headers = {}
    if token_file is not None:  # small files, read once per call
        headers["Authorization"] = f"Bearer {read_token(token_file)}"
    tls: ssl.SSLContext | bool = True
    if ca_file is not None:
        tls = ssl.create_default_context(cafile=str(ca_file))
    return headers, tls


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, fmt) + suffix


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def _when(stamp: float | None, now: float) -> str:
    if stamp is None:
        return "never"
    iso = datetime.fromtimestamp(stamp, UTC).strftime("%H:%M:%SZ")
    return f"{iso} ({now - stamp:.0f}s ago)"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _kubernetes(state: dict[str, Any]) -> str:
    kube = state.get("kubernetes") or {}
    if kube.get("reachable") is None:
        return "not used"
    if kube["reachable"]:
        unread = kube.get("error")  # scopes it would not give: their targets kept, then dropped
        return f"reachable; unreadable: {unread}" if unread else "reachable"
    return f"UNREACHABLE ({kube.get('error') or 'no answer'}): last known targets kept"


def render(state: dict[str, Any], now: float | None = None, explain: bool = False) -> str:
    now = time.time() if now is None else now
    leader = {True: "yes", False: "no", None: "unknown"}[state.get("leader")]
    dry = "; dry run (writes nothing)" if state.get("dry_run") else ""
    lines = [
        f"tick {state['ticks']} at {_when(state.get('last_tick'), now)}; leader: {leader}; "
        f"last weight change: {_when(state.get('last_change'), now)}{dry}",
        f"kubernetes: {_kubernetes(state)}",
        "",
    ]
    rows = [["CLUSTER", "KV", "KV MAX", "QUEUE", "P50", "P90", "PODS", "HEALTH", "WEIGHT"]]
    for name, c in sorted(state["clusters"].items()):
        rows.append(
            [
                name,
                _num(c["vram_utilization"], ".2f"),
                _num(c["vram_utilization_max"], ".2f"),
                _num(c["queue_depth"], ".1f"),
                _ms(c["latency_p50_seconds"]),
                _ms(c["latency_p90_seconds"]),
                f"{c['pods_answering']}/{c['pods_scraped']}",
                health_words(c),
                _num(c["weight"], "d"),
            ]
        )
    lines += _table(rows)
    for name, c in sorted(state["clusters"].items()):
        found = c.get("discovered_pods")
        if found is not None:  # pods found by discovery, not listed: which ones, now
            shown = ", ".join(mask_url(str(u)) for u in found[:DISCOVERED_SHOWN])
            more = (
                f" (+{len(found) - DISCOVERED_SHOWN} more)" if len(found) > DISCOVERED_SHOWN else ""
            )
            lines.append(f"  {name}: {len(found)} pods discovered: {shown or '-'}{more}")
        for error in c.get("errors") or []:  # which pod failed, and how (URLs masked)
            url = mask_url(str(error.get("url")))
            lines.append(f"  {name}: {url}: {error.get('reason')}: {error.get('detail')}")
    lines += ["", *_targets(state.get("targets") or {}, now)]
    if explain:
        lines += ["", *_explain(state.get("targets") or {})]
    for key, why in sorted((state.get("refused") or {}).items()):
        lines.append(f"refused: {key}: {why}")
    # what objects' annotations and pages say reaches a terminal: no escape sequence of a
    # tenant's (clear screen, a title, hidden text) may rewrite what an operator reads
    return "\n".join(printable(line, "?") for line in lines)


def _targets(targets: dict[str, Any], now: float) -> list[str]:
    """Per target and ref: decided, held, its share of the target's traffic, and the write."""
    rows = [["TARGET", "REF", "CLUSTER", "DESIRED", "APPLIED", "SHARE", "MODE", "WRITE", "WRITTEN"]]
    notes = []
    for key, t in sorted(targets.items()):
        notes += [f"note: {key}: {note}" for note in t.get("notes", [])]
        for ref, r in t["refs"].items():
            rows.append(
                [
                    key,
                    ref,
                    r["cluster"] or "(unmapped)",
                    _num(r["desired"], "d"),
                    _num(r["applied"], "d"),
                    _num(r["share"], ".0f", "%"),
                    t["mode"],
                    t["write"] + (f" ({t['detail']})" if t.get("detail") else ""),
                    _when(t["last_write"], now),
                ]
            )
    return [*_table(rows), *notes]


# Each law's factors (``weights.<law>.factors``) as explain's columns, and what its score is.
LAWS: dict[str, tuple[tuple[tuple[str, str, str], ...], str]] = {
    "capacity": (
        (
            ("CAPACITY", "capacity", ".0f"),
            ("FROM", "capacity_from", "ref"),
            ("UTILIZATION", "utilization", ".2f"),
            ("CAP SHARE", "capacity_share", ".2f"),
            ("DEMAND SHARE", "demand_share", ".2f"),
        ),
        "score = capacity share − demand share (above 0: room for more); capacity in KV tokens"
        " (from: kv_blocks, kv_blocks_kept, kv_tokens_per_pod; measured, learned_per_pod where"
        " its pages publish no pool: estimated from the target's clusters that do) or pods"
        " (ready_endpoints, replicas, pods); realised/"
        "intended: % of the target's requests served vs asked for; '-' for unhealthy or unmapped",
    ),
    "integral": (
        (
            ("KV HEADROOM", "kv_headroom", ".3f"),
            ("QUEUE", "queue_penalty", ".3f"),
            ("LATENCY", "latency_penalty", ".3f"),
        ),
        "score = kv headroom × queue penalty × latency penalty (relative to the best cluster);"
        " '-' for an unhealthy or unmapped ref",
    ),
}


def _explain(targets: dict[str, Any]) -> list[str]:
    """Why each ref has its weight, per law in force (each decision names its law): its
    cluster's score and the score's parts, its goal, and the share its cluster really served
    beside the one intended."""
    lines: list[str] = []
    for law in sorted({t.get("law", "capacity") for t in targets.values()}):
        chosen = {k: t for k, t in targets.items() if t.get("law", "capacity") == law}
        lines += [f"law: {law}", *_explain_law(chosen, *LAWS.get(law, ((), "")))]
    for key, t in sorted(targets.items()):
        lines.append(
            f"{key}: mode {t['mode']}"
            + (f" ({'; '.join(t['notes'])})" if t.get("notes") else "")
            + f"; {_actuation(t)}"
        )
    return lines


def _actuation(target: dict[str, Any]) -> str:
    """How long the target's changes take to act, and whether the last one has."""
    delay = target.get("actuation_delay_s")
    measured = "not measured yet" if delay is None else f"{delay:.0f}s"
    waiting = " (waiting for the last change to act)" if target.get("waiting_to_act") else ""
    return f"actuation delay {measured}{waiting}"


def _part(factors: dict[str, Any], ref: dict[str, Any], name: str, spec: str) -> str:
    """One of a law's columns: a factor, or (``spec`` "ref") a fact of the ref itself."""
    if spec == "ref":
        return str(ref.get(name) or "-")
    return _num(factors.get(name), spec)


def _explain_law(
    targets: dict[str, Any], parts: tuple[tuple[str, str, str], ...], legend: str
) -> list[str]:
    rows = [
        [
            "TARGET",
            "REF",
            "CLUSTER",
            "SCORE",
            *(title for title, _, _ in parts),
            "GOAL",
            "DESIRED",
            "REALISED",
            "INTENDED",
        ]
    ]
    for key, t in sorted(targets.items()):
        for ref, r in t["refs"].items():
            f = r.get("factors") or {}
            rows.append(
                [
                    key,
                    ref,
                    r["cluster"] or "(unmapped)",
                    _num(f.get("score"), ".3f"),
                    *(_part(f, r, name, spec) for _, name, spec in parts),
                    _num(r.get("goal"), ".1f"),
                    _num(r["desired"], "d"),
                    _num(r.get("realised"), ".1f"),
                    _num(r.get("intended"), ".1f"),
                ]
            )
    return [*_table(rows), legend]
