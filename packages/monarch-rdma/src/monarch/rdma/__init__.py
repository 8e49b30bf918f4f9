"""Monarch RDMA buffers (``monarch.rdma``), as in Meta's Monarch: ``RDMABuffer`` registers local
memory (a 1-D contiguous torch tensor or memoryview) and is a small picklable handle through which
any actor or the client reads and writes that memory one-sidedly; ``RDMAAction`` batches such
transfers. Transfers go through *providers* found by plugin (``monarch.rdma.providers``,
``monarch.rdma.hookspecs``): ``shm`` between processes of one host (a memcpy through the
owner's shared memory) and ``net`` otherwise (per-process manager actors, chunked and
pipelined); ``RDMABuffer.transport`` says which serves.
Importing this package does not import torch.
"""

from __future__ import annotations

from monarch.rdma import _plugin, _registry
from monarch.rdma._buffer import (
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]

_registry.add_builtin(_plugin)
