"""Checks between fields, run on raw data so that they are reported in the same run as the field
errors (every problem of a file at once, not one per attempt). The files the settings name are
checked in ``files``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.engines import AUTO, ENGINES
from controller.settings.durations import (
    API_TIMEOUT,
    INTERVAL,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    default_staleness,
    seconds,
)


def cross_field_problems(data: Mapping[str, Any]) -> list[str]:
    """Problems between fields, found leniently on raw data, so that they are reported in the
    same run as the field errors (every problem of a file at once, not one per attempt)."""
    problems: list[str] = []
    interval = seconds(data.get("interval", INTERVAL))
    clusters = [c for c in _items(data.get("clusters")) if isinstance(c, dict)]
    names = [str(c.get("name")) for c in clusters if c.get("name")]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        problems.append(f"clusters: names must be unique: {', '.join(duplicates)}")
    scrape = data.get("scrape") or {}
    # unset: 3 s, or half the interval when that is shorter (never past it)
    timeout = seconds(scrape.get("timeout")) if isinstance(scrape, dict) else None
    if interval is not None and timeout is not None and timeout >= interval:
        problems.append("scrape.timeout: must be shorter than interval")
    staleness = _staleness(data, interval)
    if interval is not None and staleness is not None and staleness <= interval:
        problems.append(
            f"health.max_staleness: {staleness:g}s must be longer than interval ({interval:g}s): "
            "a reading held through one failed fetch is an interval old, and would be judged "
            "stale at once, every cluster's on its first failure"
        )
    for index, cluster in enumerate(clusters):
        prometheus = cluster.get("prometheus")
        own = prometheus.get("timeout") if isinstance(prometheus, dict) else cluster.get("timeout")
        limit = seconds(own) if own is not None else None
        if interval is not None and limit is not None and limit >= interval:
            problems.append(f"clusters[{index}].timeout: must be shorter than interval")
    problems += _querier_problems(data, clusters)
    problems += _engine_problems(data, clusters)
    kubernetes = data.get("kubernetes") or {}
    problems += _needs_kubernetes(kubernetes, data.get("leader_election"), clusters)
    problems += leader_problems(kubernetes, data.get("leader_election"))
    routes = kubernetes.get("httproutes") if isinstance(kubernetes, dict) else None
    seen: dict[tuple[object, object], int] = {}
    for index, route in enumerate(_items(routes)):
        if not isinstance(route, dict):
            continue
        first = seen.setdefault((route.get("namespace"), route.get("name")), index)
        if first != index:  # the last entry's mapping silently won (found by an attack)
            problems.append(
                f"kubernetes.httproutes[{index}]: {route.get('namespace')}/{route.get('name')} "
                f"is httproutes[{first}] too: one entry a route, its backends mapped once"
            )
    for index, route in enumerate(_items(routes)):
        backends = route.get("backends") if isinstance(route, dict) else None
        for backend, cluster_name in (backends or {}).items() if isinstance(backends, dict) else ():
            if cluster_name not in names:
                problems.append(
                    f"kubernetes.httproutes[{index}].backends.{backend}: "
                    f"no cluster named {cluster_name!r}"
                )
    return problems


def _staleness(data: Mapping[str, Any], interval: float | None) -> float | None:
    """``health.max_staleness`` as the raw data sets it, or as it defaults for the interval
    (``default_staleness``; the checks run on raw data too, beside the field errors)."""
    health = data.get("health", {})
    if not isinstance(health, dict):
        return None
    if "max_staleness" in health:
        return seconds(health["max_staleness"])
    return default_staleness(interval) if interval is not None else None


def _items(value: object) -> list[Any]:
    """A list as the raw data gives it, or none: a number where a list belongs is the
    field's own error (``clusters: Input should be a valid list``), never a crash here."""
    return value if isinstance(value, list) else []


def leader_problems(kubernetes: object, election: object, enabled: bool = False) -> list[str]:
    """With leader election on (in the file, or ``enabled``: ``--leader-elect``), a leader
    writes only with a whole ``api_timeout`` of its lease left (``publish.kubernetes``), and
    its lease runs ``renew_deadline`` from a renewal begun every ``retry_period``: unless
    ``api_timeout + retry_period < renew_deadline`` it may hold the Lease and never write
    (nor let another replica)."""
    kube = kubernetes if isinstance(kubernetes, dict) else {}
    lease = election if isinstance(election, dict) else {}
    if not (enabled or lease.get("enabled") is True):
        return []
    timeout = seconds(kube.get("api_timeout", API_TIMEOUT))
    renew = seconds(lease.get("renew_deadline", RENEW_DEADLINE))
    retry = seconds(lease.get("retry_period", RETRY_PERIOD))
    if timeout is None or renew is None or retry is None or timeout + retry < renew:
        return []
    return [
        f"kubernetes.api_timeout: {timeout:g}s with leader_election.retry_period {retry:g}s "
        f"must stay under leader_election.renew_deadline {renew:g}s: a leader writes only "
        "with a whole API timeout of its lease left, so it would hold the Lease and never "
        "write (lower api_timeout, or raise renew_deadline and lease_duration)"
    ]


