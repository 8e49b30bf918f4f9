"""Public names for those who write or choose RDMA providers (not part of Monarch's API).

``RDMAProvider`` (the interface), ``ProviderSpec`` (what a plugin's ``monarch_rdma_providers``
hook returns; see ``monarch.rdma.hookspecs``), ``RemoteKey``, ``PeerInfo``, ``Reach``,
``select_provider`` (the pure choice of a provider for a pair of processes), the registry
(``ProviderRegistry``, ``default_registry``) with its errors, ``RegistrationDeclined``, and
``shared_memory(n)``: memory the ``shm`` provider shares without copies (for memoryviews).
"""

from __future__ import annotations

from monarch.rdma._provider import (
    PeerInfo,
    ProviderSpec,
    RDMAProvider,
    Reach,
    RegistrationDeclined,
    RemoteKey,
    select_provider,
)
from monarch.rdma._registry import (
    ProviderConflictError,
    ProviderLoadError,
    ProviderRegistry,
    default_registry,
)
from monarch.rdma._shm import shared_memory

__all__ = [
    "PeerInfo",
    "ProviderConflictError",
    "ProviderLoadError",
    "ProviderRegistry",
    "ProviderSpec",
    "RDMAProvider",
    "Reach",
    "RegistrationDeclined",
    "RemoteKey",
    "default_registry",
    "select_provider",
    "shared_memory",
]
