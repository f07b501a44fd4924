"""Pure: the Kubernetes objects we steer, read from their JSON, and the guarded patches we send.

ExternalModel (``inference.opendatahub.io/v1alpha1``): ``spec.externalProviderRefs[i]`` is
``{ref: {name}, targetModel, apiFormat, path, weight (0..100, default 1), ...}``; each ``ref.name``
names an ExternalProvider in the same namespace — one cluster. HTTPRoute
(``gateway.networking.k8s.io/v1``): ``spec.rules[r].backendRefs[b].{name, weight}``.

How a ref finds its cluster (first match wins), via annotations on the ExternalProvider:
- ``weight-controller.opendatahub.io/cluster: <name>`` — a cluster from the config;
- ``weight-controller.opendatahub.io/vllm-metrics-urls: "<url>,<url>"`` and/or
  ``weight-controller.opendatahub.io/epp-metrics-url: <url>`` (optionally
  ``weight-controller.opendatahub.io/model-name``) — a cluster defined right there, named after
  the provider;
- else a configured cluster with the provider's own name; else the ref is *unmapped* and keeps
  its weight.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from controller.errors import printable
from controller.model import Ref, Target
from controller.settings import ClusterSettings, HTTPRouteTarget
from controller.settings.schema import CLUSTER_NAME_MAX, CLUSTER_NAME_PATTERN

DOMAIN = "weight-controller.opendatahub.io"
MANAGED_LABEL = f"{DOMAIN}/managed"
LAST_APPLIED = f"{DOMAIN}/last-applied"
CLUSTER_ANNOTATION = f"{DOMAIN}/cluster"
VLLM_URLS_ANNOTATION = f"{DOMAIN}/vllm-metrics-urls"
EPP_URL_ANNOTATION = f"{DOMAIN}/epp-metrics-url"
MODEL_NAME_ANNOTATION = f"{DOMAIN}/model-name"
TOKEN_ANNOTATION = f"{DOMAIN}/bearer-token"  # a name from kubernetes.annotation_urls.tokens
EPP_TOKEN_ANNOTATION = f"{DOMAIN}/epp-bearer-token"
PAUSE_ANNOTATION = f"{DOMAIN}/pause"
PIN_ANNOTATION = f"{DOMAIN}/pin"

EXTERNAL_MODEL = ("inference.opendatahub.io", "v1alpha1", "externalmodels")
EXTERNAL_PROVIDER = ("inference.opendatahub.io", "v1alpha1", "externalproviders")
HTTPROUTE = ("gateway.networking.k8s.io", "v1", "httproutes")
DEFAULT_WEIGHT = 1  # the ExternalModel CRD's default for an absent weight

Kind = Literal["ExternalModel", "HTTPRoute"]
Json = dict[str, Any]

__all__ = ["Ref", "Target"]  # re-exported: the publisher's tests build them from here


@dataclass(frozen=True, slots=True)
class ProviderMapping:
    """ExternalProvider name → cluster name, plus clusters the providers define themselves."""

    clusters: Mapping[str, str]
    defined: tuple[ClusterSettings, ...]
    problems: tuple[str, ...]


def _weight(entry: Mapping[str, Any]) -> int:
    value = entry.get("weight", DEFAULT_WEIGHT)
    return int(value) if isinstance(value, int | float) else DEFAULT_WEIGHT


def _stated(entry: Mapping[str, Any]) -> bool:
    """The entry holds its weight as an integer, so a patch can ``test`` that it still does."""
    value = entry.get("weight")
    return isinstance(value, int) and not isinstance(value, bool)


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def last_applied_key(rule: int | None) -> str:
    """The annotation that records what we applied: one per target, so an HTTPRoute's rules
    each keep their own record."""
    return LAST_APPLIED if rule is None else f"{LAST_APPLIED}.rule-{rule}"


NOTE_MAX_CHARS = 256  # of a pause note shown
# What our own annotations may hold: a weight map of at most 64 refs is far below both.
JSON_MAX_CHARS = 16 * 1024
JSON_MAX_DEPTH = 4


def bounded_json(text: str) -> Any:
    """``json.loads`` for annotation values anyone can write: refused (ValueError) when longer
    than ``JSON_MAX_CHARS`` or nested deeper than ``JSON_MAX_DEPTH``, before it is parsed (a
    deeply nested value would raise RecursionError, which no caller expects)."""
    if len(text) > JSON_MAX_CHARS:
        raise ValueError(f"longer than {JSON_MAX_CHARS} characters")
    depth, deepest, quoted, escaped = 0, 0, False, False
    for char in text:
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > JSON_MAX_DEPTH:
                raise ValueError(f"nested deeper than {JSON_MAX_DEPTH}")
        elif char in "]}":
            depth -= 1
    return json.loads(text)


def _last_applied(
    annotations: Mapping[str, str], key: str
) -> tuple[dict[str, int] | None, float | None]:
    """Our record of the last write (``weight_patch``'s, whichever replica or process wrote
    it), read once: its weights, and when it was made in seconds since the epoch; each
    ``None`` where it cannot be read."""
    try:
        record = bounded_json(annotations[key])
    except (KeyError, ValueError, TypeError, AttributeError):
        return None, None
    try:
        weights = {str(k): int(v) for k, v in record["weights"].items()}
    except (KeyError, ValueError, TypeError, AttributeError):
        weights = None
    try:
        stamp = datetime.fromisoformat(str(record["time"]))
        at = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
    except (KeyError, ValueError, TypeError, OverflowError):
        at = None
    return weights, at


def _writers(obj: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Who wrote the object itself: managedFields entries without a ``subresource`` (the
    payload processor's ``status`` updates come after every spec change and say nothing about
    who set the weights)."""
    entries = obj.get("metadata", {}).get("managedFields") or []
    return tuple(
        (str(e["manager"]), str(e.get("time") or ""))
        for e in entries
        if isinstance(e, dict) and e.get("manager") and not e.get("subresource")
    )


