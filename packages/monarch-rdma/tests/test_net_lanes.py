"""The ``net`` provider's data lanes: the wire format (pure), the chunk plan, and a lane server
with its connecting pool in this process (Unix and TLS), including refusals, drops, pinning and
cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.config import configured
from monarch.rdma import RDMABuffer, _net
from monarch.rdma._net import LANE_CHUNK, MIN_CHUNK, plan_lane_chunks
from monarch.rdma._netlane import (
    MAX_IDLE,
    PIPELINE_DEPTH,
    Endpoint,
    LanePool,
    LaneRequest,
    LaneServer,
    OwnerGone,
    Unreachable,
)
from monarch.rdma._netwire import (
    MAX_MESSAGE,
    REPLY_SIZE,
    REQUEST_SIZE,
    Op,
    Reply,
    Request,
    WireError,
    decode_reply,
    decode_request,
    encode_error,
    encode_ok,
    encode_request,
)

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")
SECRET = bytes(range(16))
U64 = st.integers(0, (1 << 64) - 1)


# -- the wire format ----------------------------------------------------------------------------


@given(st.sampled_from([Op.READ, Op.WRITE]), U64, U64, U64, st.binary(min_size=16, max_size=16))
def test_requests_round_trip(op: Op, region: int, offset: int, length: int, secret: bytes) -> None:
    data = encode_request(op, region, offset, length, secret)
    assert len(data) == REQUEST_SIZE
    assert decode_request(data) == Request(op, region, offset, length, secret)


@given(U64)
def test_replies_round_trip(length: int) -> None:
    assert decode_reply(encode_ok(length)) == Reply(True, length)


def test_an_error_reply_carries_its_message_cut_to_the_bound() -> None:
    data = encode_error("é" * MAX_MESSAGE)
    reply = decode_reply(data[:REPLY_SIZE])
    assert not reply.ok
    assert reply.length == MAX_MESSAGE == len(data) - REPLY_SIZE
    assert decode_reply(encode_error("gone")[:REPLY_SIZE]) == Reply(False, 4)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"short", "45 bytes"),
        (b"XXXX" + encode_request(Op.READ, 1, 0, 1, SECRET)[4:], "magic"),
        (encode_request(Op.READ, 1, 0, 1, SECRET)[:4] + b"\x09" + bytes(40), "unknown request op"),
        (encode_request(Op.DROP, 1, 0, 5, SECRET), "no range"),
    ],
)
def test_malformed_requests_are_wire_errors(data: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_request(data)


def test_malformed_replies_and_values_are_wire_errors() -> None:
    with pytest.raises(WireError, match="9 bytes"):
        decode_reply(b"\x00")
    with pytest.raises(WireError, match="unknown reply status"):
        decode_reply(b"\x07" + bytes(8))
    with pytest.raises(WireError, match="error message"):
        decode_reply(b"\x01" + (MAX_MESSAGE + 1).to_bytes(8, "big"))
    with pytest.raises(WireError, match="secret"):
        encode_request(Op.READ, 1, 0, 1, b"short")
    with pytest.raises(WireError, match="out of range"):
        encode_request(Op.READ, -1, 0, 1, SECRET)


# -- the chunk plan -----------------------------------------------------------------------------


@given(st.integers(0, 1 << 34), st.integers(1, 128), st.integers(1, 16))
def test_lane_chunks_cover_the_transfer(total: int, max_mib: int, window: int) -> None:
    max_chunk = max_mib * MIN_CHUNK
    chunks = plan_lane_chunks(total, max_chunk, window)
    assert sum(n for _, n in chunks) == total
    assert [s for s, _ in chunks] == [sum(n for _, n in chunks[:i]) for i in range(len(chunks))]
    assert all(n <= min(LANE_CHUNK, max_chunk) for _, n in chunks)
    if total <= min(2 * MIN_CHUNK, max_chunk):
        assert len(chunks) == (1 if total else 0)  # the latency case: one request
    else:
        assert all(n >= MIN_CHUNK for _, n in chunks[:-1])
        assert len(chunks) >= min(window, total // MIN_CHUNK)  # every connection has work


def test_a_bad_lane_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="bad chunk plan"):
        plan_lane_chunks(-1, MIN_CHUNK, 1)
    with pytest.raises(ValueError, match="bad chunk plan"):
        plan_lane_chunks(10, MIN_CHUNK, 0)
    with pytest.raises(ValueError, match="bad chunk plan"):
        plan_lane_chunks(10, 0, 1)


# -- a lane server and its pool in this process -------------------------------------------------


class _Table:
    """A region table for a lane server: number -> (memory, secret)."""

    def __init__(self) -> None:
        self.regions: dict[int, tuple[memoryview, bytes]] = {}
        self.gate: threading.Event | None = None  # set: lookups wait on it (a stalled owner)

    def lookup(self, number: int, secret: bytes) -> memoryview | str:
        if self.gate is not None:
            self.gate.wait(30)
        found = self.regions.get(number)
        if found is None or found[1] != secret:
            return f"RDMA region {number} is not registered in this process"
        return found[0]

    def drop(self, number: int, secret: bytes) -> None:
        if number in self.regions and self.regions[number][1] == secret:
            del self.regions[number]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[_Table, LaneServer, LanePool]]:
    table = _Table()
    server = LaneServer(table.lookup, table.drop, tcp_host="127.0.0.1")
    pool = LanePool()
    try:
        yield table, server, pool
    finally:
        pool.close_idle()
        server.close()


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("kind", ["unix", "tls"])
def test_reads_and_writes_move_bytes_between_the_memories(
    served: tuple[_Table, LaneServer, LanePool], kind: str
) -> None:
    table, server, pool = served
    memory = bytearray(os.urandom(3 << 20))
    table.regions[1] = (memoryview(memory), SECRET)
    dst = bytearray(1 << 20)
    _run(pool.transfer(kind, server.endpoint, Op.READ, 1, SECRET, 5, memoryview(dst)))
    assert dst == memory[5 : 5 + (1 << 20)]
    src = os.urandom(2 << 20)
    _run(pool.transfer(kind, server.endpoint, Op.WRITE, 1, SECRET, 7, memoryview(src)))
    assert memory[7 : 7 + len(src)] == src


@pytest.mark.parametrize("kind", ["unix", "tls"])
def test_refusals_carry_the_owners_message_and_keep_the_connection(
    served: tuple[_Table, LaneServer, LanePool], kind: str
) -> None:
    table, server, pool = served
    memory = bytearray(b"abcdefgh")
    table.regions[2] = (memoryview(memory), SECRET)
    table.regions[3] = (memoryview(b"read-only"), SECRET)
    endpoint = server.endpoint

    def transfer(op: Op, region: int, secret: bytes, offset: int, view: memoryview) -> None:
        _run(pool.transfer(kind, endpoint, op, region, secret, offset, view))

    with pytest.raises(RuntimeError, match="not registered"):
        transfer(Op.READ, 2, bytes(16), 0, memoryview(bytearray(8)))  # the wrong secret
    with pytest.raises(RuntimeError, match="not registered"):  # its payload drained
        transfer(Op.WRITE, 99, SECRET, 0, memoryview(bytes(3 << 20)))
    with pytest.raises(RuntimeError, match="outside its 8 bytes"):
        transfer(Op.READ, 2, SECRET, 4, memoryview(bytearray(5)))
    with pytest.raises(RuntimeError, match="read-only"):
        transfer(Op.WRITE, 3, SECRET, 0, memoryview(b"x"))
    transfer(Op.WRITE, 2, SECRET, 0, memoryview(b"XY"))  # still in step
    assert memory == b"XYcdefgh"
    transfer(Op.DROP, 2, SECRET, 0, memoryview(b""))
    assert 2 not in table.regions
    with pytest.raises(RuntimeError, match="not registered"):
        transfer(Op.READ, 2, SECRET, 0, memoryview(bytearray(1)))


@pytest.mark.parametrize(("kind", "connections"), [("unix", 1), ("tls", 1), ("unix", 3)])
def test_a_pipeline_runs_its_requests_with_refusals_in_step(
    served: tuple[_Table, LaneServer, LanePool], kind: str, connections: int
) -> None:
    table, server, _ = served
    pool = LanePool()
    memory = bytearray(os.urandom(3 << 20))
    table.regions[11] = (memoryview(memory), SECRET)
    dsts = [bytearray(1 << 20) for _ in range(3)]
    reads = [LaneRequest(Op.READ, 11, SECRET, i << 20, memoryview(d)) for i, d in enumerate(dsts)]
    reads.insert(1, LaneRequest(Op.READ, 11, bytes(16), 0, memoryview(bytearray(8))))
    outcomes = _run(pool.pipeline(kind, server.endpoint, reads, connections))
    assert outcomes[0] is None
    assert outcomes[2:] == [None, None]
    assert isinstance(outcomes[1], str)
    assert "not registered" in outcomes[1]  # the wrong secret
    assert all(dst == memory[i << 20 : (i + 1) << 20] for i, dst in enumerate(dsts))
    # more small writes than one connection keeps in flight, a refused one (its 1 MiB payload
    # drained) among them
    srcs = [os.urandom(1024) for _ in range(PIPELINE_DEPTH + 3)]
    writes = [
        LaneRequest(Op.WRITE, 11, SECRET, i * 1024, memoryview(b)) for i, b in enumerate(srcs)
    ]
    refused = LaneRequest(Op.WRITE, 99, SECRET, 0, memoryview(bytes(1 << 20)))
    writes.insert(PIPELINE_DEPTH - 1, refused)
    outcomes = _run(pool.pipeline(kind, server.endpoint, writes, connections))
    assert [i for i, outcome in enumerate(outcomes) if outcome is not None] == [PIPELINE_DEPTH - 1]
    assert "not registered" in str(outcomes[PIPELINE_DEPTH - 1])
    assert bytes(memory[: len(srcs) * 1024]) == b"".join(srcs)
    assert 1 <= pool._idle_count <= connections  # kept: every connection stayed in step
    assert _run(pool.pipeline(kind, server.endpoint, [], connections)) == []
    drop = LaneRequest(Op.DROP, 11, SECRET, 0, memoryview(b""))
    with pytest.raises(ValueError, match="reads and writes only"):
        _run(pool.pipeline(kind, server.endpoint, [drop]))
    pool.close_idle()


def test_a_pipeline_to_an_owner_that_is_gone_fails_every_request(
    served: tuple[_Table, LaneServer, LanePool],
) -> None:
    _, server, _ = served
    gone = dataclasses.replace(server.endpoint, unix=server.endpoint.unix + "-gone")
    request = LaneRequest(Op.READ, 1, SECRET, 0, memoryview(bytearray(4)))
    outcomes = _run(LanePool().pipeline("unix", gone, [request, request, request], 2))
    assert len(outcomes) == 3
    assert all(isinstance(outcome, OwnerGone) for outcome in outcomes)


def test_a_pipeline_replaces_a_kept_connection_the_owner_closed_while_idle(
    served: tuple[_Table, LaneServer, LanePool],
) -> None:
    table, server, _ = served
    pool = LanePool()
    memory = os.urandom(4096)
    table.regions[12] = (memoryview(memory), SECRET)
    dst = bytearray(4096)
    _run(pool.transfer("unix", server.endpoint, Op.READ, 12, SECRET, 0, memoryview(dst)))
    (kept,) = next(iter(pool._idle.values()))
    assert isinstance(kept.sock, socket.socket)  # the Unix lane: a plain socket
    kept.sock.shutdown(socket.SHUT_RDWR)  # it fails before any reply, as a closed one would
    dsts = [bytearray(1024) for _ in range(4)]
    requests = [
        LaneRequest(Op.READ, 12, SECRET, i * 1024, memoryview(d)) for i, d in enumerate(dsts)
    ]
    assert _run(pool.pipeline("unix", server.endpoint, requests)) == [None] * 4
    assert b"".join(dsts) == memory
    pool.close_idle()


def test_the_pool_keeps_a_bounded_number_of_idle_connections(
    served: tuple[_Table, LaneServer, LanePool],
) -> None:
    table, server, _ = served
    memory = bytes(range(256)) * 4
    table.regions[5] = (memoryview(memory), SECRET)
    pool = LanePool()
    dsts = [bytearray(len(memory)) for _ in range(MAX_IDLE + 4)]

    async def many() -> None:  # more connections at once than the pool keeps
        await asyncio.gather(
            *(
                pool.transfer("unix", server.endpoint, Op.READ, 5, SECRET, 0, memoryview(dst))
                for dst in dsts
            )
        )

    _run(many())
    assert all(dst == memory for dst in dsts)
    idle = sum(len(conns) for conns in pool._idle.values())
    assert 1 <= idle <= MAX_IDLE
    assert idle == pool._idle_count
    _run(many())  # the kept ones are reused, the bound holds
    assert sum(len(conns) for conns in pool._idle.values()) == pool._idle_count <= MAX_IDLE
    pool.close_idle()
    assert pool._idle_count == 0


def test_a_cancel_that_comes_after_the_io_leaves_the_kept_connection_alone(
    served: tuple[_Table, LaneServer, LanePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk whose I/O finished (its connection back in the pool) and that is cancelled
    before its task resumes (another chunk failed, or the timeout passed just then) must not
    shut that connection down: the next transfer takes it."""
    table, server, _ = served
    memory = b"kept alive"
    table.regions[6] = (memoryview(memory), SECRET)
    pool = LanePool()
    kept = threading.Event()
    give_back = pool._give_back

    def noted(kind: str, endpoint: Endpoint, conn: Any) -> None:
        give_back(kind, endpoint, conn)
        kept.set()

    monkeypatch.setattr(pool, "_give_back", noted)
    dst = memoryview(bytearray(len(memory)))

    async def cancelled_late() -> None:
        task = asyncio.ensure_future(
            pool.transfer("unix", server.endpoint, Op.READ, 6, SECRET, 0, dst)
        )
        await asyncio.sleep(0)  # the task started its thread
        assert kept.wait(10)  # the loop is held: the task cannot resume before the cancel
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(cancelled_late())
    assert pool._idle_count == 1
    again = memoryview(bytearray(len(memory)))
    _run(pool.transfer("unix", server.endpoint, Op.READ, 6, SECRET, 0, again))
    assert bytes(again) == memory
    assert pool._idle_count == 1  # the same connection served, and is kept again


