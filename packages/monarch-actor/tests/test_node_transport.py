"""NodeProcessTransport over real Chrysalis Nodes on an in-process datagram network.

A root and two children share one runtime loop (each node is a full Node: switch, QUIC,
nameserver); each gets a transport whose callbacks record what arrives and what bounces.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

from chrysalis.core import Pid
from chrysalis.datagram import InprocNetwork
from chrysalis.node import JoinSettings, Node
from chrysalis.quic.testing import issue_identity
from monarch.actor._base.codec import ReceivedBuffer
from monarch.actor._base.envelope import ActorAddr, Envelope, FrameLimits, MessageKind, PortAddr
from monarch.actor._base.errors import MessageTooLargeError
from monarch.actor._base.loop import RuntimeLoop
from monarch.actor._transport.lane import LaneSettings
from monarch.actor._transport.node import NodeProcessTransport, NodeTransportSettings
from monarch.actor._transport.seam import InProcessFabric, InProcessTransport
from monarch.config import get_global_config
from monarch.config._registry import configured

T = 10.0


@dataclass
class Member:
    node: Any
    transport: NodeProcessTransport
    got: list[tuple[Envelope, list[ReceivedBuffer]]] = field(default_factory=list)
    bounced: list[tuple[Envelope, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def deliver(self, env: Envelope, buffers: list[ReceivedBuffer]) -> None:
        with self.cond:
            self.got.append((env, buffers))
            self.cond.notify_all()

    def bounce(self, env: Envelope, reason: str) -> None:
        with self.cond:
            self.bounced.append((env, reason))
            self.cond.notify_all()

    def wait(self, what: str, count: int, timeout: float = T) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(getattr(self, what)) >= count, timeout)
        assert ok, f"{what}: {len(getattr(self, what))} < {count}"


class Cluster:
    """Nodes on one in-process network; ``lanes`` gives each transport its identity (so the
    transports negotiate direct lanes) and ``lane_settings`` bounds them."""

    def __init__(
        self,
        settings: NodeTransportSettings | None = None,
        *,
        lanes: bool = True,
        lane_settings: LaneSettings | None = None,
    ) -> None:
        self.loop = RuntimeLoop("test-node-transport")
        self.loop.start()
        self.net = InprocNetwork()
        self.members: list[Member] = []
        self.settings = settings
        self.lanes = lanes
        self.lane_settings = lane_settings

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop.loop).result(T)

    def add(
        self,
        parent: Member | None = None,
        limits: FrameLimits | None = None,
        hosts: Callable[[bytes], bool] | None = None,
        lane_settings: LaneSettings | None = None,
    ) -> Member:
        """A new member (``lane_settings``: this one's, instead of the cluster's)."""

        async def start() -> Member:
            join = None if parent is None else JoinSettings(parent.node.local_addr, parent.node.pid)
            identity = issue_identity()
            node = Node(identity, carrier=self.net.bind(), parent=join)
            await node.__aenter__()
            await node.wait_connected()
            transport = NodeProcessTransport(
                node, self.loop, limits=limits, settings=self.settings, hosts=hosts,
                identity=identity if self.lanes else None,
                lanes=lane_settings or self.lane_settings,
            )  # fmt: skip
            member = Member(node, transport)
            transport.attach(self.loop, member.deliver, member.bounce)
            transport.start()
            return member

        member: Member = self.run(start())
        self.members.append(member)
        return member

    def close(self) -> None:
        async def stop() -> None:
            for member in reversed(self.members):
                await member.transport.aclose()
                await member.node.aclose()

        try:
            self.run(stop())
        finally:
            self.loop.stop()


@pytest.fixture(params=["lanes", "force-quic"])
def transport_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs with direct lanes and with the ``force_quic`` setting."""
    if request.param == "force-quic":
        with configured(force_quic=True):
            yield request.param
    else:
        yield request.param