def last_writer(writers: Sequence[tuple[str, str]], ours: str) -> str:
    """The manager that last wrote the object, other than ``ours``; ``unknown`` when none is
    recorded or two managers share the latest time (managedFields keep whole seconds)."""
    others = [(manager, when) for manager, when in writers if manager != ours]
    if not others:
        return "unknown"
    latest = max(when for _, when in others)
    managers = {manager for manager, when in others if when == latest}
    return managers.pop() if len(managers) == 1 else "unknown"


def _target(
    kind: Kind,
    obj: Mapping[str, Any],
    refs: Sequence[Ref],
    rule: int | None = None,
    minimum: int = 0,
) -> Target:
    meta = obj.get("metadata", {})
    annotations = _annotations(obj)
    recorded, recorded_at = _last_applied(annotations, last_applied_key(rule))
    return Target(
        kind=kind,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        refs=tuple(refs),
        annotations=_as_read(meta.get("annotations")),
        labels=_as_read(meta.get("labels")) if kind == "ExternalModel" else None,
        last_applied=recorded,
        applied_at=recorded_at,
        writers=_writers(obj),
        rule=rule,
        total=None if kind == "HTTPRoute" else 100,
        minimum=minimum,
        paused=_paused(annotations),
        pinned=_pinned(annotations),
    )


def _as_read(mapping: Any) -> dict[str, Any] | None:
    """Annotations or labels as the API server holds them, for a patch to ``test``: a copy,
    never coerced (a value changed here would make every write a conflict)."""
    return None if mapping is None else dict(mapping)


