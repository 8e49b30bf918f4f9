"""``Future[R]``: one result, waited on from synchronous code or from any asyncio loop.

Why this design: the runtime completes results on its own loop thread, while callers wait from
three kinds of places: a plain thread (the client script, a sync actor), an asyncio loop the user
runs (``asyncio.run(main())``), or an async actor's loop. So a future is two layers:

- ``_Cell``: a thread-safe one-shot slot the runtime fills with a *raw* outcome (for example the
  undecoded reply bytes) and that any thread can wait on or attach a callback to.
- ``Future``: the user handle. On first observation (``get``, ``await``, ``as_asyncio``) it
  turns the raw outcome into the user's value with its ``decode`` function, in the observing
  thread, and caches the result: later observations return the same value or re-raise the
  *same* exception object. Decoding user values (unpickling, which may run user
  ``__setstate__`` code) therefore never runs on the runtime loop.

Semantics (the reference's ``test_future_characterization``): direct construction raises
``TypeError``; ``get(timeout)`` raises ``TimeoutError`` without cancelling anything; invalid
timeouts raise ``ValueError`` before waiting; ``get()`` inside a running asyncio loop works but
warns (``UserWarning``); ``await`` works any number of times, mixed with ``get()``; awaiting with
no running loop raises ``ValueError`` and leaves the future usable; ``as_asyncio()`` needs a
running loop (``RuntimeError``) and returns a fresh ``asyncio.Future`` each call. Blocking on a
pending future from the runtime loop thread itself raises ``RuntimeError`` (it would deadlock).
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar, cast

from monarch.actor._base.loop import is_runtime_thread
from monarch.config import _registry as _config

__all__ = ["Future"]

R = TypeVar("R")
T = TypeVar("T")
_log = logging.getLogger("monarch.actor.future")

_PENDING, _OK, _ERROR = 0, 1, 2
_MAIN_WAIT_SLICE = 0.1  # the main thread waits in slices so KeyboardInterrupt gets through
#: The spin before a blocking wait (``future_spin_wait``): its clock (nanoseconds) and how a
#: poll gives way; module attributes so a test can count the polls with a clock of its own.
_spin_clock = time.monotonic_ns
_spin_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))


class _Cell(Generic[T]):
    """A thread-safe, write-once outcome with blocking waits and done callbacks."""

    __slots__ = ("_callbacks", "_gate", "_lock", "_state", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Made by the first wait that finds the cell pending (most cells of a pipelining caller
        # complete before anyone waits): a raw lock held while the cell is pending, released
        # once by the completion; each waiter takes it and passes it on at once. Cheaper than
        # a ``threading.Event``, whose wait makes a ``Condition`` waiter lock and whose set
        # runs Python under the condition's lock that the woken waiter must take again (a
        # second hand-off between the runtime loop's thread and the caller's, per call).
        self._gate: Any = None
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._state != _PENDING

    def _complete(self, state: int, value: Any) -> bool:
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = state
            self._value = value
            callbacks, self._callbacks = self._callbacks, []
            gate = self._gate
        if gate is not None:
            gate.release()  # the one release: held since the first wait made it
        for callback in callbacks:
            _run_callback(callback)
        return True

    def set_result(self, value: T) -> bool:
        """Complete with a value; False if already complete (first completion wins)."""
        return self._complete(_OK, value)

    def set_exception(self, exc: BaseException) -> bool:
        """Complete with an exception; False if already complete."""
        return self._complete(_ERROR, exc)

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once complete: now (this thread) or in the completing thread."""
        with self._lock:
            if self._state == _PENDING:
                self._callbacks.append(callback)
                return
        _run_callback(callback)

    def wait(self, timeout: float | None) -> bool:
        """Block until complete or ``timeout`` seconds passed; True if complete."""
        if self._state != _PENDING:
            return True
        if timeout != 0:
            if timeout is None:
                if self._spin(None):
                    return True
            else:
                start = _spin_clock()
                if self._spin(timeout):
                    return True
                # the poll's time comes off the timeout (a wait never overruns it)
                timeout = max(0.0, timeout - (_spin_clock() - start) / 1e9)
        with self._lock:
            if self._state != _PENDING:
                return True
            gate = self._gate
            if gate is None:
                gate = self._gate = _thread.allocate_lock()
                gate.acquire()  # held until ``_complete`` releases it
        if threading.current_thread() is not threading.main_thread():
            if gate.acquire(True, -1 if timeout is None else timeout):
                try:  # noqa: SIM105 (no context manager on the hot path)
                    gate.release()  # open for the next waiter
                except RuntimeError:
                    pass  # reopened already by an interrupted main-thread waiter
                return True
            return self._state != _PENDING
        # Main thread: wait in slices so an interrupt (unhandled fault) is raised promptly.
        remaining = math.inf if timeout is None else timeout
        try:
            while remaining > 0:
                step = min(remaining, _MAIN_WAIT_SLICE)
                if gate.acquire(True, step):
                    try:  # noqa: SIM105 (no context manager on the hot path)
                        gate.release()
                    except RuntimeError:
                        pass  # reopened already by an interrupted waiter (below)
                    return True
                remaining -= step
        except BaseException:
            # An interrupt (a signal handler's exception) may come between taking the gate and
            # passing it on: once the cell is complete, its gate is open for good, so open it
            # (a waiter that held it in transit then finds it open: the ``RuntimeError``
            # above); a pending cell's gate is left held for its completion.
            if self._state != _PENDING:
                with contextlib.suppress(RuntimeError):
                    gate.release()
            raise
        return self._state != _PENDING

    def _spin(self, timeout: float | None) -> bool:
        """Poll for at most ``future_spin_wait`` (and ``timeout``) before a blocking wait;
        True once complete. Each poll yields the CPU and the GIL (``os.sched_yield``): the
        thread completing the cell runs in the meantime, and finds no sleeper to wake."""
        window = float(_config.get("future_spin_wait"))
        if window <= 0:
            return False
        if timeout is not None and timeout < window:
            window = timeout
        clock = _spin_clock
        give_way = _spin_yield
        end = clock() + int(window * 1e9)
        while self._state == _PENDING:
            if clock() >= end:
                return False
            give_way()
        return True

    def outcome(self) -> tuple[bool, Any]:
        """``(ok, value_or_exception)`` of a completed cell."""
        if self._state == _PENDING:
            raise RuntimeError("cell is not complete")
        return self._state == _OK, self._value


