"""The QUIC settings of ``chrysalis scale`` processes: larger datagrams where every path is
local (issue 22: stream transfers of the persisted experiments).

Why: a scale tree launched on one machine talks only over Unix datagram sockets and loopback
UDP, where no link limits a datagram to an Ethernet MTU. With the default 1,472-byte QUIC
datagrams an 8 MiB transfer is about 5,700 datagrams, each one ``sendto`` and one pass of
packet building and AES-GCM, and a Unix socket's receive queue holds only
``net.unix.max_dgram_qlen`` datagrams (10 by default), whatever their size: a forwarding parent
(leaf to leaf traffic crosses the parent's ``DatagramSwitch``) drops what does not fit (spec
3.2: ``EgressQueueFull``), and each drop makes the sender's congestion control back off.
Measured (README, "Where a stream transfer's time goes"): 16 KiB datagrams cut the CPU per
transfer about tenfold and lift leaf-to-leaf transfers from 3 to 6 MiB/s to 15 to 35 MiB/s.

``max_udp_payload`` is a sending limit of each QUIC endpoint (QUIC's own parameter; the wire
format is unchanged): a peer with the default still sends 1,472-byte datagrams, and receives
these larger ones (a receiver accepts up to 65,527 bytes unless it says otherwise). Where a
UDP address is not a loopback address the default stays: the path may cross a real link.

Where every path is local, a scale node also answers new clients without a stateless Retry
(``QuicConfig(retry=False)``): the transport spec (5.4) skips Retry where the packet I/O
declares peer addresses validated, which a Unix datagram socket's kernel-given source path and
a loopback address are (no other host can send from them). Retry validates a client's address
against spoofed floods; here it only cost each child a round trip, a second ClientHello (four
key shares generated again) and a token minted and checked at its parent (issue 22 item 4:
about a fifth of a forked worker's start-up CPU together with the fork server's warm-up join,
README "Scale start-up"). Anything else keeps ``QuicConfig``'s default (Retry on).
"""

from __future__ import annotations

from typing import Final

from chrysalis.core import UDP_SCHEME, UNIXGRAM_SCHEME, DatagramAddr
from chrysalis.quic import QuicConfig

__all__ = ["LOCAL_MAX_UDP_PAYLOAD", "datagram_size", "is_local", "scale_quic_config"]

LOCAL_MAX_UDP_PAYLOAD: Final = 16 * 1024
"""QUIC datagram size of a scale node whose paths are all local (Unix or loopback UDP): the
largest ``QuicConfig`` accepts, since the engines write frame lengths as 2-byte varints."""


def is_local(address: DatagramAddr) -> bool:
    """Whether ``address`` is a Unix datagram socket or a loopback UDP address (a path that
    never leaves this machine)."""
    if address.scheme == UNIXGRAM_SCHEME:
        return True
    return address.scheme == UDP_SCHEME and address.ip.is_loopback


def datagram_size(*addresses: DatagramAddr | None) -> int:
    """The QUIC datagram size of a scale node that binds or dials ``addresses`` (``None``s
    are skipped): ``LOCAL_MAX_UDP_PAYLOAD`` when every address is local (``is_local``), else
    ``QuicConfig``'s default."""
    present = [address for address in addresses if address is not None]
    if present and all(is_local(address) for address in present):
        return LOCAL_MAX_UDP_PAYLOAD
    return QuicConfig().max_udp_payload


def scale_quic_config(idle_timeout: float, *addresses: DatagramAddr | None) -> QuicConfig:
    """The QUIC settings of a scale node that binds or dials ``addresses``: keepalives every
    quarter of ``idle_timeout``, datagrams of ``datagram_size(*addresses)``, and no stateless
    Retry where every path is local (see the module docstring)."""
    size = datagram_size(*addresses)
    return QuicConfig(
        idle_timeout=idle_timeout,
        keepalive_interval=idle_timeout / 4,
        max_udp_payload=size,
        retry=size != LOCAL_MAX_UDP_PAYLOAD,
    )
