"""The ``ibverbs`` provider: one-sided RDMA READ and WRITE over reliable-connected queue pairs,
through pyverbs (``pip install 'monarch-rdma[verbs]'``).

Theory of operation. Each process that uses the provider opens one device (the first with an
active port, ``_ibverbs.usable_devices``), one protection domain, one completion queue with a
completion channel, and one thread that waits on that channel and polls the queue: completions
are handled off the actor threads and handed to the waiting transfer's event loop.

*Registration* (the owner's process) registers the buffer's own memory (no copy) as a memory
region with local write, remote read and remote write access (remote read only for read-only
memory) and returns a ``RemoteKey`` whose ``VerbsDetail`` carries the region's address, length
and remote key (``_verbs_proto.RegionInfo``), the owner's process and its ``VerbsManager`` actor.

*Connection* (the process that transfers, once per owner process): it creates an RC queue pair,
moves it to INIT and sends a ``ConnectRequest`` (its LID, GID, QP number, a random PSN and the
port's MTU, encoded by ``_verbs_proto``) to the owner's ``VerbsManager`` in an ordinary actor
message. The owner's process creates its own queue pair, moves it INIT -> RTR -> RTS towards
the request and answers ``ConnectAccept`` (its QP and the requested region, so a dropped buffer
is refused here already) or ``ConnectReject``; the requester then moves its own queue pair
RTR -> RTS. The path MTU is the smaller of the two. Within one process the manager is called
directly (a loopback queue pair).

*A transfer* registers the local memory (the destination of a read, the source of a write) for
the time of the transfer, cuts it into chunks of at most ``rdma_max_chunk_size_mb`` and posts one
signalled RDMA READ or WRITE work request per chunk, at most ``rdma_net_chunks_in_flight`` of
them outstanding per transfer and at most ``SEND_QUEUE_DEPTH`` per queue pair (the rest wait in
the connection's backlog, posted as completions free slots). The owner's CPU takes no part.

*Errors*: a completion with an error status fails the transfer with a ``RuntimeError`` that
names the cause (the owner refused the access: dropped or out of range; the owner cannot be
reached: retries exhausted; flushed) and the queue pair, now in the error state, is discarded
(the next transfer connects again). A transfer cancelled by its timeout moves its queue pair to
the error state, which flushes its outstanding work requests, and waits for their completions
before the local memory is deregistered: once the caller has the ``TimeoutError`` the device
writes nothing more into either memory.

*Deregistration* (``drop()`` from any process) is a message to the owner's manager (a direct
call in the owner's process) that deregisters the memory region: later accesses through its
remote key fail at the device.

pyverbs is imported only when the provider is created. ``use_api`` replaces it (tests: the
device emulation in ``tests/fake_pyverbs.py``; there is no RDMA device on the machines this
was written on, and this module has not run against a real one).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import importlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Final

from monarch.actor import Actor, ActorError, endpoint
from monarch.rdma import _ibverbs
from monarch.rdma._config import setting
from monarch.rdma._host import HOST
from monarch.rdma._memory import address_of
from monarch.rdma._owned import spawn_process_actor
from monarch.rdma._provider import (
    ProviderSpec,
    RDMAProvider,
    Reach,
    RegistrationDeclined,
    RemoteKey,
)
from monarch.rdma._verbs_proto import (
    ConnectAccept,
    ConnectReject,
    ConnectRequest,
    HandshakeError,
    QpInfo,
    RegionInfo,
    decode,
    encode,
)

__all__ = [
    "NAME",
    "SEND_QUEUE_DEPTH",
    "SPEC",
    "VerbsDetail",
    "VerbsManager",
    "VerbsProvider",
    "load_pyverbs",
    "plan_chunks",
    "use_api",
]

NAME: Final = "ibverbs"
#: Work requests outstanding on one queue pair at most (its send queue's depth).
SEND_QUEUE_DEPTH: Final = 64
#: Completion queue entries (shared by every queue pair of the process).
CQ_DEPTH: Final = 4096
#: Queue pairs a process keeps towards owners, and accepts from requesters, at most.
MAX_CONNECTIONS: Final = 256
#: How long a cancelled transfer waits for its flushed work requests.
FLUSH_WAIT: Final = 10.0
PORT: Final = 1
_MIB: Final = 1 << 20
_log = logging.getLogger("monarch.rdma.verbs")

_api_factory: Callable[[], Any] | None = None
_api_device: str | None = None


def use_api(factory: Callable[[], Any] | None, device: str | None = None) -> None:
    """Replace pyverbs by ``factory()`` (a namespace with pyverbs' classes and an ``e`` of its
    enums) and use ``device``; ``None`` restores pyverbs. For tests: the provider is then
    available in this process without ``/dev/infiniband``."""
    global _api_factory, _api_device, _state
    _api_factory, _api_device = factory, device
    _state = None


def load_pyverbs() -> SimpleNamespace:
    """pyverbs' classes used here, in one namespace (``e``: its enums, ``Error``: its base
    exception)."""
    device = importlib.import_module("pyverbs.device")
    pd = importlib.import_module("pyverbs.pd")
    mr = importlib.import_module("pyverbs.mr")
    cq = importlib.import_module("pyverbs.cq")
    qp = importlib.import_module("pyverbs.qp")
    addr = importlib.import_module("pyverbs.addr")
    wr = importlib.import_module("pyverbs.wr")
    errors = importlib.import_module("pyverbs.pyverbs_error")
    return SimpleNamespace(
        Context=device.Context, PD=pd.PD, MR=mr.MR, CQ=cq.CQ, CompChannel=cq.CompChannel,
        QP=qp.QP, QPCap=qp.QPCap, QPInitAttr=qp.QPInitAttr, QPAttr=qp.QPAttr,
        AHAttr=addr.AHAttr, GlobalRoute=addr.GlobalRoute, GID=addr.GID, SGE=wr.SGE,
        SendWR=wr.SendWR, e=importlib.import_module("pyverbs.enums"),
        Error=errors.PyverbsError,
    )  # fmt: skip


def plan_chunks(total: int, max_chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the work requests of a ``total``-byte transfer: chunks of
    ``max_chunk`` bytes, the last one shorter; none for ``total == 0``."""
    if total < 0 or max_chunk < 1:
        raise ValueError(f"bad chunk plan ({total=}, {max_chunk=})")
    return [(offset, min(max_chunk, total - offset)) for offset in range(0, total, max_chunk)]


