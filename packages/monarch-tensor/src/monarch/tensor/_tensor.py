"""``monarch.tensor.Tensor``: a distributed tensor seen from the client.

The client keeps a meta tensor per distributed tensor (shape, dtype, strides) and propagates
it through each operation without running it; the operation itself goes to the workers in the
ordered batch. Dropping the client tensor frees the shards.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from monarch.tensor import _messages as m
from monarch.tensor._context import active_mesh, issued_at, no_mesh
from monarch.tensor._stream import check_usable, get_active_stream, stream_id

if TYPE_CHECKING:
    from monarch.tensor._mesh import DeviceMesh

__all__ = [
    "MOVES",
    "Tensor",
    "dispatch",
    "mesh_of",
    "meta_empty",
    "reduce",
    "reduce_",
    "streams_of",
    "to_message",
    "to_meta",
]

Reduction = Literal["sum", "avg", "max", "min", "stack"]
_REDUCTIONS = ("sum", "avg", "max", "min", "stack")

#: ``to_mesh`` and ``slice_mesh`` behind the methods of the same names (``_move``, a module
#: above this one, registers them when it is imported).
MOVES: dict[str, Callable[..., Any]] = {}

_aten = torch.ops.aten
#: Operations that need a value on the client: fetch the shard instead.
_NEEDS_VALUE = {
    _aten._local_scalar_dense.default,
    _aten.item.default,
    _aten.is_nonzero.default,
    _aten.equal.default,
}
#: Operator namespaces that only mark the client's own work (``torch.optim``'s
#: ``record_function`` profiler ranges): they run on the client, never on the workers.
_CLIENT_ONLY_NAMESPACES = frozenset({"profiler"})


class Tensor(torch.Tensor):  # type: ignore[misc]
    """A tensor with one shard on each process of ``mesh``."""

    _fake: torch.Tensor
    _mesh: DeviceMesh
    _ref: int
    _stream: Any

    @staticmethod
    def __new__(cls, fake: torch.Tensor, mesh: DeviceMesh, ref: int, stream: Any) -> Tensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            fake.size(),
            strides=fake.stride(),
            storage_offset=fake.storage_offset(),
            dtype=fake.dtype,
            layout=fake.layout,
            device=fake.device,
            requires_grad=False,
        )
        r._fake = fake
        r._mesh = mesh
        r._ref = ref
        r._stream = stream
        weakref.finalize(r, mesh.client.free, ref, stream_id(stream))
        return cast(Tensor, r)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return (
            f"monarch.Tensor(mesh={self._mesh!r}, shape={tuple(self._fake.shape)}, "
            f"dtype={self._fake.dtype}, stream={self._stream!r})"
        )

    @property
    def mesh(self) -> DeviceMesh:
        return self._mesh

    @property
    def stream(self) -> Any:
        return self._stream

    def reduce(
        self,
        dims: str | Sequence[str],
        reduction: Reduction = "sum",
        scatter: bool = False,
        mesh: DeviceMesh | None = None,
        _inplace: bool = False,
    ) -> Tensor:
        """A collective over ``dims`` of the mesh: ``sum``/``avg``/``max``/``min`` leave every
        member the reduced tensor (``scatter``: its equal slice of dim 0); ``stack`` the members'
        tensors stacked on a new dim 0 (``scatter``: all-to-all, the shape stays). ``mesh``: a
        part of this tensor's mesh the result is left on (e.g. ``mesh.slice(gpus=0)``: reduce to
        one process)."""
        target = self._mesh if mesh is None else mesh
        if target != self._mesh:
            if target.client is not self._mesh.client or not set(target.ranks) <= set(
                self._mesh.ranks
            ):
                raise ValueError(
                    f"reduce(mesh={target!r}): the result mesh must be part of {self._mesh!r}"
                )
            if _inplace:
                raise ValueError("reduce_ keeps the tensor on its mesh: mesh= is not allowed")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        groups = self._mesh.groups(names)
        size = len(groups[0])
        shape = list(self._fake.shape)
        if scatter and (not shape or shape[0] % size):
            raise ValueError(
                f"reduce(scatter=True) over {size} members needs dim 0 divisible by {size}, "
                f"got shape {tuple(shape)}"
            )
        if reduction == "stack":
            out_shape = shape if scatter else [size, *shape]
        else:
            out_shape = [shape[0] // size, *shape[1:]] if scatter else shape
        if _inplace and out_shape != shape:
            raise ValueError(f"reduce_ cannot change the shape {tuple(shape)} to {out_shape}")
        client = self._mesh.client
        if size > 1:
            client.ensure_process_group()
        out_ref = None if _inplace else client.new_ref()
        command = (
            m.REDUCE,
            out_ref,
            self._ref,
            groups,
            reduction,
            scatter,
            tuple(shape),
            self._fake.dtype,
            issued_at(),
        )
        client.send(self._mesh.rank_set, command, self._stream)
        if out_ref is None:
            return self
        if target != self._mesh:  # the result stays on the target's processes only
            elsewhere = frozenset(self._mesh.ranks) - frozenset(target.ranks)
            client.send(elsewhere, (m.DEL, (out_ref,)), self._stream)
        fake = meta_empty(out_shape, self._fake.dtype)
        return Tensor(fake, target, out_ref, self._stream)

    def to_mesh(self, mesh: Any, stream: Any = None) -> Tensor:
        """``monarch.to_mesh(self, mesh, stream)``: a copy on ``mesh`` (dimensions by name)."""
        return cast(Tensor, MOVES["to_mesh"](self, mesh, stream))

    def slice_mesh(self, **coords: int | slice) -> Tensor:
        """``monarch.slice_mesh(self, **coords)``: this tensor on the slice of its mesh."""
        return cast(Tensor, MOVES["slice_mesh"](self, **coords))

    def reduce_(
        self,
        dims: str | Sequence[str],
        reduction: Reduction = "sum",
        scatter: bool = False,
        mesh: DeviceMesh | None = None,
    ) -> Tensor:
        return self.reduce(dims, reduction, scatter, mesh, _inplace=True)


def reduce(
    tensors: Any,
    dims: str | Sequence[str],
    reduction: Reduction = "sum",
    scatter: bool = False,
    mesh: DeviceMesh | None = None,
    _inplace: bool = False,
) -> Any:
    """``Tensor.reduce`` on every tensor of a pytree."""
    return tree_map(
        lambda t: (
            t.reduce(dims, reduction, scatter, mesh, _inplace) if isinstance(t, Tensor) else t
        ),
        tensors,
    )


def reduce_(
    tensors: Any,
    dims: str | Sequence[str],
    reduction: Reduction = "sum",
    scatter: bool = False,
    mesh: DeviceMesh | None = None,
) -> Any:
    return reduce(tensors, dims, reduction, scatter, mesh, _inplace=True)


def mesh_of(leaves: Sequence[Any]) -> DeviceMesh | None:
    """The mesh the distributed tensors among ``leaves`` share (``ValueError`` if several)."""
    found: DeviceMesh | None = None
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            if found is None:
                found = leaf._mesh
            elif leaf._mesh != found:
                raise ValueError(
                    f"an operation mixes tensors of different meshes ({found!r} and "
                    f"{leaf._mesh!r}); move them with to_mesh first"
                )
    return found


def streams_of(leaves: Sequence[Any], *more: Any) -> tuple[int, ...]:
    """The ids of the streams of the distributed tensors among ``leaves`` and of ``more``: what
    a fetch of them waits for on the workers."""
    found = {stream_id(leaf._stream) for leaf in leaves if isinstance(leaf, Tensor)}
    found.update(stream_id(s) for s in more)
    return tuple(sorted(found))


def meta_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A plain meta tensor, even where a mesh is active (there ``torch.empty`` would make a
    distributed tensor, whose later use as a fake would send operations to the workers)."""
    with no_mesh.activate():
        return torch.empty(tuple(shape), dtype=dtype, device="meta")