def _paused(annotations: Mapping[str, str]) -> str | None:
    """``weight-controller.opendatahub.io/pause: "<why>"`` (any value but ``false``)."""
    value = annotations.get(PAUSE_ANNOTATION)
    if value is None or value.strip().lower() in ("", "false", "no", "0"):
        return None
    if value.strip().lower() in ("true", "yes", "1"):
        return "paused by annotation"
    # the note goes into logs, /debug/state and status: an operator's sentence on one line,
    # not a file, nor a terminal's escape sequences
    value = printable(value)
    return value if len(value) <= NOTE_MAX_CHARS else value[:NOTE_MAX_CHARS] + "…"


def _pinned(annotations: Mapping[str, str]) -> dict[str, int] | None:
    """``weight-controller.opendatahub.io/pin: '{"east": 80, "west": 20}'`` (by ref name).
    Unreadable pins count as no pin; ``weights.pin_problem`` says why."""
    value = annotations.get(PIN_ANNOTATION)
    if value is None:
        return None
    try:
        pinned = bounded_json(value)
    except ValueError:
        return {}
    if not isinstance(pinned, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in pinned.values()
    ):
        return {}
    return {str(k): int(v) for k, v in pinned.items()}


def external_model(obj: Mapping[str, Any], providers: ProviderMapping, minimum: int = 0) -> Target:
    """``minimum``: the lowest weight the installed CRD accepts (see ``weight_minimum``)."""
    entries = obj.get("spec", {}).get("externalProviderRefs") or []
    refs = []
    for index, entry in enumerate(entries):
        name = str((entry.get("ref") or {}).get("name", ""))
        refs.append(
            Ref(
                path=f"/spec/externalProviderRefs/{index}",
                name_path="/ref/name",
                name=name,
                weight=_weight(entry),
                cluster=providers.clusters.get(name),
                stated=_stated(entry),
            )
        )
    return _target("ExternalModel", obj, refs, minimum=minimum)


EXTERNAL_MODEL_CRD = "externalmodels.inference.opendatahub.io"


def weight_minimum(crd: Mapping[str, Any]) -> int:
    """``externalProviderRefs[].weight.minimum`` of the served version of an ExternalModel CRD
    (MaaS v0.2.0: 1, v0.2.1 and later: 0; 0 when the schema sets none)."""
    for version in crd.get("spec", {}).get("versions") or []:
        if version.get("name") != EXTERNAL_MODEL[1] or not version.get("served", True):
            continue
        node = version.get("schema", {}).get("openAPIV3Schema", {})
        for step in ("spec", "externalProviderRefs", "items", "weight"):
            node = (
                node.get("items", {})
                if step == "items"
                else node.get("properties", {}).get(step, {})
            )
        return int(node.get("minimum", 0))
    raise KeyError(f"{EXTERNAL_MODEL_CRD} serves no {EXTERNAL_MODEL[1]}")


def httproute(obj: Mapping[str, Any], config: HTTPRouteTarget) -> list[Target]:
    """One target per rule: Gateway API weights are relative within one rule's backendRefs
    (``weight / sum``), so each rule is its own traffic split."""
    targets = []
    for r, rule in enumerate(obj.get("spec", {}).get("rules") or []):
        refs = [
            Ref(
                path=f"/spec/rules/{r}/backendRefs/{b}",
                name_path="/name",
                name=str(backend.get("name", "")),
                weight=_weight(backend),
                cluster=config.backends.get(str(backend.get("name", ""))),
                stated=_stated(backend),
            )
            for b, backend in enumerate(rule.get("backendRefs") or [])
        ]
        targets.append(_target("HTTPRoute", obj, refs, rule=r))
    return targets


