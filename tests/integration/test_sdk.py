"""kubernetes-asyncio loaded by the piece: the real classes, only the modules that are used."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run(code: str) -> dict[str, object]:
    """``code`` in a fresh interpreter (imports are process-wide); it prints one JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_daemon_loads_a_few_dozen_client_modules_not_fifteen_hundred() -> None:
    found = run(
        """
        import json, sys
        import controller.app
        from controller.kube.sdk import client
        client.CoordinationV1Api, client.CustomObjectsApi, client.V1Lease
        names = [m for m in sys.modules if m.startswith("kubernetes_asyncio")]
        print(json.dumps({"modules": len(names)}))
        """
    )
    modules = found["modules"]
    assert isinstance(modules, int) and 10 <= modules <= 60


def test_names_are_the_real_classes_and_nested_models_deserialise() -> None:
    found = run(
        """
        import asyncio, json
        from controller.kube.sdk import client
        from kubernetes_asyncio.client.models.v1_lease import V1Lease
        from kubernetes_asyncio.client.api.coordination_v1_api import CoordinationV1Api

        async def read():
            async with client.ApiClient() as api:
                return api._ApiClient__deserialize(
                    {"metadata": {"name": "x", "resourceVersion": "7"},
                     "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15}},
                    "V1Lease",
                )

        lease = asyncio.run(read())
        print(json.dumps({
            "same_lease": client.V1Lease is V1Lease,
            "same_api": client.CoordinationV1Api is CoordinationV1Api,
            "type": type(lease.spec).__name__,
            "holder": lease.spec.holder_identity,
            "version": lease.metadata.resource_version,
        }))
        """
    )
    assert found == {
        "same_lease": True,
        "same_api": True,
        "type": "V1LeaseSpec",
        "holder": "pod-a",
        "version": "7",
    }


def test_an_unknown_name_is_an_attribute_error() -> None:
    from controller.kube.sdk import client

    with pytest.raises(AttributeError, match="NoSuchApi"):
        getattr(client, "NoSuchApi")  # noqa: B009  (a name the package does not have)


def test_a_package_imported_first_is_left_whole() -> None:
    found = run(
        """
        import json, sys
        import kubernetes_asyncio.client
        before = len(sys.modules)
        from controller.kube import sdk
        print(json.dumps({"installed": sdk.install(), "whole": before > 1000}))
        """
    )
    assert found == {"installed": False, "whole": True}


def test_only_the_sdk_module_imports_kubernetes_asyncio() -> None:
    """Any other module importing it first would load the whole package again."""
    package = Path(__file__).resolve().parents[2] / "controller"
    direct = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n.split(".")[0] == "kubernetes_asyncio" for n in names):
                direct.append(str(path.relative_to(package)))
    assert direct == ["kube/sdk.py"] * 4
