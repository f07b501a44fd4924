"""The EPP of an InferencePool of the controller's own cluster (``clusters[].inference_pool``):
where its /metrics page is, resolved from the pool and the Service it names, and followed as
they change (the Lister's informers watch both kinds in the pool's namespace).

Facts, from kubernetes-sigs/gateway-api-inference-extension:
- ``api/v1/inferencepool_types.go``: ``spec.endpointPickerRef`` {``group`` (default ``""``),
  ``kind`` (default ``Service``), ``name``, ``port.number``}. Its port is the ext-proc (gRPC)
  port the gateway calls, not the metrics port. ExternalName Services "MUST NOT" be supported
  (CVE-2021-25740): they point anywhere.
- ``config/charts/inferencepool/templates/epp-service.yaml``: the EPP Service is a ClusterIP
  Service with ports ``grpc-ext-proc`` (9002) and ``http-metrics`` (9090).

The page is read at the Service's cluster IP over http (what kube-proxy routes, no lookup per
connection), or at its DNS name ``name.namespace.svc`` over https (the name its certificate
carries) or when the Service is headless.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from controller.kube.errors import APIError
from controller.kube.informer import Lister
from controller.settings import InferencePoolRef
from controller.sources.discovery import PoolError, Problem

POOLS = ("inference.networking.k8s.io", "v1", "inferencepools")
# A Service's name is a DNS-1035 label (Kubernetes' validation): it goes into the URL read.
_SERVICE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
SERVICES = ("", "v1", "services")
Json = dict[str, Any]


def epp_url(ref: InferencePoolRef, pools: Sequence[Json], services: Sequence[Json]) -> str:
    """The EPP's metrics URL, from the objects of the pool's namespace; ``PoolError`` says
    what is missing."""
    where = f"{ref.namespace}/{ref.name}"
    pool = _named(pools, ref.name)
    if pool is None:
        raise PoolError(Problem.NO_POOL, f"no InferencePool {where}")
    picker = _object(_object(pool.get("spec")).get("endpointPickerRef"))
    if not isinstance(picker.get("name"), str) or not picker["name"]:
        raise PoolError(Problem.NO_EPP_REF, f"InferencePool {where} has no endpointPickerRef")
    group, kind = picker.get("group"), picker.get("kind")
    group, kind = "" if group is None else group, "Service" if kind is None else kind
    if (group, kind) != ("", "Service"):
        raise PoolError(
            Problem.NO_EPP_REF,
            f"InferencePool {where}'s endpointPickerRef is a {kind} of group {group!r}, not a "
            "Service: its metrics cannot be found",
        )
    if ref.service is not None and picker["name"] != ref.service:
        raise PoolError(
            Problem.NOT_PINNED,
            f"InferencePool {where} names Service {picker['name']} for its EPP, not "
            f"{ref.service} (inference_pool.service): not read, and no token sent there",
        )
    if not _SERVICE_NAME.fullmatch(picker["name"]):
        raise PoolError(
            Problem.NO_EPP_REF,
            f"InferencePool {where}'s endpointPickerRef names {picker['name']!r}, which is no "
            "Service's name",
        )
    service = _named(services, picker["name"])
    if service is None:
        raise PoolError(
            Problem.NO_SERVICE,
            f"no Service {ref.namespace}/{picker['name']} (InferencePool {where}'s EPP)",
        )
    return _url(ref, service)


def _url(ref: InferencePoolRef, service: Json) -> str:
    name = str(_object(service.get("metadata")).get("name"))
    spec = _object(service.get("spec"))
    if spec.get("type") == "ExternalName":
        raise PoolError(
            Problem.EXTERNAL_NAME,
            f"Service {ref.namespace}/{name} is an ExternalName: it may point anywhere, and "
            "the InferencePool API forbids following it",
        )
    if not spec.get("selector"):
        raise PoolError(
            Problem.NO_SELECTOR,
            f"Service {ref.namespace}/{name} selects no pods: its endpoints are written by "
            "hand and may point anywhere, so it is not read (nor sent a token)",
        )
    listed = spec.get("ports")
    ports = [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else []
    entry = next((p for p in ports if p.get("name") == ref.metrics_port), None)
    if entry is None:
        named = ", ".join(f"{p.get('name')}={p.get('port')}" for p in ports) or "none"
        raise PoolError(
            Problem.NO_METRICS_PORT,
            f"Service {ref.namespace}/{name} has no port named {ref.metrics_port} (ports: "
            f"{named}); set inference_pool.metrics_port",
        )
    address = spec.get("clusterIP")
    headless = not isinstance(address, str) or address in ("", "None")
    # a headless Service's name resolves to the pods: their port is its targetPort (which
    # defaults to the port; a named one is the pods' own to resolve, not ours)
    port = entry.get("targetPort", entry.get("port")) if headless else entry.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise PoolError(
            Problem.NO_METRICS_PORT,
            f"Service {ref.namespace}/{name}'s port {ref.metrics_port} leads to {port!r}, "
            "not a port number (a headless Service's targetPort must be one)",
        )
    if ref.scheme == "https" or headless:
        host = f"{name}.{ref.namespace}.svc"
    else:
        host = f"[{address}]" if ":" in str(address) else str(address)
    return f"{ref.scheme}://{host}:{port}{ref.path}"


def _named(objects: Sequence[Json], name: str) -> Json | None:
    found = (_object(o) for o in objects)
    return next((o for o in found if _object(o.get("metadata")).get("name") == name), None)


def _object(value: object) -> Json:
    """``value`` where it is a JSON object, else empty: an object the API server let through
    against its schema (a ``spec`` that is a string) reads as one that says nothing, and is
    named for what is missing, never a crash of the cluster's fetch (``internal``)."""
    return value if isinstance(value, dict) else {}


class PoolResolver:
    """Resolves pools from the Lister's caches (watched, or listed on each call when watching
    is off); an API failure is ``PoolError(API)``."""

    def __init__(self, lister: Lister) -> None:
        self._lister = lister

    async def __call__(self, ref: InferencePoolRef) -> str:
        try:
            pools, services = await asyncio.gather(
                self._lister.list(POOLS, ref.namespace, ""),
                self._lister.list(SERVICES, ref.namespace, ""),
            )
        except APIError as exc:
            raise PoolError(Problem.API, f"{exc.reason}: {exc}") from exc
        return epp_url(ref, pools, services)

    async def close(self) -> None:
        await self._lister.close()
