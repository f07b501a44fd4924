"""The Topologies chapter (manifests/topologies/README.md) holds: every config it shows loads
and passes `check-config` with the files it names present, every component renders over the
base and validates, the spoke-side manifests render, and the ACM allowlist carries exactly the
series the controller reads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controller import families
from controller.engines import ENGINES
from controller.settings import build_settings, load_settings
from controller.settings.queries import PrometheusQueries
from tests.support.manifests import ROOT

TOPOLOGIES = ROOT / "manifests" / "topologies"
CONFIGS = [ROOT / "manifests" / "base" / "config.yaml", *sorted(TOPOLOGIES.glob("*/config.yaml"))]
COMPONENTS = sorted(p.parent.name for p in TOPOLOGIES.glob("*/kustomization.yaml"))
NOT_CORE = {"ServiceMonitor", "PrometheusRule", "Route"}  # CRDs kubernetes-validate lacks
K8S_VERSION = kubernetes_validate.latest_version()


def test_the_chapter_shows_every_topology_and_its_config() -> None:
    chapter = (TOPOLOGIES / "README.md").read_text()
    for config in CONFIGS[1:]:
        assert config.relative_to(TOPOLOGIES).as_posix() in chapter, config
    assert "../base/config.yaml" in chapter  # the base's own: the spoke EPP
    readme = (ROOT / "README.md").read_text()
    assert "manifests/topologies/README.md" in readme


def test_the_shipped_config_describes_a_fleet() -> None:
    settings = load_settings(ROOT / "manifests" / "base" / "config.yaml")
    assert len(settings.clusters) >= 2
    # the spoke-EPP topology: each cluster through its EPP, none through listed pods
    assert all(c.epp_url is not None and not c.vllm_urls for c in settings.clusters)


def _ca(directory: Path) -> Path:
    cert, key = directory / "ca.crt", directory / "ca.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=test", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert


@pytest.mark.parametrize("config", CONFIGS, ids=[p.relative_to(ROOT).as_posix() for p in CONFIGS])
def test_every_topology_config_passes_check_config(config: Path, tmp_path: Path) -> None:
    """The paths a config names are the pod's; here each is made under tmp_path (a token, a
    CA bundle, the serving certificate), so check-config checks the config, not this host."""
    text = config.read_text()
    ca = _ca(tmp_path)
    for path in sorted(set(re.findall(r"(/(?:var/run|etc)/[\w./-]+)", text))):
        local = tmp_path / "root" / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith((".crt", ".key")):
            shutil.copy(ca if path.endswith(".crt") else ca.with_suffix(".key"), local)
        else:
            local.write_text("a-token\n")
        text = text.replace(path, str(local))
    copy = tmp_path / "config.yaml"
    copy.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIGHT_CONTROLLER_")}
    done = subprocess.run(
        [sys.executable, "-m", "controller", "check-config", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["clusters"]


def _render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with kustomize) is needed to render manifests/"
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],  # the default load restrictor, as a user runs it
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] not in NOT_CORE:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_topology_component_renders_over_the_base(component: str, tmp_path: Path) -> None:
    base = os.path.relpath(ROOT / "manifests", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base],
                "components": [f"{base}/topologies/{component}"],
            }
        )
    )
    objects = _render(tmp_path)
    _validate(objects)
    config = next(o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o["data"])
    shipped = yaml.safe_load((TOPOLOGIES / component / "config.yaml").read_text())
    assert yaml.safe_load(config["data"]["config.yaml"]) == shipped  # it replaced the base's
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    mounted = {
        m["mountPath"]
        for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    for path in re.findall(r"(/(?:var/run|etc)/[\w./-]+)", yaml.safe_dump(shipped)):
        assert any(path.startswith(m + "/") for m in mounted), (component, path, mounted)
    # the kubelet probes the port the daemon serves its probes on (found by an audit: three
    # components' configs had no probe_bind, so their pods never became ready)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        port = container[probe]["httpGet"]["port"]
        number = ports[port] if isinstance(port, str) else port
        assert shipped["server"].get("probe_bind", "").endswith(f":{number}"), (component, probe)


@pytest.mark.parametrize(
    "where", ["spoke-epp/spoke", "spoke-prometheus/spoke", "flat-network/model-namespace"]
)
def test_the_manifests_for_the_other_side_render(where: str) -> None:
    objects = _render(TOPOLOGIES / where)
    assert objects
    _validate(objects)


def read_by_default_templates() -> set[str]:
    """Every metric name the default PromQL templates select, each spelling of a name with a
    colon (``ns[:_]x``) both ways."""
    found: set[str] = set()
    for template in PrometheusQueries().model_dump().values():
        for pattern in re.findall(r'__name__=~"([^"]+)"', template):
            found |= {pattern.replace("[:_]", c) for c in ":_"}
        found |= set(re.findall(r'__name__="([^"]+)"', template))
    return found


def test_the_acm_allowlist_carries_exactly_what_the_controller_reads() -> None:
    allowlist = yaml.safe_load(
        (TOPOLOGIES / "hub-thanos" / "observability-metrics-custom-allowlist.yaml").read_text()
    )
    names = set(yaml.safe_load(allowlist["data"]["uwl_metrics_list.yaml"])["names"])
    wanted = read_by_default_templates()
    assert names == wanted, (sorted(wanted - names), sorted(names - wanted))
    # every engine's signals are among them, and the EPP's
    for engine in ENGINES.values():
        assert {*engine.kv.names, *engine.waiting.names, *engine.running.names} <= wanted
    assert {*families.EPP_LATENCY} <= {n.removesuffix("_bucket") for n in wanted}


def test_the_ray_serve_section_s_config_and_service_are_valid() -> None:
    """The Ray Serve section's snippets: a config the controller accepts, reading its
    clusters by the ray-vllm row, and a headless Service Kubernetes accepts."""
    chapter = (TOPOLOGIES / "README.md").read_text()
    section = chapter.split("## Ray Serve LLM", 1)[1].split("\n## ", 1)[0]
    config, service = (yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S))
    settings = build_settings(config)
    assert {c.engine for c in settings.clusters} == {"ray-vllm"}
    assert all(c.model_name for c in settings.clusters)
    kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    assert service["spec"]["clusterIP"] == "None"
