"""The commands the client sends to the tensor workers, in order, batched (plain tuples: cheap
to pickle). Tensors inside arguments are replaced by :class:`Ref`.

``("op", outs, mutated, name, args, kwargs, issued_at)``: run the torch operator ``name``
(``aten::add.Tensor``); ``outs`` names each output leaf (``None``: not kept, e.g. the input an
in-place op returns; ``outs`` itself ``None``: nothing of the result is kept); ``mutated``
are the input refs it writes (failed with it).
``("call", outs, mutated, fn, args, kwargs, issued_at)``: a ``remote`` function (callable or
``"module.path"``).
``("rref", outs, mutated, (actor_mesh, endpoint), args, kwargs, issued_at)``: call the
endpoint of this process's actor with the local shards and wait for its reply.
``("del", refs)``: free.
``("reduce", out, src, groups, reduction, scatter, shape, dtype, issued_at)``: a collective
(``out`` None: in place) over the group
of ``groups`` holding this worker's rank. ``("send", src, dst_rank, issued_at)`` and
``("recv", out, src_rank, shape, dtype, issued_at)``: point-to-point (``to_mesh`` within one
process mesh). ``("push", src, inbox, coords, key, issued_at)``: send ``src``'s shard to the
``TensorInbox`` actor at ``coords`` of the actor mesh ``inbox`` (another process mesh) under
``key``; ``("take", out, key, shape, dtype, issued_at)``: wait for ``key`` in this process's
inbox and keep it as ``out`` (``to_mesh`` between process meshes).
``("signal", event)`` and ``("wait", event)``: the stream running ``wait`` goes on only after
the one running ``signal`` reached it (borrows, ``to_mesh`` onto another stream).

A batch is a list of ``(ranks, stream, command)``: ``ranks`` the root ranks it is for
(``None``: all), ``stream`` the id of the :class:`Stream` it runs on (``0``: main).
"""

from __future__ import annotations

__all__ = [
    "CALL",
    "DEL",
    "OP",
    "PUSH",
    "RECV",
    "REDUCE",
    "RREF",
    "SEND",
    "SIGNAL",
    "TAKE",
    "WAIT",
    "Ref",
]

OP = "op"
CALL = "call"
RREF = "rref"
DEL = "del"
REDUCE = "reduce"
SEND = "send"
RECV = "recv"
PUSH = "push"
TAKE = "take"
SIGNAL = "signal"
WAIT = "wait"


class Ref(int):
    """A tensor argument: the ref of a tensor in the worker's table."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Ref({int(self)})"
