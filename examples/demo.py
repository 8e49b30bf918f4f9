"""A short tour of the Chrysalis foundation: wire types and plugin discovery.

Run it with ``./dev demo`` (sets up the workspace first) or, inside the workspace
environment, ``python examples/demo.py``.
"""

from __future__ import annotations

import hashlib

from chrysalis.core import (
    ConnectionId,
    DatagramAddr,
    Pid,
    PidPrefix,
    PluginRegistry,
    target_pid,
)


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


if __name__ == "__main__":
    main()
