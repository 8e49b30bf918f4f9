"""The ``net`` provider's data lanes: one-sided transfers over sockets, served by threads.

Why: a chunk sent as an actor message is copied three or four times (into the message, the
lane's slot or TLS record, out of it, into the destination) and hops between the runtime loop
and the manager's actor thread on both sides. A data lane moves the bytes straight between the
two memories: the owner's server thread ``sendall``s a ``memoryview`` slice of the registered
memory and the reader ``recv_into``s the destination slice (a write goes the other way), so the
only copies are the kernel's (across hosts, also the encryption, and one copy of each verified
record out of its buffer), and no actor thread of the owner runs.

The owner (``LaneServer``, one per process, started with its first registration) listens on
an abstract Unix socket (within a host; the peer must run as the same user, ``SO_PEERCRED``) and
on a TCP port with TLS 1.3 (across hosts). Its TLS certificate is a fresh self-signed one made
at start; the key carries its SHA-256 fingerprint, and the connecting side checks it before it
sends anything (the key travels only inside authenticated actor messages, so this pins the
owner's process). TLS only opens the connection: the bytes then travel as ``_netseal``'s sealed
AES-256-GCM records of up to 256 KiB over the same TCP connection (Python's ``ssl`` moved one
16 KiB record per call), with keys exchanged inside TLS. A request names the region and carries
the registration's 128-bit secret, also from the key. Each connection is served by a thread of
its own (at most ``MAX_CONNECTIONS`` per process); the protocol is ``_netwire``'s.

The process that transfers (``LanePool``) keeps idle connections per owner endpoint (at most
``MAX_IDLE`` each, ``MAX_IDLE_TOTAL`` in all) and runs every chunk as blocking socket I/O in a
thread of a bounded pool (``recv_into``/``sendall`` release the GIL), so several chunks of one
transfer run at once on several connections. The pool has twice the threads one pipeline may
take (``MAX_IDLE``), so a large ``RDMAAction`` never leaves a transfer started meanwhile
waiting for the whole action: it gets threads of its own. A chunk cancelled (its transfer's
timeout passed) shuts its socket down, which ends the blocked call at once, and waits for the
thread before it lets the cancellation through: once the caller has its error, nothing more is
written into either memory. A connection refused, or one that ends mid-request, is the
owner's death: ``OwnerGone`` (a ``RuntimeError``); a refusal by a live owner (a dropped region)
is its message.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import datetime
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from monarch.rdma._netseal import (
    SealedStream,
    TruncatedRecord,
    client_handshake,
    server_handshake,
)
from monarch.rdma._netwire import (
    REPLY_SIZE,
    REQUEST_SIZE,
    Op,
    WireError,
    decode_reply,
    decode_request,
    encode_error,
    encode_ok,
    encode_request,
)

__all__ = [
    "IDLE_TIMEOUT",
    "IO_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_IDLE",
    "MAX_IDLE_TOTAL",
    "Endpoint",
    "LanePool",
    "LaneServer",
    "Lookup",
    "OwnerGone",
    "PIPELINE_BYTES",
    "PIPELINE_DEPTH",
    "LaneRequest",
    "Unreachable",
    "host_addresses",
]

_log = logging.getLogger("monarch.rdma.net")
T = TypeVar("T")
#: Connections one owner process serves at once (each a thread); more are closed at once.
MAX_CONNECTIONS: Final = 64
#: Idle connections a transferring process keeps per owner endpoint, and in all.
MAX_IDLE: Final = 16  # the connections one pipeline takes at most (half the pool's threads)
MAX_IDLE_TOTAL: Final = 256
#: Seconds a socket call may block without progress before the connection is given up (the
#: transfer's own timeout cancels sooner; this bounds a thread whose caller went away).
IO_TIMEOUT: Final = 120.0
CONNECT_TIMEOUT: Final = 5.0
#: Seconds an owner keeps a connection with no request (its thread then ends); a connecting
#: side whose kept connection was closed meanwhile retries once on a fresh one.
IDLE_TIMEOUT: Final = 120.0
_DRAIN: Final = 1 << 20
#: Requests a pipelined connection keeps in flight (``LanePool.pipeline``): bounded so that the
#: requests (45 bytes each; a write's payload is answered by 9 bytes) always fit in the peer's
#: socket buffer and neither side blocks the other ...
PIPELINE_DEPTH: Final = 64
#: ... and, beyond the oldest, at most this many bytes of them (two 1 MiB reads in flight per
#: connection: no round trip between them, and the rest left to whichever connection is free).
PIPELINE_BYTES: Final = 1 << 20
_SIOCGIFADDR: Final = 0x8915

#: ``lookup(region, secret)``: the registered memory, or an error message.
Lookup = Callable[[int, bytes], "memoryview | str"]


class _Stream(Protocol):
    """What the lanes' protocol needs of a connection: a socket (Unix lane) or a
    ``SealedStream`` (TLS lane)."""

    def settimeout(self, timeout: float | None, /) -> None: ...
    def sendall(self, data: bytes | bytearray | memoryview, /) -> None: ...
    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0, /) -> int: ...
    def close(self) -> None: ...


def _raw(stream: _Stream) -> socket.socket:
    """The socket under ``stream`` (what a cancellation shuts down)."""
    return stream.raw if isinstance(stream, SealedStream) else stream  # type: ignore[return-value]


class OwnerGone(RuntimeError):
    """The owner's process cannot be reached (it exited) or ended the connection."""


