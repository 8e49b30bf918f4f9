"""The qh3 implementation of the engine seam (optional: ``pip install chrysalis-quic[qh3]``).

Why a second engine: qh3 (2.1) keeps aioquic's sans-IO API but moves packet processing, loss
recovery and congestion control into a Rust core, which costs several times less CPU per
packet (see the platform notes). Its Python layer is thin, so this module drives the native
core (``QuicConnectionCore``) almost directly and keeps qh3's Python TLS 1.3 stack. Each
difference from what the endpoint needs is handled here, as narrowly as qh3 allows:

1. **Client authentication.** A qh3 server never sends a TLS CertificateRequest, so a client
   cannot present its certificate in TLS. The server engine asks for the *session-bound
   client proof* instead (``_client_proof``): it advertises ``initial_max_streams_uni = 1``,
   the client signs this session's TLS exporter with its leaf key on stream 2, and the
   engine reports ``HandshakeCompleted`` only once the proof was judged; until then no stream
   data can reach the application (the endpoint gates delivery on that event). The chain the
   proof carried is then ``peer_certificate_chain()``, verified by the endpoint exactly like a
   TLS client chain; a rejected, oversized or missing proof (``proof_timeout``) closes the
   connection with code 1 and reports an empty chain. A qh3 *client* sends the proof whenever
   its server asks; towards an aioquic server (which asks for a TLS certificate and allows no
   unidirectional stream) it presents its certificate in TLS instead.
2. **Connection IDs.** The endpoint's first host CID and the client's Initial destination CID
   replace qh3's random ones before the native core exists. Further CIDs are drawn by the
   Rust core at random and cannot be supplied; the core refuses a peer CID limit below 2, so
   each side issues exactly one spare, random CID (reported as ``CidIssued`` and routed by
   exact match). Packets keep using the endpoint-chosen, PID-prefixed CIDs unless a peer
   migrates, which Chrysalis peers do not do; the tests audit every datagram.
3. **Receive flow control.** The native core grants credit when an application event is
   *polled*, not when the application consumed it. The engine therefore stops polling the
   core while the bytes it handed the endpoint and the endpoint still holds reach
   ``connection_window``, so the peer stalls on flow control instead of memory growing:
   received, unconsumed bytes per connection stay below ``2 * connection_window`` plus one
   64 KiB event. The bound is per connection, not per stream (polling is one FIFO), and a
   closing or closed core is always drained so termination is never held back.
4. **Send acknowledgements.** The core exposes no per-stream acknowledged offset, only the
   bytes still waiting for their first transmission, the packets in flight and a loss
   counter. The engine keeps, per stream, checkpoints ``(highest packet number, bytes sent)``
   taken after each transmission; a checkpoint counts as acknowledged once no packet up to
   that number is outstanding and no loss was declared since the engine last knew that
   nothing was waiting for retransmission. After a loss (qh3 also declares spurious ones
   under reordering), acknowledgement waits until nothing is in flight, which may be
   noticed on a timer (the endpoint re-examines its sends after timers too). The estimate is
   conservative: a send never completes before its bytes were acknowledged, only later.
   A FIN is tracked the same way (``sends_settled``: a graceful shutdown closes only once
   every FIN was acknowledged), but a FIN-only frame is invisible to the core's send buffer
   size: the FIN counts as transmitted after a flush the congestion window and pacing did not
   hold back (its checkpoint is then that flush's highest packet number), and otherwise only
   once a flush leaves nothing in flight.
5. **Addresses.** The core accepts only IP socket addresses; each connection maps the
   endpoint's opaque ``DatagramAddr`` values to synthetic ones (at most eight per
   connection; datagrams from further addresses are dropped).
6. **Handshake details.** The client offers X25519 only (no hybrid post-quantum key share),
   so its ClientHello fits one Initial datagram as aioquic's does (one Retry per attempt).
   A server whose first datagram the core refuses before any ClientHello (qh3 rejects a
   client Initial without CRYPTO, such as a probe after a lost ClientHello) keeps no state
   and sends nothing. The core runs on its own clock (seconds since the connection's first
   call): absolute POSIX seconds do not survive qh3's float-to-nanosecond conversions, and
   a timer would then fire a hair late, again and again.
7. **Limits.** ``max_streams_bidi`` bidirectional streams (qh3 hard-codes 100), no
   unidirectional stream except the proof stream, no DATAGRAM frames, no path MTU probing,
   two active peer CIDs. The server treats the client address as validated: the endpoint
   answers every unknown client with a Retry first, or disables Retry only where the carrier
   proves source addresses (qh3 2.1 also fails its anti-amplification accounting with a
   single-datagram ClientHello, as aioquic sends, when the address is not validated).

8. **Early stream data.** A client keeps the stream data the endpoint hands it after its
   handshake completed and gives it to the core only once the handshake is *confirmed*
   (HANDSHAKE_DONE), in order. Why: the server acknowledges no 1-RTT packet before it has the
   client's Finished, so data sent earlier stays in flight; and qh3 2.1's core, once such
   data fills the congestion window, sends neither its Handshake-space probes nor even
   acknowledgements (found by the lossy hypothesis test). A lost Finished was then never
   retransmitted and both sides went idle. The cost is one round trip before a new
   connection's first stream bytes leave (the client proof is exempt: the server needs it).
   Kept bytes count as handed over and unacknowledged, so the endpoint's
   ``stream_send_buffer`` bounds them per stream.
9. **Overdue deadlines.** As the aioquic engine does (``chrysalis.quic`` README,
   "Keepalive"), a datagram read at or after the connection's idle deadline (or the end of
   its closing period) fires the core's timers first, which ends the connection, and is
   dropped. Why: a process resumed after ``SIGSTOP`` reads the datagrams queued meanwhile
   before its timers fire; fed first, they revived connections the peer had discarded. The
   idle deadline lives in the Rust core, which tells only its earliest timer and its kind,
   so ``get_timer`` (the endpoint asks after every step that can move a deadline) keeps a
   time before which neither can have passed: the core's deadline when it is the idle or
   closing one, else the later of that deadline and the last datagram's time plus
   ``min(idle_timeout, peer's max_idle_timeout)`` (the idle timer restarts with every
   packet received and never runs shorter, RFC 9000 section 10.1). The receive path adds
   one comparison with it. A datagram read past it, and still that long after the one
   before, fires the core's due timers first (the idle deadline is often behind an ACK or
   loss timer armed before a stop); any other datagram goes in first and the driver fires
   the ACK, loss or pacing timers after it, as before (a late driver must not declare
   losses the datagram refutes). A timer that ends the connection without any close (ours,
   the peer's or a protocol error) is reported as ``IDLE``, whichever timer was due first.

qh3 runs its own congestion controller (``QuicConfig.congestion_control`` is not used). qh3
itself imports ``socket`` and, through its package, ``asyncio``; nothing in this module does
I/O or reads a clock: ``now`` is always an argument.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final, final

from aioquic.quic.connection import QuicConnection as AioquicQuicConnection
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from qh3 import tls as qh3_tls
from qh3._hazmat import Buffer as Qh3Buffer
from qh3._hazmat import QuicConnectionCore
from qh3.quic import events as qh3_events
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError, QuicConnectionState
from qh3.quic.packet import (
    QuicErrorCode,
    QuicProtocolVersion,
    pull_quic_transport_parameters,
    push_quic_transport_parameters,
)
from qh3.quic.tls_bridge import QuicTlsBridge, QuicTlsBridgeError

from chrysalis.core import CID_LEN, DatagramAddr
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._engines.aioquic import AioquicEngine
from chrysalis.quic._engines.base import (
    AUTHENTICATION_FAILED_CODE,
    CidIssued,
    CidRetired,
    EngineConnection,
    EngineEvent,
    EngineStatistics,
    HandshakeCompleted,
    StopSendingReceived,
    StreamDataReceived,
    StreamResetReceived,
    Terminated,
    TerminationKind,
    new_stream_data,
    set_sdr_data,
    set_sdr_fin,
    set_sdr_stream_id,
)
from chrysalis.quic._engines.client_proof import (
    DEFAULT_PROOF_TIMEOUT,
    MAX_SIGNATURE_LENGTH,
    PROOF_STREAM_ID,
    ClientProof,
    ClientProofError,
    ExporterTap,
    ProofBuilder,
    ProofFailure,
    ProofVerifier,
    sign_client_proof,
)
from chrysalis.quic._identity import Identity, IdentityError

__all__ = ["AioquicProvingEngine", "Qh3Connection", "Qh3Engine"]

_CERT_NONE: Final = 0
"""``ssl.CERT_NONE``: qh3 does not verify the peer chain (the endpoint does)."""
_PEER_CID_LIMIT: Final = 2
"""``active_connection_id_limit`` we advertise (the smallest value QUIC allows)."""
_MAX_PATHS: Final = 8
"""Distinct peer addresses one connection maps (further datagrams are dropped)."""
_SYNTHETIC_HOST: Final = "198.18.0.1"
"""Host of the synthetic socket addresses (RFC 2544 benchmarking range, never routed)."""
_MAX_CHECKPOINTS: Final = 64
"""Acknowledgement checkpoints kept per stream (further ones merge into the newest)."""
_FIN_ROOM: Final = 4 * 1500
"""Congestion window a flush must leave free for the engine to count a FIN handed before it
as transmitted (a fuller window may have held the FIN-only frame back)."""
_NOTHING: Final = object()
"""A placeholder that is no ``DatagramAddr`` (the last-path memo before the first datagram)."""
_CORE_HAS_EVENTS: Final = hasattr(QuicConnectionCore, "has_events")
"""The native core tells, as an attribute, whether ``next_event`` has anything (qh3 2.1)."""
_NO_TIMER: Final = float("inf")
"""``_ch_timer_at`` while the core has no timer (or none was asked for yet), and the idle
floor without an idle timeout."""


def _internal(exc: RuntimeError) -> QuicConnectionError:
    return QuicConnectionError(QuicErrorCode.INTERNAL_ERROR, None, str(exc))


@final
class _SendTrack:
    """Send-side bookkeeping of one stream: bytes the endpoint handed over (``written``),
    of which ``early`` still wait in the engine for the handshake's confirmation (not yet in
    the core), the acknowledged estimate, and checkpoints ``(packet number, bytes sent)``
    awaiting acknowledgement; ``fin`` while a FIN handed over is not known acknowledged, and
    ``fin_packet``, once it is known transmitted, the packet number by which it was."""

    __slots__ = ("acked", "checkpoints", "early", "fin", "fin_packet", "written")

    def __init__(self) -> None:
        self.written = 0
        self.early = 0
        self.acked = 0
        self.checkpoints: deque[tuple[int, int]] = deque()
        self.fin = False
        self.fin_packet: int | None = None


class _Qh3TlsBridge(QuicTlsBridge):
    """qh3's TLS bridge with Chrysalis's stream limits and no DATAGRAM support in the
    transport parameters (qh3 hard-codes 100 bidirectional and 103 unidirectional streams).
    The native core is built with the same limits (``Qh3Connection._create_core``)."""

    def __init__(self, *args: Any, streams_bidi: int, streams_uni: int, **kwargs: Any) -> None:
        # Set before qh3's constructor: it serializes the transport parameters.
        self._ch_streams_bidi = streams_bidi
        self._ch_streams_uni = streams_uni
        super().__init__(*args, **kwargs)

    def serialize_transport_parameters(self) -> bytes:
        parameters = pull_quic_transport_parameters(
            Qh3Buffer(data=super().serialize_transport_parameters())
        )
        parameters.initial_max_streams_bidi = self._ch_streams_bidi
        parameters.initial_max_streams_uni = self._ch_streams_uni
        parameters.max_datagram_frame_size = None
        parameters.google_connection_options = None
        buf = Qh3Buffer(capacity=4 * self.configuration.max_datagram_size)
        push_quic_transport_parameters(buf, parameters)
        return buf.data


class Qh3Connection(QuicConnection):
    """qh3 ``QuicConnection`` driving the native core directly; implements
    ``EngineConnection`` (see the module docstring for every deviation from stock qh3).

    Args:
        configuration: the qh3 configuration (``connection_id_length`` 20).
        host_cid: the first host (source) CID.
        max_streams_bidi: bidirectional streams the peer may open.
        initial_dcid: client only: the Initial destination CID.
        original_dcid: server only: the destination CID of the client's first Initial.
        retry_scid: server only: the Retry's source CID when the client answered a Retry.
        proof_builder: client only: builds the proof for a session's exporter value.
        proof_timeout: server only: seconds after the handshake to wait for the proof.
    """

    stream_consumed_noop: Final = True
    """``EngineHints``: the core credits a stream as its events are polled (see the gate)."""

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        host_cid: bytes,
        max_streams_bidi: int,
        initial_dcid: bytes | None = None,
        original_dcid: bytes | None = None,
        retry_scid: bytes | None = None,
        proof_builder: ProofBuilder | None = None,
        proof_timeout: float = DEFAULT_PROOF_TIMEOUT,
    ) -> None:
        super().__init__(
            configuration=configuration,
            original_destination_connection_id=original_dcid,
            retry_source_connection_id=retry_scid,
        )
        self.host_cid = host_cid
        if configuration.is_client:
            if initial_dcid is None:
                raise ValueError("a client connection needs an initial destination CID")
            self._original_destination_connection_id = initial_dcid
        self._ch_streams_bidi = max_streams_bidi
        self._ch_events: deque[EngineEvent] = deque()
        # ``EngineHints``: every translated event waits in ``_ch_events`` (qh3's own
        # ``_events`` is emptied before each public call returns), except those the receive
        # gate holds in the core while ``events_withheld``. The endpoint asks ``next_event``
        # only while either says so (no call finding nothing after each receipt and flush).
        self.event_queue: deque[EngineEvent] = self._ch_events
        self._ch_held = 0  # stream bytes queued in _ch_events
        self._ch_buffered = 0  # stream bytes the endpoint holds unconsumed
        self._ch_window = configuration.max_data
        self.events_withheld = False  # the receive gate holds events in the core
        self._ch_now = 0.0  # the caller's clock, at the latest call
        self._ch_epoch: float | None = None  # the caller's clock at the first call
        self._ch_core_now = 0.0  # the core's clock at the latest call
        self._ch_tap = ExporterTap()
        self._ch_builder = proof_builder
        self._ch_verifier = (
            None if configuration.is_client else ProofVerifier(timeout=proof_timeout)
        )
        self._ch_alpn: str | None = None
        self._ch_chain: list[bytes] = []
        self._ch_proof_failure: ProofFailure | None = None
        self._ch_judged = False
        self._ch_crypto_seen = False
        self._ch_cause: tuple[TerminationKind, int, str] | None = None
        self._ch_idle = False
        self._ch_terminated = False
        self._ch_to_synthetic: dict[DatagramAddr, tuple[str, int]] = {}
        self._ch_from_synthetic: dict[tuple[str, int], DatagramAddr] = {}
        self._ch_tracks: dict[int, _SendTrack] = {}
        self._ch_unacked: dict[int, _SendTrack] = {}
        self._ch_loss_mark = 0
        # Client only, until the handshake is confirmed: stream writes kept out of the core
        # (``_release_early``); None once released (and always on a server).
        self._ch_early: list[tuple[int, bytes, bool]] | None = (
            [] if configuration.is_client else None
        )
        self._ch_outbox: list[tuple[bytes, DatagramAddr]] = []
        # The last path a datagram came from, by identity (carriers hand out one cached
        # address object per sender): no ``DatagramAddr.__hash__`` / ``__eq__`` frames per
        # datagram. The placeholder is no address, so the first datagram takes the lookup.
        self._ch_last_addr: object = _NOTHING
        self._ch_last_synthetic: tuple[str, int] = (_SYNTHETIC_HOST, 0)
        # Kept by ``get_timer`` (caller's clock): neither the idle deadline nor the closing
        # period's end can pass before it; a datagram read at or after it looks further
        # (``_overdue``, module docstring, 9.).
        self._ch_timer_at = _NO_TIMER
        self._ch_heard = 0.0  # the caller's clock at the latest datagram (or at ``start``)
        # The shortest idle timeout the connection can have (the peer's joins at handshake).
        self._ch_idle_floor = configuration.idle_timeout or _NO_TIMER

    # -- qh3 internals replaced -----------------------------------------------------------------

    def _create_core(self, remote_addr: Any, initial_dcid: bytes, now: float) -> None:
        configuration = self._configuration
        is_client = self._is_client
        version = self._version
        assert version is not None  # qh3 sets it before creating a core
        self._core = QuicConnectionCore(
            is_client=is_client,
            version=version,
            local_addr=("0.0.0.0", 0),
            remote_addr=remote_addr,
            source_cid=self.host_cid,
            destination_cid=initial_dcid,
            # A server is reached only after a Retry or over a carrier that proves source
            # addresses (the endpoint's rule), so anti-amplification never applies.
            peer_address_validated=True,
            active_connection_id_limit=_PEER_CID_LIMIT,
            max_datagram_size=configuration.max_datagram_size,
            probe_datagram_size=False,
            idle_timeout=configuration.idle_timeout,
            ack_delay_exponent=3,
            max_datagram_frame_size=None,
            peer_max_datagram_frame_size=None,
            connection_receive_window=configuration.max_data,
            connection_send_limit=0,
            stream_receive_window=configuration.max_stream_data,
            stream_send_limit_bidi_local=0,
            stream_send_limit_bidi_remote=0,
            stream_send_limit_uni=0,
            max_stream_reassembly=configuration.max_stream_data,
            local_max_streams_bidi=self._ch_streams_bidi,
            local_max_streams_uni=0 if is_client else 1,
            peer_max_streams_bidi=0,
            peer_max_streams_uni=0,
            initial_rtt=configuration.initial_rtt,
            max_ack_delay=0.025,
            initial_time=now,
        )
        self._applied_transport_parameters = None
        self._pre_handshake_state_replayed = False

    def _create_tls(self, remote_source_cid: bytes | None) -> QuicTlsBridge:
        bridge = _Qh3TlsBridge(
            self._configuration,
            streams_bidi=self._ch_streams_bidi,
            streams_uni=0 if self._is_client else 1,
            version=self._version,
            local_initial_source_connection_id=self.host_cid,
            remote_initial_source_connection_id=remote_source_cid,
            original_destination_connection_id=self._original_destination_connection_id,
            retry_source_connection_id=self._retry_source_connection_id,
            version_change_handler=self._set_version,
        )
        if self._is_client:
            # One-datagram ClientHello, as aioquic sends: no hybrid post-quantum key share
            # (its 1.2 KB would split the ClientHello over two Initials, each answered with a
            # Retry). Both engines then agree on X25519, whoever the peer is.
            context = bridge.tls
            context._supported_groups = [
                group for group in context._supported_groups if group != qh3_tls.Group.X25519ML768
            ]
        self._tls = bridge
        self._ch_tap = ExporterTap()  # a Retry restarts TLS: capture the new session's secret
        self._ch_tap.install(bridge.tls)
        return bridge

    def _normalize_address(self, addr: Any) -> Any:
        return addr  # always one of our synthetic, well-formed socket addresses

    def _gate_open(self) -> bool:
        if self._ch_held + self._ch_buffered < self._ch_window:
            return True
        core = self._core
        return core is None or core.state != "connected"

    def _drain_core(self) -> None:
        """Translate native events into engine events (qh3's own loop, plus the receive gate,
        the proof stream and termination kinds)."""
        core = self._core
        if core is None:
            return
        out = self._ch_events
        while True:
            if self._ch_held + self._ch_buffered >= self._ch_window and not self._gate_open():
                self.events_withheld = True
                return
            # ``has_events`` (an attribute, no call) ends the loop where a ``next_event``
            # call would only say None: once per receipt and per fired timer.
            if _CORE_HAS_EVENTS and not core.has_events:
                self.events_withheld = False
                return
            native = core.next_event()
            if native is None:
                self.events_withheld = False
                return
            kind = native[0]
            if kind == "stream_data":
                sid: int = native[1]
                if sid & 2:
                    self._uni_data(sid, native[2], native[3])
                    continue
                data: bytes = native[2]
                if sid not in self._ch_tracks:
                    self._ch_tracks[sid] = _SendTrack()
                # Built through its slots: see ``new_stream_data`` (every datagram with data).
                event = new_stream_data(StreamDataReceived)
                set_sdr_stream_id(event, sid)
                set_sdr_data(event, data)
                set_sdr_fin(event, native[3])
                out.append(event)
                self._ch_held += len(data)
            elif kind == "crypto_data":
                self._crypto(native)
            elif kind == "stream_reset":
                sid = native[1]
                if sid & 2:
                    if sid == PROOF_STREAM_ID and self._ch_verifier is not None:
                        self._ch_verifier.abort()
                        self._proof_progress()
                    continue
                if sid not in self._ch_tracks:
                    self._ch_tracks[sid] = _SendTrack()
                out.append(StreamResetReceived(sid, native[2]))
            elif kind == "stop_sending":
                if not native[1] & 2:
                    out.append(StopSendingReceived(native[1], native[2]))
                    self._give_up(native[1])
            elif kind == "stream_finished":
                sid = native[1]
                self._created_local_stream_ids.discard(sid)
                self._ch_tracks.pop(sid, None)
                self._ch_unacked.pop(sid, None)
            elif kind == "handshake_done":
                self._handshake_confirmed = True
                core.handshake_confirmed()
                self._release_early(core)
            elif kind == "connection_id_issued":
                out.append(CidIssued(native[1]))
            elif kind == "connection_id_retired":
                out.append(CidRetired(native[1]))
            elif kind == "peer_closed":
                if self._ch_cause is None:
                    self._ch_cause = (
                        TerminationKind.APPLICATION if native[1] else TerminationKind.TRANSPORT,
                        native[2],
                        native[4].decode("utf8", "replace"),
                    )
            elif kind == "protocol_error":
                if self._ch_cause is None:
                    self._ch_cause = (TerminationKind.TRANSPORT, native[1], str(native[3]))
            elif kind == "connection_terminated":
                self._terminated(native[1], native[2], native[3].decode("utf8", "replace"))
            elif kind == "new_token":
                self._peer_token = native[1]
            # datagram, ping, credit, blocked, path and stream-limit events: not used

    def _crypto(self, native: tuple[Any, ...]) -> None:
        core = self._core
        tls = self._tls
        assert core is not None
        assert tls is not None
        self._ch_crypto_seen = True
        try:
            tls.receive_crypto(qh3_tls.Epoch(native[1]), native[3], native[2], version=core.version)
            self._drain_tls()
        except QuicTlsBridgeError as exc:
            if self._ch_cause is None:
                self._ch_cause = (TerminationKind.TRANSPORT, exc.error_code, exc.reason_phrase)
            try:
                core.close(exc.error_code, int(exc.frame_type), exc.reason_phrase.encode())
            except RuntimeError as error:
                raise _internal(error) from error
            self._close_event = qh3_events.ConnectionTerminated(
                exc.error_code, exc.frame_type, exc.reason_phrase
            )
        self._take_tls_events()

    def _take_tls_events(self) -> None:
        """qh3 queues TLS outcomes (and a version-negotiation failure) in ``_events``."""
        while self._events:
            event = self._events.popleft()
            if isinstance(event, qh3_events.HandshakeCompleted):
                self._handshake(event.alpn_protocol)
            elif isinstance(event, qh3_events.ConnectionTerminated):
                self._terminated(event.error_code, event.frame_type, event.reason_phrase)

    def _terminated(self, code: int, frame_type: int | None, reason: str) -> None:
        if self._ch_terminated:
            return  # the first termination is the last event
        self._ch_terminated = True
        self._state = QuicConnectionState.TERMINATED
        cause = self._ch_cause
        if cause is None and self._ch_idle:
            event = Terminated(TerminationKind.IDLE, None, reason or "Idle timeout")
        elif cause is not None:
            event = Terminated(cause[0], cause[1], cause[2])
        else:
            kind = TerminationKind.APPLICATION if frame_type is None else TerminationKind.TRANSPORT
            event = Terminated(kind, code, reason)
        self._ch_events.append(event)

    # -- the client proof -------------------------------------------------------------------------

    def _handshake(self, alpn: str | None) -> None:
        self._ch_alpn = alpn
        tls = self._tls
        parameters = None if tls is None else tls.remote_transport_parameters
        if parameters is not None and parameters.max_idle_timeout:  # milliseconds
            self._ch_idle_floor = min(self._ch_idle_floor, parameters.max_idle_timeout / 1000.0)
        verifier = self._ch_verifier
        if verifier is None:
            self._send_proof()
            self._ch_events.append(HandshakeCompleted(alpn))
            return
        verifier.start(self._ch_now)
        self._proof_progress()

    def _send_proof(self) -> None:
        tls = self._tls
        parameters = None if tls is None else tls.remote_transport_parameters
        if parameters is None or not parameters.initial_max_streams_uni:
            return  # the server authenticates by TLS (it allows no unidirectional stream)
        builder = self._ch_builder
        exporter = self._ch_tap.exporter()
        if builder is None or exporter is None:
            return  # nothing to prove with: the server times out and refuses
        proof = builder(exporter)
        core = self._core
        if proof is not None and core is not None:
            try:
                core.send_stream(PROOF_STREAM_ID, proof, True)
            except (RuntimeError, ValueError) as exc:
                raise _internal(RuntimeError(f"cannot send the client proof: {exc}")) from exc

    def _uni_data(self, sid: int, data: bytes, fin: bool) -> None:
        verifier = self._ch_verifier
        if sid == PROOF_STREAM_ID and verifier is not None:
            verifier.feed(data, fin)
            self._proof_progress()

    def _proof_progress(self) -> None:
        verifier = self._ch_verifier
        if verifier is None or self._ch_judged or not verifier.started:
            return  # no proof wanted, verdict given, or the handshake is not complete yet
        verifier.judge(self._ch_tap.exporter())
        self._proof_decided()

    def _proof_decided(self) -> None:
        """Report the handshake once the proof has a verdict (exactly once)."""
        verifier = self._ch_verifier
        assert verifier is not None
        outcome = verifier.outcome
        if outcome is None or self._ch_judged:
            return
        self._ch_judged = True
        if isinstance(outcome, ProofFailure):
            self._ch_proof_failure = outcome
            self._ch_chain = []
            self.close(AUTHENTICATION_FAILED_CODE, f"client proof rejected: {outcome.value}")
        else:
            self._ch_chain = list(outcome)
        self._ch_events.append(HandshakeCompleted(self._ch_alpn))

    @property
    def proof_failure(self) -> ProofFailure | None:
        """Server side: why the client's proof was rejected (None: accepted or pending)."""
        return self._ch_proof_failure

    # -- acknowledgement estimate -------------------------------------------------------------

    def _refresh_acks(self, now: float) -> None:
        """After acknowledgements or losses were processed (a receipt or a timer, after each
        of which the endpoint looks at its sends): resolve checkpoints, or settle everything
        once nothing is in flight."""
        core = self._core
        unacked = self._ch_unacked
        if core is None or not unacked:
            return
        if core.loss_total != self._ch_loss_mark:
            for track in unacked.values():
                track.checkpoints.clear()  # some bytes (or the FIN) may need retransmission
                track.fin_packet = None
            if core.bytes_in_flight == 0:
                # Flush now: if the core has nothing to (re)transmit, nothing is pending.
                self._poll_into(self._ch_outbox, now)
                self._settle_if_quiet(core)
            return
        if core.bytes_in_flight == 0:
            # ``_all_acked`` inline (a request/response receipt mostly finds nothing in
            # flight: one frame less on the path).
            untransmitted = False
            for sid, track in list(unacked.items()):
                track.checkpoints.clear()
                track.acked = track.written - track.early - core.get_send_buffer_size(sid)
                if track.fin:
                    if track.fin_packet is None:
                        untransmitted = True
                        continue
                    track.fin = False  # its packet was outstanding: now acknowledged
                if track.acked >= track.written:
                    del unacked[sid]
            if untransmitted:
                # A FIN not known transmitted (rare: a flush held back, or none since the
                # FIN): flush now; if that leaves nothing in flight, it was acknowledged.
                self._poll_into(self._ch_outbox, now)
                self._settle_if_quiet(core)
            return
        outstanding = core.outstanding_application_packets
        # Packet numbers are unique, so the smallest tuple holds the smallest number (no
        # generator: this runs after every receipt).
        low = min(outstanding)[0] if outstanding else 1 << 62
        for sid, track in list(unacked.items()):
            checkpoints = track.checkpoints
            while checkpoints and checkpoints[0][0] < low:
                track.acked = checkpoints.popleft()[1]
            if track.fin:
                fin_packet = track.fin_packet
                if fin_packet is None or fin_packet >= low:
                    continue
                track.fin = False
            if track.acked >= track.written:
                del unacked[sid]

    def _settle_if_quiet(self, core: QuicConnectionCore) -> None:
        """Right after a full transmission: when nothing is in flight and no pacing delay is
        pending, nothing awaits (re)transmission, so every transmitted byte was
        acknowledged; this is also the point from which losses are counted again."""
        if core.bytes_in_flight != 0:
            return
        timer = core.get_timer()
        if timer is not None and timer[0] == "pacing":
            return
        self._ch_loss_mark = core.loss_total
        self._all_acked(core)

    def _after_send(self) -> None:
        """After a full transmission: checkpoint each stream's newly sent bytes (settling
        waits for a receipt or a timer, after which the endpoint looks at its sends)."""
        core = self._core
        unacked = self._ch_unacked
        if core is None or not unacked or core.loss_total != self._ch_loss_mark:
            return
        outstanding = core.outstanding_application_packets
        if not outstanding:
            return
        top = max(outstanding)[0]  # unique packet numbers: the largest tuple's
        # A FIN kept until the handshake's confirmation (``_ch_early``) was not transmitted.
        held: bool | None = None if self._ch_early is None else True
        for sid, track in unacked.items():
            if track.fin and track.fin_packet is None:
                if held is None:
                    timer = core.get_timer()
                    held = (timer is not None and timer[0] == "pacing") or (
                        core.bytes_in_flight + _FIN_ROOM > core.congestion_window
                    )
                if not held:
                    track.fin_packet = top
            sent = track.written - track.early - core.get_send_buffer_size(sid)
            checkpoints = track.checkpoints
            last = checkpoints[-1][1] if checkpoints else track.acked
            if sent > last:
                if len(checkpoints) >= _MAX_CHECKPOINTS:
                    checkpoints[-1] = (top, sent)
                else:
                    checkpoints.append((top, sent))

    def _all_acked(self, core: QuicConnectionCore) -> None:
        """Nothing is in flight and nothing awaits retransmission: every transmitted byte
        was acknowledged."""
        kept = self._ch_early is not None  # a FIN kept there was not even handed to the core
        for sid, track in list(self._ch_unacked.items()):
            track.checkpoints.clear()
            track.acked = track.written - track.early - core.get_send_buffer_size(sid)
            if track.fin and not kept:
                track.fin = False
            if track.acked >= track.written and not track.fin:
                del self._ch_unacked[sid]

    def _give_up(self, stream_id: int) -> None:
        """The stream's send half was reset: nothing of it awaits acknowledgement."""
        self._ch_unacked.pop(stream_id, None)
        track = self._ch_tracks.get(stream_id)
        if track is not None:
            track.fin = False

    # -- addresses ------------------------------------------------------------------------------

    def _synthetic(self, addr: DatagramAddr) -> tuple[str, int] | None:
        synthetic = self._ch_to_synthetic.get(addr)
        if synthetic is None:
            if len(self._ch_to_synthetic) >= _MAX_PATHS:
                return None
            synthetic = (_SYNTHETIC_HOST, len(self._ch_to_synthetic) + 1)
            self._ch_to_synthetic[addr] = synthetic
            self._ch_from_synthetic[synthetic] = addr
        return synthetic

    # -- EngineConnection -----------------------------------------------------------------------

    def _core_time(self, now: float) -> float:
        """The core's clock: seconds since this connection's first call, never decreasing.
        Small values convert exactly to the core's nanosecond durations, so a timer fires
        at the very instant ``get_timer`` named (absolute POSIX seconds would not)."""
        epoch = self._ch_epoch
        if epoch is None:
            epoch = self._ch_epoch = now
        elapsed = now - epoch
        if elapsed < self._ch_core_now:
            return self._ch_core_now
        self._ch_core_now = elapsed
        return elapsed

    def start(self, addr: DatagramAddr, now: float) -> None:
        """Client only: begin the handshake towards ``addr`` (sends nothing yet)."""
        synthetic = self._synthetic(addr)
        assert synthetic is not None
        self._ch_now = self._ch_heard = now
        self.connect(synthetic, self._core_time(now))
        self._take_tls_events()  # keep ``event_queue`` the whole story (``EngineHints``)

    def receive_datagram(self, data: bytes, addr: Any, now: float) -> None:
        if now >= self._ch_timer_at and self._overdue(now):
            # The idle deadline (or the closing period's end) passed before this datagram was
            # read (a process resumed after a stop): the connection ended first and the
            # datagram is dropped (module docstring, 9.).
            return
        if addr is self._ch_last_addr:
            synthetic = self._ch_last_synthetic  # the same sender as last time (every datagram)
        else:
            known = self._ch_to_synthetic.get(addr)
            if known is None:
                known = self._synthetic(addr)
                if known is None:
                    return  # not remembered: an unmapped path stays dropped
            synthetic = self._ch_last_synthetic = known
            self._ch_last_addr = addr
        if not data:
            return
        self._ch_now = self._ch_heard = now
        core = self._core
        epoch = self._ch_epoch
        if epoch is not None and now - epoch >= self._ch_core_now:
            # ``_core_time`` inline: the clock moved on (the usual case).
            elapsed = self._ch_core_now = now - epoch
        else:
            elapsed = self._core_time(now)
        if core is not None and self._handshake_complete and not data[0] & 0x80:
            # Fast path: a short-header datagram holds one packet; version negotiation,
            # Retry, coalescing and CID learning only concern long headers.
            try:
                core.receive_datagram(data, synthetic, elapsed, len(data))
            except RuntimeError as exc:
                raise _internal(exc) from exc
            self._drain_core()
        else:
            first = core is None
            super().receive_datagram(data, synthetic, elapsed)
            self._take_tls_events()
            if first and self._ch_verifier is not None and not self._ch_crypto_seen:
                self._forget_failed_start()
        if self._ch_unacked:
            self._refresh_acks(elapsed)

    def _overdue(self, now: float) -> bool:
        """A datagram read at ``now`` found the deadline ``get_timer`` kept passed: fire the
        core's due timers first when the idle deadline or the closing period's end may have
        passed (module docstring, 9.). True when that ended the connection (the datagram is
        dropped); otherwise the kept deadline is brought up to date."""
        core = self._core
        timer = None if core is None else core.get_timer()
        if timer is None:
            self._ch_timer_at = _NO_TIMER
            return False
        kind = timer[0]
        if kind != "idle" and kind != "close":
            quiet = self._ch_heard + self._ch_idle_floor
            if now < quiet:
                # Datagrams read since ``get_timer`` restarted the idle timer: only an ACK,
                # loss or pacing timer is due, which the driver fires after this datagram.
                self._ch_timer_at = quiet
                return False
        self.handle_timer(now)
        if self._ch_terminated:
            return True
        self.get_timer()
        return False

    def _forget_failed_start(self) -> None:
        """A server's first datagram that the core refused without seeing a ClientHello (qh3
        treats a client's Initial without CRYPTO, such as a probe sent after the ClientHello
        was lost, as a protocol violation) leaves no state and sends no close: the endpoint
        drops the connection silently and the client's retransmitted ClientHello starts a
        new one."""
        core = self._core
        if core is not None and core.local_error is not None:
            self._core = None
            self._tls = None
            self._close_event = None
            self._ch_cause = None
            self._ch_events.clear()
            self._ch_held = 0

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, DatagramAddr]]:
        if self._core is None:
            return []
        if self.events_withheld and self._gate_open():
            self._drain_core()
        core = self._core
        assert core is not None
        out = self._ch_outbox
        if out:
            self._ch_outbox = []
        else:
            out = []
        epoch = self._ch_epoch
        if epoch is not None and now - epoch >= self._ch_core_now:
            # ``_core_time`` inline: the clock moved on (the usual case; every flush).
            elapsed = self._ch_core_now = now - epoch
        else:
            elapsed = self._core_time(now)
        # ``_poll_into`` inline (every flush: one frame less on the path to the socket).
        book = self._ch_from_synthetic
        poll = core.poll_transmit
        while True:
            try:
                transmit = poll(elapsed)
            except RuntimeError as exc:
                raise _internal(exc) from exc
            if transmit is None:
                break
            destination = book.get(transmit[1])
            if destination is not None:
                out.append((transmit[0], destination))
        if self._ch_unacked:
            self._after_send()
        return out

    def _poll_into(self, out: list[tuple[bytes, DatagramAddr]], now: float) -> None:
        core = self._core
        assert core is not None
        book = self._ch_from_synthetic
        poll = core.poll_transmit
        while True:
            try:
                transmit = poll(now)
            except RuntimeError as exc:
                raise _internal(exc) from exc
            if transmit is None:
                return
            destination = book.get(transmit[1])
            if destination is not None:
                out.append((transmit[0], destination))

    def get_timer(self) -> float | None:
        core = self._core
        timer = None if core is None else core.get_timer()
        epoch = self._ch_epoch
        if timer is None or epoch is None:
            at = None
            self._ch_timer_at = _NO_TIMER
        else:
            at = timer[1] + epoch
            kind = timer[0]
            if kind == "idle" or kind == "close":
                self._ch_timer_at = at
            else:
                # An ACK, loss or pacing timer first: the idle deadline is no earlier than the
                # shortest idle timeout after the last datagram (module docstring, 9.).
                quiet = self._ch_heard + self._ch_idle_floor
                self._ch_timer_at = quiet if quiet > at else at
        verifier = self._ch_verifier
        if verifier is None or self._ch_judged:
            return at  # a judged proof has no deadline (no property call per timer query)
        deadline = verifier.deadline
        if deadline is not None and (at is None or deadline < at):
            return deadline
        return at

    def handle_timer(self, now: float) -> None:
        self._ch_now = now
        elapsed = self._core_time(now)
        core = self._core
        epoch = self._ch_epoch
        if core is not None and epoch is not None:
            timer = core.get_timer()
            if timer is not None and timer[1] + epoch <= now:
                # A timer that ends the connection with no close of either side nor protocol
                # error ends it idle, even when another timer (an ACK, a loss) was due first:
                # the core fires every due deadline (after a stop, the idle one is often
                # behind an earlier one; qh3 reports it as error 1, "Idle timeout").
                self._ch_idle = self._ch_cause is None
                # Due by the caller's clock: fire it at its own deadline even if the
                # subtraction above rounded a hair below it.
                if timer[1] > elapsed:
                    elapsed = self._ch_core_now = timer[1]
                try:
                    core.handle_timer(elapsed)
                except RuntimeError as exc:
                    raise _internal(exc) from exc
                self._drain_core()
                if not self._ch_terminated:
                    self._ch_idle = False
        verifier = self._ch_verifier
        if verifier is not None and not self._ch_judged and verifier.expire(now):
            self._proof_decided()
        if self._ch_unacked:
            self._refresh_acks(elapsed)

    def next_event(self) -> EngineEvent | None:  # type: ignore[override]
        if self._events:
            self._take_tls_events()
        events = self._ch_events
        if not events:
            if not (self.events_withheld and self._gate_open()):
                return None
            self._drain_core()
            if not events:
                return None
        event = events.popleft()
        if type(event) is StreamDataReceived:
            self._ch_held -= len(event.data)
        return event

    def open_stream(self, stream_id: int) -> None:
        if stream_id & 2:
            raise ValueError("only bidirectional streams can be opened")
        if stream_id not in self._ch_tracks:
            self._ch_tracks[stream_id] = _SendTrack()

    def send_stream_data(  # type: ignore[override]
        self, stream_id: int, data: bytes | memoryview, end_stream: bool = False
    ) -> None:
        core = self._core
        if core is None or stream_id & 2:
            raise ValueError(f"stream {stream_id} cannot send")
        track = self._ch_tracks.get(stream_id)
        if track is None:
            raise ValueError(f"stream {stream_id} is finished or unknown")
        early = self._ch_early
        if early is not None:
            # Before confirmation (see the module docstring, 8.): kept here, counted as
            # handed over and unacknowledged, so the endpoint's per-stream send buffer
            # bounds it like bytes in the core.
            early.append((stream_id, bytes(data), end_stream))
            track.early += len(data)
        else:
            core.send_stream(stream_id, data, end_stream)  # ValueError / RuntimeError pass up
        if data:
            track.written += len(data)
            self._ch_unacked[stream_id] = track
        if end_stream:
            track.fin = True
            self._ch_unacked[stream_id] = track

    def _release_early(self, core: QuicConnectionCore) -> None:
        """The handshake is confirmed: hand the core the stream writes kept until now, in
        order. A write the core refuses (the peer stopped the stream meanwhile: the endpoint
        abandons that send half on the ``StopSendingReceived`` it gets) drops the stream's
        remaining early writes."""
        early = self._ch_early
        self._ch_early = None
        if not early:
            return
        refused: set[int] = set()
        for stream_id, data, fin in early:
            track = self._ch_tracks.get(stream_id)
            if track is not None:
                track.early -= len(data)
            if stream_id in refused or track is None:
                continue
            try:
                core.send_stream(stream_id, data, fin)
            except (RuntimeError, ValueError):
                refused.add(stream_id)

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        core = self._core
        if core is None:
            raise ValueError("connection not started")
        try:
            core.reset_stream(stream_id, error_code)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from exc
        early = self._ch_early
        if early:  # a reset stream's early writes are never sent
            self._ch_early = [write for write in early if write[0] != stream_id]
            track = self._ch_tracks.get(stream_id)
            if track is not None:
                track.early = 0
        self._give_up(stream_id)

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        core = self._core
        if core is None:
            raise ValueError("connection not started")
        try:
            core.stop_sending(stream_id, error_code)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from exc

    def stream_send_state(self, stream_id: int) -> tuple[int, int] | None:
        track = self._ch_tracks.get(stream_id)
        if track is None:
            return None
        return track.acked, track.written - track.acked

    def sends_settled(self) -> bool:
        return not self._ch_unacked

    def stream_consumed(self, stream_id: int, consumed_through: int) -> None:
        # The core credits per stream as events are polled; the gate is per connection
        # (``stream_consumed_noop``: the endpoint need not call this).
        pass

    def set_buffered(self, nbytes: int) -> None:
        self._ch_buffered = nbytes

    def close(  # type: ignore[override]
        self, error_code: int = 0, reason: str = ""
    ) -> None:
        if self._ch_cause is None and self._close_event is None and self._core is not None:
            self._ch_cause = (TerminationKind.APPLICATION, error_code, reason)
        with contextlib.suppress(QuicConnectionError):  # the core closed: the first close won
            super().close(error_code=error_code, frame_type=None, reason_phrase=reason)

    def peer_certificate_chain(self) -> list[bytes]:
        if self._ch_verifier is not None:
            return list(self._ch_chain)
        tls = self._tls
        if tls is None or tls.peer_certificate is None:
            return []
        return [tls.peer_certificate.public_bytes()] + [
            certificate.public_bytes() for certificate in tls.peer_certificate_chain
        ]

    @property
    def peer_packet_seen(self) -> bool:
        core = self._core
        return core is not None and core.received_authenticated_packet

    @property
    def is_terminated(self) -> bool:
        return self._state is QuicConnectionState.TERMINATED

    def statistics(self) -> EngineStatistics:
        core = self._core
        if core is None:
            return EngineStatistics(0.0, 0, 0, 0)
        return EngineStatistics(
            smoothed_rtt=core.smoothed_rtt or 0.0,
            congestion_window=core.congestion_window,
            bytes_in_flight=core.bytes_in_flight,
            pto_count=core.pto_count,
        )


