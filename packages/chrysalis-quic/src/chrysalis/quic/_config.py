"""Endpoint admission limits and QUIC parameters (spec 5.2 and 5.10).

Why two records: ``EndpointLimits`` bounds what one endpoint admits (connections, handshakes in
flight, connections per source, streams per connection) and is the same whatever QUIC engine
runs below; ``QuicConfig`` holds the protocol parameters applied identically to the client and
server sides of every connection (ALPN, datagram size, idle timeout, flow-control windows,
stream limits, congestion control) plus the bounds this endpoint adds because aioquic has none:
how many bytes one stream may keep buffered inside the engine before the endpoint stops
handing it more (send backpressure), how much work one ``poll`` does, and how many
completions may wait for a slow application. Both are frozen, validated at construction, and
pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ALPN",
    "DEFAULT_FLOW_WINDOW",
    "MIN_UDP_PAYLOAD",
    "EndpointLimits",
    "QuicConfig",
]

ALPN: Final = "chrysalis/1"
"""The one application protocol every Chrysalis QUIC connection negotiates."""

MIN_UDP_PAYLOAD: Final = 1200
"""Smallest QUIC datagram payload a path must carry (RFC 9000 section 14)."""

DEFAULT_FLOW_WINDOW: Final = 64 * 1024 * 1024
"""The reference's single flow-control window (connection and stream), 64 MiB."""

_MAX_UDP_PAYLOAD: Final = 16384
"""Largest ``max_udp_payload`` the engines carry intact: aioquic (and the engines built on it)
write STREAM and CRYPTO frame lengths and long-header packet lengths as 2-byte varints (at
most 16,383), so a larger datagram can hold a frame whose length field overflows and the
peer reads garbage (measured: "Unknown frame type" at 32 KiB, "Failed to parse frame" at
60,000 bytes). At 16,384 bytes the headers and the AEAD tag keep every length below 16,383."""
_MAX_WINDOW: Final = 1 << 40
_MAX_STREAMS: Final = 1 << 24
_MAX_COUNT: Final = 1 << 31


def _positive(owner: str, name: str, value: object, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= high:
        raise ValueError(f"{owner}.{name} must be in 1..{high}, got {value}")


def _seconds(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}.{name} must be a number, not {type(value).__name__}")
    if not 0.0 < float(value) <= 86400.0:
        raise ValueError(f"{owner}.{name} must be in (0, 86400] seconds, got {value}")


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    """Admission limits of one endpoint (spec 5.2; all at least 1).

    Attributes:
        max_connections: live connections, client and server together. A connect beyond it
            fails with ``CommandError.TRANSPORT`` ("admission limited"); a new server
            connection beyond it is refused (counted in ``admission_rejections``).
        max_pending_handshakes: accepted server connections whose handshake has not finished.
        max_connections_per_source: live server connections per source. For UDP the key is
            the source IP (the port is ignored); for other carriers the whole address.
        max_streams_per_connection: stream records one connection may hold. A local open
            beyond it fails with ``CommandError.INVALID_ARGUMENT``; a peer stream beyond it is
            refused with STOP_SENDING and RESET_STREAM (code 0) without harming the connection.
    """

    max_connections: int = 65536
    max_pending_handshakes: int = 4096
    max_connections_per_source: int = 1024
    max_streams_per_connection: int = 65536

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_pending_handshakes",
            "max_connections_per_source",
            "max_streams_per_connection",
        ):
            _positive("EndpointLimits", name, getattr(self, name), _MAX_COUNT)


