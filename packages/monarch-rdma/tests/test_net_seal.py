"""The TLS data lane's sealed records (``_netseal``, ``_netwire``'s seal format): the format,
a stream's records against tampering, replay, reordering and truncation, and the lane through a
man-in-the-middle proxy in this process that flips, cuts or stalls bytes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import os
import select
import socket
import ssl
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from monarch.rdma._netlane import Endpoint, LanePool, LaneServer, OwnerGone
from monarch.rdma._netseal import SEAL_HEADED, SealedStream, TruncatedRecord, client_handshake
from monarch.rdma._netwire import (
    SEAL_HEAD_SIZE,
    SEAL_HELLO_SIZE,
    SEAL_MAX_RECORD,
    SEAL_TAG_SIZE,
    SEAL_VERSION,
    Op,
    SealHello,
    WireError,
    decode_seal_head,
    decode_seal_hello,
    encode_seal_head,
    encode_seal_hello,
    seal_aad,
    seal_nonce,
)

SECRET = bytes(range(16))
MiB = 1 << 20

# -- the format ---------------------------------------------------------------------------------


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=4, max_size=4))
def test_hellos_round_trip(key: bytes, prefix: bytes) -> None:
    data = encode_seal_hello(SealHello(key, prefix))
    assert len(data) == SEAL_HELLO_SIZE
    assert decode_seal_hello(data) == SealHello(key, prefix)


def test_malformed_hellos_and_heads_are_wire_errors() -> None:
    good = encode_seal_hello(SealHello(bytes(32), bytes(4)))
    with pytest.raises(WireError, match="magic"):
        decode_seal_hello(b"XXXX" + good[4:])
    with pytest.raises(WireError, match="version 2"):
        decode_seal_hello(good[:4] + bytes([2]) + good[5:])
    with pytest.raises(WireError, match="41 bytes"):
        decode_seal_hello(good[:-1])
    with pytest.raises(WireError, match="32-byte key"):
        encode_seal_hello(SealHello(bytes(16), bytes(4)))
    assert decode_seal_head(encode_seal_head(SEAL_MAX_RECORD)) == SEAL_MAX_RECORD
    for length in (0, SEAL_MAX_RECORD + 1):
        with pytest.raises(WireError, match="sealed record"):
            encode_seal_head(length)
    with pytest.raises(WireError, match="sealed record of"):
        decode_seal_head(struct.pack(">B3xI", SEAL_VERSION, SEAL_MAX_RECORD + 1))
    with pytest.raises(WireError, match="version"):
        decode_seal_head(struct.pack(">B3xI", 9, 5))
    with pytest.raises(WireError, match="version"):
        decode_seal_head(bytes([SEAL_VERSION, 1, 0, 0, 0, 0, 0, 5]))


def test_nonces_and_associated_data_differ_per_record() -> None:
    nonces = {seal_nonce(b"pref", n) for n in range(1000)}
    assert len(nonces) == 1000
    assert all(len(n) == 12 for n in nonces)
    assert seal_aad(5, 1, 0) != seal_aad(5, 1, 5) != seal_aad(6, 1, 5) != seal_aad(5, 2, 5)


# -- one stream ---------------------------------------------------------------------------------


class _Capture:
    """A fake socket that keeps what is sent (to tamper with it before it is received)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data: Any) -> None:
        self.data += data


_KEYS = (SealHello(b"k" * 32, b"p" * 4), SealHello(b"K" * 32, b"P" * 4))


def _sealed(payloads: list[bytes], record: int = 4096) -> bytes:
    sender = SealedStream(_Capture(), _KEYS[0], _KEYS[1], record)  # type: ignore[arg-type]
    for payload in payloads:
        sender.sendall(payload)
    captured: bytearray = sender.raw.data  # type: ignore[attr-defined]
    return bytes(captured)


