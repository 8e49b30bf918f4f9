"""The aioquic engine's fast paths (``_aioquic_fast``) against aioquic's own code.

The main check is differential: the same scripted exchange over a lossy, reordering,
duplicating virtual link runs once with the fast paths and once without, and every
observable (each datagram's size and destination CID prefix, every event, the timer after
every step, stream send states and recovery statistics) must be identical. Only the TLS
handshake differs between two runs (ECDSA signatures vary in length), so each comparison
uses a pair of runs whose handshake datagrams have the same sizes.

The other tests pin the fallbacks: an unpinned aioquic or ``fast=False`` runs aioquic's code
throughout, and datagrams the fast receive path does not cover still take aioquic's path.
"""

from __future__ import annotations

import heapq
import itertools
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioquic
import pytest
from aioquic.quic.recovery import QuicPacketRecovery
from aioquic.quic.stream import QuicStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).parent))

from test_endpoint_harness import T0, issue

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.quic import _aioquic_fast
from chrysalis.quic._aioquic_engine import AioquicConnection, AioquicEngine
from chrysalis.quic._aioquic_fast import FastPacketRecovery, FastQuicConnection
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._engine import (
    EngineEvent,
    HandshakeCompleted,
    StreamDataReceived,
)
from chrysalis.quic._identity import Identity

CLIENT_ADDR = DatagramAddr.inproc(7, 1)
SERVER_ADDR = DatagramAddr.inproc(7, 2)
_CLIENT_ID, _SERVER_ID = issue(), issue()
_HANDSHAKE_PHASE = 0.5
"""Virtual seconds given to the handshake before the script starts."""


@dataclass
class _Link:
    """One direction's impairments, drawn from the run's seeded generator."""

    loss: float = 0.0
    duplicate: float = 0.0
    jitter: float = 0.0  # extra delay up to this many seconds: reorders datagrams
    delay: float = 0.002


_CLEAN = _Link()


