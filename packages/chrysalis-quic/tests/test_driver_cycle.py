"""The inline drivers' cycle skips work that cannot have changed: a ``poll`` with nothing new
(``QuicEndpoint.poll_hint``), the progress pass for held acknowledgements that acknowledge
nothing yet, and the re-arming of a loop timer that another one covers (``_InlineDriver``'s
two timers). Each test here fails if a skip loses work: a submission, a cancellation, an
acknowledged send, data waiting for room, or a timer that must fire."""

from __future__ import annotations

import asyncio
import heapq
import sys
import threading
import types
from pathlib import Path
from typing import Any, cast

sys.path.append(str(Path(__file__).parent))

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_endpoint_harness import Net, Node, pair

from chrysalis.core.completion import (
    ConnectionRef,
    DriverStopped,
    ReceiveCompletion,
    ReceiveStatus,
    SendCompletion,
    SendOutcome,
    Wakeup,
)
from chrysalis.quic._asyncio import _InlineDriver, _LoopNotifier
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._endpoint import Close, EndpointRole, Shutdown


class _EpochHint:
    """A poll hint that reads the channels' own driver notifier (a ``Wakeup``): "unpolled"
    while its epoch moved since the last poll, exactly what a notifier that sets a flag on
    every ``notify`` reports."""

    def __init__(self, wakeup: Wakeup) -> None:
        self._wakeup = wakeup
        self._seen = -1
        self._forced = False
        self.polls = 0  # polls that looked at the queues

    @property
    def unpolled(self) -> bool:
        return self._forced or self._wakeup.epoch() != self._seen

    @unpolled.setter
    def unpolled(self, value: bool) -> None:
        if value:
            self._forced = True
        else:
            self.polls += 1
            self._forced = False
            self._seen = self._wakeup.epoch()


def _hinted(node: Node) -> _EpochHint:
    notifier = node.channels.driver_notifier
    assert isinstance(notifier, Wakeup)
    hint = _EpochHint(notifier)
    node.endpoint.poll_hint = hint
    return hint


def _held_pump(net: Net) -> bool:
    """``Net.pump`` as the inline driver runs it: acknowledgement checks held while datagrams
    are fed, released before the poll that follows (``hold_ack_checks``)."""
    now = net.now
    before = (net.sent, sum(len(node.completions) for node in net.nodes.values()))
    for node in list(net.nodes.values()):
        node.endpoint.poll(now)
        for data, destination in node.endpoint.datagrams_to_send(now):
            net.inject(node.addr, destination, data)
    delivered = 0
    for node in net.nodes.values():
        node.endpoint.hold_ack_checks = True
    while net._flights and net._flights[0].at <= now:
        flight = heapq.heappop(net._flights)
        target = net.nodes.get(flight.destination)
        delivered += 1
        if target is not None:
            target.endpoint.receive_datagram(flight.data, flight.source, now)
    for node in list(net.nodes.values()):
        endpoint = node.endpoint
        timer = endpoint.get_timer()
        if timer is not None and timer <= now:
            endpoint.handle_timer(now)
        endpoint.hold_ack_checks = False
        endpoint.poll(now)
        for data, destination in endpoint.datagrams_to_send(now):
            net.inject(node.addr, destination, data)
        if node.auto_drain:
            node.drain()
    after = (net.sent, sum(len(node.completions) for node in net.nodes.values()))
    return delivered > 0 or after != before


def _run_held(net: Net, done: Any, *, within: float = 5.0) -> None:
    deadline = net.now + within
    for _ in range(100_000):
        progressed = _held_pump(net)
        if done():
            return
        if progressed:
            continue
        upcoming = net.next_time()
        assert upcoming is not None, "the network went idle before the condition held"
        assert upcoming <= deadline, f"condition not reached within {within} virtual seconds"
        net.now = max(upcoming, net.now + 1e-6)
    raise AssertionError("too many rounds")


def _connected(**options: Any) -> tuple[Net, Node, Node, ConnectionRef]:
    net, client, server = pair(**options)
    return net, client, server, client.connect(server)


# -- the poll hint --------------------------------------------------------------------------------