class Unreachable(OwnerGone):
    """No address of the owner's host answered on its TLS lane (not a refusal: a timeout, no
    route): another path (the message lane) may still reach it."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where an owner process's lane server listens: ``unix`` (abstract socket name, without
    the leading NUL), ``port`` and ``addresses`` (its host's IPv4 addresses, loopback left out)
    of the TLS listener, and ``fingerprint`` (SHA-256 of its certificate)."""

    unix: str
    port: int
    addresses: tuple[str, ...]
    fingerprint: bytes


def host_addresses() -> tuple[str, ...]:
    """This host's IPv4 interface addresses, loopback left out (``SIOCGIFADDR`` per interface)."""
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(
                    probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue  # no IPv4 address
            address = socket.inet_ntoa(raw[20:24])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    return tuple(found)


def _send_headed(sock: _Stream, head: bytes | bytearray, data: memoryview) -> None:
    """``head`` then ``data``; on the TLS lane the head's record leaves in the same system call
    as the data's first record."""
    if isinstance(sock, SealedStream):
        sock.send_headed(head, data)
    else:
        sock.sendall(head)
        sock.sendall(data)


def _recv_exact(sock: _Stream, n: int) -> bytes:
    data = bytearray(n)
    _recv_into_all(sock, memoryview(data))
    return bytes(data)


def _recv_into_all(sock: _Stream, view: memoryview) -> None:
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise OwnerGone("the connection ended mid-request")
        got += k


def _drain(sock: _Stream, n: int) -> None:
    scratch = memoryview(bytearray(min(n, _DRAIN)))
    while n > 0:
        k = sock.recv_into(scratch, min(n, scratch.nbytes))
        if k == 0:
            raise OwnerGone("the connection ended mid-request")
        n -= k


def _make_certificate() -> tuple[bytes, bytes]:
    """A fresh self-signed ECDSA P-256 certificate: ``(PEM of certificate and key, DER)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "monarch-rdma-net")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem, cert.public_bytes(serialization.Encoding.DER)


def _server_context(pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.num_tickets = 0  # nothing in TLS after the hellos: the sealed records follow
    fd = os.memfd_create("monarch-rdma-net-identity", os.MFD_CLOEXEC)
    try:  # never in the file system
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return context


class LaneServer:
    """One owner process's data-lane server (module docstring). ``lookup`` and ``drop`` reach
    the process's region table; ``tcp_host`` is the address the TLS listener binds."""

    def __init__(
        self, lookup: Lookup, drop: Callable[[int, bytes], None], tcp_host: str = "0.0.0.0",
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:  # fmt: skip
        self._lookup = lookup
        self._drop = drop
        self._idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._active = 0
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            name = f"monarch-rdma-net/{os.getpid()}/{secrets.token_hex(8)}"
            unix.bind("\0" + name)
            unix.listen(128)
            tcp.bind((tcp_host, 0))
            tcp.listen(128)
            pem, der = _make_certificate()
            self._tls = _server_context(pem)
        except BaseException:
            unix.close()
            tcp.close()
            raise
        self._unix, self._tcp = unix, tcp
        self.endpoint = Endpoint(
            name,
            tcp.getsockname()[1],
            host_addresses() if tcp_host in ("0.0.0.0", "") else (tcp_host,),
            hashlib.sha256(der).digest(),
        )
        for listener, tls in ((unix, False), (tcp, True)):
            threading.Thread(
                target=self._accept, args=(listener, tls), name="monarch-rdma-net-accept",
                daemon=True,
            ).start()  # fmt: skip

    def close(self) -> None:
        """Stop listening (connections being served finish their request)."""
        for listener in (self._unix, self._tcp):
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def _accept(self, listener: socket.socket, tls: bool) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = self._active >= MAX_CONNECTIONS
                if not full:
                    self._active += 1
            if full:
                _log.warning("RDMA net lane: %d connections already, one refused", MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn, tls), name="monarch-rdma-net-serve", daemon=True
            ).start()

    def _serve(self, raw: socket.socket, tls: bool) -> None:
        conn: _Stream = raw
        try:
            raw.settimeout(IO_TIMEOUT)
            if tls:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = server_handshake(raw, self._tls)
            else:
                creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                pid, uid, _gid = struct.unpack("3i", creds)
                if uid != os.getuid():
                    _log.warning("RDMA net lane: refused pid %d of another user (uid %d)", pid, uid)
                    return
            while self._one(conn):
                pass
        except TruncatedRecord as exc:  # the peer went away mid-record (a cancelled transfer)
            _log.debug("RDMA net lane connection ended: %r", exc)
        except WireError as exc:  # malformed or forged: a peer that is not a lane, or an attack
            _log.warning("RDMA net lane: a connection sent bad data and is closed: %s", exc)
        except (OSError, OwnerGone) as exc:
            _log.debug("RDMA net lane connection ended: %r", exc)
        finally:
            raw.close()
            with self._lock:
                self._active -= 1

    def _one(self, conn: _Stream) -> bool:
        """Serve one request; False when the peer closed the connection."""
        conn.settimeout(self._idle_timeout)  # between requests (a timeout ends the connection)
        head = bytearray(REQUEST_SIZE)
        first = conn.recv_into(head, REQUEST_SIZE)
        if first == 0:
            return False
        conn.settimeout(IO_TIMEOUT)
        if first < REQUEST_SIZE:
            _recv_into_all(conn, memoryview(head)[first:])
        request = decode_request(head)
        if request.op is Op.DROP:
            self._drop(request.region, request.secret)
            conn.sendall(encode_ok())
            return True
        found = self._lookup(request.region, request.secret)
        error = found if isinstance(found, str) else None
        if isinstance(found, memoryview):
            if request.offset + request.length > found.nbytes:
                error = (
                    f"RDMA region {request.region}: bytes [{request.offset}, "
                    f"{request.offset + request.length}) are outside its {found.nbytes} bytes"
                )
            elif request.op is Op.WRITE and found.readonly:
                error = f"RDMA region {request.region} is read-only memory: it cannot be written"
        if request.op is Op.READ:
            if error is not None:
                conn.sendall(encode_error(error))
                return True
            assert isinstance(found, memoryview)
            data = found[request.offset : request.offset + request.length]
            _send_headed(conn, encode_ok(request.length), data)
            return True
        if error is not None:
            _drain(conn, request.length)  # stay in step: the payload follows the header
            conn.sendall(encode_error(error))
            return True
        assert isinstance(found, memoryview)
        _recv_into_all(conn, found[request.offset : request.offset + request.length])
        conn.sendall(encode_ok())
        return True


@dataclass(frozen=True, slots=True)
class LaneRequest:
    """One request of a pipeline (``LanePool.pipeline``): ``op`` (``READ`` or ``WRITE``) of
    ``view.nbytes`` bytes at ``offset`` of ``region``, with the registration's ``secret``."""

    op: Op
    region: int
    secret: bytes
    offset: int
    view: memoryview


class _Conn:
    """One client connection; ``reused`` when it came from the pool (it may have gone stale)."""

    __slots__ = ("reused", "sock")

    def __init__(self, sock: _Stream, reused: bool = False) -> None:
        self.sock = sock
        self.reused = reused

    def close(self) -> None:
        self.sock.close()


class _Stale(Exception):
    """A kept connection failed before its reply began: the owner had closed it while idle."""


class _Job:
    """One chunk's I/O: ``cancel`` (from the caller's loop) shuts down the socket the thread
    uses, or will use, so a blocked call ends at once; ``release`` (the thread, done with the
    socket) takes it out of reach first, so a late cancel never touches a connection that went
    back to the pool."""

    __slots__ = ("cancelled", "lock", "sock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.sock: socket.socket | None = None

    def track(self, sock: socket.socket) -> None:
        with self.lock:
            self.sock = sock
            cancelled = self.cancelled
        if cancelled:
            _shutdown(sock)
            raise OwnerGone("cancelled")

    def cancel(self) -> None:
        with self.lock:  # under the lock: ``release`` cannot hand the socket on meanwhile
            self.cancelled = True
            if self.sock is not None:
                _shutdown(self.sock)

    def release(self) -> bool:
        """The thread is done with its socket; False when the job was cancelled."""
        with self.lock:
            self.sock = None
            return not self.cancelled


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError, ValueError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the fd's, even under an SSLSocket


def _io_failure(exc: BaseException, state: _Job, conn: _Conn, replied: bool) -> Exception:
    """What a connection's I/O failure means: the caller's cancellation, a kept connection the
    owner had closed while idle (``_Stale``: nothing answered yet, so it is retried on a fresh
    one), or the owner gone."""
    if state.cancelled:
        return OwnerGone("cancelled")
    if conn.reused and not replied and not isinstance(exc, WireError):
        return _Stale()
    return OwnerGone(f"the connection to the owner's process failed: {exc!r}")


async def _finish(job: asyncio.Future[T], state: _Job) -> T:
    """``job``'s result; when the caller is cancelled (its timeout), its socket is shut down
    and the thread waited for first: nothing touches the caller's memory once this returns."""
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        state.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait([job])  # nothing touches the memory once we return
        if job.done() and not job.cancelled():
            job.exception()  # seen: no "exception never retrieved" noise
        raise


class LanePool:
    """The connecting side (module docstring): idle connections per endpoint, chunk I/O in a
    bounded thread pool. ``tls`` makes even a same-host transfer go over TLS (to 127.0.0.1)."""

    def __init__(self, threads: int = 2 * MAX_IDLE) -> None:
        self._threads = threads
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._idle: dict[tuple[str, Endpoint], collections.deque[_Conn]] = {}
        self._lock = threading.Lock()
        self._client_tls: ssl.SSLContext | None = None
        self._reachable: dict[Endpoint, str] = {}
        self._idle_count = 0

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self._threads, "monarch-rdma-net"
                )
            return self._executor

    async def transfer(
        self, kind: str, endpoint: Endpoint, op: Op, region: int, secret: bytes,
        offset: int, view: memoryview,
    ) -> None:  # fmt: skip
        """One request (``op``) over a connection of ``kind`` (``"unix"``, ``"tls"``): a read
        fills ``view`` from the region at ``offset``, a write stores ``view`` there, a drop
        releases it (``view`` empty). ``RuntimeError`` with the owner's message when it
        refuses; ``OwnerGone`` when it cannot be reached."""
        loop = asyncio.get_running_loop()
        state = _Job()
        job = loop.run_in_executor(
            self._pool(), self._blocking, kind, endpoint, op, region, secret, offset, view, state
        )
        await _finish(job, state)

    async def pipeline(
        self, kind: str, endpoint: Endpoint, requests: list[LaneRequest], connections: int = 1
    ) -> list[str | OwnerGone | None]:
        """Several requests over up to ``connections`` connections of ``kind``, pipelined:
        each connection (a pool thread) takes the next request from one shared queue and keeps
        several in flight (its first ones sent at once; up to ``PIPELINE_DEPTH``, and at most
        ``PIPELINE_BYTES`` beyond the oldest), sending another as each reply is read, so no
        request waits a round trip and no connection waits for a slow one (the work goes to
        whichever is free). Each request's outcome in order: ``None``, the owner's refusal
        (its message; the connection stays in step) or the ``OwnerGone`` (``Unreachable``) of
        the connection that carried it (it may or may not have run: all are idempotent).

        ``connections`` is bounded by half the pool's threads, so other transfers find threads
        while a pipeline runs; once the queue is empty, the connections no thread has taken up
        yet are called off (their threads would find nothing to do), so a pipeline never waits
        for threads that other transfers hold."""
        if any(request.op not in (Op.READ, Op.WRITE) for request in requests):
            raise ValueError("a pipeline carries reads and writes only")
        outcomes: list[str | OwnerGone | None] = [None] * len(requests)
        if not requests:
            return outcomes
        queue = collections.deque(range(len(requests)))
        failures: list[OwnerGone] = []
        pool = self._pool()
        width = max(1, min(connections, len(requests), self._threads // 2))
        states = [_Job() for _ in range(width)]
        started = [
            pool.submit(
                self._drain_queue, kind, endpoint, requests, queue, outcomes, failures, state
            )
            for state in states
        ]
        jobs = [asyncio.wrap_future(future) for future in started]
        try:
            waiting: set[asyncio.Future[None]] = set(jobs)
            while waiting:
                _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if not queue:  # all taken: the connections not begun have nothing to carry
                    for future in started:
                        future.cancel()  # False (nothing done) for one a thread runs
        except asyncio.CancelledError:
            for future in started:
                future.cancel()
            for state in states:
                state.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait(jobs)  # nothing touches the memory once we return
            raise
        for job in jobs:
            if not job.cancelled() and (exc := job.exception()) is not None:
                raise exc
        for index in queue:  # every connection failed before these were sent
            outcomes[index] = failures[-1] if failures else OwnerGone("the requests were not sent")
        return outcomes

    def _drain_queue(
        self, kind: str, endpoint: Endpoint, requests: list[LaneRequest],
        queue: collections.deque[int], outcomes: list[str | OwnerGone | None],
        failures: list[OwnerGone], state: _Job,
    ) -> None:  # fmt: skip
        """One connection of ``pipeline``: requests from ``queue`` until it is empty. A kept
        connection the owner had closed while idle is replaced once (its requests queued
        again); a failure ends this connection and fails the requests it carried."""
        fresh = False
        while queue:
            try:
                conn = self._take(kind, endpoint, state, fresh=fresh)
            except OwnerGone as exc:
                failures.append(exc)
                return
            inflight: collections.deque[int] = collections.deque()
            ok = False  # kept only once served in step (any other exit closes it)
            try:
                self._serve_queue(conn, requests, queue, inflight, outcomes, state)
                ok = True
            except _Stale:
                queue.extendleft(reversed(inflight))  # sent again, on a fresh connection
                fresh = True
                continue
            except OwnerGone as exc:
                failures.append(exc)
                for index in inflight:
                    outcomes[index] = exc
                return
            finally:
                if state.release() and ok:
                    self._give_back(kind, endpoint, conn)
                else:
                    conn.close()

    @staticmethod
    def _serve_queue(
        conn: _Conn, requests: list[LaneRequest], queue: collections.deque[int],
        inflight: collections.deque[int], outcomes: list[str | OwnerGone | None], state: _Job,
    ) -> None:  # fmt: skip
        replied = False
        try:
            sock = conn.sock
            sock.settimeout(IO_TIMEOUT)
            pending = 0  # bytes of the requests in flight after the oldest
            while True:
                heads = bytearray()
                while len(inflight) < PIPELINE_DEPTH:
                    try:
                        index = queue.popleft()  # atomic: the other connections take too
                    except IndexError:
                        break
                    request = requests[index]
                    if inflight and pending + request.view.nbytes > PIPELINE_BYTES:
                        queue.appendleft(index)  # for the next free connection, or this one
                        break
                    if inflight:
                        pending += request.view.nbytes
                    inflight.append(index)
                    heads += encode_request(
                        request.op, request.region, request.offset, request.view.nbytes,
                        request.secret,
                    )  # fmt: skip
                    if request.op is Op.WRITE:
                        _send_headed(sock, heads, request.view)
                        heads.clear()
                if heads:
                    sock.sendall(heads)
                if not inflight:
                    return
                request = requests[inflight[0]]
                reply = decode_reply(_recv_exact(sock, REPLY_SIZE))
                replied = True
                if not reply.ok:
                    message = _recv_exact(sock, reply.length).decode("utf-8", "replace")
                    outcomes[inflight[0]] = message  # in step: the next reply follows
                elif request.op is Op.READ:
                    if reply.length != request.view.nbytes:
                        raise WireError(
                            f"asked for {request.view.nbytes} bytes, the owner sends {reply.length}"
                        )
                    _recv_into_all(sock, request.view)
                inflight.popleft()
                if inflight:
                    pending -= requests[inflight[0]].view.nbytes
        except (OSError, WireError, OwnerGone) as exc:
            raise _io_failure(exc, state, conn, replied) from exc

    def _blocking(
        self, kind: str, endpoint: Endpoint, op: Op, region: int, secret: bytes, offset: int,
        view: memoryview, state: _Job,
    ) -> None:  # fmt: skip
        conn = self._take(kind, endpoint, state)
        try:
            self._attempt(kind, endpoint, op, region, secret, offset, view, state, conn)
        except _Stale:  # all requests are idempotent: once more, on a fresh connection
            conn = self._take(kind, endpoint, state, fresh=True)
            self._attempt(kind, endpoint, op, region, secret, offset, view, state, conn)

    def _attempt(
        self, kind: str, endpoint: Endpoint, op: Op, region: int, secret: bytes, offset: int,
        view: memoryview, state: _Job, conn: _Conn,
    ) -> None:  # fmt: skip
        ok = replied = False
        try:
            sock = conn.sock
            sock.settimeout(IO_TIMEOUT)
            length = 0 if op is Op.DROP else view.nbytes
            head = encode_request(op, region, offset, length, secret)
            if op is Op.WRITE:
                _send_headed(sock, head, view)
            else:
                sock.sendall(head)
            reply = decode_reply(_recv_exact(sock, REPLY_SIZE))
            replied = True
            if not reply.ok:
                message = _recv_exact(sock, reply.length).decode("utf-8", "replace")
                ok = True  # in step: the connection is reused
                raise RuntimeError(message)
            if op is Op.READ:
                if reply.length != view.nbytes:
                    raise WireError(
                        f"asked for {view.nbytes} bytes, the owner sends {reply.length}"
                    )
                _recv_into_all(sock, view)
            ok = True
        except (OSError, WireError, OwnerGone) as exc:
            raise _io_failure(exc, state, conn, replied) from exc
        finally:
            if state.release() and ok:
                self._give_back(kind, endpoint, conn)
            else:
                conn.close()

    def _take(self, kind: str, endpoint: Endpoint, state: _Job, fresh: bool = False) -> _Conn:
        conn = None
        with self._lock:
            idle = None if fresh else self._idle.get((kind, endpoint))
            if idle:
                conn = idle.pop()
                conn.reused = True
                self._idle_count -= 1
                if not idle:
                    del self._idle[(kind, endpoint)]
        if conn is not None:
            try:
                state.track(_raw(conn.sock))
            except OwnerGone:
                conn.close()
                raise
            return conn
        try:
            return _Conn(self._connect(kind, endpoint, state))
        except OSError as exc:
            if kind == "tls" and not isinstance(
                exc, ConnectionRefusedError | ssl.SSLError | ssl.CertificateError
            ):
                raise Unreachable(
                    f"no address of the owner's host answers on its TLS lane: {exc!r}"
                ) from exc
            raise OwnerGone(
                f"cannot reach the owner's process ({kind} lane): {exc!r}; it has exited"
                if isinstance(exc, ConnectionRefusedError | FileNotFoundError)
                else f"cannot reach the owner's process ({kind} lane): {exc!r}"
            ) from exc

    def _give_back(self, kind: str, endpoint: Endpoint, conn: _Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault((kind, endpoint), collections.deque())
            if len(idle) < MAX_IDLE and self._idle_count < MAX_IDLE_TOTAL:
                idle.append(conn)
                self._idle_count += 1
                return
        conn.close()

    def _connect(self, kind: str, endpoint: Endpoint, state: _Job) -> _Stream:
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                state.track(sock)
                sock.settimeout(CONNECT_TIMEOUT)
                sock.connect("\0" + endpoint.unix)
            except BaseException:
                sock.close()
                raise
            return sock
        with self._lock:
            known = self._reachable.get(endpoint)
        candidates = [known] if known else list(endpoint.addresses)
        failure: OSError | None = None
        if not candidates:
            raise OSError(errno.ENETUNREACH, "the owner's host offers no IPv4 address")
        for address in candidates:
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                state.track(raw)
                raw.settimeout(CONNECT_TIMEOUT)
                raw.connect((address, endpoint.port))
            except OSError as exc:
                raw.close()
                failure = exc
                continue
            except BaseException:
                raw.close()
                raise
            try:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:  # pinned: nothing is sent unless the certificate is the key's
                    sealed = client_handshake(raw, self._tls_context(), endpoint.fingerprint)
                except WireError as exc:
                    raise ssl.SSLError(f"the owner's TLS lane is not a sealed lane: {exc}") from exc
            except BaseException:
                raw.close()
                raise
            with self._lock:
                if len(self._reachable) >= MAX_IDLE_TOTAL:
                    self._reachable.clear()  # a cache: bounded, refilled on use
                self._reachable[endpoint] = address
            return sealed
        assert failure is not None
        raise failure

    def _tls_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._client_tls is None:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.minimum_version = ssl.TLSVersion.TLSv1_3
                context.check_hostname = False  # pinned instead: the key's fingerprint
                context.verify_mode = ssl.CERT_NONE
                self._client_tls = context
            return self._client_tls

    def close_idle(self) -> None:
        """Close every idle connection (tests; a process exit closes them anyway)."""
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
            self._idle_count = 0
        for conn in conns:
            conn.close()
