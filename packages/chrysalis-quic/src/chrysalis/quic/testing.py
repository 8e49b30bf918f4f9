"""Test helpers for the layers above ``chrysalis.quic``: identities and in-memory pairs.

Why a public module: the node, the nameserver and Monarch all need "two processes that can
talk over QUIC" in their tests, without sockets, ports or child processes. These helpers build
them over an ``InprocNetwork`` (or any network with ``bind()``, such as
``chrysalis.faultnet.FaultyNetwork`` for loss and reordering) with identities from one shared
in-memory development CA, on whichever event loop is running (asyncio or trio).

- ``issue_identity()`` / ``issue_identities(n)``: fresh leaves (fresh PIDs) of the shared CA.
- ``open_endpoint_pair()``: two duplex adapter endpoints (``AsyncioEndpoint`` or
  ``TrioEndpoint``), ``async with ... as (first, second)``.
- ``open_stream_pair()``: an established connection and one stream, both ends already known to
  each other (the opener sent one marker byte that the acceptor consumed), as
  ``(opened, accepted)``; good for stream conformance suites.
- ``open_transport_pair()``: two ``QuicTransport`` objects.

Everything is closed (and every task ended) when the ``async with`` block ends.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from chrysalis.datagram import DatagramSocket, InprocNetwork
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._devca import DevelopmentCA
from chrysalis.quic._driver import DEFAULT_DRIVER_MODE
from chrysalis.quic._endpoint_core import AdapterOptions
from chrysalis.quic._identity import Identity
from chrysalis.quic._transport import QuicTransport, current_async_library

__all__ = [
    "BindableNetwork",
    "connected_stream_pair",
    "issue_identities",
    "issue_identity",
    "open_endpoint_pair",
    "open_stream_pair",
    "open_transport_pair",
    "shared_ca",
]

_MARKER = b"\x00"
_lock = threading.Lock()
_ca: DevelopmentCA | None = None


class BindableNetwork(Protocol):
    """A network that binds fresh sockets (``InprocNetwork``, ``FaultyNetwork``)."""

    def bind(self) -> DatagramSocket: ...


def shared_ca() -> DevelopmentCA:
    """The process-wide in-memory development CA of the test helpers (created once)."""
    global _ca
    with _lock:
        if _ca is None:
            _ca = DevelopmentCA.create(common_name="chrysalis quic testing CA")
        return _ca


def issue_identity() -> Identity:
    """A fresh identity (a new leaf, so a new PID) trusted by every other one issued here."""
    return shared_ca().issue()


def issue_identities(count: int) -> list[Identity]:
    """``count`` fresh identities of the shared CA."""
    if count < 0:
        raise ValueError("count must not be negative")
    return [issue_identity() for _ in range(count)]


def _adapter() -> Any:
    if current_async_library() == "trio":
        from chrysalis.quic._trio import TrioEndpoint

        return TrioEndpoint
    from chrysalis.quic._asyncio import AsyncioEndpoint

    return AsyncioEndpoint


@asynccontextmanager
async def open_endpoint_pair(
    *,
    network: BindableNetwork | None = None,
    identities: tuple[Identity, Identity] | None = None,
    config: QuicConfig | None = None,
    options: AdapterOptions | None = None,
    driver: str = DEFAULT_DRIVER_MODE,
) -> AsyncIterator[tuple[Any, Any]]:
    """Two duplex endpoints of the running loop's adapter on ``network`` (a fresh
    ``InprocNetwork`` by default). Both are shut down when the block ends."""
    net: BindableNetwork = InprocNetwork() if network is None else network
    first_id, second_id = issue_identities(2) if identities is None else identities
    adapter = _adapter()
    kwargs: dict[str, Any] = {"config": config, "options": options, "driver": driver}
    async with (
        adapter.spawn_duplex(first_id, net.bind(), **kwargs) as first,
        adapter.spawn_duplex(second_id, net.bind(), **kwargs) as second,
    ):
        yield first, second


async def connected_stream_pair(first: Any, second: Any) -> tuple[Any, Any]:
    """Open a stream from ``first`` to ``second`` (dialling, or reusing the first connection
    ``first`` has to ``second``) and accept it; return ``(opened, accepted)``.

    The opener sends one marker byte that the acceptor consumes, so both ends exist and both
    streams are clean. ``second`` must not have other incoming streams waiting.
    """
    connection = None
    for candidate in first.connections():
        if candidate.dialed and not candidate.is_closed and candidate.core.peer == second.pid:
            connection = candidate
            break
    if connection is None:
        connection = await first.connect(second.pid, second.local_addr)
    opened = await connection.open_stream()
    opened.core.write(_MARKER)
    _, accepted = await second.accept()
    marker = await accepted.core.read_exactly(len(_MARKER))
    if marker != _MARKER:
        raise AssertionError(f"unexpected stream marker {marker!r}")
    return opened, accepted


@asynccontextmanager
async def open_stream_pair(
    *,
    network: BindableNetwork | None = None,
    config: QuicConfig | None = None,
    options: AdapterOptions | None = None,
    driver: str = DEFAULT_DRIVER_MODE,
) -> AsyncIterator[tuple[Any, Any]]:
    """``(opened, accepted)``: two ends of one stream between two fresh endpoints."""
    async with open_endpoint_pair(
        network=network, config=config, options=options, driver=driver
    ) as (first, second):
        yield await connected_stream_pair(first, second)


@asynccontextmanager
async def open_transport_pair(
    *,
    network: BindableNetwork | None = None,
    identities: tuple[Identity, Identity] | None = None,
    config: QuicConfig | None = None,
    driver: str = DEFAULT_DRIVER_MODE,
) -> AsyncIterator[tuple[QuicTransport[Any], QuicTransport[Any]]]:
    """Two ``QuicTransport`` objects on ``network`` (a fresh ``InprocNetwork`` by default)."""
    net: BindableNetwork = InprocNetwork() if network is None else network
    first_id, second_id = issue_identities(2) if identities is None else identities
    async with (
        QuicTransport.spawn(first_id, net.bind(), config=config, driver=driver) as first,
        QuicTransport.spawn(second_id, net.bind(), config=config, driver=driver) as second,
    ):
        yield first, second