@pytest.mark.parametrize("op", [Op.READ, Op.WRITE])
def test_a_kept_connection_the_owner_closed_while_idle_is_replaced(op: Op) -> None:
    """The owner ends a connection idle for ``idle_timeout``; the next transfer through the
    pool finds it closed before any reply and retries once on a fresh connection."""
    table = _Table()
    memory = bytearray(b"idle" * 64)
    table.regions[1] = (memoryview(memory), SECRET)
    server = LaneServer(table.lookup, table.drop, tcp_host="127.0.0.1", idle_timeout=0.2)
    pool = LanePool()
    try:
        view = memoryview(bytearray(len(memory)))
        _run(pool.transfer("unix", server.endpoint, Op.READ, 1, SECRET, 0, view))
        assert pool._idle_count == 1
        (kept,) = [conn for conns in pool._idle.values() for conn in conns]
        assert isinstance(kept.sock, socket.socket)  # the Unix lane: a plain socket
        readable, _, _ = select.select([kept.sock], [], [], 10)  # the owner's end of it
        assert readable
        assert kept.sock.recv(1, socket.MSG_PEEK) == b""
        data = memoryview(bytearray(b"IDLE" * 64)) if op is Op.WRITE else view
        _run(pool.transfer("unix", server.endpoint, op, 1, SECRET, 0, data))
        assert bytes(memory) == (b"IDLE" * 64 if op is Op.WRITE else bytes(view))
        assert kept.sock.fileno() == -1  # the stale one was closed, a fresh one is kept
        assert pool._idle_count == 1
    finally:
        pool.close_idle()
        server.close()


