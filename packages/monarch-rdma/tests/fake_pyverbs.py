"""An EMULATION of the part of pyverbs' API that ``monarch.rdma._verbs`` uses, for tests.

Why: there is no RDMA device on the machines these tests run on (no ``/dev/infiniband``, no
``rdma_rxe``), so the provider's logic (queue-pair state sequence, chunking, the bound on
outstanding work requests, completion handling, error paths, deregistration, the handshake over
actor messages between processes) is exercised against this stand-in. It is not a device and
proves nothing about a real one.

What it emulates: a *fabric* shared by the processes of one host through a directory (each
queue pair and memory region is a small file there: its process, state, address, length, access
flags). A signalled RDMA READ or WRITE posted on a queue pair in RTS is executed by a worker
thread of its ``Context``, in order: it checks the local memory region (lkey, bounds, local
write access for a read), the remote queue pair (exists, at least RTR), the remote region
(rkey exists in the remote QP's process, bounds, remote read or write access), then copies
(``ctypes.memmove`` within a process, ``process_vm_readv``/``process_vm_writev`` between
processes of the host) and puts a work completion on the queue pair's CQ, waking its
completion channel. Like a real device, a failed work request moves the queue pair to the
error state and every later one completes with ``IBV_WC_WR_FLUSH_ERR``; moving it to the error
state (``modify``) flushes what is queued.

Test controls on ``Fabric``: ``fail_next(status, count)`` (the next work requests complete with
``status``), ``hold()``/``release()`` (work requests wait: outstanding ones pile up),
``max_outstanding`` (the most work requests a queue pair had posted and not completed),
``wr_lengths`` (the lengths of executed work requests) and ``transitions`` (per queue-pair
number, the states it went through).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import secrets
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class Enums:
    """The ibverbs enum values the provider uses (pyverbs.enums)."""

    IBV_ACCESS_LOCAL_WRITE = 1
    IBV_ACCESS_REMOTE_WRITE = 2
    IBV_ACCESS_REMOTE_READ = 4
    IBV_QPT_RC = 2
    IBV_QPS_RESET = 0
    IBV_QPS_INIT = 1
    IBV_QPS_RTR = 2
    IBV_QPS_RTS = 3
    IBV_QPS_ERR = 6
    IBV_QP_STATE = 1
    IBV_WR_RDMA_WRITE = 0
    IBV_WR_RDMA_READ = 4
    IBV_SEND_SIGNALED = 2
    IBV_WC_SUCCESS = 0
    IBV_WC_LOC_LEN_ERR = 1
    IBV_WC_LOC_PROT_ERR = 4
    IBV_WC_WR_FLUSH_ERR = 5
    IBV_WC_LOC_ACCESS_ERR = 8
    IBV_WC_REM_INV_REQ_ERR = 9
    IBV_WC_REM_ACCESS_ERR = 10
    IBV_WC_RETRY_EXC_ERR = 12
    IBV_WC_RNR_RETRY_EXC_ERR = 13
    IBV_WC_RESP_TIMEOUT_ERR = 19
    IBV_PORT_ACTIVE = 4
    IBV_LINK_LAYER_INFINIBAND = 1
    IBV_LINK_LAYER_ETHERNET = 2
    IBV_MTU_4096 = 5


e = Enums


class PyverbsError(Exception):
    """The emulation's error (pyverbs' base exception)."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_writev.restype = ctypes.c_ssize_t


