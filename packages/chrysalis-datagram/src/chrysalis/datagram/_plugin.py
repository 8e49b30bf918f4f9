"""The ``chrysalis`` plugin of this package: registers the UDP, Unix datagram and in-process
carriers through the ``chrysalis_carriers`` hook.

Declared in ``pyproject.toml`` under ``[project.entry-points.chrysalis]``, so
``chrysalis.core.default_registry().open_carrier("udp://127.0.0.1:0")`` finds it. The hook
only describes the carriers (it opens nothing); the factories open sockets when called:

* ``udp``: ``UdpSocket.bind(address, **options)`` (``recv_buffer``, ``send_buffer``, ``gso``,
  ``gro``);
* ``unixgram``: ``UnixDatagramSocket.bind(address, **options)`` (``send_buffer``,
  ``recv_buffer``);
* ``inproc``: binds ``address.endpoint_id`` on the live :class:`InprocNetwork` whose id is
  ``address.network_id`` (or on the ``network=`` option, which must have that id).

Carrier modules are imported inside the factories, so loading the plugin stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chrysalis.core import (
    INPROC_SCHEME,
    UDP_SCHEME,
    UNIXGRAM_SCHEME,
    AddressError,
    CarrierSpec,
    DatagramAddr,
)
from chrysalis.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from chrysalis.datagram._inproc import InprocSocket
    from chrysalis.datagram._udp import UdpSocket
    from chrysalis.datagram._unix import UnixDatagramSocket

__all__ = ["chrysalis_carriers", "open_inproc", "open_udp", "open_unixgram"]


def _take(options: dict[str, object], name: str, kind: type[Any], default: Any) -> Any:
    value = options.pop(name, default)
    if value is not default and not isinstance(value, kind):
        raise TypeError(f"option {name!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _no_more(options: dict[str, object], scheme: str) -> None:
    if options:
        unknown = ", ".join(sorted(options))
        raise TypeError(f"unknown {scheme} carrier option(s): {unknown}")


def open_udp(address: DatagramAddr, /, **options: object) -> UdpSocket:
    """Carrier factory for ``udp`` addresses; options ``recv_buffer`` / ``send_buffer``
    (int) and ``gso`` / ``gro`` (bool or None), as in ``UdpSocket.bind``."""
    from chrysalis.datagram._udp import DEFAULT_UDP_BUFFER_SIZE, UdpSocket

    recv_buffer = _take(options, "recv_buffer", int, DEFAULT_UDP_BUFFER_SIZE)
    send_buffer = _take(options, "send_buffer", int, DEFAULT_UDP_BUFFER_SIZE)
    gso = _take(options, "gso", bool, None)
    gro = _take(options, "gro", bool, None)
    _no_more(options, UDP_SCHEME)
    return UdpSocket.bind(
        address, recv_buffer=recv_buffer, send_buffer=send_buffer, gso=gso, gro=gro
    )


def open_unixgram(address: DatagramAddr, /, **options: object) -> UnixDatagramSocket:
    """Carrier factory for ``unixgram`` addresses; options ``send_buffer`` / ``recv_buffer``
    (int), as in ``UnixDatagramSocket.bind``."""
    from chrysalis.datagram._unix import DEFAULT_UNIX_BUFFER_SIZE, UnixDatagramSocket

    send_buffer = _take(options, "send_buffer", int, DEFAULT_UNIX_BUFFER_SIZE)
    recv_buffer = _take(options, "recv_buffer", int, DEFAULT_UNIX_BUFFER_SIZE)
    _no_more(options, UNIXGRAM_SCHEME)
    return UnixDatagramSocket.bind(address, send_buffer=send_buffer, recv_buffer=recv_buffer)


def open_inproc(address: DatagramAddr, /, **options: object) -> InprocSocket:
    """Carrier factory for ``inproc`` addresses; option ``network`` (an ``InprocNetwork``
    whose id must match the address).

    Raises ``AddressError`` for a non-inproc address or a ``network`` with another id, and
    ``HostUnreachableError`` when no live network has the address's network id.
    """
    from chrysalis.datagram._inproc import InprocNetwork
    from chrysalis.datagram._socket import HostUnreachableError

    network: InprocNetwork | None = _take(options, "network", InprocNetwork, None)
    _no_more(options, INPROC_SCHEME)
    if address.scheme != INPROC_SCHEME:
        raise AddressError(f"the inproc carrier needs an inproc address, got {address}")
    if network is None:
        network = InprocNetwork.lookup(address.network_id)
        if network is None:
            raise HostUnreachableError(f"no live inproc network {address.network_id}")
    elif network.network_id != address.network_id:
        raise AddressError(f"{address} is not on inproc network {network.network_id}")
    return network.bind(address.endpoint_id)


@hookimpl
def chrysalis_carriers() -> Sequence[CarrierSpec]:
    """The three carriers of ``chrysalis.datagram``."""
    return (
        CarrierSpec(UDP_SCHEME, open_udp, "UDP over IPv4/IPv6 with GSO/GRO batching"),
        CarrierSpec(UNIXGRAM_SCHEME, open_unixgram, "Unix datagram sockets (path or abstract)"),
        CarrierSpec(INPROC_SCHEME, open_inproc, "in-process bounded queues (InprocNetwork)"),
    )
