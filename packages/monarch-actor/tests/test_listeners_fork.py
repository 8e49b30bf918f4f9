"""A process forked while another thread holds the listeners' lock can still add and remove
span and supervision-record listeners (the child gets a new lock: ``listeners._after_fork``)."""

from __future__ import annotations

import os
import select
import signal
import threading

from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import listeners as tm_listeners
from monarch.actor._runtime.telemetry import tracing as tm_tracing

TIMEOUT = 30.0


def test_a_child_forked_while_the_listeners_lock_is_held_adds_and_removes_listeners() -> None:
    """Fork while another thread holds the listeners' lock; the child adds and removes a span
    listener and a supervision-record listener and writes ``ok`` (bounded: a child stuck on the
    lock is killed and the answer is empty)."""
    lock = tm_listeners._listeners_lock
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(TIMEOUT)

    holder = threading.Thread(target=hold)
    holder.start()
    read, write = os.pipe()
    try:
        assert held.wait(TIMEOUT)
        pid = os.fork()
        if pid == 0:  # the child: use the listeners, answer, out without cleanup
            try:
                remove = tm.add_span_listener(lambda s: None)
                plain_with = tm_tracing._PLAIN
                remove()
                tm.add_supervision_listener(lambda r: None)()
                new = tm_listeners._listeners_lock is not lock
                ok = new and plain_with is False and tm_tracing._PLAIN is True
                os.write(write, b"ok" if ok else b"no")
            finally:
                os._exit(0)
    finally:
        release.set()
        holder.join(TIMEOUT)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], TIMEOUT)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        answer = os.read(read, 2) if ready else b""
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"ok"
