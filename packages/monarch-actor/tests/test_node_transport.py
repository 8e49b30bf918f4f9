"""NodeProcessTransport over real Chrysalis Nodes on an in-process datagram network.

A root and two children share one runtime loop (each node is a full Node: switch, QUIC,
nameserver); each gets a transport whose callbacks record what arrives and what bounces.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from chrysalis.core import Pid
from chrysalis.datagram import InprocNetwork
from chrysalis.node import JoinSettings, Node
from chrysalis.quic.testing import issue_identity
from monarch.actor._base.envelope import ActorAddr, Envelope, FrameLimits, MessageKind, PortAddr
from monarch.actor._base.errors import MessageTooLargeError
from monarch.actor._base.loop import RuntimeLoop
from monarch.actor._transport.node import (
    LaneSettings,
    NodeProcessTransport,
    NodeTransportSettings,
)
from monarch.config._registry import configured

T = 10.0


@dataclass
class Member:
    node: Any
    transport: NodeProcessTransport
    got: list[tuple[Envelope, list[bytes | bytearray]]] = field(default_factory=list)
    bounced: list[tuple[Envelope, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def deliver(self, env: Envelope, buffers: list[bytes | bytearray]) -> None:
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

    def add(self, parent: Member | None = None, limits: FrameLimits | None = None) -> Member:
        async def start() -> Member:
            join = None if parent is None else JoinSettings(parent.node.local_addr, parent.node.pid)
            identity = issue_identity()
            node = Node(identity, carrier=self.net.bind(), parent=join)
            await node.__aenter__()
            await node.wait_connected()
            transport = NodeProcessTransport(
                node, self.loop, limits=limits, settings=self.settings,
                identity=identity if self.lanes else None, lanes=self.lane_settings,
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


def test_self_addressed_envelopes_are_delivered_locally(cluster: Cluster) -> None:
    root = cluster.add()
    root.transport.send(envelope(root, root.transport.pid, 0), [])
    root.wait("got", 1)


def test_oversize_message_is_refused_at_the_sender(cluster: Cluster) -> None:
    root = cluster.add(limits=FrameLimits(max_frame_bytes=1024))
    with pytest.raises(MessageTooLargeError):
        root.transport.send(envelope(root, b"\x01" * 16, 0, payload=b"x" * 2048), [])


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