def _receive(wire: bytes, nbytes: int) -> tuple[bytearray, BaseException | None]:
    """Feed ``wire`` to a receiving stream (then EOF); what landed in a zeroed destination."""
    mine, theirs = socket.socketpair()
    dst = bytearray(nbytes)
    failure: BaseException | None = None

    def feed() -> None:
        with contextlib.suppress(OSError):
            theirs.sendall(wire)
        theirs.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    stream = SealedStream(mine, _KEYS[1], _KEYS[0])
    view, got = memoryview(dst), 0
    try:
        mine.settimeout(10)
        while got < nbytes:
            k = stream.recv_into(view[got:], nbytes - got)
            if k == 0:
                raise EOFError("ended between records")
            got += k
    except (WireError, EOFError) as exc:
        failure = exc
    finally:
        mine.close()
        feeder.join(10)
    return dst, failure


@pytest.mark.parametrize("size", [1, 9, 4095, 4096, 4097, 3 * 4096 + 5])
def test_a_stream_moves_every_size_class(size: int) -> None:
    payload = os.urandom(size)
    wire = _sealed([payload])
    records = -(-size // 4096)
    assert len(wire) == size + records * (SEAL_HEAD_SIZE + SEAL_TAG_SIZE)
    if size >= 8:  # encrypted (a byte or two of random payload turns up by chance: 1 in 10)
        assert payload not in wire
    dst, failure = _receive(wire, size)
    assert failure is None
    assert dst == payload


def _records(wire: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(wire):
        (length,) = struct.unpack(">I", wire[at + 4 : at + 8])
        end = at + SEAL_HEAD_SIZE + length + SEAL_TAG_SIZE
        out.append(wire[at:end])
        at = end
    return out


def test_a_tampered_record_fails_and_nothing_of_it_lands() -> None:
    payload = bytes(range(256)) * 48  # 3 records of 4096
    wire = bytearray(_sealed([payload]))
    second = SEAL_HEAD_SIZE + 4096 + SEAL_TAG_SIZE + SEAL_HEAD_SIZE + 100
    wire[second] ^= 0x01  # one bit of the second record's ciphertext
    dst, failure = _receive(bytes(wire), len(payload))
    assert isinstance(failure, WireError)
    assert "failed authentication" in str(failure)
    assert dst[:4096] == payload[:4096]  # the first record was authentic
    assert dst[4096:] == bytes(len(payload) - 4096)  # not one byte of the forged one


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda r: [r[0], r[0], r[1]], id="replayed"),
        pytest.param(lambda r: [r[1], r[0], r[2]], id="reordered"),
        pytest.param(lambda r: [r[0], r[2]], id="dropped"),
        pytest.param(
            lambda r: [r[0], r[1][:7] + bytes([r[1][7] ^ 1]) + r[1][8:-1], r[2]], id="resized"
        ),
    ],
)
def test_replayed_reordered_dropped_or_resized_records_fail(
    change: Callable[[list[bytes]], list[bytes]],
) -> None:
    payload = os.urandom(3 * 4096)
    records = _records(_sealed([payload]))
    assert len(records) == 3
    dst, failure = _receive(b"".join(change(records)), len(payload))
    assert isinstance(failure, WireError)
    assert dst[4096:] == bytes(len(payload) - 4096)


def test_a_record_cut_short_is_a_truncation_not_an_end() -> None:
    payload = os.urandom(2 * 4096)
    wire = _sealed([payload])
    dst, failure = _receive(wire[: len(wire) - 10], len(payload))
    assert isinstance(failure, TruncatedRecord)
    assert dst[4096:] == bytes(4096)


def test_a_head_announcing_more_than_a_record_is_refused_before_its_body() -> None:
    wire = struct.pack(">B3xI", SEAL_VERSION, 1 << 31) + bytes(64)
    _, failure = _receive(wire, 10)
    assert isinstance(failure, WireError)
    assert "sealed record of" in str(failure)


