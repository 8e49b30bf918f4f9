"""Monarch distributed tensors (``from monarch import fetch_shard, remote, ...``).

``with proc_mesh.activate():`` makes torch operations issued by this thread produce
:class:`Tensor` s with one shard on each process of the mesh. The client propagates shapes and
dtypes with meta tensors and never waits for the workers; operations go to a tensor worker on
each process in order, in batches; dropping a client tensor frees its shards.
``fetch_shard``/``inspect`` bring a shard back; ``Tensor.reduce`` runs collectives over the
mesh's gloo process group; ``remote`` functions run on every shard.
"""

from __future__ import annotations

from monarch.actor._mesh.adverbs import set_rref_hook as _set_rref_hook
from monarch.actor._mesh.meshes import set_activate_hook as _set_activate_hook
from monarch.tensor._context import get_active_mesh, no_mesh
from monarch.tensor._errors import RemoteException
from monarch.tensor._fetch import call_on_shard_and_fetch, fetch_shard, inspect
from monarch.tensor._grad import grad_generator
from monarch.tensor._mesh import DeviceMesh, activate_proc_mesh, coalescing
from monarch.tensor._move import slice_mesh, to_mesh
from monarch.tensor._remote import Remote, remote
from monarch.tensor._rref import rref as _rref
from monarch.tensor._stream import Borrow, Stream, get_active_stream
from monarch.tensor._tensor import Tensor, reduce, reduce_

__all__ = [
    "Borrow",
    "DeviceMesh",
    "Remote",
    "RemoteException",
    "Stream",
    "Tensor",
    "call_on_shard_and_fetch",
    "coalescing",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "slice_mesh",
    "to_mesh",
]

_set_activate_hook(activate_proc_mesh)
_set_rref_hook(_rref)