def _is_ip_literal(name: str) -> bool:
    text = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _default_builder(identity: Identity) -> ProofBuilder:
    chain = [certificate.public_bytes(Encoding.DER) for certificate in identity.chain]
    key = identity.private_key
    try:  # refuse, where the identity is loaded, a chain too large to prove in-band
        ClientProof(tuple(chain), 0, bytes(MAX_SIGNATURE_LENGTH)).encode()
    except ClientProofError as exc:
        raise IdentityError(f"the identity cannot be proven in-band: {exc}") from exc

    def build(exporter: bytes) -> bytes:
        return sign_client_proof(key, chain, exporter).encode()

    return build


@final
class Qh3Engine:
    """Builds ``Qh3Connection`` objects for one endpoint (implements ``QuicEngine``).

    Use it as the endpoint's engine factory: ``QuicEndpoint(..., engine=Qh3Engine)`` (or
    ``functools.partial(Qh3Engine, proof_timeout=2.0)``).

    Args:
        config: the endpoint's QUIC parameters.
        identity: this process's identity; qh3 needs an ECDSA or RSA leaf key.
        proof_timeout: server side: seconds after the handshake within which the client's
            proof must have arrived.
        proof_builder: client side: builds the proof for a session's exporter value (default:
            sign with ``identity``). Tests inject hostile provers here.

    Raises ``IdentityError`` when qh3 cannot use the identity's key.
    """

    __slots__ = ("_builder", "_client", "_config", "_proof_timeout", "_server")

    def __init__(
        self,
        config: QuicConfig,
        identity: Identity,
        *,
        proof_timeout: float = DEFAULT_PROOF_TIMEOUT,
        proof_builder: ProofBuilder | None = None,
    ) -> None:
        if not isinstance(identity.private_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise IdentityError(
                "the qh3 engine needs an ECDSA or RSA leaf key, not "
                f"{type(identity.private_key).__name__}"
            )
        if not proof_timeout > 0.0:
            raise ValueError(f"proof_timeout must be positive, got {proof_timeout}")
        self._config = config
        self._proof_timeout = float(proof_timeout)
        self._builder = _default_builder(identity) if proof_builder is None else proof_builder
        certificates = qh3_tls.load_pem_x509_certificates(identity.chain_pem())
        base = QuicConfiguration(
            alpn_protocols=[config.alpn],
            connection_id_length=CID_LEN,
            idle_timeout=float(config.idle_timeout),
            max_data=config.connection_window,
            max_stream_data=config.stream_window,
            max_datagram_size=config.max_udp_payload,
            probe_datagram_size=False,
            supported_versions=[QuicProtocolVersion.VERSION_1],
            verify_mode=_CERT_NONE,
            active_connection_id_limit=_PEER_CID_LIMIT,
        )
        base.certificate = certificates[0]
        base.certificate_chain = certificates[1:]
        base.private_key = qh3_tls.load_pem_private_key(identity.key_pem())
        self._client = replace(base, is_client=True)
        self._server = replace(base, is_client=False)

    def connect(
        self,
        *,
        host_cid: bytes,
        initial_dcid: bytes,
        addr: DatagramAddr,
        server_name: str | None,
        issue_cid: Callable[[], bytes],
        now: float,
    ) -> Qh3Connection:
        """Create a client connection and start its handshake (see ``QuicEngine``).
        ``issue_cid`` is unused: qh3's core draws further CIDs itself."""
        configuration = self._client
        if server_name is not None and not _is_ip_literal(server_name):
            configuration = replace(configuration, server_name=server_name)
        connection = Qh3Connection(
            configuration=configuration,
            host_cid=host_cid,
            max_streams_bidi=self._config.max_streams_bidi,
            initial_dcid=initial_dcid,
            proof_builder=self._builder,
        )
        connection.start(addr, now)
        return connection

    def accept(
        self,
        *,
        host_cid: bytes,
        original_dcid: bytes,
        retry_scid: bytes | None,
        issue_cid: Callable[[], bytes],
    ) -> Qh3Connection:
        """Create a server connection (see ``QuicEngine``); it asks for the client proof."""
        return Qh3Connection(
            configuration=self._server,
            host_cid=host_cid,
            max_streams_bidi=self._config.max_streams_bidi,
            original_dcid=original_dcid,
            retry_scid=retry_scid,
            proof_timeout=self._proof_timeout,
        )


# --- aioquic clients for qh3 servers -------------------------------------------------------------


@final
class _ProvingAioquicClient:
    """An aioquic client connection that also answers a server's proof request: it captures
    the exporter secret and, when the server allows a unidirectional stream, sends the proof
    on stream 2 as the handshake completes. Every other call passes straight through."""

    __slots__ = ("_builder", "_inner", "_sent", "_tap", "_tls")

    # ``EngineHints``: driven like any aioquic connection (next_event until None).
    event_queue: Final = None
    events_withheld: Final = False
    stream_consumed_noop: Final = False

    def __init__(self, inner: AioquicQuicConnection, builder: ProofBuilder) -> None:
        self._inner = inner
        self._builder = builder
        self._sent = False
        self._tls: object = None
        self._tap = ExporterTap()
        self._follow_tls()

    def _follow_tls(self) -> None:
        # aioquic builds a new TLS context when it answers a Retry: tap the current one.
        # (A Retry arrives alone, so the new context sees no secret before the next call.)
        tls = self._inner.tls
        if tls is not self._tls:
            self._tls = tls
            self._tap = ExporterTap()
            self._tap.install(tls)

    def next_event(self) -> EngineEvent | None:
        event: EngineEvent | None = self._inner.next_event()  # type: ignore[assignment]
        if isinstance(event, HandshakeCompleted) and not self._sent:
            self._sent = True
            exporter = self._tap.exporter()
            if self._inner._remote_max_streams_uni >= 1 and exporter is not None:
                proof = self._builder(exporter)
                if proof is not None:
                    self._inner.send_stream_data(PROOF_STREAM_ID, proof, end_stream=True)
        return event

    def receive_datagram(self, data: bytes, addr: DatagramAddr, now: float) -> None:
        self._inner.receive_datagram(data, addr, now)
        self._follow_tls()

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, DatagramAddr]]:
        return self._inner.datagrams_to_send(now)

    def get_timer(self) -> float | None:
        return self._inner.get_timer()

    def handle_timer(self, now: float) -> None:
        self._inner.handle_timer(now)

    def open_stream(self, stream_id: int) -> None:
        self._engine().open_stream(stream_id)

    def send_stream_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None:
        self._engine().send_stream_data(stream_id, data, end_stream)

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        self._engine().reset_stream(stream_id, error_code)

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        self._engine().stop_stream(stream_id, error_code)

    def stream_send_state(self, stream_id: int) -> tuple[int, int] | None:
        return self._engine().stream_send_state(stream_id)

    def sends_settled(self) -> bool:
        return self._engine().sends_settled()

    def stream_consumed(self, stream_id: int, consumed_through: int) -> None:
        self._engine().stream_consumed(stream_id, consumed_through)

    def set_buffered(self, nbytes: int) -> None:
        self._engine().set_buffered(nbytes)

    def close(self, error_code: int, reason: str) -> None:
        self._engine().close(error_code, reason)

    def send_ping(self, uid: int) -> None:
        self._engine().send_ping(uid)

    def peer_certificate_chain(self) -> list[bytes]:
        return self._engine().peer_certificate_chain()

    @property
    def host_cid(self) -> bytes:
        return self._engine().host_cid

    @property
    def peer_packet_seen(self) -> bool:
        return self._engine().peer_packet_seen

    @property
    def is_terminated(self) -> bool:
        return self._engine().is_terminated

    def statistics(self) -> EngineStatistics:
        return self._engine().statistics()

    def _engine(self) -> EngineConnection:
        return self._inner  # type: ignore[return-value]