class _Counting(_Capture):
    """A ``_Capture`` that counts the system calls a stream makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def sendall(self, data: Any) -> None:
        self.calls += 1
        super().sendall(data)


@pytest.mark.parametrize(
    ("head_size", "size"),
    [(9, 0), (45, 1), (45, 4096), (2880, 2 * 4096 + 3), (SEAL_HEADED, 5), (SEAL_HEADED + 1, 5000)],
)
def test_a_headed_send_is_two_sends_in_fewer_system_calls(head_size: int, size: int) -> None:
    head, payload = os.urandom(head_size), os.urandom(size)
    sender = SealedStream(_Counting(), _KEYS[0], _KEYS[1], 4096)  # type: ignore[arg-type]
    sender.send_headed(head, payload)
    capture: _Counting = sender.raw  # type: ignore[assignment]
    head_records = -(-head_size // 4096) if head_size > SEAL_HEADED else 1
    data_records = -(-size // 4096)
    assert len(_records(bytes(capture.data))) == head_records + data_records
    # A head that fits leaves with the data's first record; a larger one in records of its own.
    assert capture.calls == (head_records if head_size > SEAL_HEADED else 0) + max(data_records, 1)
    dst, failure = _receive(bytes(capture.data), head_size + size)
    assert failure is None
    assert dst == head + payload


class _Trickle:
    """A fake socket that hands out ``wire`` a few bytes per ``recv_into`` and checks that the
    receiver never asks for more than the rest of the record it is in and the next record's
    head (the peer may send nothing more before it has an answer). The stream ends (EOF) after
    ``cut`` bytes of ``wire`` (all of it when None)."""

    def __init__(self, wire: bytes, step: int, cut: int | None = None) -> None:
        self.wire, self.at, self.step = wire, 0, step
        self.cut = len(wire) if cut is None else cut
        self.ends = list(itertools.accumulate(len(r) for r in _records(wire)))

    def recv_into(self, view: memoryview, nbytes: int) -> int:
        within = [end for end in self.ends if end > self.at]
        if within:  # inside a record, or at its start (then at least its head is asked for)
            assert nbytes <= within[0] - self.at + SEAL_HEAD_SIZE, (nbytes, self.at, within[0])
        k = min(nbytes, self.step, self.cut - self.at, view.nbytes)
        view[:k] = self.wire[self.at : self.at + k]
        self.at += k
        return k


@pytest.mark.parametrize("step", [1, 3, 8, 33, 1 << 20])
def test_records_read_a_few_bytes_at_a_time_or_all_at_once_come_out_whole(step: int) -> None:
    payloads = [os.urandom(9), os.urandom(45), os.urandom(300_000), os.urandom(17)]
    sender = SealedStream(_Capture(), _KEYS[0], _KEYS[1])  # type: ignore[arg-type]
    sender.send_headed(payloads[0], payloads[2])
    sender.sendall(payloads[1])
    sender.sendall(payloads[3])
    wire: bytearray = sender.raw.data  # type: ignore[attr-defined]
    raw = _Trickle(bytes(wire), step)
    receiver = SealedStream(raw, _KEYS[1], _KEYS[0])  # type: ignore[arg-type]
    dst = bytearray(sum(len(p) for p in payloads))
    view, got = memoryview(dst), 0
    while got < len(dst):
        k = receiver.recv_into(view[got:])
        assert k > 0
        got += k
    assert dst == payloads[0] + payloads[2] + payloads[1] + payloads[3]
    assert receiver.recv_into(bytearray(1)) == 0  # a clean end between records
    assert raw.at == len(wire)


def test_eof_inside_a_carried_over_head_returns_the_record_then_is_a_truncation() -> None:
    first, second = os.urandom(100), os.urandom(50)
    wire = _sealed([first, second])
    cut = len(_records(wire)[0]) + 3  # 3 bytes into the second record's head
    raw = _Trickle(wire, 1 << 20, cut)  # the first record comes with those 3 bytes
    receiver = SealedStream(raw, _KEYS[1], _KEYS[0])  # type: ignore[arg-type]
    dst = bytearray(200)
    assert receiver.recv_into(dst) == len(first)  # whole, though the next head was cut
    assert dst[: len(first)] == first
    assert raw.at == cut  # the 3 bytes were carried over with it
    with pytest.raises(TruncatedRecord):
        receiver.recv_into(dst)


class _Reads(_Trickle):
    """A ``_Trickle`` that counts its reads and times out (``TimeoutError``, as a socket with a
    timeout does) at the cut instead of ending there, when ``stall``."""

    def __init__(self, wire: bytes, step: int, cut: int | None = None, stall: bool = False) -> None:
        super().__init__(wire, step, cut)
        self.reads, self.stall = 0, stall

    def recv_into(self, view: memoryview, nbytes: int) -> int:
        self.reads += 1
        if self.stall and self.at == self.cut:
            raise TimeoutError("timed out")
        return super().recv_into(view, nbytes)


def _tampered_second() -> bytes:
    wire = bytearray(_sealed([os.urandom(2 * 4096)]))
    wire[len(_records(bytes(wire))[0]) + SEAL_HEAD_SIZE + 7] ^= 0x01
    return bytes(wire)


@pytest.mark.parametrize(
    ("wire", "cut", "stall", "first"),
    [
        pytest.param(_tampered_second(), None, False, "failed authentication", id="forged"),
        pytest.param(_sealed([os.urandom(2 * 4096)]), 5000, True, "timed out", id="timeout"),
        pytest.param(_sealed([os.urandom(2 * 4096)]), 5000, False, "ended inside", id="cut"),
    ],
)
def test_a_stream_that_failed_receiving_refuses_further_use_without_reading(
    wire: bytes, cut: int | None, stall: bool, first: str
) -> None:
    raw = _Reads(wire, 1000, cut, stall)
    receiver = SealedStream(raw, _KEYS[1], _KEYS[0])  # type: ignore[arg-type]
    dst = bytearray(2 * 4096)
    view = memoryview(dst)
    assert receiver.recv_into(view) == 4096  # the first record, authentic
    with pytest.raises((WireError, TimeoutError), match=first):
        receiver.recv_into(view[4096:])
    reads, at = raw.reads, raw.at
    for _ in range(2):
        with pytest.raises(WireError, match="unusable after an earlier failure: .*" + first):
            receiver.recv_into(view[4096:])
    assert (raw.reads, raw.at) == (reads, at)  # not one more read from the socket
    with pytest.raises(WireError, match="unusable after an earlier failure"):
        receiver.sendall(b"x")  # the whole stream is done with, both ways


class _FailingSend(_Counting):
    """A ``_Counting`` whose ``sendall`` fails (the peer reset) after ``ok`` calls."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def sendall(self, data: Any) -> None:
        if self.calls == self.ok:
            self.calls += 1
            raise ConnectionResetError("reset by peer")
        super().sendall(data)