def _gid_bytes(gid: Any) -> bytes:
    return bytes.fromhex(str(gid.gid).replace(":", ""))


def _gid_text(raw: bytes) -> str:
    text = raw.hex()
    return ":".join(text[i : i + 4] for i in range(0, 32, 4))


def qp_init_attr(api: Any, cq: Any) -> Any:
    """An RC queue pair's creation attributes: both queues on ``cq``, ``SEND_QUEUE_DEPTH``
    send slots, one scatter-gather element."""
    cap = api.QPCap(max_send_wr=SEND_QUEUE_DEPTH, max_recv_wr=1, max_send_sge=1,
                    max_recv_sge=1)  # fmt: skip
    return api.QPInitAttr(qp_type=api.e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)


def init_attr(api: Any) -> Any:
    """RESET -> INIT: the port, partition key 0, remote read and write allowed."""
    e = api.e
    attr = api.QPAttr(port_num=PORT)
    attr.qp_access_flags = (
        e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    )
    attr.pkey_index = 0
    return attr


def rtr_attr(api: Any, local: QpInfo, remote: QpInfo, rd_atomic: int, is_global: bool) -> Any:
    """INIT -> RTR towards ``remote``: the smaller path MTU, its QP number and PSN, its address
    (with a global route, by GID, on RoCE or where GIDs are set)."""
    attr = api.QPAttr(port_num=PORT, path_mtu=min(local.mtu, remote.mtu))
    attr.dest_qp_num = remote.qp_num
    attr.rq_psn = remote.psn
    attr.max_dest_rd_atomic = rd_atomic
    attr.min_rnr_timer = 12
    if is_global:
        route = api.GlobalRoute(dgid=api.GID(_gid_text(remote.gid)), sgid_index=local.gid_index)
        attr.ah_attr = api.AHAttr(port_num=PORT, is_global=1, gr=route, dlid=remote.lid)
    else:
        attr.ah_attr = api.AHAttr(port_num=PORT, is_global=0, dlid=remote.lid)
    return attr


