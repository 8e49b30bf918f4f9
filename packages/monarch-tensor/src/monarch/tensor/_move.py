"""Moving tensors between meshes: ``slice_mesh`` and ``to_mesh``."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from monarch.tensor import _messages as m
from monarch.tensor._context import issued_at
from monarch.tensor._mesh import DeviceMesh
from monarch.tensor._tensor import Tensor

__all__ = ["slice_mesh", "to_mesh"]


def _alias_on(t: Tensor, mesh: DeviceMesh) -> Tensor:
    """A tensor of ``mesh`` naming ``t``'s shards on the processes of ``mesh`` (a subset)."""
    client = mesh.client
    ref = client.new_ref()
    client.send(
        mesh.rank_set,
        (m.OP, (ref,), (), "aten::alias", (m.Ref(t._ref),), {}, issued_at()),
    )
    return Tensor(t._fake, mesh, ref, t._stream)


def slice_mesh(tensors: Any, **coords: int | slice) -> Any:
    """Every distributed tensor of the pytree, as a tensor of its mesh's slice at ``coords``."""

    def one(t: Any) -> Any:
        if not isinstance(t, Tensor):
            return t
        return _alias_on(t, t._mesh.slice(**coords))

    return tree_map(one, tensors)


def to_mesh(tensors: Any, mesh: DeviceMesh, stream: Any = None) -> Any:
    """Every distributed tensor of the pytree moved to ``mesh`` (same number of processes: the
    i-th process of the source sends its shard to the i-th of ``mesh``)."""

    def one(t: Any) -> Any:
        if not isinstance(t, Tensor) or t._mesh == mesh:
            return t
        if t._mesh.client is not mesh.client:
            raise NotImplementedError("to_mesh between different process meshes is not provided")
        src, dst = t._mesh.ranks, mesh.ranks
        if len(src) != len(dst):
            raise ValueError(
                f"to_mesh: {t._mesh!r} has {len(src)} processes, {mesh!r} has {len(dst)}"
            )
        client = mesh.client
        out = client.new_ref()
        where = issued_at()
        shape = tuple(t._fake.shape)
        if any(a != b for a, b in zip(src, dst, strict=True)):
            client.ensure_process_group()
        for a, b in zip(src, dst, strict=True):
            if a == b:
                client.send(
                    frozenset({a}), (m.OP, (out,), (), "aten::clone", (m.Ref(t._ref),), {}, where)
                )
            else:
                client.send(frozenset({a}), (m.SEND, t._ref, b, where))
                client.send(frozenset({b}), (m.RECV, out, a, shape, t._fake.dtype, where))
        fake = torch.empty(shape, dtype=t._fake.dtype, device="meta")
        return Tensor(fake, mesh, out, t._stream if stream is None else stream)

    return tree_map(one, tensors)
