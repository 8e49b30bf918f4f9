"""Actor classes for the lifecycle tests (importable by worker processes by module name)."""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from typing import Any

from monarch.actor import Actor, MeshFailure, Port, context, endpoint

_holds: dict[str, threading.Event] = {}
_holds_lock = threading.Lock()


def hold(key: str) -> threading.Event:
    """The event ``NeverReady(..., key)`` waits on in this process: an in-process test sets it
    when done so that the stuck thread ends. A fresh key per test: workers forked later from a
    copy of the client inherit the events already set."""
    with _holds_lock:
        return _holds.setdefault(key, threading.Event())


class NeverReady(Actor):
    """An ``__init__`` that does not return (until ``hold(key)`` is set in this process)."""

    def __init__(self, started: Port[int], key: str) -> None:
        started.send(os.getpid())
        hold(key).wait(120.0)

    @endpoint
    def ok(self) -> str:
        return "ok"


class Blocker(Actor):
    @endpoint
    def block(self, started: Port[int], key: str) -> str:
        """Does not return (until ``hold(key)`` is set in this process)."""
        started.send(os.getpid())
        hold(key).wait(120.0)
        return "returned"


class Plain(Actor):
    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()


class _WritesOnDelete:
    """Module-level state whose ``__del__`` leaves a trace (it runs when the interpreter
    finalizes, as Monarch's ``test_del_runs_on_proc_mesh_stop`` pins)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()

    # Late in finalization a module's globals and builtins are gone: keep ``open`` at hand.
    def __del__(self, _open: Any = open) -> None:
        with _open(self.path, "a") as f:
            f.write(f"__del__ {self.pid}\n")


_module_state: list[_WritesOnDelete] = []


def _write(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


class Finalized(Actor):
    """Registers, in its process, an ``atexit`` handler and a module-level ``__del__`` that
    write to ``path`` when the worker's interpreter ends."""

    def __init__(self, path: str) -> None:
        atexit.register(_write, path, f"atexit {os.getpid()}\n")
        _module_state.append(_WritesOnDelete(path))

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()


class HangsAtExit(Actor):
    """Registers an ``atexit`` handler that never returns: the worker cannot exit by itself."""

    def __init__(self) -> None:
        atexit.register(threading.Event().wait)

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()


class Child(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("child failure")

    @endpoint
    def ok(self) -> str:
        return "ok"


class AsyncOwner(Actor):
    """Owns a ``Child`` mesh; its ``__supervise__`` returns False or raises (``mode``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.child: Any = None

    @endpoint
    async def spawn_child(self) -> None:
        procs = context().actor_instance.proc_mesh
        assert procs is not None
        self.child = procs.spawn("child", Child)
        await self.child.initialized

    @endpoint
    async def fail_child_during_call(self) -> str:
        """The child dies while this call awaits (for good, unless the failure ends it)."""
        self.child.boom.broadcast()
        await asyncio.Event().wait()
        return "returned normally"

    def __supervise__(self, failure: MeshFailure) -> bool:
        if self.mode == "raise":
            raise RuntimeError("supervise raised on purpose")
        return False


class WatchfulOwner(Actor):
    """An async owner whose endpoint broadcasts to its child and awaits its own
    ``__supervise__``: the failure must reach it while that endpoint is in flight."""

    def __init__(self) -> None:
        self.child: Any = None
        self.failures: list[str] = []
        self.supervised: asyncio.Event | None = None

    @endpoint
    async def spawn_child(self) -> Any:
        procs = context().actor_instance.proc_mesh
        assert procs is not None
        self.child = procs.spawn("child", Child)
        await self.child.initialized
        return self.child

    @endpoint
    async def fail_child_and_wait(self) -> list[str]:
        self.supervised = asyncio.Event()
        self.child.boom.broadcast()  # fire and forget: nobody awaits the failure
        await self.supervised.wait()
        return self.failures

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        if self.supervised is not None:
            self.supervised.set()
        return True
