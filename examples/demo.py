"""A short tour of Chrysalis: wire types, plugin discovery and an authenticated QUIC exchange.

Run it with ``./dev demo`` (sets up the workspace first) or, inside the workspace
environment, ``python examples/demo.py``.
"""

from __future__ import annotations

import asyncio
import hashlib

from chrysalis.core import (
    ConnectionId,
    DatagramAddr,
    Pid,
    PidPrefix,
    PluginRegistry,
    target_pid,
)
from chrysalis.datagram import UdpSocket
from chrysalis.quic import AsyncioEndpoint, DevelopmentCA


def main() -> None:
    # A process identity is the first 16 bytes of SHA-256 over its DER leaf certificate.
    fake_leaf = b"0\x82\x01\x00" + hashlib.sha256(b"demo leaf").digest()
    pid = Pid.from_certificate(fake_leaf)
    print(f"PID of the demo leaf:      {pid}")
    print(f"parsed back (upper case):  {Pid.parse(str(pid).upper()) == pid}")
    prefix = PidPrefix.parse(str(pid)[:5])
    print(f"prefix {prefix} expands to: {prefix.expand([pid, Pid.LINK_LOCAL])}")

    # Every QUIC connection ID is 20 bytes: the destination PID, then a u32 suffix.
    issued = ConnectionId.issued(pid, 7)
    initial = ConnectionId.initial(pid, 1)
    print(f"issued CID:                {bytes(issued).hex()} (initial={issued.is_initial})")
    print(f"client Initial CID:        {bytes(initial).hex()} (initial={initial.is_initial})")
    short_header_packet = b"\x40" + bytes(issued) + b"payload"
    print(f"target PID of a packet:    {target_pid(short_header_packet)}")

    # Carrier addresses are a scheme plus opaque bytes, with readable text forms.
    for text in ("udp://127.0.0.1:4433", "udp://[::1]:4433", "unixgram:///tmp/chrysalis.sock"):
        addr = DatagramAddr.parse(text)
        print(f"{text:<31} -> {addr.scheme} {addr.opaque.hex()}")

    # Plugins are found through the `chrysalis` entry-point group of installed distributions.
    registry = PluginRegistry()
    registry.load_entry_points()
    carriers = registry.carriers()
    print(f"carriers found through entry points: {', '.join(sorted(carriers)) or '(none)'}")
    for scheme, spec in sorted(carriers.items()):
        print(f"  {scheme:<10} {spec.description}")

    # Two processes' worth of identity from one development CA; PIDs come from the leaves.
    asyncio.run(asyncio.wait_for(quic_exchange(), 30))


async def quic_exchange() -> None:
    ca = DevelopmentCA.create()
    alice, bob = ca.issue(), ca.issue()
    loopback = DatagramAddr.udp("127.0.0.1", 0)
    async with (
        AsyncioEndpoint.spawn_duplex(alice, UdpSocket.bind(loopback)) as a,
        AsyncioEndpoint.spawn_duplex(bob, UdpSocket.bind(loopback)) as b,
    ):
        # Every connection ID carries the PID of the process that terminates the packet; the
        # connection only completes if the peer's certificate hashes to the PID we dialled.
        connection = await a.connect(bob.pid, b.local_addr)
        stream = await connection.open_stream()
        stream.write(b"ping")
        stream.write_eof()
        peer, incoming = await b.accept()
        request = await incoming.read()
        incoming.write(request.replace(b"ping", b"pong"))
        incoming.write_eof()
        reply = await stream.read()
        print(f"QUIC over UDP {a.local_addr} -> {b.local_addr}")
        print(f"  {bob.pid} accepted a stream from authenticated PID {peer}")
        print(f"  {alice.pid} sent b'ping' and got {reply!r}")


if __name__ == "__main__":
    main()
