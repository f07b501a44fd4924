"""requirements.lock is what the image installs: every runtime dependency pinned exactly, with
hashes, within what pyproject.toml asks for (`make lock` regenerates it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, hashes)"""
    pins: dict[str, tuple[str, int]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := PIN.match(line):
            name = canonicalize_name(match.group(1))
            pins[name] = (match.group(2), 0)
        elif "--hash=sha256:" in line and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


def test_every_runtime_dependency_is_locked_within_its_range_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked()
    for spec in project["dependencies"]:
        wanted = Requirement(spec)
        name = canonicalize_name(wanted.name)
        assert name in pins, f"{wanted.name} is not in requirements.lock: run `make lock`"
        version, _ = pins[name]
        assert wanted.specifier.contains(version), f"{name}=={version} outside {wanted}"
    assert all(hashes > 0 for _, hashes in pins.values())
    text = (ROOT / "requirements.lock").read_text()
    assert "--index-url" not in text and "--find-links" not in text  # nothing of this machine


def test_the_image_installs_the_lock_and_nothing_else() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes -r requirements.lock" in dockerfile
    assert "--no-deps ." in dockerfile  # the package itself adds no unlocked dependency
