"""Actor classes for the lifecycle tests (importable by worker processes by module name)."""

from __future__ import annotations

import os
import threading

from monarch.actor import Actor, Port, endpoint

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


class Plain(Actor):
    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()
