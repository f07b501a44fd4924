"""Pure: may the controller fetch a metrics URL that came from an object's annotations?

Anyone who can edit an ExternalProvider could otherwise point the controller (and the token
it holds) at the cloud metadata service, at itself, or at the API server. URLs from
annotations must be http(s), carry no credentials, name an address on the allow-list
(cluster-internal service names and pod addresses by default), and are never loopback,
link-local, unspecified, multicast or the API server.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from controller.settings import AnnotationURLSettings

# How pods reach the API server: its service names, and the address the kubelet injects.
API_SERVER_NAMES = frozenset(
    {
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
)


def api_server_hosts(extra: Iterable[str] = ()) -> frozenset[str]:
    """The API server as ``host`` (any port: its service names and service IP) or
    ``host:port`` (``extra``: the address our client talks to, which may share a host with
    other servers outside a cluster)."""
    env = (
        os.environ.get(k, "") for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_PORT_443_TCP_ADDR")
    )
    return API_SERVER_NAMES | {h.lower() for h in (*env, *extra) if h}


def refusal(url: str, policy: AnnotationURLSettings, api_hosts: frozenset[str]) -> str | None:
    """Why ``url`` may not be fetched, or ``None`` if it may."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or '(none)'!r} is not http or https"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL"
    if not host:
        return "no host"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if host in api_hosts or f"{host}:{port}" in api_hosts:
        return "it is the Kubernetes API server"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return _name_refusal(host, policy)
    return _address_refusal(address, policy)


def _name_refusal(host: str, policy: AnnotationURLSettings) -> str | None:
    if host == "localhost" or host.endswith(".localhost"):
        return None if policy.allow_loopback else "loopback (localhost)"
    if any(fnmatch.fnmatch(host, pattern) for pattern in policy.allow if "/" not in pattern):
        return None
    return f"host {host!r} is not on the allow-list (kubernetes.annotation_urls.allow)"


def _address_refusal(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: AnnotationURLSettings
) -> str | None:
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    if address.is_loopback:
        return None if policy.allow_loopback else f"loopback address {address}"
    if address.is_link_local:
        return f"link-local address {address} (cloud metadata lives there)"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return f"address {address} is not a host"
    for pattern in policy.allow:
        if "/" in pattern and address in ipaddress.ip_network(pattern, strict=False):
            return None
    return f"address {address} is not on the allow-list (kubernetes.annotation_urls.allow)"


@dataclass
class NamesFromObjects:
    """The host names annotation URLs passed ``refusal`` with (discovery's, rebuilt each
    time it reads them), and what their addresses may not be once resolved: a name is text
    until it is dialled, and a tenant's ExternalName Service makes ``x.team-b.svc`` answer
    loopback or the metadata server (found by an attack). The pages' resolver asks
    ``address_refusal`` of every address such a name resolves to."""

    policy: AnnotationURLSettings
    names: frozenset[str] = frozenset()
    api_hosts: frozenset[str] = field(default_factory=api_server_hosts)

    def refusal(self, host: str, address: str) -> str | None:
        if host.lower().rstrip(".") not in self.names:
            return None  # configured: the operator's own
        return address_refusal(address, self.policy, self.api_hosts)


def address_refusal(
    address: str, policy: AnnotationURLSettings, api_hosts: frozenset[str]
) -> str | None:
    """Why a name from annotations may not be dialled at ``address``, what it resolved to:
    loopback (unless ``allow_loopback``), link-local, no host, or the API server. The
    allow-list is for what was written (names, literal addresses), not for what a cluster's
    DNS answers for an allowed name (a ClusterIP, a pod's address)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"it resolves to {address!r}, no address"
    mapped = getattr(ip, "ipv4_mapped", None)
    ip = mapped if mapped is not None else ip
    if str(ip) in api_hosts:
        return f"it resolves to the Kubernetes API server ({ip})"
    if ip.is_loopback:
        return None if policy.allow_loopback else f"it resolves to loopback address {ip}"
    if ip.is_link_local:
        return f"it resolves to link-local address {ip} (cloud metadata lives there)"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return f"it resolves to {ip}, not a host"
    return None
