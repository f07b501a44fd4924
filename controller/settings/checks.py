"""Checks between fields, run on raw data so that they are reported in the same run as the field
errors (every problem of a file at once, not one per attempt). The files the settings name are
checked in ``files``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.settings.durations import INTERVAL, SCRAPE_TIMEOUT, seconds


def cross_field_problems(data: Mapping[str, Any]) -> list[str]:
    """Problems between fields, found leniently on raw data, so that they are reported in the
    same run as the field errors (every problem of a file at once, not one per attempt)."""
    problems: list[str] = []
    interval = seconds(data.get("interval", INTERVAL))
    clusters = [c for c in data.get("clusters") or [] if isinstance(c, dict)]
    names = [str(c.get("name")) for c in clusters if c.get("name")]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        problems.append(f"clusters: names must be unique: {', '.join(duplicates)}")
    scrape = data.get("scrape") or {}
    timeout = seconds(scrape.get("timeout", SCRAPE_TIMEOUT)) if isinstance(scrape, dict) else None
    if interval is not None and timeout is not None and timeout >= interval:
        problems.append("scrape.timeout: must be shorter than interval")
    for index, cluster in enumerate(clusters):
        prometheus = cluster.get("prometheus")
        own = prometheus.get("timeout") if isinstance(prometheus, dict) else cluster.get("timeout")
        limit = seconds(own) if own is not None else None
        if interval is not None and limit is not None and limit >= interval:
            problems.append(f"clusters[{index}].timeout: must be shorter than interval")
    kubernetes = data.get("kubernetes") or {}
    routes = kubernetes.get("httproutes") if isinstance(kubernetes, dict) else None
    for index, route in enumerate(routes or []):
        backends = route.get("backends") if isinstance(route, dict) else None
        for backend, cluster_name in (backends or {}).items() if isinstance(backends, dict) else ():
            if cluster_name not in names:
                problems.append(
                    f"kubernetes.httproutes[{index}].backends.{backend}: "
                    f"no cluster named {cluster_name!r}"
                )
    return problems