@dataclass
class _Run:
    """A client and a server ``AioquicConnection`` on a virtual link with a virtual clock.

    ``trace`` records everything observable, in order; two runs with the same seed and
    script must produce the same trace whichever code paths the engines take.
    """

    fast: bool
    seed: int
    link: _Link
    config: QuicConfig = field(default_factory=QuicConfig)
    trace: list[tuple[Any, ...]] = field(default_factory=list)
    handshake_sizes: list[int] = field(default_factory=list)
    received: dict[int, bytearray] = field(default_factory=dict)
    echoed: dict[int, bytearray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.now = T0
        client_keys, server_keys = itertools.count(1), itertools.count(1)

        def client_cid() -> bytes:
            return ConnectionId.issued(_CLIENT_ID.pid, next(client_keys)).raw

        def server_cid() -> bytes:
            return ConnectionId.issued(_SERVER_ID.pid, next(server_keys)).raw

        initial_dcid = ConnectionId.initial(_SERVER_ID.pid, 1).raw
        self.client = _connection(
            self.config,
            _CLIENT_ID,
            self.fast,
            host_cid=client_cid(),
            issue_cid=client_cid,
            initial_dcid=initial_dcid,
        )
        self.client.connect(SERVER_ADDR, self.now)
        self.server = _connection(
            self.config,
            _SERVER_ID,
            self.fast,
            host_cid=server_cid(),
            issue_cid=server_cid,
            original_dcid=initial_dcid,
        )
        self.sides = {"client": self.client, "server": self.server}
        self.addrs = {"client": SERVER_ADDR, "server": CLIENT_ADDR}
        self.pids = {"client": _SERVER_ID.pid, "server": _CLIENT_ID.pid}
        self.queue: list[tuple[float, int, str, bytes]] = []
        self.seq = itertools.count()
        self.confirmed = False

    # -- the virtual network ------------------------------------------------------------------

    def flush(self, name: str) -> None:
        conn = self.sides[name]
        peer = "server" if name == "client" else "client"
        for data, addr in conn.datagrams_to_send(self.now):
            assert addr == self.addrs[name]
            prefix: Pid | None = target_pid(data)
            self.trace.append(("sent", name, len(data), prefix == self.pids[name]))
            if self.now - T0 <= _HANDSHAKE_PHASE:
                self.handshake_sizes.append(len(data))
            # The link is clean during the handshake (whose retransmissions are aioquic's
            # own code) and impaired afterwards.
            link = self.link if self.now - T0 > _HANDSHAKE_PHASE else _CLEAN
            if self.rng.random() < link.loss:
                continue
            copies = 2 if self.rng.random() < link.duplicate else 1
            for _ in range(copies):
                at = self.now + link.delay + self.rng.random() * link.jitter
                heapq.heappush(self.queue, (at, next(self.seq), peer, data))

    def deliver_until(self, deadline: float) -> None:
        """Run the link and the timers until ``deadline`` (virtual seconds)."""
        while True:
            timers = [(conn.get_timer(), name) for name, conn in self.sides.items()]
            pending = [(at, name) for at, name in timers if at is not None]
            next_timer = min(pending) if pending else None
            next_packet = self.queue[0][0] if self.queue else None
            candidates = [t for t in (next_timer and next_timer[0], next_packet) if t is not None]
            if not candidates or min(candidates) > deadline:
                self.now = max(self.now, deadline)
                return
            if next_packet is not None and (next_timer is None or next_packet <= next_timer[0]):
                at, _, name, data = heapq.heappop(self.queue)
                self.now = max(self.now, at)
                source = SERVER_ADDR if name == "client" else CLIENT_ADDR
                self.sides[name].receive_datagram(data, source, self.now)
                self.after(name)
            else:
                assert next_timer is not None
                at, name = next_timer
                # A real clock has moved on when a timer fires; aioquic relies on it (an
                # ACK due exactly "now" waits for pacing, and re-arms the same deadline).
                self.now = max(self.now + 1e-6, at)
                self.trace.append(("timer", name, round(at - T0, 9)))
                self.sides[name].handle_timer(self.now)
                self.after(name)

    def after(self, name: str) -> None:
        """What the endpoint does after feeding a connection: drain events, flush."""
        conn = self.sides[name]
        while (event := conn.next_event()) is not None:
            self.on_event(name, event)
        self.flush(name)
        timer = conn.get_timer()
        self.trace.append(("timer-at", name, None if timer is None else round(timer - T0, 9)))

    def on_event(self, name: str, event: EngineEvent) -> None:
        self.trace.append(("event", name, type(event).__name__, _summary(event)))
        if isinstance(event, HandshakeCompleted) and name == "client":
            self.confirmed = True
        if isinstance(event, StreamDataReceived):
            conn = self.sides[name]
            store = self.received if name == "server" else self.echoed
            buffer = store.setdefault(event.stream_id, bytearray())
            buffer += event.data
            conn.stream_consumed(event.stream_id, len(buffer))
            conn.set_buffered(0)
            if name == "server" and (event.data or event.fin):
                conn.send_stream_data(event.stream_id, event.data, event.fin)

    def snapshot(self) -> None:
        for name, conn in self.sides.items():
            stats = conn.statistics()
            states = {sid: conn.stream_send_state(sid) for sid in sorted(conn._streams)}
            self.trace.append(("state", name, stats, states, conn.get_timer()))


def _connection(
    config: QuicConfig, identity: Identity, fast: bool, **kwargs: Any
) -> AioquicConnection:
    engine = AioquicEngine(config, identity)
    configuration = engine._client if "initial_dcid" in kwargs else engine._server
    return AioquicConnection(
        configuration=configuration,
        max_streams_bidi=config.max_streams_bidi,
        fast=fast,
        **kwargs,
    )


def _summary(event: EngineEvent) -> tuple[Any, ...]:
    if isinstance(event, StreamDataReceived):
        return (event.stream_id, len(event.data), event.fin)
    return tuple(getattr(event, slot) for slot in getattr(type(event), "__slots__", ()))


def _script(run: _Run, messages: list[tuple[int, int, bool]], *, handshake: bool = True) -> None:
    """Handshake (unless done), then the client sends ``(stream index, size, fin)`` messages
    one after another (a few virtual milliseconds apart) and the server echoes; then the
    link drains and the echoed bytes are checked."""
    if handshake:
        run.flush("client")
        run.deliver_until(T0 + _HANDSHAKE_PHASE)
    assert run.confirmed, "handshake did not complete"
    run.snapshot()
    opened: set[int] = set()
    sent: dict[int, int] = {}
    finished: set[int] = set()
    sids: dict[int, int] = {}
    for index, size, fin in messages:
        if size == 0 and not fin:
            continue  # nothing to send
        # Streams are opened in the order first used (aioquic takes a stream ID below the
        # highest one opened for a finished stream).
        sid = sids.setdefault(index, 4 * len(sids))
        if sid in finished:
            continue
        if sid not in opened:
            run.client.open_stream(sid)
            opened.add(sid)
        payload = bytes((sent.get(sid, 0) + i) % 251 for i in range(size))
        sent[sid] = sent.get(sid, 0) + size
        run.client.send_stream_data(sid, payload, fin)
        if fin:
            finished.add(sid)
        run.flush("client")
        run.deliver_until(run.now + 0.003)
    run.deliver_until(run.now + 10.0)
    run.snapshot()
    for sid, total in sent.items():
        expected = bytes(i % 251 for i in range(total))
        assert bytes(run.received.get(sid, b"")) == expected, f"stream {sid} corrupted"
        assert bytes(run.echoed.get(sid, b"")) == expected, f"echo on stream {sid} corrupted"


def _matched_runs(
    seed: int, link: _Link, messages: list[tuple[int, int, bool]], config: QuicConfig | None = None
) -> tuple[_Run, _Run]:
    """A fast and a stock run of the same script whose handshakes had the same sizes."""
    cfg = config or QuicConfig()
    with _deterministic_stream_sets():
        return _matched_runs_inner(seed, link, messages, cfg)


@contextmanager
def _deterministic_stream_sets() -> Iterator[None]:
    """aioquic collects the streams served by a packet in a ``set`` and appends them to its
    service order in set order, which follows ``id()``, so two runs of the same script can
    serve streams in different orders. Hashing streams by their ID (equality stays
    identity) makes that order a function of the script alone."""
    QuicStream.__hash__ = _stream_hash  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        QuicStream.__hash__ = object.__hash__  # type: ignore[method-assign]


def _stream_hash(stream: QuicStream) -> int:
    return hash(stream.stream_id)


def _matched_runs_inner(
    seed: int, link: _Link, messages: list[tuple[int, int, bool]], cfg: QuicConfig
) -> tuple[_Run, _Run]:
    for _ in range(40):
        fast = _Run(fast=True, seed=seed, link=link, config=cfg)
        stock = _Run(fast=False, seed=seed, link=link, config=cfg)
        fast.flush("client")
        stock.flush("client")
        fast.deliver_until(T0 + _HANDSHAKE_PHASE)
        stock.deliver_until(T0 + _HANDSHAKE_PHASE)
        if _handshake_key(fast) == _handshake_key(stock):
            break
    else:
        pytest.fail("no two handshakes of the same sizes in 40 tries")
    for run in (fast, stock):
        _script(run, messages, handshake=False)
    return fast, stock


def _handshake_key(run: _Run) -> tuple[Any, ...]:
    # Datagram sizes alone can hide packets of different sizes coalesced in a padded
    # datagram; the congestion windows see every packet's size.
    return (
        run.handshake_sizes,
        run.client.statistics().congestion_window,
        run.server.statistics().congestion_window,
    )


@contextmanager
def _counting(name: str) -> Iterator[list[int]]:
    """Count calls of ``FastQuicConnection.<name>`` while inside the block."""
    calls = [0]
    original = getattr(FastQuicConnection, name)

    def wrapper(self: FastQuicConnection, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(self, *args, **kwargs)

    setattr(FastQuicConnection, name, wrapper)
    try:
        yield calls
    finally:
        setattr(FastQuicConnection, name, original)


_PING_PONG = [(0, 16, False)] * 30 + [(0, 0, True)]
_MIXED = (
    [(0, 16, False)] * 5
    + [(1, 5000, False), (2, 40, False), (1, 20_000, False), (0, 16, False)]
    + [(3, 3000, True), (2, 1, False), (2, 70_000, True), (0, 16, True), (1, 1, True)]
)


@pytest.mark.skipif(not _aioquic_fast.SUPPORTED, reason="fast paths need the pinned aioquic")
@pytest.mark.parametrize(
    ("seed", "link", "messages"),
    [
        (1, _Link(), _PING_PONG),
        (2, _Link(), _MIXED),
        (3, _Link(loss=0.1, jitter=0.004), _PING_PONG),
        (4, _Link(loss=0.05, duplicate=0.05, jitter=0.01), _MIXED),
        (5, _Link(loss=0.2, duplicate=0.1, jitter=0.02), _MIXED),
    ],
)
def test_fast_paths_behave_exactly_as_aioquic(
    seed: int, link: _Link, messages: list[tuple[int, int, bool]]
) -> None:
    with _counting("_receive_short_packet") as short, _counting("_nothing_left") as early:
        fast, stock = _matched_runs(seed, link, messages)
    assert fast.trace == stock.trace
    # ... and the fast paths really ran (only in the fast run: the stock one never enters).
    assert short[0] > 10
    assert early[0] > 10
    assert all(p for kind, *rest in fast.trace if kind == "sent" for p in rest[2:])


@pytest.mark.skipif(not _aioquic_fast.SUPPORTED, reason="fast paths need the pinned aioquic")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    loss=st.sampled_from([0.0, 0.05, 0.15]),
    jitter=st.sampled_from([0.0, 0.005, 0.02]),
    messages=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 9000), st.booleans()), min_size=1, max_size=12
    ),
)
def test_fast_paths_match_aioquic_on_random_scripts(
    seed: int, loss: float, jitter: float, messages: list[tuple[int, int, bool]]
) -> None:
    fast, stock = _matched_runs(seed, _Link(loss=loss, duplicate=loss / 2, jitter=jitter), messages)
    assert fast.trace == stock.trace


