"""The shipped manifests as kustomize renders them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def render(path: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with kustomize) is needed to render manifests/"
    done = subprocess.run(
        [kubectl, "kustomize", str(ROOT / path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
