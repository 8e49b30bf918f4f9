"""The client runtime of this OS process: its loop, fabric, root client and node layer.

``client()`` makes it on first use (and again after a fork): a ``RuntimeLoop``, the
``InProcessFabric`` that in-process simulated processes share (``new_local_runtime``), the
client's ``ProcRuntime`` (label ``"client"``) and its ``RootCell``, and the node layer that
gives the client its PID and reaches worker processes (``_hosts.client_node.ClientNodeLayer``,
registered by ``_hosts.host_mesh`` through ``set_node_layer``: hook H3). ``shutdown_client``
stops what the root owns, then the node layer and the loop (registered with ``atexit``).

This module registers hook H1 at import (``context.set_root_context``): ``context()`` and
``current_sender()`` outside any actor are the root client's. Before a client is made,
``main_module.refuse_while_importing`` runs: a worker importing the client's unguarded main
module must not start Monarch.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from chrysalis.core import Pid
from monarch.actor._base import codec as _codec
from monarch.actor._base.envelope import ActorAddr, FrameLimits, MessageKind
from monarch.actor._base.loop import RuntimeLoop
from monarch.actor._runtime import logging as _logging
from monarch.actor._runtime import main_module
from monarch.actor._runtime.cell import RootCell, _stop_meshes
from monarch.actor._runtime.context import (
    Context,
    _reset_context,
    _set_context,
    set_root_context,
)
from monarch.actor._runtime.proc import ProcDeath, ProcRuntime
from monarch.actor._transport.seam import InProcessFabric
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._hosts.client_node import (
        ClientNodeLayer,
    )
    from monarch.actor._hosts.host_mesh import (
        HostMesh,
    )

__all__ = [
    "add_start_hook",
    "broadcast_proc_death",
    "client",
    "new_local_runtime",
    "set_node_layer",
    "shutdown_client",
]

_log = logging.getLogger("monarch.actor.client")

_frame_limits_cache: list[FrameLimits] = [FrameLimits()]


def _frame_limits() -> FrameLimits:
    # Asked on every send: reuse the last FrameLimits while the setting is unchanged.
    value = int(_config.get("codec_max_frame_length"))
    cached = _frame_limits_cache[0]
    if cached.max_frame_bytes != value:
        cached = _frame_limits_cache[0] = FrameLimits(max_frame_bytes=value)
    return cached


class _Client:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = RuntimeLoop("monarch-runtime")
        self.loop.start()
        self.fabric = InProcessFabric(_frame_limits)
        if _node_layer_factory is None:
            raise RuntimeError("monarch.actor is not fully imported (no node layer registered)")
        self.node_layer = _node_layer_factory()  # the client's PID is its (lazy) node's PID
        self.host_mesh: HostMesh | None = None
        self.host_lock = threading.Lock()
        #: The host agent (``_hosts.agent``), spawned in this process on first use.
        self.host_agent: Any = None
        self.runtime = ProcRuntime(self.fabric, self.loop, "client", pid=self.node_layer.pid)
        self.root = RootCell(self.runtime)
        self.runtime.root = self.root
        self.local_runtimes: weakref.WeakSet[ProcRuntime] = weakref.WeakSet()


#: Hook H3: builds the client's node layer (``_hosts.client_node.ClientNodeLayer``; set by
#: ``_hosts.host_mesh`` at import).
_node_layer_factory: Callable[[], ClientNodeLayer] | None = None


def set_node_layer(factory: Callable[[], ClientNodeLayer]) -> None:
    """Register the factory of the client's node layer (called once, by ``_hosts.host_mesh``, at
    import)."""
    global _node_layer_factory
    _node_layer_factory = factory


_client: _Client | None = None
_client_lock = threading.Lock()
#: This process's PID once asked (key 0), emptied in a forked child: ``client()`` runs on every
#: call a program makes outside actors, and ``os.getpid()`` is a system call each time. The
#: fork handler is the dict's own ``clear`` (as ``_base.loop`` does): a function of this module
#: there would keep the module's globals alive until the interpreter's last teardown, and an
#: exec-started worker then no longer ran its actor modules' finalizers (``test_lifecycle``).
_own_pid: dict[int, int] = {}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_own_pid.clear)


def _this_pid() -> int:
    pid = _own_pid.get(0)
    if pid is None:
        pid = _own_pid[0] = os.getpid()
    return pid


_atexit_registered = False


def client_started() -> bool:
    """True once this process's client runtime exists (``client()`` was called)."""
    return _client is not None


