"""Chrysalis ``Node``: one process of the mesh (carrier, switch, QUIC transport, nameserver,
parent link) behind one facade, under asyncio or trio.

``Node(identity, listen=..., parent=JoinSettings(...))`` is an async context manager; inside it
the node publishes itself to its parent, serves its children, resolves and enumerates PIDs and
opens authenticated streams to any PID (``dial``) or takes them (``accept``).
``register_link_session`` runs a link-local protocol once per parent<->child link (spec 4.4).

The names are imported on first use (``_LAZY``: name -> defining module), not with the package:
importing a submodule such as ``chrysalis.node._cli`` (the ``chrysalis`` command) does not pull
in QUIC, TLS and the nameserver unless it uses them (issue 22, item 5).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: the CLI's thin path imports no typing (issue 22, item 5)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Final

    from chrysalis.node._address import join_members, member_options
    from chrysalis.node._node import (
        DEFAULT_REJOIN_TIMEOUT,
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

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_REJOIN_TIMEOUT",
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
    "join_members",
    "member_options",
]

_NODE: Final = "chrysalis.node._node"
_SESSIONS: Final = "chrysalis.node._sessions"
_LAZY: Final[Mapping[str, str]] = {
    "DEFAULT_REJOIN_TIMEOUT": _NODE,
    "ENUMERATION_ATTEMPTS": _NODE,
    "ENUMERATION_PAGE": _NODE,
    "JoinSettings": _NODE,
    "Node": _NODE,
    "NodeError": _NODE,
    "NodeStatistics": _NODE,
    "bind_carrier": _NODE,
    "DEFAULT_HANDSHAKE_TIMEOUT": _SESSIONS,
    "LINK_ID_BYTES": _SESSIONS,
    "SESSION_VERSION": _SESSIONS,
    "LinkSessionError": _SESSIONS,
    "LinkSessionHandler": _SESSIONS,
    "LinkSessions": _SESSIONS,
    "LinkSessionVersionError": _SESSIONS,
    "decode_ack": _SESSIONS,
    "join_members": "chrysalis.node._address",
    "member_options": "chrysalis.node._address",
}
"""Where each public name is defined."""


# The shared helper (``chrysalis._lazy``) is imported at the first look-up of a missing name, not
# with the package. A missing name includes a submodule not imported yet: ``from chrysalis.node
# import _agent_client`` asks the package for the name first (the import system's ``hasattr``),
# which calls ``__getattr__`` and so imports the helper. A command the agent answers imports its
# thin client as ``from chrysalis.node._agent_client import ...``, which looks nothing up on the
# package, so it imports nothing beyond ``THIN_IMPORTS`` (``tests/test_cli_start.py``).
# The pair is built at that first look-up and kept (``_EXPORTS``), not built again per look-up.
_EXPORTS: tuple[Callable[[str], object], Callable[[], list[str]]] | None = None


def _exports() -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    global _EXPORTS
    if _EXPORTS is None:
        from chrysalis._lazy import lazy_exports

        _EXPORTS = lazy_exports(globals(), _LAZY)
    return _EXPORTS


def __getattr__(name: str) -> object:
    return _exports()[0](name)


def __dir__() -> list[str]:
    return _exports()[1]()
