"""Getting values back: ``fetch_shard`` and ``inspect``."""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_flatten, tree_map

from monarch.actor import Future
from monarch.tensor._context import active_mesh, issued_at, no_mesh
from monarch.tensor._errors import RemoteException
from monarch.tensor._mesh import refuse_in_coalescing
from monarch.tensor._stream import get_active_stream
from monarch.tensor._table import Failure
from monarch.tensor._tensor import mesh_of, streams_of, to_message

__all__ = ["call_on_shard_and_fetch", "fetch_shard", "inspect"]


def _decode(inner: Any, raw: Any) -> Any:
    with no_mesh.activate():  # unpickling makes tensors: local ones, even inside activate()
        status, value = inner(raw)
    if status == "err":
        assert isinstance(value, Failure)
        raise RemoteException(value)
    return value


def _coords_on(mesh: Any, shard: dict[str, int] | None) -> dict[str, int]:
    coords = dict(shard or {})
    unknown = [d for d in coords if d not in mesh.names]
    if unknown:
        raise ValueError(f"mesh {mesh!r} has no dimensions {unknown}")
    full = {name: coords.get(name, 0) for name in mesh.names}
    mesh.rank_of(full)  # bounds
    return full


def call_on_shard_and_fetch(
    remote: Any, *args: Any, shard: dict[str, int] | None = None, **kwargs: Any
) -> Future[Any]:
    """Run the ``remote`` function on one process (``shard``: its coordinates, unnamed ones 0)
    of the mesh of its tensor arguments (else the active mesh), in order after everything
    issued before, and return what it returns."""
    target = getattr(remote, "target", remote)
    check = getattr(remote, "check_fetchable", None)
    if check is not None:
        check()
    leaves = tree_flatten((args, kwargs))[0]
    mesh = mesh_of(leaves) or active_mesh()
    if mesh is None:
        raise RuntimeError("call_on_shard_and_fetch needs an active mesh or distributed tensors")
    refuse_in_coalescing("fetching results")
    full = _coords_on(mesh, shard)
    mesh.client.flush()
    workers = mesh.workers.slice(**full) if full else mesh.workers
    message_args, message_kwargs = tree_map(to_message, (args, kwargs))
    answer = workers.call_and_fetch.call_one(
        target,
        message_args,
        message_kwargs,
        issued_at(),
        streams_of(leaves, get_active_stream()),
    )
    inner = answer._decode
    return Future._create(answer._cell, lambda raw: _decode(inner, raw))


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Future[Any]:
    """The shard at ``shard``/``kwargs`` (unnamed dimensions: 0) of every distributed tensor in
    the pytree ``obj``, as local tensors. ``.get()`` raises ``RemoteException`` when an
    operation that should have produced one failed on the worker."""
    coords = dict(shard or {})
    coords.update(kwargs)
    leaves = tree_flatten(obj)[0]
    mesh = mesh_of(leaves)
    if mesh is None:
        return Future._completed(obj)
    refuse_in_coalescing("fetching results")
    full = _coords_on(mesh, coords)
    mesh.client.flush()
    target = mesh.workers.slice(**full) if full else mesh.workers
    answer = target.fetch.call_one(tree_map(to_message, obj), streams_of(leaves))
    inner = answer._decode
    return Future._create(answer._cell, lambda raw: _decode(inner, raw))


def inspect(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """``fetch_shard(obj, shard, **kwargs).get()``."""
    return fetch_shard(obj, shard, **kwargs).get()
