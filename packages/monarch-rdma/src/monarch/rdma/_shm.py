"""The ``shm`` provider: one-sided transfers between processes of one host through shared memory.

Theory of operation. A registration is *shared*, never copied per transfer: the owner's memory
must already lie in a shared file mapping that another process can map too (a memfd or a file
of ``/dev/shm``; ``_shm_proto.locate`` decides from ``/proc/self/maps``). ``RDMABuffer`` moves a
CPU torch tensor there at registration (``Tensor.share_memory_()``: one copy, once, and the
owner's tensor then *is* the shared memory, so the owner sees every write), and
``shared_memory(n)`` allocates such memory for memoryviews. Memory in private pages (a
``bytearray``, ``bytes``) is declined (``RegistrationDeclined``): the ``net`` provider serves it,
so the owner's object stays the one memory every transfer reads and writes. A copy-in
registration would break that (writes would land in a copy the owner never sees), so there is
none.

The owner keeps a duplicate of the mapping's descriptor and a *control page*: a small memfd of
``MAX_REGIONS`` 64-bit slots, one per live registration, holding the registration's number
while it is registered and 0 once dropped. A process that transfers asks the owner's process
once per buffer for both descriptors: it connects to the owner's abstract Unix socket (named in
the key; nothing in the file system), proves it holds the handle (a 128-bit secret carried in
the key, which travels only inside authenticated actor messages) and must run as the same user
(``SO_PEERCRED``); a thread of the owner's process (not an actor: the owner's actors take no
part) answers with the descriptors over ``SCM_RIGHTS``. The transferring process maps them,
caches the mapping per buffer (at most ``MAX_MAPPINGS``; least recently used unmapped first)
and opens a pidfd of the owner (its pid taken from the socket's credentials).

A transfer is then a memcpy into or out of the mapping, with no message at all: before and after
the copy the transferring process checks the control slot (dropped: ``RuntimeError`` "dropped")
and the pidfd (exited: ``RuntimeError`` "exited"), so a drop or the owner's death is an error
and never a silent success (a copy done at the call, ``transfer_now``, checks the slot before
it and both after it: the mapping of an exited owner keeps its pages, so copying through it
harms nothing, and the transfer fails all the same). Smaller copies slice a view of the
buffer's bytes made once per mapping (``_Mapped.window``; the slice keeps the mapping mapped)
and run in the caller's thread. Copies of at least ``THREAD_COPY`` bytes run in a worker thread
(``ctypes.memmove`` releases the GIL), so the caller's event loop stays responsive and the
operations of an ``RDMAAction`` overlap. Such a copy runs in ``COPY_CHUNK`` pieces: a transfer
cancelled meanwhile (its timeout passed) stops the copy at the end of the current piece and
waits for it, so once the caller sees the error nothing more is written into either memory.

Only Linux has memfds, pidfds and abstract sockets; ``available()`` says whether they exist here.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import ctypes
import logging
import mmap
import os
import secrets
import select
import socket
import stat
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Final

from monarch.rdma._memory import address_of
from monarch.rdma._provider import (
    ProviderSpec,
    RDMAProvider,
    Reach,
    RegistrationDeclined,
    RemoteKey,
)
from monarch.rdma._shm_proto import Shared, locate, parse_maps

__all__ = [
    "MAX_MAPPINGS",
    "MAX_REGIONS",
    "NAME",
    "SPEC",
    "ShmDetail",
    "ShmProvider",
    "available",
    "shared_memory",
]

_log = logging.getLogger("monarch.rdma.shm")

NAME: Final = "shm"
#: Live registrations per owner process (slots of its control page).
MAX_REGIONS: Final = 4096
#: Mappings of other processes' buffers a process keeps (least recently used unmapped first).
MAX_MAPPINGS: Final = 1024
#: Owner processes a process keeps a control page and pidfd of.
MAX_OWNERS: Final = 256
#: Copies of at least this many bytes run in a worker thread (GIL released).
THREAD_COPY: Final = 4 << 20
#: A threaded copy runs in pieces of this many bytes and stops between two of them once its
#: transfer was cancelled (a timeout): nothing is written after the caller's error.
COPY_CHUNK: Final = 16 << 20
#: Seconds the descriptor exchange with an owner's process may take.
FETCH_TIMEOUT: Final = 10.0
_SLOT: Final = struct.Struct("<Q")
_REQUEST: Final = 17  # a command byte and the 16-byte secret
_REPLY_MAX: Final = 512


def available() -> bool:
    """Whether this process can use the provider (Linux: memfds, pidfds, abstract sockets)."""
    return (
        sys.platform == "linux"
        and hasattr(os, "memfd_create")
        and hasattr(os, "pidfd_open")
        and hasattr(socket, "SO_PEERCRED")
    )


@dataclass(frozen=True, slots=True)
class ShmDetail:
    """The ``shm`` part of a ``RemoteKey``: the owner's socket name (abstract, without the
    leading NUL) and pid, the registration's control ``slot``, the ``secret`` that authorises
    fetching its descriptors, the region's ``offset`` in the shared file and ``readonly``."""

    socket: str
    pid: int
    slot: int
    secret: bytes
    offset: int
    readonly: bool


