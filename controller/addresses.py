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


# Cloud metadata services outside the link-local range, some inside the private ranges the
# allow-list has by default: Alibaba Cloud's (100.100.100.200, in 100.64.0.0/10), AWS's
# IPv6 IMDS (fd00:ec2::254, in fd00::/8), Azure's WireServer (168.63.129.16); refused
# whatever the allow-list says (a review).
METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254", "168.63.129.16")
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
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if _api_server(host, port, api_hosts):
            return "it is the Kubernetes API server"
        return _name_refusal(host, policy)
    if _api_server(_unmapped(address), port, api_hosts):
        return "it is the Kubernetes API server"
    return _address_refusal(address, policy)


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as the API server's is written: an IPv4-mapped IPv6 one as its IPv4 (a
    review: ``[::ffff:10.96.0.1]`` passed, and dials the IPv4 address)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


def _api_server(host: str, port: int, api_hosts: frozenset[str]) -> bool:
    """``host`` (a name, or an address as ``_unmapped`` writes it) on ``port`` is the API
    server: by host alone, or ``host:port`` as ``api_server_hosts`` keeps it (an IPv6
    address without brackets, as the client's own is kept: a review)."""
    return host in api_hosts or f"{host}:{port}" in api_hosts


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
    if address in METADATA:
        return f"address {address}, a cloud's metadata service"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return f"address {address} is not a host"
    for pattern in policy.allow:
        if "/" in pattern and address in ipaddress.ip_network(pattern, strict=False):
            return None
    return f"address {address} is not on the allow-list (kubernetes.annotation_urls.allow)"


@dataclass
class TenantAddresses:
    """Where the clusters annotations define may be dialled, checked at every address their
    names resolve to (``sources.dns.GuardedResolver`` on their own connector): a name is
    text until it is dialled, and a tenant's ExternalName Service makes ``x.team-b.svc``
    answer loopback or the metadata server (found by an attack). Resolved addresses are
    judged as written ones are (``refusal``): never loopback (unless allowed), link-local, a
    metadata service or the API server, and within the allow-list's ranges (a review: a
    name let through to a public host carried a tenant's token there). ``api_hosts`` is set
    by discovery, which knows the address its client talks to."""

    policy: AnnotationURLSettings
    api_hosts: frozenset[str] = field(default_factory=api_server_hosts)

    def refusal(self, host: str, address: str, port: int) -> str | None:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"it resolves to {address!r}, no address"
        if _api_server(plain := _unmapped(ip), port, self.api_hosts):
            return f"it resolves to the Kubernetes API server ({plain})"
        why = _address_refusal(ip, self.policy)
        return None if why is None else f"it resolves to {why}"