def to_meta(leaf: Any) -> Any:
    if isinstance(leaf, Tensor):
        return leaf._fake
    if isinstance(leaf, torch.Tensor):
        return leaf.detach().to("meta")
    return leaf


def to_message(leaf: Any) -> Any:
    if isinstance(leaf, Tensor):
        return m.Ref(leaf._ref)
    return leaf


def _check_streams(leaves: Sequence[Any], stream: Any) -> None:
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            check_usable(leaf, stream)


def dispatch(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on the client's meta tensors and send it to the workers."""
    if func.namespace in _CLIENT_ONLY_NAMESPACES:
        with no_mesh.activate():
            return func(*args, **kwargs)
    flat, _ = tree_flatten((args, kwargs))
    mesh = mesh_of(flat)
    active = active_mesh()
    if mesh is None:
        if active is None or func in _NEEDS_VALUE:  # no mesh, or a local tensor's value
            with no_mesh.activate():
                return func(*args, **kwargs)
        mesh = active
    elif active is not None and active.client is not mesh.client:
        raise ValueError(
            f"{func}: tensors are on {mesh!r} but the active mesh is {active!r}; "
            "use to_mesh or activate their mesh"
        )
    if func in _NEEDS_VALUE:
        raise RuntimeError(
            f"{func} needs the value of a distributed tensor on the client: use "
            "fetch_shard(t, **coords).get() or inspect(t)"
        )
    stream = get_active_stream()
    _check_streams(flat, stream)
    meta_args, meta_kwargs = tree_map(to_meta, (args, kwargs))
    if not any(isinstance(leaf, torch.Tensor) for leaf in flat) and any(
        a.name == "device" for a in func._schema.arguments
    ):
        meta_kwargs = {**meta_kwargs, "device": "meta"}
    with no_mesh.activate():
        result = func(*meta_args, **meta_kwargs)
    inputs = {id(leaf._fake): leaf for leaf in flat if isinstance(leaf, Tensor)}
    out_leaves, out_spec = tree_flatten(result)
    client = mesh.client
    outs: list[int | None] = []
    mutated: list[int] = []
    wrapped: list[Any] = []
    for leaf in out_leaves:
        if isinstance(leaf, torch.Tensor):
            alias = inputs.get(id(leaf))
            if alias is not None:  # in place (or out=): the input tensor itself
                outs.append(None)
                mutated.append(alias._ref)
                wrapped.append(alias)
                continue
            ref = client.new_ref()
            outs.append(ref)
            wrapped.append(Tensor(leaf, mesh, ref, stream))
        else:
            outs.append(None)
            wrapped.append(leaf)
    message_args, message_kwargs = tree_map(to_message, (args, kwargs))
    client.send(
        mesh.rank_set,
        (
            m.OP,
            tuple(outs),
            tuple(mutated),
            func.name(),
            message_args,
            message_kwargs,
            issued_at(),
        ),
        stream,
    )
    return tree_unflatten(wrapped, out_spec)
