"""``monarch._src.actor.actor_mesh`` as Monarch's documentation and examples import it: the
public names the reference's module has, re-exported from ``monarch.actor`` (``NDSlice`` is
``Slice``). Not here: the reference's internals (``RootClientActor``, ``DebugContext``,
``RankedPortReceiver``, ``_client_context``, ...)."""

from __future__ import annotations

from monarch._src.actor._forward import forwarder
from monarch.actor import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Context,
    Endpoint,
    Future,
    Instance,
    MeshFailure,
    MeshTrait,
    Point,
    Port,
    PortReceiver,
    Shape,
    ValueMesh,
    as_endpoint,
    config,
    context,
    current_actor_name,
    current_rank,
    current_size,
    send,
    shutdown_context,
)
from monarch.actor import Slice as NDSlice

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Context",
    "Endpoint",
    "Future",
    "Instance",
    "MeshFailure",
    "MeshTrait",
    "NDSlice",
    "Point",
    "Port",
    "PortReceiver",
    "Shape",
    "ValueMesh",
    "as_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "send",
    "shutdown_context",
]

__getattr__ = forwarder(
    __name__, frozenset({"ChannelTransport", "attach", "enable_transport", "returns_future"})
)