def _copy_between(pid: int, local: int, remote: int, length: int, read: bool) -> None:
    if pid == os.getpid():
        if read:
            ctypes.memmove(local, remote, length)
        else:
            ctypes.memmove(remote, local, length)
        return
    mine, theirs = _IoVec(local, length), _IoVec(remote, length)
    call = _libc.process_vm_readv if read else _libc.process_vm_writev
    done = call(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
    if done != length:
        raise OSError(ctypes.get_errno(), f"process_vm copy moved {done} of {length} bytes")


class Fabric:
    """The shared state of the emulation (one directory) and its test controls."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fail: list[int] = []
        self._gate = threading.Condition()
        self._held = False
        self.max_outstanding = 0
        self.wr_lengths: list[int] = []
        self.transitions: dict[int, list[str]] = {}

    def api(self) -> SimpleNamespace:
        """The pyverbs-shaped namespace over this fabric."""
        fabric = self

        class _Ctx(Context):
            def __init__(self, name: str) -> None:
                super().__init__(fabric, name)

        return SimpleNamespace(
            Context=_Ctx, PD=PD, MR=MR, CQ=CQ, CompChannel=CompChannel, QP=QP, QPCap=QPCap,
            QPInitAttr=QPInitAttr, QPAttr=QPAttr, AHAttr=AHAttr, GlobalRoute=GlobalRoute,
            GID=GID, SGE=SGE, SendWR=SendWR, e=e, Error=PyverbsError,
        )  # fmt: skip

    def fail_next(self, status: int, count: int = 1) -> None:
        with self._lock:
            self._fail.extend([status] * count)

    def take_failure(self) -> int | None:
        with self._lock:
            return self._fail.pop(0) if self._fail else None

    def hold(self) -> None:
        with self._gate:
            self._held = True

    def release(self) -> None:
        with self._gate:
            self._held = False
            self._gate.notify_all()

    def poke(self) -> None:
        """A queue pair changed state (held work of one in error may go: it flushes)."""
        with self._gate:
            self._gate.notify_all()

    def wait_gate(self, qp: QP) -> None:
        with self._gate:
            self._gate.wait_for(lambda: not self._held or qp.qp_state == e.IBV_QPS_ERR, 30)

    # the shared tables: one file per object
    def publish(self, kind: str, number: int, fields: dict[str, int]) -> bool:
        path = self.dir / f"{kind}-{number}"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(" ".join(f"{k}={v}" for k, v in fields.items()))
        return True

    def update(self, kind: str, number: int, fields: dict[str, int]) -> None:
        path = self.dir / f"{kind}-{number}"
        tmp = self.dir / f".{kind}-{number}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(" ".join(f"{k}={v}" for k, v in fields.items()))
        os.replace(tmp, path)

    def lookup(self, kind: str, number: int) -> dict[str, int] | None:
        try:
            text = (self.dir / f"{kind}-{number}").read_text()
        except FileNotFoundError:
            return None
        return {k: int(v) for k, v in (item.split("=") for item in text.split())}

    def remove(self, kind: str, number: int) -> None:
        (self.dir / f"{kind}-{number}").unlink(missing_ok=True)


class GID:
    def __init__(self, val: str = "0000:0000:0000:0000:0000:0000:0000:0000") -> None:
        self.gid = val


class Context:
    def __init__(self, fabric: Fabric, name: str) -> None:
        self.fabric = fabric
        self.name = name
        self._work: queue.Queue[Any] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="fake-verbs-device", daemon=True)
        self._worker.start()
        host = os.getpid() & 0xFFFF
        self._gid = f"fe80:0000:0000:0000:0000:0000:{host >> 8:04x}:{host & 0xFF:04x}"

    def query_port(self, port: int) -> SimpleNamespace:
        return SimpleNamespace(
            state=e.IBV_PORT_ACTIVE, lid=7, active_mtu=e.IBV_MTU_4096,
            link_layer=e.IBV_LINK_LAYER_INFINIBAND, gid_tbl_len=1,
        )  # fmt: skip

    def query_gid(self, port: int, index: int) -> GID:
        return GID(self._gid)

    def query_device(self) -> SimpleNamespace:
        return SimpleNamespace(max_qp_rd_atom=16, max_qp_init_rd_atom=16)

    def _run(self) -> None:
        while True:
            qp, wr = self._work.get()
            self.fabric.wait_gate(qp)
            qp._execute(wr)


class PD:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.mrs: dict[int, MR] = {}


class MR:
    def __init__(self, pd: PD, length: int, access: int, address: int | None = None) -> None:
        if address is None or length < 1:
            raise PyverbsError("the emulation registers given memory only")
        if access & e.IBV_ACCESS_REMOTE_WRITE and not access & e.IBV_ACCESS_LOCAL_WRITE:
            raise PyverbsError("remote write access requires local write access (EINVAL)")
        self.pd, self.address, self.length, self.access = pd, address, length, access
        fabric = pd.ctx.fabric
        while True:
            key = secrets.randbits(32) or 1
            fields = {"pid": os.getpid(), "addr": address, "len": length, "access": access}
            if fabric.publish("mr", key, fields):
                break
        self.lkey = self.rkey = key
        pd.mrs[key] = self
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pd.mrs.pop(self.lkey, None)
            self.pd.ctx.fabric.remove("mr", self.rkey)


class CompChannel:
    def __init__(self, ctx: Context) -> None:
        self._cond = threading.Condition()
        self._events = 0

    def notify(self) -> None:
        with self._cond:
            self._events += 1
            self._cond.notify_all()

    def wake(self) -> None:
        self.notify()

    def get_cq_event(self, cq: CQ) -> None:
        with self._cond:
            while not self._events:
                self._cond.wait()
            self._events -= 1


class WC(SimpleNamespace):
    pass


class CQ:
    def __init__(self, ctx: Context, cqe: int, cq_context: Any, channel: CompChannel,
                 comp_vector: int) -> None:  # fmt: skip
        self.cqe, self.channel = cqe, channel
        self._lock = threading.Lock()
        self._entries: list[WC] = []
        self._armed = False
        self.acked = 0

    def push(self, wc: WC) -> None:
        with self._lock:
            if len(self._entries) >= self.cqe:
                raise PyverbsError("CQ overrun")
            self._entries.append(wc)
            armed, self._armed = self._armed, False
        if armed:
            self.channel.notify()

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        with self._lock:
            taken, self._entries = self._entries[:num_entries], self._entries[num_entries:]
        return len(taken), taken

    def req_notify(self, solicited_only: bool = False) -> None:
        with self._lock:
            self._armed = True

    def ack_events(self, num_events: int) -> None:
        self.acked += num_events


class QPCap:
    def __init__(self, max_send_wr: int = 1, max_recv_wr: int = 10, max_send_sge: int = 1,
                 max_recv_sge: int = 1) -> None:  # fmt: skip
        self.max_send_wr = max_send_wr


class QPInitAttr:
    def __init__(self, qp_type: int, scq: CQ, rcq: CQ, cap: QPCap) -> None:
        self.qp_type, self.scq, self.rcq, self.cap = qp_type, scq, rcq, cap


class GlobalRoute:
    def __init__(self, dgid: GID, sgid_index: int = 0) -> None:
        self.dgid, self.sgid_index = dgid, sgid_index


class AHAttr:
    def __init__(self, port_num: int = 1, is_global: int = 0, gr: GlobalRoute | None = None,
                 dlid: int = 0) -> None:  # fmt: skip
        self.port_num, self.is_global, self.gr, self.dlid = port_num, is_global, gr, dlid


class QPAttr:
    def __init__(self, qp_state: int = e.IBV_QPS_INIT, port_num: int = 1,
                 path_mtu: int = 3) -> None:  # fmt: skip
        self.qp_state, self.port_num, self.path_mtu = qp_state, port_num, path_mtu
        self.dest_qp_num: int | None = None
        self.rq_psn = self.sq_psn = 0
        self.qp_access_flags = 0
        self.ah_attr: AHAttr | None = None


class SGE:
    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr, self.length, self.lkey = addr, length, lkey


class SendWR:
    def __init__(self, wr_id: int = 0, opcode: int = e.IBV_WR_RDMA_WRITE, num_sge: int = 1,
                 sg: list[SGE] | None = None, send_flags: int = 0) -> None:  # fmt: skip
        if not sg:
            raise PyverbsError("A WR needs at least one SGE")
        self.wr_id, self.opcode, self.num_sge, self.sg, self.send_flags = (
            wr_id,
            opcode,
            num_sge,
            sg,
            send_flags,
        )
        self.rkey = self.remote_addr = 0

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey, self.remote_addr = rkey, addr


_STATES = {0: "RESET", 1: "INIT", 2: "RTR", 3: "RTS", 6: "ERR"}


class QP:
    def __init__(self, pd: PD, init: QPInitAttr) -> None:
        if init.qp_type != e.IBV_QPT_RC:
            raise PyverbsError("the emulation has RC queue pairs only")
        self.pd, self.cq, self.depth = pd, init.scq, init.cap.max_send_wr
        self.fabric = pd.ctx.fabric
        self.qp_state = e.IBV_QPS_RESET
        self.dest: int | None = None
        self._lock = threading.Lock()
        self.outstanding = 0
        self.closed = False
        while True:
            self.qp_num = secrets.randbits(24) or 1
            if self.fabric.publish("qp", self.qp_num, {"pid": os.getpid(), "state": 0}):
                break
        self.fabric.transitions[self.qp_num] = ["RESET"]

    def _move(self, state: int) -> None:
        self.qp_state = state
        self.fabric.transitions[self.qp_num].append(_STATES[state])
        self.fabric.update("qp", self.qp_num, {"pid": os.getpid(), "state": state})
        self.fabric.poke()

    def to_init(self, attr: QPAttr) -> None:
        if self.qp_state != e.IBV_QPS_RESET:
            raise PyverbsError(f"to INIT from {_STATES[self.qp_state]}")
        self._move(e.IBV_QPS_INIT)

    def to_rtr(self, attr: QPAttr) -> None:
        if self.qp_state != e.IBV_QPS_INIT:
            raise PyverbsError(f"to RTR from {_STATES[self.qp_state]}")
        if attr.dest_qp_num is None or attr.ah_attr is None:
            raise PyverbsError("RTR needs the destination QP number and address")
        self.dest = attr.dest_qp_num
        self._move(e.IBV_QPS_RTR)

    def to_rts(self, attr: QPAttr) -> None:
        if self.qp_state != e.IBV_QPS_RTR:
            raise PyverbsError(f"to RTS from {_STATES[self.qp_state]}")
        self._move(e.IBV_QPS_RTS)

    def modify(self, attr: QPAttr, mask: int) -> None:
        if self.closed:
            raise PyverbsError("modify of a destroyed QP")
        if attr.qp_state == e.IBV_QPS_ERR:
            self._move(e.IBV_QPS_ERR)

    def post_send(self, wr: SendWR) -> None:
        if self.closed:
            raise PyverbsError("post_send on a destroyed QP")
        if self.qp_state != e.IBV_QPS_RTS and self.qp_state != e.IBV_QPS_ERR:
            raise PyverbsError(f"post_send in state {_STATES[self.qp_state]}")
        with self._lock:
            if self.outstanding >= self.depth:
                raise PyverbsError("send queue full (ENOMEM)")
            self.outstanding += 1
            self.fabric.max_outstanding = max(self.fabric.max_outstanding, self.outstanding)
        self.pd.ctx._work.put((self, wr))

    def _complete(self, wr: SendWR, status: int, length: int) -> None:
        with self._lock:
            self.outstanding -= 1
        op = "read" if wr.opcode == e.IBV_WR_RDMA_READ else "write"
        self.cq.push(WC(wr_id=wr.wr_id, status=status, opcode=op, byte_len=length))

    def _execute(self, wr: SendWR) -> None:
        sge = wr.sg[0]
        if self.qp_state == e.IBV_QPS_ERR:
            self._complete(wr, e.IBV_WC_WR_FLUSH_ERR, 0)
            return
        status = self.fabric.take_failure()
        if status is None:
            status = self._check_and_copy(wr, sge)
        if status != e.IBV_WC_SUCCESS:
            self._move(e.IBV_QPS_ERR)
        else:
            self.fabric.wr_lengths.append(sge.length)
        self._complete(wr, status, sge.length)

    def _check_and_copy(self, wr: SendWR, sge: SGE) -> int:
        read = wr.opcode == e.IBV_WR_RDMA_READ
        local = self.pd.mrs.get(sge.lkey)
        if local is None or local.closed:
            return e.IBV_WC_LOC_PROT_ERR
        if sge.addr < local.address or sge.addr + sge.length > local.address + local.length:
            return e.IBV_WC_LOC_PROT_ERR
        if read and not local.access & e.IBV_ACCESS_LOCAL_WRITE:
            return e.IBV_WC_LOC_PROT_ERR
        remote_qp = self.fabric.lookup("qp", self.dest or 0)
        if remote_qp is None or remote_qp["state"] not in (e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            return e.IBV_WC_RETRY_EXC_ERR  # nobody answers: the transport retries run out
        pid = remote_qp["pid"]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return e.IBV_WC_RETRY_EXC_ERR
        region = self.fabric.lookup("mr", wr.rkey)
        if region is None or region["pid"] != pid:
            return e.IBV_WC_REM_ACCESS_ERR
        if wr.remote_addr < region["addr"] or (
            wr.remote_addr + sge.length > region["addr"] + region["len"]
        ):
            return e.IBV_WC_REM_ACCESS_ERR
        needed = e.IBV_ACCESS_REMOTE_READ if read else e.IBV_ACCESS_REMOTE_WRITE
        if not region["access"] & needed:
            return e.IBV_WC_REM_ACCESS_ERR
        try:
            _copy_between(pid, sge.addr, wr.remote_addr, sge.length, read)
        except OSError:
            return e.IBV_WC_RETRY_EXC_ERR
        return e.IBV_WC_SUCCESS

    def close(self) -> None:
        self.closed = True
        self.fabric.remove("qp", self.qp_num)
