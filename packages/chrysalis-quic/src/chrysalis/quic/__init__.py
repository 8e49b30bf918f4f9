"""Chrysalis PID-routed QUIC: process identity, the endpoint on aioquic, asyncio and trio
adapters and the stream transport.

Implemented so far: process identity (``Identity``, the development CA and the ``dev`` and
``file`` identity-provider plugins, peer-chain verification deriving the peer PID).
"""

from __future__ import annotations

from chrysalis.quic._devca import DevelopmentCA
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

__all__ = [
    "DEV_CA_DIR_ENV",
    "MAX_CERTIFICATE_DER_LENGTH",
    "MAX_CHAIN_LENGTH",
    "DevelopmentCA",
    "DevelopmentIdentityProvider",
    "FileIdentityProvider",
    "Identity",
    "IdentityError",
    "IdentityFiles",
    "PeerVerificationError",
    "TlsPrivateKey",
    "default_dev_ca_directory",
    "verify_peer_chain",
    "write_identity",
]
