"""The ready endpoints of a Service of the controller's own cluster, from its EndpointSlices
(``discovery.k8s.io/v1``, labelled ``kubernetes.io/service-name``): where discovered pods come
from when ``pods.endpoint_slices`` is set. An endpoint whose ``conditions.ready`` is false is
left out (Kubernetes: a missing ``ready`` means ready)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from controller.kube.errors import APIError, call, list_of
from controller.kube.sdk import client
from controller.sources.dns import DNSError

SERVICE_LABEL = "kubernetes.io/service-name"


def slice_lister(
    api: client.ApiClient, seconds: float
) -> Callable[[str, str], Awaitable[list[str]]]:
    custom = client.CustomObjectsApi(api)

    async def ready_addresses(namespace: str, service: str) -> list[str]:
        try:
            found = await call(
                f"list endpointslices in {namespace}",
                lambda: custom.list_namespaced_custom_object(
                    "discovery.k8s.io",
                    "v1",
                    namespace,
                    "endpointslices",
                    label_selector=f"{SERVICE_LABEL}={service}",
                ),
                seconds,
            )
            items, _ = list_of(found, f"list endpointslices in {namespace}")
        except APIError as exc:
            raise DNSError(str(exc)) from exc
        return addresses(items)

    return ready_addresses


def addresses(slices: list[dict[str, Any]]) -> list[str]:
    found: set[str] = set()
    for item in slices:
        if not isinstance(item, dict) or item.get("addressType") not in ("IPv4", "IPv6"):
            continue
        for endpoint in item.get("endpoints") or []:
            if not isinstance(endpoint, dict):
                continue
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            found.update(str(a) for a in endpoint.get("addresses") or [] if isinstance(a, str))
    return sorted(found)
