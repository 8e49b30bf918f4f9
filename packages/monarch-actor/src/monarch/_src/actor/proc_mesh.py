"""``monarch._src.actor.proc_mesh`` as Monarch's documentation and examples import it: the
public names the reference's module has, re-exported from ``monarch.actor``. Not here: the
reference's internals (``SetupActor``, spawn callbacks, ``get_active_proc_meshes``, ...)."""

from __future__ import annotations

from monarch._src.actor._forward import forwarder
from monarch.actor import (
    Actor,
    ActorMesh,
    Future,
    MeshFailure,
    MeshTrait,
    ProcMesh,
    Region,
    Shape,
    Slice,
    context,
    endpoint,
    get_or_spawn_controller,
)

__all__ = [
    "Actor",
    "ActorMesh",
    "Future",
    "MeshFailure",
    "MeshTrait",
    "ProcMesh",
    "Region",
    "Shape",
    "Slice",
    "context",
    "endpoint",
    "get_or_spawn_controller",
]

__getattr__ = forwarder(__name__, frozenset({"returns_future"}))