def rts_attr(attr: Any, local: QpInfo, rd_atomic: int) -> Any:
    """RTR -> RTS: this side's PSN, the transport timeout (4.096 us * 2**14, about 67 ms) and
    7 retries."""
    attr.sq_psn = local.psn
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.max_rd_atomic = rd_atomic
    return attr


def work_request(
    api: Any, wr_id: int, opcode: int, address: int, length: int, lkey: int, rkey: int,
    remote_address: int,
) -> Any:  # fmt: skip
    """One signalled RDMA READ or WRITE of ``length`` bytes between local ``address`` (memory
    region ``lkey``) and ``remote_address`` (remote key ``rkey``)."""
    sge = api.SGE(address, length, lkey)
    wr = api.SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                    send_flags=api.e.IBV_SEND_SIGNALED)  # fmt: skip
    wr.set_wr_rdma(rkey, remote_address)
    return wr


@dataclass(frozen=True, slots=True)
class VerbsDetail:
    """The ``ibverbs`` part of a ``RemoteKey``: the owner's ``process`` (host and pid), its
    ``manager`` (actor reference; ``None`` in tests within one process) and the ``region``."""

    process: str
    manager: Any
    region: RegionInfo


def _process_id() -> str:
    return f"{HOST}/{os.getpid()}"


class VerbsManager(Actor):
    """The per-process manager of the ``ibverbs`` provider: answers queue-pair handshakes and
    drops for the regions registered in its process. Not for direct use."""

    @endpoint
    def connect(self, region: int, request: bytes) -> bytes:
        return _provider_state().accept(region, request)

    @endpoint
    def drop(self, region: int) -> None:
        _provider_state().deregister_local(region)


