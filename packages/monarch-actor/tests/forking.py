"""Shared by the fork tests: fork while another thread holds a lock and let the child prove
it can still work (the runtime's ``os.register_at_fork`` handlers give it new locks)."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

TIMEOUT = 30.0


def fork_while_held(lock: Any, child: Callable[[], bool]) -> bytes:
    """Fork while another thread holds ``lock``; the child runs ``child`` and writes ``ok``
    when it returns true, ``no`` otherwise, then leaves without cleanup. The parent's answer:
    those two bytes, or empty when the child was stuck (killed after ``TIMEOUT``)."""
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
        if pid == 0:  # the child: answer, out without cleanup
            try:
                os.write(write, b"ok" if child() else b"no")
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
            return b""
        return os.read(read, 2)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
