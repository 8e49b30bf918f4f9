"""Cheaper hot paths for aioquic's ``QuicConnection``, pinned to aioquic 1.7.2.

Why: a 16-byte request/response costs each side one ``receive_datagram``, one
``datagrams_to_send`` and one ``get_timer``, and aioquic spends most of that in generic code
that serves every state (handshake, migration, path validation, qlog) on every packet. The
overrides here handle the steady state of an established connection with the same state
changes aioquic makes, in fewer Python steps, and hand everything else to aioquic's own code:

* ``_write_application``: aioquic's loop builds packets until one comes out empty, so every
  flush that fits in one packet builds (and discards) a second one, and asks every stream
  again for data it has not got. This copy stops after a packet when nothing is left that a
  further packet could carry (no stream, crypto or datagram data pending, no frame owed);
  otherwise it loops exactly as aioquic does.
* ``datagrams_to_send``: in the established state (handshake confirmed, one validated path,
  no close pending, no preferred address to probe) it skips the handshake epochs and the
  probing-path bookkeeping, which have nothing to do there.
* ``_send_simple`` (tried first by the established-state ``datagrams_to_send``): the
  common flush, at most one 1-RTT packet with an ACK frame and/or one STREAM frame carrying
  all of one stream's pending data, is built as bytes directly (frames joined as byte
  strings, AEAD and header protection called inline) with the sent-packet record, bytes in
  flight, pacer and idle timer updated exactly as aioquic's builder and ``_flush_builder``
  would. Anything else (a frame owed besides ACK and STREAM, a second stream, data for more
  than one packet, an ACK-of-ACK PING, a pending key update, flow control, congestion) is
  left to ``_write_application``, before anything changed.
* ``receive_datagram``: a datagram that is one short-header (1-RTT) packet from the active,
  validated path of a connected connection is opened (header protection, packet number and
  AEAD inlined; a new key phase takes aioquic's decryption) and accounted for inline; its
  ACK, STREAM (in-order data straight to an event), PADDING and PING frames are handled
  without a receive context, which is built only for other frames. Any other datagram (long
  headers, coalesced packets, an unknown address or CID, a qlog trace) takes aioquic's path.
* ``get_timer``: on a validated path the amplification and path-validation terms are known
  to be absent, so only the ACK, loss-detection and pacing terms are computed, in one pass
  over the packet spaces with the probe timeout inlined; the idle timeout, the pacer's
  bucket and rate and the ACK queue's range list are likewise updated without a call per
  step (same arithmetic, same order).
* ``_payload_received``, ``_handle_ack_frame``, ``_flush_builder``: no qlog branches, and no
  per-packet hashing of ``tls.Epoch`` (a plain ``Enum``, whose ``__hash__`` is Python code):
  the frame table's epoch sets become tuples and the 1-RTT crypto pair, packet space and
  crypto stream are looked up once per connection.
* ``FastPacketRecovery`` (the connection's recovery object is switched to it): ACK
  processing without the qlog branch (on the ACK frame's range list, no ``RangeSet``), loss
  detection that skips the bookkeeping when nothing was lost, one scan of the packet spaces
  for the loss-detection time.
* ``FastPacketBuilder``: ``start_frame`` computes the packet's fill level once.

Behaviour is unchanged throughout; in particular the early exit still
consults the pacer as the skipped iteration would have, so timers stay identical (the tests
compare fast and stock runs datagram by datagram, timer by timer, with every 1-RTT packet's
plaintext and the recovery state after every step).

Each override is a copy of the aioquic 1.7.2 method with the steady-state branch made
explicit; the module checks ``aioquic.__version__`` and, on any other version, every override
defers to aioquic unchanged (``SUPPORTED`` is False). A connection can also be built with
the fast paths off (``fast=False``), which the tests use to compare both behaviours.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Final

import aioquic
from aioquic._buffer import Buffer, BufferReadError
from aioquic._crypto import CryptoError
from aioquic.buffer import UINT_VAR_MAX
from aioquic.buffer import size_uint_var as _size_uint_var
from aioquic.quic.congestion.base import K_GRANULARITY
from aioquic.quic.connection import (
    NetworkAddress,
    QuicConnection,
    QuicConnectionError,
    QuicConnectionState,
    QuicNetworkPath,
    QuicReceiveContext,
)
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.events import StreamDataReceived
from aioquic.quic.packet import (
    NON_ACK_ELICITING_FRAME_TYPES,
    NON_IN_FLIGHT_FRAME_TYPES,
    PACKET_FIXED_BIT,
    PACKET_NUMBER_MAX_SIZE,
    PROBING_FRAME_TYPES,
    QuicErrorCode,
    QuicFrameType,
    QuicPacketType,
    QuicStreamFrame,
)
from aioquic.quic.packet_builder import (
    PACKET_NUMBER_SEND_SIZE,
    QuicDeliveryHandler,
    QuicDeliveryState,
    QuicPacketBuilder,
    QuicPacketBuilderStop,
    QuicSentPacket,
)
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import (
    K_MICRO_SECOND,
    K_PACKET_THRESHOLD,
    K_SECOND,
    K_TIME_THRESHOLD,
    MAX_ACK_RANGES,
    QuicPacketPacer,
    QuicPacketRecovery,
    QuicPacketSpace,
)
from aioquic.quic.stream import (
    FinalSizeError,
    QuicStream,
    QuicStreamSender,
    StreamFinishedError,
)
from cryptography.exceptions import InvalidTag

from chrysalis.quic._engines._aioquic_tls import tls

__all__ = ["SUPPORTED", "FastPacketBuilder", "FastPacketRecovery", "FastQuicConnection"]

PINNED_VERSION: Final = "1.7.2"
"""The aioquic release whose method bodies the overrides copy."""
SUPPORTED: Final = aioquic.__version__ == PINNED_VERSION
"""True when the installed aioquic is the pinned one (otherwise aioquic's code runs)."""

_CONNECTED: Final = QuicConnectionState.CONNECTED
_ONE_RTT: Final = tls.Epoch.ONE_RTT
_ZERO_RTT: Final = tls.Epoch.ZERO_RTT
_ONE_RTT_PACKET: Final = QuicPacketType.ONE_RTT
_ZERO_RTT_PACKET: Final = QuicPacketType.ZERO_RTT
_HANDSHAKE: Final = tls.Epoch.HANDSHAKE
_INITIAL: Final = tls.Epoch.INITIAL
_ACKED: Final = QuicDeliveryState.ACKED
_CRYPTO_FRAME: Final = int(QuicFrameType.CRYPTO)
_ACK_ECN_FRAME: Final = int(QuicFrameType.ACK_ECN)
_NON_ACK_ELICITING: Final = frozenset(int(t) for t in NON_ACK_ELICITING_FRAME_TYPES)
_PROBING: Final = frozenset(int(t) for t in PROBING_FRAME_TYPES)
_NON_IN_FLIGHT: Final = frozenset(int(t) for t in NON_IN_FLIGHT_FRAME_TYPES)
_PATH_FRAMES: Final = (int(QuicFrameType.PATH_CHALLENGE), int(QuicFrameType.PATH_RESPONSE))
_MIN_FIRST_FRAME: Final = PACKET_NUMBER_MAX_SIZE - PACKET_NUMBER_SEND_SIZE
_NO_ARGS: Final[tuple[Any, ...]] = ()
_SHORT_HEADER_BITS: Final = PACKET_FIXED_BIT | (PACKET_NUMBER_SEND_SIZE - 1)
_ACK_FRAME: Final = int(QuicFrameType.ACK)
_STREAM_LEN_FRAME: Final = int(QuicFrameType.STREAM_BASE) | 2
_new_object: Final = object.__new__
_BYTE: Final = tuple(bytes((value,)) for value in range(256))
"""Each byte value as a one-byte string (for v < 64 also the varint encoding of v)."""


def _varint(value: int) -> bytes:
    """``Buffer.push_uint_var``'s encoding of ``value`` (RFC 9000 section 16)."""
    if value < 0:
        raise ValueError("Integer is negative")
    if value < 0x40:
        return _BYTE[value]
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x40000000:
        return (value | 0x80000000).to_bytes(4, "big")
    if value <= UINT_VAR_MAX:
        return (value | 0xC000000000000000).to_bytes(8, "big")
    raise ValueError("Integer is too big for a variable-length integer")


def _frame_handler(
    handlers: dict[int, tuple[Any, tuple[tls.Epoch, ...]]], frame_type: int, epoch: tls.Epoch
) -> Any:
    """The handler of ``frame_type`` in a packet of ``epoch`` (aioquic 1.7.2's checks: an
    unknown type is a FRAME_ENCODING_ERROR, a type the epoch does not allow a
    PROTOCOL_VIOLATION)."""
    entry = handlers.get(frame_type)
    if entry is None:
        raise QuicConnectionError(
            error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
            frame_type=frame_type,
            reason_phrase="Unknown frame type",
        )
    frame_handler, frame_epochs = entry
    if epoch not in frame_epochs:
        raise QuicConnectionError(
            error_code=QuicErrorCode.PROTOCOL_VIOLATION,
            frame_type=frame_type,
            reason_phrase="Unexpected frame type",
        )
    return frame_handler


def _sender_idle(sender: QuicStreamSender) -> bool:
    """True when ``sender`` has nothing left to send (no pending range, no pending FIN).

    Marks it empty as aioquic's ``get_frame`` would on its next call, so later flushes skip it.
    """
    if sender._pending_eof or len(sender._pending):
        return False
    sender.buffer_is_empty = True
    return True


def _update_pacing_rate(
    pacer: QuicPacketPacer, congestion_window: int, smoothed_rtt: float
) -> None:
    """aioquic 1.7.2's ``QuicPacketPacer.update_rate`` with its min/max as comparisons."""
    pacing_rate = congestion_window / (
        smoothed_rtt if smoothed_rtt >= K_MICRO_SECOND else K_MICRO_SECOND
    )
    max_datagram_size = pacer._max_datagram_size
    packet_time = max_datagram_size / pacing_rate
    if packet_time > K_SECOND:
        packet_time = K_SECOND
    pacer.packet_time = packet_time if packet_time > K_MICRO_SECOND else K_MICRO_SECOND
    burst = congestion_window // 4
    if burst > 16 * max_datagram_size:
        burst = 16 * max_datagram_size
    if burst < 2 * max_datagram_size:
        burst = 2 * max_datagram_size
    pacer.bucket_max = burst / pacing_rate
    if pacer.bucket_time > pacer.bucket_max:
        pacer.bucket_time = pacer.bucket_max


def _pacing_blocked(pacer: QuicPacketPacer, now: float) -> float | None:
    """aioquic 1.7.2's ``QuicPacketPacer.next_send_time`` (``update_bucket`` inlined)."""
    packet_time = pacer.packet_time
    if packet_time is None:
        return None
    evaluation_time = pacer.evaluation_time
    if now > evaluation_time:
        bucket_time = pacer.bucket_time + (now - evaluation_time)
        pacer.bucket_time = bucket_time if bucket_time <= pacer.bucket_max else pacer.bucket_max
        pacer.evaluation_time = now
    if pacer.bucket_time <= 0:
        return now + packet_time
    return None


def _on_stream_delivery(
    delivery: QuicDeliveryState, sender: QuicStreamSender, start: int, stop: int, fin: bool
) -> None:
    """``sender.on_data_delivery`` for the packets ``_send_simple`` writes.

    The common case (data without FIN acknowledged in order, nothing acknowledged out of
    order before) moves the buffer start directly, as aioquic's range bookkeeping would
    (add the range, find it first and contiguous, shift it off); anything else is aioquic's.
    """
    if (
        delivery is _ACKED
        and not fin
        and stop > start
        and start == sender._buffer_start
        and sender._reset_error_code is None
        and not sender._acked._RangeSet__ranges  # type: ignore[attr-defined]
    ):
        sender._buffer_start = stop
        del sender._buffer[: stop - start]
        if stop == sender._buffer_fin and sender._acked_fin:
            sender.is_finished = True
        return
    sender.on_data_delivery(delivery, start, stop, fin)


class FastQuicConnection(QuicConnection):
    """``QuicConnection`` with the steady-state fast paths described in the module docstring.

    ``_chrysalis_fast`` (set by the subclass constructor through ``_enable_fast_paths``)
    selects them; it is False on an unpinned aioquic whatever was asked.
    """

    _chrysalis_fast: bool = False
    _stream_limits_on_change_only: bool = False
    """A subclass sets this when its ``_write_stream_limits`` writes a frame only for a
    stream whose ``max_stream_data_local_sent`` differs from ``max_stream_data_local`` (and
    changes nothing otherwise): the flush then calls it only for those streams."""
    _fast_space: QuicPacketSpace | None = None
    _fast_crypto: CryptoPair | None = None
    _fast_crypto_stream: QuicStream | None = None
    _fast_zero_rtt: CryptoPair | None = None
    _fast_frames: dict[int, tuple[Any, tuple[tls.Epoch, ...]]]

    def _enable_fast_paths(self, fast: bool) -> None:
        """Call right after ``QuicConnection.__init__``, before anything was sent."""
        self._chrysalis_fast = fast and SUPPORTED
        if not self._chrysalis_fast:
            return
        # The frame dispatch table with each frame's epochs as a tuple: membership in
        # aioquic's frozensets hashes a plain Enum (a Python-level __hash__) per frame.
        table: dict[int, tuple[Any, Any]] = self.__dict__["_QuicConnection__frame_handlers"]
        self._fast_frames = {
            frame_type: (handler, tuple(epochs)) for frame_type, (handler, epochs) in table.items()
        }
        # Same state, cheaper ACK handling and loss detection (see FastPacketRecovery).
        self._loss.__class__ = FastPacketRecovery
        self._cache_one_rtt()

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if self._chrysalis_fast:
            self._cache_one_rtt()

    def _cache_one_rtt(self) -> None:
        # ``_initialize`` creates the epoch dictionaries; their 1-RTT entries are never
        # replaced afterwards (only the INITIAL crypto pair is, on version negotiation).
        self._fast_space = self._spaces.get(_ONE_RTT)
        self._fast_crypto = self._cryptos.get(_ONE_RTT)
        self._fast_crypto_stream = self._crypto_streams.get(_ONE_RTT)
        self._fast_zero_rtt = self._cryptos.get(_ZERO_RTT)

    # -- send ---------------------------------------------------------------------------------

    def _established(self) -> bool:
        """The steady state the fast paths cover (everything else runs aioquic's code)."""
        return (
            self._chrysalis_fast
            and self._state is _CONNECTED
            and self._handshake_confirmed
            and not self._close_pending
            and self._quic_logger is None
            and len(self._network_paths) == 1
            and self._network_paths[0].is_validated
            and self._remote_preferred_address is None
        )

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, NetworkAddress]]:
        if not self._established():
            return super().datagrams_to_send(now)
        # aioquic 1.7.2's datagrams_to_send, for the established state: no close pending, the
        # handshake confirmed (no INITIAL or HANDSHAKE epoch to write, no stranded handshake
        # data), one validated path (no amplification limit, no probing path), and no
        # preferred address to probe.
        network_path = self._network_paths[0]
        simple = self._send_simple(network_path, now)
        if simple is not None:
            return simple
        builder = FastPacketBuilder(
            host_cid=self.host_cid,
            is_client=self._is_client,
            max_datagram_size=self._max_datagram_size,
            packet_number=self._packet_number,
            peer_cid=self._peer_cid.cid,
            peer_token=self._peer_token,
            quic_logger=None,
            spin_bit=self._spin_bit,
            version=self._version,  # type: ignore[arg-type]  # set once connected
        )
        self._pacing_at = None
        loss = self._loss
        builder.max_flight_bytes = loss.congestion_window - loss.bytes_in_flight
        if self._probe_pending and builder.max_flight_bytes < self._max_datagram_size:
            builder.max_flight_bytes = self._max_datagram_size
        try:  # noqa: SIM105 (contextlib.suppress costs a context manager per flush)
            self._write_application(builder, network_path, now)
        except QuicPacketBuilderStop:
            pass
        return self._flush_builder(
            builder=builder, network_path=network_path, peer_cid=self._peer_cid.cid, now=now
        )

    def _fast_idle_timeout(self) -> float:
        """aioquic 1.7.2's ``_idle_timeout`` with ``get_probe_timeout`` inlined (one call
        instead of three per packet; the same arithmetic in the same order)."""
        idle_timeout = self._configuration.idle_timeout
        remote = self._remote_max_idle_timeout
        if remote is not None and remote < idle_timeout:
            idle_timeout = remote
        loss = self._loss
        if loss._rtt_initialized:
            variance = 4 * loss._rtt_variance
            pto = loss._rtt_smoothed + (variance if variance >= K_GRANULARITY else K_GRANULARITY)
            pto += loss.max_ack_delay
        else:
            pto = 2 * loss._rtt_initial
        pto *= 3
        return idle_timeout if idle_timeout >= pto else pto

    def _connection_limits_pending(self) -> bool:
        """True unless ``_write_connection_limits`` is known to write nothing now.

        The direct writer (``_send_simple``) covers only flushes in which no MAX_DATA or
        MAX_STREAMS frame is owed; a subclass that knows its override's rule answers here
        without changing anything. This default keeps every flush on the generic path."""
        return True

    def _send_simple(
        self, network_path: QuicNetworkPath, now: float
    ) -> list[tuple[bytes, NetworkAddress]] | None:
        """The common established-state flush, built directly: at most one 1-RTT packet
        holding an ACK frame and/or one STREAM frame that carries all of one stream's
        pending data. Returns the datagrams, or None (having changed nothing) when the
        flush needs anything else, which ``_write_application`` then builds.

        Every state change is the one aioquic 1.7.2's ``_write_application``,
        ``QuicPacketBuilder`` and ``_flush_builder`` make for such a packet (in particular
        the sent-packet record, bytes in flight, the pacer and the idle timer); the bytes
        on the wire are identical too.
        """
        crypto = self._fast_crypto
        space = self._fast_space
        if crypto is None or space is None or crypto._update_key_requested:
            return None
        send = crypto.send
        aead = send.aead
        if (
            aead is None
            or self._handshake_done_pending
            or network_path.remote_challenges
            or self._retire_connection_ids
            or self._streams_blocked_pending
            or self._ping_pending
            or self._probe_pending
            or self._datagrams_pending
            or not self._stream_limits_on_change_only
        ):
            return None
        for connection_id in self._host_cids:
            if not connection_id.was_sent:
                return None
        crypto_stream = self._fast_crypto_stream
        if crypto_stream is not None:
            crypto_sender = crypto_stream.sender
            if (
                not crypto_sender.buffer_is_empty
                or crypto_sender._pending_eof
                or crypto_sender._pending._RangeSet__ranges  # type: ignore[attr-defined]
            ):
                return None
        for stream in self._streams.values():
            if stream.max_stream_data_local_sent != stream.max_stream_data_local:
                return None
        # At most one stream with something to send; none that stock would discard,
        # stop or reset in this flush.
        candidate: QuicStream | None = None
        for stream in self._streams_queue:
            sender = stream.sender
            receiver = stream.receiver
            if (
                (receiver.is_finished and sender.is_finished)
                or receiver.stop_pending
                or sender.reset_pending
            ):
                return None
            if sender.buffer_is_empty or stream.is_blocked:
                continue
            if candidate is not None:
                return None
            candidate = stream
        if self._connection_limits_pending():
            return None

        ack_at = space.ack_at
        need_ack = ack_at is not None and ack_at <= now
        packet_number = self._packet_number
        peer_cid = self._peer_cid.cid
        # The frames are assembled as byte strings (a few joins cost less than a Buffer
        # method call per field); _BYTE[v] is v < 64 as a one-byte varint.
        first_byte = _SHORT_HEADER_BITS | (self._spin_bit << 5) | (crypto.recv.key_phase << 2)
        header_size = 3 + len(peer_cid)
        max_datagram_size = self._max_datagram_size
        parts: list[bytes] = []
        if need_ack:
            ack_ranges = space.ack_queue._RangeSet__ranges  # type: ignore[attr-defined]
            ranges = len(ack_ranges)
            # aioquic adds a PING to trigger an ACK of this ACK; that takes the generic
            # path. So does an ACK whose ranges might not all fit (never with <= 64), and
            # an empty queue (whatever aioquic then does, it does it there).
            if (
                not ranges
                or (ranges > 1 and packet_number % 8 == 0)
                or 16 * (ranges + 1) > max_datagram_size - header_size - 1 - crypto.aead_tag_size
            ):
                return None
            assert space.largest_received_time is not None  # set with ack_at
            delay = int((now - space.largest_received_time) * 1000000) >> (
                self._local_ack_delay_exponent
            )
            r = ack_ranges[-1]
            largest = r.stop - 1
            first_length = largest - r.start
            # Packet numbers and ACK delays pass 63 within the first round trips: their
            # two-byte varints are inline too (no ``_varint`` frame per packet).
            parts = [
                _BYTE[_ACK_FRAME],
                _BYTE[largest]
                if largest < 64
                else (largest | 0x4000).to_bytes(2, "big")
                if largest < 0x4000
                else _varint(largest),
                _BYTE[delay]
                if 0 <= delay < 64
                else (delay | 0x4000).to_bytes(2, "big")
                if 0 <= delay < 0x4000
                else _varint(delay),
                _BYTE[ranges - 1] if ranges <= 64 else _varint(ranges - 1),
                _BYTE[first_length] if first_length < 64 else _varint(first_length),
            ]
            start = r.start
            for index in range(ranges - 2, -1, -1):
                r = ack_ranges[index]
                parts.append(_varint(start - r.stop - 1))
                parts.append(_varint(r.stop - r.start - 1))
                start = r.start

        loss = self._loss
        cc = loss._cc
        if candidate is not None:
            sender = candidate.sender
            pending = sender._pending._RangeSet__ranges  # type: ignore[attr-defined]
            if len(pending) > 1:
                return None  # more than one packet's worth (retransmitted holes)
            next_offset = pending[0].start if pending else sender._buffer_stop
            stream_id: int = candidate.stream_id  # type: ignore[assignment]
            overhead = 3 + (
                1 if stream_id <= 0x3F else 2 if stream_id <= 0x3FFF else _size_uint_var(stream_id)
            )
            if next_offset:
                overhead += (
                    1
                    if next_offset <= 0x3F
                    else 2
                    if next_offset <= 0x3FFF
                    else _size_uint_var(next_offset)
                )
            flight_capacity = cc.congestion_window - cc.bytes_in_flight
            if flight_capacity > max_datagram_size:
                flight_capacity = max_datagram_size
            position = header_size
            for part in parts:
                position += len(part)
            max_size = flight_capacity - position - crypto.aead_tag_size - overhead
            if max_size < 0:
                return None
            fin = False
            if pending:
                start, stop = pending[0].start, pending[0].stop
                # stop must not pass min(connection credit, stream credit)
                connection_limit = (
                    sender.highest_offset + self._remote_max_data - self._remote_max_data_used
                )
                if (
                    stop - start > max_size
                    or stop > connection_limit
                    or stop > candidate.max_stream_data_remote
                    or stop - start >= 0x4000
                ):
                    return None  # does not all fit: more than one packet, or blocked
                if sender._buffer_fin == stop:
                    fin = True
                elif sender._pending_eof:
                    return None  # a FIN left for a later packet
                base = sender._buffer_start
                data = bytes(sender._buffer[start - base : stop - base])
            elif sender._pending_eof:
                assert sender._buffer_fin is not None  # a FIN is pending
                start = stop = sender._buffer_fin
                fin = True
                data = b""
            else:
                return None  # not marked empty yet: let aioquic's get_frame do that
            frame_type = _STREAM_LEN_FRAME
            if start:
                frame_type |= 4
            if fin:
                frame_type |= 1
            parts.append(_BYTE[frame_type])
            parts.append(_BYTE[stream_id] if stream_id < 64 else _varint(stream_id))
            if start:  # (a long-lived stream's offset: two-byte varint inline up to 16 KiB)
                parts.append(
                    _BYTE[start]
                    if start < 64
                    else (start | 0x4000).to_bytes(2, "big")
                    if start < 0x4000
                    else _varint(start)
                )
            parts.append((len(data) | 0x4000).to_bytes(2, "big"))
            parts.append(data)
        elif not need_ack:
            # Nothing to send: aioquic starts a packet, finds it empty and stops, having
            # consulted the pacer (ack_at is None or later than now here).
            self._pacing_at = _pacing_blocked(loss._pacer, now)
            return []

        # Pacing, as at the top of aioquic's loop (an ACK due now is sent regardless).
        pacer = loss._pacer
        if not need_ack or ack_at == now:
            pacing_at = self._pacing_at = _pacing_blocked(pacer, now)
            if pacing_at is not None:
                return []

        # -- commit: from here on, exactly aioquic's state changes ------------------------
        handlers: list[tuple[QuicDeliveryHandler, Any]] = []
        if need_ack:
            handlers.append((self._on_ack_delivery, (space, space.largest_received_packet)))
            space.ack_at = None
        if candidate is not None:
            sender = candidate.sender
            previous_highest = sender.highest_offset
            if data:
                del pending[0]
                if stop > previous_highest:
                    sender.highest_offset = stop
            if fin:
                sender._pending_eof = False
            handlers.append((_on_stream_delivery, (sender, start, stop, fin)))
            used = sender.highest_offset - previous_highest
            self._remote_max_data_used += used
            if used > 0:
                queue = self._streams_queue
                if queue[-1] is not candidate:
                    queue.remove(candidate)
                    queue.append(candidate)
            # what _nothing_left's _sender_idle does after the packet
            sender.buffer_is_empty = True
        # pacer.update_after_send(now), then next_send_time(now) as the loop's exit does
        packet_time = pacer.packet_time
        if packet_time is None:
            self._pacing_at = None
        else:
            evaluation_time = pacer.evaluation_time
            if now > evaluation_time:
                bucket_time = pacer.bucket_time + (now - evaluation_time)
                if bucket_time > pacer.bucket_max:
                    bucket_time = pacer.bucket_max
                pacer.evaluation_time = now
            else:
                bucket_time = pacer.bucket_time
            if bucket_time < packet_time:
                bucket_time = 0.0
            else:
                bucket_time -= packet_time
            pacer.bucket_time = bucket_time
            self._pacing_at = now + packet_time if bucket_time <= 0 else None

        # Seal the packet as QuicPacketBuilder._end_packet does (payload >= 4 bytes: no
        # padding), header protection inlined from aioquic's HeaderProtection.apply.
        pn_bytes = (packet_number & 0xFFFF).to_bytes(2, "big")
        plain_header = b"".join((_BYTE[first_byte], peer_cid, pn_bytes))
        protected = aead._aead.encrypt(
            (aead._iv ^ packet_number).to_bytes(12, "big"), b"".join(parts), plain_header
        )
        hp = send.hp
        assert hp is not None
        sample = protected[2:18]  # PACKET_NUMBER_MAX_SIZE - PACKET_NUMBER_SEND_SIZE
        mask = hp._mask(sample) if hp._is_chacha20 else hp._encryptor.update(sample)
        datagram = b"".join(
            (
                _BYTE[first_byte ^ (mask[0] & 0x1F)],
                peer_cid,
                ((packet_number & 0xFFFF) ^ ((mask[1] << 8) | mask[2])).to_bytes(2, "big"),
                protected,
            )
        )
        sent_bytes = len(datagram)

        # The sent-packet record, fields in QuicSentPacket's order.
        eliciting = candidate is not None
        packet = _new_object(QuicSentPacket)
        packet.epoch = _ONE_RTT
        packet.in_flight = eliciting
        packet.is_ack_eliciting = eliciting
        packet.is_crypto_packet = False
        packet.packet_number = packet_number
        packet.packet_type = _ONE_RTT_PACKET
        packet.sent_time = now
        packet.sent_bytes = sent_bytes
        packet.delivery_handlers = handlers
        packet.quic_logger_frames = []

        # _flush_builder and QuicPacketRecovery.on_packet_sent.
        self._packet_number = packet_number + 1
        space.sent_packets[packet_number] = packet
        if eliciting:
            space.ack_eliciting_in_flight += 1
            if loss.handshake_confirmed or not space.is_application_data:
                loss._time_of_last_sent_ack_eliciting_packet = now
            cc.on_packet_sent(packet=packet)
            if not self._ack_eliciting_sent_since_receipt:
                self._close_at = now + self._fast_idle_timeout()
                self._ack_eliciting_sent_since_receipt = True
        network_path.bytes_sent += sent_bytes
        return [(datagram, network_path.addr)]

    def _write_application(
        self, builder: QuicPacketBuilder, network_path: QuicNetworkPath, now: float
    ) -> None:
        if not self._chrysalis_fast:
            super()._write_application(builder, network_path, now)
            return
        # aioquic 1.7.2's _write_application; the one change is the "nothing left" exit at
        # the end of the loop (marked below).
        cryptos = self._cryptos
        crypto_stream: QuicStream | None = None
        one_rtt = self._fast_crypto
        if one_rtt is None:
            one_rtt = cryptos[_ONE_RTT]
        if one_rtt.send.is_valid():
            crypto = one_rtt
            crypto_stream = self._fast_crypto_stream
            if crypto_stream is None:
                crypto_stream = self._crypto_streams[_ONE_RTT]
            packet_type = _ONE_RTT_PACKET
        elif cryptos[_ZERO_RTT].send.is_valid():
            crypto = cryptos[_ZERO_RTT]
            packet_type = _ZERO_RTT_PACKET
        else:
            return
        space = self._fast_space
        if space is None:
            space = self._spaces[_ONE_RTT]
        pacer = self._loss._pacer

        while True:
            # apply pacing, except if we have ACKs to send
            if space.ack_at is None or space.ack_at >= now:
                self._pacing_at = pacer.next_send_time(now=now)
                if self._pacing_at is not None:
                    break
            builder.start_packet(packet_type, crypto)

            # ACK, which a server sends for 0-RTT packets before the handshake
            # completes (RFC 9000 section 13.2.1), but not in 0-RTT packets.
            if packet_type is _ONE_RTT_PACKET and space.ack_at is not None and space.ack_at <= now:
                self._write_ack_frame(builder=builder, space=space, now=now)

            if self._handshake_complete:
                # PATH_CHALLENGE, while the active path is not validated.
                if not (network_path.is_validated or network_path.local_challenge_sent):
                    self._write_path_challenge_frame(builder=builder, network_path=network_path)
                    if network_path.validation_deadline is None:
                        network_path.validation_deadline = now + 3 * max(
                            self._loss.get_probe_timeout(),
                            2 * self._configuration.initial_rtt,
                        )

                # HANDSHAKE_DONE
                if self._handshake_done_pending:
                    self._write_handshake_done_frame(builder=builder)
                    self._handshake_done_pending = False

                # PATH RESPONSE
                while len(network_path.remote_challenges) > 0:
                    self._write_path_response_frame(
                        builder=builder, challenge=network_path.remote_challenges[0]
                    )
                    network_path.remote_challenges.popleft()

                # NEW_CONNECTION_ID
                for connection_id in self._host_cids:
                    if not connection_id.was_sent:
                        self._write_new_connection_id_frame(
                            builder=builder, connection_id=connection_id
                        )

                # RETIRE_CONNECTION_ID (the copy only when there is something to copy)
                for sequence_number in (
                    self._retire_connection_ids[:] if self._retire_connection_ids else ()
                ):
                    self._write_retire_connection_id_frame(
                        builder=builder, sequence_number=sequence_number
                    )
                    self._retire_connection_ids.pop(0)

                # STREAMS_BLOCKED
                if self._streams_blocked_pending:
                    if self._streams_blocked_bidi:
                        self._write_streams_blocked_frame(
                            builder=builder,
                            frame_type=QuicFrameType.STREAMS_BLOCKED_BIDI,
                            limit=self._remote_max_streams_bidi,
                        )
                    if self._streams_blocked_uni:
                        self._write_streams_blocked_frame(
                            builder=builder,
                            frame_type=QuicFrameType.STREAMS_BLOCKED_UNI,
                            limit=self._remote_max_streams_uni,
                        )
                    self._streams_blocked_pending = False

                # MAX_DATA and MAX_STREAMS
                self._write_connection_limits(builder=builder, space=space)

            # stream-level limits
            if self._stream_limits_on_change_only:
                for stream in self._streams.values():
                    if stream.max_stream_data_local_sent != stream.max_stream_data_local:
                        self._write_stream_limits(builder=builder, space=space, stream=stream)
            else:
                for stream in self._streams.values():
                    self._write_stream_limits(builder=builder, space=space, stream=stream)

            # PING (user-request)
            if self._ping_pending:
                self._write_ping_frame(builder, self._ping_pending)
                self._ping_pending.clear()

            # PING (probe)
            if self._probe_pending:
                self._write_ping_frame(builder, comment="probe")
                self._probe_pending = False

            # CRYPTO
            if crypto_stream is not None and not crypto_stream.sender.buffer_is_empty:
                self._write_crypto_frame(builder=builder, space=space, stream=crypto_stream)

            # DATAGRAM
            while self._datagrams_pending:
                try:
                    self._write_datagram_frame(
                        builder=builder,
                        data=self._datagrams_pending[0],
                        frame_type=QuicFrameType.DATAGRAM_WITH_LENGTH,
                    )
                    self._datagrams_pending.popleft()
                except QuicPacketBuilderStop:
                    break

            sent: set[QuicStream] = set()
            discarded: set[QuicStream] = set()
            try:
                for stream in self._streams_queue:
                    # if the stream is finished, discard it
                    if stream.is_finished:
                        self._streams.pop(stream.stream_id)  # type: ignore[arg-type]
                        if self._stream_is_peer_initiated(stream):
                            # Let the peer open a new stream for each one that
                            # closes (RFC 9000 section 4.6).
                            self._stream_limit(stream.stream_id).value += 1  # type: ignore[arg-type]
                        discarded.add(stream)
                        continue

                    if stream.receiver.stop_pending:
                        # STOP_SENDING
                        self._write_stop_sending_frame(builder=builder, stream=stream)

                    if stream.sender.reset_pending:
                        # RESET_STREAM
                        self._write_reset_stream_frame(builder=builder, stream=stream)
                    elif not stream.is_blocked and not stream.sender.buffer_is_empty:
                        # STREAM
                        used = self._write_stream_frame(
                            builder=builder,
                            space=space,
                            stream=stream,
                            max_offset=min(
                                stream.sender.highest_offset
                                + self._remote_max_data
                                - self._remote_max_data_used,
                                stream.max_stream_data_remote,
                            ),
                        )
                        self._remote_max_data_used += used
                        if used > 0:
                            sent.add(stream)

            finally:
                # Make a new stream service order, putting served ones at the end.
                if sent or discarded:
                    self._streams_queue = [
                        stream
                        for stream in self._streams_queue
                        if not (stream in discarded or stream in sent)
                    ]
                    self._streams_queue.extend(sent)

            if builder.packet_is_empty:
                # Discarded streams may let the peer open new ones, which the next
                # packet announces with MAX_STREAMS.
                if not discarded:
                    break
            else:
                pacer.update_after_send(now=now)
                # Chrysalis: stop when the next packet could carry nothing. Every frame
                # above that was owed has been written (or the builder stopped us with an
                # exception), so only data left behind by a full packet could go next.
                if not discarded and self._nothing_left(crypto_stream):
                    # The skipped iteration would still have consulted the pacer (its
                    # timer then fires once for nothing); keep that state identical.
                    if space.ack_at is None or space.ack_at >= now:
                        self._pacing_at = pacer.next_send_time(now=now)
                    break

    def _nothing_left(self, crypto_stream: QuicStream | None) -> bool:
        """True when another packet in this flush would come out empty."""
        if self._datagrams_pending:
            return False
        if crypto_stream is not None and not _sender_idle(crypto_stream.sender):
            return False
        for stream in self._streams_queue:
            if stream.is_finished or stream.receiver.stop_pending:
                return False
            sender = stream.sender
            if sender.reset_pending:
                return False
            if not stream.is_blocked and not sender.buffer_is_empty and not _sender_idle(sender):
                return False
        return True

    def _stream_is_peer_initiated(self, stream: QuicStream) -> bool:
        stream_id: int = stream.stream_id  # type: ignore[assignment]
        return bool(stream_id & 1) == self._is_client

    # -- timer --------------------------------------------------------------------------------

    def get_timer(self) -> float | None:
        if not self._chrysalis_fast or self._state is not _CONNECTED:
            return super().get_timer()
        paths = self._network_paths
        if not paths or not paths[0].is_validated:
            return super().get_timer()
        # aioquic 1.7.2's get_timer on a validated path: nothing is amplification-blocked and
        # no path is being validated, so only the ACK, loss and pacing terms remain.
        timer_at = self._close_at
        loss = self._loss
        if timer_at is None or loss._quic_logger is not None:
            return super().get_timer()
        # One pass over the packet spaces for the ACK timers and for
        # get_loss_detection_time(amplification_limited=False), inlined with
        # get_probe_timeout (same arithmetic, same order).
        loss_at: float | None = None
        ack_eliciting_in_flight = 0
        confirmed = loss.handshake_confirmed
        for space in loss.spaces:
            ack_at = space.ack_at
            if ack_at is not None and ack_at < timer_at:
                timer_at = ack_at
            loss_time = space.loss_time
            if loss_time is not None and (loss_at is None or loss_time < loss_at):
                loss_at = loss_time
            if confirmed or not space.is_application_data:
                ack_eliciting_in_flight += space.ack_eliciting_in_flight
        if loss_at is None and (
            ack_eliciting_in_flight or not loss.peer_completed_address_validation
        ):
            if loss._rtt_initialized:
                variance = 4 * loss._rtt_variance
                pto = loss._rtt_smoothed + (
                    variance if variance >= K_GRANULARITY else K_GRANULARITY
                )
                if confirmed:
                    pto += loss.max_ack_delay
            else:
                pto = 2 * loss._rtt_initial
            loss_at = loss._time_of_last_sent_ack_eliciting_packet + pto * (2**loss._pto_count)
        self._loss_at = loss_at
        if loss_at is not None and loss_at < timer_at:
            timer_at = loss_at
        pacing_at = self._pacing_at
        if pacing_at is not None and pacing_at < timer_at:
            timer_at = pacing_at
        return timer_at

    # -- receive ------------------------------------------------------------------------------

    def receive_datagram(self, data: bytes, addr: NetworkAddress, now: float) -> None:
        close_at = self._close_at
        if close_at is not None and now >= close_at:
            # Not aioquic's order (with or without the fast paths): a datagram read once the
            # idle timeout (or the closing period) has run out ends the connection first and
            # is dropped. A process stopped or starved for longer than the idle timeout
            # reads, when it runs again, the datagrams queued meanwhile before its timer
            # fires; fed first, they restarted the idle timer of a connection the peer had
            # already discarded, and their acknowledgements, seconds late, made RTT samples
            # of the whole stop (3 PTOs, the floor of the idle timeout, then reached 30 s
            # and more). See ``chrysalis.quic`` README, "Keepalive".
            self.handle_timer(now)
            return
        if (
            not self._chrysalis_fast
            or self._state is not _CONNECTED
            or self._quic_logger is not None
            or not data
            or data[0] & 0xC0 != PACKET_FIXED_BIT  # not one short-header packet
            or self._peer_cid.sequence_number is None
        ):
            super().receive_datagram(data, addr, now)
            return
        network_path = self._network_paths[0]
        path_addr = network_path.addr
        if (path_addr is not addr and path_addr != addr) or not network_path.is_validated:
            super().receive_datagram(data, addr, now)
            return
        self._receive_short_packet(data, network_path, now)

    def _receive_short_packet(self, data: bytes, network_path: QuicNetworkPath, now: float) -> None:
        """aioquic 1.7.2's receive_datagram for one 1-RTT packet on the active, validated path
        of a connected connection whose peer CID is known (the checks that cannot apply are
        left out: unknown address, amplification accounting, long-header types, Retry,
        version negotiation, server initialization, source-CID checks, qlog)."""
        header_size = 1 + self._configuration.connection_id_length
        if len(data) < header_size:
            return  # pull_quic_header's ValueError: dropped
        destination_cid = data[1:header_size]
        destination_cid_seq: int | None = None
        for connection_id in self._host_cids:
            if destination_cid == connection_id.cid:
                destination_cid_seq = connection_id.sequence_number
                break
        if destination_cid_seq is None:
            return  # unknown connection ID: dropped
        if self._close_at is None:
            self._close_at = now + self._fast_idle_timeout()

        crypto = self._fast_crypto
        space = self._fast_space
        if crypto is None or space is None:
            crypto = self._cryptos[_ONE_RTT]
            space = self._spaces[_ONE_RTT]
        opened = self._open_short_packet(crypto, data, header_size, space.expected_packet_number)
        if opened is None:
            return
        plain_header, plain_payload, packet_number = opened

        # RFC 9000 section 12.3 requires discarding duplicate packets (the window's
        # __contains__, inlined).
        window = space.received_packets
        if packet_number < window._lower or packet_number in window._received:
            return

        # check reserved bits
        if plain_header[0] & 0x18:
            self.close(
                error_code=QuicErrorCode.PROTOCOL_VIOLATION,
                frame_type=QuicFrameType.PADDING,
                reason_phrase="Reserved bits must be zero",
            )
            return

        # raise expected packet number
        if packet_number > space.expected_packet_number:
            space.expected_packet_number = packet_number + 1

        is_client = self._is_client
        # Servers discard 0-RTT keys on the first 1-RTT packet (RFC 9001 section 4.9.3).
        if not is_client:
            zero_rtt = self._fast_zero_rtt
            if zero_rtt is None:
                zero_rtt = self._cryptos[_ZERO_RTT]
            if zero_rtt.recv.aead is not None:  # is_valid()
                zero_rtt.recv.teardown()

        # update spin bit
        if packet_number > self._spin_highest_pn:
            spin_bit = bool(plain_header[0] & 0x20)
            self._spin_bit = not spin_bit if is_client else spin_bit
            self._spin_highest_pn = packet_number

        # handle payload
        is_probing = False
        try:
            is_ack_eliciting, is_probing = self._short_payload_received(
                plain_payload, destination_cid, network_path, now
            )
        except QuicConnectionError as exc:
            self._logger.warning(exc)
            self.close(
                error_code=exc.error_code,
                frame_type=exc.frame_type,
                reason_phrase=exc.reason_phrase,
            )
        if self._state is not _CONNECTED or self._close_pending:
            return  # (connected on entry: "not connected" is aioquic's "in END_STATES")

        # update idle timeout
        self._close_at = now + self._fast_idle_timeout()
        self._ack_eliciting_sent_since_receipt = False

        # Handle migration (a server whose client switched to another of our CIDs).
        if not is_client and not is_probing and destination_cid != self.host_cid:
            self._logger.debug(
                "Peer switching to CID %s (%d)", destination_cid.hex(), destination_cid_seq
            )
            self.host_cid = destination_cid
            if network_path.peer_cid is None:
                self.change_connection_id()

        # The packet came on the active path (index 0): nothing to add or promote.

        # record packet as received
        if not space.discarded:
            if packet_number > space.largest_received_packet:
                space.largest_received_packet = packet_number
                space.largest_received_time = now
            # ack_queue.add(packet_number): the common cases (next in sequence, or after a
            # gap above every range) directly on the range list, otherwise RangeSet.add.
            ranges = space.ack_queue._RangeSet__ranges  # type: ignore[attr-defined]
            last = ranges[-1] if ranges else None
            if last is None or packet_number > last.stop:
                ranges.append(range(packet_number, packet_number + 1))
            elif packet_number == last.stop:
                ranges[-1] = range(last.start, packet_number + 1)
            else:
                space.ack_queue.add(packet_number)
            window.add(packet_number)
            if len(ranges) > MAX_ACK_RANGES:
                del ranges[0]  # ack_queue.shift()
            if is_ack_eliciting and space.ack_at is None:
                space.ack_at = now + self._ack_delay

    def _open_short_packet(
        self, crypto: CryptoPair, data: bytes, header_size: int, expected_packet_number: int
    ) -> tuple[bytes, bytes, int] | None:
        """``crypto.decrypt_packet`` for a short-header packet, with aioquic's header
        protection removal, packet-number decoding and AEAD call inlined (aioquic 1.7.2's
        ``CryptoContext.decrypt_packet``, ``HeaderProtection.remove``, ``AEAD.decrypt``).
        A packet in the other key phase takes aioquic's own path (which updates the keys).
        None, logged as aioquic logs it, when the packet cannot be opened (dropped)."""
        recv = crypto.recv
        aead = recv.aead
        hp = recv.hp
        sample_offset = header_size + 4  # PACKET_NUMBER_LENGTH_MAX
        if aead is None or hp is None or sample_offset + 16 > len(data):
            return self._open_short_packet_stock(crypto, data, header_size, expected_packet_number)
        sample = data[sample_offset : sample_offset + 16]
        mask = hp._mask(sample) if hp._is_chacha20 else hp._encryptor.update(sample)
        first = data[0] ^ (mask[0] & 0x1F)
        if (first & 4) >> 2 != recv.key_phase:
            return self._open_short_packet_stock(crypto, data, header_size, expected_packet_number)
        pn_length = (first & 0x03) + 1
        pn_end = header_size + pn_length
        truncated = int.from_bytes(data[header_size:pn_end], "big") ^ int.from_bytes(
            mask[1 : 1 + pn_length], "big"
        )
        plain_header = b"".join(
            (bytes((first,)), data[1:header_size], truncated.to_bytes(pn_length, "big"))
        )
        # aioquic.quic.packet.decode_packet_number
        window = 1 << (pn_length * 8)
        half_window = window // 2
        packet_number = (expected_packet_number & ~(window - 1)) | truncated
        if (
            packet_number <= expected_packet_number - half_window
            and packet_number < (1 << 62) - window
        ):
            packet_number += window
        elif packet_number > expected_packet_number + half_window and packet_number >= window:
            packet_number -= window
        try:
            payload = aead._aead.decrypt(
                (aead._iv ^ packet_number).to_bytes(12, "big"), data[pn_end:], plain_header
            )
        except InvalidTag as exc:
            self._logger.debug(CryptoError(str(exc)))
            return None
        return plain_header, payload, packet_number

    def _open_short_packet_stock(
        self, crypto: CryptoPair, data: bytes, header_size: int, expected_packet_number: int
    ) -> tuple[bytes, bytes, int] | None:
        try:
            return crypto.decrypt_packet(data, header_size, expected_packet_number)
        except CryptoError as exc:  # KeyUnavailableError included
            self._logger.debug(exc)
            return None

    def _short_payload_received(
        self, plain: bytes, host_cid: bytes, network_path: QuicNetworkPath, now: float
    ) -> tuple[bool, bool]:
        """``_payload_received`` for a 1-RTT packet: ACK, STREAM, PADDING and PING frames
        are handled inline (their handlers need no receive context), any other frame by
        aioquic's handler with a context built on first need. Same checks, same errors."""
        buf = Buffer(data=plain)
        handlers = self._fast_frames
        context: QuicReceiveContext | None = None
        frame_found = False
        is_ack_eliciting = False
        is_probing: bool | None = None
        while not buf.eof():
            try:
                frame_type = buf.pull_uint_var()
            except BufferReadError:
                raise QuicConnectionError(
                    error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
                    frame_type=None,  # type: ignore[arg-type]
                    reason_phrase="Malformed frame type",
                ) from None
            try:
                if 8 <= frame_type <= 15:
                    self._stream_frame(frame_type, buf)
                elif frame_type in (_ACK_FRAME, _ACK_ECN_FRAME):
                    self._ack_frame(frame_type, buf, _ONE_RTT, now)
                elif frame_type == 0:  # PADDING: consume the run of zero bytes
                    pos = buf.tell()
                    for byte in buf.data_slice(pos, buf.capacity):
                        if byte:
                            break
                        pos += 1
                    buf.seek(pos)
                elif frame_type != 1:  # (PING has no body)
                    frame_handler = _frame_handler(handlers, frame_type, _ONE_RTT)
                    if context is None:
                        context = QuicReceiveContext(
                            epoch=_ONE_RTT,
                            host_cid=host_cid,
                            network_path=network_path,
                            quic_logger_frames=None,
                            time=now,
                            version=None,
                        )
                    frame_handler(context, frame_type, buf)
            except BufferReadError:
                raise QuicConnectionError(
                    error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
                    frame_type=frame_type,
                    reason_phrase="Failed to parse frame",
                ) from None
            except StreamFinishedError:
                pass  # we lack the state for the stream, ignore the frame
            frame_found = True
            if frame_type not in _NON_ACK_ELICITING:
                is_ack_eliciting = True
            if frame_type not in _PROBING:
                is_probing = False
            elif is_probing is None:
                is_probing = True
        if not frame_found:
            raise QuicConnectionError(
                error_code=QuicErrorCode.PROTOCOL_VIOLATION,
                frame_type=QuicFrameType.PADDING,
                reason_phrase="Packet contains no frames",
            )
        return is_ack_eliciting, bool(is_probing)

    def _handle_stream_frame(
        self, context: QuicReceiveContext, frame_type: int, buf: Buffer
    ) -> None:
        if not self._chrysalis_fast or self._quic_logger is not None:
            super()._handle_stream_frame(context, frame_type, buf)
            return
        self._stream_frame(frame_type, buf)

    def _stream_frame(self, frame_type: int, buf: Buffer) -> None:
        """aioquic 1.7.2's ``_handle_stream_frame`` without qlog, with the receiver's
        in-order fast path (``QuicStreamReceiver.handle_frame``) inlined for data without
        FIN on an existing stream."""
        stream_id = buf.pull_uint_var()
        offset = buf.pull_uint_var() if frame_type & 4 else 0
        length = buf.pull_uint_var() if frame_type & 2 else buf.capacity - buf.tell()
        frame_end = offset + length
        if frame_end > UINT_VAR_MAX:
            raise QuicConnectionError(
                error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
                frame_type=frame_type,
                reason_phrase="offset + length cannot exceed 2^62 - 1",
            )
        data = buf.pull_bytes(length)
        fin = bool(frame_type & 1)
        # check stream direction (client-initiated: bit 0 clear; unidirectional: bit 1 set)
        if (not stream_id & 1) == self._is_client and stream_id & 2:
            raise QuicConnectionError(
                error_code=QuicErrorCode.STREAM_STATE_ERROR,
                frame_type=frame_type,
                reason_phrase="Stream is send-only",
            )
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._get_or_create_stream(frame_type, stream_id)
        if frame_end > stream.max_stream_data_local:
            raise QuicConnectionError(
                error_code=QuicErrorCode.FLOW_CONTROL_ERROR,
                frame_type=frame_type,
                reason_phrase="Over stream data limit",
            )
        receiver = stream.receiver
        highest = receiver.highest_offset
        newly_received = frame_end - highest if frame_end > highest else 0
        max_data = self._local_max_data
        if max_data.used + newly_received > max_data.value:
            raise QuicConnectionError(
                error_code=QuicErrorCode.FLOW_CONTROL_ERROR,
                frame_type=frame_type,
                reason_phrase="Over connection data limit",
            )
        if (
            not fin
            and length
            and offset == receiver._buffer_start
            and receiver._final_size is None
            and not receiver.is_finished
            and not receiver._buffer
        ):
            # QuicStreamReceiver.handle_frame's "new in-order chunk" path
            if frame_end > highest:
                receiver.highest_offset = frame_end
            receiver._buffer_start = frame_end
            self._events.append(
                StreamDataReceived(data=data, end_stream=False, stream_id=stream_id)
            )
        else:
            try:
                event = receiver.handle_frame(QuicStreamFrame(offset=offset, data=data, fin=fin))
            except FinalSizeError as exc:
                raise QuicConnectionError(
                    error_code=QuicErrorCode.FINAL_SIZE_ERROR,
                    frame_type=frame_type,
                    reason_phrase=str(exc),
                ) from None
            if event is not None:
                self._events.append(event)
        max_data.used += newly_received

    def _on_ack_delivery(
        self, delivery: QuicDeliveryState, space: QuicPacketSpace, highest_acked: int
    ) -> None:
        if not self._chrysalis_fast:
            super()._on_ack_delivery(delivery, space, highest_acked)
            return
        # aioquic's ``space.ack_queue.subtract(0, highest_acked + 1)`` on the range list.
        if delivery is _ACKED:
            ranges: list[range] = space.ack_queue._RangeSet__ranges  # type: ignore[attr-defined]
            stop = highest_acked + 1
            while ranges and ranges[0].stop <= stop:
                del ranges[0]
            if ranges and ranges[0].start < stop:
                ranges[0] = range(stop, ranges[0].stop)

    def _flush_builder(
        self,
        builder: QuicPacketBuilder,
        network_path: QuicNetworkPath,
        peer_cid: bytes,
        now: float,
    ) -> list[tuple[bytes, NetworkAddress]]:
        if not self._chrysalis_fast or self._quic_logger is not None:
            return super()._flush_builder(builder, network_path, peer_cid, now)
        # aioquic 1.7.2's _flush_builder without the qlog branches, with the 1-RTT space
        # looked up once.
        datagrams, packets = builder.flush()
        if not datagrams:
            return []
        self._packet_number = builder.packet_number
        one_rtt = self._fast_space
        loss = self._loss
        sent_handshake = False
        for packet in packets:
            packet.sent_time = now
            epoch = packet.epoch
            space = one_rtt if epoch is _ONE_RTT and one_rtt is not None else self._spaces[epoch]
            loss.on_packet_sent(packet=packet, space=space)
            if epoch is _HANDSHAKE:
                sent_handshake = True
            # Restart the idle timer on the first ack-eliciting packet sent since the last
            # one received (RFC 9000 section 10.1).
            if packet.is_ack_eliciting and not self._ack_eliciting_sent_since_receipt:
                self._close_at = now + self._idle_timeout()
                self._ack_eliciting_sent_since_receipt = True
        if sent_handshake and self._is_client:
            self._discard_epoch(_INITIAL)
        addr = network_path.addr
        sent = 0
        ret = []
        for datagram in datagrams:
            sent += len(datagram)
            ret.append((datagram, addr))
        network_path.bytes_sent += sent
        return ret

    def _payload_received(
        self,
        context: QuicReceiveContext,
        plain: bytes,
        crypto_frame_required: bool = False,
    ) -> tuple[bool, bool]:
        if not self._chrysalis_fast:
            return super()._payload_received(context, plain, crypto_frame_required)
        # aioquic 1.7.2's _payload_received, with epochs as tuples (see _enable_fast_paths)
        # and the frame-type sets as plain ints.
        buf = Buffer(data=plain)
        handlers = self._fast_frames
        epoch = context.epoch
        crypto_frame_found = False
        frame_found = False
        is_ack_eliciting = False
        is_probing: bool | None = None
        while not buf.eof():
            try:
                frame_type = buf.pull_uint_var()
            except BufferReadError:
                raise QuicConnectionError(
                    error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
                    frame_type=None,  # type: ignore[arg-type]
                    reason_phrase="Malformed frame type",
                ) from None
            frame_handler = _frame_handler(handlers, frame_type, epoch)
            try:
                frame_handler(context, frame_type, buf)
            except BufferReadError:
                raise QuicConnectionError(
                    error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
                    frame_type=frame_type,
                    reason_phrase="Failed to parse frame",
                ) from None
            except StreamFinishedError:
                pass  # we lack the state for the stream, ignore the frame
            frame_found = True
            if frame_type == _CRYPTO_FRAME:
                crypto_frame_found = True
            if frame_type not in _NON_ACK_ELICITING:
                is_ack_eliciting = True
            if frame_type not in _PROBING:
                is_probing = False
            elif is_probing is None:
                is_probing = True

        if not frame_found:
            raise QuicConnectionError(
                error_code=QuicErrorCode.PROTOCOL_VIOLATION,
                frame_type=QuicFrameType.PADDING,
                reason_phrase="Packet contains no frames",
            )
        if crypto_frame_required and not crypto_frame_found:
            raise QuicConnectionError(
                error_code=QuicErrorCode.PROTOCOL_VIOLATION,
                frame_type=QuicFrameType.PADDING,
                reason_phrase="Packet contains no CRYPTO frame",
            )
        return is_ack_eliciting, bool(is_probing)

    def _handle_padding_frame(
        self, context: QuicReceiveContext, frame_type: int, buf: Buffer
    ) -> None:
        # aioquic 1.7.2 skips padding one byte at a time in Python: about 0.6 ms for a 16 KiB
        # datagram (Initial packets are padded to the whole datagram, and chrysalis-node's
        # local scale trees send 16 KiB ones: twice per handshake). The same skip at C speed.
        if not self._chrysalis_fast or self._quic_logger is not None:
            super()._handle_padding_frame(context, frame_type, buf)
            return
        pos = buf.tell()
        rest = buf.data_slice(pos, buf.capacity)
        buf.seek(pos + len(rest) - len(rest.lstrip(b"\0")))

    def _handle_ack_frame(self, context: QuicReceiveContext, frame_type: int, buf: Buffer) -> None:
        if not self._chrysalis_fast or self._quic_logger is not None:
            super()._handle_ack_frame(context, frame_type, buf)
            return
        self._ack_frame(frame_type, buf, context.epoch, context.time)

    def _ack_frame(self, frame_type: int, buf: Buffer, epoch: tls.Epoch, now: float) -> None:
        """aioquic 1.7.2's ``_handle_ack_frame`` without the qlog branch, with
        ``pull_ack_frame`` building the (ascending, disjoint) range list directly."""
        try:
            end = buf.pull_uint_var()  # largest acknowledged
            ack_delay_encoded = buf.pull_uint_var()
            ack_range_count = buf.pull_uint_var()
            ack_count = buf.pull_uint_var()  # first ACK range
            ranges = [range(end - ack_count, end + 1)]
            end -= ack_count
            for _ in range(ack_range_count):
                end -= buf.pull_uint_var() + 2
                ack_count = buf.pull_uint_var()
                ranges.append(range(end - ack_count, end + 1))
                end -= ack_count
            if end < 0:
                raise ValueError("ACK range contains a negative packet number")
        except ValueError as exc:  # BufferReadError included, as in aioquic
            # A negative packet number is a frame encoding error (RFC 9000 section 19.3.1).
            raise QuicConnectionError(
                error_code=QuicErrorCode.FRAME_ENCODING_ERROR,
                frame_type=frame_type,
                reason_phrase=str(exc),
            ) from None
        # Each range lies below the previous one with a gap: reversed, the list is the
        # RangeSet aioquic would have built.
        ranges.reverse()
        if frame_type == _ACK_ECN_FRAME:
            buf.pull_uint_var()
            buf.pull_uint_var()
            buf.pull_uint_var()
        ack_delay = (ack_delay_encoded << self._remote_ack_delay_exponent) / 1000000
        loss = self._loss
        if not loss.peer_completed_address_validation and epoch in (_HANDSHAKE, _ONE_RTT):
            loss.peer_completed_address_validation = True
        one_rtt = self._fast_space
        space = one_rtt if epoch is _ONE_RTT and one_rtt is not None else self._spaces[epoch]
        loss._ack_ranges(ranges, ack_delay, now, space)  # type: ignore[attr-defined]