def controller_owner(obj: Mapping[str, Any]) -> str | None:
    """``Kind/name`` of the controller that owns ``obj`` (an ownerReference with
    ``controller: true``), or ``None``."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return f"{ref.get('kind')}/{ref.get('name')}"
    return None


def map_providers(
    providers: Sequence[Mapping[str, Any]],
    configured: set[str],
    refuse: Callable[[str], str | None] = lambda url: None,
    tokens: Mapping[str, Path] | None = None,
    max_urls: int = 64,
    max_clusters: int = 32,
) -> ProviderMapping:
    """Provider name → cluster, for one namespace's providers. ``refuse`` says why a metrics
    URL from an annotation may not be fetched (see ``controller.addresses``); such a provider
    defines no cluster, is a problem, and its URLs are never fetched. At most
    ``max_clusters`` providers define a cluster (by name); the rest are one problem."""
    clusters: dict[str, str] = {}
    defined: list[ClusterSettings] = []
    problems: list[str] = []
    beyond: list[str] = []
    for provider in sorted(providers, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        meta = provider.get("metadata", {})
        name = str(meta.get("name", ""))
        annotations = _annotations(provider)
        if CLUSTER_ANNOTATION in annotations:
            named = annotations[CLUSTER_ANNOTATION]
            home = str(meta.get("namespace", ""))
            if named not in configured and "/" in named and named.split("/")[0] != home:
                # another namespace's cluster, defined by its annotations: read from that
                # team's pages with that team's token, its load showing in this team's
                # weights (found by an attack). A team's own (``<namespace>/<name>``) or the
                # config's are named; another's never.
                problems.append(
                    f"ExternalProvider {name}: {CLUSTER_ANNOTATION} names {named[:64]!r}, a "
                    f"cluster of another namespace than {home!r}: not read for this one"
                )
            elif named in configured or _is_cluster_name(named):
                clusters[name] = named
            else:  # it would become a label on every series of its refs
                problems.append(
                    f"ExternalProvider {name}: {CLUSTER_ANNOTATION} is not a cluster name "
                    f"({len(named)} characters: {named[:64]!r})"
                )
        elif VLLM_URLS_ANNOTATION in annotations or EPP_URL_ANNOTATION in annotations:
            # An object's cluster is its own: named namespace/name, so two teams' providers
            # of the same name are two clusters, never one read from either's pages.
            namespace = str(meta.get("namespace", ""))
            own = f"{namespace}/{name}" if namespace else name
            if len(defined) >= max_clusters:
                beyond.append(own)
                continue
            try:
                cluster = cluster_from_annotations(own, annotations, tokens or {}, namespace)
            except UnknownTokenError as exc:
                problems.append(f"ExternalProvider {name}: {exc}")
                continue
            except ValidationError as exc:
                reason = "; ".join(e["msg"] for e in exc.errors(include_url=False))
                problems.append(f"ExternalProvider {name}: bad metrics annotations: {reason}")
                continue
            if len(cluster.vllm_urls) > max_urls:
                problems.append(
                    f"ExternalProvider {own}: {len(cluster.vllm_urls)} vLLM URLs, more than "
                    f"kubernetes.annotation_urls.max_urls ({max_urls})"
                )
                continue
            urls = [str(u) for u in (*cluster.vllm_urls, cluster.epp_url) if u is not None]
            refused = [f"{url} ({why})" for url in urls if (why := refuse(url)) is not None]
            if refused:
                problems.append(
                    f"ExternalProvider {name}: refused metrics URL {', '.join(refused)}"
                )
                continue
            defined.append(cluster)
            clusters[name] = own
        elif name in configured:
            clusters[name] = name
    if beyond:  # one namespace's objects must not take the tick from the others' clusters
        problems.append(
            f"{len(beyond)} ExternalProvider(s) beyond kubernetes.annotation_urls.max_clusters "
            f"({max_clusters}) of their namespace define no cluster, first {beyond[0]}"
        )
    return ProviderMapping(clusters, tuple(defined), tuple(problems))


def _is_cluster_name(text: str) -> bool:
    """A name a cluster may have (``ClusterSettings.name``): short, and a label value that
    cannot grow /metrics."""
    return len(text) <= CLUSTER_NAME_MAX and re.fullmatch(CLUSTER_NAME_PATTERN, text) is not None


class UnknownTokenError(ValueError):
    """An annotation names a token the operator did not make available."""


def cluster_from_annotations(
    name: str, annotations: Mapping[str, str], tokens: Mapping[str, Path], namespace: str = ""
) -> ClusterSettings:
    """A cluster an ExternalProvider of ``namespace`` defines. Its tokens are named, never
    given as paths: only files the operator listed in ``kubernetes.annotation_urls.tokens``
    for that namespace (``namespace/name``, or ``*/name`` for any) can be sent, and over plain
    http only to Services of this cluster (``token_over_cluster_network``)."""
    urls = annotations.get(VLLM_URLS_ANNOTATION, "").replace(",", " ").split()
    files: dict[str, Path] = {}
    for setting, key in (
        ("bearer_token_file", TOKEN_ANNOTATION),
        ("epp_bearer_token_file", EPP_TOKEN_ANNOTATION),
    ):
        wanted = annotations.get(key, "").strip()
        if not wanted:
            continue
        found = tokens.get(f"{namespace}/{wanted}") or tokens.get(f"*/{wanted}")
        if found is None:
            mine = sorted(
                k.partition("/")[2] for k in tokens if k.partition("/")[0] in (namespace, "*")
            )
            raise UnknownTokenError(
                f"{key} names token {wanted[:64]!r}, which kubernetes.annotation_urls.tokens "
                f"does not define for namespace {namespace!r} (defined for it: "
                f"{', '.join(mine) or 'none'})"
            )
        files[setting] = found
    return ClusterSettings.model_validate(
        {
            "name": name,
            "vllm_urls": urls,
            "epp_url": annotations.get(EPP_URL_ANNOTATION) or None,
            "model_name": annotations.get(MODEL_NAME_ANNOTATION) or None,
            **files,
            "token_over_cluster_network": bool(files),
        }
    )


def _escape(key: str) -> str:
    """A map key as one JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def weight_patch(target: Target, desired: Mapping[str, int], stamp: str) -> list[Json]:
    """A JSON Patch that ``test``s each ref's name at its index, the weight it was read with,
    and the annotations as read (or, where there were none, the resourceVersion), and an
    ExternalModel's labels as read (its opt-in), before setting the new weights — if the list
    was reordered, someone changed a weight, or a person paused, pinned or un-labelled the
    object since it was read, the API server rejects the whole patch (422) and the loop
    re-reads and weighs again, instead of giving a weight to the wrong provider or
    overwriting a hand edit, a pause or an opt-out blind — and records what we applied."""
    ops: list[Json] = []
    for ref in target.refs:
        if ref.name not in desired:
            continue
        ops.append({"op": "test", "path": ref.path + ref.name_path, "value": ref.name})
        if ref.stated:
            ops.append({"op": "test", "path": ref.path + "/weight", "value": ref.weight})
        if desired[ref.name] != ref.weight:
            ops.append({"op": "add", "path": ref.path + "/weight", "value": desired[ref.name]})
    if target.labels is not None:  # still opted in as it was read (a watch may lag)
        ops.append({"op": "test", "path": "/metadata/labels", "value": target.labels})
    elif target.kind == "ExternalModel" and target.annotations is not None:
        # no labels to test (a selector that takes objects without): nothing changed at all
        rv = target.resource_version
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    record = json.dumps({"weights": dict(sorted(desired.items())), "time": stamp})
    key = last_applied_key(target.rule)
    if target.annotations is not None:
        # A person's pause or pin set since the read (a watch that lags) refuses the write:
        # the annotations must still be as read, or the API server rejects the whole patch.
        ops.append({"op": "test", "path": "/metadata/annotations", "value": target.annotations})
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": record})
    else:
        # Creating the map would replace one written meanwhile: only if nothing changed.
        rv = target.resource_version
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": rv})
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {key: record}})
    return ops
