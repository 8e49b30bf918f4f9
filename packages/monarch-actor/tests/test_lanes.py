"""Direct lanes between NodeProcessTransports: negotiation, order across the switch, shared
memory, TLS over TCP, failure and hostile peers (real Nodes on an in-process network)."""

from __future__ import annotations

import asyncio
import errno
import gc
import mmap
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from chrysalis.quic.testing import issue_identity
from monarch.actor._base.codec import KIND_PERSISTENT
from monarch.actor._base.envelope import Envelope, FrameLimits
from monarch.actor._transport import shm as _shm
from monarch.actor._transport.lane import LaneManager, LaneSettings, TcpLane, UnixLane
from monarch.actor._transport.lane_proto import (
    FEATURE_LEND,
    Auth,
    Hello,
    Offer,
    Refuse,
    decode_control,
    encode_handshake,
)
from monarch.actor._transport.node import NodeTransportSettings
from monarch.config._registry import configured

sys.path.insert(0, str(Path(__file__).parent))
from test_node_transport import Cluster, Member, T, envelope


def wait_for(predicate: Any, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def on_lane(a: Member, b: Member) -> None:
    """Send until ``a`` writes to ``b`` on a lane."""
    a.transport.send(envelope(a, b.transport.pid, 10**6), [])
    wait_for(lambda: a.transport.statistics().outbound_lanes == 1)
    b.wait("got", 1)
    b.got.clear()


def with_buffers(env: Envelope, buffers: list[bytes | bytearray]) -> Envelope:
    sizes = tuple(len(b) for b in buffers)
    kinds = bytes(1 if isinstance(b, bytes) else 0 for b in buffers)
    return Envelope(
        env.kind, env.sender, env.target, env.port, env.endpoint, env.sequence, env.reply_port,
        env.cast, env.payload, sizes, kinds,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _lanes_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about lanes: a suite run with MONARCH_FORCE_QUIC=1 must not turn them
    off (the rest of the suite runs in whichever mode the environment says)."""
    monkeypatch.delenv("MONARCH_FORCE_QUIC", raising=False)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(NodeTransportSettings(dial_timeout=2.0))
    try:
        yield c
    finally:
        c.close()


def test_order_holds_across_the_switch_to_the_lane(cluster: Cluster) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    sent = 0
    deadline = time.monotonic() + T
    while a.transport.statistics().outbound_lanes == 0:  # the switch happens mid-stream
        assert time.monotonic() < deadline, "no lane"
        for _ in range(20):
            a.transport.send(envelope(a, b.transport.pid, sent), [])
            sent += 1
        time.sleep(0.002)
    for _ in range(500):
        a.transport.send(envelope(a, b.transport.pid, sent), [])
        sent += 1
    b.wait("got", sent)
    assert [env.sequence for env, _ in b.got] == list(range(sent))
    assert b.transport.statistics().inbound_lanes == 1


@pytest.mark.parametrize("lend", [True, False])
def test_large_buffers_travel_as_shared_memory_and_are_acknowledged(lend: bool) -> None:
    settings = NodeTransportSettings(dial_timeout=2.0)
    cluster = Cluster(settings, lane_settings=LaneSettings(lend=lend))
    try:
        _large_buffers_travel_as_shared_memory(cluster, lend)
    finally:
        cluster.close()


def _large_buffers_travel_as_shared_memory(cluster: Cluster, lend: bool) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    on_lane(a, b)
    big = bytearray(range(256)) * 4096
    small = b"abc"
    a.transport.send(with_buffers(envelope(a, b.transport.pid, 1), [big, small]), [
        memoryview(big), memoryview(small)
    ])  # fmt: skip
    big[0] = 255  # the sender may reuse its memory once send returned
    b.wait("got", 1)
    buffers = b.got[0][1]
    # writable at the sender, a protocol-5 buffer (no persistent bit): the receiver's own mapping
    assert type(buffers[0]) is mmap.mmap
    assert buffers[0][0] == 0
    assert bytes(buffers[0]) == bytes(bytearray(range(256)) * 4096)
    assert bytes(buffers[1]) == b"abc"
    lane = a.transport._peers[b.transport.pid.raw].lane
    assert isinstance(lane, UnixLane)
    # The mapping is the slot: it stays the receiver's (unacknowledged) while the object lives
    time.sleep(0.05)
    assert lane.shm_outstanding == 1 << 20
    buffers[0][0] = 7  # private: the receiver's write never reaches the slot
    del buffers
    b.got.clear()
    gc.collect()
    wait_for(lambda: lane.shm_outstanding == 0)  # freed: the receiver acknowledged the slot
    frozen = bytes(range(256)) * 2048
    for i in range(20):  # the slot is reused, never rewritten while in flight
        a.transport.send(
            with_buffers(envelope(a, b.transport.pid, 2 + i), [frozen]), [memoryview(frozen)]
        )
    b.wait("got", 20)
    assert all(bytes(env_buffers[1][0]) == frozen for env_buffers in b.got)
    assert all(type(env_buffers[1][0]) is bytes for env_buffers in b.got)
    # A ``bytes`` is lent (read out of the sender by the receiver), the rest goes in slots.
    if lend and _reads_itself():
        assert lane.lend
        assert (lane.pool.issued, lane.pool.lent) == (1, 20)
    else:
        assert not lane.lend
        assert (lane.pool.issued, lane.pool.lent) == (21, 0)  # every large buffer in a slot
    assert lane.pool.detached_issued == 0  # and a pooled one: copied out, acknowledged at once
    wait_for(lambda: lane.shm_outstanding == 0)
    assert not lane.pool._lent  # every loan acknowledged: the sender holds none of them


def test_a_held_mapping_sends_later_buffers_in_detached_slots_then_recycles() -> None:
    """The receiver keeps an array rebuilt over a slot: over the bound the sender uses fresh
    (detached) slots, acknowledged on receipt; once the array is freed the pooled slot is
    reused."""
    c = Cluster(lane_settings=LaneSettings(shm_threshold=1024, max_shm_bytes=128 * 1024))
    try:
        root = c.add()
        a, b = c.add(root), c.add(root)
        on_lane(a, b)
        lane = a.transport._peers[b.transport.pid.raw].lane
        assert isinstance(lane, UnixLane)
        data = bytearray(range(256)) * 400  # 100 KiB: a 128 KiB slot, the whole bound
        for i in range(3):
            data[0] = i
            a.transport.send(
                with_buffers(envelope(a, b.transport.pid, i), [data]), [memoryview(data)]
            )
            b.wait("got", i + 1)
            # the first is held by the receiver; a detached one is acknowledged on receipt
            wait_for(lambda: lane.shm_outstanding == 128 * 1024)
        got = [env_buffers[1][0] for env_buffers in b.got]
        assert [type(x) for x in got] == [mmap.mmap] * 3
        assert [x[0] for x in got] == [0, 1, 2]
        assert all(x[1:] == data[1:] for x in got)
        assert lane.pool.issued == 3
        assert lane.pool.detached_issued == 2
        del got
        b.got.clear()
        gc.collect()
        wait_for(lambda: lane.shm_outstanding == 0)
        # the receiver gave its detached slots back: the sender keeps what its bound allows
        wait_for(lambda: lane.pool.adopted == 1)
        a.transport.send(with_buffers(envelope(a, b.transport.pid, 3), [data]), [memoryview(data)])
        b.wait("got", 1)
        assert lane.pool.detached_issued == 2  # the recycled slot again
    finally:
        c.close()


def test_a_large_persistent_bytearray_arrives_as_a_bytearray(cluster: Cluster) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    on_lane(a, b)
    big = bytearray(b"q" * 300_000)
    env = with_buffers(envelope(a, b.transport.pid, 1), [big])
    env = msgspec.structs.replace(env, buffer_kinds=bytes([KIND_PERSISTENT]))
    a.transport.send(env, [memoryview(big)])
    b.wait("got", 1)
    (received,) = b.got[0][1]
    assert type(received) is bytearray  # the codec rebuilds a bytearray argument over it
    assert received == big


def test_over_the_shared_bytes_bound_buffers_go_inline() -> None:
    c = Cluster(lane_settings=LaneSettings(shm_threshold=1024, max_shm_bytes=1000))
    try:
        root = c.add()
        a, b = c.add(root), c.add(root)
        on_lane(a, b)
        data = bytes(range(256)) * 16
        a.transport.send(with_buffers(envelope(a, b.transport.pid, 1), [data]), [memoryview(data)])
        b.wait("got", 1)
        assert bytes(b.got[0][1][0]) == data
        lane = a.transport._peers[b.transport.pid.raw].lane
        assert isinstance(lane, UnixLane)
        assert lane.pool.issued == 0
    finally:
        c.close()


def test_force_quic_keeps_everything_on_the_stream(cluster: Cluster) -> None:
    with configured(force_quic=True):
        root = cluster.add()
        a, b = cluster.add(root), cluster.add(root)
        for i in range(50):
            a.transport.send(envelope(a, b.transport.pid, i), [])
            time.sleep(0.002)
        b.wait("got", 50)
    assert [env.sequence for env, _ in b.got] == list(range(50))
    assert a.transport.statistics().outbound_lanes == 0
    assert b.transport.statistics().inbound_lanes == 0


def test_a_tls_lane_over_tcp_checks_peers_and_keeps_order() -> None:
    c = Cluster(lane_settings=LaneSettings(kinds=("tcp",), tcp_host="127.0.0.1", force_tcp=True))
    try:
        root = c.add()
        a, b = c.add(root), c.add(root)
        for i in range(300):
            a.transport.send(envelope(a, b.transport.pid, i), [])
            if i % 50 == 0:
                time.sleep(0.01)
        wait_for(lambda: a.transport.statistics().outbound_lanes == 1)
        for i in range(300, 600):
            a.transport.send(envelope(a, b.transport.pid, i), [])
        b.wait("got", 600)
        assert [env.sequence for env, _ in b.got] == list(range(600))
        lane = a.transport._peers[b.transport.pid.raw].lane
        assert isinstance(lane, TcpLane)
        data = bytearray(b"z" * 300_000)
        a.transport.send(
            with_buffers(envelope(a, b.transport.pid, 600), [data]), [memoryview(data)]
        )
        b.wait("got", 601)
        assert bytes(b.got[-1][1][0]) == bytes(data)
    finally:
        c.close()


def test_a_broken_lane_fails_the_peer_like_a_broken_stream_and_a_later_send_recovers(
    cluster: Cluster,
) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    on_lane(a, b)
    a.transport.send(envelope(a, b.transport.pid, 1, reply=True), [])
    b.wait("got", 1)
    cluster.loop.call_soon(lambda: [lane.close() for lane in list(b.transport._inbound_lanes)])
    a.wait("bounced", 1)
    assert a.bounced[0][0].sequence == 1
    assert "closed its lane" in a.bounced[0][1]
    a.transport.send(envelope(a, b.transport.pid, 2), [])  # a new stream, a new lane
    b.wait("got", 2)
    assert b.got[-1][0].sequence == 2


def test_hostile_bytes_on_the_lane_listener_close_that_connection_only(cluster: Cluster) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    on_lane(a, b)
    manager = b.transport._lanes
    assert manager is not None
    answers = []
    for garbage in (b"\xff\xff\xff\xff", encode_handshake(Offer("x", "", 0, b"n" * 32, b"t" * 16))):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(T)
            sock.connect("\0" + manager._unix_name)
            sock.sendall(garbage)
            answer = b""
            while chunk := sock.recv(65536):  # the acceptor closes after its answer
                answer += chunk
            answers.append(answer)
    assert answers[0] == b""  # a length over the bound: closed without an answer
    assert decode_control(answers[1][4:]) == Refuse("expected an Auth message")
    a.transport.send(envelope(a, b.transport.pid, 7), [])
    b.wait("got", 1)


def test_a_lane_handshake_refuses_an_impostor_and_a_foreign_certificate() -> None:
    settings = LaneSettings(handshake_timeout=2.0)
    ids = {name: issue_identity() for name in ("a", "b", "mallory")}
    # A certificate from another development CA.
    from chrysalis.quic import DevelopmentCA

    ids["foreign"] = DevelopmentCA.create("another CA").issue()

    async def scenario() -> list[str]:
        accepted: list[bytes] = []

        def accept(token: bytes, lane: UnixLane | TcpLane) -> None:
            accepted.append(token)
            lane.close()

        b = LaneManager(ids["b"], settings, FrameLimits, accept)
        outcomes = []
        for name in ("a", "mallory", "foreign"):
            dialer = LaneManager(
                ids[name], settings, FrameLimits, lambda _token, lane: lane.close()
            )
            hello, nonce = dialer.hello()
            offer = b.offer(ids["a"].pid.raw, hello, asyncio.get_running_loop().time())
            assert offer.kind == "unix"
            try:
                lane = await dialer.dial(ids["b"].pid.raw, offer, nonce)
            except Exception as exc:
                outcomes.append(f"{name}: {exc}")
            else:
                lane.close()
                outcomes.append(f"{name}: ok")
        b.close()
        assert len(accepted) == 1
        return outcomes

    loop = asyncio.new_event_loop()
    try:
        outcomes = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert outcomes[0] == "a: ok"
    assert outcomes[1].startswith("mallory:")
    assert "expected" in outcomes[1]
    assert outcomes[2].startswith("foreign:")
    assert "refused" in outcomes[2]


def test_decoding_a_handshake_message_is_bounded() -> None:
    auth = Auth(b"t" * 16, (b"c" * 10,), b"s")
    assert decode_control(encode_handshake(auth)[4:]) == auth


def _sender_lane_against(script: Any) -> tuple[UnixLane, list[str]]:
    """A sender ``UnixLane`` on one end of a socket pair; ``script(peer_socket)`` plays the
    receiver; returns the lane and the reasons it failed with."""
    failures: list[str] = []

    async def run() -> UnixLane:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        lane = UnixLane(mine, asyncio.get_running_loop(), b"\x01" * 16, LaneSettings())
        lane.on_failed = failures.append
        lane.start_sender()
        try:
            script(theirs)
            for _ in range(50):  # let the loop read what the peer wrote
                await asyncio.sleep(0.002)
        finally:
            theirs.close()
            lane.close()
        return lane

    return asyncio.run(run()), failures


def _give_back(sock: socket.socket, fd: int | None) -> None:
    import array

    fds = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    sock.sendmsg([b"\0\0\0\0"], fds)


def test_a_slot_given_back_is_kept_only_when_it_is_a_sealed_slot() -> None:
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, 64 * 1024)
    try:
        lane, failures = _sender_lane_against(lambda peer: _give_back(peer, unsealed))
    finally:
        os.close(unsealed)
    assert failures == []  # refused quietly: it could shrink under the sender's mapping
    assert lane.pool.adopted == 0

    pool = _shm.ShmPool(1 << 20)
    taken = pool.put(memoryview(b"s" * 100_000))
    assert taken is not None
    try:
        lane, failures = _sender_lane_against(lambda peer: _give_back(peer, taken[1]))
    finally:
        os.close(taken[1])
        pool.close()
    assert failures == []
    assert lane.pool.adopted == 1  # a sealed slot of a slot size: kept


def test_a_give_back_without_its_descriptor_or_a_stray_ack_fails_the_lane() -> None:
    _lane, failures = _sender_lane_against(lambda peer: _give_back(peer, None))
    assert len(failures) == 1
    assert "gave back a slot without its descriptor" in failures[0]
    _lane, failures = _sender_lane_against(lambda peer: peer.send(b"\0\0\0\7"))
    assert len(failures) == 1
    assert "acknowledged shared memory never sent" in failures[0]


def _send_ring(sock: socket.socket, fd: int | None) -> None:
    import array

    fds = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    sock.sendmsg([b"\xff\xff\xff\xff"], fds)


def test_a_bad_acknowledgement_ring_fails_the_lane() -> None:
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, _shm.RING_BYTES)
    try:
        _lane, failures = _sender_lane_against(lambda peer: _send_ring(peer, unsealed))
    finally:
        os.close(unsealed)
    assert len(failures) == 1
    assert "bad acknowledgement ring" in failures[0]
    _lane, failures = _sender_lane_against(lambda peer: _send_ring(peer, None))
    assert len(failures) == 1
    assert "ring without its descriptor" in failures[0]


def test_a_ring_entry_for_a_slot_never_sent_fails_the_lane() -> None:
    failures: list[str] = []

    async def run() -> tuple[int, int]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        lane = UnixLane(mine, asyncio.get_running_loop(), b"\x01" * 16, LaneSettings())
        failed = asyncio.Event()

        def on_failed(reason: str) -> None:
            failures.append(reason)
            failed.set()

        lane.on_failed = on_failed
        ringed = asyncio.Event()
        attach = lane.pool.attach_ring

        def attaching(ring: _shm.AckRing) -> None:
            attach(ring)
            ringed.set()

        lane.pool.attach_ring = attaching  # type: ignore[method-assign]
        lane.start_sender()
        ring, fd = _shm.AckRing.create()
        try:
            _send_ring(theirs, fd)
        finally:
            os.close(fd)
        taken = lane.pool.put(memoryview(b"z" * 300_000))
        assert taken is not None
        os.close(taken[1])
        await asyncio.wait_for(ringed.wait(), T)  # the sender's loop read the ring's message
        ring.push(taken[0])  # a genuine acknowledgement, then one for a slot never sent
        ring.push(4242)
        outstanding = lane.shm_outstanding  # reads the ring: the first frees the slot
        await asyncio.wait_for(failed.wait(), T)
        theirs.close()
        ring.close()
        return outstanding, int(lane.closed)

    outstanding, closed = asyncio.run(run())
    assert outstanding == 0
    assert closed == 1
    assert len(failures) == 1
    assert "acknowledged shared memory never sent" in failures[0]


def test_a_corked_batch_of_frames_with_descriptors_arrives_in_order() -> None:
    """Frames with shared-memory descriptors queued together leave in one sendmsg (every
    descriptor with the batch's first byte, at most 32 per call); the receiver claims them in
    frame order."""
    from monarch.actor._base.envelope import FRAME_PREFIX as prefix
    from monarch.actor._base.envelope import ActorAddr, MessageKind
    from monarch.actor._transport.lane_proto import lane_prefix

    encoder = msgspec.msgpack.Encoder()
    got: list[tuple[int, bytes]] = []
    n = 70  # three sendmsg calls' worth of descriptors
    pool = _shm.ShmPool(256 << 20)

    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sender = UnixLane(one, loop, b"\x01" * 16, LaneSettings())
        receiver = UnixLane(two, loop, b"\x02" * 16, LaneSettings(), FrameLimits())
        done = asyncio.Event()
        ended: list[str | None] = []

        def on_message(env: Envelope, buffers: list[Any]) -> None:
            got.append((env.sequence, bytes(buffers[0])))
            if len(got) == n:
                done.set()

        receiver.start(on_message, ended.append)
        sender.start_sender()
        calls = 0
        real = one.sendmsg

        def counting(*args: Any) -> int:
            nonlocal calls
            calls += 1
            return real(*args)

        sender._sock = type("S", (), {"sendmsg": staticmethod(counting)})()
        sender.cork()
        for seq in range(n):
            data = bytes([seq]) * 70_000
            taken = pool.put(memoryview(data))
            assert taken is not None
            env = Envelope(
                MessageKind.CALL, ActorAddr(b"\x01" * 16, "root"), ActorAddr(b"\x02" * 16, "a"),
                -1, "ep", seq, None, None, b"", (len(data),), b"\x01",
            )  # fmt: skip
            header = encoder.encode(env)
            pieces = [lane_prefix([(0, taken[0])]), prefix.pack(len(header), 0), header]
            sender.send_frame(pieces, [taken[1]], 1)
        sender.uncork()
        await asyncio.wait_for(done.wait(), T)
        sender._sock = one
        sender.close()
        receiver.close()
        return calls, len(ended)

    calls, ended = asyncio.run(run())
    pool.close()
    assert [seq for seq, _data in got] == list(range(n))
    assert all(data == bytes([seq]) * 70_000 for seq, data in got)
    assert calls == 3  # 32 + 32 + 6 descriptors
    assert ended == 0


def test_sends_hinted_more_leave_together_through_the_outbox_in_order(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``send(..., more=True)`` (an actor thread with more calls queued) skips the sending
    thread's own ``sendmsg``: the frames go through the outbox and leave in batches, in order,
    and a plain send after them does not overtake them."""
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    on_lane(a, b)
    lane = a.transport._peers[b.transport.pid.raw].lane
    assert isinstance(lane, UnixLane)
    assert lane.direct
    direct: list[int] = []
    original = UnixLane.send_direct

    def counted(self: UnixLane, pieces: Any, fds: Any) -> None:
        direct.append(len(pieces))
        original(self, pieces, fds)

    monkeypatch.setattr(UnixLane, "send_direct", counted)
    a.transport.send(envelope(a, b.transport.pid, 0), [])  # the control: an idle lane, direct
    b.wait("got", 1)
    assert len(direct) == 1
    for seq in range(1, 101):
        a.transport.send(envelope(a, b.transport.pid, seq), [], more=True)
    a.transport.send(envelope(a, b.transport.pid, 101), [])
    b.wait("got", 102)
    assert [env.sequence for env, _ in b.got] == list(range(102))
    # The hinted frames never took the direct path; the last one did only if the loop had
    # drained the outbox before it was sent.
    assert len(direct) <= 2


@pytest.mark.skipif(not _shm.available(), reason="needs memfd_create")
@pytest.mark.parametrize("views", [32 << 20, 0])
def test_a_receiver_copies_bytes_out_of_its_views_of_the_senders_slots(views: int) -> None:
    """A read-only buffer in a slot is copied out of the receiver's kept view of that slot (one
    mapping per slot the sender reuses, none with ``shm_views=0``), the slot acknowledged at
    once, so the sender's slots go round."""
    from monarch.actor._base.envelope import FRAME_PREFIX as prefix
    from monarch.actor._base.envelope import ActorAddr, MessageKind
    from monarch.actor._transport.lane_proto import lane_prefix

    encoder = msgspec.msgpack.Encoder()
    got: list[bytes] = []
    n = 12

    async def run() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        settings = LaneSettings(shm_views=views)
        sender = UnixLane(one, loop, b"\x01" * 16, settings)
        receiver = UnixLane(two, loop, b"\x02" * 16, settings, FrameLimits())
        arrived = asyncio.Event()

        def on_message(env: Envelope, buffers: list[Any]) -> None:
            assert type(buffers[0]) is bytes
            got.append(buffers[0])
            arrived.set()

        ringed = asyncio.Event()
        attach = sender.pool.attach_ring

        def attaching(ring: _shm.AckRing) -> None:
            ringed.set()
            attach(ring)

        sender.pool.attach_ring = attaching  # type: ignore[method-assign]
        receiver.start(on_message, lambda _reason: None)
        sender.start_sender()
        for seq in range(n):
            data = bytes([seq]) * (1 << 20)
            taken = sender.pool.put(memoryview(data))
            assert taken is not None
            env = Envelope(
                MessageKind.CALL, ActorAddr(b"\x01" * 16, "root"), ActorAddr(b"\x02" * 16, "a"),
                -1, "ep", seq, None, None, b"", (len(data),), b"\x03",
            )  # fmt: skip
            header = encoder.encode(env)
            pieces = [lane_prefix([(0, taken[0])]), prefix.pack(len(header), 0), header]
            arrived.clear()
            sender.send_frame(pieces, [taken[1]], 1)
            await asyncio.wait_for(arrived.wait(), T)
            # The receiver's acknowledgement ring comes once, on the socket; from then on the
            # acknowledgement is in the ring when the message is handed over.
            await asyncio.wait_for(ringed.wait(), T)
            assert sender.shm_outstanding == 0
        # every acknowledgement went through the ring, none on the socket after it
        assert receiver._ring is not None
        assert receiver._ring.pushed == n
        mapped = receiver.views.mapped if receiver.views is not None else -1
        copies = receiver.views.copies if receiver.views is not None else -1
        slots = sum(len(free) for free in sender.pool._free.values())
        sender.close()
        receiver.close()
        return mapped, copies, slots

    mapped, copies, slots = asyncio.run(run())
    assert got == [bytes([seq]) * (1 << 20) for seq in range(n)]
    assert slots == 1  # one slot, reused every call
    assert (mapped, copies) == ((1, n) if views else (-1, -1))


def _reads_itself() -> bool:
    """Whether this process may ``process_vm_readv`` itself (what lending needs)."""
    one, two = socket.socketpair()
    try:
        reader = _shm.PeerReader.open(two)
        if reader is not None:
            reader.close()
        return reader is not None
    finally:
        one.close()
        two.close()


def test_lending_is_asked_for_once_and_a_bad_loan_fails_the_lane() -> None:
    """A receiver that can read its sender says so once (the sender lends from then on); a
    lent buffer it cannot read (an address with nothing there) is a clear frame error that
    ends the lane, like any hostile bytes; one that is not read-only too."""
    from monarch.actor._base.envelope import FRAME_PREFIX as prefix
    from monarch.actor._base.envelope import ActorAddr, MessageKind
    from monarch.actor._transport.lane_proto import lent_prefix

    encoder = msgspec.msgpack.Encoder()

    async def run(kind: bytes) -> tuple[bool, list[str | None], int]:
        loop = asyncio.get_running_loop()
        one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sender = UnixLane(one, loop, b"\x01" * 16, LaneSettings())
        receiver = UnixLane(two, loop, b"\x02" * 16, LaneSettings(), FrameLimits(), peer_lends=True)
        ended: list[str | None] = []
        done = asyncio.Event()

        def on_end(reason: str | None) -> None:
            ended.append(reason)
            done.set()

        receiver.start(lambda _env, _buffers: None, on_end)
        sender.start_sender()
        deadline = time.monotonic() + T
        while not sender.lend and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        env = Envelope(
            MessageKind.CALL, ActorAddr(b"\x01" * 16, "root"), ActorAddr(b"\x02" * 16, "a"),
            -1, "ep", 0, None, None, b"", (4096,), kind,
        )  # fmt: skip
        header = encoder.encode(env)
        pieces = [lent_prefix([(0, 0x4000_0001, 8)]), prefix.pack(len(header), 0), header]
        sender.send_frame(pieces, None, 1)
        await asyncio.wait_for(done.wait(), T)
        lend = sender.lend
        reads = receiver._reader.reads if receiver._reader is not None else -1
        sender.close()
        receiver.close()
        return lend, ended, reads

    if not _reads_itself():
        pytest.skip("this process cannot read itself with process_vm_readv")
    lend, ended, reads = asyncio.run(run(b"\x03"))
    assert lend
    assert reads == 0
    assert len(ended) == 1
    assert ended[0] is not None
    assert "sent bad bytes on its lane" in ended[0]
    assert "cannot read a lent buffer" in ended[0]
    _lend, ended, _reads = asyncio.run(run(b"\x02"))
    assert ended[0] is not None
    assert "not read-only" in ended[0]


def test_a_sender_with_lending_off_keeps_using_slots_when_asked_to_lend() -> None:
    """``lane_lend_bytes`` off at the sender: the receiver's request is read (the ring and
    acknowledgements still work) but the sender never lends; the default setting lends."""

    async def run(settings: LaneSettings, wait: float) -> bool:
        loop = asyncio.get_running_loop()
        one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sender = UnixLane(one, loop, b"\x01" * 16, settings)
        receiver = UnixLane(two, loop, b"\x02" * 16, LaneSettings(), FrameLimits(), peer_lends=True)
        receiver.start(lambda _env, _buffers: None, lambda _reason: None)
        sender.start_sender()
        deadline = time.monotonic() + wait
        while not sender.lend and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        asked = receiver._reader is not None
        lend = sender.lend
        sender.close()
        receiver.close()
        return asked and not lend

    if not _reads_itself():
        pytest.skip("this process cannot read itself with process_vm_readv")
    assert asyncio.run(run(LaneSettings(lend=False), 0.5))
    # the check can fail: on, the sender lends (waited for up to T: a loaded machine may hold
    # this process past a sub-second deadline before the request is read)
    assert not asyncio.run(run(LaneSettings(), T))


def _v1_hello(host: bytes, nonce: bytes) -> Hello:
    """A ``Hello`` as a sender of the release before lending was negotiated writes it (no
    ``features`` element: the bytes that release's ``encode_control`` produces)."""
    old = decode_control(msgspec.msgpack.encode(("hello", 1, host, nonce, ("unix", "tcp"))))
    assert isinstance(old, Hello)
    return old


def test_a_sender_names_lending_in_its_hello_only_where_it_lends() -> None:
    identity = issue_identity()

    def features(settings: LaneSettings) -> tuple[str, ...]:
        return LaneManager(identity, settings, FrameLimits, lambda _t, _l: None).hello()[0].features

    assert features(LaneSettings()) == ((FEATURE_LEND,) if _shm.available() else ())
    assert features(LaneSettings(lend=False)) == ()
    assert features(LaneSettings(shm_threshold=0)) == ()
    assert features(LaneSettings(kinds=("tcp",))) == ()


@pytest.mark.parametrize("hello", ["lends", "v1", "lending-off"])
def test_the_request_to_lend_goes_only_to_a_sender_whose_hello_named_it(hello: str) -> None:
    """Through the real negotiation and handshake: the accepted lane's receiver asks to borrow
    (acknowledgement ``0xFFFFFFFE`` on the socket) only when the dialer's ``Hello`` named
    ``FEATURE_LEND``; a ``Hello`` of the earlier release (no features) or of a sender with
    lending off gets nothing on its socket."""
    if not _reads_itself():
        pytest.skip("this process cannot read itself with process_vm_readv")
    ids = {name: issue_identity() for name in ("a", "b")}

    async def scenario() -> tuple[bytes, bool]:
        accepted: list[UnixLane | TcpLane] = []
        b = LaneManager(
            ids["b"], LaneSettings(), FrameLimits, lambda _t, lane: accepted.append(lane)
        )
        dialer_settings = LaneSettings(lend=hello != "lending-off")
        a = LaneManager(ids["a"], dialer_settings, FrameLimits, lambda _t, lane: lane.close())
        message, nonce = a.hello()
        if hello == "v1":
            message = _v1_hello(message.host, nonce)
        offer = b.offer(ids["a"].pid.raw, message, asyncio.get_running_loop().time())
        assert offer.kind == "unix"
        sender = await a.dial(ids["b"].pid.raw, offer, nonce)
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.01)
        (receiver,) = accepted
        assert isinstance(sender, UnixLane)
        assert isinstance(receiver, UnixLane)
        receiver.start(lambda _env, _buffers: None, lambda _reason: None)
        try:  # what the receiver wrote on starting (it writes nothing else before a frame)
            got = sender._sock.recv(64, socket.MSG_DONTWAIT)
        except BlockingIOError:
            got = b""
        asked = receiver._reader is not None
        sender.close()
        receiver.close()
        a.close()
        b.close()
        return got, asked

    got, asked = asyncio.run(scenario())
    if hello == "lends":
        assert (got, asked) == (b"\xff\xff\xff\xfe", True)
    else:
        assert (got, asked) == (b"", False)


@pytest.mark.parametrize("off", ["nowhere", "sender", "receiver", "v1-sender"])
def test_one_mib_payloads_move_whichever_side_has_lending_off(off: str) -> None:
    """1 MiB ``bytes`` through real transports: lent when both sides allow it (and this process
    can read itself), in slots when lending is off at the sender or the receiver, or when the
    sender's ``Hello`` is of the earlier release (no features): then the receiver never asks."""
    cluster = Cluster(NodeTransportSettings(dial_timeout=2.0))
    try:
        root = cluster.add()
        a = cluster.add(root, lane_settings=LaneSettings(lend=off != "sender"))
        b = cluster.add(root, lane_settings=LaneSettings(lend=off != "receiver"))
        if off == "v1-sender":
            lanes = a.transport._lanes
            assert lanes is not None
            hello = lanes.hello

            def old_hello() -> tuple[Hello, bytes]:
                message, nonce = hello()
                return _v1_hello(message.host, nonce), nonce

            lanes.hello = old_hello  # type: ignore[method-assign]
        on_lane(a, b)
        lane = a.transport._peers[b.transport.pid.raw].lane
        assert isinstance(lane, UnixLane)
        lends = off == "nowhere" and _reads_itself()
        if lends:  # the request is on its way: every payload below is lent
            wait_for(lambda: lane.lend)
        n = 8
        payloads = [bytes([i]) * (1 << 20) + os.urandom(64) for i in range(n)]
        for i, data in enumerate(payloads):
            a.transport.send(
                with_buffers(envelope(a, b.transport.pid, 1 + i), [data]), [memoryview(data)]
            )
        b.wait("got", n)
        assert [env.sequence for env, _ in b.got] == list(range(1, n + 1))
        assert [bytes(buffers[0]) for _env, buffers in b.got] == payloads
        # These went on the lane: the receiver started it (and asked then, or never).
        (inbound,) = b.transport._inbound_lanes
        assert isinstance(inbound, UnixLane)
        wait_for(lambda: lane.shm_outstanding == 0)
        if lends:
            assert lane.lend
            assert inbound._reader is not None
            assert (lane.pool.issued, lane.pool.lent) == (0, n)  # the sender lent every one
        else:
            assert not lane.lend
            assert inbound._reader is None  # never asked (so never read the sender's memory)
            assert lane.pool.lent == 0
            assert (lane.pool.issued, lane.pool.detached_issued) == (n, 0)  # slots instead
    finally:
        cluster.close()


def test_the_lane_lend_bytes_setting_reaches_the_default_lane_settings() -> None:
    from monarch.actor._transport.node import default_lane_settings

    assert default_lane_settings(object()).lend
    with configured(lane_lend_bytes=False):
        assert not default_lane_settings(object()).lend


def test_a_lent_frame_that_cannot_take_its_lane_goes_inline_and_frees_the_loan() -> None:
    """A frame prepared with lent buffers whose lane is no longer the way out (it broke, or
    another replaced it) is re-encoded with the caller's bytes inline, and its loans freed
    (the receiver will never read them)."""
    from types import SimpleNamespace

    from monarch.actor._base.envelope import FrameDecoder
    from monarch.actor._transport.node import NodeProcessTransport, _Shared

    pool = _shm.ShmPool(4 << 20)
    data = bytes(range(256)) * 1024
    view = memoryview(data)
    taken = pool.lend(view)
    assert taken is not None
    small = b"abc"
    env = with_buffers(envelope_for_unshare(), [data, small])
    lane: Any = SimpleNamespace(pool=pool)
    shared = _Shared(lane, [(0, taken[0])], [], [None, small], [view])
    fake: Any = SimpleNamespace(limits=FrameLimits())
    pieces = NodeProcessTransport._unshare(fake, env, shared)
    assert not pool.lending
    assert pool.outstanding == 0
    decoder = FrameDecoder(FrameLimits())
    decoder.receive_data(b"".join(bytes(p) for p in pieces))
    message = decoder.next_message()
    assert message is not None
    assert [bytes(b) for b in message[1]] == [data, small]
    pool.close()


def envelope_for_unshare() -> Envelope:
    from monarch.actor._base.envelope import ActorAddr, MessageKind

    return Envelope(
        MessageKind.CALL, ActorAddr(b"\x01" * 16, "root"), ActorAddr(b"\x02" * 16, "a"),
        -1, "ep", 0, None, None, b"", (), b"",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("error", "gone"), [(errno.ECONNRESET, True), (errno.EPIPE, True), (errno.ENOMEM, False)]
)
def test_only_a_reset_or_closed_end_counts_as_the_receiver_gone(error: int, gone: bool) -> None:
    """A sender whose acknowledgement read fails drops its unread loans only when the error
    says the receiver's end is gone; another error (ENOMEM) keeps them parked, since the
    receiver may still read frames already in its socket."""

    class Failing:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def recvmsg(self, *_args: object) -> Any:
            raise OSError(error, os.strerror(error))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    async def run() -> bool:
        loop = asyncio.get_running_loop()
        one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sender = UnixLane(one, loop, b"\x01" * 16, LaneSettings())
        sender._sock = Failing(one)  # type: ignore[assignment]
        sender._on_acks()
        result = sender._peer_gone
        sender._sock = one
        sender.close()
        two.close()
        return result

    assert asyncio.run(run()) is gone