def current_client() -> _Client | None:
    """This process's client runtime if it was made (``client()`` makes it on first use)."""
    return _client


def client() -> _Client:
    """The client runtime of this OS process, bootstrapped on first use (and after fork)."""
    global _client, _atexit_registered
    current = _client
    if current is not None and current.pid == (_own_pid.get(0) or _this_pid()):
        return current
    with _client_lock:
        if _client is None or _client.pid != os.getpid():
            # A worker importing the client's script: its unguarded program is running.
            main_module.refuse_while_importing("Monarch (a client: this_proc(), context(), ...)")
            _client = _Client()
            if not _atexit_registered:
                atexit.register(_shutdown_at_exit)
                _atexit_registered = True
            made = _client
        else:
            return _client
    for hook in list(_start_hooks):
        try:
            hook(made)
        except Exception:
            _log.exception("a client start hook failed")
    return made


#: Called with each client runtime this process makes, once it exists (outside the lock):
#: ``_mesh.admin`` starts the admin endpoint there when ``admin_port`` is set.
_start_hooks: list[Callable[[_Client], None]] = []


def add_start_hook(hook: Callable[[_Client], None]) -> None:
    """Call ``hook(client)`` whenever this process makes its client runtime (bounded: a few
    modules register one each, at import)."""
    if hook not in _start_hooks:
        if len(_start_hooks) >= 16:
            raise ValueError("too many client start hooks (limit 16)")
        _start_hooks.append(hook)


def shutdown_client(timeout: float = 5.0, *, at_exit: bool = False) -> None:
    """Stop everything the root client owns, then the runtime loop (bounded; idempotent)."""
    global _client
    with _client_lock:
        current, _client = _client, None
    if current is None or current.pid != os.getpid():
        return
    owned, current.root.owned = current.root.owned, []
    # The stops leave as this client's root: with no context, ``current_sender`` would
    # bootstrap a fresh client (this one is unpublished already), whose ports get the acks.
    token = _set_context(current.root.context)
    try:
        _stop_meshes(owned, timeout, at_exit=at_exit)
    finally:
        _reset_context(token)
    for runtime in list(current.local_runtimes):
        runtime.close()
    current.node_layer.shutdown(current, timeout)
    current.runtime.close()
    current.loop.stop(timeout=min(timeout, 1.0))


def _shutdown_at_exit() -> None:
    with contextlib.suppress(Exception):
        shutdown_client(timeout=1.0, at_exit=True)


def broadcast_proc_death(
    client: _Client, pid: Pid, reason: str, others: Sequence[Pid], *, fenced: bool = False
) -> None:
    """Tell the client's runtime and every process in ``others`` that ``pid`` died (``fenced``:
    was declared dead, see ``ProcRuntime.proc_died``)."""
    with contextlib.suppress(Exception):
        client.loop.call_soon(partial(client.runtime.proc_died, pid.raw, reason, fenced=fenced))
    runtime = client.runtime
    payload = _codec.Payload(msgspec.msgpack.encode(ProcDeath(pid.raw, reason, fenced)))
    for other in others:
        with contextlib.suppress(Exception):
            runtime.post(
                runtime.agent, MessageKind.SUPERVISION, ActorAddr(other.raw, ""), payload=payload
            )


def new_local_runtime(label: str) -> ProcRuntime:
    """A simulated process on the client's fabric and loop."""
    c = client()
    runtime = ProcRuntime(c.fabric, c.loop, label)
    c.local_runtimes.add(runtime)
    return runtime


def _root_context() -> Context:
    return client().root.context


set_root_context(_root_context)  # hook H1: ``context()`` outside any actor


def _client_in_this_process() -> bool:
    current = _client
    return current is not None and current.pid == os.getpid()


_logging.set_client_probe(_client_in_this_process)  # user records outside actors: ``<root>``
