"""Getting values back: ``fetch_shard`` and ``inspect``."""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_flatten, tree_map

from monarch.actor import Future
from monarch.tensor._errors import RemoteException
from monarch.tensor._mesh import no_mesh
from monarch.tensor._table import Failure
from monarch.tensor._tensor import mesh_of, to_message

__all__ = ["fetch_shard", "inspect"]


def _decode(inner: Any, raw: Any) -> Any:
    with no_mesh.activate():  # unpickling makes tensors: local ones, even inside activate()
        status, value = inner(raw)
    if status == "err":
        assert isinstance(value, Failure)
        raise RemoteException(value)
    return value


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
    unknown = [d for d in coords if d not in mesh.names]
    if unknown:
        raise ValueError(f"fetch_shard: mesh {mesh!r} has no dimensions {unknown}")
    full = {name: coords.get(name, 0) for name in mesh.names}
    mesh.rank_of(full)  # bounds
    mesh.client.flush()
    target = mesh.workers.slice(**full) if full else mesh.workers
    answer = target.fetch.call_one(tree_map(to_message, obj))
    inner = answer._decode
    return Future._create(answer._cell, lambda raw: _decode(inner, raw))


def inspect(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """``fetch_shard(obj, shard, **kwargs).get()``."""
    return fetch_shard(obj, shard, **kwargs).get()