@dataclass(slots=True)
class _Pending:
    """One posted work request: where its completion goes."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]
    connection: _Connection


@dataclass(eq=False, slots=True)
class _Connection:
    """A connected queue pair towards one owner process, with its bounded send queue."""

    qp: Any
    peer: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    inflight: int = 0
    backlog: collections.deque[Any] = field(default_factory=collections.deque)
    broken: str | None = None
    closed: bool = False

    def close_if_drained(self) -> None:
        """Destroy the queue pair once it is out of service and nothing is posted on it."""
        with self.lock:  # never while another thread modifies it (_State._retire)
            if self.closed or self.broken is None or self.inflight or self.backlog:
                return
            self.closed = True
            try:
                self.qp.close()
            except Exception as exc:
                _log.debug("RDMA verbs: destroying a retired queue pair: %s", exc)


@dataclass(slots=True)
class _Owned:
    mr: Any
    view: memoryview
    info: RegionInfo


class _State:
    """The device resources of one process (rebuilt in a forked child)."""

    def __init__(self, api: Any, device: str) -> None:
        self.api = api
        e = api.e
        self.e = e
        self.pid = os.getpid()
        self.ctx = api.Context(name=device)
        self.device = device
        self.pd = api.PD(self.ctx)
        self.channel = api.CompChannel(self.ctx)
        self.cq = api.CQ(self.ctx, CQ_DEPTH, None, self.channel, 0)
        port = self.ctx.query_port(PORT)
        if port.state != e.IBV_PORT_ACTIVE:
            raise RuntimeError(f"RDMA device {device} port {PORT} is not active ({port.state})")
        self.lid = int(port.lid)
        self.mtu = int(port.active_mtu)
        self.gid_index = int(os.environ.get("MONARCH_RDMA_VERBS_GID_INDEX", "0"))
        self.gid = _gid_bytes(self.ctx.query_gid(PORT, self.gid_index))
        self.is_global = port.link_layer == e.IBV_LINK_LAYER_ETHERNET or any(self.gid)
        attr = self.ctx.query_device()
        self.rd_atomic = max(1, min(16, int(attr.max_qp_rd_atom), int(attr.max_qp_init_rd_atom)))
        self.lock = threading.Lock()
        self.regions: dict[int, _Owned] = {}
        self.connections: collections.OrderedDict[str, _Connection] = collections.OrderedDict()
        self.accepted: collections.OrderedDict[tuple[bytes, int], Any] = collections.OrderedDict()
        self.pending: dict[int, _Pending] = {}
        self.connecting: dict[str, concurrent.futures.Future[_Connection]] = {}
        self.next_wr = 1
        self.closed = False
        self.poller = threading.Thread(target=self._poll, name="monarch-rdma-verbs-cq", daemon=True)
        self.poller.start()

    # ----- owner side -------------------------------------------------------------------

    def register(self, memory: memoryview) -> RegionInfo:
        e = self.e
        if memory.readonly:
            access = e.IBV_ACCESS_REMOTE_READ
        else:
            access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
        address = address_of(memory)
        mr = self.api.MR(self.pd, memory.nbytes, access, address=address)
        info = RegionInfo(address, memory.nbytes, int(mr.rkey))
        with self.lock:
            self.regions[info.rkey] = _Owned(mr, memory, info)
        return info

    def deregister_local(self, rkey: int) -> None:
        with self.lock:
            owned = self.regions.pop(rkey, None)
        if owned is not None:
            owned.mr.close()

    def _new_qp(self) -> Any:
        qp = self.api.QP(self.pd, qp_init_attr(self.api, self.cq))
        qp.to_init(init_attr(self.api))
        return qp

    def _info(self, qp: Any, psn: int) -> QpInfo:
        return QpInfo(self.lid, self.gid, int(qp.qp_num), psn, self.mtu, PORT, self.gid_index)

    def _connect_qp(self, qp: Any, local: QpInfo, remote: QpInfo) -> None:
        """INIT -> RTR -> RTS towards ``remote``."""
        attr = rtr_attr(self.api, local, remote, self.rd_atomic, self.is_global)
        qp.to_rtr(attr)
        rts_attr(attr, local, self.rd_atomic)
        qp.to_rts(attr)

    def accept(self, rkey: int, request_bytes: bytes) -> bytes:
        """The owner's half of the handshake: a queue pair towards the requester, or why not."""
        try:
            request = decode(request_bytes)
        except HandshakeError as exc:
            return encode(ConnectReject(0, f"malformed handshake: {exc}"))
        if not isinstance(request, ConnectRequest):
            return encode(ConnectReject(request.request, "expected a connect request"))
        with self.lock:
            owned = self.regions.get(rkey)
        if owned is None:
            reason = f"RDMA region {rkey:#x} is not registered in this process (dropped)"
            return encode(ConnectReject(request.request, reason))
        qp = self._new_qp()
        local = self._info(qp, secrets.randbits(24))
        try:
            self._connect_qp(qp, local, request.qp)
        except Exception as exc:
            qp.close()
            return encode(ConnectReject(request.request, f"queue pair setup failed: {exc}"))
        with self.lock:
            self.accepted[(request.qp.gid, request.qp.qp_num)] = qp
            while len(self.accepted) > MAX_CONNECTIONS:
                _, old = self.accepted.popitem(last=False)
                old.close()
        return encode(ConnectAccept(request.request, local, owned.info))

    # ----- requester side ----------------------------------------------------------------

    async def connection(self, detail: VerbsDetail) -> _Connection:
        """The kept queue pair towards the owner's process, connected on first use; concurrent
        transfers towards one owner share one handshake."""
        while True:
            with self.lock:
                conn = self.connections.get(detail.process)
                if conn is not None and conn.broken is None:
                    self.connections.move_to_end(detail.process)
                    return conn
                waiting = self.connecting.get(detail.process)
                if waiting is None:
                    mine: concurrent.futures.Future[_Connection] = concurrent.futures.Future()
                    self.connecting[detail.process] = mine
            if waiting is not None:
                with contextlib.suppress(Exception):  # its handshake failed: try one of ours
                    await asyncio.shield(asyncio.wrap_future(waiting))
                continue
            try:
                conn = await self._connect(detail)
            except BaseException as exc:
                with self.lock:
                    self.connecting.pop(detail.process, None)
                mine.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                raise
            with self.lock:
                self.connecting.pop(detail.process, None)
            mine.set_result(conn)
            return conn

    async def _connect(self, detail: VerbsDetail) -> _Connection:
        qp = self._new_qp()
        psn = secrets.randbits(24)
        local = self._info(qp, psn)
        request = encode(ConnectRequest(secrets.randbits(32), local))
        try:
            if detail.process == _process_id() or detail.manager is None:
                answer = self.accept(detail.region.rkey, request)
            else:
                answer = await detail.manager.connect.call_one(detail.region.rkey, request)
            message = decode(answer)
            if isinstance(message, ConnectReject):
                raise RuntimeError(f"the owner refused the connection: {message.reason}")
            if not isinstance(message, ConnectAccept):
                raise RuntimeError("the owner answered the handshake with a request")
            if message.region != detail.region:
                raise RuntimeError("the owner's region differs from the handle's (stale handle)")
            self._connect_qp(qp, local, message.qp)
        except BaseException:
            qp.close()
            raise
        conn = _Connection(qp, detail.process)
        with self.lock:
            old = self.connections.pop(detail.process, None)
            self.connections[detail.process] = conn
            evicted = []
            while len(self.connections) > MAX_CONNECTIONS:
                evicted.append(self.connections.popitem(last=False)[1])
        for stale in ([old] if old is not None else []) + evicted:
            self._retire(stale, "replaced")
        return conn

    def _retire(self, conn: _Connection, why: str) -> None:
        """Take ``conn`` out of service: to the error state (its outstanding requests flush)."""
        with conn.lock:  # the queue pair is destroyed under this lock too
            if conn.broken is None:
                conn.broken = why
            if not conn.closed:
                try:
                    attr = self.api.QPAttr()
                    attr.qp_state = self.e.IBV_QPS_ERR
                    conn.qp.modify(attr, self.e.IBV_QP_STATE)
                except Exception as exc:  # already in error
                    _log.debug("RDMA verbs: moving a queue pair to the error state: %s", exc)
        with self.lock:
            if self.connections.get(conn.peer) is conn:
                del self.connections[conn.peer]
        conn.close_if_drained()

    def post(self, conn: _Connection, wr: Any, pending: _Pending, wr_id: int) -> None:
        with self.lock:
            self.pending[wr_id] = pending
        with conn.lock:
            if conn.broken is not None:
                failed = conn.broken
            elif conn.inflight < SEND_QUEUE_DEPTH:
                conn.inflight += 1
                failed = None
                try:
                    conn.qp.post_send(wr)
                except Exception as exc:
                    conn.inflight -= 1
                    failed = f"posting a work request failed: {exc}"
            else:
                conn.backlog.append((wr, wr_id))
                return
        if failed is not None:
            self._complete(wr_id, None, failed)

    def next_id(self) -> int:
        with self.lock:
            wr_id = self.next_wr
            self.next_wr += 1
            return wr_id

    def _complete(self, wr_id: int, status: int | None, failure: str | None) -> None:
        with self.lock:
            pending = self.pending.pop(wr_id, None)
        if pending is None:
            return
        result: Any = status if failure is None else RuntimeError(failure)

        def deliver() -> None:
            if pending.future.done():
                return
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            pending.loop.call_soon_threadsafe(deliver)

    def _poll(self) -> None:
        """The completion thread: drain the CQ, then sleep on the completion channel."""
        cq = self.cq
        while not self.closed:
            try:
                count, wcs = cq.poll(64)
                if not count:
                    cq.req_notify()
                    count, wcs = cq.poll(64)  # a completion that came before req_notify
                    if not count:
                        self.channel.get_cq_event(cq)
                        cq.ack_events(1)
                        continue
            except Exception as exc:
                if not self.closed:  # else: closed meanwhile
                    _log.error("RDMA verbs: the completion queue failed: %s", exc)
                return
            for wc in wcs[:count]:
                self._on_completion(wc)

    def _on_completion(self, wc: Any) -> None:
        wr_id, status = int(wc.wr_id), int(wc.status)
        with self.lock:
            pending = self.pending.get(wr_id)
        if pending is None:
            return
        conn = pending.connection
        follow: list[tuple[Any, int]] = []
        with conn.lock:
            conn.inflight -= 1
            if status != self.e.IBV_WC_SUCCESS and conn.broken is None:
                conn.broken = _status_text(self.e, status)
            if conn.broken is None:
                while conn.backlog and conn.inflight < SEND_QUEUE_DEPTH:
                    wr, backlog_id = conn.backlog.popleft()
                    try:
                        conn.qp.post_send(wr)
                        conn.inflight += 1
                    except Exception as exc:
                        follow.append((None, backlog_id))
                        conn.broken = f"posting a work request failed: {exc}"
            else:
                follow.extend((None, backlog_id) for _, backlog_id in conn.backlog)
                conn.backlog.clear()
            broken = conn.broken
        if status != self.e.IBV_WC_SUCCESS:
            self._retire(conn, broken or "failed")
        if broken is not None:
            conn.close_if_drained()  # before the last waiter hears of its completion
        if status != self.e.IBV_WC_SUCCESS:
            self._complete(wr_id, None, _status_text(self.e, status))
        else:
            self._complete(wr_id, status, None)
        for _, other in follow:
            self._complete(other, None, f"not posted: the queue pair failed ({broken})")

    def close(self) -> None:
        """Release every resource (tests); the completion thread ends at its next wake-up."""
        self.closed = True
        with self.lock:
            conns = list(self.connections.values())
            accepted = list(self.accepted.values())
            regions = list(self.regions.values())
            self.connections.clear()
            self.accepted.clear()
            self.regions.clear()
        for conn in conns:
            if not conn.closed:
                conn.closed = True
                conn.qp.close()
        for qp in accepted:
            qp.close()
        for owned in regions:
            owned.mr.close()
        wake = getattr(self.channel, "wake", None)
        if wake is not None:
            wake()


