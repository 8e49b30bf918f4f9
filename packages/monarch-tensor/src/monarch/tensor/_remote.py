"""``remote``: functions that run on every shard.

``propagate`` says how the client learns the outputs (the reference's ``Propagator``): a
callable run on meta tensors; ``"cached"``: the function runs once on the first process of the
mesh (``call_and_fetch``) and the shapes, dtypes and non-tensor values of its result are kept
per distinct input (shapes, dtypes, other arguments); ``"inspect"``: nothing (the call returns
``None``, for functions whose result is fetched with ``call_on_shard_and_fetch``);
``"mocked"``: ``NotImplementedError``, as in the reference. ``None`` runs the function itself on
meta tensors (the reference's default is ``"cached"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from monarch.tensor import _messages as m
from monarch.tensor._context import active_mesh, issued_at, no_mesh
from monarch.tensor._errors import RemoteException
from monarch.tensor._mesh import ANSWER_TIMEOUT_S, DeviceMesh, refuse_in_coalescing
from monarch.tensor._stream import get_active_stream
from monarch.tensor._table import Failure
from monarch.tensor._tensor import Tensor, mesh_of, meta_empty, streams_of, to_message, to_meta
from monarch.tensor._worker import TensorSpec, resolve_function

__all__ = ["PROPAGATORS", "Remote", "check_propagate", "remote"]

#: The string propagators the reference accepts.
PROPAGATORS = ("cached", "inspect", "mocked")
#: The worker function behind ``propagate="cached"``.
PROPAGATE_FUNCTION = "monarch.tensor._worker.propagate_on_shard"
#: Distinct inputs a ``"cached"`` remote function keeps the outputs of (then it starts over).
MAX_CACHED = 1024


def check_propagate(propagate: Any) -> None:
    """The reference's errors for a propagator it cannot use: ``"mocked"`` is not implemented,
    and anything else that is neither a known string nor callable is called (``TypeError``)."""
    if propagate == "mocked":
        raise NotImplementedError("mocked propagation")
    if propagate is not None and propagate not in PROPAGATORS and not callable(propagate):
        raise TypeError(f"'{type(propagate).__name__}' object is not callable")


def _key_of(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        fake = leaf._fake if isinstance(leaf, Tensor) else leaf
        return ("tensor", tuple(fake.shape), fake.dtype, fake.requires_grad)
    try:
        hash(leaf)
    except TypeError:
        return ("repr", repr(leaf))
    return ("value", type(leaf), leaf)


class Remote:
    """A function called on every process of the mesh of its tensor arguments (else the active
    mesh), each call on that process's shards (see the module docstring for ``propagate``)."""

    def __init__(self, target: Callable[..., Any] | str, propagate: Any) -> None:
        self.target = target
        self.propagate = propagate
        self.__name__ = target if isinstance(target, str) else getattr(target, "__name__", "f")
        self._cache: dict[Any, Any] = {}

    def check_fetchable(self) -> None:
        """``call_on_shard_and_fetch`` checks the propagator as the reference does."""
        check_propagate(self.propagate)

    def _local(self) -> Callable[..., Any]:
        return resolve_function(self.target) if isinstance(self.target, str) else self.target

    def __repr__(self) -> str:
        return f"remote({self.__name__})"

    def _on_meta(self, args: Any, kwargs: Any) -> Any:
        shaper = self.propagate if callable(self.propagate) else self._local()
        with no_mesh.activate():
            meta_args, meta_kwargs = tree_map(to_meta, (args, kwargs))
            try:
                return shaper(*meta_args, **meta_kwargs)
            except Exception as exc:
                raise RuntimeError(
                    f"{self!r}: computing the output shapes on meta tensors failed ({exc}); "
                    "give remote(..., propagate=fn) returning tensors of the outputs' shapes, "
                    'or propagate="cached"'
                ) from exc

    def _cached(self, mesh: DeviceMesh, args: Any, kwargs: Any) -> Any:
        """The result's structure from a run on the mesh's first process (once per input)."""
        leaves, spec = tree_flatten((args, kwargs))
        key = (str(spec), tuple(_key_of(leaf) for leaf in leaves))
        found = self._cache.get(key)
        if found is None:
            refuse_in_coalescing("fetching results")
            mesh.client.flush()
            first = dict.fromkeys(mesh.names, 0)
            workers = mesh.workers.slice(**first) if first else mesh.workers
            message = tree_map(to_message, (args, kwargs))
            answer = workers.call_and_fetch.call_one(
                PROPAGATE_FUNCTION,
                (self.target, *message),
                {},
                issued_at(),
                streams_of(leaves, get_active_stream()),
            )
            with no_mesh.activate():
                status, found = answer.get(timeout=ANSWER_TIMEOUT_S)
            if status == "err":
                assert isinstance(found, Failure)
                raise RemoteException(found)
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[key] = found
        return tree_map(
            lambda v: meta_empty(v.shape, v.dtype) if isinstance(v, TensorSpec) else v,
            found,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = tree_flatten((args, kwargs))[0]
        mesh = mesh_of(flat)
        active = active_mesh()
        if mesh is None:
            mesh = active
        if mesh is None:
            return self._local()(*args, **kwargs)
        check_propagate(self.propagate)
        client = mesh.client
        message_args, message_kwargs = tree_map(to_message, (args, kwargs))
        if self.propagate == "inspect":  # runs everywhere; the client keeps nothing
            client.send(
                mesh.rank_set,
                (m.CALL, None, (), self.target, message_args, message_kwargs, issued_at()),
                get_active_stream(),
            )
            return None
        if self.propagate == "cached":
            result = self._cached(mesh, args, kwargs)
        else:
            result = self._on_meta(args, kwargs)
        leaves, spec = tree_flatten(result)
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
        client.send(
            mesh.rank_set,
            (m.CALL, tuple(outs), (), self.target, message_args, message_kwargs, issued_at()),
            stream,
        )
        return tree_unflatten(wrapped, spec)


def remote(function: Callable[..., Any] | str | None = None, *, propagate: Any = None) -> Any:
    """``remote(fn)``, ``remote("module.function")``, or ``@remote(propagate=...)``;
    ``propagate``: a callable, ``"cached"``, ``"inspect"``, ``"mocked"`` or ``None``."""
    if function is None:
        return lambda f: Remote(f, propagate)
    return Remote(function, propagate)
