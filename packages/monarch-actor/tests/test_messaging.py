"""Messaging end to end on the in-process runtime (behaviour catalogue 5.1 and 5.4)."""

from __future__ import annotations

import asyncio
import operator
import os
import pickle
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from monarch.actor import (
    Accumulator,
    Actor,
    ActorMesh,
    Channel,
    Future,
    Point,
    Port,
    ProcMesh,
    ValueMesh,
    as_endpoint,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    send,
    this_host,
    this_proc,
)
from monarch.actor._base.future import _Cell

Procs = Callable[..., ProcMesh]
T = 5.0  # every wait in this file is bounded by this many seconds


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value_ = start
        self.seen: list[int] = []
        self.local = threading.local()
        self.local.mark = "set in __init__"

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value_ += by

    @endpoint
    def value(self) -> int:
        return self.value_

    @endpoint
    def record(self, item: int) -> None:
        self.seen.append(item)

    @endpoint
    def recorded(self) -> list[int]:
        return self.seen

    @endpoint
    def where(self) -> tuple[dict[str, int], dict[str, int], str]:
        return dict(current_rank()), current_size(), str(current_rank())

    @endpoint
    def identity(self) -> tuple[str, str, dict[str, int], str, str | None]:
        instance = context().actor_instance
        creator = instance.creator.name if instance.creator else None
        return current_actor_name(), str(instance), dict(instance.rank), instance.name, creator

    @endpoint
    def thread_local(self) -> str:
        return str(self.local.mark)

    @endpoint
    def pid_and_thread(self) -> tuple[int, str]:
        return os.getpid(), threading.current_thread().name

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    def not_decorated(self) -> int:
        return 41


class AsyncCounter(Actor):
    def __init__(self) -> None:
        self.value_ = 0
        self.local = threading.local()
        self.local.mark = "async init"

    @endpoint
    async def incr(self, by: int = 1) -> None:
        await asyncio.sleep(0)
        self.value_ += by

    @endpoint
    async def value(self) -> int:
        return self.value_

    @endpoint
    async def thread_local(self) -> str:
        return str(self.local.mark)

    @endpoint
    async def choose_from(self, mesh: Any) -> int:
        return int(await mesh.value.choose())


class Caller(Actor):
    @endpoint
    def call_one_of(self, mesh: Any) -> int:
        return int(mesh.value.call_one().get(timeout=T))

    @endpoint
    def loop_and_warnings(self, mesh: Any) -> tuple[bool, list[str]]:
        try:
            asyncio.get_running_loop()
            visible = True
        except RuntimeError:
            visible = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mesh.value.call_one().get(timeout=T)
        return visible, [str(w.message) for w in caught]

    @endpoint
    def names_from(self, mesh: Any) -> list[str]:
        return [f.get(timeout=T)[0] for f in mesh.identity.stream()]

    @endpoint
    def choose_from(self, mesh: Any) -> int:
        return int(mesh.value.choose().get(timeout=T))

    @endpoint
    def spawn_here(self) -> tuple[str, str]:
        child = this_proc().spawn("child", Counter)
        own = str(context().actor_instance.proc_id)
        _, name = child.pid_and_thread.call_one().get(timeout=T)
        return own, str(child.identity.call_one().get(timeout=T)[0]).split("@")[1] + "|" + name