def _run_callback(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        _log.exception("future callback failed")


def _all_done(cells: Sequence[_Cell[Any]]) -> _Cell[None]:
    """A cell completed (with ``None``) once every cell in ``cells`` is complete."""
    joined: _Cell[None] = _Cell()
    if not cells:
        joined.set_result(None)
        return joined
    remaining = [len(cells)]
    lock = threading.Lock()

    def one_done() -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            joined.set_result(None)

    for cell in cells:
        cell.add_done_callback(one_done)
    return joined


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
    if math.isnan(timeout) or math.isinf(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a finite, non-negative number, got {timeout!r}")


def _identity(value: Any) -> Any:
    return value


class Future(Generic[R]):
    """The result of an asynchronous operation: ``get()`` from sync code, ``await`` in async.

    The operation started when the future was created; the future only governs how the caller
    waits. Outcomes are cached: repeated ``get``/``await`` return the same value or re-raise the
    same exception object.
    """

    __slots__ = ("__weakref__", "_cell", "_decode", "_error", "_lock", "_resolved", "_value")

    _cell: _Cell[Any]
    _decode: Callable[[Any], R]
    _lock: threading.Lock
    _resolved: bool
    _value: Any
    _error: BaseException | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "monarch.actor.Future cannot be constructed directly; futures are returned by "
            "endpoint adverbs, ports and mesh operations"
        )

    @classmethod
    def _create(cls, cell: _Cell[Any], decode: Callable[[Any], R] | None = None) -> Future[R]:
        self = object.__new__(cls)
        self._cell = cell
        # ``cast`` with a string: ``Callable[[Any], R]`` spelled out is built at run time, on
        # every future made without a decoder (about 0.6 us each)
        self._decode = decode if decode is not None else cast("Callable[[Any], R]", _identity)
        self._lock = threading.Lock()
        self._resolved = False
        self._value = None
        self._error = None
        return self

    @classmethod
    def _completed(cls, value: R) -> Future[R]:
        cell: _Cell[R] = _Cell()
        cell.set_result(value)
        return cls._create(cell)

    @classmethod
    def _failed(cls, exc: BaseException) -> Future[R]:
        cell: _Cell[Any] = _Cell()
        cell.set_exception(exc)
        return cls._create(cell)

    # -- observation -------------------------------------------------------------------------
    def done(self) -> bool:
        """True once the outcome is available (``get`` would not block)."""
        return self._cell.done()

    def _outcome(self) -> R:
        with self._lock:
            if not self._resolved:
                ok, raw = self._cell.outcome()
                if ok:
                    try:
                        self._value = self._decode(raw)
                    except Exception as exc:  # a decode failure is the outcome
                        self._error = exc
                else:
                    self._error = raw
                self._resolved = True
        if self._error is not None:
            raise self._error
        return cast(R, self._value)

    def _wait(self, timeout: float | None) -> bool:
        if not self._cell.done() and is_runtime_thread():
            raise RuntimeError(
                "blocking on a monarch Future from the runtime loop thread would deadlock"
            )
        return self._cell.wait(timeout)

    def get(self, timeout: float | None = None) -> R:
        """Block until the outcome is available (at most ``timeout`` seconds) and return it.

        Raises the operation's exception; ``TimeoutError`` if it is not ready in time (the work
        goes on, a later ``get`` or ``await`` still sees it); ``ValueError`` for a negative,
        NaN or infinite timeout. Inside a running asyncio loop it works but warns.
        """
        _check_timeout(timeout)
        if not self._cell.done() and is_runtime_thread():
            raise RuntimeError(
                "blocking on a monarch Future from the runtime loop thread would deadlock"
            )
        if asyncio._get_running_loop() is not None:
            warnings.warn(
                "Future.get() was called from within a running asyncio event loop; it blocks "
                "the loop until the result arrives. Use 'await' instead.",
                UserWarning,
                stacklevel=2,
            )
        if not self._cell.wait(timeout):  # (``_wait``'s check made above)
            raise TimeoutError(f"monarch Future not ready after {timeout} s")
        return self._outcome()

    def result(self, timeout: float | None = None) -> R:
        """Alias of ``get`` (compatibility with ``concurrent.futures``)."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The operation's exception, or ``None`` if it succeeded (waits like ``get``)."""
        _check_timeout(timeout)
        if not self._wait(timeout):
            raise TimeoutError(f"monarch Future not ready after {timeout} s")
        try:
            self._outcome()
        except Exception as exc:
            return exc
        return None

    def __await__(self) -> Generator[Any, None, R]:
        loop = asyncio._get_running_loop()
        if loop is None:
            raise ValueError("__await__ with no active event loop")
        if not self._cell.done():
            waiter: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                with contextlib.suppress(RuntimeError):  # the awaiting loop is gone
                    loop.call_soon_threadsafe(_release, waiter)

            self._cell.add_done_callback(wake)
            yield from waiter.__await__()
        return self._outcome()

    def as_asyncio(self) -> asyncio.Future[R]:
        """A new ``asyncio.Future`` on the running loop that completes with this outcome.

        Raises ``RuntimeError`` when no loop is running (the future stays usable).
        """
        loop = asyncio.get_running_loop()
        target: asyncio.Future[R] = loop.create_future()

        def transfer() -> None:
            if target.done():
                return
            try:
                target.set_result(self._outcome())
            except Exception as exc:
                target.set_exception(exc)

        def schedule() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(transfer)

        self._cell.add_done_callback(schedule)
        return target

    def __repr__(self) -> str:
        state = "done" if self._cell.done() else "pending"
        return f"<monarch.actor.Future {state}>"


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
