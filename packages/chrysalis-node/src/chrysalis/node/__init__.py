"""Chrysalis ``Node``: one process of the mesh (carrier, switch, QUIC transport, nameserver,
parent link) behind one asyncio facade.

``Node(identity, listen=..., parent=JoinSettings(...))`` is an async context manager; inside it
the node publishes itself to its parent, serves its children, resolves and enumerates PIDs and
opens authenticated streams to any PID (``dial``) or takes them (``accept``).
"""

from __future__ import annotations

from chrysalis.node._node import (
    ENUMERATION_ATTEMPTS,
    ENUMERATION_PAGE,
    JoinSettings,
    Node,
    NodeError,
    NodeStatistics,
    bind_carrier,
)

for _public in (JoinSettings, Node, NodeError, NodeStatistics):
    _public.__module__ = __name__
del _public

__all__ = [
    "ENUMERATION_ATTEMPTS",
    "ENUMERATION_PAGE",
    "JoinSettings",
    "Node",
    "NodeError",
    "NodeStatistics",
    "bind_carrier",
]
