"""Looking up a name's addresses: the system resolver, or one DNS server asked directly.

The system resolver (``getaddrinfo``) is what a pod should use: it follows the pod's
``/etc/resolv.conf`` (search domains, the cluster's DNS Service). Asking a server directly
(``PodDiscovery.nameserver``) is for a split-horizon setup and for tests, and gives each
record's TTL. The direct client is small and strict: one UDP question per record type (A, then
AAAA), answers bounds-checked as a hostile server's would need, at most ``limit`` addresses.
RFC 1035 (message format, compression), RFC 3596 (AAAA).
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import struct
from collections.abc import Callable

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

A, AAAA, IN = 1, 28, 1
_NOERROR, _NXDOMAIN = 0, 3
_MAX_MESSAGE = 4096
_MAX_POINTERS = 32  # a compression loop is refused, not followed for ever


class DNSError(Exception):
    """The name could not be looked up (not: it has no addresses)."""


class AddressRefusedError(OSError):
    """A name resolved only to addresses it may not be dialled at (``GuardedResolver``)."""


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, whose answers are checked before any is dialled:
    ``refusal(host, address, port)`` says why ``host`` may not be reached at ``address``.
    The addresses refused are dropped; a name left with none fails to connect, named
    (``AddressRefusedError``), and nothing is sent to it. Checked here, where the address is
    chosen, not before: the name could answer differently a moment later."""

    def __init__(self, refusal: Callable[[str, str, int], str | None]) -> None:
        self._inner = aiohttp.DefaultResolver()
        self._refusal = refusal

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        kept, why = [], None
        for result in found:
            reason = self._refusal(host, result["host"], port)
            if reason is None:
                kept.append(result)
            else:
                why = why or reason
        if not kept and why is not None:
            raise AddressRefusedError(f"{host}: {why}: not dialled (kubernetes.annotation_urls)")
        return kept

    async def close(self) -> None:
        await self._inner.close()


async def system_lookup(name: str, seconds: float) -> tuple[list[str], float | None]:
    """Addresses of ``name`` from the system resolver (no TTL is known)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(seconds):
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5)):
            return [], None  # no such name, or no address: no pods right now
        raise DNSError(f"{name}: {exc.strerror or exc}") from exc
    except (TimeoutError, OSError) as exc:
        raise DNSError(f"{name}: {type(exc).__name__}: {exc}") from exc
    return sorted({str(info[4][0]) for info in infos}), None


async def direct_lookup(
    name: str, server: tuple[str, int], seconds: float, limit: int
) -> tuple[list[str], float | None]:
    """A and AAAA records of ``name`` from ``server``, and the smallest TTL among them."""
    found: list[str] = []
    ttls: list[float] = []
    for rtype in (A, AAAA):
        addresses, ttl = await _ask(name, rtype, server, seconds, limit)
        found += addresses
        ttls += [ttl] if ttl is not None else []
    return sorted(set(found))[:limit], min(ttls, default=None)


async def _ask(
    name: str, rtype: int, server: tuple[str, int], seconds: float, limit: int
) -> tuple[list[str], float | None]:
    ident = secrets.randbelow(65536)
    query = _question(ident, name, rtype)
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bytes] = loop.create_future()

    class _Protocol(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
            # Only the server's answer to this question counts (a spoofed packet from
            # elsewhere, or a late answer to an earlier question, is dropped).
            if addr[:2] == server and data[:2] == query[:2] and not answer.done():
                answer.set_result(data)

        def error_received(self, exc: Exception) -> None:
            if not answer.done():
                answer.set_exception(exc)

    try:
        transport, _ = await loop.create_datagram_endpoint(
            _Protocol, remote_addr=server, family=socket.AF_INET6 if ":" in server[0] else 0
        )
    except OSError as exc:
        raise DNSError(f"{name}: cannot reach {server[0]}:{server[1]}: {exc}") from exc
    try:
        transport.sendto(query)
        async with asyncio.timeout(seconds):
            data = await answer
    except (TimeoutError, OSError) as exc:
        raise DNSError(f"{name}: no answer from {server[0]}:{server[1]}") from exc
    finally:
        transport.close()
    return parse_answer(data, ident, rtype, limit)


def _question(ident: int, name: str, rtype: int) -> bytes:
    header = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)  # recursion desired
    return header + _encode(name) + struct.pack("!HH", rtype, IN)


def _encode(name: str) -> bytes:
    """``name`` in a question's wire form, its labels as IDNA writes them (``bücher`` as
    ``xn--bcher-kva``, as the system resolver asks for it)."""
    try:
        ascii_name = name.rstrip(".").encode("idna")
    except UnicodeError:
        raise DNSError(f"{name!r} is not a DNS name") from None
    labels = [label for label in ascii_name.split(b".") if label]
    if not labels or any(len(label) > 63 for label in labels) or len(ascii_name) > 253:
        raise DNSError(f"{name!r} is not a DNS name")
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\x00"


def parse_answer(data: bytes, ident: int, rtype: int, limit: int) -> tuple[list[str], float | None]:
    """Addresses of type ``rtype`` in a DNS answer, and their smallest TTL; a malformed or
    failed answer is a ``DNSError`` (no such name is no addresses)."""
    if len(data) < 12 or len(data) > _MAX_MESSAGE:
        raise DNSError("a DNS answer of impossible size")
    got, flags, questions, answers = struct.unpack("!HHHH", data[:8])
    if got != ident or not flags & 0x8000:
        raise DNSError("not the answer to our question")
    code = flags & 0x000F
    if code == _NXDOMAIN:
        return [], None
    if code != _NOERROR:
        raise DNSError(f"the DNS server answered with error code {code}")
    offset = 12
    for _ in range(questions):
        offset = _skip_name(data, offset) + 4
    found: list[str] = []
    ttls: list[float] = []
    for _ in range(answers):
        offset = _skip_name(data, offset)
        if offset + 10 > len(data):
            raise DNSError("a DNS answer cut short")
        kind, klass, ttl, length = struct.unpack("!HHIH", data[offset : offset + 10])
        offset += 10
        rdata = data[offset : offset + length]
        offset += length
        if len(rdata) != length:
            raise DNSError("a DNS answer cut short")
        if klass != IN or kind != rtype or len(found) >= limit:
            continue  # CNAMEs on the way, other classes, or more than we read
        size = 4 if rtype == A else 16
        if length != size:
            raise DNSError("a DNS address record of the wrong size")
        found.append(str(ipaddress.ip_address(rdata)))
        ttls.append(float(ttl))
    return found, min(ttls, default=None)


def _skip_name(data: bytes, offset: int) -> int:
    """The offset after the (possibly compressed) name at ``offset``."""
    for _ in range(_MAX_POINTERS + 128):
        if offset >= len(data):
            raise DNSError("a DNS name runs past the answer")
        length = data[offset]
        if length == 0:
            return offset + 1
        if length & 0xC0 == 0xC0:  # a pointer ends the name here
            if offset + 2 > len(data):
                raise DNSError("a DNS name runs past the answer")
            return offset + 2
        if length & 0xC0:
            raise DNSError("a DNS label of an unknown kind")
        offset += 1 + length
    raise DNSError("a DNS name with too many labels")
