"""The built-in provider plugin of ``monarch.rdma`` (entry point ``net`` of the ``monarch.rdma``
group): the ``net`` provider, available everywhere, the ``shm`` provider (one host, Linux) and
the ``ibverbs`` provider (an RDMA device and pyverbs)."""

from __future__ import annotations

from collections.abc import Sequence

from monarch.rdma import _net, _shm, _verbs
from monarch.rdma._provider import ProviderSpec
from monarch.rdma.hookspecs import hookimpl

__all__ = ["monarch_rdma_providers"]


@hookimpl
def monarch_rdma_providers() -> Sequence[ProviderSpec]:
    """The ``net``, ``shm`` and ``ibverbs`` providers (``ibverbs`` available only with a
    device with an active port and pyverbs)."""
    return (_net.SPEC, _shm.SPEC, _verbs.SPEC)
