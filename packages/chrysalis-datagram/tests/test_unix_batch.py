"""Unix datagram carrier: batched receives (``recvmmsg`` into the caller's cached buffers).

A buffer list is cached on its second sighting, so every test here receives once to warm the
cache (or checks that the first call did not cache), then exercises the batch path: sources,
lengths, truncation and unnamed senders in the middle of a batch, buffers replaced in place,
the cache bound and the buffer exports, shutdown racing a receive, and the plain fallback.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    AddressNotAvailableError,
    DatagramRecvMeta,
    InvalidDataError,
    SocketClosedError,
    UnixDatagramSocket,
    _recvmmsg,
)
from chrysalis.datagram._recvmmsg import BATCH_CACHE_LIMIT, recvmmsg_function
from chrysalis.datagram._socket import ReceiveBuffer, mapped_buffers
from chrysalis.datagram.testing import wait_readable

_REAL_BATCH_FROM = UnixDatagramSocket._batch_from

pytestmark = pytest.mark.skipif(
    recvmmsg_function() is None, reason="recvmmsg is not available on this platform"
)


@pytest.fixture(autouse=True, scope="module")
def _always_batch() -> Iterator[None]:
    """Take the batch path whatever the last batch held (the receivers switch to their
    per-datagram loop after single datagrams and right after a batch that emptied the queue;
    that switch is tested on its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(UnixDatagramSocket, "_batch_from", 0)
        patch.setattr(_recvmmsg, "_PROBE_AFTER_DRAIN", False)
        yield


def _close(*socks: UnixDatagramSocket) -> None:
    for sock in socks:
        sock.shutdown()
        assert sock.join(5)


def _abstract(tag: str) -> bytes:
    return f"\0chrysalis-test-batch-{os.getpid()}-{tag}-{os.urandom(4).hex()}".encode()


@pytest.fixture
def trio(
    tmp_path: Path,
) -> Iterator[tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket]]:
    """A receiver, a sender with a filesystem path and a sender with an abstract name."""
    rx = UnixDatagramSocket.bind(tmp_path / "rx.sock")
    path_sender = UnixDatagramSocket.bind(tmp_path / "tx.sock")
    abstract_sender = UnixDatagramSocket.bind(_abstract("tx"))
    yield rx, path_sender, abstract_sender
    _close(rx, path_sender, abstract_sender)


def _batches(sock: UnixDatagramSocket) -> int:
    cache = sock._batches
    assert cache is not None
    return len(cache)


def _receive(
    sock: UnixDatagramSocket, buffers: Sequence[bytearray | memoryview | mmap.mmap], expected: int
) -> list[tuple[bytes, DatagramAddr, int]]:
    """Receive ``expected`` datagrams into ``buffers`` (several calls if needed)."""
    got: list[tuple[bytes, DatagramAddr, int]] = []
    while len(got) < expected:
        metas: list[DatagramRecvMeta] = []
        filled = sock.try_recv(buffers, metas)
        assert filled == len(metas)
        got += [
            (bytes(buf[: m.length]), m.source, m.stride)
            for buf, m in zip(buffers, metas, strict=False)
        ]
        if filled == 0:
            assert wait_readable(sock, 2.0)
    return got


def _warm(
    rx: UnixDatagramSocket, sender: UnixDatagramSocket, buffers: Sequence[ReceiveBuffer]
) -> None:
    """Receive twice into ``buffers``, so that the list is cached."""
    for _ in range(2):
        assert sender.try_send_to(b"warm", rx.local_addr)
        assert _receive(rx, buffers, 1) == [(b"warm", sender.local_addr, 4)]
    assert _batches(rx) == 1


def _send_and_receive(
    rx: UnixDatagramSocket,
    path_sender: UnixDatagramSocket,
    abstract_sender: UnixDatagramSocket,
    buffers: Sequence[ReceiveBuffer],
) -> None:
    """A batch of mixed senders and lengths (an empty datagram, a full buffer) arrives
    exactly, in order, through cached ``buffers``."""
    sends = [
        (path_sender, b"a" * 1200),
        (path_sender, b"b" * 1200),
        (abstract_sender, b"c" * 1200),
        (abstract_sender, b"d" * 7),
        (path_sender, b""),
        (path_sender, b"e" * 1500),
    ]
    for sender, payload in sends:
        assert sender.try_send_to(payload, rx.local_addr)
    assert wait_readable(rx, 2.0)
    got = _receive(rx, buffers, len(sends))
    assert got == [(payload, sender.local_addr, len(payload)) for sender, payload in sends]


