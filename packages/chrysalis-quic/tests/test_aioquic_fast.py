"""The aioquic engine's fast paths (``_aioquic_fast``) against aioquic's own code.

The main check is differential: the same scripted exchange over a lossy, reordering,
duplicating virtual link runs once with the fast paths and once without, and every
observable must be identical: each datagram's size and destination CID prefix, the
plaintext of every 1-RTT packet (header and frames, opened with the receiver's keys, so the
direct packet writer must produce exactly the bytes aioquic's builder does), every event,
the timer after every step, and after every step the recovery state (sent-packet records,
bytes in flight, congestion window, RTT estimates, loss and ACK timers, ACK ranges) and the
stream senders' state. Only the TLS handshake differs between two runs (ECDSA signatures
vary in length, and the keys differ), so each comparison uses a pair of runs whose
handshake datagrams have the same sizes.

The other tests pin the fallbacks: an unpinned aioquic or ``fast=False`` runs aioquic's code
throughout, and datagrams the fast receive path does not cover still take aioquic's path.
"""

from __future__ import annotations

import heapq
import itertools
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aioquic
import pytest
from aioquic import tls
from aioquic._buffer import Buffer
from aioquic._crypto import CryptoError
from aioquic.buffer import UINT_VAR_MAX
from aioquic.quic.recovery import QuicPacketRecovery
from aioquic.quic.stream import QuicStream
from aioquic.tls import CipherSuite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).parent))

from test_endpoint_harness import T0, issue

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._engines import aioquic as _aioquic_engine
from chrysalis.quic._engines import aioquic_fast as _aioquic_fast
from chrysalis.quic._engines.aioquic import AioquicConnection, AioquicEngine
from chrysalis.quic._engines.aioquic_fast import FastPacketRecovery, FastQuicConnection
from chrysalis.quic._engines.base import (
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
    cipher_suites: tuple[CipherSuite, ...] | None = None
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
            cipher_suites=self.cipher_suites,
            host_cid=client_cid(),
            issue_cid=client_cid,
            initial_dcid=initial_dcid,
        )
        self.client.connect(SERVER_ADDR, self.now)
        self.server = _connection(
            self.config,
            _SERVER_ID,
            self.fast,
            cipher_suites=self.cipher_suites,
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
            plain = _plaintext(self.sides[peer], data)
            self.trace.append(("sent", name, len(data), prefix == self.pids[name], plain))
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
        self.trace.append(("recovery", name, _recovery_state(conn)))

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
    config: QuicConfig,
    identity: Identity,
    fast: bool,
    cipher_suites: tuple[CipherSuite, ...] | None = None,
    **kwargs: Any,
) -> AioquicConnection:
    engine = AioquicEngine(config, identity)
    configuration = engine._client if "initial_dcid" in kwargs else engine._server
    if cipher_suites is not None:
        configuration = replace(configuration, cipher_suites=list(cipher_suites))
    return AioquicConnection(
        configuration=configuration,
        max_streams_bidi=config.max_streams_bidi,
        fast=fast,
        **kwargs,
    )


def _plaintext(receiver: AioquicConnection, datagram: bytes) -> tuple[bytes, bytes] | str | None:
    """The plain header and payload of a 1-RTT datagram, opened with the receiver's current
    keys without changing them (a packet of the next key phase is opened with derived
    keys, as aioquic would); None for long-header datagrams (the handshake's, which carry
    TLS randomness), a string when it cannot be opened yet."""
    if datagram[0] & 0x80:
        return None
    crypto = receiver._cryptos.get(tls.Epoch.ONE_RTT)
    space = receiver._spaces.get(tls.Epoch.ONE_RTT)
    if crypto is None or space is None or not crypto.recv.is_valid():
        return "no 1-RTT keys yet"
    try:
        header, payload, _, _ = crypto.recv.decrypt_packet(
            datagram, 1 + len(receiver.host_cid), space.expected_packet_number
        )
    except CryptoError as exc:
        return f"cannot open: {exc}"
    return header, payload