class FastPacketRecovery(QuicPacketRecovery):
    """``QuicPacketRecovery`` with cheaper ACK processing and loss detection.

    A connection with the fast paths switches its recovery object to this class right after
    construction (same attributes, only methods differ). ``on_ack_received`` is aioquic
    1.7.2's with the lookups hoisted and without the qlog branch when no trace is kept;
    ``_detect_loss`` skips the loss bookkeeping (persistent-congestion check, an empty
    ``_on_packets_lost``) when no packet was lost, which has no effect in aioquic either.
    """

    def on_ack_received(
        self,
        *,
        ack_rangeset: RangeSet,
        ack_delay: float,
        now: float,
        space: QuicPacketSpace,
    ) -> None:
        if self._quic_logger is not None:
            super().on_ack_received(
                ack_rangeset=ack_rangeset, ack_delay=ack_delay, now=now, space=space
            )
            return
        self._ack_ranges(
            ack_rangeset._RangeSet__ranges,  # type: ignore[attr-defined]
            ack_delay,
            now,
            space,
        )

    def _ack_ranges(
        self, ack_ranges: list[range], ack_delay: float, now: float, space: QuicPacketSpace
    ) -> None:
        """``on_ack_received`` (without a qlog trace) for the ranges of an ACK frame,
        ascending and disjoint as in aioquic's ``RangeSet``."""
        is_ack_eliciting = False
        largest_acked = ack_ranges[-1].stop - 1
        largest_newly_acked: int | None = None
        largest_sent_time = 0.0

        if largest_acked > space.largest_acked_packet:
            space.largest_acked_packet = largest_acked

        # Only visit the sent packets within the acknowledged ranges (sorted by number).
        sent_packets = space.sent_packets
        cc = self._cc
        packet_numbers = list(sent_packets)
        for r in ack_ranges:
            start = bisect_left(packet_numbers, r.start)
            stop = bisect_left(packet_numbers, r.stop)
            for packet_number in packet_numbers[start:stop]:
                packet = sent_packets.pop(packet_number)
                if packet.is_ack_eliciting:
                    is_ack_eliciting = True
                    space.ack_eliciting_in_flight -= 1
                if packet.in_flight:
                    cc.on_packet_acked(packet=packet, now=now)
                largest_newly_acked = packet_number
                largest_sent_time = packet.sent_time  # type: ignore[assignment]  # set when sent
                for handler, args in packet.delivery_handlers:
                    handler(_ACKED, *args)

        if largest_newly_acked is None:
            return

        if largest_acked == largest_newly_acked and is_ack_eliciting:
            latest_rtt = now - largest_sent_time
            # limit ACK delay to max_ack_delay (min/max/abs below as comparisons: the same
            # values, without a builtin call each)
            if ack_delay > self.max_ack_delay:
                ack_delay = self.max_ack_delay
            # update RTT estimate, which cannot be < 1 ms
            rtt_latest = latest_rtt if latest_rtt >= 0.001 else 0.001
            if rtt_latest < self._rtt_min:
                self._rtt_min = rtt_latest
            if rtt_latest > self._rtt_min + ack_delay:
                rtt_latest -= ack_delay
            self._rtt_latest = rtt_latest
            if not self._rtt_initialized:
                self._rtt_first_sample_time = now
                self._rtt_initialized = True
                self._rtt_variance = latest_rtt / 2
                self._rtt_smoothed = latest_rtt
            else:
                deviation = self._rtt_min - rtt_latest
                if deviation < 0:
                    deviation = -deviation
                self._rtt_variance = 3 / 4 * self._rtt_variance + 1 / 4 * deviation
                self._rtt_smoothed = 7 / 8 * self._rtt_smoothed + 1 / 8 * rtt_latest
            # inform congestion controller
            cc.on_rtt_measurement(now=now, rtt=latest_rtt)
            _update_pacing_rate(self._pacer, cc.congestion_window, self._rtt_smoothed)

        self._detect_loss(now=now, space=space)

        # Reset the PTO count, unless the client is not yet certain the server has
        # validated its address (RFC 9002 section 6.2.1).
        if self.peer_completed_address_validation:
            self._pto_count = 0

    def get_loss_detection_time(self, *, amplification_limited: bool) -> float | None:
        if self._quic_logger is not None:
            return super().get_loss_detection_time(amplification_limited=amplification_limited)
        # aioquic 1.7.2's, with the space scans as plain loops.
        loss_space: QuicPacketSpace | None = None
        ack_eliciting_in_flight = 0
        confirmed = self.handshake_confirmed
        for space in self.spaces:
            loss_time = space.loss_time
            if loss_time is not None and (
                loss_space is None or loss_time < loss_space.loss_time  # type: ignore[operator]
            ):
                loss_space = space
            if confirmed or not space.is_application_data:
                ack_eliciting_in_flight += space.ack_eliciting_in_flight
        if loss_space is not None:
            return loss_space.loss_time
        # A server blocked by the anti-amplification limit does not arm the PTO until it
        # receives a datagram (RFC 9002 section 6.2.2.1).
        if amplification_limited:
            return None
        if not self.peer_completed_address_validation or ack_eliciting_in_flight:
            timeout: float = self.get_probe_timeout(include_max_ack_delay=confirmed) * (
                2**self._pto_count
            )
            return self._time_of_last_sent_ack_eliciting_packet + timeout
        return None

    def _detect_loss(self, *, now: float, space: QuicPacketSpace) -> None:
        if self._rtt_initialized:
            latest, smoothed = self._rtt_latest, self._rtt_smoothed
            loss_delay = K_TIME_THRESHOLD * (latest if latest >= smoothed else smoothed)
        else:
            loss_delay = K_TIME_THRESHOLD * self._rtt_initial
        largest_acked = space.largest_acked_packet
        packet_threshold = largest_acked - K_PACKET_THRESHOLD
        time_threshold = now - loss_delay

        lost_packets: list[QuicSentPacket] = []
        loss_time: float | None = None
        for packet_number, packet in space.sent_packets.items():
            if packet_number > largest_acked:
                break
            sent_time: float = packet.sent_time  # type: ignore[assignment]  # set when sent
            if packet_number <= packet_threshold or sent_time <= time_threshold:
                lost_packets.append(packet)
            else:
                packet_loss_time = sent_time + loss_delay
                if loss_time is None or loss_time > packet_loss_time:
                    loss_time = packet_loss_time
        space.loss_time = loss_time
        if not lost_packets:
            return  # aioquic would call _on_packets_lost with nothing to do
        self._on_packets_lost(
            now=now,
            packets=lost_packets,
            persistent_congestion=self._in_persistent_congestion(packets=lost_packets),
            space=space,
        )