def test_a_stream_that_failed_sending_refuses_further_use_without_sending() -> None:
    raw = _FailingSend(1)
    sender = SealedStream(raw, _KEYS[0], _KEYS[1], 4096)  # type: ignore[arg-type]
    with pytest.raises(ConnectionResetError):
        sender.send_headed(b"head", os.urandom(3 * 4096))  # the second record's send fails
    calls, sent = raw.calls, bytes(raw.data)
    sends: list[Callable[[], None]] = [
        lambda: sender.sendall(b"more"),
        lambda: sender.send_headed(b"h", b"data"),
    ]
    for send in sends:
        with pytest.raises(WireError, match="unusable after an earlier failure: Connection"):
            send()
    assert (raw.calls, bytes(raw.data)) == (calls, sent)  # nothing more sent
    with pytest.raises(WireError, match="unusable after an earlier failure"):
        sender.recv_into(bytearray(1))


def test_decrypt_into_in_place() -> None:
    """What ``SealedStream._open_next`` relies on: ``AESGCM.decrypt_into`` with its output
    aliasing its input exactly (same buffer, same offset) opens the record, and a forged tag is
    ``InvalidTag`` (that nothing of a failed record is then copied out is
    ``test_a_tampered_record_fails_and_nothing_of_it_lands``)."""
    cipher, nonce, aad = AESGCM(b"k" * 32), b"n" * 12, b"aad"
    plain = os.urandom(5000)
    for forged in (False, True):
        buffer = bytearray(SEAL_HEAD_SIZE) + cipher.encrypt(nonce, plain, aad)
        if forged:
            buffer[-1] ^= 0x01  # the tag
        stage = memoryview(buffer)
        sealed = stage[SEAL_HEAD_SIZE:]
        if forged:
            with pytest.raises(InvalidTag):
                cipher.decrypt_into(nonce, sealed, aad, stage[SEAL_HEAD_SIZE:-SEAL_TAG_SIZE])
        else:
            cipher.decrypt_into(nonce, sealed, aad, stage[SEAL_HEAD_SIZE:-SEAL_TAG_SIZE])
            assert buffer[SEAL_HEAD_SIZE:-SEAL_TAG_SIZE] == plain


