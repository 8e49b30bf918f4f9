"""The ``faultnet`` carrier plugin: open any carrier's socket behind a fault plan.

Why a carrier scheme: code that opens its sockets from configuration (an address and options,
through ``PluginRegistry.open_carrier``) can be pointed at a bad network without a code change.

Address: scheme ``faultnet``; the opaque bytes are the *inner* address as UTF-8 text, for
example ``DatagramAddr("faultnet", b"udp://127.0.0.1:0")`` (build it with
:func:`faultnet_address`). The special inner text ``inproc`` binds a fresh endpoint on an
in-process network: the ``network`` option, or else one process-wide ``InprocNetwork`` shared by
every ``faultnet`` ``inproc`` socket. As text, like every scheme the core does not know, the
address is written in hex: ``faultnet://696e70726f63`` is ``faultnet_address("inproc")``.

Options (keyword arguments of the factory):

* fault plan fields: ``seed``, ``loss``, ``duplicate``, ``reorder``, ``reorder_window``,
  ``reorder_timeout``, ``delay``, ``jitter``, ``max_held``, ``direction`` -- numbers or text
  (``loss="0.1"``), see :class:`FaultPlan`;
* ``inner_options``: a mapping passed as keyword options to the inner carrier's factory;
* ``registry``: the ``PluginRegistry`` that opens the inner address (default: the process-wide
  one); ``network``: the network ``inproc`` binds on;
* ``clock`` and ``timer_thread``: passed to :class:`FaultySocket`.

Unknown options raise ``TypeError``; a bad address or value ``ValueError``. The plan is
validated before the inner socket is opened, so a bad option leaks nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from chrysalis.core import (
    AddressError,
    CarrierSpec,
    DatagramAddr,
    PluginRegistry,
    default_registry,
    hookimpl,
)
from chrysalis.datagram import DatagramSocket
from chrysalis.faultnet._network import BindableNetwork, new_inproc_network
from chrysalis.faultnet._plan import FaultPlan
from chrysalis.faultnet._socket import FaultySocket

__all__ = [
    "FAULTNET_SCHEME",
    "INPROC_INNER",
    "chrysalis_carriers",
    "faultnet_address",
    "open_faultnet",
]

#: The carrier scheme this plugin serves.
FAULTNET_SCHEME: Final = "faultnet"
#: Inner address text meaning "a fresh endpoint on an in-process network".
INPROC_INNER: Final = "inproc"

_shared_lock: Final = threading.Lock()
_shared_network: BindableNetwork | None = None


def faultnet_address(inner: DatagramAddr | str) -> DatagramAddr:
    """The ``faultnet`` address wrapping ``inner`` (an address, its text, or ``"inproc"``).

    Raises ``AddressError`` (a ``ValueError``) for text that is not an address, and for an
    inner address that is itself ``faultnet``.
    """
    if isinstance(inner, DatagramAddr):
        text = str(inner)
    elif isinstance(inner, str):
        text = inner
    else:
        raise TypeError(
            f"faultnet_address() needs a DatagramAddr or str, not {type(inner).__name__}"
        )
    _parse_inner(text)  # validate now rather than when the socket is opened
    return DatagramAddr(FAULTNET_SCHEME, text.encode("utf-8"))


def _parse_inner(text: str) -> DatagramAddr | None:
    """The inner address of ``text``, or ``None`` for :data:`INPROC_INNER`."""
    if text == INPROC_INNER:
        return None
    inner = DatagramAddr.parse(text)
    if inner.scheme == FAULTNET_SCHEME:
        raise AddressError("a faultnet address cannot wrap another faultnet address")
    return inner


def _shared_inproc_network() -> BindableNetwork:
    global _shared_network
    with _shared_lock:
        if _shared_network is None:
            _shared_network = new_inproc_network()
        return _shared_network


def open_faultnet(address: DatagramAddr, /, **options: Any) -> FaultySocket:
    """Open the inner socket named by ``address`` and wrap it in a :class:`FaultySocket`
    (the ``faultnet`` carrier factory; see the module docstring for address and options)."""
    if not isinstance(address, DatagramAddr):
        raise TypeError(f"open_faultnet() needs a DatagramAddr, not {type(address).__name__}")
    if address.scheme != FAULTNET_SCHEME:
        raise ValueError(f"open_faultnet() needs a {FAULTNET_SCHEME} address, got {address}")
    try:
        text = address.opaque.decode("utf-8")
    except UnicodeDecodeError:
        raise AddressError(f"{address} does not hold an inner address as UTF-8 text") from None
    inner_addr = _parse_inner(text)
    inner_options: object = options.pop("inner_options", None) or {}
    if not isinstance(inner_options, Mapping):
        raise TypeError(f"inner_options must be a mapping, not {type(inner_options).__name__}")
    registry: object = options.pop("registry", None)
    if registry is not None and not isinstance(registry, PluginRegistry):
        raise TypeError(f"registry must be a PluginRegistry, not {type(registry).__name__}")
    network: BindableNetwork | None = options.pop("network", None)
    clock: Callable[[], float] | None = options.pop("clock", None)
    timer_thread = options.pop("timer_thread", True)
    if not isinstance(timer_thread, bool):
        raise TypeError(f"timer_thread must be a bool, not {type(timer_thread).__name__}")
    plan = FaultPlan.from_options(options)
    if inner_addr is None:
        if inner_options:
            raise TypeError("inner_options are not supported for the inproc inner carrier")
        source = network if network is not None else _shared_inproc_network()
        inner: object = source.bind()
    else:
        if network is not None:
            raise TypeError("the network option applies only to the inproc inner carrier")
        reg = registry if registry is not None else default_registry()
        inner = reg.open_carrier(inner_addr, **inner_options)
    if not isinstance(inner, DatagramSocket):
        raise TypeError(
            f"the inner carrier returned a {type(inner).__name__}, not a DatagramSocket"
        )
    try:
        if clock is None:
            return FaultySocket(inner, plan, timer_thread=timer_thread)
        return FaultySocket(inner, plan, clock=clock, timer_thread=timer_thread)
    except BaseException:
        inner.shutdown()
        raise


_CARRIERS: Final = (
    CarrierSpec(
        FAULTNET_SCHEME,
        open_faultnet,
        "fault injection (loss, duplication, reordering, delay, partitions) around any carrier",
    ),
)


@hookimpl
def chrysalis_carriers() -> Sequence[CarrierSpec]:
    """The ``faultnet`` carrier."""
    return _CARRIERS
