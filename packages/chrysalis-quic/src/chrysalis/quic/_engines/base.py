"""The engine seam: the small interface the endpoint uses to drive one QUIC state machine.

Why a seam: the endpoint (``_endpoint``) owns everything Chrysalis-specific (CID routing,
Retry, admission, PID authentication, ordered stream operations, completions, backpressure);
the QUIC protocol itself (packet protection, loss recovery, congestion control, TLS) comes from
a library. Keeping the endpoint's needs in one narrow interface means a second library (qh3,
with a Rust core) can be plugged in later by writing one adapter module, and it documents
exactly which behaviour the endpoint relies on:

* the endpoint chooses every connection ID: the engine is *given* the first host CID, the
  client's Initial destination CID, and a callable that issues further host CIDs;
* the server requests a client certificate; neither side verifies the peer chain (the
  endpoint does, with the identity's roots) but both expose the chain the peer presented;
* addresses are opaque ``DatagramAddr`` values; an engine that needs IP tuples maps them
  itself (aioquic only compares addresses, so it needs no mapping);
* receive flow control follows what the *application* consumed (``stream_consumed``,
  ``set_buffered``), never merely what arrived, so received bytes waiting in the endpoint are
  bounded by the windows;
* the engine reports, per stream, the contiguous acknowledged offset and the bytes it still
  buffers, so the endpoint can complete sends on acknowledgement and bound each stream's
  in-engine buffer (aioquic has no send backpressure of its own).

Events are the endpoint's own small, frozen, slotted types, so no library type leaks upward.
Everything here is pure typing: no I/O, no clocks (``now`` is always an argument).

Optional hints (``EngineHints``): an engine connection *may* also carry plain attributes that
let the endpoint skip calls on the round-trip path; one without them is driven as before
(the endpoint reads them with a fallback, so a third engine needs none of them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias

from chrysalis.core import DatagramAddr
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._identity import Identity

__all__ = [
    "AUTHENTICATION_FAILED_CODE",
    "CidIssued",
    "CidRetired",
    "EngineConnection",
    "EngineFactory",
    "EngineHints",
    "EngineEvent",
    "EngineStatistics",
    "HandshakeCompleted",
    "QuicEngine",
    "StopSendingReceived",
    "StreamDataReceived",
    "StreamResetReceived",
    "Terminated",
    "TerminationKind",
]


AUTHENTICATION_FAILED_CODE: Final = 1
"""Application close code of a connection whose peer identity was rejected (by the endpoint's
PID check, or by an engine's own client authentication: qh3's client proof)."""


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """The TLS handshake finished (the peer is *not* verified yet: the endpoint does that)."""

    alpn: str | None


@dataclass(frozen=True, slots=True)
class StreamDataReceived:
    """In-order bytes of ``stream_id`` (``fin`` when they end the stream)."""

    stream_id: int
    data: bytes
    fin: bool


# Engines build one ``StreamDataReceived`` per datagram that carries stream data (the common
# event): through its slots' descriptors, as the completion model builds its completions,
# instead of the frozen dataclass's generated ``__init__`` (a Python frame that sets each
# field through ``object.__setattr__``). ``new_stream_data`` then one setter per field; a
# field added above must be set there too (the engine tests compare with the constructor).
new_stream_data: Final[Callable[[type[StreamDataReceived]], StreamDataReceived]] = object.__new__


def _slot_setter(name: str) -> Callable[[StreamDataReceived, Any], None]:
    """The setter of a slotted field's descriptor (it bypasses the frozen class's guard)."""
    setter: Callable[[StreamDataReceived, Any], None] = getattr(StreamDataReceived, name).__set__
    return setter


set_sdr_stream_id: Final = _slot_setter("stream_id")
set_sdr_data: Final = _slot_setter("data")
set_sdr_fin: Final = _slot_setter("fin")


@dataclass(frozen=True, slots=True)
class StreamResetReceived:
    """The peer reset its send half of ``stream_id`` with ``error_code``."""

    stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class StopSendingReceived:
    """The peer asked us to stop sending on ``stream_id`` (the engine resets our send half)."""

    stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class CidIssued:
    """The engine issued another host connection ID (route it to this connection)."""

    cid: bytes


@dataclass(frozen=True, slots=True)
class CidRetired:
    """The peer retired a host connection ID (stop routing it)."""

    cid: bytes


class TerminationKind(enum.Enum):
    """How a connection ended."""

    APPLICATION = "application"
    """An application CONNECTION_CLOSE (ours or the peer's, whichever came first)."""
    TRANSPORT = "transport"
    """A transport CONNECTION_CLOSE: a protocol error on either side."""
    IDLE = "idle"
    """Silence: the idle timeout expired, nothing was sent."""


@dataclass(frozen=True, slots=True)
class Terminated:
    """The connection reached its final state; ``error_code`` is None for ``IDLE``.

    This is the engine's last event for the connection.
    """

    kind: TerminationKind
    error_code: int | None
    reason: str


EngineEvent: TypeAlias = (
    HandshakeCompleted
    | StreamDataReceived
    | StreamResetReceived
    | StopSendingReceived
    | CidIssued
    | CidRetired
    | Terminated
)
"""Everything ``EngineConnection.next_event`` can return."""


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """A snapshot of one connection's recovery state (what the engine can tell).

    Attributes:
        smoothed_rtt: seconds (0.0 before the first sample).
        congestion_window: bytes.
        bytes_in_flight: bytes sent and not yet acknowledged or declared lost.
        pto_count: consecutive probe timeouts (the reference's "congestion events" proxy).
    """

    smoothed_rtt: float
    congestion_window: int
    bytes_in_flight: int
    pto_count: int


class EngineConnection(Protocol):
    """One QUIC connection state machine, driven by the endpoint.

    Contract: every method takes ``now`` where time matters and never reads a clock; no
    method performs I/O. ``receive_datagram``, ``handle_timer`` and the stream operations may
    queue events and datagrams; the endpoint drains ``next_event`` after each of them and
    calls ``datagrams_to_send`` before sleeping until ``get_timer``. Stream operations raise
    ``ValueError`` for a stream the engine cannot use (for example one it already discarded).
    """

    def receive_datagram(self, data: bytes, addr: DatagramAddr, now: float) -> None:
        """Feed one received datagram (already routed to this connection)."""

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, DatagramAddr]]:
        """Return the datagrams to transmit now, with their destinations."""

    def get_timer(self) -> float | None:
        """The time ``handle_timer`` must next be called, or None."""

    def handle_timer(self, now: float) -> None:
        """Fire the timer (loss detection, acknowledgement delay, pacing, idle, close)."""

    def next_event(self) -> EngineEvent | None:
        """Pop the oldest queued event, or None."""

    def open_stream(self, stream_id: int) -> None:
        """Create local state for a locally initiated bidirectional stream (sends nothing)."""

    def send_stream_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None:
        """Append ``data`` (and FIN when ``end_stream``) to the stream's send buffer."""

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        """Abort the stream's send half (RESET_STREAM)."""

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        """Ask the peer to stop sending (STOP_SENDING)."""

    def stream_send_state(self, stream_id: int) -> tuple[int, int] | None:
        """``(acknowledged_through, buffered)`` of the stream's send half: the contiguous
        acknowledged offset and the bytes handed over but not acknowledged; None when the
        engine no longer has the stream (it finished: FIN or reset acknowledged)."""

    def sends_settled(self) -> bool:
        """True when nothing handed over on any stream awaits acknowledgement: every byte
        and every FIN was acknowledged (a reset send half counts as settled: its data was
        given up). A graceful shutdown closes the connection only once this holds (or its
        grace ran out): a CONNECTION_CLOSE ends retransmission, so a FIN or byte still in
        flight, or not even sent yet, would never reach the peer."""

    def stream_consumed(self, stream_id: int, consumed_through: int) -> None:
        """The application consumed (or the endpoint dropped) the stream's received bytes up
        to ``consumed_through``: the stream's receive window may slide."""

    def set_buffered(self, nbytes: int) -> None:
        """Received bytes the endpoint still holds for this connection (not yet consumed):
        the connection's receive window covers exactly what left the endpoint."""

    def close(self, error_code: int, reason: str) -> None:
        """Close with an application error code (idempotent; the first close wins)."""

    def send_ping(self, uid: int) -> None:
        """Queue a PING frame (an ack-eliciting packet) for the next ``datagrams_to_send``:
        the endpoint's keepalive. Its acknowledgement is not reported as an event."""

    def peer_certificate_chain(self) -> list[bytes]:
        """The DER chain the peer presented, leaf first (empty when it presented none)."""

    @property
    def host_cid(self) -> bytes:
        """The host connection ID the first packets carry as source CID."""

    @property
    def peer_packet_seen(self) -> bool:
        """True once the engine authenticated (decrypted) at least one packet of the peer."""

    @property
    def is_terminated(self) -> bool:
        """True once the connection reached its final state (no more datagrams or events
        except those already queued)."""

    def statistics(self) -> EngineStatistics:
        """A snapshot of the recovery state."""