@pytest.fixture
def cluster(transport_mode: str) -> Iterator[Cluster]:
    c = Cluster(NodeTransportSettings(dial_timeout=2.0))
    try:
        yield c
    finally:
        c.close()


def envelope(
    src: Member, dst: Pid | bytes, seq: int, payload: bytes = b"x", reply: bool = False
) -> Envelope:
    raw = dst.raw if isinstance(dst, Pid) else dst
    port = PortAddr(src.transport.pid.raw, "root", 7) if reply else None
    return Envelope(
        MessageKind.CALL, ActorAddr(src.transport.pid.raw, "root"), ActorAddr(raw, "a"),
        -1, "ep", seq, port, None, payload,
    )  # fmt: skip


def test_envelopes_between_sibling_processes_arrive_in_send_order(cluster: Cluster) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    for i in range(200):
        a.transport.send(envelope(a, b.transport.pid, i, payload=i.to_bytes(4, "big")), [])
    b.wait("got", 200)
    assert [env.sequence for env, _ in b.got] == list(range(200))
    assert all(env.sender.pid == a.transport.pid.raw for env, _ in b.got)


def test_out_of_band_buffers_are_copied_and_arrive_intact(cluster: Cluster) -> None:
    root = cluster.add()
    child = cluster.add(root)
    big = bytearray(range(256)) * 4096  # 1 MiB, written in chunks
    env = envelope(child, root.transport.pid, 0)
    env = Envelope(
        env.kind, env.sender, env.target, -1, "ep", 0, None, None, b"h",
        (len(big), 3), b"\x00\x01",
    )  # fmt: skip
    child.transport.send(env, [memoryview(big), memoryview(b"abc")])
    big[0] = 255  # the sender may reuse its memory once send returned
    root.wait("got", 1)
    _, buffers = root.got[0]
    assert buffers[0][0] == 0
    assert bytes(buffers[0]) == bytes(bytearray(range(256)) * 4096)
    assert bytes(buffers[1]) == b"abc"


def test_unknown_pid_bounces_with_a_clear_reason(cluster: Cluster) -> None:
    root = cluster.add()
    child = cluster.add(root)
    child.transport.send(envelope(child, b"\x07" * 16, 0), [])
    child.wait("bounced", 1)
    assert "unreachable" in child.bounced[0][1]
    assert "0707" in child.bounced[0][1]


def test_mark_unreachable_fails_outstanding_calls_and_later_sends(cluster: Cluster) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    a.transport.send(envelope(a, b.transport.pid, 0, reply=True), [])
    b.wait("got", 1)  # delivered, but b never answers
    a.transport.mark_unreachable(b.transport.pid, "process b was killed")
    a.wait("bounced", 1)
    assert a.bounced[0][0].sequence == 0
    assert a.bounced[0][1] == "process b was killed"
    a.transport.send(envelope(a, b.transport.pid, 1), [])
    a.wait("bounced", 2)
    assert a.bounced[1][0].sequence == 1


def test_a_bounced_call_keeps_only_a_small_payload(cluster: Cluster) -> None:
    """A remembered call holds at most 256 bytes of payload until its reply (a bounce does not
    read it): a larger one is remembered without its payload."""
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    for seq, size in ((0, 256), (1, 257)):
        call = Envelope(
            MessageKind.CALL, ActorAddr(a.transport.pid.raw, "root"),
            ActorAddr(b.transport.pid.raw, "a"), -1, "ep", seq,
            PortAddr(a.transport.pid.raw, "root", 10 + seq), None, b"p" * size,
        )  # fmt: skip
        a.transport.send(call, [])
    b.wait("got", 2)
    a.transport.mark_unreachable(b.transport.pid, "gone")
    a.wait("bounced", 2)
    payloads = {env.sequence: env.payload for env, _reason in a.bounced}
    assert payloads == {0: b"p" * 256, 1: b""}


