"""The files the settings name, checked where the process runs: tokens, CA bundles, the
kubeconfig, the serving certificate. ``check-config`` reports them with the rest, and ``run``
refuses to start on them (one line each) instead of failing later mid-tick."""

from __future__ import annotations

import errno
import os
import ssl
import stat
from pathlib import Path

import yaml

from controller.settings.schema import Settings

# A bearer token is a few kilobytes (a projected service-account token ~1 KB, an OIDC one a
# few); a file larger than this is not one, and would go in every request's header.
TOKEN_MAX_BYTES = 64 * 1024
# What any other file the settings name may be (a system CA bundle is ~200 KB).
FILE_MAX_BYTES = 16 * 1024 * 1024


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them, or an OSError saying why not. Opened
    without blocking and judged on what was opened (``fstat``): a FIFO with no writer blocked
    ``check-config`` for ever, and would block the event loop that reads a token (found by an
    attack); a device or a directory is no file either. Follows symlinks (a projected token
    is one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or directory)")
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew since
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def regular(path: Path) -> None:
    """An OSError unless ``path`` is a regular file now (``stat``, which never blocks): for
    files another library opens by their path (a serving certificate reloaded)."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or directory)")


def read_token(path: Path) -> str:
    """A bearer token file's text (``read_regular``), or why it cannot be one: an OSError, or a
    ValueError (``token_problem``)."""
    text = read_regular(path, TOKEN_MAX_BYTES).decode("utf-8", "replace")
    if why := token_problem(text):
        raise ValueError(why)
    return text.strip()


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
            if token:
                read_token(path)
            else:
                read_regular(path, FILE_MAX_BYTES)
            if ca:  # a regular file: loaded by its path, as the run loads it (comments in any
                # encoding, which ``cadata`` refuses as a str)
                ssl.create_default_context(cafile=str(path))
        except OSError as exc:
            problems.append(f"{where}: cannot read {path}: {exc.strerror or exc}")
        except ssl.SSLError as exc:
            problems.append(f"{where}: {path} is not a CA bundle: {exc.reason or exc}")
        except ValueError as exc:  # a token a header cannot carry (``token_problem``)
            problems.append(f"{where}: {path}: {exc}")

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
    kubeconfig = settings.kubernetes.kubeconfig
    why = (
        kubeconfig_problem(kubeconfig, settings.kubernetes.context)
        if kubeconfig is not None and not problems_of(problems, "kubernetes.kubeconfig")
        else None
    )
    if why is not None:
        problems.append(f"kubernetes.kubeconfig: {kubeconfig}: {why}")
    readable("server.tls_cert_file", settings.server.tls_cert_file)
    readable("server.tls_key_file", settings.server.tls_key_file)
    cert, key = settings.server.tls_cert_file, settings.server.tls_key_file
    if cert is not None and key is not None and not problems_of(problems, "server.tls_"):
        # loaded as the server loads them: a key of another certificate, or no PEM, passed
        # check-config and then failed run with "[X509: KEY_VALUES_MISMATCH]" and no field
        # named (found by an attack)
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            cause = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            problems.append(
                f"server.tls_cert_file: {cert} with server.tls_key_file {key} cannot serve "
                f"TLS: {cause} (a key of another certificate, or not PEM?)"
            )
    return problems


def kubeconfig_problem(path: Path, context: str | None) -> str | None:
    """Why ``path`` is no kubeconfig the client can load with ``context`` (its
    current-context if ``None``), or ``None``: /etc/hostname, an empty file or bad YAML
    passed check-config and then raised a TypeError or a YAML traceback at run time (found
    by an attack). The client checks the rest (server, credentials) when it loads it."""
    try:
        data = yaml.safe_load(read_regular(path, FILE_MAX_BYTES).decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        return f"not YAML: {type(exc).__name__}"
    if not isinstance(data, dict):
        return "not a kubeconfig (a YAML mapping with clusters, users and contexts)"
    contexts = data.get("contexts")
    names = (
        [c.get("name") for c in contexts if isinstance(c, dict)]
        if isinstance(contexts, list)
        else []
    )
    wanted = context or data.get("current-context")
    if not wanted:
        return "names no current-context, and kubernetes.context is not set"
    if wanted not in names:
        return f"has no context {wanted!r} (its contexts: {', '.join(map(str, names)) or 'none'})"
    return None


def problems_of(problems: list[str], field: str) -> bool:
    """A problem already names ``field`` (or a field it begins)."""
    return any(p.startswith(field) for p in problems)