class EngineHints(Protocol):
    """Optional attributes of an ``EngineConnection`` (not part of its required protocol).

    Why: a request/response round trip drains events after each receipt and each flush, and
    delivers bytes that the engine may credit on its own. Asking ``next_event`` until it says
    None and calling a ``stream_consumed`` that does nothing are whole calls per datagram;
    these plain attributes (read without a call) let the endpoint skip them. An engine
    without an attribute is driven as before (``event_queue`` None, ``stream_consumed_noop``
    False).

    Attributes:
        event_queue: None (drain by calling ``next_event`` until it returns None), or a
            container, the same object for the connection's life, that is non-empty whenever
            ``next_event`` would return an event, unless ``events_withheld`` is True. The
            endpoint then calls ``next_event`` only while ``event_queue or
            events_withheld``, so no event is skipped and the order is ``next_event``'s.
        events_withheld: with an ``event_queue``: True while the engine holds back events
            that ``next_event`` may release (qh3's receive gate); the endpoint then asks.
        stream_consumed_noop: True when ``stream_consumed`` does nothing (the engine credits
            the peer otherwise); the endpoint may then skip the call.
    """

    event_queue: Sized | None
    events_withheld: bool
    stream_consumed_noop: bool


class QuicEngine(Protocol):
    """Creates ``EngineConnection`` objects for one endpoint's identity and parameters."""

    def connect(
        self,
        *,
        host_cid: bytes,
        initial_dcid: bytes,
        addr: DatagramAddr,
        server_name: str | None,
        issue_cid: Callable[[], bytes],
        now: float,
    ) -> EngineConnection:
        """Start a client connection whose first source CID is ``host_cid`` and whose
        Initial destination CID is ``initial_dcid``; further host CIDs come from
        ``issue_cid``. ``server_name`` is sent as SNI when it is a DNS name."""

    def accept(
        self,
        *,
        host_cid: bytes,
        original_dcid: bytes,
        retry_scid: bytes | None,
        issue_cid: Callable[[], bytes],
    ) -> EngineConnection:
        """Create a server connection for a client whose first Initial carried
        ``original_dcid``; ``retry_scid`` is the source CID of the Retry it answered (None
        without Retry). The server requests a client certificate."""


EngineFactory: TypeAlias = Callable[[QuicConfig, Identity], QuicEngine]
"""Builds an engine for an endpoint's configuration and identity."""