def _status_text(e: Any, status: int) -> str:
    if status in (e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_REM_INV_REQ_ERR):
        return (
            f"the owner's device refused the access (status {status}): the buffer was dropped, "
            "or the range is outside its registration"
        )
    if status in (e.IBV_WC_RETRY_EXC_ERR, e.IBV_WC_RNR_RETRY_EXC_ERR, e.IBV_WC_RESP_TIMEOUT_ERR):
        return (
            f"the owner's process has exited or cannot be reached (status {status}: retries "
            "exhausted)"
        )
    if status == e.IBV_WC_WR_FLUSH_ERR:
        return f"flushed (status {status}): the queue pair failed or the transfer was cancelled"
    if status in (e.IBV_WC_LOC_PROT_ERR, e.IBV_WC_LOC_ACCESS_ERR, e.IBV_WC_LOC_LEN_ERR):
        return f"the local memory registration was refused by the device (status {status})"
    return f"completion status {status}"


_state: _State | None = None
_state_lock = threading.Lock()


def _provider_state() -> _State:
    """This process's device resources (opened on first use; again in a forked child)."""
    global _state
    with _state_lock:
        if _state is None or _state.pid != os.getpid():
            if _api_factory is not None:
                api, device = _api_factory(), _api_device or "fake0"
            else:
                devices = _ibverbs.usable_devices()
                if not devices:
                    why = _ibverbs.unavailable_reason() or "no device with an active port"
                    raise RuntimeError(f"ibverbs: {why}")
                api, device = load_pyverbs(), devices[0]
            _state = _State(api, device)
            _log.info("RDMA verbs: device %s opened in process %d", device, os.getpid())
        return _state


