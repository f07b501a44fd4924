"""The image's entry point, exercised as the image runs it (no Docker engine here): the built
wheel installed into a fresh virtualenv beside its dependencies from requirements.lock (hashes
checked, as the Dockerfile installs them), started as another, non-root user that can write
nothing of its own install — OpenShift's restricted-v2 gives the pod an arbitrary UID and the
Deployment a read-only root filesystem."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller import __version__
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
UID = 54321  # no such user: any UID must do, as on OpenShift
BUILD_IGNORES = (".git", ".venv*", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start the entry point as another user")
    base = Path(tempfile.mkdtemp(prefix="wc-image-", dir="/tmp"))
    try:
        # built from a copy: pip builds in the tree it is given (build/, *.egg-info), where a
        # module deleted since the last build would be packaged again, and two workers of
        # the suite would share it
        source = base / "source"
        shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*BUILD_IGNORES))
        wheels = base / "wheels"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "-w",
                str(wheels),
                str(source),
            ],
            check=True,
            timeout=300,
            capture_output=True,
        )
        (wheel,) = wheels.glob("weight_controller-*.whl")
        venv = base / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
        )
        # the dependencies exactly as the image installs them: from the lock, hashes checked;
        # then the package itself, adding nothing
        lock = str(ROOT / "requirements.lock")
        pip_into(venv, "--require-hashes", "--no-deps", "-r", lock)
        pip_into(venv, "--no-deps", str(wheel))
        for path in [base, *base.rglob("*")]:  # readable by anyone, writable by nobody else
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        yield venv
    finally:
        shutil.rmtree(base, ignore_errors=True)


PIP = (sys.executable, "-m", "pip")


def pip_into(venv: Path, *args: str) -> None:
    subprocess.run(
        [
            *PIP,
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-compile",
            *args,
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )


def as_other_user(*command: str) -> list[str]:
    return ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *command]


ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1"}


def test_the_entry_point_runs_from_the_wheel_as_an_arbitrary_uid(installed: Path) -> None:
    entry = str(installed / "bin" / "weight-controller")
    done = subprocess.run(
        as_other_user(entry, "--version"),
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == __version__
    imported = subprocess.run(
        as_other_user(
            str(installed / "bin" / "python"), "-c", "import controller; print(controller.__file__)"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
        cwd="/",
    )
    assert str(installed) in imported.stdout  # the wheel's copy, not the source tree


def test_the_daemon_starts_serves_and_stops_cleanly_as_that_user(installed: Path) -> None:
    port = free_port()
    config = installed.parent / "config.yaml"
    config.write_text(
        "interval: 5s\n"
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:9/metrics']}]\n"
        f"server: {{bind: '127.0.0.1:{port}'}}\nlog: {{format: json}}\n"
    )
    config.chmod(0o644)
    child = subprocess.Popen(
        as_other_user(str(installed / "bin" / "weight-controller"), "run", "--config", str(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 30
        served = False
        while time.monotonic() < deadline and not served:
            probe = subprocess.run(
                [
                    "python3",
                    "-c",
                    f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/healthz', timeout=1).status)",
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
            served = probe.stdout.strip() == "200"
            time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=15)
    assert served, f"the daemon never answered /healthz: {err}"
    assert child.returncode == 0, err
    assert '"event": "serving"' in out and "Traceback" not in out + err
