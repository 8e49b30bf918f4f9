"""The ``_mesh`` layer: the user's mesh API.

Modules, each importing only those before it (and the layers to the right): ``accumulator``
(``Accumulator``), ``adverbs`` (``Endpoint``: ``call``, ``call_one``, ``choose``, ``stream``,
``broadcast``, ``send``) and ``logging_option`` (``ProcMesh.logging_option``) < ``meshes``
(``ProcMesh``, ``ActorMesh``, ``this_proc``, ``local_proc_mesh``; sets hook H2,
``_runtime.context.set_proc_resolver``, and holds hook H4, ``set_host_resolver``) <
``telemetry`` (a mesh's metrics summed over its processes, one trace of all their spans) <
``admin`` (the client's admin endpoint: Prometheus text, ``monarch top``'s status) <
``otel_metrics`` (the mesh-wide metrics as OpenTelemetry observable instruments).

This package took the old module path ``monarch.actor._mesh``: the names that module exported,
and the private ones other modules imported from it, are re-exported here for one release. Code
inside ``monarch.actor`` imports the module that defines a name; module state (the host
resolver of hook H4) and monkeypatches live in ``meshes``, not here.
"""

from monarch.actor._mesh.meshes import (
    READY_TIMEOUT,
    ActorMesh,
    ProcMesh,
    local_proc_mesh,
    set_host_resolver,
    this_proc,
    wait_ready,
)
from monarch.actor._mesh.meshes import _adopt as _adopt
from monarch.actor._mesh.meshes import _forget as _forget
from monarch.actor._mesh.meshes import _ProcMeshState as _ProcMeshState
from monarch.actor._mesh.meshes import _spawn_system_actor as _spawn_system_actor

__all__ = [
    "READY_TIMEOUT",
    "ActorMesh",
    "ProcMesh",
    "local_proc_mesh",
    "set_host_resolver",
    "this_proc",
    "wait_ready",
]