# -- the lane through a man in the middle -------------------------------------------------------

#: ``mangle(direction, offset, data)``: the bytes to forward (``direction`` "up": client to
#: owner, "down": owner to client; ``offset`` of ``data`` in that direction's stream); None
#: cuts the connection; ``b""`` holds the rest of the direction back (a stall).
Mangle = Callable[[str, int, bytes], "bytes | None"]


class _Proxy:
    """A TCP proxy on loopback in front of a lane server's TLS port (bounded: its threads end
    with their connections; ``close`` ends them all)."""

    def __init__(self, port: int, mangle: Mangle) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.mangle = port, mangle
        self.socks: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            owner = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [client, owner]
            for direction, a, b in (("up", client, owner), ("down", owner, client)):
                thread = threading.Thread(target=self._pump, args=(direction, a, b), daemon=True)
                self.threads.append(thread)
                thread.start()

    def _pump(self, direction: str, a: socket.socket, b: socket.socket) -> None:
        offset, held = 0, False
        try:
            while data := a.recv(1 << 16):
                out = None if held else self.mangle(direction, offset, data)
                offset += len(data)
                if out is None and not held:
                    break
                if out == b"":
                    held = True
                    continue
                if out:
                    b.sendall(out)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept
        self.listener.close()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self.threads:
            thread.join(5)


class _Table:
    def __init__(self) -> None:
        self.regions: dict[int, tuple[memoryview, bytes]] = {}

    def lookup(self, number: int, secret: bytes) -> memoryview | str:
        found = self.regions.get(number)
        if found is None or found[1] != secret:
            return f"RDMA region {number} is not registered in this process"
        return found[0]

    def drop(self, number: int, secret: bytes) -> None:
        self.regions.pop(number, None)


@pytest.fixture(scope="module")
def owner() -> Iterator[tuple[_Table, LaneServer]]:
    table = _Table()
    server = LaneServer(table.lookup, table.drop, tcp_host="127.0.0.1")
    try:
        yield table, server
    finally:
        server.close()


@contextlib.contextmanager
def _through(server: LaneServer, mangle: Mangle) -> Iterator[tuple[LanePool, Endpoint]]:
    proxy = _Proxy(server.endpoint.port, mangle)
    pool = LanePool()
    try:
        yield pool, Endpoint("unused", proxy.port, ("127.0.0.1",), server.endpoint.fingerprint)
    finally:
        pool.close_idle()
        proxy.close()


def _passthrough(direction: str, offset: int, data: bytes) -> bytes:
    return data


def _flip_at(direction: str, position: int) -> Mangle:
    def mangle(d: str, offset: int, data: bytes) -> bytes:
        if d == direction and offset <= position < offset + len(data):
            changed = bytearray(data)
            changed[position - offset] ^= 0x01
            return bytes(changed)
        return data

    return mangle


def _cut_at(direction: str, position: int, stall: bool = False) -> Mangle:
    def mangle(d: str, offset: int, data: bytes) -> bytes | None:
        if d == direction and offset + len(data) > position:
            if position > offset:  # what comes before the cut still passes, then nothing
                return None if not stall else b""
            return None if not stall else b""
        return data

    return mangle


