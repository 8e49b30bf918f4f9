"""Every public exception of the QUIC adapters and ``QuicTransport`` (their base is
``QuicTransportError``)."""

from __future__ import annotations

from chrysalis.core import Pid

__all__ = [
    "ConnectError",
    "ConnectionLostError",
    "EndpointClosedError",
    "IncompleteReadError",
    "PeerAuthenticationError",
    "QuicTransportError",
    "ReadLimitError",
    "StreamBrokenError",
    "StreamClosedError",
    "StreamResetError",
    "WriteBufferFullError",
]


# --- errors ------------------------------------------------------------------------------------


class QuicTransportError(Exception):
    """Base class of the errors raised by the adapters and ``QuicTransport``."""


class EndpointClosedError(QuicTransportError):
    """The endpoint (or transport) is shut down or its driver stopped."""


class ConnectError(QuicTransportError, ConnectionError):
    """A dial failed: the endpoint refused the connect, or the connection closed before its
    handshake completed. ``application_code`` / ``transport_code`` are the close codes."""

    def __init__(
        self,
        message: str,
        *,
        application_code: int | None = None,
        transport_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.application_code = application_code
        self.transport_code = transport_code


class PeerAuthenticationError(ConnectError):
    """The peer's certificate did not prove the requested PID (or was not trusted).

    ``expected`` is the PID dialled (None for an unpinned dial), ``actual`` the PID of the
    presented certificate (None when no trusted certificate was presented), ``reason`` what
    did not match, naming the presented certificate (subject, issuer, PID)."""

    def __init__(self, expected: Pid | None, actual: Pid | None, reason: str = "") -> None:
        wanted = "any trusted peer" if expected is None else f"PID {expected}"
        if reason:
            message = f"peer authentication failed: expected {wanted}; {reason}"
        elif actual is None:
            message = f"peer authentication failed: expected {wanted}; no trusted certificate"
        else:
            message = f"peer authentication failed: expected {wanted}, got PID {actual}"
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.reason = reason


class ConnectionLostError(QuicTransportError, ConnectionError):
    """The connection closed before the stream finished (no FIN was received).

    ``application_code`` / ``transport_code`` are the close codes, if any (neither for an idle
    timeout or an endpoint shutdown)."""

    def __init__(
        self,
        message: str = "the connection closed",
        *,
        application_code: int | None = None,
        transport_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.application_code = application_code
        self.transport_code = transport_code


class StreamResetError(QuicTransportError, ConnectionResetError):
    """The peer reset its sending half of the stream with ``error_code``."""

    def __init__(self, error_code: int) -> None:
        super().__init__(f"the peer reset the stream (code {error_code})")
        self.error_code = error_code


class StreamBrokenError(QuicTransportError, BrokenPipeError):
    """Written bytes can no longer be delivered: the peer stopped reading (STOP_SENDING),
    the stream was reset, or the connection closed."""


class StreamClosedError(QuicTransportError):
    """This side already closed the stream (or its writing half) and then used it."""


class IncompleteReadError(QuicTransportError, EOFError):
    """``read_exactly`` reached EOF first; ``partial`` holds the bytes read."""

    def __init__(self, partial: bytes, expected: int) -> None:
        super().__init__(f"{len(partial)} bytes read on a total of {expected} expected bytes")
        self.partial = partial
        self.expected = expected


class ReadLimitError(QuicTransportError, BufferError):
    """Reading everything until EOF would exceed the caller's limit."""


class WriteBufferFullError(QuicTransportError, BufferError):
    """A synchronous ``write`` would hold more than the stream's write buffer limit locally:
    await ``drain()`` between writes."""
