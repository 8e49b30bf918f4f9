"""Chrysalis datagram carriers (UDP, Unix datagram, in-process), socket sets, PID routing and the
datagram switch.

Every carrier implements the non-blocking :class:`DatagramSocket` contract (see ``_socket``);
the asyncio and trio adapters (:class:`AsyncDatagramSocket`, :class:`TrioDatagramSocket`) are
imported lazily so that neither runtime is a hard dependency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chrysalis._lazy import lazy_exports
from chrysalis.datagram._route import (
    DEFAULT_MAX_ROUTES,
    Dropped,
    DropReason,
    Forwarded,
    ForwardResult,
    GatePermit,
    GateStatistics,
    Route,
    RouteGate,
    Router,
    RouterStatistics,
    RoutingTableFullError,
)
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    AddressInUseError,
    AddressNotAvailableError,
    ConnectionRefusedDatagramError,
    DatagramError,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    ShutdownState,
    SocketClosedError,
    UnsupportedSchemeError,
    Waker,
)
from chrysalis.datagram._socket_set import DatagramSocketSet
from chrysalis.datagram._switch import (
    DEFAULT_BINDING_BYTES,
    DEFAULT_BINDING_CAPACITY,
    MAX_BINDING_BYTES,
    MAX_BINDING_CAPACITY,
    BindingStatistics,
    DatagramSwitch,
    DestinationMismatchError,
    SwitchSocket,
    SwitchStatistics,
)
from chrysalis.datagram._udp import UdpSocket, udp_gso_supported
from chrysalis.datagram._unix import UnixDatagramSocket

if TYPE_CHECKING:
    from chrysalis.datagram._asyncio import AsyncDatagramSocket
    from chrysalis.datagram._inproc import InprocNetwork, InprocSocket
    from chrysalis.datagram._trio import TrioDatagramSocket

__all__ = [
    # ---- carriers (owned by the carriers engineer) ---------------------------------------------
    "DATAGRAM_BATCH_SIZE",
    "MAX_DATAGRAM_SIZE",
    "AddressInUseError",
    "AddressNotAvailableError",
    "AsyncDatagramSocket",
    "ConnectionRefusedDatagramError",
    "DatagramError",
    "DatagramRecvMeta",
    "DatagramSocket",
    "DatagramSocketSet",
    "DatagramTooLargeError",
    "DatagramTransmit",
    "HostUnreachableError",
    "InprocNetwork",
    "InprocSocket",
    "InvalidDataError",
    "ShutdownState",
    "SocketClosedError",
    "TrioDatagramSocket",
    "UdpSocket",
    "UnixDatagramSocket",
    "UnsupportedSchemeError",
    "Waker",
    "udp_gso_supported",
    # ---- routing ----
    "DEFAULT_MAX_ROUTES",
    "DropReason",
    "Dropped",
    "ForwardResult",
    "Forwarded",
    "GatePermit",
    "GateStatistics",
    "Route",
    "RouteGate",
    "Router",
    "RouterStatistics",
    "RoutingTableFullError",
    "DEFAULT_BINDING_BYTES",
    "DEFAULT_BINDING_CAPACITY",
    "MAX_BINDING_BYTES",
    "MAX_BINDING_CAPACITY",
    "BindingStatistics",
    "DatagramSwitch",
    "DestinationMismatchError",
    "SwitchSocket",
    "SwitchStatistics",
]

# The in-process carrier (tests and single-process meshes) loads on first use too: a process on
# real sockets (``chrysalis ls``) never needs it (issue 22, item 5).
_LAZY = {
    "InprocNetwork": "chrysalis.datagram._inproc",
    "InprocSocket": "chrysalis.datagram._inproc",
    "AsyncDatagramSocket": "chrysalis.datagram._asyncio",
    "TrioDatagramSocket": "chrysalis.datagram._trio",
}

__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
"""Import the runtime adapters (trio is an optional dependency) and the in-process carrier on
first use (``chrysalis._lazy``)."""