def _forget_after_fork() -> None:
    global _state_lock, _managers_lock
    _state_lock = threading.Lock()
    _managers_lock = threading.Lock()
    _manager.clear()


_manager: list[Any] = []
_managers_lock = threading.Lock()
os.register_at_fork(after_in_child=_forget_after_fork)


def _this_manager() -> Any:
    """This process's ``VerbsManager`` (spawned on first use, from a thread that runs no
    actor, so the process owns it)."""
    with _managers_lock:
        if _manager:
            return _manager[0]
        spawned = spawn_process_actor("rdma_verbs_manager", VerbsManager, "the ibverbs manager")
        _manager.append(spawned)
        return spawned


def _detail(key: RemoteKey) -> VerbsDetail:
    if not isinstance(key.detail, VerbsDetail):
        raise RuntimeError(f"RDMA region {key.region}: not an {NAME} key ({key.detail!r})")
    return key.detail


def _settings() -> tuple[int, int]:
    max_chunk = max(1, int(setting("rdma_max_chunk_size_mb"))) * _MIB
    window = max(1, min(int(setting("rdma_net_chunks_in_flight")), SEND_QUEUE_DEPTH))
    return max_chunk, window


class VerbsProvider:
    """The ``ibverbs`` provider (see the module docstring). Implements ``RDMAProvider``.
    ``manager=False`` registers without a manager actor (tests within one process)."""

    name = NAME

    def __init__(self, *, manager: bool = True) -> None:
        self._with_manager = manager

    def register(self, memory: memoryview, *, owner: str) -> RemoteKey:
        """Register ``memory`` as a memory region; ``RegistrationDeclined`` (other providers
        then serve the buffer) where the device cannot be opened or the memory registered."""
        try:
            state = _provider_state()
            info = state.register(memory)
        except Exception as exc:
            _log.warning("RDMA verbs: a buffer of %d bytes is not registered: %s",
                         memory.nbytes, exc)  # fmt: skip
            raise RegistrationDeclined(f"{NAME}: {exc}") from exc
        try:
            mgr = _this_manager() if self._with_manager else None
        except BaseException:
            state.deregister_local(info.rkey)
            raise
        return RemoteKey(NAME, info.rkey, memory.nbytes, VerbsDetail(_process_id(), mgr, info))

    async def read(self, key: RemoteKey, offset: int, dst: memoryview) -> None:
        await self._transfer("read", key, offset, dst)

    async def write(self, key: RemoteKey, offset: int, src: memoryview) -> None:
        await self._transfer("write", key, offset, src)

    async def _transfer(self, what: str, key: RemoteKey, offset: int, local: memoryview) -> None:
        detail = _detail(key)
        if offset < 0 or offset + local.nbytes > detail.region.length:
            raise RuntimeError(
                f"RDMA {what} of region {key.region}: bytes [{offset}, {offset + local.nbytes}) "
                f"are outside its {detail.region.length} bytes"
            )
        if not local.nbytes:
            return
        state = _provider_state()
        e = state.e
        try:
            conn = await state.connection(detail)
        except (ActorError, RuntimeError, HandshakeError) as exc:
            raise RuntimeError(
                f"RDMA {what} of region {key.region} ({NAME} provider) failed: no queue pair "
                f"to the owner's process ({exc})"
            ) from exc
        if what == "read" and local.readonly:
            raise RuntimeError("RDMA read destination is read-only memory")
        access = e.IBV_ACCESS_LOCAL_WRITE if what == "read" else 0
        local_address = address_of(local)
        mr = state.api.MR(state.pd, local.nbytes, access, address=local_address)
        opcode = e.IBV_WR_RDMA_READ if what == "read" else e.IBV_WR_RDMA_WRITE
        max_chunk, window = _settings()
        loop = asyncio.get_running_loop()
        chunks = collections.deque(plan_chunks(local.nbytes, max_chunk))
        outstanding: set[asyncio.Future[int]] = set()
        try:
            while chunks or outstanding:
                while chunks and len(outstanding) < window:
                    start, length = chunks.popleft()
                    wr_id = state.next_id()
                    wr = work_request(
                        state.api, wr_id, opcode, local_address + start, length, mr.lkey,
                        detail.region.rkey, detail.region.address + offset + start,
                    )  # fmt: skip
                    future: asyncio.Future[int] = loop.create_future()
                    outstanding.add(future)
                    state.post(conn, wr, _Pending(loop, future, conn), wr_id)
                done, _ = await asyncio.wait(outstanding, return_when=asyncio.FIRST_COMPLETED)
                outstanding -= done
                errors = [exc for exc in (f.exception() for f in done) if exc is not None]
                errors.sort(key=lambda exc: "flushed" in str(exc))  # the cause before its flushes
                if errors:
                    raise RuntimeError(
                        f"RDMA {what} of region {key.region} ({NAME} provider) failed: {errors[0]}"
                    ) from errors[0]
        finally:
            if outstanding:  # cancelled or failed: flush the rest before the memory goes
                state._retire(conn, f"a {what} was abandoned")
                await _settle(outstanding)
            mr.close()

    async def deregister(self, key: RemoteKey) -> None:
        detail = _detail(key)
        try:
            if detail.process == _process_id() or detail.manager is None:
                _provider_state().deregister_local(detail.region.rkey)
            else:
                await detail.manager.drop.call_one(detail.region.rkey)
        except (ActorError, RuntimeError) as exc:
            raise RuntimeError(f"RDMA drop of region {key.region} ({NAME}) failed: {exc}") from exc


