"""Which address a node listening on a wildcard (``udp://0.0.0.0:PORT``, ``udp://[::]:PORT``)
advertises: its join token, its nameserver locator, the address a worker loop reports.

A wildcard bind accepts datagrams on every interface, but ``0.0.0.0`` is no address another host
can send to. The node advertises, with the bound port, the first of:

1. the address given explicitly (``--advertise IP``, ``Node(advertise=...)``);
2. the bound address itself when it is not a wildcard;
3. the local address the kernel uses toward the node's parent (a joined node: the interface
   its parent reaches it on);
4. the local address of the interface the default route uses;
5. the first address of a non-loopback interface that is up (interfaces in name order);
6. the loopback address (a host with no other network: only its own processes can reach it).

``choose_advertised`` is that rule alone (sans-IO: it is given what the host knows);
``host_view`` collects those facts from the kernel (a routing query sends no packet) and
``advertised_address`` puts both together.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from chrysalis.core import DatagramAddr

__all__ = [
    "HostView",
    "advertised_address",
    "choose_advertised",
    "host_view",
    "is_wildcard",
    "parse_advertise",
    "route_source",
]

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
#: Where the default-route query points (TEST-NET-1 / the IPv6 documentation prefix: never
#: contacted, a UDP connect only asks the kernel for a route).
_PROBE_V4: Final = "192.0.2.1"
_PROBE_V6: Final = "2001:db8::1"
#: Most interfaces looked at.
MAX_INTERFACES: Final = 256
_SIOCGIFADDR: Final = 0x8915
_SIOCGIFFLAGS: Final = 0x8913
_IFF_UP: Final = 0x1
_IFF_LOOPBACK: Final = 0x8


class HostView(NamedTuple):
    """What the host knows about its addresses: the source address toward the parent (None
    for a root or when unknown), the default route's source address (None without a default
    route), and the up interfaces' addresses as ``(name, address, is_loopback)``."""

    toward_parent: _IP | None
    default_route: _IP | None
    interfaces: Sequence[tuple[str, _IP, bool]]


def is_wildcard(addr: DatagramAddr) -> bool:
    """Whether ``addr`` is a UDP wildcard bind (``0.0.0.0`` or ``::``)."""
    return addr.scheme == "udp" and addr.ip.is_unspecified


def parse_advertise(text: str) -> _IP:
    """An ``--advertise`` value: an IP address (``10.0.0.5``, ``fe80::1``), optionally as
    ``udp://IP`` or ``udp://IP:PORT`` (the port is ignored: a node advertises the port it bound).
    ``ValueError`` naming the value otherwise."""
    rest = text.strip()
    if rest.startswith("udp://"):
        rest = rest[len("udp://") :]
        if rest.startswith("["):
            rest = rest[1:].partition("]")[0]
        elif rest.count(":") == 1:
            rest = rest.partition(":")[0]
    try:
        ip = ipaddress.ip_address(rest)
    except ValueError:
        raise ValueError(f"advertise address {text!r} is not an IP address") from None
    if ip.is_unspecified:
        raise ValueError(f"advertise address {text!r} is a wildcard: nobody can reach it")
    return ip


def choose_advertised(
    bound: DatagramAddr, view: HostView | None, override: _IP | None = None
) -> DatagramAddr:
    """The address to advertise for a carrier bound at ``bound`` (see the module docstring);
    ``view`` is needed only when ``bound`` is a wildcard and there is no ``override``."""
    if bound.scheme != "udp":
        return bound
    if override is not None:
        return DatagramAddr.udp(str(override), bound.port)
    if not bound.ip.is_unspecified:
        return bound
    if view is None:
        raise ValueError("a wildcard bind needs the host's addresses to choose one")
    family = bound.ip.version

    def usable(ip: _IP | None) -> bool:
        return ip is not None and ip.version == family and not ip.is_unspecified

    for candidate in (view.toward_parent, view.default_route):
        if usable(candidate):
            return DatagramAddr.udp(str(candidate), bound.port)
    ordered = sorted(view.interfaces, key=lambda item: item[0])
    for _name, ip, loopback in ordered:
        if not loopback and usable(ip) and not ip.is_link_local:
            return DatagramAddr.udp(str(ip), bound.port)
    return DatagramAddr.udp("127.0.0.1" if family == 4 else "::1", bound.port)


# -- what the kernel says (IO) -------------------------------------------------------------------
def route_source(destination: str) -> _IP | None:
    """The local address the kernel would use toward ``destination`` (no packet is sent), or
    None without a route."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((destination, 9))
            ip = ipaddress.ip_address(probe.getsockname()[0].split("%")[0])
    except (OSError, ValueError):
        return None
    return None if ip.is_unspecified else ip


def _interfaces() -> list[tuple[str, _IP, bool]]:
    """IPv4 addresses of the up interfaces (Linux ioctls; empty where they are missing)."""
    found: list[tuple[str, _IP, bool]] = []
    try:
        names = [name for _index, name in socket.if_nameindex()][:MAX_INTERFACES]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags_raw = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request)
                address_raw = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address, or not a real interface
            flags = array.array("H", flags_raw[16:18])[0]
            if not flags & _IFF_UP:
                continue
            ip = ipaddress.IPv4Address(address_raw[20:24])
            found.append((name, ip, bool(flags & _IFF_LOOPBACK) or ip.is_loopback))
    return found


def host_view(parent: DatagramAddr | None = None, *, family: int = 4) -> HostView:
    """What this host knows (see ``HostView``): routing queries and the interface list."""
    toward = None
    if parent is not None and parent.scheme == "udp":
        with contextlib.suppress(ValueError):
            toward = route_source(str(parent.ip))
    default = route_source(_PROBE_V4 if family == 4 else _PROBE_V6)
    return HostView(toward, default, _interfaces() if family == 4 else [])


def advertised_address(
    bound: DatagramAddr,
    *,
    override: str | None = None,
    parent: DatagramAddr | None = None,
) -> DatagramAddr:
    """The address to advertise for ``bound`` on this host (``choose_advertised`` with the
    kernel's view, gathered only when needed). ``ValueError`` for a bad ``override``."""
    ip = parse_advertise(override) if override is not None else None
    if ip is not None or not is_wildcard(bound):
        return choose_advertised(bound, None, ip)
    return choose_advertised(bound, host_view(parent, family=bound.ip.version))
