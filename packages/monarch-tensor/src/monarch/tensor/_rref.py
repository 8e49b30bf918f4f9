"""``endpoint.rref(...)``: actor endpoints inside the tensor engine's order.

The call is a command of the batch: each tensor worker, when it reaches it, calls the endpoint of
the actor on its own process with the local shards of the distributed arguments and waits for
the reply, so the actor sees every earlier operation done and no later one; the tensors it
returns become the shards of the result, whose shapes the endpoint's ``propagate`` gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from monarch.tensor import _messages as m
from monarch.tensor._context import active_mesh, issued_at, no_mesh
from monarch.tensor._stream import get_active_stream
from monarch.tensor._tensor import Tensor, mesh_of, meta_empty, to_message, to_meta

__all__ = ["rref"]


def rref(
    actors: Any,
    name: str,
    propagate: Callable[..., Any] | str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The tensor engine's ``Endpoint.rref`` (registered with monarch-actor)."""
    flat = tree_flatten((args, kwargs))[0]
    mesh = mesh_of(flat) or active_mesh()
    if mesh is None:
        raise RuntimeError(
            f"{name}.rref() needs an active mesh (with proc_mesh.activate():) or distributed "
            "tensor arguments"
        )
    # The reference's propagators for endpoints: no "cached" (its default), no "mocked";
    # "inspect": nothing comes back (the endpoint still runs on every process).
    if propagate is None or propagate == "cached":
        raise NotImplementedError("Cached propagation is not implemented for actor endpoints.")
    if propagate == "mocked":
        raise NotImplementedError("mocked propagation")
    if propagate == "inspect":
        message_args, message_kwargs = tree_map(to_message, (args, kwargs))
        mesh.client.send(
            mesh.rank_set,
            (m.RREF, None, (), (actors, name), message_args, message_kwargs, issued_at()),
            get_active_stream(),
        )
        return None
    if not callable(propagate):
        raise TypeError(f"'{type(propagate).__name__}' object is not callable")
    with no_mesh.activate():
        meta_args, meta_kwargs = tree_map(to_meta, (args, kwargs))
        result = propagate(*meta_args, **meta_kwargs)
    leaves, spec = tree_flatten(result)
    client = mesh.client
    stream = get_active_stream()
    outs: list[int | None] = []
    wrapped: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            ref = client.new_ref()
            fake = leaf if leaf.device.type == "meta" else meta_empty(leaf.shape, leaf.dtype)
            outs.append(ref)
            wrapped.append(Tensor(fake, mesh, ref, stream))
        else:
            outs.append(None)
            wrapped.append(leaf)
    message_args, message_kwargs = tree_map(to_message, (args, kwargs))
    client.send(
        mesh.rank_set,
        (m.RREF, tuple(outs), (), (actors, name), message_args, message_kwargs, issued_at()),
        stream,
    )
    return tree_unflatten(wrapped, spec)
