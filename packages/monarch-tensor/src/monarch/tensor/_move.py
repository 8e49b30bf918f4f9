"""Moving tensors between meshes: ``slice_mesh`` and ``to_mesh``.

``to_mesh`` matches dimensions by name, as the reference does: every dimension of the source
must be in the destination with the same size; a destination dimension the source lacks is
broadcast (each of its processes gets a copy, with the reference's warning). Within one process
mesh the shards move over its gloo process group (point-to-point); between two process meshes a
source worker sends its shard as an actor message to the destination process's
``TensorInbox``, where the destination worker takes it in its order of commands.
"""

from __future__ import annotations

import itertools
import secrets
import warnings
from typing import Any

from torch.utils._pytree import tree_map

from monarch.actor import ProcMesh
from monarch.tensor import _messages as m
from monarch.tensor._context import issued_at
from monarch.tensor._mesh import DeviceMesh, device_mesh_of
from monarch.tensor._tensor import MOVES, Tensor, meta_empty

__all__ = ["slice_mesh", "to_mesh"]

#: Transfer keys between process meshes: unique to this client process.
_TOKEN = secrets.token_hex(8)
_transfers = itertools.count(1)


def _alias_on(t: Tensor, mesh: DeviceMesh) -> Tensor:
    """A tensor of ``mesh`` naming ``t``'s shards on the processes of ``mesh`` (a subset)."""
    client = mesh.client
    ref = client.new_ref()
    client.send(
        mesh.rank_set,
        (m.OP, (ref,), (), "aten::alias", (m.Ref(t._ref),), {}, issued_at()),
        t._stream,
    )
    return Tensor(t._fake, mesh, ref, t._stream)


def slice_mesh(tensors: Any, **coords: int | slice) -> Any:
    """Every distributed tensor of the pytree, as a tensor of its mesh's slice at ``coords``."""

    def one(t: Any) -> Any:
        if not isinstance(t, Tensor):
            return t
        return _alias_on(t, t._mesh.slice(**coords))

    return tree_map(one, tensors)


def placement(src: DeviceMesh, dst: DeviceMesh) -> list[tuple[int, int]]:
    """``(source root rank, destination root rank)`` for every process of ``dst``: the source
    process at the same coordinates of the dimensions both have. ``ValueError`` (the
    reference's messages) when a shared dimension's sizes differ or ``dst`` lacks one of
    ``src``'s dimensions; a warning for each dimension of ``dst`` the source is broadcast along."""
    for name in dst.names:
        if name not in src.names:
            warnings.warn(
                f"to_mesh is broadcasting along {name} dimension."
                "This is implemented inefficiently and should only be used for initialization "
                "before it is fixed.",
                stacklevel=4,
            )
            continue
        if src.sizes[name] != dst.sizes[name]:
            raise ValueError(
                f"dimension {name} of destination device_mesh has a different length than the "
                "source tensor"
            )
    missing = set(src.names) - set(dst.names)
    if missing:
        raise ValueError(f"destination mesh does not have dimensions {missing}")
    pairs = []
    for point in itertools.product(*(range(dst.sizes[n]) for n in dst.names)):
        coords = dict(zip(dst.names, point, strict=True))
        pairs.append((src.rank_of({n: coords[n] for n in src.names}), dst.rank_of(coords)))
    return pairs


def to_mesh(tensors: Any, mesh: DeviceMesh | ProcMesh, stream: Any = None) -> Any:
    """Every distributed tensor of the pytree copied to ``mesh`` (a device mesh, or a process
    mesh: its whole device mesh), on ``stream`` (default: the tensor's)."""
    target = device_mesh_of(mesh) if isinstance(mesh, ProcMesh) else mesh

    def one(t: Any) -> Any:
        if not isinstance(t, Tensor):
            return t
        pairs = placement(t._mesh, target)
        fake = meta_empty(t._fake.shape, t._fake.dtype)
        out = target.client.new_ref()
        where = issued_at()
        onto = t._stream if stream is None else stream
        if t._mesh.client is target.client:
            _within(t, target.client, pairs, out, where, onto)
        else:
            _between(t, target, pairs, out, where, onto)
        return Tensor(fake, target, out, onto)

    return tree_map(one, tensors)


def _within(
    t: Tensor, client: Any, pairs: list[tuple[int, int]], out: int, where: str, onto: Any
) -> None:
    """Point-to-point over the process group of the one process mesh: sent on ``t``'s stream,
    received on ``onto`` (a copy on the same process: on ``onto``, after ``t``'s stream)."""
    if any(a != b for a, b in pairs):
        client.ensure_process_group()
    shape, dtype = tuple(t._fake.shape), t._fake.dtype
    copies = frozenset(a for a, b in pairs if a == b)
    if copies:
        client.sync(copies, t._stream, onto)
    for a, b in pairs:
        if a == b:
            client.send(
                frozenset({a}),
                (m.OP, (out,), (), "aten::clone", (m.Ref(t._ref),), {}, where),
                onto,
            )
        else:
            client.send(frozenset({a}), (m.SEND, t._ref, b, where), t._stream)
            client.send(frozenset({b}), (m.RECV, out, a, shape, dtype, where), onto)


def _between(
    t: Tensor, target: DeviceMesh, pairs: list[tuple[int, int]], out: int, where: str, onto: Any
) -> None:
    """Actor messages from the source workers to the destination processes' inboxes; the
    source's batch is sent at once, so the destination never waits on an unsent command."""
    source = t._mesh.client
    inbox = target.client.ensure_inbox()
    labels = target.client.labels
    shape, dtype = tuple(t._fake.shape), t._fake.dtype
    for a, b in pairs:
        key = f"{_TOKEN}:{next(_transfers)}"
        coords = dict(zip(labels, _coordinates(b, target.client.sizes), strict=True))
        source.send(frozenset({a}), (m.PUSH, t._ref, inbox, coords, key, where), t._stream)
        target.client.send(frozenset({b}), (m.TAKE, out, key, shape, dtype, where), onto)
    source.flush()


def _coordinates(rank: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    point = []
    for size in reversed(sizes):
        point.append(rank % size)
        rank //= size
    return tuple(reversed(point))


MOVES["to_mesh"] = to_mesh
MOVES["slice_mesh"] = slice_mesh