def test_a_fenced_process_is_refused_what_it_still_sends(
    cluster: Cluster, wait_until: Callable[..., None]
) -> None:
    """A process declared dead while it may still run (``fence=True``): what arrives from it
    afterwards, on its open stream or lane, is refused and counted, never delivered."""
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    b.transport.send(envelope(b, a.transport.pid, 0), [])
    a.wait("got", 1)
    a.transport.mark_unreachable(b.transport.pid, "declared dead", fence=True)
    wait_until(lambda: a.transport.statistics().unreachable == 1, T)
    for seq in (1, 2):
        b.transport.send(envelope(b, a.transport.pid, seq), [])
    wait_until(lambda: a.transport.statistics().refused == 2, T)
    assert [env.sequence for env, _ in a.got] == [0]


def test_an_exited_process_is_not_fenced(cluster: Cluster, wait_until: Callable[..., None]) -> None:
    """Without ``fence`` (the process exited) what it sent before is still delivered."""
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    b.transport.send(envelope(b, a.transport.pid, 0), [])
    a.wait("got", 1)
    a.transport.mark_unreachable(b.transport.pid, "exited")
    wait_until(lambda: a.transport.statistics().unreachable == 1, T)
    b.transport.send(envelope(b, a.transport.pid, 1), [])
    a.wait("got", 2)
    assert a.transport.statistics().refused == 0


def test_a_reply_clears_the_outstanding_call(cluster: Cluster) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    a.transport.send(envelope(a, b.transport.pid, 0, reply=True), [])
    b.wait("got", 1)
    reply = Envelope(
        MessageKind.PORT_VALUE, ActorAddr(b.transport.pid.raw, "a"),
        ActorAddr(a.transport.pid.raw, "root"), 7, "", 0, None, None, b"r",
    )  # fmt: skip
    b.transport.send(reply, [])
    a.wait("got", 1)
    a.transport.mark_unreachable(b.transport.pid, "gone")
    time.sleep(0.1)
    assert a.bounced == []  # nothing was waiting any more


def test_parent_and_child_streams_ride_their_link_connection_when_lanes_carry_them(
    cluster: Cluster, transport_mode: str
) -> None:
    """A parent and its child already share an authenticated link connection (the join's):
    with lanes, their envelope streams open on it, so neither dials a connection of its own
    (no handshake); with every message on QUIC they keep their own connections."""
    root = cluster.add()
    child = cluster.add(root)
    for i in range(50):
        root.transport.send(envelope(root, child.transport.pid, i), [])
        child.transport.send(envelope(child, root.transport.pid, i), [])
    root.wait("got", 50)
    child.wait("got", 50)
    assert [env.sequence for env, _ in root.got] == list(range(50))
    assert [env.sequence for env, _ in child.got] == list(range(50))
    dials = [m.node.transport.statistics().dials for m in (root, child)]
    if transport_mode == "lanes" and not get_global_config()["force_quic"]:  # not set outside
        assert dials == [0, 1]  # the child's join alone
        assert root.transport.statistics().refused == 0
    else:
        assert sum(dials) >= 2  # the join, then application connections (both may dial)


def test_self_addressed_envelopes_are_delivered_locally(cluster: Cluster) -> None:
    root = cluster.add()
    root.transport.send(envelope(root, root.transport.pid, 0), [])
    root.wait("got", 1)


def test_oversize_message_is_refused_at_the_sender(cluster: Cluster) -> None:
    root = cluster.add(limits=FrameLimits(max_frame_bytes=1024))
    with pytest.raises(MessageTooLargeError):
        root.transport.send(envelope(root, b"\x01" * 16, 0, payload=b"x" * 2048), [])