class Ported(Actor):
    @endpoint(explicit_response_port=True)
    def reply_later(self, port: Port[int], x: int) -> None:
        threading.Timer(0.01, port.send, (x + 1,)).start()

    @endpoint
    def send_many(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint
    def fail_through(self, port: Port[int]) -> None:
        port.exception(KeyError("sent as an error"))


class Gate(Actor):
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.unblock = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> str:
        self.ready.set()
        await self.unblock.wait()
        return "done"

    @endpoint
    async def release_when_ready(self) -> str:
        await self.ready.wait()
        self.unblock.set()
        return "released"

    @concurrent_endpoint
    async def rank_later(self) -> dict[str, int]:
        await asyncio.sleep(0.01)
        return dict(current_rank())


class Sequential(Actor):
    """``wait`` replies with a port, then blocks (awaiting) until a value arrives on it."""

    @endpoint(explicit_response_port=True)
    async def wait(self, port: Port[Port[None]]) -> None:
        release, released = Channel[None].open()
        port.send(release)
        await released.recv()

    @endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.fixture
def counters(procs: Procs) -> Any:
    return procs(gpus=2).spawn("counter", Counter)


# -- adverbs -----------------------------------------------------------------------------------
def test_call_returns_a_value_mesh_with_the_mesh_extent(counters: Any) -> None:
    vm = counters.value.call().get(timeout=T)
    assert isinstance(vm, ValueMesh)
    assert str(vm.extent) == "{gpus: 2}"
    assert vm.values() == [0, 0]


def test_call_one_on_a_one_rank_slice(counters: Any) -> None:
    counters.slice(gpus=1).incr.call_one(5).get(timeout=T)
    assert counters.value.call().get(timeout=T).values() == [0, 5]


def test_call_one_on_a_bigger_mesh_fails_before_binding(counters: Any) -> None:
    with pytest.raises(ValueError, match="call_one requires exactly 1 actor, but mesh has 2"):
        counters.value.call_one("too", "many", "args")


def test_arguments_are_checked_against_the_signature_at_the_caller(counters: Any) -> None:
    with pytest.raises(TypeError, match="too many positional arguments"):
        counters.value.call(1)
    with pytest.raises(TypeError):
        counters.incr.broadcast(nope=1)


def test_broadcast_is_ordered_before_later_calls(counters: Any) -> None:
    counters.incr.broadcast(3)
    assert counters.value.choose().get(timeout=T) == 3
    assert counters.value.choose().get(timeout=T) == 3


def test_choose_spreads_over_ranks(counters: Any) -> None:
    counters.slice(gpus=0).incr.call_one(1).get(timeout=T)
    chosen = {counters.value.choose().get(timeout=T) for _ in range(4)}
    assert chosen == {0, 1}


def test_stream_yields_one_future_per_rank(counters: Any) -> None:
    counters.incr.broadcast(2)
    futures = list(counters.value.stream())
    assert len(futures) == 2
    assert sum(f.get(timeout=T) for f in futures) == 4


def test_messages_from_one_sender_arrive_in_order(counters: Any) -> None:
    for i in range(200):
        counters.record.broadcast(i)
    seen = counters.recorded.call().get(timeout=T)
    assert seen.values() == [list(range(200))] * 2


def test_low_level_send_replies_to_a_port(counters: Any) -> None:
    port, receiver = Channel[int].open()
    send(counters.value, (), {}, port=port)
    values = sorted([receiver.recv().get(timeout=T), receiver.recv().get(timeout=T)])
    assert values == [0, 0]
    send(counters.incr, (1,), {}, selection="choose")
    assert sum(counters.value.call().get(timeout=T).values()) == 1


def test_large_arguments_round_trip(counters: Any) -> None:
    blob = os.urandom(1 << 20)
    assert counters.slice(gpus=0).echo.call_one(blob).get(timeout=T) == blob
    data = bytearray(blob)
    back = counters.slice(gpus=0).echo.call_one(data).get(timeout=T)
    assert back == data
    assert back is not data


def test_rref_needs_the_tensor_engine(counters: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without monarch-tensor (here: its module name made unimportable), rref names it."""
    from monarch.actor._mesh import adverbs

    monkeypatch.setattr(adverbs, "_rref_hook", None)
    monkeypatch.setattr(adverbs, "TENSOR_ENGINE_MODULE", "monarch_no_such_tensor_engine")
    with pytest.raises(NotImplementedError, match="install monarch-tensor"):
        counters.value.rref()


# -- ranks, names, context ------------------------------------------------------------------------
def test_current_rank_and_size_inside_endpoints(procs: Procs) -> None:
    mesh = procs(hosts=1, gpus=2).spawn("where", Counter)
    vm = mesh.where.call().get(timeout=T)
    ranks = [r for r, _, _ in vm.values()]
    assert ranks == [{"hosts": 0, "gpus": 0}, {"hosts": 0, "gpus": 1}]
    assert all(size == {"hosts": 1, "gpus": 2} for _, size, _ in vm.values())
    assert vm.values()[1][2] == "{'hosts': 0/1, 'gpus': 1/2}"
    assert vm.flatten("r").slice(r=1).item()[0] == {"hosts": 0, "gpus": 1}


def test_message_rank_is_relative_to_the_slice_but_instance_rank_is_not(counters: Any) -> None:
    rank, size, text = counters.slice(gpus=1).where.call_one().get(timeout=T)
    assert (rank, size, text) == ({}, {}, "{}")
    _, _, spawn_rank, _, _ = counters.slice(gpus=1).identity.call_one().get(timeout=T)
    assert spawn_rank == {"gpus": 1}


def test_actor_names_and_creation_chain(counters: Any) -> None:
    vm = counters.identity.call().get(timeout=T)
    names = [v[0] for v in vm.values()]
    assert len(set(names)) == 2
    _, chain, _, name, creator = vm.values()[1]
    assert chain == f"<root>.<{Counter.__module__}.Counter counter{{'gpus': 1/2}}>"
    assert (name, creator) == ("counter", "root")


def test_the_client_context_is_the_root() -> None:
    assert str(context().actor_instance) == "<root>"
    assert dict(current_rank()) == {}
    assert current_size() == {}


def test_thread_local_state_persists_across_calls(procs: Procs) -> None:
    pm = procs(gpus=1)
    sync_mesh = pm.spawn("tls_sync", Counter)
    async_mesh = pm.spawn("tls_async", AsyncCounter)
    for _ in range(4):
        assert sync_mesh.thread_local.call_one().get(timeout=T) == "set in __init__"
        assert async_mesh.thread_local.call_one().get(timeout=T) == "async init"


def test_value_mesh_of_a_two_dimensional_call(procs: Procs) -> None:
    mesh = procs(hosts=1, gpus=2).spawn("vm", Counter)
    mesh.slice(hosts=0, gpus=1).incr.call_one().get(timeout=T)
    vm = mesh.value.call().get(timeout=T)
    assert vm.item(hosts=0, gpus=1) == 1
    assert vm.item(hosts=0, gpus=0) == 0
    assert vm.slice(gpus=1).item(hosts=0) == 1
    assert [(dict(p), v) for p, v in vm] == [
        ({"hosts": 0, "gpus": 0}, 0),
        ({"hosts": 0, "gpus": 1}, 1),
    ]
    assert all(isinstance(p, Point) for p, _ in vm)


# -- sync and async actors calling each other ---------------------------------------------------
def test_sync_actor_blocks_on_another_actor(procs: Procs, counters: Any) -> None:
    caller = procs(gpus=1).spawn("caller", Caller)
    counters.slice(gpus=1).incr.call_one(7).get(timeout=T)
    assert caller.call_one_of.call_one(counters.slice(gpus=1)).get(timeout=T) == 7


def test_sync_endpoint_has_no_visible_loop_and_get_does_not_warn(
    procs: Procs, counters: Any
) -> None:
    caller = procs(gpus=1).spawn("caller", Caller)
    visible, caught = caller.loop_and_warnings.call_one(counters.slice(gpus=0)).get(timeout=T)
    assert visible is False
    assert caught == []


def test_choose_from_client_sync_actor_and_async_actor(procs: Procs, counters: Any) -> None:
    pm = procs(gpus=1)
    sync_caller = pm.spawn("sync_caller", Caller)
    async_caller = pm.spawn("async_caller", AsyncCounter)
    counters.incr.broadcast(4)
    assert counters.value.choose().get(timeout=T) == 4
    assert sync_caller.choose_from.call_one(counters).get(timeout=T) == 4
    assert async_caller.choose_from.call_one(counters).get(timeout=T) == 4


def test_client_asyncio_code_can_await_adverbs(procs: Procs) -> None:
    mesh = procs(gpus=2).spawn("async_counter", AsyncCounter)

    async def main() -> list[int]:
        await mesh.incr.call(2)
        vm = await mesh.value.call()
        one = await mesh.slice(gpus=0).value.call_one()
        return [*vm.values(), one]

    assert asyncio.run(main()) == [2, 2, 2]


def test_mesh_passed_to_a_mesh_streams_distinct_names(procs: Procs) -> None:
    pm = procs(gpus=2)
    source = pm.spawn("from", Caller)
    target = procs(gpus=2).spawn("to", Counter)
    names = source.names_from.call(target).get(timeout=T).values()
    assert all(len(set(n)) == 2 for n in names)
    to_one = source.names_from.call(target.slice(gpus=1)).get(timeout=T).values()
    assert to_one[0] == to_one[1]
    assert len(to_one[0]) == 1


def test_rebinding_to_a_slice_keeps_the_mesh_usable(procs: Procs) -> None:
    mesh = procs(gpus=2).spawn("rebind", Counter)
    mesh = mesh.slice(gpus=1)
    assert mesh.value.call_one().get(timeout=T) == 0


def test_pickled_mesh_is_a_usable_reference(counters: Any) -> None:
    copy = pickle.loads(pickle.dumps(counters))
    assert isinstance(copy, ActorMesh)
    copy.incr.broadcast(1)
    assert counters.value.call().get(timeout=T).values() == [1, 1]
    copy.initialized.get(timeout=T)
    with pytest.raises(ValueError, match="not owned"):
        copy.stop()


def test_initialized_and_internal_name(counters: Any) -> None:
    assert counters.initialized.get(timeout=T) is None
    assert counters._name.get(timeout=T).startswith("counter-")


# -- this_proc / this_host ------------------------------------------------------------------------
def test_this_proc_spawns_in_the_client_process() -> None:
    mesh = this_proc().spawn("local_counter", Counter)
    try:
        pid, thread_name = mesh.pid_and_thread.call_one().get(timeout=T)
        assert pid == os.getpid()
        assert thread_name != threading.current_thread().name
        assert str(mesh.extent) == "{}"
    finally:
        mesh.stop().get(timeout=T)


def test_this_proc_inside_an_actor_is_that_actors_process(procs: Procs) -> None:
    caller = procs(gpus=1).spawn("spawner", Caller)
    own, child = caller.spawn_here.call_one().get(timeout=T)
    assert child.split("|")[0] == own


def test_this_host_is_the_client_host_with_an_empty_extent() -> None:
    host = this_host()
    assert host.extent.labels == []
    assert host is this_host()
    with pytest.raises(ValueError, match="at least 1"):
        host.spawn_procs({"gpus": 0})  # checked before any process starts


# -- ports ----------------------------------------------------------------------------------------
def test_port_passed_as_argument_receives_values_in_order(procs: Procs) -> None:
    ported = procs(gpus=1).spawn("ported", Ported)
    port, receiver = Channel[int].open()
    ported.send_many.broadcast(port, 100)
    assert [receiver.recv().get(timeout=T) for _ in range(100)] == list(range(100))


def test_explicit_response_port_replies_later_from_another_thread(procs: Procs) -> None:
    ported = procs(gpus=1).spawn("ported", Ported)
    assert ported.reply_later.call_one(41).get(timeout=T) == 42


def test_port_exception_is_raised_by_recv(procs: Procs) -> None:
    ported = procs(gpus=1).spawn("ported", Ported)
    port, receiver = Channel[int].open()
    ported.fail_through.broadcast(port)
    with pytest.raises(KeyError, match="sent as an error"):
        receiver.recv().get(timeout=T)


def test_channel_in_the_client_waiting_recv_then_send() -> None:
    port, receiver = Channel[str].open()
    pending = receiver.recv()
    assert not pending.done()
    port.send("hello")
    assert pending.get(timeout=T) == "hello"


def test_once_channel_accepts_a_single_value() -> None:
    from monarch.actor import PortClosedError

    port, receiver = Channel[int].open(once=True)
    port.send(1)
    port.send(2)
    assert receiver.recv().get(timeout=T) == 1
    with pytest.raises(PortClosedError):
        receiver.recv().get(timeout=T)


def test_ranked_channel_reports_the_sender_rank(procs: Procs) -> None:
    ported = procs(gpus=2).spawn("ported", Ported)
    port, receiver = Channel[int].open_ranked()
    ported.send_many.broadcast(port, 1)
    got = sorted(receiver.recv().get(timeout=T) for _ in range(2))
    assert got == [(0, 0), (1, 0)]


def test_closed_receiver_releases_its_port() -> None:
    from monarch.actor._runtime.client import client

    runtime = client().runtime
    before = runtime.open_ports
    port, receiver = Channel[int].open()
    assert runtime.open_ports == before + 1
    receiver.close()
    assert runtime.open_ports == before
    port.send(1)  # dropped, not an error


def test_reply_ports_are_closed_before_their_futures_complete(counters: Any) -> None:
    from monarch.actor._runtime.client import client

    runtime = client().runtime
    counters.initialized.get(timeout=T)
    before = runtime.open_ports  # (receivers of earlier tests may still be collected: <=)
    for _ in range(5):
        counters.value.call().get(timeout=T)
        [f.get(timeout=T) for f in counters.value.stream()]
        counters.slice(gpus=0).value.call_one().get(timeout=T)
        assert runtime.open_ports <= before


# -- endpoints that are not endpoints -----------------------------------------------------------
def test_undecorated_method_on_a_mesh_explains_itself(counters: Any) -> None:
    with pytest.raises(RuntimeError, match="not an endpoint"):
        counters.not_decorated()
    with pytest.raises(RuntimeError, match="as_endpoint"):
        counters.not_decorated.call()


def test_as_endpoint_makes_it_callable(counters: Any) -> None:
    ep = as_endpoint(counters.not_decorated)
    assert ep.call().get(timeout=T).values() == [41, 41]
    with pytest.raises(ValueError, match="as_endpoint"):
        as_endpoint(counters.value)


def test_unknown_attribute_is_an_attribute_error(counters: Any) -> None:
    with pytest.raises(AttributeError):
        counters.nothing_here  # noqa: B018


# -- concurrency ------------------------------------------------------------------------------
def test_concurrent_endpoint_lets_a_later_message_run(procs: Procs) -> None:
    gate = procs(gpus=1).spawn("gate", Gate)
    waiting = gate.wait.call_one()
    assert gate.release_when_ready.call_one().get(timeout=T) == "released"
    assert waiting.get(timeout=T) == "done"


def test_concurrent_bodies_see_their_own_message_rank(procs: Procs) -> None:
    gate = procs(gpus=2).spawn("gate", Gate)
    assert gate.rank_later.call().get(timeout=T).values() == [{"gpus": 0}, {"gpus": 1}]
    assert gate.slice(gpus=1).rank_later.call_one().get(timeout=T) == {}


def test_ordinary_async_endpoints_run_one_at_a_time(procs: Procs) -> None:
    gate = procs(gpus=1).spawn("sequential", Sequential)

    async def main() -> None:
        release = await asyncio.wait_for(gate.wait.call_one(), T)
        ping = asyncio.ensure_future(gate.ping.call_one())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(ping), 0.1)
        release.send(None)
        assert await asyncio.wait_for(ping, T) == "pong"

    asyncio.run(main())


def test_different_actors_run_concurrently(procs: Procs) -> None:
    pm = procs(gpus=1)
    slow = pm.spawn("slow", Sequential)
    fast = pm.spawn("fast", Counter)
    release = slow.wait.call_one().get(timeout=T)  # slow now waits inside its body
    ping = slow.ping.call_one()
    assert fast.value.call_one().get(timeout=T) == 0  # answered while slow is busy
    assert not ping.done()
    release.send(None)
    assert ping.get(timeout=T) == "pong"


# -- Accumulator ------------------------------------------------------------------------------
def test_accumulator_sums_replies(counters: Any) -> None:
    counters.incr.broadcast(3)
    total: Accumulator[[], int, int] = Accumulator(counters.value, 0, operator.add)
    assert total.accumulate().get(timeout=T) == 6

    async def main() -> int:
        return await total.accumulate()

    assert asyncio.run(main()) == 6


class FakeEndpoint:
    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.calls: list[tuple[Any, ...]] = []

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[Any]]:
        self.calls.append((args, kwargs))
        return iter([Future._completed(v) for v in self.values])


def test_accumulate_folds_left_to_right_in_arrival_order() -> None:
    fake = FakeEndpoint(["a", "b", "c"])
    assert Accumulator(fake, "", operator.add).accumulate().get(timeout=T) == "abc"


def test_accumulate_of_an_empty_stream_is_the_identity() -> None:
    assert Accumulator(FakeEndpoint([]), 17, operator.add).accumulate().get(timeout=T) == 17


def test_accumulate_forwards_arguments_to_stream() -> None:
    fake = FakeEndpoint([1])
    acc: Accumulator[..., int, int] = Accumulator(fake, 0, operator.add)
    acc.accumulate(1, k=2).get(timeout=T)
    assert fake.calls == [((1,), {"k": 2})]


def test_accumulate_waits_for_pending_replies() -> None:
    cells: list[_Cell[int]] = [_Cell(), _Cell()]

    class Pending:
        def stream(self) -> Iterator[Future[int]]:
            return iter([Future._create(c) for c in cells])

    result = Accumulator(Pending(), 0, operator.add).accumulate()
    assert not result.done()
    cells[1].set_result(2)
    cells[0].set_result(1)
    assert result.get(timeout=T) == 3


def test_the_point_of_a_cast_is_cached_per_cast_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The message rank of a call is built once per ``CastInfo`` (every call of a pipelining
    caller carries the same one) and stays right for every rank; the cache is bounded."""
    from monarch.actor._base.envelope import CastInfo
    from monarch.actor._runtime import cell as _cell

    monkeypatch.setattr(_cell, "_POINTS", {})
    monkeypatch.setattr(_cell, "_POINTS_MAX", 4)
    for rank in range(6):
        point = _cell._point_of(CastInfo(("hosts", "gpus"), (2, 3), rank))
        assert (point.rank, point["hosts"], point["gpus"]) == (rank, rank // 3, rank % 3)
        again = _cell._point_of(CastInfo(("hosts", "gpus"), (2, 3), rank))
        assert again is point
        assert len(_cell._POINTS) <= 4
    assert _cell._point_of(CastInfo(("x",), (2,), 5)).rank == 0  # out of range: empty point
    assert _cell._point_of(None).rank == 0


_GATE = threading.Event()
_GATE_CELL: list[Any] = []


class HintGate(Actor):
    @endpoint
    def wait(self) -> int:
        _GATE_CELL.append(context()._cell)
        assert _GATE.wait(T)
        return -1

    @endpoint
    def echo(self, x: int) -> int:
        return x

    @endpoint
    def sized(self, x: int, data: bytes) -> int:
        assert len(data) == 1 << 20
        return x


def test_replies_are_hinted_more_exactly_while_calls_are_queued(
    procs: Procs, monkeypatch: pytest.MonkeyPatch, wait_until: Callable[..., None]
) -> None:
    """An actor thread with calls queued behind the one it answers posts the reply with
    ``more=True`` (the transport may write the batch's replies together); the last reply of the
    batch, with nothing queued, is a plain send, so nothing waits for a next call."""
    from monarch.actor._base.codec import decode
    from monarch.actor._runtime.proc import ProcRuntime

    gate = procs().spawn("gate", HintGate)
    assert gate.echo.call_one(0).get(timeout=T) == 0
    hints: dict[int, bool] = {}
    original = ProcRuntime.post

    def recording(self: ProcRuntime, *args: Any, **kwargs: Any) -> None:
        payload = kwargs.get("payload")
        if kwargs.get("port", -1) >= 0 and payload is not None:
            value = decode(payload.data, list(payload.buffers), payload.kinds)
            if isinstance(value, int):
                hints[value] = kwargs.get("more", False)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ProcRuntime, "post", recording)
    _GATE.clear()
    _GATE_CELL.clear()
    try:
        blocked = gate.wait.call_one()
        futures = [gate.echo.call_one(i) for i in range(1, 6)]
        # The endpoint holds the actor thread: the five echoes queue behind it.
        wait_until(lambda: len(_GATE_CELL) == 1 and len(_GATE_CELL[0].mailbox) == 5)
    finally:
        _GATE.set()
    assert blocked.get(timeout=T) == -1
    assert [f.get(timeout=T) for f in futures] == [1, 2, 3, 4, 5]
    assert hints == {-1: True, 1: True, 2: True, 3: True, 4: True, 5: False}
    assert gate.echo.call_one(6).get(timeout=T) == 6
    assert hints[6] is False  # one call at a time: every reply is a plain send


def test_replies_are_not_batched_behind_queued_large_calls(
    procs: Procs, monkeypatch: pytest.MonkeyPatch, wait_until: Callable[..., None]
) -> None:
    """With calls carrying large buffers queued (64 KiB or more in all), a reply is a plain send
    (the actor's thread writes it at once where the lane is idle): each of those calls takes
    long enough that batching would only add a wake-up of the runtime loop. Once only small
    calls are left queued, the replies are hinted ``more=True`` again."""
    from monarch.actor._base.codec import decode
    from monarch.actor._runtime.proc import ProcRuntime

    gate = procs().spawn("gate_large", HintGate)
    assert gate.echo.call_one(0).get(timeout=T) == 0
    hints: dict[int, bool] = {}
    original = ProcRuntime.post

    def recording(self: ProcRuntime, *args: Any, **kwargs: Any) -> None:
        payload = kwargs.get("payload")
        if kwargs.get("port", -1) >= 0 and payload is not None:
            value = decode(payload.data, list(payload.buffers), payload.kinds)
            if isinstance(value, int):
                hints[value] = kwargs.get("more", False)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ProcRuntime, "post", recording)
    big = b"y" * (1 << 20)
    _GATE.clear()
    _GATE_CELL.clear()
    try:
        blocked = gate.wait.call_one()
        futures = [gate.sized.call_one(1, big), gate.sized.call_one(2, big)]
        futures += [gate.echo.call_one(i) for i in range(3, 6)]
        wait_until(lambda: len(_GATE_CELL) == 1 and len(_GATE_CELL[0].mailbox) == 5)
    finally:
        _GATE.set()
    assert blocked.get(timeout=T) == -1
    assert [f.get(timeout=T) for f in futures] == [1, 2, 3, 4, 5]
    # -1 and 1 leave with a 1 MiB call still queued; from 2 on only small calls are.
    assert hints == {-1: False, 1: False, 2: True, 3: True, 4: True, 5: False}