def _recovery_state(conn: AioquicConnection) -> tuple[Any, ...]:
    """Everything loss recovery and the ACK machinery keep, plus the stream senders."""
    loss = conn._loss
    spaces: list[tuple[Any, ...] | None] = []
    for epoch in (tls.Epoch.INITIAL, tls.Epoch.HANDSHAKE, tls.Epoch.ONE_RTT):
        space = conn._spaces.get(epoch)
        if space is None:
            spaces.append(None)
            continue
        packets = [
            (
                p.packet_number,
                p.epoch,
                p.packet_type,
                p.in_flight,
                p.is_ack_eliciting,
                p.is_crypto_packet,
                p.sent_time,
                p.sent_bytes,
                len(p.delivery_handlers),
            )
            for p in space.sent_packets.values()
        ]
        spaces.append(
            (
                packets,
                space.ack_eliciting_in_flight,
                space.largest_acked_packet,
                space.loss_time,
                space.ack_at,
                list(space.ack_queue),
                space.expected_packet_number,
                space.largest_received_packet,
                space.largest_received_time,
            )
        )
    pacer = loss._pacer
    streams = []
    for sid in sorted(conn._streams):
        stream = conn._streams[sid]
        sender, receiver = stream.sender, stream.receiver
        pending = list(sender._pending)
        streams.append(
            (
                sid,
                sender.highest_offset,
                # ``buffer_is_empty`` is only a hint that spares a ``get_frame`` call: with
                # nothing pending, aioquic sets it on the next call that finds nothing (or
                # not, when pacing ends the flush first), the fast paths when they see that
                # nothing is left. Either way nothing is sent, so compare what it means.
                sender.buffer_is_empty or not (pending or sender._pending_eof),
                sender.is_finished,
                sender._buffer_start,
                sender._buffer_stop,
                pending,
                sender._pending_eof,
                list(sender._acked),
                sender._acked_fin,
                receiver.highest_offset,
                receiver._buffer_start,
                receiver.is_finished,
                stream.max_stream_data_local,
                stream.max_stream_data_local_sent,
                stream.max_stream_data_remote,
            )
        )
    return (
        loss.bytes_in_flight,
        loss.congestion_window,
        loss._pto_count,
        loss._rtt_smoothed,
        loss._rtt_variance,
        loss._rtt_latest,
        loss._rtt_min,
        loss._time_of_last_sent_ack_eliciting_packet,
        (pacer.bucket_max, pacer.bucket_time, pacer.evaluation_time, pacer.packet_time),
        conn._packet_number,
        conn._close_at,
        conn._pacing_at,
        conn._ack_eliciting_sent_since_receipt,
        conn._remote_max_data_used,
        conn._local_max_data.used,
        conn._spin_bit,
        [stream.stream_id for stream in conn._streams_queue],
        spaces,
        streams,
        conn._network_paths[0].bytes_sent if conn._network_paths else None,
    )


def _summary(event: EngineEvent) -> tuple[Any, ...]:
    if isinstance(event, StreamDataReceived):
        return (event.stream_id, len(event.data), event.fin)
    return tuple(getattr(event, slot) for slot in getattr(type(event), "__slots__", ()))


_CLIENT_KEY_UPDATE, _SERVER_KEY_UPDATE, _CLIENT_PING = -1, -2, -3
"""Script entries with a negative stream index are actions instead of messages."""


def _action(run: _Run, action: int) -> None:
    if action in (_CLIENT_KEY_UPDATE, _SERVER_KEY_UPDATE):
        # A PING makes the first packet of the new key phase leave at once, and the wait
        # lets the peer see it before anything else happens: aioquic does not hold back a
        # second update until the first was acknowledged (RFC 9001 section 6.5), and a
        # peer that misses a whole key phase cannot decrypt any more.
        name = "client" if action == _CLIENT_KEY_UPDATE else "server"
        run.sides[name].request_key_update()
        run.sides[name].send_ping(len(run.trace))
        run.flush(name)
        run.deliver_until(run.now + 0.5)
    else:
        run.client.send_ping(len(run.trace))
        run.flush("client")


def _script(run: _Run, messages: list[tuple[int, int, bool]], *, handshake: bool = True) -> None:
    """Handshake (unless done), then the client sends ``(stream index, size, fin)`` messages
    one after another (a few virtual milliseconds apart) and the server echoes; then the
    link drains and the echoed bytes are checked. A negative stream index is an action
    (``_CLIENT_KEY_UPDATE``, ``_SERVER_KEY_UPDATE``, ``_CLIENT_PING``)."""
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
        if index < 0:
            _action(run, index)
            run.deliver_until(run.now + 0.003)
            continue
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
    seed: int,
    link: _Link,
    messages: list[tuple[int, int, bool]],
    config: QuicConfig | None = None,
    cipher_suites: tuple[CipherSuite, ...] | None = None,
) -> tuple[_Run, _Run]:
    """A fast and a stock run of the same script whose handshakes had the same sizes."""
    cfg = config or QuicConfig()
    with _deterministic_stream_sets():
        return _matched_runs_inner(seed, link, messages, cfg, cipher_suites)