def test_a_broadcast_sends_the_envelopes_before_one_that_fails(cluster: Cluster) -> None:
    """``send_each`` encodes every frame first, yet an envelope that fails raises only once
    the ones before it were sent, as one ``send`` after the other would."""
    root = cluster.add(limits=FrameLimits(max_frame_bytes=1024))
    a, b = cluster.add(root), cluster.add(root)
    envelopes = [
        envelope(root, a.transport.pid, 0),
        envelope(root, b.transport.pid, 0, payload=b"x" * 2048),
        envelope(root, a.transport.pid, 1),
    ]
    with pytest.raises(MessageTooLargeError):
        root.transport.send_each(envelopes, [])
    # markers sent after it: in order per sender, so what the broadcast sent came before them
    root.transport.send(envelope(root, a.transport.pid, 2), [])
    root.transport.send(envelope(root, b.transport.pid, 3), [])
    a.wait("got", 2)
    b.wait("got", 1)
    assert [env.sequence for env, _ in a.got] == [0, 2]  # not the one after the failure
    assert [env.sequence for env, _ in b.got] == [3]


def test_full_outbound_queue_bounces_instead_of_growing() -> None:
    c = Cluster(NodeTransportSettings(dial_timeout=1.0, max_queued_frames=2))
    try:
        root = c.add()

        def burst() -> None:  # on the loop: no frame can leave before all five are sent
            for i in range(5):
                root.transport.send(envelope(root, b"\x09" * 16, i), [])

        c.loop.call_soon(burst)
        root.wait("bounced", 5)
        reasons = [reason for _, reason in root.bounced]
        assert sum("queue is full" in r for r in reasons) == 3
        assert root.transport.statistics().queued_frames == 0
    finally:
        c.close()


def test_closed_transport_bounces_new_envelopes(cluster: Cluster) -> None:
    root = cluster.add()
    root.transport.close()
    assert root.transport.wait_closed(T)
    root.transport.send(envelope(root, b"\x05" * 16, 0), [])
    root.wait("bounced", 1)
    assert "closed" in root.bounced[0][1]


# --- the client's shape: a fabric whose uplink is the node's transport ---------------------------


class Inbox:
    """A fabric member's callbacks: what arrives, what bounces, and whether each delivery ran
    inside the node transport's inbound handler (the direct path) or later, from the loop's
    queue."""

    def __init__(self) -> None:
        self.got: list[Envelope] = []
        self.direct: list[bool] = []
        self.bounced: list[tuple[Envelope, str]] = []
        self.cond = threading.Condition()

    def deliver(self, env: Envelope, buffers: list[ReceivedBuffer]) -> None:
        frame: FrameType | None = sys._getframe(1)
        inbound = NodeProcessTransport._on_inbound.__code__
        while frame is not None and frame.f_code is not inbound:
            frame = frame.f_back
        with self.cond:
            self.got.append(env)
            self.direct.append(frame is not None)
            self.cond.notify_all()

    def bounce(self, env: Envelope, reason: str) -> None:
        with self.cond:
            self.bounced.append((env, reason))
            self.cond.notify_all()

    def wait(self, what: str, count: int) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(getattr(self, what)) >= count, T)
        assert ok, f"{what}: {len(getattr(self, what))} < {count}"


@dataclass
class ClientShape:
    """A node whose transport delivers into an ``InProcessFabric`` (as the client's does):
    ``own`` is attached with the node's PID (the client's runtime), ``sim`` with a PID of its
    own (an in-process simulated process)."""

    node: Member
    fabric: InProcessFabric
    own: InProcessTransport
    own_inbox: Inbox
    sim: InProcessTransport
    sim_inbox: Inbox


def client_shape(cluster: Cluster, parent: Member) -> ClientShape:
    fabric = InProcessFabric()
    holder = cluster.add(parent, hosts=fabric.hosts)
    transport = holder.transport
    transport.attach(cluster.loop, fabric.deliver_inbound, fabric.bounce_inbound)
    fabric.uplink = transport
    own_inbox, sim_inbox = Inbox(), Inbox()
    own = fabric.attach(cluster.loop, own_inbox.deliver, own_inbox.bounce, transport.pid)
    sim = fabric.attach(cluster.loop, sim_inbox.deliver, sim_inbox.bounce)
    return ClientShape(holder, fabric, own, own_inbox, sim, sim_inbox)


