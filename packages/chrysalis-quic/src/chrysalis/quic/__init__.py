"""Chrysalis PID-routed QUIC: process identity, the endpoint on aioquic, asyncio and trio
adapters and the stream transport.

Implemented so far: process identity (``Identity``, the development CA, the ``dev`` and ``file``
identity-provider plugins, peer-chain verification deriving the peer PID), the sans-IO
multi-connection endpoint ``QuicEndpoint`` behind the ``QuicEngine`` seam, the asyncio and trio
adapters (``AsyncioEndpoint``, ``TrioEndpoint``) and ``QuicTransport``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chrysalis._lazy import lazy_exports
from chrysalis.quic._asyncio import (
    AsyncioConnection,
    AsyncioEndpoint,
    AsyncioStream,
)
from chrysalis.quic._byte_stream import MAX_READ_ALL, ByteStream
from chrysalis.quic._config import (
    ALPN,
    DEFAULT_FLOW_WINDOW,
    MIN_UDP_PAYLOAD,
    EndpointLimits,
    QuicConfig,
)
from chrysalis.quic._devca import DevelopmentCA
from chrysalis.quic._driver import DEFAULT_DRIVER_MODE, DriverStatistics, EndpointDriver
from chrysalis.quic._endpoint import (
    AUTHENTICATION_FAILED_CODE,
    SHUTDOWN_CLOSE_CODE,
    Abort,
    Close,
    Connect,
    ConnectionKeyExhausted,
    ConnectionStatistics,
    EndpointRole,
    EndpointState,
    EndpointStatistics,
    OpenBidi,
    QuicCommand,
    QuicEndpoint,
    Shutdown,
)
from chrysalis.quic._endpoint_core import REFUSED_STREAM_CODE, AdapterOptions
from chrysalis.quic._engines.aioquic import AioquicConnection, AioquicEngine
from chrysalis.quic._engines.base import (
    CidIssued,
    CidRetired,
    EngineConnection,
    EngineStatistics,
    HandshakeCompleted,
    QuicEngine,
    StopSendingReceived,
    StreamDataReceived,
    StreamResetReceived,
    Terminated,
    TerminationKind,
)
from chrysalis.quic._errors import (
    ConnectError,
    ConnectionLostError,
    EndpointClosedError,
    IncompleteReadError,
    PeerAuthenticationError,
    QuicTransportError,
    ReadLimitError,
    StreamBrokenError,
    StreamClosedError,
    StreamResetError,
    WriteBufferFullError,
)
from chrysalis.quic._identity import (
    MAX_CERTIFICATE_DER_LENGTH,
    MAX_CHAIN_LENGTH,
    Identity,
    IdentityError,
    PeerVerificationError,
    TlsPrivateKey,
    verify_peer_chain,
)
from chrysalis.quic._providers import (
    DEV_CA_DIR_ENV,
    DevelopmentIdentityProvider,
    FileIdentityProvider,
    IdentityFiles,
    default_dev_ca_directory,
    write_identity,
)
from chrysalis.quic._retry import InvalidRetryToken, RetryTokenFault, RetryTokens
from chrysalis.quic._transport import (
    LINK_PROTOCOL_ID_LEN,
    LINK_REJECTED_CODE,
    DuplicateProtocolError,
    LinkProtocol,
    LinkProtocolId,
    QuicTransport,
    TransportEndpoint,
    TransportStatistics,
)

__all__ = [
    "ALPN",
    "AUTHENTICATION_FAILED_CODE",
    "Abort",
    "AdapterOptions",
    "AioquicProvingEngine",
    "AioquicConnection",
    "AioquicEngine",
    "AsyncioConnection",
    "AsyncioEndpoint",
    "AsyncioStream",
    "ByteStream",
    "CidIssued",
    "CidRetired",
    "Close",
    "Connect",
    "ConnectError",
    "ConnectionKeyExhausted",
    "ConnectionLostError",
    "ConnectionStatistics",
    "DEFAULT_DRIVER_MODE",
    "DEFAULT_FLOW_WINDOW",
    "DEV_CA_DIR_ENV",
    "DevelopmentCA",
    "DevelopmentIdentityProvider",
    "DriverStatistics",
    "DuplicateProtocolError",
    "EndpointClosedError",
    "EndpointDriver",
    "EndpointLimits",
    "EndpointRole",
    "EndpointState",
    "EndpointStatistics",
    "EngineConnection",
    "EngineStatistics",
    "FileIdentityProvider",
    "HandshakeCompleted",
    "Identity",
    "IdentityError",
    "IdentityFiles",
    "IncompleteReadError",
    "InvalidRetryToken",
    "LINK_PROTOCOL_ID_LEN",
    "LINK_REJECTED_CODE",
    "LinkProtocol",
    "LinkProtocolId",
    "MAX_CERTIFICATE_DER_LENGTH",
    "MAX_CHAIN_LENGTH",
    "MAX_READ_ALL",
    "MIN_UDP_PAYLOAD",
    "OpenBidi",
    "PeerAuthenticationError",
    "PeerVerificationError",
    "QuicCommand",
    "QuicConfig",
    "QuicEndpoint",
    "QuicEngine",
    "QuicTransport",
    "Qh3Engine",
    "QuicTransportError",
    "REFUSED_STREAM_CODE",
    "ReadLimitError",
    "RetryTokenFault",
    "RetryTokens",
    "SHUTDOWN_CLOSE_CODE",
    "Shutdown",
    "StopSendingReceived",
    "StreamBrokenError",
    "StreamClosedError",
    "StreamDataReceived",
    "StreamResetError",
    "StreamResetReceived",
    "Terminated",
    "TerminationKind",
    "TlsPrivateKey",
    "TransportEndpoint",
    "TransportStatistics",
    "TrioConnection",
    "TrioEndpoint",
    "TrioStream",
    "WriteBufferFullError",
    "default_dev_ca_directory",
    "verify_peer_chain",
    "write_identity",
]

if TYPE_CHECKING:
    from chrysalis.quic._engines.qh3 import AioquicProvingEngine, Qh3Engine
    from chrysalis.quic._trio import TrioConnection, TrioEndpoint, TrioStream

# trio and qh3 are optional: their modules load on first use.
_LAZY = {
    "AioquicProvingEngine": "chrysalis.quic._engines.qh3",
    "Qh3Engine": "chrysalis.quic._engines.qh3",
    "TrioConnection": "chrysalis.quic._trio",
    "TrioEndpoint": "chrysalis.quic._trio",
    "TrioStream": "chrysalis.quic._trio",
}

__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
"""Import the trio adapter and the qh3 engine on first use (optional dependencies;
``chrysalis._lazy``)."""
