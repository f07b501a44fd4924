"""A DNS server on loopback that answers A queries for the names a test sets, as a cluster's
DNS answers for a headless Service: one record per ready pod, with a TTL."""

from __future__ import annotations

import asyncio
import ipaddress
import struct


class DNSServer(asyncio.DatagramProtocol):
    def __init__(self, ttl: int = 5) -> None:
        self.records: dict[str, list[str]] = {}
        self.ttl = ttl
        self.port = 0
        self.questions = 0
        self._transport: asyncio.DatagramTransport | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> DNSServer:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=("127.0.0.1", 0)
        )
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        return self

    def stop(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        assert self._transport is not None
        self.questions += 1
        ident = data[:2]
        name, end = _name(data, 12)
        rtype = struct.unpack("!H", data[end : end + 2])[0]
        question = data[12 : end + 4]
        known = name in self.records
        answers = [a for a in self.records.get(name, []) if rtype == 1 and ":" not in a]
        flags = 0x8180 if known else 0x8183  # a response, recursion available; NXDOMAIN
        header = ident + struct.pack("!HHHHH", flags, 1, len(answers), 0, 0)
        body = b"".join(
            b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, self.ttl, 4) + ipaddress.ip_address(a).packed
            for a in answers
        )
        self._transport.sendto(header + question + body, addr)


def _name(data: bytes, offset: int) -> tuple[str, int]:
    labels = []
    while data[offset]:
        length = data[offset]
        labels.append(data[offset + 1 : offset + 1 + length].decode())
        offset += 1 + length
    return ".".join(labels), offset + 1