@contextmanager
def _deterministic_stream_sets() -> Iterator[None]:
    """aioquic collects the streams served by a packet in a ``set`` and appends them to its
    service order in set order, which follows ``id()``, so two runs of the same script can
    serve streams in different orders. Hashing streams by their ID (equality stays
    identity) makes that order a function of the script alone. The stateless reset tokens
    of the CIDs the engine issues (random, and sent in 1-RTT packets) become zeros, so the
    packet plaintexts of two runs can be compared."""
    QuicStream.__hash__ = _stream_hash  # type: ignore[method-assign,assignment]
    original_token = _aioquic_engine._reset_token
    _aioquic_engine._reset_token = _zero_token
    try:
        yield
    finally:
        QuicStream.__hash__ = object.__hash__  # type: ignore[method-assign]
        _aioquic_engine._reset_token = original_token


def _zero_token() -> bytes:
    return bytes(16)


def _stream_hash(stream: QuicStream) -> int:
    return hash(stream.stream_id)


def _matched_runs_inner(
    seed: int,
    link: _Link,
    messages: list[tuple[int, int, bool]],
    cfg: QuicConfig,
    cipher_suites: tuple[CipherSuite, ...] | None,
) -> tuple[_Run, _Run]:
    # Handshakes of either kind are kept by their key, so any fast one can pair with any
    # stock one (a pair of fresh runs matches only some of the time).
    seen: dict[bool, dict[tuple[Any, ...], _Run]] = {True: {}, False: {}}
    pair: tuple[_Run, _Run] | None = None
    for attempt in range(80):
        kind = attempt % 2 == 0
        run = _Run(fast=kind, seed=seed, link=link, config=cfg, cipher_suites=cipher_suites)
        run.flush("client")
        run.deliver_until(T0 + _HANDSHAKE_PHASE)
        key = _handshake_key(run)
        other = seen[not kind].get(key)
        if other is not None:
            pair = (run, other) if kind else (other, run)
            break
        seen[kind].setdefault(key, run)
    if pair is None:
        pytest.fail("no two handshakes of the same sizes in 80 tries")
    fast, stock = pair
    for run in (fast, stock):
        _script(run, messages, handshake=False)
    return fast, stock


def _handshake_key(run: _Run) -> tuple[Any, ...]:
    # Datagram sizes alone can hide packets of different sizes coalesced in a padded
    # datagram; the congestion windows see every packet's size.
    return (
        tuple(run.handshake_sizes),
        run.client.statistics().congestion_window,
        run.server.statistics().congestion_window,
    )