def test_a_tls_owner_whose_certificate_is_not_the_pinned_one_is_refused(
    served: tuple[_Table, LaneServer, LanePool],
) -> None:
    table, server, _ = served
    table.regions[4] = (memoryview(bytearray(4)), SECRET)
    forged = dataclasses.replace(server.endpoint, fingerprint=bytes(32))
    with pytest.raises(OwnerGone, match="not the one in its key"):
        _run(LanePool().transfer("tls", forged, Op.READ, 4, SECRET, 0, memoryview(bytearray(4))))


@pytest.mark.parametrize("kind", ["unix", "tls"])
def test_an_owner_that_is_gone_fails_at_once(kind: str) -> None:
    table = _Table()
    server = LaneServer(table.lookup, table.drop, tcp_host="127.0.0.1")
    endpoint = dataclasses.replace(server.endpoint, addresses=("127.0.0.1",))
    server.close()
    started = time.monotonic()
    with pytest.raises(OwnerGone, match="has exited"):
        _run(LanePool().transfer(kind, endpoint, Op.READ, 1, SECRET, 0, memoryview(bytearray(1))))
    assert time.monotonic() - started < 2


def test_an_owner_host_without_an_ipv4_address_is_unreachable_not_gone() -> None:
    """No address to dial is not a dead owner: the provider then takes the message lane."""
    nowhere = Endpoint("unused", 1, (), bytes(32))
    with pytest.raises(Unreachable, match="no IPv4 address"):
        _run(LanePool().transfer("tls", nowhere, Op.READ, 1, SECRET, 0, memoryview(bytearray(1))))


