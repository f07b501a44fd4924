"""``kubectl kustomize manifests`` renders objects that validate against the Kubernetes schemas,
the samples follow the ExternalModel CRD's rules, and the security settings are what we claim."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controller.kube import objects
from controller.settings import build_settings
from controller.settings.schema import HTTPRouteTarget
from tests.support import crds
from tests.support.crd_facts import rendered_crd, without_descriptions
from tests.support.manifests import render

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = kubernetes_validate.latest_version()


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
        "ServiceAccount/weight-controller",
        "ServiceAccount/weight-controller-metrics-scraper",
        "ClusterRole/weight-controller",
        "ClusterRoleBinding/weight-controller",
        "Role/weight-controller-leader-election",
        "RoleBinding/weight-controller-leader-election",
        "ClusterRole/weight-controller-metrics-reader",
        "ClusterRoleBinding/weight-controller-metrics-reader",
        "Deployment/weight-controller",
        "Service/weight-controller-metrics",
        "Secret/weight-controller-metrics-scraper-token",
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


def test_the_shipped_config_is_valid_settings(rendered: dict[str, dict[str, Any]]) -> None:
    settings = shipped_settings(rendered)
    assert settings.kubernetes.enabled and settings.leader_election.enabled
    assert settings.kubernetes.namespaces == []  # every namespace, as MaaS lays them out
    assert settings.server.port == 8443


def shipped_settings(rendered: dict[str, dict[str, Any]]) -> Any:
    config_map = next(
        o for k, o in rendered.items() if k.startswith("ConfigMap/weight-controller-config")
    )
    return build_settings(yaml.safe_load(config_map["data"]["config.yaml"]))


def test_openshift_restricted_v2_assigns_the_ids(rendered: dict[str, dict[str, Any]]) -> None:
    pod = rendered["Deployment/weight-controller"]["spec"]["template"]["spec"]
    contexts = [pod["securityContext"], *(c["securityContext"] for c in pod["containers"])]
    for context in contexts:
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context), context


def test_metrics_are_https_with_authentication_and_authorization(
    rendered: dict[str, dict[str, Any]],
) -> None:
    settings = shipped_settings(rendered)
    assert settings.server.authenticate and settings.server.tls_cert_file is not None
    service = rendered["Service/weight-controller-metrics"]
    secret = service["metadata"]["annotations"][
        "service.beta.openshift.io/serving-cert-secret-name"
    ]
    pod = rendered["Deployment/weight-controller"]["spec"]["template"]["spec"]
    mounted = {v["name"]: v for v in pod["volumes"]}["serving-cert"]["secret"]["secretName"]
    assert mounted == secret
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "serving-cert")
    assert str(settings.server.tls_cert_file).startswith(mount["mountPath"])
    # the kubelet's probes on their own plain port: no TLS and no token to need
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.server.probe_bind is not None
    assert int(settings.server.probe_bind.rpartition(":")[2]) == ports["probes"] != ports["https"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTP"
        assert container[probe]["httpGet"]["port"] == "probes"
    monitor = rendered["ServiceMonitor/weight-controller"]
    assert monitor["metadata"]["labels"]["monitoring.opendatahub.io/scrape"] == "true"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["port"] == service["spec"]["ports"][0]["name"]
    token = endpoint["authorization"]["credentials"]["name"]
    assert rendered[f"Secret/{token}"]["type"] == "kubernetes.io/service-account-token"
    scraper = rendered[f"Secret/{token}"]["metadata"]["annotations"][
        "kubernetes.io/service-account.name"
    ]
    reader = rendered["ClusterRoleBinding/weight-controller-metrics-reader"]
    assert scraper in {s["name"] for s in reader["subjects"]}
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())


def test_network_policy_allows_dns_on_53_and_5353_and_the_monitoring_namespaces(
    rendered: dict[str, dict[str, Any]],
) -> None:
    policy = rendered["NetworkPolicy/weight-controller"]["spec"]
    dns = next(r for r in policy["egress"] if any(p["port"] == 53 for p in r["ports"]))
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {
        (53, "UDP"),
        (53, "TCP"),
        (5353, "UDP"),
        (5353, "TCP"),
    }
    assert dns["to"], "DNS egress names its destination"
    (ingress,) = policy["ingress"]
    namespaces = ingress["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert {
        "redhat-ods-monitoring",
        "openshift-monitoring",
        "openshift-user-workload-monitoring",
    } <= set(namespaces)
    assert ingress["ports"] == [{"port": 8443, "protocol": "TCP"}]


def test_the_base_leaves_the_namespace_alone_and_carries_maas_labels(
    rendered: dict[str, dict[str, Any]],
) -> None:
    assert not any(k.startswith("Namespace/") for k in rendered)  # delete -k keeps maas-system
    for obj in rendered.values():
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "models-as-a-service"
    component = yaml.safe_load(
        (ROOT / "manifests/components/namespace/kustomization.yaml").read_text()
    )
    assert component["kind"] == "Component"


def test_samples_pass_the_upstream_crds_and_map_to_clusters(
    rendered: dict[str, dict[str, Any]],
) -> None:
    samples = render("manifests/samples")
    models = [s for s in samples if s["kind"] == "ExternalModel"]
    providers = [s for s in samples if s["kind"] == "ExternalProvider"]
    for version in crds.VERSIONS:
        for sample in samples:
            _, causes = crds.admit(version, sample["kind"].lower() + "s", sample)
            assert causes == [], (version, sample["metadata"]["name"], causes)
    for model in models:
        assert model["metadata"]["labels"][objects.MANAGED_LABEL] == "true"
    configured = {c.name for c in shipped_settings(rendered).clusters}
    mapping = objects.map_providers(providers, configured)
    assert mapping.problems == ()
    target = objects.external_model(models[0], mapping)
    assert len(target.refs) >= 2 and all(ref.cluster for ref in target.refs)


def test_the_upstream_schemas_reject_what_the_crd_rejects() -> None:
    model = yaml.safe_load((ROOT / "manifests/samples/externalmodel.yaml").read_text())
    model["spec"]["externalProviderRefs"][0]["weight"] = 101
    for version in crds.VERSIONS:
        _, causes = crds.admit(version, "externalmodels", model)
        assert [c["field"] for c in causes] == ["spec.externalProviderRefs[0].weight"]
    model["spec"]["externalProviderRefs"][0]["weight"] = 0
    assert crds.admit("v0.2.0", "externalmodels", model)[1] != []
    assert crds.admit("v0.2.1", "externalmodels", model)[1] == []


def test_dockerfile_is_multi_stage_and_runs_as_any_non_root_uid() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) >= 2 and all("registry.access.redhat.com/ubi9/" in s for s in stages)
    assert all(":latest" not in s and ":" in s.split()[1] for s in stages)  # pinned tags
    final = text[text.rindex(stages[-1]) :]
    user = next(line.split()[1] for line in final.splitlines() if line.startswith("USER "))
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"  # numeric: runAsNonRoot
    assert "apt-get" not in final and "gcc" not in final and "pip install" not in final
    labels = final[final.index("LABEL") :]
    for label in ("org.opencontainers.image.title", "org.opencontainers.image.version", "name"):
        assert f"{label}=" in labels


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


OVERLAYS = {"manifests": "maas-system", "manifests/overlays/opendatahub": "opendatahub"}
NAMESPACES = set(OVERLAYS.values())


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


@pytest.mark.parametrize(("overlay", "namespace"), sorted(OVERLAYS.items()))
def test_every_overlay_names_only_its_own_namespace_and_validates(
    overlay: str, namespace: str
) -> None:
    """With `namespace: opendatahub` the bindings' subjects (4 places) and the ServiceMonitor's
    TLS serverName stayed in maas-system: 403s and a TLS name mismatch, no render error."""
    objects = render(overlay)
    foreign = NAMESPACES - {namespace}
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]
        for text in _strings(obj):
            # a field that is a namespace, a service's DNS name, or one in the config's text
            for other in foreign:
                named = (other, f".{other}.svc", f"namespace: {other}", f"namespace={other}")
                assert text != other and not any(n in text for n in named[1:]), text[:200]
        if obj["kind"] not in ("ServiceMonitor", "PrometheusRule"):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    subjects = [s for o in objects for s in o.get("subjects", [])]
    assert len(subjects) == 4 and {s["namespace"] for s in subjects} == {namespace}
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    name = monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"]
    assert name == f"weight-controller-metrics.{namespace}.svc"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [namespace]


def test_the_grafana_operator_component_points_at_the_shipped_dashboard(tmp_path: Path) -> None:
    """OpenShift/ODH run no Grafana sidecar; the Grafana Operator reads GrafanaDashboards."""
    base = os.path.relpath(ROOT / "manifests", tmp_path)
    component = os.path.relpath(ROOT / "manifests/components/grafana-operator", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: maas-system\nresources: [{base}]\ncomponents: [{component}]\n"
    )
    rendered = {f"{d['kind']}/{d['metadata']['name']}": d for d in render(str(tmp_path))}
    dashboard = rendered["GrafanaDashboard/weight-controller"]
    ref = dashboard["spec"]["configMapRef"]
    configmap = rendered[f"ConfigMap/{ref['name']}"]
    assert dashboard["metadata"]["namespace"] == configmap["metadata"]["namespace"]
    assert json.loads(configmap["data"][ref["key"]])["uid"] == "weight-controller"


def _with_component(tmp_path: Path, component: str) -> list[dict[str, Any]]:
    """The opendatahub overlay as a copy of its own that also takes ``component``."""
    overlay = yaml.safe_load(
        (ROOT / "manifests/overlays/opendatahub/kustomization.yaml").read_text()
    )
    overlay["resources"] = [os.path.relpath(ROOT / "manifests/base", tmp_path)]
    overlay["components"] = [os.path.relpath(ROOT / component, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return render(str(tmp_path))


MODEL = {
    "apiVersion": "inference.opendatahub.io/v1alpha1",
    "kind": "ExternalModel",
    "metadata": {
        "name": "granite",
        "labels": {"weight-controller.opendatahub.io/managed": "true"},
        "annotations": {"owner": "team-a"},
    },
    "spec": {
        "externalProviderRefs": [
            {"ref": {"name": "east"}, "targetModel": "granite", "weight": 50},
            {"ref": {"name": "west"}, "targetModel": "granite", "weight": 50},
        ]
    },
}


ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "granite", "annotations": {"owner": "team-a"}},
    "spec": {
        "parentRefs": [{"name": "gateway"}],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/a"}}],
                "backendRefs": [
                    {"name": "east", "port": 8000, "weight": 50},
                    {"name": "west", "port": 8000, "weight": 50},
                ],
            },
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/b"}}],
                "backendRefs": [{"name": "east", "port": 8000}, {"name": "west", "port": 8000}],
            },
        ],
    },
}


def _edited(change: Any, original: dict[str, Any] = MODEL) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(original))
    change(copy)
    return copy


def _policy_verdicts(tmp_path: Path, new: dict[str, Any], old: dict[str, Any]) -> list[bool]:
    """Each validation of the shipped policy on ``old`` → ``new``, by cel-python."""
    import celpy
    from celpy import celtypes
    from celpy.adapter import json_to_cel

    objects_ = _with_component(tmp_path, "manifests/components/weights-only-policy")
    (policy,) = [o for o in objects_ if o["kind"] == "ValidatingAdmissionPolicy"]
    env = celpy.Environment()
    activation: dict[str, Any] = {"object": json_to_cel(new), "oldObject": json_to_cel(old)}
    variables = celtypes.MapType({})
    for variable in policy["spec"].get(
        "variables", []
    ):  # in order: a variable may use the ones before
        program = env.program(env.compile(variable["expression"]))
        value = program.evaluate({**activation, "variables": variables})
        variables = celtypes.MapType({**variables, celtypes.StringType(variable["name"]): value})
    activation["variables"] = variables
    return [
        bool(env.program(env.compile(v["expression"])).evaluate(activation))
        for v in policy["spec"]["validations"]
    ]


LAST_APPLIED = "weight-controller.opendatahub.io/last-applied"
MANAGED = "weight-controller.opendatahub.io/managed"


def _ref(index: int, key: str, value: Any) -> Any:
    return lambda o: o["spec"]["externalProviderRefs"][index].__setitem__(key, value)


def _meta(group: str, key: str, value: Any) -> Any:
    return lambda o: o["metadata"][group].__setitem__(key, value)


PAUSE = "weight-controller.opendatahub.io/pause"


def _paused(value: str) -> Any:
    return lambda o: o["metadata"]["annotations"].__setitem__(PAUSE, value)


def _listed(group: str, value: Any) -> Any:
    return lambda o: o["metadata"].setdefault(group, []).append(value)


def _both(*edits: Any) -> Any:
    def edit(o: Any) -> None:
        for one in edits:
            one(o)

    return edit


@pytest.mark.parametrize(
    ("edit", "allowed"),
    [
        (_ref(0, "weight", 20), True),
        (_meta("annotations", LAST_APPLIED, "{}"), True),
        (_ref(0, "ref", {"name": "elsewhere"}), False),
        (_ref(1, "targetModel", "llama"), False),
        (lambda o: o["spec"]["externalProviderRefs"].append({"ref": {"name": "x"}}), False),
        (lambda o: o["spec"].__setitem__("other", "added"), False),
        (_meta("labels", MANAGED, "false"), False),
        (_meta("annotations", "owner", "team-b"), False),
        (lambda o: o["metadata"].pop("annotations"), False),
        # the four gaps found by the #40 attack, and a paused model
        (_ref(1, "ref", {"name": "east"}), False),  # a copy of another ref: two of one name
        (_listed("ownerReferences", {"kind": "Secret", "name": "x", "uid": "u"}), False),
        (_listed("finalizers", "example.com/hold"), False),
        (_meta("annotations", LAST_APPLIED, "x" * 200_000), False),
        (_meta("annotations", LAST_APPLIED + "-anything", "{}"), False),
    ],
    ids=lambda v: v if isinstance(v, bool) else "",
)
def test_the_weights_only_policy_lets_the_weights_change_and_nothing_else(
    tmp_path: Path, edit: Any, allowed: bool
) -> None:
    """Cluster-wide `patch` on ExternalModels let the service account change any field. The
    policy's CEL is run here by an independent CEL implementation (cel-python) on the edit."""
    import celpy
    from celpy.adapter import json_to_cel

    objects = _with_component(tmp_path, "manifests/components/weights-only-policy")
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    env = celpy.Environment()
    (condition,) = policy["spec"]["matchConditions"]
    user = "system:serviceaccount:opendatahub:weight-controller"  # the overlay's namespace
    request = json_to_cel({"userInfo": {"username": user}})
    assert env.program(env.compile(condition["expression"])).evaluate({"request": request})
    verdicts = _policy_verdicts(tmp_path, _edited(edit), MODEL)
    assert all(verdicts) is allowed, verdicts


