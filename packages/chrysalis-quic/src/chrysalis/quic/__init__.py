"""Chrysalis PID-routed QUIC: process identity, the endpoint on aioquic, asyncio and trio
adapters and the stream transport.

Implemented so far: process identity (``Identity``, the development CA, the ``dev`` and ``file``
identity-provider plugins, peer-chain verification deriving the peer PID) and the sans-IO
multi-connection endpoint ``QuicEndpoint`` behind the ``QuicEngine`` seam (aioquic engine).
"""

from __future__ import annotations

from chrysalis.quic._aioquic_engine import AioquicConnection, AioquicEngine
from chrysalis.quic._config import (
    ALPN,
    DEFAULT_FLOW_WINDOW,
    MIN_UDP_PAYLOAD,
    EndpointLimits,
    QuicConfig,
)
from chrysalis.quic._devca import DevelopmentCA
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
from chrysalis.quic._engine import (
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

__all__ = [
    "ALPN",
    "AUTHENTICATION_FAILED_CODE",
    "Abort",
    "AioquicConnection",
    "AioquicEngine",
    "CidIssued",
    "CidRetired",
    "Close",
    "Connect",
    "ConnectionKeyExhausted",
    "ConnectionStatistics",
    "DEFAULT_FLOW_WINDOW",
    "DEV_CA_DIR_ENV",
    "DevelopmentCA",
    "DevelopmentIdentityProvider",
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
    "InvalidRetryToken",
    "MAX_CERTIFICATE_DER_LENGTH",
    "MAX_CHAIN_LENGTH",
    "MIN_UDP_PAYLOAD",
    "OpenBidi",
    "PeerVerificationError",
    "QuicCommand",
    "QuicConfig",
    "QuicEndpoint",
    "QuicEngine",
    "RetryTokenFault",
    "RetryTokens",
    "SHUTDOWN_CLOSE_CODE",
    "Shutdown",
    "StopSendingReceived",
    "StreamDataReceived",
    "StreamResetReceived",
    "Terminated",
    "TerminationKind",
    "TlsPrivateKey",
    "default_dev_ca_directory",
    "verify_peer_chain",
    "write_identity",
]
