"""Actors a process owns: spawned from a thread that runs no actor (``spawn_process_actor``).

Why: monarch-rdma's managers (the net provider's, the ibverbs provider's, the CUDA staging
manager) serve every buffer of their process, so the process must own them, not whichever
actor happened to ask first (whose stop would stop them too).
"""

from __future__ import annotations

import threading
from typing import Any

from monarch.actor import this_proc

__all__ = ["spawn_process_actor"]


def spawn_process_actor(name: str, actor_class: type, what: str) -> Any:
    """Spawn ``actor_class`` in this process from a thread that runs no actor, so the process
    (not the actor that asked first) owns it and it outlives that actor; a failure is a
    ``RuntimeError`` naming ``what``. (The net provider's managers, the ibverbs provider's and
    the CUDA staging manager.)"""
    result: list[Any] = []
    failure: list[BaseException] = []

    def spawn() -> None:
        try:
            result.append(this_proc().spawn(name, actor_class))
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)

    thread = threading.Thread(target=spawn, name=f"monarch-rdma-spawn-{name}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise RuntimeError(f"cannot start {what}: {failure[0]!r}") from failure[0]
    return result[0]
