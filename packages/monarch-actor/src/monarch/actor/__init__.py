"""Monarch-compatible actors and meshes (``from monarch.actor import Actor, endpoint``).

This facade is the supported import location; the ``_``-prefixed modules behind it carry no
stability promise. What is here now: shapes and value meshes, futures, actors and endpoints with
every adverb, ports and channels, accumulators, context and ranks, the error types with their
categories and causal chains, the message envelope and argument codec, and an in-process
runtime (simulated processes on one fabric, ``_local_proc_mesh``) that runs programs end to end,
and real worker processes on this host (``this_host().spawn_procs``), each a Chrysalis Node
joined under the client's node.
"""

from __future__ import annotations

import gc as _gc
import sys as _sys

#: The ``python -m`` entry points that start a worker process (without the zygote) or a host's
#: worker loop (``run_worker_loop_forever``): what the process runs is always this facade's
#: import first (``-m`` imports the package), then the entry point.
_ENTRY_POINTS = ("monarch.actor._worker", "monarch.actor._attach")


def _dash_m_module() -> str | None:
    """The module this interpreter was started to run with ``-m``, if any (its options are
    skipped; a script or ``-c`` ends the search: a later ``-m`` is their argument)."""
    argv = _sys.orig_argv[1:]
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "-m":
            return argv[index + 1] if index + 1 < len(argv) else None
        if arg.startswith("-m"):
            return arg[2:]
        if not arg.startswith("-") or arg.startswith("-c"):
            return None
        index += 2 if arg in ("-X", "-W", "--check-hash-based-pycs") else 1
    return None


# A worker process or a worker loop started fresh spends most of its start-up here, importing
# the stack (issues 19 and 23), and the cyclic collector runs over and over while it does,
# finding no garbage: the imports allocate long-lived objects only. In those processes (and
# only there: a program's own collector settings are its business) collection is off while
# importing, and what the imports made goes into the permanent generation (``gc.freeze``)
# before it is back on, else the first full collection walks all of it. About a fifteenth of
# a worker loop's CPU time to listening (benchmarks/worker_start.py); ``monarch.job``'s host
# worker does the same around its own imports.
# The methods of the stack's dataclasses and its regular expressions are compiled once across
# such processes too (``chrysalis._startup.import_window``: about a fifth and a tenth of the
# imports' CPU time).
_STARTING_AS_ENTRY_POINT = _gc.isenabled() and _dash_m_module() in _ENTRY_POINTS
if _STARTING_AS_ENTRY_POINT:
    from chrysalis._startup import import_window as _import_window

    _window = _import_window()
    _window.__enter__()
try:
    from monarch.actor import config
    from monarch.actor._base.actor import Actor
    from monarch.actor._base.endpoint import concurrent_endpoint, endpoint
    from monarch.actor._base.errors import (
        ActorError,
        ErrorCategory,
        FailureEvent,
        MeshFailure,
        PortClosedError,
        PortOverflowError,
        SupervisionError,
    )
    from monarch.actor._base.future import Future
    from monarch.actor._base.ids import ActorId, ProcId
    from monarch.actor._base.shape import Extent, MeshTrait, Point, Region, Shape, Slice
    from monarch.actor._base.uid import Uid
    from monarch.actor._base.value_mesh import ValueMesh
    from monarch.actor._hosts import attach_procs as _attach_procs  # noqa: F401  (workers' start)
    from monarch.actor._hosts import worker as _worker_main  # noqa: F401  (for the zygote's forks)
    from monarch.actor._hosts.agent import get_or_spawn_controller
    from monarch.actor._hosts.attach_daemon import (
        run_worker_loop_forever,
        run_worker_loop_until_shutdown,
        start_worker_loop_forever,
    )
    from monarch.actor._hosts.client_attach import attach
    from monarch.actor._hosts.commands import BootstrapCommand, default_bootstrap_cmd
    from monarch.actor._hosts.host_mesh import HostMesh, attach_to_workers, this_host
    from monarch.actor._hosts.settle import default_unhandled_fault_hook as _default_hook
    from monarch.actor._hosts.settle import shutdown_context
    from monarch.actor._mesh import admin as _admin  # noqa: F401  (admin_port starts it: a hook)
    from monarch.actor._mesh import meshes as _meshes
    from monarch.actor._mesh.accumulator import Accumulator
    from monarch.actor._mesh.adverbs import Endpoint, as_endpoint, send
    from monarch.actor._mesh.meshes import ActorMesh, ProcMesh, this_proc
    from monarch.actor._runtime.context import (
        Context,
        Instance,
        context,
        current_actor_name,
        current_rank,
        current_size,
    )
    from monarch.actor._runtime.enable_transport import ChannelTransport, enable_transport
    from monarch.actor._runtime.ports import Channel, Port, PortReceiver
    from monarch.actor._runtime.returns_future import returns_future
    from monarch.actor._runtime.telemetry import (
        ChainLink,
        SupervisionRecord,
        add_supervision_listener,
        chrome_trace,
        disable_telemetry,
        enable_telemetry,
        finished_spans,
        get_meter,
        metrics_snapshot,
        span,
        supervision_events,
        traced,
    )
finally:
    if _STARTING_AS_ENTRY_POINT:
        _window.__exit__(None, None, None)

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorId",
    "ActorMesh",
    "BootstrapCommand",
    "ChainLink",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "ErrorCategory",
    "Extent",
    "FailureEvent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "MeshTrait",
    "Point",
    "Port",
    "PortClosedError",
    "PortOverflowError",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "Region",
    "Shape",
    "Slice",
    "SupervisionError",
    "SupervisionRecord",
    "Uid",
    "ValueMesh",
    "add_supervision_listener",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "chrome_trace",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "disable_telemetry",
    "enable_telemetry",
    "enable_transport",
    "endpoint",
    "finished_spans",
    "get_meter",
    "get_or_spawn_controller",
    "metrics_snapshot",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "send",
    "shutdown_context",
    "span",
    "start_worker_loop_forever",
    "supervision_events",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called once per unhandled failure that reaches the root client (looked up at fault time,
    so replace it by assignment: ``monarch.actor.unhandled_fault_hook = f``).

    Returning normally means handled. Raising anything (the default raises ``SystemExit(1)``)
    means unhandled: the report goes to stderr and the main thread gets ``KeyboardInterrupt``.
    """
    _default_hook(failure)


# Public classes claim the facade as their module, so reprs, docs and pickles name
# ``monarch.actor.X`` rather than a private module that may be reorganised.
for _public in (
    Accumulator,
    Actor,
    ActorError,
    ActorId,
    ActorMesh,
    ChainLink,
    Channel,
    ChannelTransport,
    Context,
    Endpoint,
    ErrorCategory,
    Extent,
    FailureEvent,
    Future,
    HostMesh,
    Instance,
    MeshFailure,
    MeshTrait,
    Point,
    Port,
    PortClosedError,
    PortOverflowError,
    PortReceiver,
    ProcId,
    ProcMesh,
    Region,
    Shape,
    Slice,
    SupervisionError,
    SupervisionRecord,
    Uid,
    ValueMesh,
    BootstrapCommand,
):
    _public.__module__ = __name__
del _public

#: In-process simulated processes (``_local_proc_mesh(per_host={"gpus": 2})``) on the client's
#: fabric. Private: no stability promise.
_local_proc_mesh = _meshes.local_proc_mesh