def _transfer(pool: LanePool, endpoint: Endpoint, op: Op, region: int, view: memoryview,
              timeout: float = 30) -> None:  # fmt: skip
    async def main() -> None:
        await asyncio.wait_for(pool.transfer("tls", endpoint, op, region, SECRET, 0, view), timeout)

    asyncio.run(main())


@pytest.mark.parametrize("size", [1, 9, MiB - 1, MiB, MiB + 1, 5 * MiB + 3])
def test_the_tls_lane_moves_every_size_class_both_ways(
    owner: tuple[_Table, LaneServer], size: int
) -> None:
    table, server = owner
    memory = bytearray(os.urandom(size))
    table.regions[1] = (memoryview(memory), SECRET)
    with _through(server, _passthrough) as (pool, endpoint):  # the proxy sees only ciphertext
        dst = bytearray(size)
        _transfer(pool, endpoint, Op.READ, 1, memoryview(dst))
        assert dst == memory
        src = os.urandom(size)
        _transfer(pool, endpoint, Op.WRITE, 1, memoryview(src))
        assert memory == src


def test_a_read_tampered_on_the_way_fails_and_no_forged_byte_lands(
    owner: tuple[_Table, LaneServer],
) -> None:
    table, server = owner
    memory = os.urandom(4 * MiB)
    table.regions[2] = (memoryview(memory), SECRET)
    with _through(server, _flip_at("down", 2 * MiB + 12345)) as (pool, endpoint):
        dst = bytearray(len(memory))
        started = time.monotonic()
        with pytest.raises(OwnerGone, match="failed authentication"):
            _transfer(pool, endpoint, Op.READ, 2, memoryview(dst))
        assert time.monotonic() - started < 10
    # Records of 256 KiB; the flipped bit is in the ninth (the TLS handshake, the hello and the
    # reply head take a few KiB before them): the first eight arrived, nothing of it nor after.
    assert dst[: 2 * MiB] == memory[: 2 * MiB]
    assert dst[2 * MiB :] == bytes(2 * MiB)


def test_a_write_tampered_on_the_way_fails_and_no_forged_byte_lands(
    owner: tuple[_Table, LaneServer],
) -> None:
    table, server = owner
    memory = bytearray(3 * MiB)
    table.regions[3] = (memoryview(memory), SECRET)
    src = os.urandom(3 * MiB)
    with _through(server, _flip_at("up", MiB + 5000)) as (pool, endpoint):
        with pytest.raises(OwnerGone):
            _transfer(pool, endpoint, Op.WRITE, 3, memoryview(src[: 3 * MiB]))
    # The flipped bit is in the fifth record of 256 KiB: the first four were stored (authentic),
    # nothing of the forged one, nor after it.
    assert memory[:MiB] == src[:MiB]
    assert memory[MiB:] == bytes(2 * MiB)


def test_a_stream_cut_mid_record_fails_at_once(owner: tuple[_Table, LaneServer]) -> None:
    table, server = owner
    memory = os.urandom(3 * MiB)
    table.regions[4] = (memoryview(memory), SECRET)
    with _through(server, _cut_at("down", 2 * MiB)) as (pool, endpoint):
        started = time.monotonic()
        with pytest.raises(OwnerGone):
            _transfer(pool, endpoint, Op.READ, 4, memoryview(bytearray(len(memory))))
        assert time.monotonic() - started < 5


def test_a_stream_stalled_mid_record_fails_within_the_timeout(
    owner: tuple[_Table, LaneServer],
) -> None:
    table, server = owner
    memory = os.urandom(3 * MiB)
    table.regions[5] = (memoryview(memory), SECRET)
    with _through(server, _cut_at("down", 2 * MiB, stall=True)) as (pool, endpoint):
        dst = bytearray(len(memory))
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            _transfer(pool, endpoint, Op.READ, 5, memoryview(dst), timeout=0.5)
        assert time.monotonic() - started < 3


def _plain_tls_server(hello: bytes) -> tuple[socket.socket, bytes, threading.Thread]:
    """A TLS 1.3 server with a certificate of its own that answers with ``hello``."""
    from monarch.rdma._netlane import _make_certificate, _server_context

    pem, der = _make_certificate()
    context = _server_context(pem)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(10)
                tls.recv(SEAL_HELLO_SIZE)
                tls.sendall(hello)
                tls.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, hashlib.sha256(der).digest(), thread


