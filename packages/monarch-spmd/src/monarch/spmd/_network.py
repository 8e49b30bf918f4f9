"""Host names, addresses and free ports for the rendezvous (``MASTER_ADDR``/``MASTER_PORT``)."""

from __future__ import annotations

import enum
import ipaddress
import logging
import socket

__all__ = ["AddrType", "find_free_port", "get_ipaddr"]

logger = logging.getLogger(__name__)


class AddrType(enum.Enum):
    """Which address :meth:`SPMDActor.get_host_port` reports instead of the host name (as
    ``monarch.tools.network.AddrType``): ``Default`` tries IPv6 then IPv4."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


def find_free_port() -> int:
    """A TCP port free on this host now (the kernel's pick; a later bind may still race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """The first routable (not link-local) address of ``hostname`` for TCP in the families of
    ``addr_type``; ``RuntimeError`` when there is none."""
    if addr_type is AddrType.IPv4:
        families = [socket.AF_INET]
    elif addr_type is AddrType.IPv6:
        families = [socket.AF_INET6]
    elif addr_type is AddrType.Default:
        families = [socket.AF_INET6, socket.AF_INET]
    else:
        raise ValueError(f"unknown address type {addr_type!r}")
    for family in families:
        try:
            found = socket.getaddrinfo(hostname, port, family, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            logger.info("no %s address for %s:%d (%s)", family.name, hostname, port, error)
            continue
        for _, _, _, _, sockaddr in found:
            addr = str(sockaddr[0])
            if ipaddress.ip_address(addr).is_link_local:
                logger.info("skipping link-local address %s of %s", addr, hostname)
                continue
            return addr
    raise RuntimeError(
        f"cannot resolve {hostname!r} to a routable {addr_type.name} address for TCP;"
        " check the host's network configuration"
    )
