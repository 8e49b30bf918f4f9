"""Replication over Node links: ``ReplicationTopology`` attaches a ``Replica`` to a
``chrysalis.node.Node`` and runs a bidirectional sync session on every adjacent link.

A separate public module (not re-exported from ``chrysalis.sqlite``) so that importing the
replication core does not import the Node stack.
"""

from __future__ import annotations

from chrysalis.sqlite._topology import (
    DEFAULT_GC_INTERVAL,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    READ_SIZE,
    SQLITE_LINK_PROTOCOL,
    LinkReplicationStatus,
    ReplicaStream,
    ReplicationTopology,
    pump_session,
    run_collector,
)

__all__ = [
    "DEFAULT_GC_INTERVAL",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "READ_SIZE",
    "SQLITE_LINK_PROTOCOL",
    "LinkReplicationStatus",
    "ReplicaStream",
    "ReplicationTopology",
    "pump_session",
    "run_collector",
]