@pytest.mark.parametrize(
    ("pause", "edit", "allowed"),
    [
        ("incident 4711", _ref(0, "weight", 20), False),
        ("true", _ref(0, "weight", 20), False),
        ("false", _ref(0, "weight", 20), True),
        ("0", _ref(0, "weight", 20), True),
        (" false ", _ref(0, "weight", 20), False),  # the policy is the stricter of the two
        ("incident 4711", _meta("annotations", LAST_APPLIED, "{}"), True),  # weights unmoved
    ],
)
def test_the_policy_refuses_a_weight_change_to_a_paused_model(
    tmp_path: Path, pause: str, edit: Any, allowed: bool
) -> None:
    """Whatever the controller's cache says: the API server holds the pause."""
    old = _edited(_paused(pause))
    verdicts = _policy_verdicts(tmp_path, _edited(edit, old), old)
    assert all(verdicts) is allowed, verdicts


def _backend(rule: int, index: int, key: str, value: Any) -> Any:
    return lambda o: o["spec"]["rules"][rule]["backendRefs"][index].__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "allowed"),
    [
        (_backend(0, 0, "weight", 20), True),
        (_backend(1, 1, "weight", 3), True),  # a weight where none was written
        (_meta("annotations", LAST_APPLIED + ".rule-1", "{}"), True),
        (_backend(0, 0, "name", "elsewhere"), False),
        (_backend(0, 1, "name", "east"), False),  # a copy of another backend
        (_backend(0, 0, "port", 9000), False),
        (lambda o: o["spec"]["rules"][0]["matches"].clear(), False),
        (lambda o: o["spec"]["rules"].pop(), False),
        (lambda o: o["spec"]["parentRefs"].append({"name": "other"}), False),
        (lambda o: o["spec"]["rules"][0]["backendRefs"].append({"name": "x"}), False),
        (_meta("annotations", "owner", "team-b"), False),
        (_listed("finalizers", "example.com/hold"), False),
        (_both(_paused("incident"), _backend(0, 0, "weight", 20)), False),
        # one rule replaced by a copy of another: its own matches would be gone
        (
            lambda o: o["spec"]["rules"].__setitem__(
                1, json.loads(json.dumps(o["spec"]["rules"][0]))
            ),
            False,
        ),
    ],
    ids=lambda v: v if isinstance(v, bool) else "",
)
def test_the_policy_lets_an_httproutes_weights_change_and_nothing_else(
    tmp_path: Path, edit: Any, allowed: bool
) -> None:
    """HTTPRoutes, which the service account may patch too, had no policy."""
    old = ROUTE
    if "incident" in json.dumps(_edited(edit, ROUTE)["metadata"]):
        old = _edited(_paused("incident"), ROUTE)
    verdicts = _policy_verdicts(tmp_path, _edited(edit, ROUTE), old)
    assert all(verdicts) is allowed, verdicts


