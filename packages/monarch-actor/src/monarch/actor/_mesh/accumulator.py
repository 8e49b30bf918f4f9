"""``Accumulator``: fold the replies of ``stream()`` as they arrive.

Why: ``call()`` waits for every rank and keeps every value; a reduction only needs a running
total. ``accumulate`` sends at once (through the endpoint's ``stream``) and the returned future
folds ``combine(acc, value)`` left to right in arrival order, starting from ``identity``, when it
is observed (so user ``combine`` code runs in the caller's thread, never on the runtime loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from monarch.actor._base.future import Future, _all_done

__all__ = ["Accumulator"]

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[P, R, A]):
    """``Accumulator(endpoint, identity, combine).accumulate(*args) -> Future[A]``.

    ``endpoint`` is anything with a ``stream(*args, **kwargs)`` yielding ``Future``s (an actor
    mesh endpoint). An empty stream yields ``identity``; the first failing reply (in arrival
    order) fails the result.
    """

    def __init__(self, endpoint: Any, identity: A, combine: Callable[[A, R], A]) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        """Start the stream now; the future holds the fold of its replies."""
        futures: list[Future[R]] = list(self._endpoint.stream(*args, **kwargs))
        for future in futures:
            if not isinstance(future, Future):
                raise TypeError(f"stream() yielded {type(future).__name__}, not a Future")
        identity, combine = self._identity, self._combine

        def fold(_: object) -> A:
            acc = identity
            for future in futures:
                acc = combine(acc, future._outcome())
            return acc

        return Future._create(_all_done([f._cell for f in futures]), fold)
