"""The ``Switch`` from the QUIC stream to a lane, with the races driven explicitly.

Why these tests: a receiver that began shutting down between accepting a lane and reading its
``Switch`` used to drop the lane at once while still reading its streams, so the ``Switch``
found nothing ("switched to a lane it did not open", about half of the short multi-process
runs) and the envelopes the sender wrote on the lane after it were lost. The sender's
``Switch`` is held here until the receiver is inside that window, so each run takes the path
that used to fail.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor._transport.lane_proto import Switch, encode_control
from monarch.actor._transport.node import STREAM_MAGIC, NodeTransportSettings

sys.path.insert(0, str(Path(__file__).parent))
from test_lanes import wait_for
from test_node_transport import Cluster, Member, T, envelope


class _Records(logging.Handler):
    """The transport's warnings (its own handler: the ``monarch`` logger may not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def _lanes_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about lanes, also in a suite run with MONARCH_FORCE_QUIC=1."""
    monkeypatch.delenv("MONARCH_FORCE_QUIC", raising=False)


@pytest.fixture
def warnings() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("monarch.actor.transport")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(NodeTransportSettings(dial_timeout=2.0, flush_timeout=T))
    try:
        yield c
    finally:
        c.close()


class _HeldSwitch:
    """Stands in for ``a``'s ``_switch``: records the peer and leaves the lane pending, so that
    everything ``a`` sends meanwhile stays on the stream; ``release`` switches for real."""

    def __init__(self, a: Member, monkeypatch: pytest.MonkeyPatch) -> None:
        self.transport = a.transport
        self.real = a.transport._switch
        self.peers: list[Any] = []
        monkeypatch.setattr(a.transport, "_switch", self.peers.append)

    def release(self, cluster: Cluster) -> None:
        async def switch() -> None:
            self.transport._switch = self.real  # type: ignore[method-assign]
            peer = self.peers[-1]
            if peer.pending_lane is not None:  # else the lane is gone: nothing to switch to
                self.real(peer)

        cluster.run(switch())


class _HeldClose:
    """A stream whose ``wait_closed`` waits for ``released`` first: it keeps the receiver's
    shutdown in the window where it no longer takes new lanes but still reads its streams."""

    def __init__(self, stream: Any, released: asyncio.Event) -> None:
        self._stream = stream
        self._released = released

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def wait_closed(self) -> None:
        await self._released.wait()
        await self._stream.wait_closed()


def sequences(member: Member) -> list[int]:
    return [env.sequence for env, _buffers in member.got]


def test_a_switch_read_while_the_receiver_shuts_down_finds_its_lane(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, warnings: _Records
) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    # b talks to a first: b's shutdown then waits for that stream to close, and reads its
    # inbound streams meanwhile.
    b.transport.send(envelope(b, a.transport.pid, 0), [])
    a.wait("got", 1)
    held = _HeldSwitch(a, monkeypatch)
    for seq in range(10):  # the first envelopes to b: dial, Hello, Offer, lane handshake
        a.transport.send(envelope(a, b.transport.pid, seq), [])
    wait_for(lambda: held.peers and b.transport._accepted)
    b.wait("got", 10)

    released = asyncio.Event()

    async def hold_close() -> None:
        peer = b.transport._peers[a.transport.pid.raw]
        peer.stream = _HeldClose(peer.stream, released)

    cluster.run(hold_close())
    b.transport.close()
    wait_for(lambda: b.transport._shut)  # no new lane, no new stream from here on

    held.release(cluster)  # the Switch and everything after it reach b during its shutdown
    assert a.transport.statistics().outbound_lanes == 1
    for seq in range(10, 30):
        a.transport.send(envelope(a, b.transport.pid, seq), [])
    b.wait("got", 30, timeout=5.0)
    assert sequences(b) == list(range(30))  # none lost, none reordered across the switch
    assert not a.bounced
    assert not [m for m in warnings.messages if "switched" in m], warnings.messages

    cluster.loop.loop.call_soon_threadsafe(released.set)
    assert b.transport.wait_closed(T)
    assert not b.transport._accepted
    assert not b.transport._inbound_lanes


def test_an_accepted_lane_lives_as_long_as_the_stream_that_offered_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    held = _HeldSwitch(a, monkeypatch)
    a.transport.send(envelope(a, b.transport.pid, 0), [])
    wait_for(lambda: held.peers and b.transport._accepted)
    (lane,) = b.transport._accepted.values()
    # a gives up on b (as on a process death it was told of): its stream to b ends unswitched.
    a.transport.mark_unreachable(b.transport.pid, "gone")
    wait_for(lambda: not b.transport._accepted)  # no clock: the stream's end frees it
    assert lane.closed
    assert not b.transport._offered


def test_a_switch_names_only_the_lane_offered_on_its_own_stream(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, warnings: _Records
) -> None:
    root = cluster.add()
    a, b = cluster.add(root), cluster.add(root)
    held = _HeldSwitch(a, monkeypatch)
    a.transport.send(envelope(a, b.transport.pid, 0), [])
    wait_for(lambda: held.peers and b.transport._accepted)
    (token,) = b.transport._accepted

    async def second_stream() -> None:  # the same peer, another stream, the first one's token
        stream = await a.node.dial(b.transport.pid)
        stream.write(STREAM_MAGIC + encode_control(Switch(token)))
        await stream.drain()

    cluster.run(second_stream())
    wait_for(lambda: [m for m in warnings.messages if "not offered on its stream" in m])
    assert token in b.transport._accepted  # the lane still waits for its own stream's Switch
    held.release(cluster)
    for seq in range(1, 20):
        a.transport.send(envelope(a, b.transport.pid, seq), [])
    b.wait("got", 20)
    assert sequences(b) == list(range(20))
    assert b.transport.statistics().inbound_lanes == 1