@dataclass(frozen=True, slots=True)
class QuicConfig:
    """QUIC parameters applied to both sides of every connection (spec 5.10).

    Attributes:
        alpn: the application protocol (``"chrysalis/1"``).
        max_udp_payload: largest QUIC datagram sent (1,200 to 16,384: the engines encode frame
            lengths in 2-byte varints, so larger datagrams would corrupt frames; default 1,472).
        idle_timeout: seconds without traffic before a connection is dropped silently.
        connection_window: connection-level receive flow-control window in bytes. Received
            bytes that no posted receive consumed yet are bounded by it.
        stream_window: stream-level receive flow-control window in bytes (the per-stream
            bound on received bytes waiting for a posted receive).
        max_streams_bidi: concurrent bidirectional streams the peer may open (QUIC
            ``initial_max_streams_bidi``); unidirectional streams are never allowed.
        congestion_control: ``"cubic"`` (default) or ``"reno"``.
        stream_send_buffer: most bytes one stream may have inside the QUIC engine (handed
            over but not yet acknowledged). aioquic buffers without limit, so the endpoint
            stops handing a stream more data at this bound and resumes on acknowledgement.
        max_submissions_per_poll: submissions one ``poll`` drains (bounds the work of a call).
        retry: answer the first Initial of an unknown client with a stateless Retry and
            allocate state only for a valid token (``False`` only where the carrier already
            proves the source address).
        retry_token_lifetime: seconds a Retry token stays valid (120).
        retry_secret_lifetime: seconds a Retry secret mints tokens before it is rotated to
            the single "previous" generation (3,600).
        max_staged_completions: completions waiting for the application (queue full or
            event credits exhausted) beyond which received datagrams are dropped (QUIC
            retransmits them): the bound on internal completion staging.
        shutdown_grace: seconds of graceful shutdown when the application closes every
            submission handle without submitting ``Shutdown`` (1 s, as the reference's
            transport).
        keepalive_interval: seconds without any datagram from the peer after which the
            endpoint sends a QUIC PING on an established connection (and again every
            interval while the silence lasts), or None (default) for no keepalive. The PING
            is acknowledged by a live peer, whose ACK restarts both sides' idle timers, so only
            a dead or unreachable peer reaches ``idle_timeout``; it must therefore be shorter
            than ``idle_timeout`` (the effective idle timeout is the smaller of both peers'
            values: choose it below the peer's too).
    """

    alpn: str = ALPN
    max_udp_payload: int = 1472
    idle_timeout: float = 30.0
    connection_window: int = DEFAULT_FLOW_WINDOW
    stream_window: int = DEFAULT_FLOW_WINDOW
    max_streams_bidi: int = 16384
    congestion_control: str = "cubic"
    stream_send_buffer: int = 1024 * 1024
    max_submissions_per_poll: int = 1024
    retry: bool = True
    retry_token_lifetime: float = 120.0
    retry_secret_lifetime: float = 3600.0
    max_staged_completions: int = 4096
    shutdown_grace: float = 1.0
    keepalive_interval: float | None = None

    def __post_init__(self) -> None:
        owner = "QuicConfig"
        if not isinstance(self.alpn, str) or not 1 <= len(self.alpn.encode()) <= 255:
            raise ValueError(f"{owner}.alpn must be 1 to 255 bytes of text")
        _positive(owner, "max_udp_payload", self.max_udp_payload, _MAX_UDP_PAYLOAD)
        if self.max_udp_payload < MIN_UDP_PAYLOAD:
            raise ValueError(
                f"{owner}.max_udp_payload must be at least {MIN_UDP_PAYLOAD}, "
                f"got {self.max_udp_payload} (UDP payload too small)"
            )
        _seconds(owner, "idle_timeout", self.idle_timeout)
        _positive(owner, "connection_window", self.connection_window, _MAX_WINDOW)
        _positive(owner, "stream_window", self.stream_window, _MAX_WINDOW)
        _positive(owner, "max_streams_bidi", self.max_streams_bidi, _MAX_STREAMS)
        if self.congestion_control not in ("cubic", "reno"):
            raise ValueError(
                f"{owner}.congestion_control must be 'cubic' or 'reno', "
                f"got {self.congestion_control!r}"
            )
        _positive(owner, "stream_send_buffer", self.stream_send_buffer, _MAX_WINDOW)
        _positive(owner, "max_submissions_per_poll", self.max_submissions_per_poll, _MAX_COUNT)
        if not isinstance(self.retry, bool):
            raise TypeError(f"{owner}.retry must be a bool")
        _seconds(owner, "retry_token_lifetime", self.retry_token_lifetime)
        _seconds(owner, "retry_secret_lifetime", self.retry_secret_lifetime)
        _positive(owner, "max_staged_completions", self.max_staged_completions, _MAX_COUNT)
        _seconds(owner, "shutdown_grace", self.shutdown_grace)
        if self.keepalive_interval is not None:
            _seconds(owner, "keepalive_interval", self.keepalive_interval)
            if self.keepalive_interval >= self.idle_timeout:
                raise ValueError(
                    f"{owner}.keepalive_interval ({self.keepalive_interval} s) must be shorter "
                    f"than idle_timeout ({self.idle_timeout} s), or the connection idles out "
                    "before its first PING"
                )
