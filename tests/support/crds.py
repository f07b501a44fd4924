"""The upstream ExternalModel/ExternalProvider CRDs (../shared/upstream-crds/, or rendered from
their facts where that is absent: ``crd_facts``) as an API server applies them: prune unknown fields, apply defaults, validate against ``openAPIV3Schema``.

Structural-schema behaviour as the Kubernetes docs describe it
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/):
fields not in the schema are pruned (unless ``x-kubernetes-preserve-unknown-fields``), defaults
are applied to objects that are present, and violations come back as a 422 whose
``details.causes[]`` name each ``field`` (``spec.externalProviderRefs[1].weight``).
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.support.crd_facts import rendered_crd

CRD_DIR = Path(__file__).resolve().parents[3] / "shared" / "upstream-crds"
VERSIONS = {"v0.2.0": "v0.2.0", "v0.2.1": "v0.2.1-and-main"}
PLURALS = ("externalmodels", "externalproviders")
Json = dict[str, Any]


@cache
def crd(version: str, plural: str) -> Json:
    """The upstream file where ``../shared`` is beside the repository, else the same CRD
    rendered from its facts (``crd_facts``; held equal to the files where both are here)."""
    path = upstream_path(version, plural)
    if not path.is_file():
        return rendered_crd(version, plural)
    loaded: Json = yaml.safe_load(path.read_text())
    return loaded


def upstream_path(version: str, plural: str) -> Path:
    return CRD_DIR / f"{VERSIONS[version]}-inference.opendatahub.io_{plural}.yaml"


def schema(version: str, plural: str) -> Json:
    found: Json = crd(version, plural)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return found


def weight_minimum(version: str) -> int:
    refs = schema(version, "externalmodels")["properties"]["spec"]["properties"]
    return int(refs["externalProviderRefs"]["items"]["properties"]["weight"]["minimum"])


def _prune_and_default(value: Any, node: Json) -> Any:
    if isinstance(value, dict) and node.get("type") == "object":
        props = node.get("properties")
        extra = node.get("additionalProperties")
        keep_unknown = node.get("x-kubernetes-preserve-unknown-fields") or props is None
        result = {}
        for key, item in value.items():
            if props is not None and key in props:
                result[key] = _prune_and_default(item, props[key])
            elif isinstance(extra, dict):
                result[key] = _prune_and_default(item, extra)
            elif keep_unknown:
                result[key] = item
        for key, sub in (props or {}).items():
            if key not in result and "default" in sub:
                result[key] = copy.deepcopy(sub["default"])
        return result
    if isinstance(value, list) and "items" in node:
        return [_prune_and_default(item, node["items"]) for item in value]
    return value


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def admit(version: str, plural: str, obj: Json) -> tuple[Json, list[Json]]:
    """The object as stored (pruned, defaulted) and the causes of a rejection (empty: valid)."""
    node = schema(version, plural)
    stored: Json = _prune_and_default(obj, node)
    validator = jsonschema.Draft7Validator(node)
    causes = []
    for error in sorted(validator.iter_errors(stored), key=lambda e: list(e.absolute_path)):
        where = _field(error.absolute_path)
        causes.append(
            {
                "reason": "FieldValueRequired"
                if error.validator == "required"
                else "FieldValueInvalid",
                "message": f"Invalid value: {error.instance!r}: {where} {error.message}",
                "field": where,
            }
        )
    return stored, causes
