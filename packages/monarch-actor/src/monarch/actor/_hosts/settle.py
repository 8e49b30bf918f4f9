"""Client-wide entry points: the fault hook, shutdown, the supervision barrier.

Why a module of its own: these functions are looked up or replaced by users at module level
(``monarch.actor.unhandled_fault_hook = f``), so the facade re-exports them as plain functions
while the machinery stays in ``_runtime``. ``flush_supervision`` is test support (not in the
reference API, so not re-exported from ``monarch.actor``): import it from the public
``monarch.actor.testing``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from monarch.actor._base.envelope import ActorAddr, MessageKind
from monarch.actor._base.errors import MeshFailure
from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.loop import is_runtime_thread
from monarch.actor._runtime.client import (
    _Client,
    client,
    shutdown_client,
)
from monarch.actor._runtime.context import (
    _current,
)
from monarch.actor._runtime.proc import (
    FLUSH_ENDPOINT,
    FlushReport,
)
from monarch.actor._runtime.sinks import (
    OneSink,
    Reply,
)

__all__ = ["default_unhandled_fault_hook", "flush_supervision", "shutdown_context"]


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default ``unhandled_fault_hook``: exit with status 1.

    The runtime catches the ``SystemExit``, writes the failure report to stderr and interrupts
    the main thread with ``KeyboardInterrupt``, so ``atexit`` handlers run.
    """
    sys.exit(1)


def shutdown_context(timeout: float = 5.0) -> Future[None]:
    """Tear down the client: stop every mesh the root client owns, then the runtime loop.

    Idempotent (a second call resolves to ``None`` at once); bounded by ``timeout`` seconds per
    stop. Using the API again afterwards bootstraps a fresh client.
    """
    cell: _Cell[None] = _Cell()

    def run() -> None:
        try:
            shutdown_client(timeout)
        except BaseException as exc:
            cell.set_exception(exc)
        else:
            cell.set_result(None)

    threading.Thread(target=run, name="monarch-shutdown", daemon=True).start()
    return Future._create(cell)


def flush_supervision(timeout: float = 10.0) -> None:
    """Return once every supervision event already received or in flight has been delivered
    to its handler; ``TimeoutError`` after ``timeout`` seconds.

    Why: a test asserting that *no* fault reached the client (an owner handled it, a stop is
    no failure) needs to know that nothing more is coming; sleeping for a while only makes
    that likely. What "in flight" covers, in the order the barrier drains it:

    1. Process exits: a worker that died sends nothing; the host layer observes the exit (the
       reaper of a local worker) and queues the notices (``WorkerGroup.on_exit``). For every
       local worker whose OS process is gone (an unreaped zombie included) the barrier waits
       until the host layer has reported it (``exited`` is set after the notices are sent).
       Exits on attached hosts reach the client through their daemon's session and are not
       waited for.
    2. Every live process of the program (this client, its simulated processes, the live
       workers) gets a round trip: the request arrives behind what reached that process
       before (death notices sent in step 1 included: same sender, same path), a marker goes
       into every actor's mailbox behind the supervision events queued there, and the reply
       leaves once each actor handled its marker, after whatever handling them sent (an
       owner that did not handle a failure reports its own failure to *its* owner).
    3. Each reply carries the process's supervision envelopes sent and received per peer.
       An event sent from one worker to another travels on a path the round trips do not
       share, so the round repeats until, for every pair of processes that answered, what
       one sent equals what the other received: then nothing sent before the round is still
       on its way, and nothing handled in it sent more (a chain of owners settles in as many
       rounds as it has links).
    4. The root client: faults for ``unhandled_fault_hook`` run on the hook's thread; a
       marker goes through its queue behind them.

    Call it from the client's own threads (not from an actor: its marker would wait on the
    caller; nor from ``unhandled_fault_hook``: its hook marker would); an actor busy in a long
    endpoint delays the barrier until it takes its marker.
    """
    if is_runtime_thread() or _current() is not None:
        raise RuntimeError("flush_supervision() must be called from the client, not an actor")
    deadline = time.monotonic() + timeout
    c = client()
    if threading.current_thread() is c.root._hook_thread:  # it would wait for its own marker
        raise RuntimeError("flush_supervision() cannot be called from unhandled_fault_hook")
    while True:
        _settle_exits(c, deadline)
        if _consistent(_flush_round(c, deadline)):
            break
        if time.monotonic() >= deadline:  # rounds that answer but never agree
            raise TimeoutError(f"supervision traffic did not settle within {timeout} s")
    if not c.root.flush_hook(_left(deadline)):
        raise TimeoutError(f"the fault hook did not finish within {timeout} s")


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _os_gone(pid: int) -> bool:
    """True if the OS process ``pid`` has exited (a zombie counts; nothing is reaped here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no procfs: only a reaped process is known to be gone
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def _settle_exits(c: _Client, deadline: float) -> None:
    """Step 1 of ``flush_supervision``: wait until the host layer reported every local worker
    whose OS process is gone."""
    layer = c.node_layer
    with layer._lock:
        groups = list(layer.groups)
    for group in groups:
        popens: list[Any] = list(getattr(group, "popens", ()))  # local workers only
        exited = list(group.exited)
        for rank, popen in enumerate(popens[: len(exited)]):
            if exited[rank].is_set() or not _os_gone(popen.pid):
                continue
            if not exited[rank].wait(_left(deadline)):
                raise TimeoutError(f"the exit of worker os pid {popen.pid} was not reported")


def _flush_round(c: _Client, deadline: float) -> dict[bytes, FlushReport]:
    """Steps 2 and 3: one round trip to every live process; the reports of those that
    answered (a process that cannot be reached any more is gone, and left out)."""
    targets = [c.runtime.pid_raw]
    targets += [r.pid_raw for r in list(c.local_runtimes) if not r.stopped]
    layer = c.node_layer
    with layer._lock:
        groups = list(layer.groups)
    targets += [pid.raw for group in groups for pid in group.live_pids()]
    runtime, root = c.runtime, c.root
    cells: dict[bytes, tuple[_Cell[Reply], int]] = {}
    try:
        for pid in dict.fromkeys(targets):
            cell: _Cell[Reply] = _Cell()
            port = runtime.open_port(root, OneSink(cell))
            cells[pid] = (cell, port.index)
            runtime.post(
                runtime.agent,
                MessageKind.CALL,
                ActorAddr(pid, ""),
                endpoint=FLUSH_ENDPOINT,
                reply_port=port,
            )
        reports: dict[bytes, FlushReport] = {}
        for pid, (cell, _) in cells.items():
            if not cell.wait(_left(deadline)):
                raise TimeoutError(f"process {pid.hex()[:8]} did not answer flush_supervision")
            ok, reply = cell.outcome()
            if ok and reply.ok:
                reports[pid] = msgspec.msgpack.decode(reply.payload, type=FlushReport)
        return reports
    finally:
        for _, index in cells.values():
            runtime.close_port(index)


def _consistent(reports: dict[bytes, FlushReport]) -> bool:
    """True when, between every two processes that answered, the supervision envelopes one
    sent (net of bounces) equal those the other received: none is in flight."""
    for sender, report in reports.items():
        for receiver, other in reports.items():
            if report.sent.get(receiver.hex(), 0) != other.received.get(sender.hex(), 0):
                return False
    return True
