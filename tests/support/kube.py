"""Kubernetes objects the tests seed the API-server double with, and helpers around it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.kube.objects import MANAGED_LABEL
from controller.settings import Settings, build_settings
from tests.support.apiserver import FakeAPIServer

CRD = "inference.opendatahub.io/v1alpha1"


NS = "maas-system"


def provider(
    name: str, annotations: dict[str, str] | None = None, namespace: str = NS
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    spec = {
        "provider": "openai",
        "endpoint": f"{name}.example.com",
        "auth": {"type": "simple", "secretRef": {"name": f"{name}-api-key"}},
    }
    return {"metadata": meta, "spec": spec}


def model(
    name: str,
    refs: list[tuple[str, int]],
    managed: bool = True,
    namespace: str = NS,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {MANAGED_LABEL: "true"} if managed else {}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {
            "externalProviderRefs": [
                {
                    "ref": {"name": ref},
                    "targetModel": "llama",
                    "apiFormat": "openai-chat",
                    "path": "/v1/chat/completions",
                    "weight": weight,
                }
                for ref, weight in refs
            ]
        },
    }


def seed(apiserver: FakeAPIServer, refs: list[tuple[str, int]], name: str = "llama") -> None:
    for ref, _ in refs:
        if apiserver.get(CRD, "externalproviders", NS, ref) is None:
            apiserver.put_object(CRD, "externalproviders", provider(ref))
    apiserver.put_object(CRD, "externalmodels", model(name, refs))


def weights_of(
    apiserver: FakeAPIServer, name: str = "llama", namespace: str = NS
) -> dict[str, int]:
    obj = apiserver.get(CRD, "externalmodels", namespace, name)
    assert obj is not None
    return {r["ref"]["name"]: r["weight"] for r in obj["spec"]["externalProviderRefs"]}


def hot_and_cool() -> Fleet:
    """east hot (KV 0.95), west cool (0.2), no noise: every tick wants weight moved east→west."""
    return Fleet([SimCluster("east", kv=0.95, noise=0.0), SimCluster("west", kv=0.2, noise=0.0)])


def settings_for(sims: Fleet, **extra: Any) -> Settings:
    # These tests call once() back to back, faster than the interval: no settling between
    # steps (weights.settle: 0), so every tick may take its step. They change objects between
    # ticks and expect the next tick to read them, so they LIST each tick (kubernetes.watch:
    # false); the watch has its own tests (test_watch.py), which wait for its events.
    kube = {"enabled": True, "api_timeout": 1, "watch": False, **extra.pop("kubernetes", {})}
    return build_settings(
        {
            "interval": 1,
            "clusters": sims.settings_clusters(),
            "scrape": {"timeout": 0.5},
            "weights": {"settle": 0, **extra.pop("weights", {})},
            "kubernetes": kube,
            **extra,
        }
    )


async def ticks(controller: Controller, n: int) -> None:
    for _ in range(n):
        await controller.once()


async def wait_until(check: Callable[[], bool], seconds: float) -> float:
    loop = asyncio.get_running_loop()
    began = loop.time()
    while loop.time() - began < seconds:
        if check():
            return loop.time() - began
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


GATEWAY = "gateway.networking.k8s.io/v1"


def route(rules: list[list[tuple[str, int]]], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "apps", **meta},
        "spec": {
            "rules": [
                {"backendRefs": [{"name": n, "port": 8000, "weight": w} for n, w in rule]}
                for rule in rules
            ]
        },
    }


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": server}}],
                "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
                "contexts": [
                    {"name": "double", "context": {"cluster": "double", "user": "tester"}}
                ],
                "current-context": "double",
            }
        )
    )
    return path
