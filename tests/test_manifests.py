"""``kubectl kustomize manifests`` renders objects that validate against the Kubernetes schemas,
the samples follow the ExternalModel CRD's rules, and the security settings are what we claim."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from controller.kube import objects
from controller.settings import build_settings

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = kubernetes_validate.latest_version()

# The ExternalModel / ExternalProvider rules we rely on (inference.opendatahub.io/v1alpha1).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
EXTERNAL_MODEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.opendatahub.io/v1alpha1"},
        "kind": {"const": "ExternalModel"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": DNS_SUBDOMAIN, "maxLength": 253}},
        },
        "spec": {
            "type": "object",
            "required": ["externalProviderRefs"],
            "properties": {
                "externalProviderRefs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 64,
                    "items": {
                        "type": "object",
                        "required": ["ref", "targetModel", "apiFormat", "path"],
                        "properties": {
                            "ref": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string", "pattern": DNS_SUBDOMAIN}
                                },
                            },
                            "targetModel": {"type": "string", "minLength": 1},
                            "apiFormat": {"type": "string", "minLength": 1},
                            "path": {"type": "string", "pattern": "^/"},
                            "weight": {"type": "integer", "minimum": 0, "maximum": 100},
                        },
                    },
                }
            },
        },
    },
}
EXTERNAL_PROVIDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "kind": {"const": "ExternalProvider"},
        "metadata": {"properties": {"name": {"type": "string", "pattern": DNS_SUBDOMAIN}}},
        "spec": {
            "type": "object",
            "required": ["provider", "endpoint"],
            "properties": {
                "provider": {"type": "string", "minLength": 1},
                "endpoint": {"type": "string", "pattern": DNS_SUBDOMAIN},  # a bare hostname
            },
        },
    },
}


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


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in render("manifests")}


def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: dict[str, dict[str, Any]],
) -> None:
    crds = {"ServiceMonitor", "PrometheusRule"}
    validated = 0
    for obj in rendered.values():
        if obj["kind"] in crds:
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        validated += 1
    expected = {
        "Namespace/maas-system",
        "ServiceAccount/weight-controller",
        "Role/weight-controller",
        "RoleBinding/weight-controller",
        "ClusterRole/weight-controller-metrics-reader",
        "ClusterRoleBinding/weight-controller-metrics-reader",
        "Deployment/weight-controller",
        "Service/weight-controller-metrics",
        "ServiceMonitor/weight-controller",
        "NetworkPolicy/weight-controller",
        "PodDisruptionBudget/weight-controller",
    }
    assert expected <= set(rendered)
    assert validated == len(rendered) - len([o for o in rendered.values() if o["kind"] in crds])


def test_invalid_objects_are_caught_by_the_same_validation(
    rendered: dict[str, dict[str, Any]],
) -> None:
    broken = yaml.safe_load(yaml.safe_dump(rendered["Deployment/weight-controller"]))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_deployment_is_locked_down_and_probed(rendered: dict[str, dict[str, Any]]) -> None:
    deployment = rendered["Deployment/weight-controller"]
    assert deployment["metadata"]["namespace"] == "maas-system"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert "--leader-elect" in container["args"]
    projected = [v for v in pod["volumes"] if "projected" in v]
    assert (
        projected[0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] <= 3600
    )
    config = next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"]
    assert config.startswith("weight-controller-config-")  # hashed: a change rolls the pods
    assert f"ConfigMap/{config}" in rendered


def test_rbac_is_exactly_what_the_controller_uses(rendered: dict[str, dict[str, Any]]) -> None:
    rules = {
        (rule["apiGroups"][0], resource): sorted(rule["verbs"])
        for rule in rendered["Role/weight-controller"]["rules"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("inference.opendatahub.io", "externalmodels"): ["get", "list", "patch", "watch"],
        ("inference.opendatahub.io", "externalproviders"): ["get", "list", "watch"],
        ("gateway.networking.k8s.io", "httproutes"): ["get", "list", "patch", "watch"],
        ("coordination.k8s.io", "leases"): ["create", "get", "update"],
        ("", "events"): ["create", "patch"],
    }
    reader = rendered["ClusterRole/weight-controller-metrics-reader"]["rules"]
    assert reader == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_the_shipped_config_is_valid_settings(rendered: dict[str, dict[str, Any]]) -> None:
    config_map = next(o for k, o in rendered.items() if k.startswith("ConfigMap/"))
    settings = build_settings(yaml.safe_load(config_map["data"]["config.yaml"]))
    assert settings.kubernetes.enabled and settings.leader_election.enabled
    assert settings.server.port == 8080


def test_service_and_monitor_point_at_the_metrics_port(rendered: dict[str, dict[str, Any]]) -> None:
    service = rendered["Service/weight-controller-metrics"]
    monitor = rendered["ServiceMonitor/weight-controller"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    )
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())


def test_samples_follow_the_crd_rules_and_map_to_clusters(
    rendered: dict[str, dict[str, Any]],
) -> None:
    samples = render("manifests/samples")
    models = [s for s in samples if s["kind"] == "ExternalModel"]
    providers = [s for s in samples if s["kind"] == "ExternalProvider"]
    for model in models:
        jsonschema.validate(model, EXTERNAL_MODEL_SCHEMA)
        assert model["metadata"]["labels"][objects.MANAGED_LABEL] == "true"
    for provider in providers:
        jsonschema.validate(provider, EXTERNAL_PROVIDER_SCHEMA)
    config_map = next(o for k, o in rendered.items() if k.startswith("ConfigMap/"))
    configured = {
        c.name for c in build_settings(yaml.safe_load(config_map["data"]["config.yaml"])).clusters
    }
    mapping = objects.map_providers(providers, configured)
    assert mapping.problems == ()
    target = objects.external_model(models[0], mapping)
    assert len(target.refs) >= 2 and all(ref.cluster for ref in target.refs)


def test_schema_rejects_what_the_crd_rejects() -> None:
    model = yaml.safe_load((ROOT / "manifests/samples/externalmodel.yaml").read_text())
    model["spec"]["externalProviderRefs"][0]["weight"] = 101
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(model, EXTERNAL_MODEL_SCHEMA)


def test_dockerfile_is_multi_stage_and_runs_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) >= 2 and all("slim" in s for s in stages)
    final = text[text.rindex(stages[-1]) :]
    assert "USER 65532" in final
    assert "apt-get" not in final and "gcc" not in final and "pip install" not in final
