"""The files the settings name, checked where the process runs: tokens, CA bundles, the
kubeconfig, the serving certificate. ``check-config`` reports them with the rest, and ``run``
refuses to start on them (one line each) instead of failing later mid-tick."""

from __future__ import annotations

import ssl
from pathlib import Path

from controller.settings.schema import Settings


def token_problem(text: str) -> str | None:
    """Why a token file's text cannot be a bearer token, or ``None``: RFC 6750 tokens are
    visible ASCII, and anything else cannot go in a header (read at start-up here, and by
    ``sources.http.TokenFile`` each time the file changes)."""
    token = text.strip()
    if not token or not all(33 <= ord(c) < 127 for c in token):
        return "the token is empty or holds characters a header cannot carry"
    return None


def file_problems(settings: Settings) -> list[str]:
    """Files the settings name that cannot be used here: tokens, CA bundles, the kubeconfig,
    the serving certificate. ``check-config`` reports them with the rest, and ``run`` refuses
    to start on them (one line each) instead of failing later mid-tick."""
    problems: list[str] = []

    def readable(where: str, path: Path | None, ca: bool = False, token: bool = False) -> None:
        if path is None:
            return
        try:
            read = path.read_bytes()
            if ca:
                ssl.create_default_context(cafile=str(path))
        except OSError as exc:
            problems.append(f"{where}: cannot read {path}: {exc.strerror or exc}")
            return
        except ssl.SSLError as exc:
            problems.append(f"{where}: {path} is not a CA bundle: {exc.reason or exc}")
            return
        if token and (why := token_problem(read.decode("utf-8", "replace"))):
            problems.append(f"{where}: {path}: {why}")

    for i, c in enumerate(settings.clusters):
        readable(f"clusters[{i}].bearer_token_file", c.bearer_token_file, token=True)
        readable(f"clusters[{i}].epp_bearer_token_file", c.epp_bearer_token_file, token=True)
        readable(f"clusters[{i}].ca_file", c.ca_file, ca=True)
        if c.prometheus is not None:
            readable(
                f"clusters[{i}].prometheus.bearer_token_file",
                c.prometheus.bearer_token_file,
                token=True,
            )
            readable(f"clusters[{i}].prometheus.ca_file", c.prometheus.ca_file, ca=True)
    for i, q in enumerate(settings.queriers):  # found by a review: they were not checked
        readable(f"queriers[{i}].bearer_token_file", q.bearer_token_file, token=True)
        readable(f"queriers[{i}].ca_file", q.ca_file, ca=True)
    readable("kubernetes.kubeconfig", settings.kubernetes.kubeconfig)
    readable("server.tls_cert_file", settings.server.tls_cert_file)
    readable("server.tls_key_file", settings.server.tls_key_file)
    return problems