def _needs_kubernetes(
    kubernetes: object, election: object, clusters: list[dict[str, Any]]
) -> list[str]:
    """What is read through the controller's Kubernetes client needs that client: there is
    one when Kubernetes targets or leader election are on (``app.Controller``)."""
    on = [g.get("enabled") is True for g in (kubernetes, election) if isinstance(g, dict)]
    if any(on):
        return []
    problems = []
    for index, cluster in enumerate(clusters):
        pods = cluster.get("pods")
        if isinstance(pods, dict) and pods.get("endpoint_slices") is not None:
            problems.append(
                f"clusters[{index}].pods.endpoint_slices: needs kubernetes.enabled or "
                "leader_election.enabled (they are read through the controller's Kubernetes "
                "client)"
            )
        if cluster.get("inference_pool") is not None:
            problems.append(
                f"clusters[{index}].inference_pool: needs kubernetes.enabled or "
                "leader_election.enabled (the pool and its EPP Service are read through the "
                "controller's Kubernetes client)"
            )
    return problems


def _engine_problems(data: Mapping[str, Any], clusters: list[dict[str, Any]]) -> list[str]:
    """The config's own engines have names of their own, and a cluster names a known one."""
    problems: list[str] = []
    own = [e.get("name") for e in _items(data.get("engines")) if isinstance(e, dict)]
    twice = sorted({str(n) for n in own if own.count(n) > 1})
    if twice:
        problems.append(f"engines: names must be unique: {', '.join(twice)}")
    known = {AUTO, *ENGINES, *(str(n) for n in own)}
    for index, cluster in enumerate(clusters):
        engine = cluster.get("engine", AUTO)
        if isinstance(engine, str) and engine not in known:
            choices = ", ".join([AUTO, *ENGINES, *(str(n) for n in own)])
            problems.append(f"clusters[{index}].engine: {engine!r} is not an engine: {choices}")
    return problems


def _querier_problems(data: Mapping[str, Any], clusters: list[dict[str, Any]]) -> list[str]:
    """A cluster's querier must exist, names must be unique, and health.max_staleness must
    allow two of a querier's push intervals: samples that arrive every 5 minutes are up to 5
    minutes old by design, and a shorter limit would judge every cluster behind it stale."""
    problems: list[str] = []
    queriers = [q for q in _items(data.get("queriers")) if isinstance(q, dict)]
    names = [str(q.get("name")) for q in queriers if q.get("name")]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        problems.append(f"queriers: names must be unique: {', '.join(twice)}")
    interval = seconds(data.get("interval", INTERVAL))
    for index, querier in enumerate(queriers):
        # a round is shielded from the tick's deadline (every cluster of it awaits the same
        # answers): one longer than the interval overlaps the next, and rounds pile up with
        # their connections (found by an attack: 11 more open sockets a tick)
        limit = seconds(querier.get("timeout"))
        if interval is not None and limit is not None and limit >= interval:
            problems.append(f"queriers[{index}].timeout: must be shorter than interval")
    read_as: dict[tuple[str, str], int] = {}
    shared = any(
        isinstance(c.get("prometheus"), dict) and c["prometheus"].get("querier") is not None
        for c in clusters
    )
    given = data.get("prometheus_queries")
    for name, text in given.items() if shared and isinstance(given, dict) else ():
        # a shared querier's one query is for all its clusters: without the matchers it
        # reads others' series, without the grouping every cluster came back empty
        # (missing_metric), each blamed on the cluster (found by an attack)
        if not isinstance(text, str) or name == "window":
            continue
        missing = [
            p for p in ("$selector", "$by") if p not in text and "${" + p[1:] + "}" not in text
        ]
        if "$and_by" in text:
            missing = [p for p in missing if p != "$by"]
        if missing:
            problems.append(
                f"prometheus_queries.{name}: a shared querier (queriers[]) needs "
                f"{' and '.join(missing)}: its one query is for all its clusters, matched "
                "and grouped by its cluster label"
            )
    staleness = _staleness(data, seconds(data.get("interval", INTERVAL)))
    pushes = [(f"queriers[{i}]", q.get("push_interval", 30.0)) for i, q in enumerate(queriers)]
    for index, cluster in enumerate(clusters):
        prometheus = cluster.get("prometheus")
        if not isinstance(prometheus, dict):
            continue
        wanted = prometheus.get("querier")
        if wanted is not None and wanted not in names:
            problems.append(f"clusters[{index}].prometheus.querier: no querier named {wanted!r}")
        value = prometheus.get("cluster") or cluster.get("name")
        if isinstance(wanted, str) and isinstance(value, str):
            first = read_as.setdefault((wanted, value), index)
            if first != index:
                problems.append(
                    f"clusters[{index}].prometheus.cluster: {value!r} of querier {wanted!r} is "
                    f"clusters[{first}]'s: both would read the same series, one cluster's load "
                    "counted twice"
                )
        if prometheus.get("url") is not None:
            push = prometheus.get("push_interval", 30.0)
            pushes.append((f"clusters[{index}].prometheus", push))
    for where, push in pushes:
        interval = seconds(push)
        if staleness is not None and interval is not None and staleness < 2 * interval:
            problems.append(
                f"health.max_staleness: {staleness:g}s is shorter than twice "
                f"{where}.push_interval ({interval:g}s): every cluster read through it would "
                f"be judged stale; raise it to at least {2 * interval:g}s"
            )
    return problems