def test_the_controllers_own_patch_passes_the_weights_only_policy(tmp_path: Path) -> None:
    """What the controller really sends (objects.weight_patch), on an ExternalModel with and
    without annotations of its own, and on each rule of an HTTPRoute."""
    import jsonpatch

    mapping = objects.ProviderMapping({"east": "east", "west": "west"}, (), ())
    config = HTTPRouteTarget(
        namespace="ns", name="granite", backends={"east": "east", "west": "west"}
    )
    for annotated in (True, False):
        old = json.loads(json.dumps(MODEL))
        if not annotated:
            del old["metadata"]["annotations"]
        old["metadata"]["resourceVersion"] = "7"
        targets = [objects.external_model(old, mapping)]
        route = json.loads(json.dumps(ROUTE))
        route["metadata"]["resourceVersion"] = "8"
        if not annotated:
            del route["metadata"]["annotations"]
        for target in [*targets, *objects.httproute(route, config)]:
            before = old if target.kind == "ExternalModel" else route
            patch = objects.weight_patch(target, {"east": 30, "west": 70}, "2026-12-02T00:00:00Z")
            verdicts = _policy_verdicts(tmp_path, jsonpatch.apply_patch(before, patch), before)
            assert all(verdicts), (annotated, target.key, verdicts)


@pytest.mark.parametrize("version", list(crds.VERSIONS))
@pytest.mark.parametrize("plural", list(crds.PLURALS))
def test_the_crds_rendered_from_their_facts_are_the_upstream_files(
    version: str, plural: str
) -> None:
    """A clone without ../shared runs the API double on CRDs rendered from their facts
    (tests/support/crd_facts.py): here they are held equal to the files, descriptions aside."""
    path = crds.upstream_path(version, plural)
    if not path.is_file():
        pytest.skip(f"the upstream CRDs are other projects' files, kept in ../shared ({path})")
    upstream = without_descriptions(yaml.safe_load(path.read_text()))
    assert rendered_crd(version, plural) == upstream
