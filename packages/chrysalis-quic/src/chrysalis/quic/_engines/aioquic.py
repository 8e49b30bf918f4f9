"""The aioquic implementation of the engine seam.

Why a subclass at all: aioquic's ``QuicConnection`` is a good sans-IO QUIC core, but four of
its choices conflict with Chrysalis and are changed here, each as narrowly as aioquic allows:

1. **Connection IDs.** aioquic draws CIDs from ``os.urandom`` in three places: the first host
   CID and the client's initial peer CID (both in ``__init__``) and further host CIDs
   (``_replenish_connection_ids``). Chrysalis routes datagrams by the PID prefix of the
   destination CID, so the endpoint supplies all of them: the constructor overwrites the two
   initial values right after ``super().__init__`` (before anything was sent or serialized),
   and ``_replenish_connection_ids`` draws from the endpoint's issuer.
2. **Client certificates.** An aioquic server only requests a client certificate when the TLS
   context's private ``_request_client_certificate`` flag is set; ``_initialize`` sets it.
   Neither side verifies the peer chain here (``verify_mode`` is ``CERT_NONE``): the endpoint
   verifies it against the identity's roots and derives the PID itself.
3. **Receive flow control.** aioquic doubles its receive windows whenever the peer has sent
   half of them, whether or not anyone read the data, so a fast sender and a slow reader grow
   memory without bound. ``_write_connection_limits`` and ``_write_stream_limits`` are
   replaced by versions that slide each window only by what the endpoint reports consumed
   (``stream_consumed``, ``set_buffered``).
4. **Stream and CID limits.** The peer may open ``max_streams_bidi`` bidirectional streams
   (aioquic hard-codes 128) and no unidirectional stream; we accept at most two of the peer's
   CIDs (one spare), so each side issues one extra CID, and a connection issues at most
   eight extra CIDs in its lifetime however often the peer retires them.

5. **Acknowledgements ride along.** aioquic delays every ACK by ``K_GRANULARITY`` (1 ms)
   even when it is about to send a packet anyway, so a request answered within a millisecond
   leaves without the ACK of the request, and a separate ACK-only packet follows when the
   timer fires: one more datagram, one more wake-up and one more receive on each side per
   round trip. ``datagrams_to_send`` moves a pending 1-RTT ACK to "now" when stream data was
   queued since the last call, so it leaves in the same packet (RFC 9000 section 13.2.1
   allows acknowledging sooner); without new data the delay is unchanged.

6. **Cheaper packets.** The base class is ``_aioquic_fast.FastQuicConnection``: aioquic's
   hot paths (flush, a direct writer for the common 1-RTT packet, short-header receive, ACK
   processing, timers) restated for the established state with identical behaviour, pinned
   to aioquic 1.7.2 (aioquic's own code on any other version, or with ``fast=False``). The
   direct writer needs to know that (3)'s ``_write_connection_limits`` owes nothing, which
   ``_connection_limits_pending`` answers with the same rule; stream data events are mapped
   without a call per event.

7. **One key share.** An aioquic client generates a key pair for every group it supports
   (P-256, P-384, X25519, X448) and offers all four in its ClientHello; the server uses one
   of them. A client here offers X25519 alone (where the ``cryptography`` build has it;
   RFC 8446 9.1: the group every TLS 1.3 stack implements, and the cheapest to generate and
   to agree on), so each handshake generates one key pair on each side instead of four on
   the client, and the server agrees on X25519 instead of P-256. The server keeps every
   group, so clients that offer others still connect. Authentication is unchanged: both
   sides still sign with their certificate's key and verify the peer's chain.

Addresses are the endpoint's ``DatagramAddr`` values: aioquic only compares them (its one use
of IP structure, the server's preferred address, is never configured here), so no synthetic
address mapping is needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Final, final

from aioquic.quic import events as aq_events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import (
    CONNECTION_LIMIT_FRAME_CAPACITY,
    MAX_STREAM_DATA_FRAME_CAPACITY,
    QuicConnectionId,
    QuicConnectionState,
)
from aioquic.quic.packet import QuicFrameType, QuicProtocolVersion
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography.hazmat.primitives.serialization import Encoding

from chrysalis.core import CID_LEN, DatagramAddr
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._engines._aioquic_tls import tls
from chrysalis.quic._engines.aioquic_fast import FastQuicConnection
from chrysalis.quic._engines.base import (
    CidIssued,
    CidRetired,
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
from chrysalis.quic._identity import Identity

__all__ = ["AioquicConnection", "AioquicEngine"]

_CERT_NONE: Final = 0
"""``ssl.CERT_NONE``: aioquic does not verify the peer chain (the endpoint does). Spelled as
its value so this module does not import ``ssl`` (and with it ``socket``)."""
_PEER_CID_LIMIT: Final = 2
"""``active_connection_id_limit`` we advertise: the peer issues one spare CID."""
_HOST_CID_LIMIT: Final = 2
"""Host CIDs we keep issued (the first plus one spare)."""
_CID_ISSUE_BUDGET: Final = 8
"""Extra host CIDs one connection may ever issue. Each consumes an endpoint-wide connection
key that is never reused, so a peer retiring CIDs in a loop must not drain the key space."""


@final
class AioquicConnection(FastQuicConnection):
    """``QuicConnection`` with endpoint-chosen CIDs, client-certificate requests and
    consumption-driven receive windows; implements ``EngineConnection``.

    Args:
        configuration: the aioquic configuration (``connection_id_length`` 20).
        host_cid: the first host (source) CID.
        issue_cid: returns further host CIDs (PID-prefixed, from the endpoint's key counter).
        initial_dcid: client only: the Initial destination CID.
        original_dcid: server only: the destination CID of the client's first Initial.
        retry_scid: server only: the Retry's source CID when the client answered a Retry.
        max_streams_bidi: bidirectional streams the peer may open.
        fast: use the steady-state fast paths of ``_aioquic_fast`` (they are off anyway on an
            aioquic other than the pinned version); False runs aioquic's own code throughout.
    """

    # ``EngineHints``: events are translated as ``next_event`` pops aioquic's own queue, and
    # ``stream_consumed`` slides the receive windows, so the endpoint drives both as before.
    event_queue: Final = None
    events_withheld: Final = False
    stream_consumed_noop: Final = False

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        host_cid: bytes,
        issue_cid: Callable[[], bytes],
        initial_dcid: bytes | None = None,
        original_dcid: bytes | None = None,
        retry_scid: bytes | None = None,
        max_streams_bidi: int,
        fast: bool = True,
    ) -> None:
        super().__init__(
            configuration=configuration,
            original_destination_connection_id=original_dcid,
            retry_source_connection_id=retry_scid,
        )
        self._enable_fast_paths(fast)
        self._chrysalis_issue_cid = issue_cid
        self._chrysalis_cid_budget = _CID_ISSUE_BUDGET
        self._chrysalis_stream_window = configuration.max_stream_data
        self._chrysalis_connection_window = configuration.max_data
        self._chrysalis_buffered = 0
        self._chrysalis_idle = False
        self._chrysalis_piggyback = False  # (5) stream data queued since datagrams_to_send
        # (1) Endpoint-chosen CIDs, replacing the random ones before anything used them.
        self._host_cids[0].cid = host_cid
        self.host_cid = host_cid
        self._local_initial_source_connection_id = host_cid
        if configuration.is_client:
            if initial_dcid is None:
                raise ValueError("a client connection needs an initial destination CID")
            self._peer_cid.cid = initial_dcid
            self._original_destination_connection_id = initial_dcid
        # (4) Stream limits and the spare-CID limit (serialized later, in _initialize).
        self._local_max_streams_bidi.value = max_streams_bidi
        self._local_max_streams_bidi.sent = max_streams_bidi
        self._local_max_streams_uni.value = 0
        self._local_max_streams_uni.sent = 0
        self._local_active_connection_id_limit = _PEER_CID_LIMIT

    # -- narrow overrides ---------------------------------------------------------------------

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if not self._is_client:
            # (2) aioquic asks for a client certificate only behind this private flag.
            self.tls._request_client_certificate = True
        elif tls.Group.X25519 in self.tls._supported_groups:
            # (7) One key share: X25519 only (the ClientHello is built later, in connect).
            self.tls._supported_groups = [tls.Group.X25519]

    def _replenish_connection_ids(self) -> None:
        # (1) Same policy as aioquic, but CIDs from the endpoint's issuer, and a lifetime
        # budget per connection (replenishing after the peer retires a CID is optional).
        limit = min(_HOST_CID_LIMIT, self._remote_active_connection_id_limit)
        while len(self._host_cids) < limit and self._chrysalis_cid_budget > 0:
            self._chrysalis_cid_budget -= 1
            self._host_cids.append(
                QuicConnectionId(
                    cid=self._chrysalis_issue_cid(),
                    sequence_number=self._host_cid_seq,
                    stateless_reset_token=_reset_token(),
                )
            )
            self._host_cid_seq += 1

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace) -> None:
        # (3) MAX_DATA slides with what left the endpoint, never merely with what arrived.
        max_data = self._local_max_data
        window = self._chrysalis_connection_window
        target = max_data.used - self._chrysalis_buffered + window
        if 2 * (target - max_data.value) >= window:
            max_data.value = target
        for limit in (max_data, self._local_max_streams_bidi, self._local_max_streams_uni):
            if limit is not max_data and limit.sent - limit.used >= limit.value - limit.sent:
                continue  # batch MAX_STREAMS as aioquic does
            if limit.value != limit.sent:
                buf = builder.start_frame(
                    limit.frame_type,
                    capacity=CONNECTION_LIMIT_FRAME_CAPACITY,
                    handler=self._on_connection_limit_delivery,
                    handler_args=(limit,),
                )
                buf.push_uint_var(limit.value)
                limit.sent = limit.value

    def _connection_limits_pending(self) -> bool:
        # True when _write_connection_limits below would slide the window or write a
        # frame (the same rule, changing nothing), so _send_simple leaves it the flush.
        max_data = self._local_max_data
        window = self._chrysalis_connection_window
        target = max_data.used - self._chrysalis_buffered + window
        if 2 * (target - max_data.value) >= window or max_data.value != max_data.sent:
            return True
        for limit in (self._local_max_streams_bidi, self._local_max_streams_uni):
            if limit.sent - limit.used >= limit.value - limit.sent:
                continue
            if limit.value != limit.sent:
                return True
        return False

    _stream_limits_on_change_only = True  # see FastQuicConnection: true of the override below

    def _write_stream_limits(
        self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream
    ) -> None:
        # (3) The window itself moves in ``stream_consumed``; here only the frame is written.
        stream_id = stream.stream_id
        if stream_id is not None and stream.max_stream_data_local_sent != (
            stream.max_stream_data_local
        ):
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    # -- EngineConnection ---------------------------------------------------------------------

    # receive_datagram is the base class's (its address parameter is aioquic's ``Any``):
    # an override that only called it cost a Python call per datagram.

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, DatagramAddr]]:
        if self._chrysalis_piggyback:
            # (5) A packet leaves anyway: acknowledge in it rather than in an ACK-only packet
            # when the delayed-ACK timer fires.
            self._chrysalis_piggyback = False
            space = self._fast_space  # the 1-RTT space (cached with the fast paths on)
            if space is None:
                space = self._spaces.get(tls.Epoch.ONE_RTT)
            if space is not None and space.ack_at is not None and space.ack_at > now:
                space.ack_at = now
        return super().datagrams_to_send(now)

    def handle_timer(self, now: float) -> None:
        close_at = self._close_at
        if self._close_event is None and close_at is not None and now >= close_at:
            self._chrysalis_idle = True
        super().handle_timer(now)

    def next_event(self) -> EngineEvent | None:  # type: ignore[override]
        # aioquic's next_event pops from this deque; stream data, the common event, is
        # mapped inline.
        events = self._events
        while events:
            event = events.popleft()
            if type(event) is aq_events.StreamDataReceived:
                # Built through its slots: see ``new_stream_data`` (every datagram with data).
                mapped_data = new_stream_data(StreamDataReceived)
                set_sdr_stream_id(mapped_data, event.stream_id)
                set_sdr_data(mapped_data, event.data)
                set_sdr_fin(mapped_data, event.end_stream)
                return mapped_data
            mapped = self._map_event(event)
            if mapped is not None:
                return mapped
        return None

    def _map_event(self, event: aq_events.QuicEvent) -> EngineEvent | None:
        if isinstance(event, aq_events.StreamDataReceived):
            return StreamDataReceived(event.stream_id, event.data, event.end_stream)
        if isinstance(event, aq_events.StreamReset):
            return StreamResetReceived(event.stream_id, event.error_code)
        if isinstance(event, aq_events.StopSendingReceived):
            return StopSendingReceived(event.stream_id, event.error_code)
        if isinstance(event, aq_events.HandshakeCompleted):
            return HandshakeCompleted(event.alpn_protocol)
        if isinstance(event, aq_events.ConnectionIdIssued):
            return CidIssued(event.connection_id)
        if isinstance(event, aq_events.ConnectionIdRetired):
            return CidRetired(event.connection_id)
        if isinstance(event, aq_events.ConnectionTerminated):
            if self._chrysalis_idle:
                return Terminated(TerminationKind.IDLE, None, event.reason_phrase)
            kind = (
                TerminationKind.APPLICATION
                if event.frame_type is None
                else TerminationKind.TRANSPORT
            )
            return Terminated(kind, event.error_code, event.reason_phrase)
        return None  # pings, datagrams, protocol negotiation: not used by the endpoint

    def open_stream(self, stream_id: int) -> None:
        self._get_or_create_stream_for_send(stream_id)

    def send_stream_data(
        self, stream_id: int, data: bytes | memoryview, end_stream: bool = False
    ) -> None:
        # aioquic copies ``data`` into its own buffer (``bytearray +=`` accepts a view).
        # An open bidirectional stream is what _get_or_create_stream_for_send would return
        # after its checks (it can send, and is not discarded while in _streams).
        stream = None if stream_id & 2 else self._streams.get(stream_id)
        if stream is None:
            stream = self._get_or_create_stream_for_send(stream_id)
        stream.sender.write(data, end_stream=end_stream)  # type: ignore[arg-type]
        self._chrysalis_piggyback = True

    def stream_send_state(self, stream_id: int) -> tuple[int, int] | None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return None
        sender = stream.sender
        return sender._buffer_start, sender._buffer_stop - sender._buffer_start

    def sends_settled(self) -> bool:
        # A sender is done once its FIN (or reset) was acknowledged (``is_finished``; a
        # finished stream may already be discarded); short of that, it is settled only with
        # no FIN handed over and every byte acknowledged. A reset one gave its data up.
        for stream in self._streams.values():
            sender = stream.sender
            if (
                not sender.is_finished
                and sender._reset_error_code is None
                and (sender._buffer_fin is not None or sender._buffer_start != sender._buffer_stop)
            ):
                return False
        return True

    def stream_consumed(self, stream_id: int, consumed_through: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        window = self._chrysalis_stream_window
        target = consumed_through + window
        if 2 * (target - stream.max_stream_data_local) >= window:
            stream.max_stream_data_local = target

    def set_buffered(self, nbytes: int) -> None:
        self._chrysalis_buffered = nbytes

    def close(  # type: ignore[override]
        self, error_code: int = 0, reason: str = ""
    ) -> None:
        super().close(error_code=error_code, frame_type=None, reason_phrase=reason)

    def peer_certificate_chain(self) -> list[bytes]:
        tls = getattr(self, "tls", None)
        if tls is None or tls._peer_certificate is None:
            return []
        certificates = [tls._peer_certificate, *tls._peer_certificate_chain]
        return [certificate.public_bytes(Encoding.DER) for certificate in certificates]

    @property
    def peer_packet_seen(self) -> bool:
        return self._state is not QuicConnectionState.FIRSTFLIGHT

    @property
    def is_terminated(self) -> bool:
        return self._state is QuicConnectionState.TERMINATED

    def statistics(self) -> EngineStatistics:
        loss = self._loss
        return EngineStatistics(
            smoothed_rtt=loss._rtt_smoothed,
            congestion_window=loss.congestion_window,
            bytes_in_flight=loss.bytes_in_flight,
            pto_count=loss._pto_count,
        )


def _reset_token() -> bytes:
    """A stateless reset token, drawn as aioquic draws its own."""
    return os.urandom(16)


@final
class AioquicEngine:
    """Builds ``AioquicConnection`` objects for one endpoint (implements ``QuicEngine``).

    The two aioquic configurations (client and server) are built once from ``config`` and
    ``identity``; a client connection with a server name gets a copy naming it.
    """

    __slots__ = ("_client", "_config", "_server")

    def __init__(self, config: QuicConfig, identity: Identity) -> None:
        self._config = config
        base = QuicConfiguration(
            alpn_protocols=[config.alpn],
            congestion_control_algorithm=config.congestion_control,
            connection_id_length=CID_LEN,
            idle_timeout=float(config.idle_timeout),
            max_data=config.connection_window,
            max_datagram_size=config.max_udp_payload,
            max_stream_data=config.stream_window,
            supported_versions=[QuicProtocolVersion.VERSION_1],
            verify_mode=_CERT_NONE,
        )
        base.certificate = identity.chain[0]
        base.certificate_chain = list(identity.chain[1:])
        base.private_key = identity.private_key
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
    ) -> AioquicConnection:
        """Create a client connection and start its handshake (see ``QuicEngine``)."""
        configuration = (
            self._client if server_name is None else replace(self._client, server_name=server_name)
        )
        connection = AioquicConnection(
            configuration=configuration,
            host_cid=host_cid,
            issue_cid=issue_cid,
            initial_dcid=initial_dcid,
            max_streams_bidi=self._config.max_streams_bidi,
        )
        connection.connect(addr, now)
        return connection

    def accept(
        self,
        *,
        host_cid: bytes,
        original_dcid: bytes,
        retry_scid: bytes | None,
        issue_cid: Callable[[], bytes],
    ) -> AioquicConnection:
        """Create a server connection (see ``QuicEngine``)."""
        return AioquicConnection(
            configuration=self._server,
            host_cid=host_cid,
            issue_cid=issue_cid,
            original_dcid=original_dcid,
            retry_scid=retry_scid,
            max_streams_bidi=self._config.max_streams_bidi,
        )