def fabric_envelope(src: InProcessTransport, dst: Pid, seq: int, reply: bool = False) -> Envelope:
    port = PortAddr(src.pid.raw, "root", 7) if reply else None
    return Envelope(
        MessageKind.CALL, ActorAddr(src.pid.raw, "root"), ActorAddr(dst.raw, "a"),
        -1, "ep", seq, port, None, b"x",
    )  # fmt: skip


def test_the_uplink_delivers_to_the_clients_runtime_directly_and_in_order(
    cluster: Cluster,
) -> None:
    """A reply to the client goes from the node transport straight to its runtime's callback,
    in the same loop tick (no second hop through the fabric's ``call_soon``); each sender's
    order holds, also with two senders interleaved."""
    root = cluster.add()
    shape = client_shape(cluster, root)
    a, b = cluster.add(root), cluster.add(root)
    for i in range(100):
        sender = a if i % 3 else b
        sender.transport.send(envelope(sender, shape.own.pid, i), [])
    shape.own_inbox.wait("got", 100)
    got = shape.own_inbox.got
    assert [e.sequence for e in got if e.sender.pid == a.transport.pid.raw] == [
        i for i in range(100) if i % 3
    ]
    assert [e.sequence for e in got if e.sender.pid == b.transport.pid.raw] == [
        i for i in range(100) if not i % 3
    ]
    assert all(shape.own_inbox.direct)


def test_deliver_inbound_from_another_thread_still_goes_through_the_loop() -> None:
    """Off the member's loop thread the fabric keeps the thread-safe hand-off: the callback
    runs on the member's loop, in order."""
    loop = RuntimeLoop("test-fabric")
    loop.start()
    try:
        fabric = InProcessFabric()
        threads: list[int] = []
        inbox = Inbox()

        def deliver(env: Envelope, buffers: list[ReceivedBuffer]) -> None:
            threads.append(threading.get_ident())
            inbox.deliver(env, buffers)

        member = fabric.attach(loop, deliver, inbox.bounce)
        for i in range(20):
            fabric.deliver_inbound(fabric_envelope(member, member.pid, i), [])
        inbox.wait("got", 20)
        assert [e.sequence for e in inbox.got] == list(range(20))
        assert threading.get_ident() not in threads
        assert len(set(threads)) == 1
    finally:
        loop.stop()


def test_client_shape_bounces_and_fencing_still_hold(
    cluster: Cluster, wait_until: Callable[..., None]
) -> None:
    """Through the uplink: a call from the client to a worker that dies bounces to the client's
    callback, a send to an unreachable PID bounces too, and a fenced worker's later envelopes are
    refused before they reach the fabric."""
    root = cluster.add()
    shape = client_shape(cluster, root)
    worker = cluster.add(root)
    shape.own.send(fabric_envelope(shape.own, worker.transport.pid, 0, reply=True), [])
    worker.wait("got", 1)  # delivered; the worker never answers
    worker.transport.send(envelope(worker, shape.own.pid, 1), [])
    shape.own_inbox.wait("got", 1)
    shape.node.transport.mark_unreachable(worker.transport.pid, "declared dead", fence=True)
    shape.own_inbox.wait("bounced", 1)
    assert shape.own_inbox.bounced[0][0].sequence == 0
    assert shape.own_inbox.bounced[0][1] == "declared dead"
    shape.sim.send(fabric_envelope(shape.sim, worker.transport.pid, 2), [])
    shape.sim_inbox.wait("bounced", 1)
    assert shape.sim_inbox.bounced[0][1] == "declared dead"
    for seq in (3, 4):
        worker.transport.send(envelope(worker, shape.own.pid, seq), [])
    wait_until(lambda: shape.node.transport.statistics().refused == 2, T)
    assert [e.sequence for e in shape.own_inbox.got] == [1]
    assert shape.sim_inbox.got == []