def test_a_stalled_pipeline_leaves_threads_to_other_transfers(
    served: tuple[_Table, LaneServer, LanePool],
) -> None:
    """A pipeline takes at most half the pool's threads: transfers started while two large
    actions are stuck on a stalled owner still run, a pipeline among them on the one thread
    left (before that bound, the first big action took every thread and this failed)."""
    table, server, _ = served
    memory = bytearray(os.urandom(64))
    table.regions[3] = (memoryview(memory), SECRET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"monarch-rdma-test/{os.getpid()}/{time.monotonic_ns()}"
    listener.bind("\0" + name)
    listener.listen(16)  # connections queue, nobody ever answers
    listener.setblocking(False)
    accepted: list[socket.socket] = []
    stalled = Endpoint(name, 0, (), bytes(32))
    pool = LanePool(threads=5)  # a pipeline takes 2 of them at most

    def big() -> list[LaneRequest]:  # every connection keeps its most in flight: all blocked
        return [
            LaneRequest(Op.READ, 1, SECRET, 0, memoryview(bytearray(8)))
            for _ in range(8 * PIPELINE_DEPTH)
        ]

    small = [LaneRequest(Op.READ, 3, SECRET, i * 8, memoryview(bytearray(8))) for i in range(8)]

    async def main() -> None:
        stuck = [asyncio.ensure_future(pool.pipeline("unix", stalled, big(), 8)) for _ in "ab"]
        deadline = time.monotonic() + 30
        while len(accepted) < 4:  # both pipelines' two connections are up, never answered
            try:
                accepted.append(listener.accept()[0])
            except BlockingIOError:
                assert time.monotonic() < deadline, "the stuck pipelines did not connect"
                await asyncio.sleep(0.01)
        assert not any(s.done() for s in stuck)
        dst = bytearray(64)
        await asyncio.wait_for(
            pool.transfer("unix", server.endpoint, Op.READ, 3, SECRET, 0, memoryview(dst)), 10
        )
        assert dst == memory
        # one thread is free: the small pipeline runs on it (its connections in turn)
        outcomes = await asyncio.wait_for(pool.pipeline("unix", server.endpoint, small, 8), 10)
        assert outcomes == [None] * 8
        assert b"".join(bytes(r.view) for r in small) == memory
        for s in stuck:
            s.cancel()
        for s in stuck:
            with pytest.raises(asyncio.CancelledError):
                await s

    try:
        _run(main())
    finally:
        for conn in accepted:
            conn.close()
        listener.close()
        pool.close_idle()


def test_a_stalled_owner_is_cut_off_when_the_transfer_times_out() -> None:
    """Cancellation shuts the socket down: the blocked thread ends at once and is waited for,
    so nothing touches the destination once the caller has its error."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"monarch-rdma-test/{os.getpid()}/{time.monotonic_ns()}"
    listener.bind("\0" + name)
    listener.listen(4)  # connections queue, nobody ever answers
    endpoint = Endpoint(name, 0, (), bytes(32))
    pool = LanePool()

    async def main() -> None:
        await asyncio.wait_for(
            pool.transfer("unix", endpoint, Op.READ, 1, SECRET, 0, memoryview(bytearray(8))), 0.3
        )

    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            _run(main())
        assert time.monotonic() - started < 2
        listener.settimeout(5)
        conn, _ = listener.accept()  # the request the owner never answered, then its end:
        with conn:  # the client shut the connection down, it does not wait on it any longer
            conn.settimeout(5)
            got = b""
            while part := conn.recv(4096):
                got += part
            assert len(got) == REQUEST_SIZE
    finally:
        listener.close()


# -- the provider in this process ---------------------------------------------------------------


@pytest.fixture
def net_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MONARCH_RDMA_NET_LANE", "unix")
    with configured(rdma_disable_shm=True):
        yield


def test_the_provider_times_out_a_read_from_a_stalled_owner(net_only: None) -> None:
    memory = bytearray(b"stalled!" * (6 << 17))  # 6 MiB: four chunks, all in flight
    buffer = RDMABuffer(memoryview(memory))
    assert buffer.transport == "net"
    server = _net._server
    assert server is not None
    gate = threading.Event()
    real = server._lookup

    def stalled(number: int, secret: bytes) -> memoryview | str:
        gate.wait(30)
        return real(number, secret)

    server._lookup = stalled
    dst = bytearray(len(memory))
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="timed out"):
            buffer.read_into(memoryview(dst), timeout=1).get(timeout=30)
        assert time.monotonic() - started < 5
        assert dst == bytes(len(memory))  # nothing arrived
    finally:
        gate.set()
        server._lookup = real
    buffer.read_into(memoryview(dst), timeout=30).get(timeout=30)  # a fresh connection serves
    assert dst == memory
    buffer.drop().get(timeout=30)
    with pytest.raises(RuntimeError, match="not registered"):
        buffer.read_into(memoryview(dst), timeout=30).get(timeout=30)


def test_an_owner_whose_tls_lane_does_not_answer_is_served_over_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Across hosts, a TLS lane that does not answer (no route, a firewall: not a refusal) is
    not a dead owner: the transfer takes the message lane, and keeps taking it."""
    monkeypatch.delenv("MONARCH_RDMA_NET_LANE", raising=False)
    with configured(rdma_disable_shm=True):
        memory = bytearray(b"far away" * 512)
        buffer = RDMABuffer(memoryview(memory))
    key = buffer._keys["net"]
    assert isinstance(key.detail, _net.NetDetail)
    elsewhere = dataclasses.replace(key.detail, host="another host")  # as seen from another host
    buffer._keys["net"] = dataclasses.replace(key, detail=elsewhere)
    assert _net.lane_kind(elsewhere) == "tls"
    tried: list[str] = []

    def no_route(self: LanePool, kind: str, endpoint: Endpoint, state: Any) -> socket.socket:
        tried.append(kind)
        raise OSError(errno.EHOSTUNREACH, "No route to host")

    monkeypatch.setattr(LanePool, "_connect", no_route)
    manager = elsewhere.managers[0]
    before = manager.served.call_one().get(timeout=30)
    with configured(rdma_disable_shm=True):
        dst = bytearray(len(memory))
        buffer.read_into(memoryview(dst), timeout=30).get(timeout=30)
        assert dst == memory
        assert tried  # the TLS lane was tried first
        assert _net.lane_kind(elsewhere) == "messages"  # remembered
        tried.clear()
        buffer.write_from(memoryview(b"near"), timeout=30).get(timeout=30)
        assert memory.startswith(b"near")
        assert not tried
        assert manager.served.call_one().get(timeout=30) - before == 2
        buffer.drop().get(timeout=30)
    _net._unreachable.discard(elsewhere.endpoint)
