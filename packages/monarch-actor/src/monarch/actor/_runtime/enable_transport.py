"""``enable_transport`` and ``ChannelTransport``: choose how this program's processes talk.

Why: Monarch programs start with ``enable_transport("tcp")`` (or a ``ChannelTransport``) to pick
the channel transport before anything else runs. Here the processes always meet over Chrysalis
(QUIC) and then switch to direct lanes; the transport chooses those lanes:

- ``ChannelTransport.Unix`` (``"ipc"``, the default): Unix-socket lanes between processes of one
  host (with shared memory for large buffers), TLS over TCP between hosts.
- ``TcpWithHostname`` / ``TcpWithLocalhost`` (``"tcp"``): every lane is TLS over TCP, between
  processes of one host too (loopback when the host has no routable address).
- ``ChannelTransport.Quic`` (``"quic"``): no direct lanes, every message over Chrysalis QUIC
  (the ``force_quic`` setting).

TLS flavours of Meta's infrastructure (``MetaTls*``, ``MetaQuic*``, ``Tls``), the in-process
``Local`` transport and explicit addresses (``"tcp://HOST:PORT"``: processes bind their own
addresses here) raise ``NotImplementedError`` naming what is supported. As in Monarch, one
transport per process: enabling another one later, or any after the client started, raises
``RuntimeError``. The choice is the ``default_transport`` setting, inherited by the workers.
"""

from __future__ import annotations

import threading

from monarch.actor._runtime.client import client_started
from monarch.config import _registry as _config
from monarch.config._registry import ChannelTransport

__all__ = ["SUPPORTED_TRANSPORTS", "ChannelTransport", "enable_transport"]

#: The transports ``enable_transport`` accepts here.
SUPPORTED_TRANSPORTS = (
    ChannelTransport.Unix,
    ChannelTransport.TcpWithHostname,
    ChannelTransport.TcpWithLocalhost,
    ChannelTransport.Quic,
)
_enabled: ChannelTransport | None = None
_lock = threading.Lock()


def enable_transport(transport: ChannelTransport | str) -> None:
    """Use ``transport`` for this program's processes; call it before any other Monarch call.

    ``transport`` is a ``ChannelTransport`` or a shortcut: ``"tcp"`` (``TcpWithHostname``),
    ``"ipc"``/``"unix"`` (``Unix``), ``"quic"`` (``Quic``); the module docstring says what each
    selects here. ``TypeError`` for another type, ``ValueError`` for an unknown string,
    ``NotImplementedError`` for a transport this implementation does not provide,
    ``RuntimeError`` once another transport was enabled or the client already started.
    """
    global _enabled
    if isinstance(transport, ChannelTransport):
        resolved: ChannelTransport | str = transport
    elif isinstance(transport, str):
        resolved = _config.parse_transport(_config.settings()["default_transport"], transport)
    else:
        raise TypeError(
            f"enable_transport takes a ChannelTransport or a str, got {type(transport).__name__}"
        )
    supported = ", ".join(f"ChannelTransport.{t.name}" for t in SUPPORTED_TRANSPORTS)
    if isinstance(resolved, str):
        raise NotImplementedError(
            f"enable_transport({resolved!r}): explicit addresses are not supported here (each "
            f"process binds its own address); use one of {supported} or "
            f"{', '.join(repr(k) for k in ('tcp', 'ipc', 'quic'))}"
        )
    if resolved not in SUPPORTED_TRANSPORTS:
        raise NotImplementedError(
            f"enable_transport({resolved}): this implementation does not provide that "
            f"transport; supported: {supported}"
        )
    with _lock:
        if _enabled is not None and _enabled is not resolved:
            raise RuntimeError(
                "Only one transport type may be enabled at one time. Currently enabled "
                f"transport type is `{_enabled}`. Attempted to enable transport type "
                f"`{resolved}`."
            )
        if _enabled is None and client_started():
            raise RuntimeError(
                "`enable_transport()` must be called before any other calls in the monarch "
                "API. If it isn't called, we will implicitly call "
                "`monarch.enable_transport(ChannelTransport.Unix)` on the first monarch call."
            )
        _enabled = resolved
    if resolved is ChannelTransport.Quic:
        _config.configure(default_transport=resolved, force_quic=True)
    else:
        _config.configure(default_transport=resolved)