def test_second_sighting_caches_and_batches_keep_sources_and_lengths(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, abstract_sender = trio
    buffers = [bytearray(1500) for _ in range(8)]
    assert path_sender.try_send_to(b"one", rx.local_addr)
    assert _receive(rx, buffers, 1) == [(b"one", path_sender.local_addr, 3)]
    assert _batches(rx) == 0  # first sighting: the per-datagram loop, nothing exported
    buffers[0].extend(b"!")  # so the buffer is not locked
    del buffers[0][-1]
    _warm(rx, path_sender, buffers)
    _send_and_receive(rx, path_sender, abstract_sender, buffers)
    assert abstract_sender.local_addr.opaque.startswith(b"\0")


def test_mapped_buffers_are_cached_like_bytearrays(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    """Whole mmaps (a datagram switch's buffers, issue 22) take the batch path; a cached one
    cannot be closed under the kernel until its batch is dropped."""
    rx, path_sender, abstract_sender = trio
    buffers = mapped_buffers(8, 1500)
    assert all(type(buffer) is mmap.mmap for buffer in buffers)
    assert path_sender.try_send_to(b"one", rx.local_addr)
    assert _receive(rx, buffers, 1) == [(b"one", path_sender.local_addr, 3)]
    assert _batches(rx) == 0  # first sighting: the per-datagram loop, nothing exported
    _warm(rx, path_sender, buffers)
    _send_and_receive(rx, path_sender, abstract_sender, buffers)
    first = buffers[0]
    assert isinstance(first, mmap.mmap)
    with pytest.raises(BufferError):
        first.close()
    rx.release_buffers()
    first.close()
    assert first.closed


def test_mapped_buffers_shape() -> None:
    buffers = mapped_buffers(3, 100)
    assert [len(buffer) for buffer in buffers] == [100, 100, 100]
    assert all(bytes(buffer) == bytes(100) for buffer in buffers)
    buffers[1][98:] = b"xy"
    assert bytes(buffers[1][97:]) == b"\0xy"
    assert bytes(buffers[2]) == bytes(100)
    assert mapped_buffers(0, 1) == []
    with pytest.raises(ValueError, match="receive buffers"):
        mapped_buffers(1, 0)
    with pytest.raises(ValueError, match="receive buffers"):
        mapped_buffers(-1, 1)


def test_uniform_batches_share_one_meta_and_follow_a_new_sender(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, abstract_sender = trio
    buffers = [bytearray(1500) for _ in range(8)]
    _warm(rx, path_sender, buffers)
    seen: list[DatagramRecvMeta] = []
    for sender in (path_sender, path_sender, abstract_sender, path_sender):
        for i in range(5):
            assert sender.try_send_to(bytes([i]) * 1200, rx.local_addr)
        assert wait_readable(rx, 2.0)
        metas: list[DatagramRecvMeta] = []
        filled = 0
        while filled < 5:
            filled += rx.try_recv(buffers[filled:] if filled else buffers, metas)
        assert [bytes(buffers[i][:1200]) for i in range(5)] == [bytes([i]) * 1200 for i in range(5)]
        assert all(m.source == sender.local_addr and m.length == 1200 for m in metas)
        seen += metas
    # Equal consecutive datagrams of one batch share a meta, a new sender gets a new one.
    assert len({id(m) for m in seen[5:10]}) == 1
    assert seen[10] is not seen[9]
    assert seen[15].source == path_sender.local_addr
    # A uniform batch like the last one after another receive changed the memo: a new meta.
    for _ in range(2):
        assert path_sender.try_send_to(b"x" * 1200, rx.local_addr)
    assert _receive(rx, buffers, 2) == [(b"x" * 1200, path_sender.local_addr, 1200)] * 2
    assert path_sender.try_send_to(b"short", rx.local_addr)
    assert _receive(rx, [bytearray(64)], 1) == [(b"short", path_sender.local_addr, 5)]
    for _ in range(2):
        assert path_sender.try_send_to(b"y" * 1200, rx.local_addr)
    assert wait_readable(rx, 2.0)
    metas = []
    assert rx.try_recv(buffers, metas) == 2
    assert metas[0] is metas[1]
    assert (metas[0].source, metas[0].length) == (path_sender.local_addr, 1200)


def test_truncation_in_a_batch_keeps_the_rest_in_order(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, abstract_sender = trio
    buffers = [bytearray(1024) for _ in range(6)]
    _warm(rx, path_sender, buffers)
    sends = [
        (path_sender, b"a" * 10),
        (abstract_sender, b"b" * 2000),  # longer than its buffer: consumed, an error
        (abstract_sender, b"c" * 20),
        (path_sender, b"d" * 3000),  # another one
        (path_sender, b"e" * 30),
    ]
    for sender, payload in sends:
        assert sender.try_send_to(payload, rx.local_addr)
    assert wait_readable(rx, 2.0)
    metas: list[DatagramRecvMeta] = []
    assert rx.try_recv(buffers, metas) == 1
    assert bytes(buffers[0][:10]) == b"a" * 10
    with pytest.raises(InvalidDataError, match="2000 bytes"):
        rx.try_recv(buffers, metas)
    # The datagram after the error was copied out of the caller's buffer before it was lent
    # again: it comes back intact, then the second error, then the last datagram.
    buffers[2][:] = bytes(len(buffers[2]))
    metas.clear()
    assert rx.try_recv(buffers, metas) == 1
    assert (bytes(buffers[0][: metas[0].length]), metas[0].source) == (
        b"c" * 20,
        abstract_sender.local_addr,
    )
    # try_recv_from serves what was kept, in order, too.
    with pytest.raises(InvalidDataError, match="3000 bytes"):
        rx.try_recv_from()
    assert rx.try_recv_from() == (b"e" * 30, path_sender.local_addr)
    assert rx.try_recv_from() is None


def test_kept_datagrams_fill_small_lists_and_are_checked_against_them(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, _ = trio
    buffers = [bytearray(1024) for _ in range(6)]
    _warm(rx, path_sender, buffers)
    for payload in (b"a" * 2000, b"b" * 10, b"c" * 500, b"d" * 20):
        assert path_sender.try_send_to(payload, rx.local_addr)
    assert wait_readable(rx, 2.0)
    with pytest.raises(InvalidDataError):
        rx.try_recv(buffers, [])
    one = [bytearray(32)]
    metas: list[DatagramRecvMeta] = []
    assert rx.try_recv(one, metas) == 1  # one kept datagram per buffer
    assert bytes(one[0][:10]) == b"b" * 10
    with pytest.raises(InvalidDataError, match="500 bytes"):
        rx.try_recv(one, metas)  # a kept datagram too long for the buffer it is offered
    assert _receive(rx, one, 1) == [(b"d" * 20, path_sender.local_addr, 20)]


def test_kernel_errors_and_a_racing_shutdown_on_the_batch_path(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rx, path_sender, _ = trio
    buffers = [bytearray(64) for _ in range(4)]
    _warm(rx, path_sender, buffers)
    real = _recvmmsg._recvmmsg_call

    def failing(*args: object) -> int:
        ctypes.set_errno(errno.ECONNRESET)
        return -1

    monkeypatch.setattr(_recvmmsg, "_recvmmsg_call", failing)
    with pytest.raises(ConnectionResetError):
        rx.try_recv(buffers, [])

    def shut_down_first(*args: object) -> int:
        rx.shutdown()  # queued datagrams are still delivered: dropped, the call raises
        return real(*args)

    assert path_sender.try_send_to(b"late", rx.local_addr)
    assert wait_readable(rx, 2.0)
    monkeypatch.setattr(_recvmmsg, "_recvmmsg_call", shut_down_first)
    with pytest.raises(SocketClosedError):
        rx.try_recv(buffers, [])


def test_shutdown_during_an_empty_batched_receive_raises(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rx, path_sender, _ = trio
    buffers = [bytearray(64) for _ in range(4)]
    _warm(rx, path_sender, buffers)
    real = _recvmmsg._recvmmsg_call

    def shut_down_first(*args: object) -> int:
        rx.shutdown()
        return real(*args)  # nothing queued: would block

    monkeypatch.setattr(_recvmmsg, "_recvmmsg_call", shut_down_first)
    with pytest.raises(SocketClosedError):
        rx.try_recv(buffers, [])


def test_unnamed_sender_in_a_batch_is_reported_in_order(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, _ = trio
    buffers = [bytearray(256) for _ in range(4)]
    _warm(rx, path_sender, buffers)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as anonymous:
        assert path_sender.try_send_to(b"before", rx.local_addr)
        anonymous.sendto(b"who?", rx.path)
        assert path_sender.try_send_to(b"after", rx.local_addr)
    assert wait_readable(rx, 2.0)
    metas: list[DatagramRecvMeta] = []
    assert rx.try_recv(buffers, metas) == 1
    with pytest.raises(AddressNotAvailableError):
        rx.try_recv(buffers, metas)
    assert _receive(rx, buffers, 1) == [(b"after", path_sender.local_addr, 5)]
    # A batch that starts with the unnamed sender raises at once.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as anonymous:
        anonymous.sendto(b"who?", rx.path)
    assert path_sender.try_send_to(b"next", rx.local_addr)
    assert wait_readable(rx, 2.0)
    with pytest.raises(AddressNotAvailableError):
        rx.try_recv(buffers, [])
    assert _receive(rx, buffers, 1) == [(b"next", path_sender.local_addr, 4)]


def test_a_buffer_replaced_in_place_receives_instead_of_the_cached_one(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, _ = trio
    buffers = [bytearray(64) for _ in range(4)]
    _warm(rx, path_sender, buffers)
    old = buffers[0]
    old[:] = bytes(64)
    buffers[0] = bytearray(64)  # same list object, same length, different buffer
    assert path_sender.try_send_to(b"fresh", rx.local_addr)
    assert _receive(rx, buffers, 1) == [(b"fresh", path_sender.local_addr, 5)]
    assert bytes(buffers[0][:5]) == b"fresh"
    assert old == bytes(64)  # the cached buffer was not written
    # A smaller replacement is checked against its own size.
    buffers[0] = bytearray(3)
    _warm_again = [buffers, buffers]
    for listing in _warm_again:
        assert path_sender.try_send_to(b"toolong", rx.local_addr)
        assert wait_readable(rx, 2.0)
        with pytest.raises(InvalidDataError):
            rx.try_recv(listing, [])


def test_cache_is_bounded_and_releases_buffer_exports(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, _ = trio
    lists = [[bytearray(64) for _ in range(2)] for _ in range(BATCH_CACHE_LIMIT + 2)]
    for buffers in lists:
        for _ in range(2):
            assert path_sender.try_send_to(b"x", rx.local_addr)
            assert _receive(rx, buffers, 1) == [(b"x", path_sender.local_addr, 1)]
    assert _batches(rx) == BATCH_CACHE_LIMIT
    # The oldest lists were dropped: their buffers can be resized again; cached ones cannot.
    lists[0][0].extend(b"more")
    with pytest.raises(BufferError):
        lists[-1][0].extend(b"more")
    rx.release_buffers()
    assert _batches(rx) == 0
    lists[-1][0].extend(b"more")
    # Shutdown releases them too.
    for _ in range(2):
        assert path_sender.try_send_to(b"y", rx.local_addr)
        assert _receive(rx, lists[1], 1) == [(b"y", path_sender.local_addr, 1)]
    assert _batches(rx) == 1
    rx.shutdown()
    lists[1][0].extend(b"more")


def test_memoryviews_and_other_buffers_take_the_plain_loop(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, _ = trio
    backing = bytearray(256)
    views = [memoryview(backing)[:128], memoryview(backing)[128:]]
    for _ in range(3):
        assert path_sender.try_send_to(b"p", rx.local_addr)
        assert path_sender.try_send_to(b"qq", rx.local_addr)
        assert _receive(rx, views, 2) == [
            (b"p", path_sender.local_addr, 1),
            (b"qq", path_sender.local_addr, 2),
        ]
    assert _batches(rx) == 0
    for view in views:
        view.release()  # no export kept


def test_more_buffers_than_a_batch_fill_at_most_32(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    rx, path_sender, _ = trio
    buffers = [bytearray(16) for _ in range(DATAGRAM_BATCH_SIZE + 8)]
    _warm(rx, path_sender, buffers)
    for i in range(8):
        assert path_sender.try_send_to(bytes([i]), rx.local_addr)
    assert _receive(rx, buffers, 8) == [(bytes([i]), path_sender.local_addr, 1) for i in range(8)]
    cache = rx._batches
    assert cache is not None
    assert all(batch.count <= DATAGRAM_BATCH_SIZE for batch in cache.batches)


def test_shutdown_during_batched_receives_ends_them_with_socket_closed(tmp_path: Path) -> None:
    for attempt in range(5):
        rx = UnixDatagramSocket.bind(tmp_path / f"rx{attempt}.sock")
        tx = UnixDatagramSocket.bind(tmp_path / f"tx{attempt}.sock")
        buffers = [bytearray(256) for _ in range(8)]
        _warm(rx, tx, buffers)
        failures: list[BaseException] = []
        started = threading.Event()

        def receive_until_closed(
            rx: UnixDatagramSocket = rx,
            buffers: list[bytearray] = buffers,
            started: threading.Event = started,
            failures: list[BaseException] = failures,
        ) -> None:
            started.set()
            try:
                for _ in range(1_000_000):
                    rx.try_recv(buffers, [])
                failures.append(AssertionError("never saw the shutdown"))
            except SocketClosedError:
                pass
            except BaseException as error:  # pragma: no cover - reported below
                failures.append(error)

        thread = threading.Thread(target=receive_until_closed)
        thread.start()
        assert started.wait(5)
        for _ in range(3):
            tx.try_send_to(b"z", rx.local_addr)
        rx.shutdown()
        assert rx.join(5)
        thread.join(5)
        assert not thread.is_alive()
        assert failures == []
        assert _batches(rx) == 0
        _close(tx)


def test_without_recvmmsg_the_plain_loop_receives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_recvmmsg, "_recvmmsg_call", _recvmmsg._no_recvmmsg)
    rx = UnixDatagramSocket.bind(tmp_path / "rx.sock")
    tx = UnixDatagramSocket.bind(tmp_path / "tx.sock")
    try:
        assert rx._batches is None
        buffers = [bytearray(64) for _ in range(4)]
        for _ in range(3):
            for payload in (b"1", b"22", b"333"):
                assert tx.try_send_to(payload, rx.local_addr)
            assert _receive(rx, buffers, 3) == [
                (b"1", tx.local_addr, 1),
                (b"22", tx.local_addr, 2),
                (b"333", tx.local_addr, 3),
            ]
        rx.release_buffers()  # nothing to release
    finally:
        _close(rx, tx)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([0, 1, 300, 1200, 1201, 3000])),
        min_size=1,
        max_size=24,
    ),
    st.integers(1, 12),
)
def test_batches_match_a_per_datagram_model(
    sends: list[tuple[int, int]], buffer_count: int
) -> None:
    """Any mix of senders (one unnamed), lengths and truncations: the batch path reports the
    same sequence of datagrams and errors as a per-datagram receiver would."""
    tag = os.urandom(6).hex()
    rx = UnixDatagramSocket.bind(_abstract(f"model-rx-{tag}"))
    senders = [UnixDatagramSocket.bind(_abstract(f"model-tx{i}-{tag}")) for i in range(2)]
    anonymous = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        buffers = [bytearray(1200) for _ in range(buffer_count)]
        _warm(rx, senders[0], buffers)
        expected: list[object] = []
        got: list[object] = []
        for start in range(0, len(sends), 8):  # the kernel queue holds about 10
            for n, (who, size) in enumerate(sends[start : start + 8]):
                payload = bytes([(start + n) % 256]) * size
                if who == 2:  # the length is checked first, as in the per-datagram loop
                    anonymous.sendto(payload, rx.path)
                    expected.append("too long" if size > 1200 else "unnamed")
                else:
                    assert senders[who].try_send_to(payload, rx.local_addr)
                    expected.append(
                        "too long" if size > 1200 else (payload, senders[who].local_addr)
                    )
            while len(got) < len(expected):
                metas: list[DatagramRecvMeta] = []
                try:
                    filled = rx.try_recv(buffers, metas)
                except InvalidDataError:
                    got.append("too long")
                    continue
                except AddressNotAvailableError:
                    got.append("unnamed")
                    continue
                assert filled == len(metas) <= buffer_count
                got += [
                    (bytes(buf[: m.length]), m.source)
                    for buf, m in zip(buffers, metas, strict=False)
                ]
                if filled == 0:
                    assert wait_readable(rx, 2.0)
        assert got == expected
    finally:
        anonymous.close()
        _close(rx, *senders)


def test_single_datagrams_switch_to_the_plain_loop_and_bursts_back(
    trio: tuple[UnixDatagramSocket, UnixDatagramSocket, UnixDatagramSocket],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rx, path_sender, _ = trio
    monkeypatch.setattr(UnixDatagramSocket, "_batch_from", _REAL_BATCH_FROM)  # the real ones
    monkeypatch.setattr(_recvmmsg, "_PROBE_AFTER_DRAIN", True)
    real = _recvmmsg._recvmmsg_call
    calls: list[int] = []

    def counting(*args: object) -> int:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(_recvmmsg, "_recvmmsg_call", counting)
    buffers = [bytearray(64) for _ in range(8)]
    _warm(rx, path_sender, buffers)  # single datagrams
    calls.clear()
    for _ in range(3):
        assert path_sender.try_send_to(b"one", rx.local_addr)
        assert _receive(rx, buffers, 1) == [(b"one", path_sender.local_addr, 3)]
        assert rx.try_recv(buffers, []) == 0
    assert calls == []  # the per-datagram loop served them
    for _ in range(2):
        for _ in range(5):
            assert path_sender.try_send_to(b"five", rx.local_addr)
        assert _receive(rx, buffers, 5) == [(b"five", path_sender.local_addr, 4)] * 5
        assert rx.try_recv(buffers, []) == 0  # right after a drain: the per-datagram loop
    assert len(calls) == 1  # the first burst switched back to recvmmsg for the second
    # A batch that empties the queue: the call right after it takes the per-datagram loop
    # (it mostly finds nothing), the one after that batches again.
    for _ in range(5):
        assert path_sender.try_send_to(b"again", rx.local_addr)
    assert wait_readable(rx, 2.0)
    assert rx.try_recv(buffers, []) == 5
    assert len(calls) == 2
    assert rx.try_recv(buffers, []) == 0
    assert len(calls) == 2
    assert rx.try_recv(buffers, []) == 0
    assert len(calls) == 3


def test_sightings_and_expected_headers_are_bounded() -> None:
    cache = _recvmmsg.BatchCache(112)
    lists = [[bytearray(8)] for _ in range(200)]
    for buffers in lists:
        assert cache.build(buffers) is None  # first sighting: remembered only
        assert len(cache._seen) <= 64
    assert cache.build([memoryview(bytearray(8))]) is None
    assert cache.build([memoryview(bytearray(8))]) is None  # never cached: not a bytearray
    view = memoryview(mapped_buffers(1, 8)[0])
    assert cache.build([view]) is None
    assert cache.build([view]) is None  # a slice of a mapping neither: it can be released
    batch = cache.build(lists[-1]) or cache.build(lists[-1])
    assert batch is not None
    assert len(cache) == 1
    for length in range(100):
        assert len(batch.uniform(20, length, 1)) == 64
        assert len(batch._expected) <= 64
    assert batch.expected_get((20, 99, 1)) is not None
    cache.clear()
    assert len(cache) == 0