def test_a_poll_without_news_is_skipped_and_news_is_polled() -> None:
    # The skip exists (a hint that claims nothing is new leaves a queued send alone), and a
    # notification (here the push into the empty queue) makes the next poll look.
    net, client, server, conn = _connected()
    stream = client.open(conn)
    hint = _hinted(client)
    client.endpoint.poll(net.now)
    looked = hint.polls
    client.endpoint.poll(net.now)
    assert hint.polls == looked  # nothing new: skipped
    sent = client.send(stream, b"hello")
    hint._seen = hint._wakeup.epoch()  # make the hint lie: "nothing new" (a send is queued)
    client.endpoint.poll(net.now)
    assert len(client.channels.submissions) == 1  # skipped: the send is still queued
    hint.unpolled = True
    incoming = server.incoming()
    net.run_until(lambda: client.op(sent) is not None)
    assert client.op(sent).outcome is SendOutcome.ACKNOWLEDGED  # type: ignore[union-attr]
    received = server.wait_op(server.receive(incoming, 64, min_bytes=5))
    assert isinstance(received, ReceiveCompletion)
    assert bytes(received.data()) == b"hello"


def test_hinted_polls_admit_everything_beyond_the_per_poll_bound() -> None:
    # A push notifies only an empty queue: submissions left behind by the per-poll bound
    # come with no new notification, and ``backlogged`` must keep the polls going.
    config = QuicConfig(max_submissions_per_poll=2)
    net, client, server, conn = _connected(client_config=config)
    stream = client.open(conn)
    hint = _hinted(client)
    net.run_for(0.05)
    sends = [client.send(stream, bytes([65 + index]) * 3) for index in range(7)]
    submissions = client.channels.submissions
    for left in (5, 3, 1, 0):  # one notification for the seven; nothing else happens
        client.endpoint.poll(net.now)
        assert len(submissions) == left
    incoming = server.incoming()
    net.run_until(lambda: all(client.op(sent) is not None for sent in sends))
    assert [client.op(sent).outcome for sent in sends] == [  # type: ignore[union-attr]
        SendOutcome.ACKNOWLEDGED
    ] * 7
    received = server.wait_op(server.receive(incoming, 64, min_bytes=21))
    assert isinstance(received, ReceiveCompletion)
    assert bytes(received.data()) == b"AAABBBCCCDDDEEEFFFGGG"
    assert hint.polls > 0


def test_hinted_polls_take_cancellations_and_shutdown() -> None:
    net, client, server, conn = _connected()
    stream = client.open(conn)
    client.send(stream, b"x")
    incoming = server.incoming()
    hint = _hinted(server)
    net.run_for(0.05)
    # A posted receive with nothing to read waits; its cancellation must reach the endpoint.
    first = server.receive(incoming, 64, min_bytes=2)
    net.run_for(0.05)
    assert server.op(first) is None
    assert first.cancellation is not None
    first.cancellation.cancel()
    net.run_until(lambda: server.op(first) is not None)
    cancelled = server.op(first)
    assert isinstance(cancelled, ReceiveCompletion)
    assert cancelled.status is ReceiveStatus.CANCELLED
    # DRAINING is the endpoint's own work: every poll advances it until the driver stops.
    server.submit(Shutdown(grace=0.5))
    net.run_until(lambda: bool(server.of_type(DriverStopped)), within=2.0)
    assert server.endpoint.is_stopped
    assert hint.polls > 0


def test_hinted_polls_resume_work_held_back_by_staged_completions() -> None:
    # A full completion queue stages completions and holds new submissions back; consuming
    # notifies (queue space), after which the hinted polls must admit the rest.
    net = Net()
    client = net.add("client", role=EndpointRole.CLIENT)
    server = net.add(
        "server",
        role=EndpointRole.SERVER,
        completion_queue_capacity=2,
        config=QuicConfig(max_staged_completions=1),
    )
    conn = client.connect(server)
    stream = client.open(conn)
    client.send(stream, b"0123456789")
    incoming = server.incoming()
    hint = _hinted(server)
    net.run_until(lambda: server.endpoint.poll_hint is hint and bool(server.completions))
    server.auto_drain = False
    receipts = [server.receive(incoming, 1, min_bytes=1) for _ in range(3)]
    net.run_for(0.1)
    receipts += [server.receive(incoming, 1, min_bytes=1) for _ in range(5)]
    net.run_for(0.1)
    assert any(server.op(receipt) is None for receipt in receipts)  # held back
    assert server.endpoint._staged  # staged behind the full completion queue
    server.auto_drain = True
    net.run_until(lambda: all(server.op(receipt) is not None for receipt in receipts))
    data = []
    for receipt in receipts:
        done = server.op(receipt)
        assert isinstance(done, ReceiveCompletion)
        data.append(bytes(done.data()))
    assert b"".join(data) == b"01234567"
    assert hint.polls > 0