async def _settle(futures: set[asyncio.Future[int]]) -> None:
    """Wait (bounded) for flushed work requests, also when this task is being cancelled."""
    waiter = asyncio.ensure_future(asyncio.wait(futures, timeout=FLUSH_WAIT))
    while not waiter.done():
        try:
            await asyncio.shield(waiter)
        except asyncio.CancelledError:
            continue
    for future in futures:
        if future.done() and not future.cancelled():
            future.exception()  # seen
    if any(not future.done() for future in futures):
        _log.error("RDMA verbs: %d work request(s) did not flush within %.0f s",
                   sum(not f.done() for f in futures), FLUSH_WAIT)  # fmt: skip


_probe: tuple[int, float, bool] = (0, 0.0, False)  # (pid, until, answer)
#: How long the device probe's answer is kept (a transfer asks for it; sysfs is read on a miss).
PROBE_TTL: Final = 5.0


def _available() -> bool:
    global _probe
    if _api_factory is not None:
        return True
    pid, until, answer = _probe
    now = time.monotonic()
    if pid != os.getpid() or now >= until:
        answer = bool(_ibverbs.usable_devices()) and _ibverbs.pyverbs_importable()
        _probe = (os.getpid(), now + PROBE_TTL, answer)
    return answer


def _create() -> RDMAProvider:
    return VerbsProvider()


#: The ``ibverbs`` provider's record, as ``monarch.rdma._plugin`` offers it: above ``shm``
#: and ``net`` wherever both processes have a device.
SPEC: Final = ProviderSpec(NAME, "ibverbs", Reach.ANY, 20, _available, _create)
