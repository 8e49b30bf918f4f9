"""Chrysalis ``Node``: one process of the mesh (carrier, switch, QUIC transport, nameserver,
parent link) behind one facade, under asyncio or trio.

``Node(identity, listen=..., parent=JoinSettings(...))`` is an async context manager; inside it
the node publishes itself to its parent, serves its children, resolves and enumerates PIDs and
opens authenticated streams to any PID (``dial``) or takes them (``accept``).
``register_link_session`` runs a link-local protocol once per parent<->child link (spec 4.4).
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
from chrysalis.node._sessions import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    LINK_ID_BYTES,
    SESSION_VERSION,
    LinkSessionError,
    LinkSessionHandler,
    LinkSessions,
    LinkSessionVersionError,
    decode_ack,
)

for _public in (
    JoinSettings,
    Node,
    NodeError,
    NodeStatistics,
    LinkSessionError,
    LinkSessions,
    LinkSessionVersionError,
):
    _public.__module__ = __name__
del _public

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "ENUMERATION_ATTEMPTS",
    "ENUMERATION_PAGE",
    "LINK_ID_BYTES",
    "SESSION_VERSION",
    "JoinSettings",
    "LinkSessionError",
    "LinkSessionHandler",
    "LinkSessionVersionError",
    "LinkSessions",
    "Node",
    "NodeError",
    "NodeStatistics",
    "bind_carrier",
    "decode_ack",
]
