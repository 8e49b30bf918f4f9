"""``StreamCore``: the adapter-side, runtime-neutral state of one stream (receive side: one
posted receive and the unread chunks; send side: pending, admitted and acknowledged bytes).

Its endpoint and connection (``EndpointCore``, ``ConnectionCore`` in ``_endpoint_core``) are
named for typing only: that module builds streams, this one never imports it at run time."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Final, final

from chrysalis.core.completion import (
    ControlOutcome,
    ExceedsBudget,
    OperationCancellation,
    ReceiveCompletion,
    ReceiveOptions,
    ReceiveStatus,
    SendCompletion,
    SendOutcome,
    StreamClosed,
    StreamRef,
    SubmissionClosed,
    WouldBlock,
)
from chrysalis.quic._errors import (
    EndpointClosedError,
    IncompleteReadError,
    QuicTransportError,
    ReadLimitError,
    StreamBrokenError,
    StreamClosedError,
    StreamResetError,
    WriteBufferFullError,
)

if TYPE_CHECKING:
    from chrysalis.quic._endpoint_core import AsyncEvent, ConnectionCore, EndpointCore

__all__ = ["StreamCore"]

_DIRECT_SEND: Final = 16 * 1024
_WRITE_THROUGH_MAX: Final = 1024
"""The largest write an inline driver may send from inside ``write`` (one small message: a
request or a reply, never bulk data, whose batching is worth more than a loop callback)."""

# Connection states (``ConnectionCore.state``); here because a stream reads them too.
_HANDSHAKING: Final = 0
_ESTABLISHED: Final = 1
_FAILED: Final = 2
_CLOSED: Final = 3


# Receive-side terminal states.
_RX_OPEN: Final = 0
_RX_FIN: Final = 1
_RX_RESET: Final = 2
_RX_LOST: Final = 3
_RX_STOPPED: Final = 4
# The endpoint ended the receive half because the connection is going (``ReceiveStatus.CLOSED``),
# but its ``ConnectionClosed``, which carries the close codes, has not been dispatched yet. The
# completion model delivers it after every completion of the connection's operations, and with
# the thread driver (or staged event credits) the application can drain the first before the
# endpoint has queued the second: a reader that raised at once would report a lost connection
# without its codes. Readers keep waiting in this state; nothing more is posted, and
# ``ConnectionClosed`` (or ``StreamClosed``, or the driver stopping) turns it into ``_RX_LOST``.
_RX_CLOSING: Final = 5
# Finish progress.
_EOF_NONE: Final = 0
_EOF_WANTED: Final = 1
_EOF_SENT: Final = 2


@final
class StreamCore:
    """The adapter-side state of one stream (runtime-neutral).

    Receive side: at most one posted receive; unread bytes wait in ``chunks`` (at most
    ``read_ahead`` before no new receive is posted). Send side: bytes not yet admitted wait in
    ``pending``; admitted, unacknowledged bytes are ``in_flight`` (at most about
    ``write_high_water``). All methods run on the event loop's thread.
    """

    __slots__ = (
        "__weakref__",
        "aborted",
        "ahead_due",
        "blocked",
        "cancellation",
        "chunks",
        "closed",
        "conn",
        "core",
        "eof",
        "facade",
        "head",
        "in_flight",
        "local",
        "pending",
        "pending_len",
        "posted",
        "read_closed",
        "reclaimed",
        "ref",
        "reset_code",
        "rlen",
        "rstate",
        "rwait",
        "stop_code",
        "werror",
        "write_closed",
        "wwait",
    )

    def __init__(self, core: EndpointCore, conn: ConnectionCore, ref: StreamRef, local: bool):
        self.core = core
        self.conn = conn
        self.ref = ref
        self.local = local
        self.chunks: deque[bytes | bytearray] = deque()
        self.head = 0
        self.rlen = 0
        self.posted = False
        self.rstate = _RX_OPEN
        self.reset_code = 0
        self.read_closed = False
        self.rwait: AsyncEvent | None = None
        self.pending: deque[bytes | bytearray | memoryview] = deque()
        self.pending_len = 0
        self.in_flight = 0
        self.eof = _EOF_NONE
        self.write_closed = False
        self.werror: QuicTransportError | None = None
        self.wwait: AsyncEvent | None = None
        self.stop_code: int | None = None
        self.closed = False
        self.reclaimed = False
        self.blocked = False
        self.aborted = False
        self.ahead_due = False  # queued in ``core.read_ahead_due``
        self.cancellation: OperationCancellation | None = None
        self.facade: object | None = None

    # -- signalling ---------------------------------------------------------------------------

    def _wake_readers(self) -> None:
        event = self.rwait
        if event is not None:
            self.rwait = None
            event.set()

    def _wake_writers(self) -> None:
        event = self.wwait
        if event is not None:
            self.wwait = None
            event.set()

    async def _wait_read(self) -> None:
        event = self.rwait
        if event is None:
            event = self.rwait = self.core.runtime.event()
        await event.wait()

    async def _wait_write(self) -> None:
        event = self.wwait
        if event is None:
            event = self.wwait = self.core.runtime.event()
        await event.wait()

    # -- receiving ----------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Received bytes not read yet."""
        return self.rlen

    @property
    def at_eof(self) -> bool:
        """True when every byte was read and the peer finished (or nothing more can come)."""
        state = self.rstate
        return not self.rlen and state != _RX_OPEN and state != _RX_CLOSING

    def post_receive(self) -> WouldBlock[Any] | None:
        """Keep one receive posted while the stream is open and the buffer has room."""
        if (
            self.posted
            or self.rstate != _RX_OPEN
            or self.read_closed
            or self.core.draining
            or self.rlen >= self.core.options.read_ahead
        ):
            return None
        core = self.core
        try:
            receipt = core.submitter.receive_nowait(
                self.ref, bytearray(), core.options.read_ahead, _ONE_BYTE
            )
        except WouldBlock as exc:
            return exc
        except (SubmissionClosed, ExceedsBudget):
            self._terminate_receive(_RX_LOST)
            return None
        self.posted = True
        self.cancellation = receipt.cancellation
        core.posted_receives += 1
        return None

    def _maybe_read_ahead(self) -> None:
        core = self.core
        if core.posted_receives < core.read_ahead_slots:
            self.post_receive()

    def _read_ahead(self) -> None:
        """``_maybe_read_ahead`` now, or after the inline driver's flush while it defers
        read-aheads (see ``EndpointCore.read_ahead_due``)."""
        due = self.core.read_ahead_due
        if due is None:
            self._maybe_read_ahead()
        elif not self.ahead_due:
            self.ahead_due = True
            due.append(self)

    def take(self, max_bytes: int) -> bytes:
        """Remove and return up to ``max_bytes`` buffered bytes (at least one is buffered)."""
        chunks = self.chunks
        chunk = chunks[0]
        head = self.head
        available = len(chunk) - head
        if head == 0 and available <= max_bytes:
            chunks.popleft()
            taken = chunk if isinstance(chunk, bytes) else bytes(chunk)
        elif available <= max_bytes:
            chunks.popleft()
            self.head = 0
            taken = bytes(memoryview(chunk)[head:])
        else:
            taken = bytes(memoryview(chunk)[head : head + max_bytes])
            self.head = head + max_bytes
        self.rlen -= len(taken)
        if not self.posted and not self.ahead_due:  # (queued already: nothing to do)
            self._read_ahead()
        return taken

    def take_buffered(self, count: int) -> bytes:
        """Remove and return exactly ``count`` buffered bytes (``count <= buffered``)."""
        if count <= 0:
            return b""
        first = self.take(count)
        missing = count - len(first)
        if not missing:
            return first  # one chunk held it all (the common case)
        parts = [first]
        while missing:
            part = self.take(missing)
            parts.append(part)
            missing -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def raise_receive_error(self) -> None:
        """Raise what ended the receive side unless it was a clean FIN (or it is open)."""
        if self.read_closed:
            raise StreamClosedError("the stream is closed")
        if self.rstate != _RX_OPEN:
            error = self._receive_error()
            if error is not None:
                raise error

    def take_all(self) -> bytes:
        """Remove and return every buffered byte."""
        parts = [self.take(self.rlen)]
        while self.rlen:
            parts.append(self.take(self.rlen))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def find(self, separator: bytes, start: int) -> int:
        """Index of ``separator`` in the buffered bytes from ``start``, or -1 (no copy when
        one chunk is buffered)."""
        if len(self.chunks) > 1:
            joined = b"".join(
                [bytes(memoryview(self.chunks[0])[self.head :]), *list(self.chunks)[1:]]
            )
            self.chunks.clear()
            self.chunks.append(joined)
            self.head = 0
        if not self.chunks:
            return -1
        found = self.chunks[0].find(separator, self.head + start)
        return -1 if found < 0 else found - self.head

    def _receive_error(self) -> QuicTransportError | None:
        """The error that reading at the end of the buffer raises (None: plain EOF)."""
        state = self.rstate
        if state == _RX_FIN:
            return None
        if state == _RX_RESET:
            return StreamResetError(self.reset_code)
        if state == _RX_STOPPED:
            return StreamClosedError("reading was stopped on this stream")
        return self.conn.lost_error()

    async def read_some(self, max_bytes: int) -> bytes:
        """Wait for data; return up to ``max_bytes`` bytes, or ``b""`` at a clean EOF.

        Raises ``StreamResetError`` (peer reset), ``ConnectionLostError`` (the connection
        closed first) or ``StreamClosedError`` (this side closed the stream).
        """
        while True:
            if self.read_closed:
                raise StreamClosedError("the stream is closed")
            if self.rlen:
                return self.take(max_bytes)
            state = self.rstate
            if state != _RX_OPEN and state != _RX_CLOSING:
                error = self._receive_error()
                if error is None:
                    return b""
                raise error
            blocked = self.post_receive()
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
                continue
            event = self.rwait
            if event is None:
                event = self.rwait = self.core.runtime.event()
            await event.wait()

    async def read_exactly(self, count: int) -> bytes:
        """Read exactly ``count`` bytes; ``IncompleteReadError`` at an earlier clean EOF."""
        if count <= 0:
            return b""
        # Wait here for the first bytes (one coroutine less than through read_some).
        if (
            self.rlen < count
            and self.rstate == _RX_OPEN
            and not self.read_closed
            and (self.posted or self.post_receive() is None)  # read-ahead usually posted it
            and self.rstate == _RX_OPEN
            and not self.rlen
        ):
            event = self.rwait
            if event is None:
                event = self.rwait = self.core.runtime.event()
            await event.wait()
        if self.rlen >= count and not self.read_closed:
            chunks = self.chunks
            chunk = chunks[0]
            if len(chunk) == count and not self.head:
                # One chunk is exactly the answer (a request/response exchange): ``take``
                # inline, two calls less on the path from the woken reader to its reply.
                chunks.popleft()
                self.rlen -= count
                if not self.posted and not self.ahead_due:
                    self._read_ahead()
                return chunk if isinstance(chunk, bytes) else bytes(chunk)
            return self.take_buffered(count)
        parts: list[bytes] = []
        missing = count
        while missing:
            chunk = await self.read_some(missing)
            if not chunk:
                raise IncompleteReadError(b"".join(parts), count)
            parts.append(chunk)
            missing -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_until_eof(self, limit: int) -> bytes:
        """Read until a clean EOF (at most ``limit`` bytes, else ``ReadLimitError``)."""
        parts: list[bytes] = []
        total = 0
        while True:
            chunk = await self.read_some(self.core.options.read_ahead)
            if not chunk:
                return b"".join(parts)
            total += len(chunk)
            if total > limit:
                raise ReadLimitError(f"more than {limit} bytes before EOF")
            parts.append(chunk)

    async def wait_readable(self, buffered: int = 0) -> None:
        """Wait until more than ``buffered`` bytes are buffered or the receive side ended (no
        bytes consumed); ``StreamClosedError`` after a local close."""
        while self.rlen <= buffered and (self.rstate == _RX_OPEN or self.rstate == _RX_CLOSING):
            if self.read_closed:
                raise StreamClosedError("the stream is closed")
            blocked = self.post_receive()
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
                continue
            await self._wait_read()

    def _terminate_receive(self, state: int) -> None:
        if self.rstate == _RX_OPEN:
            self.rstate = state
        self._wake_readers()

    def on_receive(self, completion: ReceiveCompletion) -> None:
        core = self.core
        if self.posted:
            self.posted = False
            core.posted_receives -= 1
        self.cancellation = None
        status = completion.status
        buffer = completion.buffer
        if len(buffer) and self.rstate == _RX_OPEN and not self.read_closed:
            self.chunks.append(buffer)
            self.rlen += len(buffer)
        if status is ReceiveStatus.DATA:
            # The common completion (bytes for a reader): ``_read_ahead`` and
            # ``_wake_readers`` inline, two calls less on the path to the woken reader.
            if self.rwait is not None or self.rlen < core.options.read_ahead:
                due = core.read_ahead_due
                if due is None:
                    self._maybe_read_ahead()
                elif not self.ahead_due:
                    self.ahead_due = True
                    due.append(self)
            event = self.rwait
            if event is not None:
                self.rwait = None
                event.set()
            return
        if status is ReceiveStatus.FIN:
            self._terminate_receive(_RX_FIN)
        elif status is ReceiveStatus.RESET:
            self.reset_code = completion.error_code or 0
            self._terminate_receive(_RX_RESET)
        elif status is ReceiveStatus.STOPPED:
            self._terminate_receive(_RX_STOPPED)
        elif status is ReceiveStatus.CLOSED:
            # Final only when nothing will tell us more (see ``_RX_CLOSING``).
            final = self.reclaimed or self.conn.state >= _FAILED or self.core.stopped
            self._terminate_receive(_RX_LOST if final else _RX_CLOSING)
        self._wake_readers()

    # -- sending ------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Raise if nothing more may be written."""
        if self.write_closed:
            raise StreamClosedError("the stream's writing half is closed")
        if self.werror is not None:
            raise self.werror

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` (copied unless it is ``bytes``) and submit what the bounds allow."""
        if self.write_closed or self.werror is not None:
            self.check_writable()  # raises
        if type(data) is bytes and not self.pending:
            # The common case (nothing waits before it, so order is kept): submit the
            # caller's immutable bytes at once, without the pending queue. Whatever the
            # bounds refuse takes the general path below, which queues it and retries.
            core = self.core
            size = len(data)
            if 0 < size <= core.max_send_piece and (
                self.in_flight + size <= core.options.write_high_water
            ):
                hook = core.write_through if size <= _WRITE_THROUGH_MAX else None
                if hook is not None:
                    # A small write: the inline driver may admit it and send it at once
                    # (True), possibly through its send lane, without the submission queue.
                    # Counted first, as the queued path counts it before flushing.
                    self.in_flight += size
                    if hook(self.ref, data):
                        return
                    self.in_flight -= size
                try:
                    core.submitter.send_nowait(self.ref, data)
                except (WouldBlock, SubmissionClosed, ExceedsBudget):
                    pass
                else:
                    self.in_flight += size
                    return
        size = len(data) if not isinstance(data, memoryview) else data.nbytes
        if not size:
            return
        if self.pending_len + size > self.core.options.write_buffer_limit:
            raise WriteBufferFullError(
                f"write buffer limit of {self.core.options.write_buffer_limit} bytes reached: "
                "await drain()"
            )
        pending = self.pending
        if isinstance(data, bytes) and size >= _DIRECT_SEND:
            pending.append(data)
        elif pending and isinstance(last := pending[-1], bytearray) and len(last) < _DIRECT_SEND:
            last += data
        else:
            pending.append(bytearray(data))
        self.pending_len += size
        self.flush()

    def flush(self) -> WouldBlock[Any] | None:
        """Admit pending bytes (then a requested FIN) and a requested STOP_SENDING while the
        bounds allow.

        Returns the ``WouldBlock`` that stopped it, or None. A refused stream is remembered
        and retried after the next batch of completions.
        """
        blocked = None
        if self.stop_code is not None and self.rstate == _RX_OPEN:
            blocked = self._submit_stop()
        if self.werror is None and (self.pending or self.eof == _EOF_WANTED):
            blocked = self._flush_writes() or blocked
        if blocked is not None:
            self.core.mark_blocked(self)
        return blocked

    def _submit_stop(self) -> WouldBlock[Any] | None:
        cancellation = self.cancellation
        if cancellation is not None:
            # A posted receive would hold the stop back until data arrives: cancel it.
            self.cancellation = None
            cancellation.cancel()
        code = self.stop_code
        assert code is not None
        try:
            self.core.submitter.stop_nowait(self.ref, code)
        except WouldBlock as exc:
            return exc
        except SubmissionClosed:
            pass
        self.rstate = _RX_STOPPED
        self._wake_readers()
        return None

    def _flush_writes(self) -> WouldBlock[Any] | None:
        core = self.core
        submitter = core.submitter
        high = core.options.write_high_water
        limit = core.max_send_piece
        pending = self.pending
        while pending:
            chunk = pending[0]
            length = len(chunk)
            size = min(length, limit)
            room = high - self.in_flight
            if room < size:
                # A partial piece only when a useful amount fits (no trickle of tiny sends).
                if room < min(size, max(high // 4, 1)):
                    break
                size = room
            piece: bytes | bytearray | memoryview = (
                chunk if size == length else memoryview(chunk)[:size]
            )
            try:
                submitter.send_nowait(self.ref, piece)
            except WouldBlock as exc:
                return exc
            except (SubmissionClosed, ExceedsBudget):
                self._fail_write(EndpointClosedError("the endpoint no longer admits work"))
                return None
            if size == length:
                pending.popleft()
            else:
                pending[0] = memoryview(chunk)[size:]
            self.pending_len -= size
            self.in_flight += size
        if self.eof == _EOF_WANTED and not pending:
            try:
                submitter.finish_nowait(self.ref)
            except WouldBlock as exc:
                return exc
            except SubmissionClosed:
                pass
            self.eof = _EOF_SENT
        if not pending:
            self._wake_writers()
        return None

    def _fail_write(self, error: QuicTransportError) -> None:
        if self.werror is None:
            self.werror = error
        self.pending.clear()
        self.pending_len = 0
        self._wake_writers()

    async def drain(self) -> None:
        """Wait until every written byte was admitted (at most ``write_high_water``
        unacknowledged bytes stay in flight); raise the stream's write error, if any."""
        while True:
            if self.werror is not None:
                raise self.werror
            blocked = self.flush()
            if self.werror is not None:
                raise self.werror
            if not self.pending:
                return
            if self.closed:
                raise StreamClosedError("the stream was closed with bytes still pending")
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
            else:
                await self._wait_write()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` and wait until it is admitted (see ``drain``)."""
        self.write(data)
        if self.pending or self.werror is not None:
            await self.drain()

    def writable_now(self) -> bool:
        """True when a write would be admitted without waiting."""
        return (
            self.werror is not None
            or self.write_closed
            or (not self.pending and self.in_flight < self.core.options.write_high_water)
        )

    async def wait_writable(self) -> None:
        """Wait until a write might be admitted without waiting (or the stream broke)."""
        while not self.writable_now():
            blocked = self.flush()
            if self.writable_now():
                return
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
            else:
                await self._wait_write()

    def write_eof(self) -> None:
        """Close the writing half: FIN after every pending byte (idempotent)."""
        if self.write_closed:
            return
        self.write_closed = True
        if self.werror is None:
            self.eof = _EOF_WANTED
            self.flush()
        self._wake_writers()

    def close(self, stop_code: int = 0) -> None:
        """Close both halves: FIN after the pending bytes, and STOP_SENDING with
        ``stop_code`` unless the peer already finished (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.read_closed = True
        self.chunks.clear()
        self.rlen = 0
        self.head = 0
        if self.rstate == _RX_OPEN:
            self.stop_code = stop_code
        self.write_eof()
        self.flush()
        self._wake_readers()
        self._wake_writers()

    def abort(self, error_code: int = 0) -> None:
        """Reset the writing half and stop the reading half with ``error_code``; pending
        bytes are dropped (idempotent)."""
        if self.aborted:
            return
        self.aborted = True
        self.closed = True
        self.read_closed = True
        self.write_closed = True
        self.chunks.clear()
        self.rlen = 0
        self.head = 0
        self.pending.clear()
        self.pending_len = 0
        if self.eof != _EOF_SENT:
            self.eof = _EOF_SENT
            self.core.stream_op_nowait(self, "reset", error_code)
        if self.rstate == _RX_OPEN:
            self.stop_code = error_code
            self.flush()
        self._fail_write(StreamClosedError("the stream was aborted"))
        self._wake_readers()

    async def wait_closed(self) -> None:
        """Wait until the stream's state is reclaimed (every byte acknowledged, both halves
        ended) or its connection closed."""
        while not self.reclaimed and self.conn.state < _FAILED:
            blocked = self.flush()
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
                continue
            event = self.wwait
            if event is None:
                event = self.wwait = self.core.runtime.event()
            await event.wait()

    def on_send(self, completion: SendCompletion) -> None:
        self.in_flight -= completion.nbytes
        outcome = completion.outcome
        if outcome is not SendOutcome.ACKNOWLEDGED and self.werror is None:
            conn = self.conn
            if conn.state >= _FAILED:
                self._fail_write(conn.broken_error())
            else:
                gone = self.core.connection_gone
                if gone is not None and gone(conn.ref):
                    # The connection is going: the completion model delivers its sends'
                    # completions before its ``ConnectionClosed`` (with the thread driver, or
                    # staged event credits, the second may not even be queued yet). Fail the
                    # writer with the connection's error when that arrives
                    # (``on_connection_lost``), not with this send's.
                    self._wake_writers()
                    return
                self._fail_write(StreamBrokenError(f"the send was {outcome.value}"))
        if self.pending or self.eof == _EOF_WANTED:
            self.flush()
        self._wake_writers()

    def on_control(self, outcome: ControlOutcome) -> None:
        if outcome is not ControlOutcome.COMPLETE and self.werror is None and self.eof:
            self.werror = StreamBrokenError(f"finishing the stream was {outcome.value}")
        self._wake_writers()

    def on_closed(self, completion: StreamClosed) -> None:
        self.reclaimed = True
        state = self.rstate
        if state == _RX_OPEN and completion.peer_reset_code is not None:
            # The peer reset the stream while no receive of ours was posted (its bytes and
            # the reset arrived in one step, after the receive before them completed): the
            # reset reaches the reader through this event instead of a receive.
            self.reset_code = completion.peer_reset_code
            self.rstate = _RX_RESET
        elif state in (_RX_OPEN, _RX_CLOSING):
            # OPEN otherwise means the endpoint ended the receive half without telling a
            # receive; CLOSING: the stream is gone before its connection (no codes to wait
            # for).
            self.rstate = _RX_LOST
        if self.werror is None and (self.pending or self.eof != _EOF_SENT):
            # The endpoint ended the send half without our FIN: the peer stopped reading.
            self._fail_write(StreamBrokenError("the peer stopped the stream"))
        self._wake_readers()
        self._wake_writers()

    @property
    def settled(self) -> bool:
        """Reclaimed, with no operation of ours left to complete."""
        return self.reclaimed and not self.in_flight and not self.posted

    def on_connection_lost(self) -> None:
        if self.rstate == _RX_OPEN or self.rstate == _RX_CLOSING:
            self.rstate = _RX_LOST
        if self.werror is None and (self.pending or self.in_flight or not self.write_closed):
            self._fail_write(self.conn.broken_error())
        if self.posted:
            self.posted = False
            self.core.posted_receives -= 1
        self.cancellation = None
        self._wake_readers()
        self._wake_writers()


_ONE_BYTE: Final = ReceiveOptions(1)