def test_a_pinned_owner_that_does_not_speak_sealed_records_is_refused() -> None:
    listener, fingerprint, thread = _plain_tls_server(b"HTTP/1.1 400 Bad Request\r\n" * 2)
    try:
        endpoint = Endpoint("unused", listener.getsockname()[1], ("127.0.0.1",), fingerprint)
        with pytest.raises(OwnerGone, match="not a sealed lane"):
            _transfer(LanePool(), endpoint, Op.READ, 1, memoryview(bytearray(4)), timeout=10)
    finally:
        listener.close()
        thread.join(10)


def test_an_unpinned_owner_is_refused_before_anything_is_sent() -> None:
    listener, _, thread = _plain_tls_server(b"")
    try:
        raw = socket.create_connection(listener.getsockname())
        raw.settimeout(10)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        with pytest.raises(ssl.SSLError, match="not the one in its key"):
            client_handshake(raw, client, bytes(32))
        raw.close()
    finally:
        listener.close()
        thread.join(10)


def test_the_owner_closes_a_connection_whose_hello_is_not_a_lanes(
    owner: tuple[_Table, LaneServer],
) -> None:
    _, server = owner
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", server.endpoint.port), timeout=10) as raw:
        with client.wrap_socket(raw) as tls:
            tls.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(SEAL_HELLO_SIZE))
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                assert tls.recv(1) == b""  # closed without a hello back


def test_a_transfer_buffers_no_more_than_a_connections_records(
    owner: tuple[_Table, LaneServer],
) -> None:
    """The memory a transfer takes is its connections' fixed buffers (made at connect), not
    its size: a 32 MiB read on a kept connection allocates less than one record."""
    table, server = owner
    memory = os.urandom(32 * MiB)
    table.regions[6] = (memoryview(memory), SECRET)
    endpoint = dataclasses.replace(server.endpoint, addresses=("127.0.0.1",))
    pool = LanePool()  # no proxy: its copies would count
    try:
        dst = bytearray(len(memory))
        _transfer(pool, endpoint, Op.READ, 6, memoryview(dst)[:MiB])  # connects
        tracemalloc.start()
        try:
            _transfer(pool, endpoint, Op.READ, 6, memoryview(dst))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        pool.close_idle()
    assert dst == memory
    assert peak < SEAL_MAX_RECORD // 4, peak


@pytest.mark.parametrize("op", [Op.READ, Op.WRITE])
def test_a_kept_sealed_connection_the_owner_closed_while_idle_is_replaced(op: Op) -> None:
    """The owner's idle close ends its side between records (a clean end, not a truncation):
    the next transfer retries once on a fresh connection, with fresh keys."""
    table = _Table()
    memory = bytearray(b"idle" * 64)
    table.regions[1] = (memoryview(memory), SECRET)
    server = LaneServer(table.lookup, table.drop, tcp_host="127.0.0.1", idle_timeout=0.2)
    endpoint = dataclasses.replace(server.endpoint, addresses=("127.0.0.1",))
    pool = LanePool()
    try:
        view = memoryview(bytearray(len(memory)))
        _transfer(pool, endpoint, Op.READ, 1, view)
        (kept,) = [conn for conns in pool._idle.values() for conn in conns]
        assert isinstance(kept.sock, SealedStream)
        readable, _, _ = select.select([kept.sock.raw], [], [], 10)  # the owner's end of it
        assert readable
        data = memoryview(bytearray(b"IDLE" * 64)) if op is Op.WRITE else view
        _transfer(pool, endpoint, op, 1, data)
        assert bytes(memory) == (b"IDLE" * 64 if op is Op.WRITE else bytes(view))
        assert kept.sock.raw.fileno() == -1  # the stale one was closed, a fresh one is kept
        assert pool._idle_count == 1
    finally:
        pool.close_idle()
        server.close()
