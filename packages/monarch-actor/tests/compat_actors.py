"""Actor classes for ``test_compat.py`` (importable by the worker processes by module name)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from monarch.actor import Actor, Port, current_rank, endpoint


class Echo(Actor):
    """Runs what it is given; answers with values a plain pickler cannot carry."""

    @endpoint
    def apply(self, fn: Callable[[int], Any], x: int) -> Any:
        return fn(x)

    @endpoint
    def make_adder(self, n: int) -> Callable[[int], int]:
        return lambda x: x + n  # a lambda closing over ``n``: back to the caller

    @endpoint
    def make_local_object(self, value: int) -> Any:
        class Local:  # a class local to this method: pickled by value
            def __init__(self, value: int) -> None:
                self.value = value

            def doubled(self) -> int:
                return 2 * self.value

        return Local(value)

    @endpoint
    def rank(self) -> str:
        return str(current_rank())

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()

    @endpoint
    def argv0(self) -> str:
        return sys.argv[0]


class LateReplier(Actor):
    """``explicit_response_port=True`` endpoints that answer after they returned."""

    @endpoint(explicit_response_port=True)
    def from_thread(self, port: Port[int], x: int) -> None:
        threading.Thread(target=port.send, args=(2 * x,), name="late-reply").start()

    @endpoint(explicit_response_port=True)
    def error_from_thread(self, port: Port[int], message: str) -> None:
        threading.Thread(
            target=port.exception, args=(ValueError(message),), name="late-error"
        ).start()

    @endpoint
    def send_from_thread(self, port: Port[str], value: str) -> None:
        """Sends on a port the caller opened (``Channel.open``), from a thread of its own."""
        threading.Thread(target=port.send, args=(value,), name="late-send").start()
