"""The ExternalModel and ExternalProvider CRDs rendered from their upstream facts, for a clone
of this repository without ``../shared/upstream-crds`` (where the files themselves are kept).

Source: the opendatahub-io models-as-a-service repository,
``deployment/base/maas-controller/crd/bases/``, tag v0.2.0 (0f47733339cb) and tag v0.2.1
(8ee0617b3aa3; main at c0639b1b9bae is identical): group ``inference.opendatahub.io``,
version ``v1alpha1``, every field, type, limit, pattern, default and required list, without
the descriptions. v0.2.1 differs from v0.2.0 in ``weight``'s minimum (0, was 1), the
``apikey`` auth type, the required ``path`` of a ref, and ``status.httpRouteName``.
``tests/integration/test_manifests.py`` holds this rendering equal to the files wherever
``../shared`` is present.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

_DNS_NAME = {
    "maxLength": 253,
    "minLength": 1,
    "pattern": "^[a-z0-9]([a-z0-9\\-]*[a-z0-9])?$",
    "type": "string",
}
_CONDITION = {
    "properties": {
        "lastTransitionTime": {"format": "date-time", "type": "string"},
        "message": {"maxLength": 32768, "type": "string"},
        "observedGeneration": {"format": "int64", "minimum": 0, "type": "integer"},
        "reason": {
            "maxLength": 1024,
            "minLength": 1,
            "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
            "type": "string",
        },
        "status": {"enum": ["True", "False", "Unknown"], "type": "string"},
        "type": {
            "maxLength": 316,
            "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)"
            "?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
            "type": "string",
        },
    },
    "required": ["lastTransitionTime", "message", "reason", "status", "type"],
    "type": "object",
}


def _auth(version: str) -> Json:
    kinds = (
        ["simple", "sigv4", "oauth2"]
        if version == "v0.2.0"
        else ["apikey", "simple", "sigv4", "oauth2"]
    )
    return {
        "properties": {
            "secretRef": {
                "properties": {"name": dict(_DNS_NAME)},
                "required": ["name"],
                "type": "object",
            },
            "type": {"enum": kinds, "type": "string"},
        },
        "required": ["secretRef", "type"],
        "type": "object",
    }


def _status(route: bool) -> Json:
    properties: Json = {"conditions": {"items": _CONDITION, "type": "array"}}
    if route:
        properties["httpRouteName"] = {"type": "string"}
    properties["phase"] = {"enum": ["Pending", "Ready", "Failed"], "type": "string"}
    return {"properties": properties, "type": "object"}


def _document(spec: Json, status: Json) -> Json:
    return {
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "type": "object",
    }


def _external_models(version: str) -> Json:
    old = version == "v0.2.0"
    ref: Json = {
        "apiFormat": {"maxLength": 63, "minLength": 1, "type": "string"},
        "auth": _auth(version),
        "config": {"additionalProperties": {"type": "string"}, "type": "object"},
    }
    if not old:
        ref["path"] = {"maxLength": 512, "minLength": 1, "pattern": "^/.*", "type": "string"}
    ref["ref"] = {"properties": {"name": dict(_DNS_NAME)}, "required": ["name"], "type": "object"}
    ref["targetModel"] = {"maxLength": 253, "minLength": 1, "type": "string"}
    ref["weight"] = {"default": 1, "maximum": 100, "minimum": 1 if old else 0, "type": "integer"}
    required = (
        ["apiFormat", "ref", "targetModel"] if old else ["apiFormat", "path", "ref", "targetModel"]
    )
    spec = {
        "properties": {
            "externalProviderRefs": {
                "items": {"properties": ref, "required": required, "type": "object"},
                "maxItems": 64,
                "minItems": 1,
                "type": "array",
            },
            "modelName": {"maxLength": 253, "type": "string"},
        },
        "required": ["externalProviderRefs"],
        "type": "object",
    }
    return _document(spec, _status(route=not old))


def _external_providers(version: str) -> Json:
    spec = {
        "properties": {
            "auth": _auth(version),
            "config": {"additionalProperties": {"type": "string"}, "type": "object"},
            "endpoint": {
                "maxLength": 253,
                "minLength": 1,
                "pattern": "^[a-zA-Z0-9]([a-zA-Z0-9\\-]*[a-zA-Z0-9])?"
                "(\\.[a-zA-Z0-9]([a-zA-Z0-9\\-]*[a-zA-Z0-9])?)+$",
                "type": "string",
            },
            "provider": {"maxLength": 63, "minLength": 1, "type": "string"},
        },
        "required": ["auth", "endpoint", "provider"],
        "type": "object",
    }
    return _document(spec, _status(route=False))


_KINDS = {
    "externalmodels": (
        "ExternalModel",
        _external_models,
        [{"jsonPath": ".status.phase", "name": "Phase", "type": "string"}],
    ),
    "externalproviders": (
        "ExternalProvider",
        _external_providers,
        [
            {"jsonPath": ".spec.provider", "name": "Provider", "type": "string"},
            {"jsonPath": ".spec.endpoint", "name": "Endpoint", "type": "string"},
            {"jsonPath": ".status.phase", "name": "Phase", "type": "string"},
        ],
    ),
}


def rendered_crd(version: str, plural: str) -> Json:
    """The CRD of ``plural`` at MaaS ``version`` (``v0.2.0``, ``v0.2.1``), descriptions left out."""
    kind, schema, columns = _KINDS[plural]
    age = {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "annotations": {"controller-gen.kubebuilder.io/version": "v0.20.1"},
            "name": f"{plural}.inference.opendatahub.io",
        },
        "spec": {
            "group": "inference.opendatahub.io",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": plural.removesuffix("s"),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "additionalPrinterColumns": [*columns, age],
                    "name": "v1alpha1",
                    "schema": {"openAPIV3Schema": schema(version)},
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node