# -- held acknowledgements ------------------------------------------------------------------------


def test_held_acks_complete_sends_and_refill_a_full_engine_buffer() -> None:
    # With the inline driver's hold, a datagram that acknowledges nothing new of a stream
    # skips its progress pass; one that frees room for queued data (``send_ops``) or
    # acknowledges the oldest send must not.
    config = QuicConfig(stream_send_buffer=4096)
    net, client, server, conn = _connected(client_config=config)
    stream = client.open(conn)
    _hinted(client)
    _hinted(server)
    payload = bytes(range(256)) * 200  # 51,200 bytes through a 4 KiB engine buffer
    sends = [
        client.send(stream, payload[index : index + 12_800]) for index in range(0, 51_200, 12_800)
    ]
    incoming = server.incoming()
    reads: list[bytes] = []

    def all_read() -> bool:
        receipt = server.receive(incoming, 65536, min_bytes=1)
        _run_held(net, lambda: server.op(receipt) is not None)
        done = server.op(receipt)
        assert isinstance(done, ReceiveCompletion)
        reads.append(bytes(done.data()))
        return sum(map(len, reads)) >= len(payload)

    for _ in range(200):
        if all_read():
            break
    assert b"".join(reads) == payload
    _run_held(net, lambda: all(client.op(sent) is not None for sent in sends))
    assert [client.op(sent).outcome for sent in sends] == [  # type: ignore[union-attr]
        SendOutcome.ACKNOWLEDGED
    ] * 4
    assert [client.op(sent).acknowledged_through for sent in sends] == [  # type: ignore[union-attr]
        12_800,
        25_600,
        38_400,
        51_200,
    ]


def test_held_acks_of_a_ping_pong_complete_every_send_in_order() -> None:
    net, client, server, conn = _connected()
    stream = client.open(conn)
    _hinted(client)
    _hinted(server)
    sends = []
    incoming = None
    for index in range(20):
        sends.append(client.send(stream, b"%02d" % index))
        if incoming is None:
            incoming = server.incoming()
        receipt = server.receive(incoming, 2, min_bytes=2)
        _run_held(net, lambda receipt=receipt: server.op(receipt) is not None)
    _run_held(net, lambda: all(client.op(sent) is not None for sent in sends))
    outcomes = [done for sent in sends if isinstance(done := client.op(sent), SendCompletion)]
    assert [done.outcome for done in outcomes] == [SendOutcome.ACKNOWLEDGED] * 20
    assert [done.acknowledged_through for done in outcomes] == [
        2 * (index + 1) for index in range(20)
    ]
    order = [
        getattr(c, "operation", None)
        for c in client.completions
        if getattr(c, "stream", None) == stream
    ]
    assert [o for o in order if o in {sent.operation for sent in sends}] == [
        sent.operation for sent in sends
    ]


# -- the inline driver's two loop timers ---------------------------------------------------------


class _StubDriver:
    def __init__(self, endpoint: Any) -> None:
        self.endpoint = endpoint
        self._deadline: float | None = None
        self._blocked = None
        self._socket_failed = False
        self.socket = self

    def readiness_fds(self) -> list[int]:
        return [0]  # "registered descriptors": ``_arm`` then only manages the timers


class _StubEndpoint:
    hold_ack_checks = False
    poll_hint = None


def _driver(loop: asyncio.AbstractEventLoop) -> tuple[_InlineDriver, _StubDriver]:
    stub = _StubDriver(_StubEndpoint())
    core = types.SimpleNamespace(write_through=None, read_ahead_due=None)
    inline = _InlineDriver(loop, stub, core, _LoopNotifier(loop), threading.Event())  # type: ignore[arg-type]
    return inline, stub


