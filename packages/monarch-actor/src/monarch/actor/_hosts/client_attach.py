"""``attach(addr)``: this client joins an existing Chrysalis tree instead of being its own root.

Why: Monarch's ``attach(addr)`` bootstraps the client through a remote gateway, so that the
client is reached through it. Here every program is a Chrysalis tree whose root is the client's
node; after ``attach("udp://HOST:PORT")`` the client's node *joins under* the node listening
there instead (a ``chrysalis serve`` root, or any node of a larger tree, trusting the same
cluster CA): the client and every process it spawns are published in that tree and reachable
through it by PID, and the client's parent link is supervised like any other. Worker processes
still join under the client.

As in Monarch it must come before the client starts (here: before its node starts, which the
first ``spawn_procs`` or ``attach_to_workers`` does): repeating the same address is a no-op,
another address or an already started client raises ``RuntimeError``. ``ValueError`` for an
address that is not ``udp://HOST:PORT``. If no node answers there within ``ATTACH_TIMEOUT``
seconds the client's start fails with ``RuntimeError`` naming the address.
"""

from __future__ import annotations

import threading
from typing import Final

from chrysalis.core import AddressError, DatagramAddr
from monarch.actor._runtime.client import current_client

__all__ = ["ATTACH_TIMEOUT", "attach", "attached_to"]

#: Seconds the client's node waits for the parent given to ``attach``.
ATTACH_TIMEOUT: Final = 30.0
_attached: str | None = None
_lock = threading.Lock()


def _client_node_started() -> bool:
    current = current_client()
    layer = current.node_layer if current is not None else None
    return getattr(layer, "_node", None) is not None


def attach(addr: str) -> None:
    """Make this client join the Chrysalis node at ``addr`` (``udp://HOST:PORT``) when it
    starts; see the module docstring."""
    global _attached
    if not isinstance(addr, str):
        raise TypeError(f"attach takes an address str, got {type(addr).__name__}")
    try:
        parsed = DatagramAddr.parse(addr)
        port = parsed.port if parsed.scheme == "udp" else 0
    except (AddressError, ValueError, TypeError) as exc:
        raise ValueError(f"attach({addr!r}): not a udp://HOST:PORT address ({exc})") from None
    if port == 0:
        raise ValueError(f"attach({addr!r}): needs the udp://HOST:PORT of a Chrysalis node")
    with _lock:
        if _attached == addr:
            return
        if _attached is not None:
            raise RuntimeError(
                f"client is already attached through {_attached}, not {addr}; detaching is not "
                "supported, so use a new process to attach through a different address"
            )
        if _client_node_started():
            raise RuntimeError(
                "client was initialized without a remote attachment; call attach(addr) before "
                "the client starts (its first spawn_procs or attach_to_workers)"
            )
        _attached = addr


def attached_to() -> str | None:
    """The address given to ``attach``, or None (the client's node is a root)."""
    return _attached
