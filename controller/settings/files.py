"""The files the settings name, checked where the process runs: tokens, CA bundles, the
kubeconfig, the serving certificate. ``check-config`` reports them with the rest, and ``run``
refuses to start on them (one line each) instead of failing later mid-tick."""

from __future__ import annotations

import ssl
from pathlib import Path

from controller.settings.schema import Settings


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