def test_unpinned_aioquic_runs_aioquic_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_aioquic_fast, "SUPPORTED", False)
    run = _Run(fast=True, seed=9, link=_Link())
    for conn in run.sides.values():
        assert not conn._chrysalis_fast
        assert type(conn._loss) is QuicPacketRecovery
    with _counting("_receive_short_packet") as short, _counting("_nothing_left") as early:
        _script(run, _PING_PONG)
    assert short[0] == 0
    assert early[0] == 0


def test_version_pin_matches_installed_aioquic() -> None:
    assert _aioquic_fast.SUPPORTED == (aioquic.__version__ == _aioquic_fast.PINNED_VERSION)
    run = _Run(fast=True, seed=10, link=_Link())
    for conn in run.sides.values():
        assert conn._chrysalis_fast == _aioquic_fast.SUPPORTED
        assert isinstance(conn._loss, FastPacketRecovery) == _aioquic_fast.SUPPORTED
    off = _Run(fast=False, seed=10, link=_Link())
    assert not off.client._chrysalis_fast
    assert type(off.client._loss) is QuicPacketRecovery


@pytest.mark.skipif(not _aioquic_fast.SUPPORTED, reason="fast paths need the pinned aioquic")
def test_datagrams_outside_the_fast_path_take_aioquics_path() -> None:
    run = _Run(fast=True, seed=11, link=_Link())
    _script(run, [(0, 16, False)] * 3)
    client, server = run.client, run.server
    server.send_stream_data(0, b"x" * 16, False)
    ((datagram, _),) = server.datagrams_to_send(run.now)
    with _counting("_receive_short_packet") as short:
        # A 1-RTT datagram from an address that is not the server's: aioquic drops it
        # (RFC 9000 section 9), without the fast path.
        client.receive_datagram(datagram, DatagramAddr.inproc(7, 99), run.now)
        assert client.next_event() is None
        # A datagram with a long header: aioquic's path (a stale Initial is dropped).
        client.receive_datagram(b"\xc0" + datagram[1:], SERVER_ADDR, run.now)
        assert client.next_event() is None
        assert short[0] == 0
        # The genuine datagram from the right address does take the fast path.
        client.receive_datagram(datagram, SERVER_ADDR, run.now)
        assert short[0] == 1
    event = client.next_event()
    assert isinstance(event, StreamDataReceived)
    assert event.data == b"x" * 16
    # A duplicate is discarded, as aioquic discards it.
    client.receive_datagram(datagram, SERVER_ADDR, run.now)
    assert client.next_event() is None


@pytest.mark.skipif(not _aioquic_fast.SUPPORTED, reason="fast paths need the pinned aioquic")
def test_corrupt_and_unknown_cid_datagrams_are_dropped_on_the_fast_path() -> None:
    run = _Run(fast=True, seed=12, link=_Link())
    _script(run, [(0, 16, False)] * 3)
    client, server = run.client, run.server
    server.send_stream_data(0, b"y" * 16, False)
    ((datagram, _),) = server.datagrams_to_send(run.now)
    corrupt = datagram[:-1] + bytes([datagram[-1] ^ 1])
    client.receive_datagram(corrupt, SERVER_ADDR, run.now)  # authentication fails
    unknown = datagram[:1] + bytes(20) + datagram[21:]
    client.receive_datagram(unknown, SERVER_ADDR, run.now)  # not one of our CIDs
    client.receive_datagram(datagram[:10], SERVER_ADDR, run.now)  # shorter than a header
    assert client.next_event() is None
    assert not client.is_terminated
    client.receive_datagram(datagram, SERVER_ADDR, run.now)
    event = client.next_event()
    assert isinstance(event, StreamDataReceived)
    assert event.data == b"y" * 16
