"""Streams: named orders of work. Each tensor belongs to the stream that was active when it was
made; using it on another stream needs a borrow, which the client tracks (a mutable borrow
makes the original unusable until dropped). On the workers each stream is an ordering domain
(its own thread: different streams' work overlaps); a borrow makes the borrowing stream wait
for the lender's work issued before it, and ``drop()`` makes the lender's later work wait for
the borrower's work issued before the drop (the reference's BorrowCreate/BorrowDrop)."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from monarch.tensor._tensor import Tensor

__all__ = ["Borrow", "Stream", "check_usable", "get_active_stream", "stream_id"]

_ids = itertools.count(1)


class Stream:
    """A named stream of work (``with stream.activate():``)."""

    def __init__(self, name: str) -> None:
        if not name:
            raise ValueError("a stream needs a name")
        self.name = name
        #: The workers' name for it (``0``: the main stream).
        self.sid = next(_ids)

    def __repr__(self) -> str:
        return f"stream {self.name!r}"

    @contextlib.contextmanager
    def activate(self) -> Iterator[Stream]:
        _active.stack.append(self)
        try:
            yield self
        finally:
            _active.stack.pop()

    def borrow(self, t: Tensor, mutable: bool = False) -> tuple[Tensor, Borrow]:
        """``t`` made usable on this stream: the borrowed tensor and the borrow to ``drop()``.
        Until then ``t`` is read-only on its own stream (unusable if ``mutable``)."""
        if t._stream is self:
            raise ValueError(f"{t!r} is already on {self!r}")
        with self.activate(), t._mesh.activate():
            check_usable(t, t._stream, borrowing=True)
            t._mesh.client.sync(t._mesh.rank_set, t._stream, self)
            with _lending(t):
                alias = torch_alias(t)
        if getattr(alias, "_stream", None) is not self:  # not a distributed tensor of ours
            raise TypeError(f"borrowing {t!r} made {type(alias).__name__}, not a monarch.Tensor")
        borrow = Borrow(t, alias, mutable)
        t._lent_to = borrow
        alias._borrowed_by = borrow
        return alias, borrow


def torch_alias(t: Tensor) -> Any:
    return torch.ops.aten.alias.default(t)


class Borrow:
    """A tensor lent to another stream; ``drop()`` returns it."""

    def __init__(self, origin: Tensor, borrowed: Tensor, mutable: bool) -> None:
        self.origin = origin
        self.borrowed = borrowed
        self.mutable = mutable
        self.dropped = False

    def drop(self) -> None:
        """End the borrow (again: nothing): the lender's later work waits for the borrower's
        work issued before now."""
        if self.dropped:
            return
        self.dropped = True
        mesh = self.origin._mesh
        mesh.client.sync(mesh.rank_set, self.borrowed._stream, self.origin._stream)

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()


class _ActiveStream(threading.local):
    def __init__(self) -> None:
        self.stack: list[Stream] = []


_active = _ActiveStream()
_main = Stream("main")
_main.sid = 0
_lent = threading.local()


@contextlib.contextmanager
def _lending(t: Tensor) -> Iterator[None]:
    _lent.ref = t._ref
    try:
        yield
    finally:
        _lent.ref = None


def stream_id(stream: Any) -> int:
    """The workers' name for ``stream`` (the main stream: 0)."""
    return int(getattr(stream, "sid", 0))


def get_active_stream() -> Stream:
    """The stream operations issued now belong to (``main`` by default)."""
    stack = _active.stack
    return stack[-1] if stack else _main


def check_usable(t: Tensor, stream: Stream, *, borrowing: bool = False) -> None:
    if getattr(_lent, "ref", None) == t._ref:
        return
    mine = getattr(t, "_borrowed_by", None)
    if mine is not None and mine.dropped:
        raise RuntimeError(f"{t!r} is a borrow that was dropped")
    borrow = getattr(t, "_lent_to", None)
    if borrow is not None and borrow.mutable and not borrow.dropped:
        raise RuntimeError(f"{t!r} is lent mutably to {borrow.borrowed._stream!r}; drop it first")
    if t._stream is not stream and not borrowing:
        raise RuntimeError(
            f"{t!r} belongs to {t._stream!r} but the active stream is {stream!r}: "
            "borrow it with stream.borrow(t)"
        )