@contextmanager
def _counting(name: str, *, returning: Callable[[Any], bool] | None = None) -> Iterator[list[int]]:
    """Count calls of ``FastQuicConnection.<name>`` while inside the block (only those whose
    result satisfies ``returning``, when given)."""
    calls = [0]
    original = getattr(FastQuicConnection, name)

    def wrapper(self: FastQuicConnection, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if returning is None or returning(result):
            calls[0] += 1
        return result

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
    with (
        _counting("_receive_short_packet") as short,
        _counting("_nothing_left") as early,
        _counting("_send_simple", returning=bool) as direct,
        _counting("_send_simple", returning=lambda result: result is None) as generic,
    ):
        fast, stock = _matched_runs(seed, link, messages)
    assert fast.trace == stock.trace
    # ... and the fast paths really ran (only in the fast run: the stock one never enters):
    # the short-header receive path, packets from the direct writer, and flushes it left
    # to the generic (early-exit) path.
    assert short[0] > 10
    assert direct[0] > 10
    assert generic[0] > 0
    assert early[0] > 0
    sent = [entry for entry in fast.trace if entry[0] == "sent"]
    assert all(prefix_ok for _, _, _, prefix_ok, _ in sent)
    assert sum(isinstance(plain, tuple) for *_, plain in sent) > 20  # compared byte by byte


_KEY_UPDATES = (
    [(0, 16, False)] * 6
    + [(_CLIENT_KEY_UPDATE, 0, False)]
    + [(0, 16, False)] * 6
    + [(_SERVER_KEY_UPDATE, 0, False), (_CLIENT_PING, 0, False)]
    + [(0, 16, False)] * 6
    + [(1, 0, True), (0, 3000, False), (_CLIENT_PING, 0, False), (0, 0, True)]
)


@pytest.mark.skipif(not _aioquic_fast.SUPPORTED, reason="fast paths need the pinned aioquic")
@pytest.mark.parametrize(
    ("seed", "link", "cipher_suites"),
    [
        (21, _Link(), None),
        (22, _Link(loss=0.1, duplicate=0.05, jitter=0.01), None),
        (23, _Link(), (CipherSuite.CHACHA20_POLY1305_SHA256,)),
        (24, _Link(loss=0.1, duplicate=0.05, jitter=0.01), (CipherSuite.CHACHA20_POLY1305_SHA256,)),
    ],
)
def test_direct_packets_match_aioquic_across_key_updates_pings_and_ciphers(
    seed: int, link: _Link, cipher_suites: tuple[CipherSuite, ...] | None
) -> None:
    """Key updates in both directions (the writer defers a pending update to aioquic, the
    reader opens the first packet of a new key phase through aioquic), PINGs (sent by the
    generic path, read inline), FIN-only frames, and ChaCha20 header protection."""
    with (
        _counting("_send_simple", returning=bool) as direct,
        _counting("_send_simple", returning=lambda result: result is None) as generic,
        _counting("_open_short_packet_stock") as stock_open,
    ):
        fast, stock = _matched_runs(seed, link, _KEY_UPDATES, cipher_suites=cipher_suites)
    assert fast.trace == stock.trace
    assert direct[0] > 10
    assert generic[0] > 0
    assert stock_open[0] >= 2  # one per key update, at least
    phases = {
        plain[0][0] & 4
        for kind, *_, plain in fast.trace
        if kind == "sent" and isinstance(plain, tuple)
    }
    assert phases == {0, 4}  # both key phases were on the wire
    suite = cipher_suites[0] if cipher_suites else CipherSuite.AES_256_GCM_SHA384
    for conn in fast.sides.values():
        assert conn._cryptos[tls.Epoch.ONE_RTT].send.cipher_suite == suite


@pytest.mark.skipif(not _aioquic_fast.SUPPORTED, reason="fast paths need the pinned aioquic")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    loss=st.sampled_from([0.0, 0.05, 0.15]),
    jitter=st.sampled_from([0.0, 0.005, 0.02]),
    messages=st.lists(
        st.tuples(
            st.one_of(st.just(_CLIENT_PING), st.integers(0, 3)),
            st.integers(0, 9000),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
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


@given(
    before=st.binary(max_size=40),
    zeros=st.integers(0, 20_000),
    after=st.binary(max_size=40),
)
@settings(max_examples=60)
def test_padding_is_skipped_exactly_as_aioquic_does(
    before: bytes, zeros: int, after: bytes
) -> None:
    # the fast skip (C speed) ends where aioquic's byte loop ends, wherever the frame starts
    keys = itertools.count(1)

    def cid() -> bytes:
        return ConnectionId.issued(_SERVER_ID.pid, next(keys)).raw

    def server(fast: bool) -> AioquicConnection:
        initial = ConnectionId.initial(_SERVER_ID.pid, 1).raw
        return _connection(
            QuicConfig(), _SERVER_ID, fast, host_cid=cid(), issue_cid=cid, original_dcid=initial
        )

    data = before + bytes(zeros) + after
    ends = []
    fast, plain = server(True), server(False)
    assert fast._chrysalis_fast
    assert not plain._chrysalis_fast
    for conn in (fast, plain):
        buf = Buffer(data=data)
        buf.seek(len(before))
        conn._handle_padding_frame(None, 0, buf)  # type: ignore[arg-type]  # unused context
        ends.append(buf.tell())
    assert ends[0] == ends[1]
    assert ends[0] == len(before) + zeros + len(after) - len(after.lstrip(b"\0"))


@given(value=st.integers(0, UINT_VAR_MAX))
def test_direct_writer_varints_are_aioquics(value: int) -> None:
    buf = Buffer(capacity=8)
    buf.push_uint_var(value)
    assert _aioquic_fast._varint(value) == buf.data


@pytest.mark.parametrize("value", [-1, UINT_VAR_MAX + 1])
def test_direct_writer_refuses_what_aioquic_cannot_encode(value: int) -> None:
    with pytest.raises(ValueError, match="Integer"):
        _aioquic_fast._varint(value)
