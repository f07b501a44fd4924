"""Checks beyond one field: between fields (on raw data, so that they are reported in the same
run as the field errors) and of the files the settings name (``check-config`` reports them with
the rest, and ``run`` refuses to start on them)."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.settings.durations import INTERVAL, SCRAPE_TIMEOUT, seconds

if TYPE_CHECKING:
    from controller.settings.schema import Settings


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


def file_problems(settings: Settings) -> list[str]:
    """Files the settings name that cannot be used here: tokens, CA bundles, the kubeconfig,
    the serving certificate. ``check-config`` reports them with the rest, and ``run`` refuses
    to start on them (one line each) instead of failing later mid-tick."""
    problems: list[str] = []

    def readable(where: str, path: Path | None, ca: bool = False) -> None:
        if path is None:
            return
        try:
            path.read_bytes()
            if ca:
                ssl.create_default_context(cafile=str(path))
        except OSError as exc:
            problems.append(f"{where}: cannot read {path}: {exc.strerror or exc}")
        except ssl.SSLError as exc:
            problems.append(f"{where}: {path} is not a CA bundle: {exc.reason or exc}")

    for i, c in enumerate(settings.clusters):
        readable(f"clusters[{i}].bearer_token_file", c.bearer_token_file)
        readable(f"clusters[{i}].epp_bearer_token_file", c.epp_bearer_token_file)
        readable(f"clusters[{i}].ca_file", c.ca_file, ca=True)
        if c.prometheus is not None:
            readable(f"clusters[{i}].prometheus.bearer_token_file", c.prometheus.bearer_token_file)
            readable(f"clusters[{i}].prometheus.ca_file", c.prometheus.ca_file, ca=True)
    readable("kubernetes.kubeconfig", settings.kubernetes.kubeconfig)
    readable("server.tls_cert_file", settings.server.tls_cert_file)
    readable("server.tls_key_file", settings.server.tls_key_file)
    return problems