class FastPacketBuilder(QuicPacketBuilder):
    """``QuicPacketBuilder`` whose ``start_frame`` (two or more calls per packet) computes
    the packet's fill level once instead of through three properties; otherwise aioquic's.
    Used by the established-state ``datagrams_to_send`` only."""

    def start_frame(
        self,
        frame_type: int,
        capacity: int = 1,
        handler: QuicDeliveryHandler | None = None,
        handler_args: Sequence[Any] = _NO_ARGS,
    ) -> Buffer:
        # aioquic 1.7.2's start_frame with packet_is_empty, remaining_buffer_space and
        # remaining_flight_space inlined.
        buf = self._buffer
        position = buf.tell()
        packet = self._packet
        assert packet is not None
        # The first frame must leave room for the padding which lets header protection
        # sample enough bytes (RFC 9001 section 5.4.2).
        if position - self._packet_start <= self._header_size and capacity < _MIN_FIRST_FRAME:
            capacity = _MIN_FIRST_FRAME
        tag = self._packet_crypto.aead_tag_size  # type: ignore[union-attr]
        if self._buffer_capacity - position - tag < capacity or (
            frame_type not in _NON_IN_FLIGHT and self._flight_capacity - position - tag < capacity
        ):
            raise QuicPacketBuilderStop
        buf.push_uint_var(frame_type)
        if frame_type not in _NON_ACK_ELICITING:
            packet.is_ack_eliciting = True
        if frame_type not in _NON_IN_FLIGHT:
            packet.in_flight = True
        if frame_type == _CRYPTO_FRAME:
            packet.is_crypto_packet = True
        if frame_type in _PATH_FRAMES:
            # Datagrams carrying PATH_CHALLENGE or PATH_RESPONSE are expanded to at least
            # 1200 bytes (RFC 9000 sections 8.2.1 and 8.2.2).
            self._datagram_needs_padding = True
        if handler is not None:
            packet.delivery_handlers.append((handler, handler_args))
        return buf