# -- shared memory for memoryviews --------------------------------------------------------------


class _Mapping(mmap.mmap):
    """An mmap that closes its memfd when it is collected (``shared_memory``)."""

    _fd: int = -1

    def __del__(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def shared_memory(nbytes: int) -> memoryview:
    """A writable, zeroed ``memoryview`` of ``nbytes`` bytes in a fresh memfd: memory the
    ``shm`` provider shares without a copy (wrap it in a tensor with ``torch.frombuffer``).
    The memory lives as long as the view (or anything made from it)."""
    if nbytes < 1:
        raise ValueError(f"shared_memory needs at least one byte, not {nbytes}")
    fd = os.memfd_create("monarch-rdma", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        mapping = _Mapping(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    mapping._fd = fd  # kept open: registration finds the mapping's file through it
    return memoryview(mapping)


# -- the owner's side ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Owned:
    fd: int
    number: int
    slot: int
    size: int


class _OwnerState:
    """This process's registrations, control page and descriptor server (lock held)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.regions: dict[bytes, _Owned] = {}  # by secret
        self.free_slots: list[int] = []
        self.next_slot = 0
        self.control_fd = -1
        self.control: mmap.mmap | None = None
        self.listener: socket.socket | None = None
        self.name = ""
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Create the control page and start the server (once)."""
        if self.listener is not None:
            return
        fd = os.memfd_create("monarch-rdma-control", os.MFD_CLOEXEC)
        os.ftruncate(fd, MAX_REGIONS * _SLOT.size)
        self.control_fd = fd
        self.control = mmap.mmap(fd, MAX_REGIONS * _SLOT.size)
        name = f"monarch-rdma-shm-{os.getpid()}-{secrets.token_hex(8)}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind("\0" + name)
        listener.listen(64)
        self.listener, self.name = listener, name
        thread = threading.Thread(
            target=_serve, args=(self, listener), name="monarch-rdma-shm", daemon=True
        )
        self.thread = thread
        thread.start()

    def take_slot(self) -> int | None:
        if self.free_slots:
            return self.free_slots.pop()
        if self.next_slot >= MAX_REGIONS:
            return None
        self.next_slot += 1
        return self.next_slot - 1

    def release(self, secret: bytes) -> None:
        with self.lock:
            owned = self.regions.pop(secret, None)
            if owned is None:
                return
            if self.control is not None:
                _SLOT.pack_into(self.control, owned.slot * _SLOT.size, 0)
            self.free_slots.append(owned.slot)
        with contextlib.suppress(OSError):
            os.close(owned.fd)


_owner = _OwnerState()


def _serve(state: _OwnerState, listener: socket.socket) -> None:
    """The descriptor server: one short exchange per connection (module docstring)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed (fork, shutdown)
        with conn:
            try:
                conn.settimeout(FETCH_TIMEOUT)
                _answer(state, conn)
            except OSError as exc:
                _log.debug("an shm descriptor request failed: %s", exc)


def _answer(state: _OwnerState, conn: socket.socket) -> None:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    request = b""
    while len(request) < _REQUEST:
        part = conn.recv(_REQUEST - len(request))
        if not part:
            return
        request += part
    command, secret = request[:1], request[1:]
    if uid != os.getuid():
        _log.warning("refused an shm request from pid %d of another user (uid %d)", pid, uid)
        conn.sendall(b"NOthe requesting process runs as another user")
        return
    if command == b"D":
        state.release(secret)
        conn.sendall(b"OK")
        return
    with state.lock:
        owned = state.regions.get(secret)
        fds = [owned.fd, state.control_fd] if owned is not None and command == b"F" else None
        if fds is not None:
            fds = [os.dup(fd) for fd in fds]  # the region may be dropped while we send
    if fds is None:
        conn.sendall(b"NOthe buffer is not registered (dropped), or the request is malformed")
        return
    try:
        socket.send_fds(conn, [b"OK"], fds)
    finally:
        for fd in fds:
            os.close(fd)


def _fd_of(shared: Shared) -> int | None:
    """A new descriptor of the file ``shared`` lies in, found among this process's open
    descriptors (a memfd or ``/dev/shm`` file is reopened through its descriptor, not its
    name), or ``None``."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            fd = int(name)
            if os.readlink(f"/proc/self/fd/{fd}") != shared.path:
                continue
            info = os.fstat(fd)
        except (OSError, ValueError):
            continue
        if info.st_ino == shared.inode and stat.S_ISREG(info.st_mode):
            return os.dup(fd)
    return None


# -- the transferring side ----------------------------------------------------------------------


@dataclass(slots=True)
class _Peer:
    pid: int
    pidfd: int
    control: mmap.mmap


@dataclass(slots=True)
class _Mapped:
    mapping: mmap.mmap
    delta: int  # where the buffer starts in the mapping
    peer: _Peer
    #: the buffer's bytes in ``mapping``: a view made once (an export, which keeps the mapping
    #: mapped while any slice of it is alive), sliced by the copies done in the caller's thread
    window: memoryview


def _exited(peer: _Peer) -> bool:
    readable, _, _ = select.select([peer.pidfd], [], [], 0)
    return bool(readable)


class ShmProvider:
    """The ``shm`` provider (module docstring). Implements ``RDMAProvider``."""

    name = NAME

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapped: collections.OrderedDict[tuple[str, int], _Mapped] = collections.OrderedDict()
        self._peers: collections.OrderedDict[str, _Peer] = collections.OrderedDict()
        os.register_at_fork(after_in_child=self._forget_after_fork)

    # -- owner
    def register(self, memory: memoryview, *, owner: str) -> RemoteKey:
        size = memory.nbytes
        if size == 0:
            raise RegistrationDeclined("an empty region")
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            where = locate(parse_maps(maps.read()), address_of(memory), size)
        if not isinstance(where, Shared):
            raise RegistrationDeclined(f"{where.reason}: not in shared memory")
        fd = _fd_of(where)
        if fd is None:
            raise RegistrationDeclined(f"no open descriptor of {where.path}")
        with _owner.lock:
            _owner.start()
            slot = _owner.take_slot()
            if slot is None:
                os.close(fd)
                raise RegistrationDeclined(f"{MAX_REGIONS} shm registrations are live already")
            secret = secrets.token_bytes(16)
            number = secrets.randbits(63) | 1
            _owner.regions[secret] = _Owned(fd, number, slot, size)
            assert _owner.control is not None
            _SLOT.pack_into(_owner.control, slot * _SLOT.size, number)
            name = _owner.name
        detail = ShmDetail(name, os.getpid(), slot, secret, where.offset, memory.readonly)
        return RemoteKey(NAME, number, size, detail)

    async def deregister(self, key: RemoteKey) -> None:
        detail: ShmDetail = key.detail
        self._forget(key)
        if detail.pid == os.getpid() and detail.socket == _owner.name:
            _owner.release(detail.secret)
            return
        try:
            await asyncio.get_running_loop().run_in_executor(_copier(), _request, detail, b"D")
        except OSError as exc:
            raise _failed("drop", key, f"the owner's process is unreachable ({exc})") from exc

    # -- transfers
    def transfer_now(self, kind: str, key: RemoteKey, offset: int, local: memoryview) -> bool:
        """The transfer done here and now when it is cheap: this process holds the owner's
        memory mapped already and the copy is below ``THREAD_COPY`` (``read``/``write`` copy
        those inline too). False when not (the caller awaits ``read``/``write``); raises as
        they would. Before the copy only the drop is checked (a copy out of, or into, the
        mapping of an owner that has exited touches nothing of anyone's: the mapping keeps
        its pages); after it, the drop and the owner's exit, so neither is a silent success."""
        n = local.nbytes
        if n >= THREAD_COPY:
            return False
        detail: ShmDetail = key.detail
        to_remote = kind == "write"
        if to_remote and detail.readonly:
            raise _failed("write", key, "the buffer is read-only memory: it cannot be written")
        ident = (detail.socket, key.region)
        with self._lock:
            mapped = self._mapped.get(ident)
            if mapped is None:
                return False
            self._mapped.move_to_end(ident)
        slot = detail.slot * _SLOT.size
        if _SLOT.unpack_from(mapped.peer.control, slot)[0] != key.region:
            self._forget(key)
            raise _failed(kind, key, "the buffer was dropped: it is not registered any more")
        _check_range(key, offset, n)
        if n:
            self._copy_inline(key, mapped, offset, local, to_remote=to_remote)
        self._check(key, mapped, kind)
        return True

    async def read(self, key: RemoteKey, offset: int, dst: memoryview) -> None:
        mapped = await self._mapping(key)
        self._check(key, mapped, "read")
        _check_range(key, offset, dst.nbytes)
        await self._copy(key, mapped, offset, dst, to_remote=False)
        self._check(key, mapped, "read")

    async def write(self, key: RemoteKey, offset: int, src: memoryview) -> None:
        detail: ShmDetail = key.detail
        if detail.readonly:
            raise _failed("write", key, "the buffer is read-only memory: it cannot be written")
        mapped = await self._mapping(key)
        self._check(key, mapped, "write")
        _check_range(key, offset, src.nbytes)
        await self._copy(key, mapped, offset, src, to_remote=True)
        self._check(key, mapped, "write")

    def _check(self, key: RemoteKey, mapped: _Mapped, what: str) -> None:
        detail: ShmDetail = key.detail
        if _SLOT.unpack_from(mapped.peer.control, detail.slot * _SLOT.size)[0] != key.region:
            self._forget(key)
            raise _failed(what, key, "the buffer was dropped: it is not registered any more")
        if _exited(mapped.peer):
            self._forget(key)
            raise _failed(what, key, f"the owner's process {mapped.peer.pid} exited")

    async def _copy(
        self, key: RemoteKey, mapped: _Mapped, offset: int, local: memoryview, *, to_remote: bool
    ) -> None:
        """Copy between ``local`` and the mapping (``to_remote``: into it). The ctypes array
        over the mapping is an export that keeps it mapped until the copy is done, whatever
        drops or evictions happen meanwhile; large copies run in a worker thread."""
        n = local.nbytes
        if n == 0:
            return
        if n < THREAD_COPY:
            self._copy_inline(key, mapped, offset, local, to_remote=to_remote)
            return
        try:
            remote = (ctypes.c_char * n).from_buffer(mapped.mapping, mapped.delta + offset)
        except (ValueError, TypeError) as exc:  # unmapped meanwhile: dropped or evicted
            raise _failed("transfer", key, f"the buffer was dropped ({exc})") from exc
        here, there = address_of(local), ctypes.addressof(remote)
        target, source = (there, here) if to_remote else (here, there)
        stop = threading.Event()
        copy = _copier().submit(_copy_in_chunks, target, source, n, stop)
        try:
            await asyncio.wrap_future(copy)
        except asyncio.CancelledError:
            # A timeout (or the caller's cancellation): stop at the end of the current piece
            # and wait for it (one piece, milliseconds), so the memory is not written after
            # the caller learned the transfer failed.
            stop.set()
            if not copy.cancel():  # started: it ends at its next piece boundary
                concurrent.futures.wait([copy])
            raise
        finally:
            del remote

    @staticmethod
    def _copy_inline(
        key: RemoteKey, mapped: _Mapped, offset: int, local: memoryview, *, to_remote: bool
    ) -> None:
        """``_copy`` of fewer than ``THREAD_COPY`` bytes, in this thread, holding the GIL (a
        slice assignment: a memcpy): the slice of the window keeps the mapping mapped."""
        try:
            remote = mapped.window[offset : offset + local.nbytes]
        except ValueError as exc:  # released: dropped or evicted meanwhile
            raise _failed("transfer", key, f"the buffer was dropped ({exc})") from exc
        try:
            if to_remote:
                remote[:] = local
            else:
                local[:] = remote
        finally:
            remote.release()

    async def _mapping(self, key: RemoteKey) -> _Mapped:
        detail: ShmDetail = key.detail
        ident = (detail.socket, key.region)
        with self._lock:
            mapped = self._mapped.get(ident)
            if mapped is not None:
                self._mapped.move_to_end(ident)
                return mapped
        return await asyncio.get_running_loop().run_in_executor(_copier(), self._fetch, key)

    def _fetch(self, key: RemoteKey) -> _Mapped:
        """Fetch the descriptors and map them (a worker thread)."""
        detail: ShmDetail = key.detail
        try:
            pid, fds = _request(detail, b"F")
        except _Refused as exc:
            raise _failed("transfer", key, f"its owner's process refused: {exc}") from exc
        except OSError as exc:
            raise _failed(
                "transfer",
                key,
                f"the owner's process {detail.pid} is unreachable or exited ({exc})",
            ) from exc
        region_fd, control_fd = fds
        try:
            if pid != detail.pid:
                raise _failed("transfer", key, f"pid {pid} answered for process {detail.pid}")
            if not stat.S_ISREG(os.fstat(region_fd).st_mode):
                raise _failed("transfer", key, "the owner sent a descriptor that is no file")
            base = detail.offset - detail.offset % mmap.ALLOCATIONGRANULARITY
            delta = detail.offset - base
            if os.fstat(region_fd).st_size < detail.offset + key.size:
                raise _failed("transfer", key, "the owner's shared file is shorter than the buffer")
            mapping = mmap.mmap(region_fd, delta + key.size, offset=base)
            peer = self._peer(detail.socket, pid, control_fd)
        finally:
            os.close(region_fd)
            os.close(control_fd)
        mapped = _Mapped(mapping, delta, peer, memoryview(mapping)[delta : delta + key.size])
        with self._lock:
            self._mapped[(detail.socket, key.region)] = mapped
            while len(self._mapped) > MAX_MAPPINGS:
                _, old = self._mapped.popitem(last=False)
                _unmap(old)
        return mapped

    def _peer(self, name: str, pid: int, control_fd: int) -> _Peer:
        with self._lock:
            peer = self._peers.get(name)
            if peer is not None:
                self._peers.move_to_end(name)
                return peer
        pidfd = os.pidfd_open(pid)
        try:
            control = mmap.mmap(control_fd, MAX_REGIONS * _SLOT.size, prot=mmap.PROT_READ)
        except BaseException:
            os.close(pidfd)
            raise
        peer = _Peer(pid, pidfd, control)
        with self._lock:
            existing = self._peers.get(name)
            if existing is not None:
                os.close(pidfd)
                control.close()
                return existing
            self._peers[name] = peer
            while len(self._peers) > MAX_OWNERS:
                _, old = self._peers.popitem(last=False)
                with contextlib.suppress(OSError):
                    os.close(old.pidfd)  # mappings still using it fail their pid check: refetched
        return peer

    def _forget(self, key: RemoteKey) -> None:
        detail: ShmDetail = key.detail
        with self._lock:
            mapped = self._mapped.pop((detail.socket, key.region), None)
        if mapped is not None:
            _unmap(mapped)

    def _forget_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._mapped.clear()
        self._peers.clear()


def _unmap(mapped: _Mapped) -> None:
    mapped.window.release()  # slices of it taken by copies still running keep it mapped
    with contextlib.suppress(BufferError):  # a copy still running holds it: unmapped when done
        mapped.mapping.close()


_memmove = ctypes.memmove


def _copy_in_chunks(target: int, source: int, n: int, stop: threading.Event) -> None:
    """``n`` bytes from ``source`` to ``target`` in ``COPY_CHUNK`` pieces, stopping early once
    ``stop`` is set (a worker thread; each piece releases the GIL)."""
    done = 0
    chunk = COPY_CHUNK
    while done < n and not stop.is_set():
        step = min(chunk, n - done)
        _memmove(target + done, source + done, step)
        done += step


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
#: Worker threads for large copies and descriptor exchanges (process-wide, made on first use:
#: ``Future.get()`` runs each transfer on a loop of its own, whose default executor would start
#: new threads every time).
COPY_THREADS: Final = 4


def _copier() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(COPY_THREADS, "monarch-rdma-copy")
        return _pool


def _check_range(key: RemoteKey, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > key.size:
        raise _failed(
            "transfer", key, f"bytes [{offset}, {offset + length}) are outside its {key.size}"
        )


class _Refused(OSError):
    """The owner's process answered, and refused."""


def _request(detail: ShmDetail, command: bytes) -> tuple[int, list[int]]:
    """One exchange with the owner's descriptor server: its pid (from the socket's credentials)
    and the descriptors it sent. ``OSError`` when it is unreachable or refuses."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(FETCH_TIMEOUT)
        conn.connect("\0" + detail.socket)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        conn.sendall(command + detail.secret)
        data, fds, _flags, _addr = socket.recv_fds(conn, _REPLY_MAX, 2)
        if data[:2] != b"OK":
            for fd in fds:
                os.close(fd)
            reason = data[2:].decode("utf-8", "replace") or "the connection closed"
            raise _Refused(reason)
        if command == b"F" and len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise OSError(f"the owner's process sent {len(fds)} descriptors, not 2")
        return pid, list(fds)


def _failed(what: str, key: RemoteKey, reason: str) -> RuntimeError:
    return RuntimeError(f"RDMA {what} of region {key.region} ({NAME} provider) failed: {reason}")


def _forget_owner_after_fork() -> None:
    """A forked child has none of its parent's registrations and no server thread: it closes
    the inherited listener (so peers of a dead parent are refused, not left waiting) and the
    descriptors, and starts its own on its first registration."""
    global _owner, _pool, _pool_lock
    _pool = None  # its threads do not exist in the child
    _pool_lock = threading.Lock()  # a fork while another thread held it left it held
    old = _owner
    _owner = _OwnerState()
    if old.listener is not None:
        with contextlib.suppress(OSError):
            old.listener.close()
    for owned in old.regions.values():
        with contextlib.suppress(OSError):
            os.close(owned.fd)
    if old.control_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(old.control_fd)


os.register_at_fork(after_in_child=_forget_owner_after_fork)


def _create() -> RDMAProvider:
    return ShmProvider()


#: The ``shm`` provider's record, as ``monarch.rdma._plugin`` offers it.
SPEC: Final = ProviderSpec(NAME, "tcp", Reach.HOST, 10, available, _create)