def _armed(inline: _InlineDriver) -> list[tuple[float, Any]]:
    armed = []
    for handle, at in ((inline._timer, inline._timer_at), (inline._near, inline._near_at)):
        if handle is not None:
            assert not handle.cancelled()
            assert handle.when() == at
            armed.append((at, handle))
        else:
            assert at == float("inf")
    return armed


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["arm", "fire-timer", "fire-near"]),
            st.one_of(st.none(), st.floats(min_value=1.0, max_value=100.0)),
        ),
        max_size=40,
    )
)
def test_the_two_loop_timers_always_cover_the_deadline(ops: list[tuple[str, float | None]]) -> None:
    # Deadlines lie 1-100 s ahead (never due here): after every arm and every early fire,
    # some armed loop timer is at or before the driver's deadline; a fire runs a step only
    # when the deadline is due (or gone).
    loop = asyncio.new_event_loop()
    try:
        inline, stub = _driver(loop)
        ran: list[bool] = []
        expected: list[bool] = []
        original = _InlineDriver._run
        _InlineDriver._run = lambda self: ran.append(True)  # type: ignore[method-assign]
        try:
            base = loop.time()
            for op, offset in ops:
                stub._deadline = None if offset is None else base + offset
                if op == "arm":
                    inline._arm()
                elif op == "fire-timer" and inline._timer is not None:
                    inline._timer.cancel()  # fired: the loop dropped it
                    inline._on_timer()
                elif op == "fire-near" and inline._near is not None:
                    inline._near.cancel()
                    inline._on_near()
                else:
                    continue
                if op != "arm" and stub._deadline is None:
                    expected.append(True)
                armed = _armed(inline)
                if stub._deadline is not None:
                    assert armed
                    assert min(at for at, _ in armed) <= stub._deadline
            assert ran == expected
            # A deadline that is due runs a step from either timer.
            stub._deadline = base + 50.0
            inline._arm()
            stub._deadline = base + 1.0
            inline._arm()
            assert inline._near is not None or inline._timer_at <= stub._deadline
            stub._deadline = loop.time() - 1.0
            for handle, fire in (
                (inline._near, inline._on_near),
                (inline._timer, inline._on_timer),
            ):
                if handle is not None:
                    handle.cancel()
                    ran.clear()
                    fire()
                    assert ran == [True]
        finally:
            _InlineDriver._run = original  # type: ignore[method-assign]
    finally:
        loop.close()


def test_an_ack_deadline_that_comes_and_goes_keeps_the_loss_timer_armed() -> None:
    # The qh3 pattern: the deadline alternates between a near ACK timer and a later,
    # receding loss timer. The loss timer's loop timer stays armed; the near one is armed
    # for the ACK deadline and cancelled when the deadline recedes again.
    loop = asyncio.new_event_loop()
    try:
        inline, stub = _driver(loop)
        base = loop.time()
        stub._deadline = base + 40.0
        inline._arm()
        far = inline._timer
        assert far is not None
        for step in range(10):
            stub._deadline = base + 1.0 + step * 0.001  # the held ACK
            inline._arm()
            near = inline._near
            assert inline._timer is far
            assert near is not None
            assert near.when() == stub._deadline
            stub._deadline = base + 40.0 + step * 0.001  # the next packet: the loss timer
            inline._arm()
            assert inline._timer is far
            assert inline._near is None
            assert near.cancelled()
        assert not far.cancelled()
        # The loss timer fires early (it receded) and re-arms for the real deadline.
        far.cancel()
        inline._on_timer()
        assert inline._timer is not None
        assert inline._timer_at == stub._deadline
        inline.close()
    finally:
        loop.close()