@final
class AioquicProvingEngine:
    """The aioquic engine whose *client* connections can authenticate to a qh3 server.

    A qh3 server cannot request a TLS client certificate; it asks for the session-bound
    client proof instead (``_client_proof``). This factory wraps ``AioquicEngine``: server
    connections are unchanged (mutual TLS), client connections send the proof when their
    server asks for it. Use ``QuicEndpoint(..., engine=AioquicProvingEngine)`` for aioquic
    endpoints that dial qh3 endpoints; a plain ``AioquicEngine`` client sends no proof, and a
    qh3 server refuses it after ``proof_timeout`` (authentication failure, close code 1,
    reason "client proof rejected: timeout").
    """

    __slots__ = ("_builder", "_inner")

    def __init__(
        self, config: QuicConfig, identity: Identity, *, proof_builder: ProofBuilder | None = None
    ) -> None:
        self._inner = AioquicEngine(config, identity)
        self._builder = _default_builder(identity) if proof_builder is None else proof_builder

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
        """An aioquic client connection that answers a proof request (see ``QuicEngine``)."""
        inner = self._inner.connect(
            host_cid=host_cid,
            initial_dcid=initial_dcid,
            addr=addr,
            server_name=server_name,
            issue_cid=issue_cid,
            now=now,
        )
        return _ProvingAioquicClient(inner, self._builder)

    def accept(
        self,
        *,
        host_cid: bytes,
        original_dcid: bytes,
        retry_scid: bytes | None,
        issue_cid: Callable[[], bytes],
    ) -> EngineConnection:
        """An unchanged aioquic server connection (it authenticates clients by mutual TLS)."""
        return self._inner.accept(
            host_cid=host_cid,
            original_dcid=original_dcid,
            retry_scid=retry_scid,
            issue_cid=issue_cid,
        )
