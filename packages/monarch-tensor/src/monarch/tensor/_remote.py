"""``remote``: functions that run on every shard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from monarch.tensor import _messages as m
from monarch.tensor._context import active_mesh, issued_at, no_mesh
from monarch.tensor._stream import get_active_stream
from monarch.tensor._tensor import Tensor, mesh_of, to_message, to_meta
from monarch.tensor._worker import resolve_function

__all__ = ["Remote", "remote"]


class Remote:
    """A function called on every process of the mesh of its tensor arguments (else the active
    mesh), each call on that process's shards. ``propagate`` gives the outputs' shapes from
    meta tensors; without it the function itself runs on meta tensors on the client."""

    def __init__(self, target: Callable[..., Any] | str, propagate: Callable[..., Any] | None):
        self.target = target
        self.propagate = propagate
        self.__name__ = target if isinstance(target, str) else getattr(target, "__name__", "f")

    def _local(self) -> Callable[..., Any]:
        return resolve_function(self.target) if isinstance(self.target, str) else self.target

    def __repr__(self) -> str:
        return f"remote({self.__name__})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = tree_flatten((args, kwargs))[0]
        mesh = mesh_of(flat)
        active = active_mesh()
        if mesh is None:
            mesh = active
        if mesh is None:
            return self._local()(*args, **kwargs)
        meta_args, meta_kwargs = tree_map(to_meta, (args, kwargs))
        shaper = self.propagate if self.propagate is not None else self._local()
        with no_mesh.activate():
            try:
                result = shaper(*meta_args, **meta_kwargs)
            except Exception as exc:
                raise RuntimeError(
                    f"{self!r}: computing the output shapes on meta tensors failed ({exc}); "
                    "give remote(..., propagate=fn) returning tensors of the outputs' shapes"
                ) from exc
        leaves, spec = tree_flatten(result)
        client = mesh.client
        stream = get_active_stream()
        outs: list[int | None] = []
        wrapped: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                ref = client.new_ref()
                fake = leaf if leaf.device.type == "meta" else leaf.detach().to("meta")
                outs.append(ref)
                wrapped.append(Tensor(fake, mesh, ref, stream))
            else:
                outs.append(None)
                wrapped.append(leaf)
        message_args, message_kwargs = tree_map(to_message, (args, kwargs))
        client.send(
            mesh.rank_set,
            (m.CALL, tuple(outs), (), self.target, message_args, message_kwargs, issued_at()),
        )
        return tree_unflatten(wrapped, spec)


def remote(
    function: Callable[..., Any] | str | None = None,
    *,
    propagate: Callable[..., Any] | None = None,
) -> Any:
    """``remote(fn)``, ``remote("module.function")``, or ``@remote(propagate=...)``."""
    if function is None:
        return lambda f: Remote(f, propagate)
    return Remote(function, propagate)
