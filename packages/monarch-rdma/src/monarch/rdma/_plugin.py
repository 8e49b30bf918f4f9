"""The built-in provider plugin of ``monarch.rdma`` (entry point ``net`` of the ``monarch.rdma``
group): the ``net`` provider, available everywhere, and the ``shm`` provider (one host, Linux)."""

from __future__ import annotations

from collections.abc import Sequence

from monarch.rdma import _net, _shm
from monarch.rdma._provider import ProviderSpec
from monarch.rdma.hookspecs import hookimpl

__all__ = ["monarch_rdma_providers"]


@hookimpl
def monarch_rdma_providers() -> Sequence[ProviderSpec]:
    """The ``net`` and ``shm`` providers."""
    return (_net.SPEC, _shm.SPEC)