@pytest.mark.parametrize("engine", ["aioquic", "qh3"])
def test_the_inline_driver_fires_timers_after_alternating_deadlines(engine: str) -> None:
    # End to end on the event loop, after a ping-pong that made the deadline alternate:
    # a lone write is acknowledged only by the receiver's delayed-ACK timer (nothing else
    # makes it send), and a peer cut off is declared dead only by the idle timer.
    from chrysalis.faultnet import FaultyNetwork
    from chrysalis.quic import AsyncioEndpoint, ConnectionLostError
    from chrysalis.quic.testing import connected_stream_pair, issue_identities

    factory: Any = None
    if engine == "qh3":
        qh3_engine = pytest.importorskip("chrysalis.quic._engines.qh3")
        factory = qh3_engine.Qh3Engine

    async def main() -> None:
        first_id, second_id = issue_identities(2)
        # 2 s: the ping-pong and the lone writes run on a real clock; at 0.5 s, this process
        # held off the CPU that long (both ends stopped) idled the connection out mid-test
        config = QuicConfig(idle_timeout=2.0)
        with FaultyNetwork() as net:
            async with (
                AsyncioEndpoint.spawn_duplex(
                    first_id, net.bind(), config=config, engine=factory
                ) as first,
                AsyncioEndpoint.spawn_duplex(
                    second_id, net.bind(), config=config, engine=factory
                ) as second,
            ):
                a, b = await asyncio.wait_for(connected_stream_pair(first, second), 10)
                for _ in range(30):
                    a.write(b"0123456789abcdef")
                    b.write(await b.readexactly(16))
                    assert await a.readexactly(16) == b"0123456789abcdef"
                for _ in range(3):
                    a.write(b"one way")
                    assert await asyncio.wait_for(b.readexactly(7), 10) == b"one way"

                    async def acknowledged() -> None:
                        while a.core.in_flight:
                            await asyncio.sleep(0.001)

                    await asyncio.wait_for(acknowledged(), 10)
                net.partition([first.local_addr], [second.local_addr])
                with pytest.raises(ConnectionLostError):
                    await asyncio.wait_for(a.read(), 10)

    asyncio.run(main())


def test_a_notification_skips_the_kick_only_while_the_driver_will_look() -> None:
    # ``_LoopNotifier.queued`` spares the kick of a notification while a callback of the
    # driver is queued that reads the flag before the driver goes idle. Between any two
    # loop callbacks of a ping-pong (and once idle) it may be set only while one is.
    from chrysalis.datagram import InprocNetwork
    from chrysalis.quic import AsyncioEndpoint
    from chrysalis.quic.testing import connected_stream_pair, issue_identities

    async def main() -> None:
        first_id, second_id = issue_identities(2)
        net = InprocNetwork()
        async with (
            AsyncioEndpoint.spawn_duplex(first_id, net.bind()) as first,
            AsyncioEndpoint.spawn_duplex(second_id, net.bind()) as second,
        ):
            a, b = await asyncio.wait_for(connected_stream_pair(first, second), 10)
            drivers = []
            for endpoint in (first, second):
                notifier = endpoint._notifier
                assert isinstance(notifier, _LoopNotifier)
                assert notifier.kick is not None
                drivers.append((notifier, cast(Any, notifier.kick).__self__))
            loop = asyncio.get_running_loop()
            checks = 0
            running = True

            def check() -> None:
                nonlocal checks
                for notifier, inline in drivers:
                    if notifier.queued:
                        assert inline._scheduled or inline._finishing
                checks += 1
                if running:
                    loop.call_soon(check)

            loop.call_soon(check)
            for _ in range(50):
                a.write(b"0123456789abcdef")
                b.write(await b.readexactly(16))
                assert await a.readexactly(16) == b"0123456789abcdef"
            running = False
            for _ in range(5):
                await asyncio.sleep(0)
            check()
            assert checks > 100
            # Idle: a write that no datagram woke still gets out (and its reply back).
            a.write(b"idle")
            assert await asyncio.wait_for(b.readexactly(4), 10) == b"idle"

    asyncio.run(main())


def test_the_cached_earliest_engine_timer_follows_every_change() -> None:
    # ``timer_due`` and ``get_timer`` read ``_timer_min`` instead of scanning the cached
    # timers: through loss, retransmission, a connection's close and its removal it must
    # equal the scan.
    net, client, server = pair(loss=0.2, seed=3)
    conns = [client.connect(server) for _ in range(3)]
    streams = [client.open(conn) for conn in conns]
    sends = [client.send(stream, b"x" * 3000) for stream in streams]

    def consistent() -> None:
        for node in (client, server):
            endpoint = node.endpoint
            endpoint.get_timer()
            timers = endpoint._timers
            assert endpoint._timer_min == min(timers.values(), default=float("inf"))

    def pump_until(done: Any) -> None:
        for _ in range(100_000):
            progressed = net.pump()
            consistent()
            if done():
                return
            if not progressed:
                upcoming = net.next_time()
                assert upcoming is not None
                net.now = max(upcoming, net.now + 1e-6)
        raise AssertionError("too many rounds")

    pump_until(lambda: all(client.op(sent) is not None for sent in sends))
    client.submit(Close(conns[0], 0, "bye"))
    pump_until(lambda: len(client.endpoint._conns) == 2 and len(server.endpoint._conns) == 2)
    consistent()
    assert client.endpoint._timers
