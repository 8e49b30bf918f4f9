"""``flush_supervision``: the barrier that makes "no fault reached the client" checkable.

In process (simulated processes share the client's loop, but each owner's ``__supervise__``
runs on its own actor thread, so without the barrier a fault may still be on its way when the
test looks). Multi-process uses are in test_procs_mesh.py and test_nested_spawn.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, MeshFailure, ProcMesh, endpoint
from monarch.actor._hosts.settle import _consistent
from monarch.actor._runtime.proc import FlushReport
from monarch.actor.testing import flush_supervision

Procs = Callable[..., ProcMesh]
T = 5.0


class Child(Actor):
    @endpoint
    def die(self) -> None:
        raise SystemExit("child down")  # a BaseException: the child fails

    @endpoint
    def ok(self) -> int:
        return 1


class Owner(Actor):
    """Spawns children (optionally on a proc mesh it was given) and decides what a failure
    is worth; ``slow`` makes ``__supervise__`` take a while, so the fault is late."""

    def __init__(self, handles: bool, slow: float = 0.0) -> None:
        self.handles = handles
        self.slow = slow
        self.children: Any = None
        self.done = threading.Event()

    @endpoint
    def spawn(self, procs: ProcMesh) -> None:
        self.children = procs.spawn("children", Child)
        self.children.ok.call().get(timeout=T)

    @endpoint
    def spawn_owner(self, procs: ProcMesh, handles: bool) -> None:
        self.children = procs.spawn("inner", Owner, handles, self.slow)

    @endpoint
    def kill_child(self) -> None:
        self.children.die.broadcast()

    @endpoint
    def kill_grandchild(self, procs: ProcMesh) -> None:
        self.children.spawn.call_one(procs).get(timeout=T)
        self.children.kill_child.call_one().get(timeout=T)

    def __supervise__(self, failure: MeshFailure) -> bool:
        if self.slow:
            self.done.wait(self.slow)  # never set: a plain delay on the actor thread
        return self.handles


class AsyncOwner(Actor):
    """``Owner`` as an async actor: ``__supervise__`` runs as a task there."""

    def __init__(self, handles: bool, slow: float = 0.0) -> None:
        self.handles = handles
        self.slow = slow
        self.children: Any = None

    @endpoint
    async def spawn(self, procs: ProcMesh) -> None:
        self.children = procs.spawn("children", Child)
        await self.children.ok.call()

    @endpoint
    async def kill_child(self) -> None:
        self.children.die.broadcast()

    async def __supervise__(self, failure: MeshFailure) -> bool:
        await asyncio.sleep(self.slow)
        return self.handles


class Flusher(Actor):
    @endpoint
    def flush(self) -> str:
        try:
            flush_supervision(T)
        except RuntimeError as error:
            return str(error)
        return "flushed"


@pytest.mark.parametrize("owner_class", [Owner, AsyncOwner])
@pytest.mark.parametrize("handles", [True, False])
def test_a_late_unhandled_failure_is_in_the_hook_after_the_flush(
    procs: Procs, faults: Any, owner_class: type[Actor], handles: bool
) -> None:
    mesh = procs(gpus=1)
    owner: Any = mesh.spawn("owner", owner_class, handles, 0.2)
    owner.spawn.call_one(procs(gpus=2)).get(timeout=T)
    owner.kill_child.call_one().get(timeout=T)  # the children fail; __supervise__ is slow
    settled = faults.settled(T)
    if handles:
        assert settled == []
    else:
        assert len(settled) == 1, settled  # the owner failed in turn: the root heard of it
        assert "owner" in str(settled[0])


def test_a_chain_of_owners_settles(procs: Procs, faults: Any) -> None:
    """The outer owner's failure is caused by the inner owner's: two hops, each slow."""
    outer: Any = procs(gpus=1).spawn("outer", Owner, False, 0.1)
    outer.spawn_owner.call_one(procs(gpus=1), False).get(timeout=T)
    outer.kill_grandchild.call_one(procs(gpus=1)).get(timeout=T)
    settled = faults.settled(T)
    assert len(settled) == 1, settled
    assert "outer" in str(settled[0])


def test_flush_with_nothing_pending_returns_and_refuses_actor_threads(
    procs: Procs, faults: Any
) -> None:
    flush_supervision(T)
    assert faults.failures == []

    flusher: Any = procs(gpus=1).spawn("flusher", Flusher)
    assert "not an actor" in flusher.flush.call_one().get(timeout=T)


_PIDS = st.sampled_from([bytes([n]) * 16 for n in range(4)])
_COUNTS = st.dictionaries(st.tuples(_PIDS, _PIDS), st.integers(0, 5))


@given(_COUNTS, _COUNTS)
def test_rounds_agree_exactly_when_nothing_is_in_flight(
    delivered: dict[tuple[bytes, bytes], int], in_flight: dict[tuple[bytes, bytes], int]
) -> None:
    """``_consistent`` over reports built from what each pair (sender, receiver) delivered and
    what is still on its way: they agree exactly when nothing is."""
    pids = {p for pair in [*delivered, *in_flight] for p in pair}
    reports = {
        pid: FlushReport(
            {
                r.hex(): delivered.get((pid, r), 0) + in_flight.get((pid, r), 0)
                for r in pids
                if (pid, r) in delivered or (pid, r) in in_flight
            },
            {s.hex(): delivered[(s, pid)] for s in pids if (s, pid) in delivered},
        )
        for pid in pids
    }
    assert _consistent(reports) == (sum(in_flight.values()) == 0)
    for report in reports.values():  # and the report survives the wire
        wire = msgspec.msgpack.encode(report)
        assert msgspec.msgpack.decode(wire, type=FlushReport) == report


def test_a_round_that_never_agrees_ends_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review fix: the rounds repeated with no deadline check of their own, so rounds that
    answered at once but never agreed (counts lost to the per-peer bound, say) spun forever."""
    from monarch.actor._hosts import settle

    one, two = bytes([1]) * 16, bytes([2]) * 16
    never_agree = {one: FlushReport({two.hex(): 1}, {}), two: FlushReport({}, {})}
    monkeypatch.setattr(settle, "_flush_round", lambda c, deadline: never_agree)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            flush_supervision(0.2)
        except BaseException as error:
            outcome.append(error)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(T)
    assert outcome, "flush_supervision did not return after its timeout"
    assert isinstance(outcome[0], TimeoutError), outcome


def test_flush_from_the_fault_hook_is_refused(
    procs: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review fix: from ``unhandled_fault_hook`` the barrier waited for its own marker in the
    hook's queue, behind the hook call making it: a ``TimeoutError`` naming a slow hook."""
    import monarch.actor

    seen: list[BaseException | None] = []
    called = threading.Event()

    def hook(failure: MeshFailure) -> None:
        try:
            flush_supervision(1.0)
        except BaseException as error:
            seen.append(error)
        else:
            seen.append(None)
        called.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
    child: Any = procs(gpus=1).spawn("child", Child)
    child.die.broadcast()  # owned by the client: the fault goes to the hook
    assert called.wait(T)
    assert isinstance(seen[0], RuntimeError), seen
    assert "unhandled_fault_hook" in str(seen[0])
