"""Datagrams per second for 1,200-byte payloads: every chrysalis carrier beside raw Python.

Usage::

    python benchmarks/datagram_throughput.py [--quick] [--smoke] [--json OUT] [--write-readme]

Each case runs a *baseline* (the same transfer written with the plainest stdlib code) and the
*candidate* (the chrysalis carrier) alternately, ``A B A B ...``, and reports the median rates
and the median of the per-round ratios (see ``benchmarks/_common.py`` and
``benchmarks/README.md``). The cases:

``udp``
    raw ``sendto`` / ``recvfrom_into`` loop vs ``UdpSocket`` with GSO and GRO off
    (``try_send_to`` / ``try_recv``). Target 0.9x.
``udp-gso``
    the same raw single-datagram loop vs ``UdpSocket`` sending 32 x 1,200-byte GSO transmits
    (``try_send_transmit``) to a GRO receiver. Target 2x where the kernel supports GSO.
``unixgram``
    raw ``AF_UNIX``/``SOCK_DGRAM`` loop vs ``UnixDatagramSocket``. Target 0.9x. Fairness: both
    sides bind filesystem paths in the same scratch directory with the same socket buffers,
    send the same ``bytes`` payload one datagram per call to the receiver's path, wait the
    same way when a send would block (the destination's queue of ``net.unix.max_dgram_qlen``
    datagrams is full) and receive up to 32 datagrams per wake, one 2,048-byte buffer per
    datagram of the batch (32 buffers each side). The baseline drops the source address that
    ``recvfrom_into`` returns; the candidate reports length and source in
    ``DatagramRecvMeta`` records, the contract's work.
``unixgram-recv``, ``udp-recv``
    diagnostics, run only when named with ``--case``: the raw pair against the raw sender
    feeding the carrier's receiver, which isolates the receive side (no target).
``inproc``
    two *threads* of one process (the carrier is in-process by definition): the standard
    library's bounded thread-safe handoff (``queue.Queue(maxsize=1024)`` of ``(source,
    bytes)`` pairs, ``put_nowait`` / ``get_nowait``) vs ``InprocNetwork`` sockets. Target 0.9x.
    An extra informational row, ``inproc-deque``, compares the same candidate trials with a
    bare ``collections.deque`` handoff (no lock, no source address; no target).
``udp-asyncio``
    ``UdpSocket`` driven by the non-blocking loop vs through ``AsyncDatagramSocket``
    (informational, no target).
``switch``
    ``UdpSocket`` sender -> ``UdpSocket`` receiver directly vs through a forwarder process
    running a ``DatagramSwitch`` on a UDP carrier with a route to the receiver's PID.
    Target 0.7x. Fairness: both sides use the same sender process and loop (single-datagram
    ``try_send_to``), the same receiver loop and the same carrier settings (default offloads),
    and the sender and receiver are pinned the same way; only the hop differs. The forwarder
    regroups the sender's datagrams into GSO batches, which reach the receiver as GRO
    aggregates, so the switch side's receiver works less per datagram than the direct one;
    the informational ``switch-vs-plain`` row therefore compares the same switch trials with a
    direct receiver that has GRO off (the cheaper path for single datagrams).
``switch-cpu``
    the forwarder alone, in one process: datagrams per CPU second of the plainest Python
    forwarder (``recvfrom_into`` + ``sendto`` per datagram) vs ``DatagramSwitch.pump``, each
    draining 2,000 datagrams queued at its socket to a GRO receiver (informational, no target).

How a trial works (processes, except ``inproc``): the receiver binds and reports its address,
then the sender sends 1,200-byte datagrams for a fixed time. Rates are counted at the
receiver, between the end of its first receive and its last one. The sender is paced by a
credit window: the receiver publishes "received so far" in shared memory and the sender never
has more than ``window`` datagrams in flight, so a fast sender cannot simply overflow a slow
receiver's socket buffer (which would measure drops, not throughput). Lost datagrams (UDP may
drop) are written off after a short stall and reported. Both sides of a case use the same
driver loop, pacing and waiting strategy (``select.poll`` on the descriptor when an operation
would block, or one-shot wakers for descriptor-less sockets); only the datagram calls differ.
Sender and receiver processes are pinned to different CPUs (``--no-pin`` to disable); the
forwarder of the switch case is left to the scheduler. Every process also reports the CPU time
it used while it worked, listed below the table per case and side (share of one core and CPU
time per datagram): which process bounds a side, and the forwarder's own cost per datagram.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import os
import queue
import resource
import select
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks._common`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    BenchmarkError,
    CaseResult,
    Child,
    ChildLink,
    SharedCounters,
    Trial,
    add_run_arguments,
    alternate_sides,
    machine_facts,
    markdown_table,
    median,
    partial_run_warning,
    run_mode,
    write_json,
    write_readme_section,
)
from chrysalis.core import ConnectionId, DatagramAddr, Pid  # noqa: E402
from chrysalis.datagram import (  # noqa: E402
    DATAGRAM_BATCH_SIZE,
    AsyncDatagramSocket,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    InprocNetwork,
    SocketClosedError,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.datagram._route import Route, Router  # noqa: E402
from chrysalis.datagram._switch import DatagramSwitch  # noqa: E402

PAYLOAD_SIZE: Final = 1200
GSO_SEGMENTS: Final = DATAGRAM_BATCH_SIZE  # 32 datagrams per GSO transmit
#: The receiver's PID in the switch case; every payload starts with a QUIC short header whose
#: destination connection ID carries it, so the switch can route by PID.
DEST_PID: Final = Pid(bytes(range(1, 17)))
PAYLOAD: Final = (b"\x40" + bytes(ConnectionId.issued(DEST_PID, 1))).ljust(PAYLOAD_SIZE, b"\xa5")
GSO_PAYLOAD: Final = PAYLOAD * GSO_SEGMENTS

# Shared counters (one writer each).
RECEIVED: Final = 0  # receiver: datagrams received so far
SENT: Final = 1  # sender: datagrams sent so far (final value once DONE is set)
DONE: Final = 2  # sender: 1 once it has stopped sending
STOP: Final = 3  # parent: 1 when the forwarder must exit
_SLOTS: Final = 4

POLL_MS: Final = 1  # readiness waits are bounded so flags are seen within ~1 ms
SENDER_SLEEP_S: Final = 50e-6  # window full: sleep this long between credit checks
STALL_S: Final = 0.02  # no credit for this long with a full window: write off as lost
CHECK_EVERY: Final = 256  # sender checks the clock and the credit at least this often
DRAIN_GRACE_S: Final = 0.1  # after the sender stopped: give up on the rest after this idle time
RAW_RECV_BUFFER: Final = 2048
GRO_RECV_BUFFER: Final = 65535
SOCKET_BUFFER: Final = 8 << 20  # SO_RCVBUF/SO_SNDBUF requested by baseline and carrier alike


@dataclass(frozen=True, slots=True)
class Config:
    """How long and how often to measure."""

    rounds: int  # ABAB rounds per case
    seconds: float  # sending time per trial
    max_datagrams: int  # cap on datagrams per trial
    window: int  # credit window, datagrams in flight
    case_budget_s: float  # stop adding rounds to a case after this long

    @property
    def trial_timeout_s(self) -> float:
        """Hard limit on one trial (children are terminated after it)."""
        return self.seconds + 10.0


# Many short rounds rather than a few long ones: the median of 20 adjacent-pair ratios shrugs
# off the bursts of a shared machine better than 5 long trials would.
FULL: Final = Config(rounds=20, seconds=0.3, max_datagrams=10**9, window=1024, case_budget_s=30)
QUICK: Final = Config(rounds=5, seconds=0.15, max_datagrams=10**9, window=1024, case_budget_s=8)
SMOKE: Final = Config(rounds=1, seconds=0.5, max_datagrams=4096, window=256, case_budget_s=5)


# --------------------------------------------------------------------------------------------
# Pacing and counting (shared by every driver loop)


class Pacer:
    """The sender's credit window and stop condition.

    ``next_limit(sent)`` publishes ``sent``, then returns the total the sender may reach before
    calling again (at most ``CHECK_EVERY`` more, never more than ``window`` ahead of what the
    receiver has acknowledged), or ``-1`` when the trial is over. It sleeps while the window is
    full; if no credit arrives for ``STALL_S`` the outstanding datagrams are written off as
    lost (UDP) so a lossy run cannot stall.
    """

    __slots__ = ("_batch", "_counters", "_end", "_max", "_window", "stalls", "written_off")

    def __init__(self, counters: SharedCounters, config: Config, batch: int = 1) -> None:
        self._counters = counters
        self._window = config.window
        self._max = config.max_datagrams
        self._batch = batch
        self._end = time.perf_counter() + config.seconds
        self.written_off = 0
        self.stalls = 0

    def next_limit(self, sent: int) -> int:
        """See the class docstring."""
        counters = self._counters
        counters.set(SENT, sent)
        now = time.perf_counter()
        if sent >= self._max or now >= self._end:
            return -1
        batch = self._batch
        window = self._window
        acked = min(counters.get(RECEIVED), sent)
        if sent + batch > acked + self.written_off + window:
            progress_at = now
            while True:
                time.sleep(SENDER_SLEEP_S)
                now = time.perf_counter()
                if now >= self._end:
                    return -1
                credit = min(counters.get(RECEIVED), sent)
                if credit != acked:
                    acked = credit
                    progress_at = now
                if sent + batch <= acked + self.written_off + window:
                    break
                if now - progress_at >= STALL_S:
                    self.written_off = sent - acked
                    self.stalls += 1
                    break
        return min(acked + self.written_off + window, sent + CHECK_EVERY, self._max)

    def finish(self, sent: int) -> None:
        """Publish the final count and tell the receiver that sending is over."""
        self._counters.set(SENT, sent)
        self._counters.set(DONE, 1)


class Recorder:
    """The receiver's count and clock; ``add`` per received batch, ``idle`` when nothing came.

    The clock starts at the end of the first receive; ``idle`` says the trial is over once the
    sender is done and everything it sent arrived, or nothing arrived for ``DRAIN_GRACE_S``
    (losses), or the hard deadline passed.
    """

    __slots__ = ("_counters", "_deadline", "first", "first_total", "last", "total")

    def __init__(self, counters: SharedCounters, timeout_s: float) -> None:
        self._counters = counters
        self._deadline = time.perf_counter() + timeout_s
        self.total = 0
        self.first_total = -1
        self.first = 0.0
        self.last = time.perf_counter()

    def add(self, count: int) -> None:
        """Record ``count`` more datagrams."""
        total = self.total + count
        self.total = total
        now = time.perf_counter()
        self.last = now
        if self.first_total < 0:
            self.first = now
            self.first_total = total
        self._counters.set(RECEIVED, total)

    def idle(self) -> bool:
        """Called when nothing was ready; ``True`` when the trial is over."""
        now = time.perf_counter()
        if now >= self._deadline:
            return True
        counters = self._counters
        if not counters.get(DONE):
            return False
        return self.total >= counters.get(SENT) or now - self.last >= DRAIN_GRACE_S

    def result(self) -> tuple[int, float, int]:
        """``(counted, seconds, received)`` for :class:`Trial`."""
        if self.first_total < 0:
            return 0, 0.0, 0
        return self.total - self.first_total, self.last - self.first, self.total


# --------------------------------------------------------------------------------------------
# Waiting (the slow path of every loop)


def _fd_waiter(fds: Sequence[int], events: int) -> Callable[[], None]:
    """Poll ``fds`` for ``events`` (bounded). For writability, also yield the CPU: an
    unconnected Unix datagram socket reports "writable" while the destination's queue is
    full, and a sender spinning on it would starve a receiver that shares its core."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, events)
    poll = poller.poll
    if events & select.POLLOUT:
        yield_cpu = os.sched_yield

        def wait_writable() -> None:
            poll(POLL_MS)
            yield_cpu()

        return wait_writable

    def wait() -> None:
        poll(POLL_MS)

    return wait


def _recv_waiter(sock: DatagramSocket) -> Callable[[], None]:
    """Wait (bounded) until ``sock`` may receive: poll its descriptors, else its waker."""
    fds = sock.readiness_fds()
    if fds:
        return _fd_waiter(fds, select.POLLIN)
    event = threading.Event()

    def wait() -> None:
        event.clear()
        sock.add_recv_waker(event.set)  # called at once if a receive may already succeed
        event.wait(POLL_MS / 1000)

    return wait


def _send_waiter(sock: DatagramSocket, destination: DatagramAddr) -> Callable[[], None]:
    """Wait (bounded) until ``sock`` may send to ``destination``."""
    fd = sock.send_readiness_fd(destination)
    if fd is not None:
        return _fd_waiter([fd], select.POLLOUT)
    event = threading.Event()

    def wait() -> None:
        event.clear()
        sock.add_send_waker(destination, event.set)
        event.wait(POLL_MS / 1000)

    return wait


# --------------------------------------------------------------------------------------------
# Driver loops: one per API, all with the same shape


def send_stdlib(sock: socket.socket, address: Any, pacer: Pacer) -> int:
    """Baseline sender: non-blocking ``sendto`` of one datagram per call."""
    sendto = sock.sendto
    payload = PAYLOAD
    wait = _fd_waiter([sock.fileno()], select.POLLOUT)
    sent = 0
    limit = pacer.next_limit(0)
    while limit >= 0:
        if sent >= limit:
            limit = pacer.next_limit(sent)
            continue
        try:
            sendto(payload, address)
        except BlockingIOError:
            wait()
            continue
        sent += 1
    pacer.finish(sent)
    return sent


def send_chrysalis(sock: DatagramSocket, destination: DatagramAddr, pacer: Pacer) -> int:
    """Candidate sender: ``try_send_to`` of one datagram per call."""
    send = sock.try_send_to
    payload = PAYLOAD
    wait = _send_waiter(sock, destination)
    sent = 0
    limit = pacer.next_limit(0)
    while limit >= 0:
        if sent >= limit:
            limit = pacer.next_limit(sent)
            continue
        if send(payload, destination):
            sent += 1
        else:
            wait()
    pacer.finish(sent)
    return sent


def send_transmit(sock: DatagramSocket, destination: DatagramAddr, pacer: Pacer) -> int:
    """Candidate sender: ``try_send_transmit`` of 32 x 1,200-byte segments per call (GSO)."""
    full = DatagramTransmit(destination, GSO_PAYLOAD, PAYLOAD_SIZE)
    count = full.segment_count
    send = sock.try_send_transmit
    wait = _send_waiter(sock, destination)
    transmit = full
    sent = 0
    limit = pacer.next_limit(0)
    while limit >= 0:
        if limit - sent < count:
            limit = pacer.next_limit(sent)
            if 0 <= limit < sent + count:
                break  # the datagram cap leaves no room for a whole transmit
            continue
        accepted = send(transmit)
        if accepted == 0:
            wait()
            continue
        sent += accepted
        transmit = full if accepted == transmit.segment_count else transmit.suffix(accepted)
    pacer.finish(sent)
    return sent


def recv_stdlib(sock: socket.socket, recorder: Recorder) -> None:
    """Baseline receiver: drain up to 32 ``recvfrom_into`` calls, then record the batch.

    Each datagram of a batch lands in its own buffer, as with the candidate's ``try_recv``
    (32 buffers of the same size): a receiver that drains a batch before handling it must
    keep every datagram, and overwriting one hot buffer would spare the baseline the cache
    traffic of the buffers the candidate fills."""
    receive = sock.recvfrom_into
    buffers = [bytearray(RAW_RECV_BUFFER) for _ in range(DATAGRAM_BATCH_SIZE)]
    batch = DATAGRAM_BATCH_SIZE
    wait = _fd_waiter([sock.fileno()], select.POLLIN)
    while True:
        got = 0
        try:
            while got < batch:
                receive(buffers[got])
                got += 1
        except BlockingIOError:
            pass
        if got:
            recorder.add(got)
        elif recorder.idle():
            return
        else:
            wait()


def recv_chrysalis(sock: DatagramSocket, recorder: Recorder, buffer_size: int) -> None:
    """Candidate receiver: ``try_recv`` into 32 caller-owned buffers, then record the batch
    (GRO aggregates count as the datagrams they hold)."""
    buffers = [bytearray(buffer_size) for _ in range(DATAGRAM_BATCH_SIZE)]
    metas: list[DatagramRecvMeta] = []
    receive = sock.try_recv
    wait = _recv_waiter(sock)
    aggregates = sock.max_receive_segments > 1
    while True:
        got = receive(buffers, metas)
        if got:
            if aggregates:
                got = sum(meta.segment_count for meta in metas)
            metas.clear()
            recorder.add(got)
        elif recorder.idle():
            return
        else:
            wait()


async def send_asyncio(sock: DatagramSocket, destination: DatagramAddr, pacer: Pacer) -> int:
    """Candidate sender through the asyncio adapter: ``await send_to`` per datagram."""
    send = AsyncDatagramSocket(sock).send_to
    payload = PAYLOAD
    sent = 0
    limit = pacer.next_limit(0)
    while limit >= 0:
        if sent >= limit:
            limit = pacer.next_limit(sent)
            continue
        await send(payload, destination)
        sent += 1
    pacer.finish(sent)
    return sent


async def recv_asyncio(sock: DatagramSocket, recorder: Recorder) -> None:
    """Candidate receiver through the asyncio adapter: ``await recv`` drains a batch per
    wake. A watchdog task ends the trial by shutting the socket down (``recv`` then raises
    :class:`SocketClosedError`); it wakes once per ``POLL_MS``."""
    adapter = AsyncDatagramSocket(sock)
    buffers = [bytearray(RAW_RECV_BUFFER) for _ in range(DATAGRAM_BATCH_SIZE)]
    metas: list[DatagramRecvMeta] = []

    async def watchdog() -> None:
        while not recorder.idle():
            await asyncio.sleep(POLL_MS / 1000)
        sock.shutdown()

    task = asyncio.create_task(watchdog())
    try:
        receive = adapter.recv
        while True:
            try:
                got = await receive(buffers, metas)
            except SocketClosedError:
                return
            metas.clear()
            recorder.add(got)
    finally:
        task.cancel()


# --------------------------------------------------------------------------------------------
# Endpoints of each kind


def _raw_udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def _raw_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.bind(path)
    sock.setblocking(False)
    return sock


def _chrysalis_udp(*, gso: bool | None, gro: bool | None) -> UdpSocket:
    return UdpSocket.bind(
        DatagramAddr.udp("127.0.0.1", 0),
        recv_buffer=SOCKET_BUFFER,
        send_buffer=SOCKET_BUFFER,
        gso=gso,
        gro=gro,
    )


def _chrysalis_unix(path: str) -> DatagramSocket:
    return UnixDatagramSocket.bind(path, send_buffer=SOCKET_BUFFER, recv_buffer=SOCKET_BUFFER)


def _close(sock: DatagramSocket) -> None:
    sock.shutdown()
    if not sock.join(5.0):
        raise BenchmarkError(f"{sock!r} did not release its resources within 5 s")


# Endpoint kinds, named "<api>-<carrier>[-variant]".
RAW_UDP: Final = "raw-udp"
CHR_UDP: Final = "chrysalis-udp"  # GSO and GRO off
CHR_UDP_GSO: Final = "chrysalis-udp-gso"  # sender: GSO transmits; receiver: GRO
CHR_UDP_AUTO: Final = "chrysalis-udp-auto"  # single-datagram sends, offloads as bind() picks
CHR_UDP_ASYNC: Final = "chrysalis-udp-asyncio"  # as CHR_UDP, through AsyncDatagramSocket
RAW_UNIX: Final = "raw-unix"
CHR_UNIX: Final = "chrysalis-unix"


def _chrysalis_endpoint(kind: str, path: str, *, receiver: bool) -> DatagramSocket:
    """A bound carrier socket for endpoint ``kind`` (receivers of the GSO kind enable GRO)."""
    if kind in (CHR_UDP, CHR_UDP_ASYNC):
        return _chrysalis_udp(gso=False, gro=False)
    if kind == CHR_UDP_GSO:  # offloads where the kernel has them
        return _chrysalis_udp(gso=None, gro=None if receiver else False)
    if kind == CHR_UDP_AUTO:
        return UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
    if kind == CHR_UNIX:
        return _chrysalis_unix(path)
    raise BenchmarkError(f"unknown endpoint kind {kind!r}")


def _cpu_seconds() -> float:
    """CPU time (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Busy:
    """How much CPU a process used while it worked, from construction to :meth:`used`."""

    __slots__ = ("_cpu", "_wall")

    def __init__(self) -> None:
        self._cpu = _cpu_seconds()
        self._wall = time.perf_counter()

    def used(self) -> tuple[float, float]:
        """``(CPU seconds, wall-clock seconds)`` so far."""
        return _cpu_seconds() - self._cpu, time.perf_counter() - self._wall


def receiver_main(
    link: ChildLink, counters: SharedCounters, config: Config, kind: str, path: str
) -> None:
    """Child process: bind a receiver of ``kind``, report its address, receive, then report
    ``(counted, seconds, received, (CPU seconds, wall seconds))``."""
    recorder_timeout = config.trial_timeout_s - 2.0
    if kind in (RAW_UDP, RAW_UNIX):
        raw = _raw_udp() if kind == RAW_UDP else _raw_unix(path)
        try:
            link.send(raw.getsockname())
            recorder = Recorder(counters, recorder_timeout)
            busy = Busy()
            recv_stdlib(raw, recorder)
            used = busy.used()
        finally:
            raw.close()
    else:
        sock = _chrysalis_endpoint(kind, path, receiver=True)
        try:
            link.send(sock.local_addr)
            recorder = Recorder(counters, recorder_timeout)
            busy = Busy()
            if kind == CHR_UDP_ASYNC:
                asyncio.run(recv_asyncio(sock, recorder))
            else:
                size = GRO_RECV_BUFFER if sock.max_receive_segments > 1 else RAW_RECV_BUFFER
                recv_chrysalis(sock, recorder, size)
            used = busy.used()
        finally:
            _close(sock)
    link.send((*recorder.result(), used))


def sender_main(
    link: ChildLink,
    counters: SharedCounters,
    config: Config,
    kind: str,
    path: str,
    destination: Any,
) -> None:
    """Child process: bind a sender of ``kind``, send to ``destination`` until done, then
    report ``(sent, (CPU seconds, wall seconds))``."""
    if kind in (RAW_UDP, RAW_UNIX):
        raw = _raw_udp() if kind == RAW_UDP else _raw_unix(path)
        try:
            busy = Busy()
            sent = send_stdlib(raw, destination, Pacer(counters, config))
            used = busy.used()
        finally:
            raw.close()
        link.send((sent, used))
        return
    sock = _chrysalis_endpoint(kind, path, receiver=False)
    try:
        busy = Busy()
        if kind == CHR_UDP_GSO:
            sent = send_transmit(sock, destination, Pacer(counters, config, GSO_SEGMENTS))
        elif kind == CHR_UDP_ASYNC:
            sent = asyncio.run(send_asyncio(sock, destination, Pacer(counters, config)))
        else:
            sent = send_chrysalis(sock, destination, Pacer(counters, config))
        used = busy.used()
    finally:
        _close(sock)
    link.send((sent, used))


def forwarder_main(link: ChildLink, counters: SharedCounters, receiver: DatagramAddr) -> None:
    """Child process: a ``DatagramSwitch`` on a UDP carrier routing ``DEST_PID`` to
    ``receiver``, pumped from this thread until the parent sets ``STOP``.

    The loop is the one an application would write: ``pump`` drains what is ready (it stops
    after a batch that did not fill its buffers), then wait for readability (returns at once
    if more arrived meanwhile)."""
    router = Router()
    router.insert(DEST_PID, Route.permanent(receiver))
    switch = DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), router)
    try:
        carrier = switch.carrier
        link.send(carrier.local_addr)
        wait = _recv_waiter(carrier)
        pump = switch.pump
        busy = Busy()
        pumps = 0
        while not counters.get(STOP):
            if pump(8):
                pumps += 1
            wait()
        used = busy.used()
        stats = switch.statistics()
        link.send(
            {
                "received": stats.received,
                "dropped": {reason.name: count for reason, count in stats.dropped.items() if count},
                "router_dropped": {
                    reason.name: count
                    for reason, count in router.statistics().dropped.items()
                    if count
                },
                "datagrams_per_pump": round(stats.received / pumps, 1) if pumps else 0.0,
                "cpu_wall_s": used,
            }
        )
    finally:
        switch.shutdown()
        if not switch.join(5.0):
            raise BenchmarkError("the datagram switch did not shut down within 5 s")


# --------------------------------------------------------------------------------------------
# The forwarder's CPU cost, in one process (the switch-cpu case)

FORWARD_BATCH: Final = 2000  # datagrams queued at the forwarder before each timed drain
RAW_FORWARDER: Final = "raw-forwarder"
SWITCH_FORWARDER: Final = "switch-forwarder"


def forward_cpu_main(link: ChildLink, config: Config, kind: str) -> None:
    """Child process: queue ``FORWARD_BATCH`` datagrams at a forwarder's socket, then forward
    them all to a GRO receiver, timing only the forwarding with the process CPU clock; repeat
    for the trial's sending time. Reports ``(forwarded, CPU seconds, received, queued)``.

    ``kind`` is the plainest Python forwarder (``recvfrom_into`` and ``sendto`` per datagram)
    or a ``DatagramSwitch`` (default UDP offloads) pumped until its socket is empty. Nothing
    else runs in the process, so CPU time is the forwarder's own cost, kernel work included,
    and it moves far less with the machine's load than a rate between processes does.
    """
    tx = _raw_udp()
    rx = _raw_udp()
    with contextlib.suppress(OSError):  # UDP_GRO, as the receiver of the switch case has
        rx.setsockopt(17, 104, 1)
    target = DatagramAddr.from_sockaddr(rx.getsockname())
    switch = None
    raw = None
    if kind == SWITCH_FORWARDER:
        router = Router()
        router.insert(DEST_PID, Route.permanent(target))
        switch = DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), router)
        address = switch.carrier.local_addr.to_sockaddr()
    elif kind == RAW_FORWARDER:
        raw = _raw_udp()
        address = raw.getsockname()
    else:
        raise BenchmarkError(f"unknown forwarder kind {kind!r}")
    scratch = bytearray(GRO_RECV_BUFFER)
    forwarded = received = queued = 0
    cpu = 0.0
    end = time.perf_counter() + config.seconds
    try:
        while queued == 0 or (time.perf_counter() < end and queued < config.max_datagrams):
            for _ in range(FORWARD_BATCH):
                tx.sendto(PAYLOAD, address)
            queued += FORWARD_BATCH
            start = time.process_time()
            if switch is not None:
                pump = switch.pump
                while pump(8):
                    pass
                done = switch.statistics().received
            else:
                assert raw is not None
                done = forwarded + _forward_raw(raw, rx.getsockname())
            cpu += time.process_time() - start
            forwarded = done
            received += _drain_gro(rx, scratch, queued - received)
    finally:
        if switch is not None:
            switch.shutdown()
            switch.join(5.0)
        for sock in (tx, rx, raw):
            if sock is not None:
                sock.close()
    link.send((forwarded, cpu, received, queued))


def _forward_raw(sock: socket.socket, destination: Any) -> int:
    """The plainest forwarder: receive and send one datagram at a time until none is left."""
    receive = sock.recvfrom_into
    send = sock.sendto
    buffer = bytearray(RAW_RECV_BUFFER)
    view = memoryview(buffer)
    count = 0
    while True:
        try:
            size, _ = receive(buffer)
        except BlockingIOError:
            return count
        send(view[:size], destination)
        count += 1


def _drain_gro(sock: socket.socket, buffer: bytearray, expected: int) -> int:
    """Receive (not timed) until ``expected`` datagrams arrived or nothing came for 100 ms;
    the number received (GRO aggregates count as the datagrams they hold)."""
    got = 0
    while got < expected:
        ready, _, _ = select.select([sock], [], [], DRAIN_GRACE_S)
        if not ready:
            break
        while got < expected:
            try:
                size, ancdata, _, _ = sock.recvmsg_into([buffer], socket.CMSG_SPACE(4))
            except BlockingIOError:
                break
            stride = size
            for level, kind, data in ancdata:
                if level == 17 and kind == 104:
                    stride = struct.unpack("@i", data[:4])[0]
            got += -(-size // stride) if 0 < stride < size else 1
    return got


# --------------------------------------------------------------------------------------------
# Trials


class Bench:
    """Runs trials; owns the shared counters and a scratch directory for Unix socket files."""

    def __init__(self, config: Config, *, pin: bool) -> None:
        self.config = config
        cpus = sorted(os.sched_getaffinity(0)) if pin else []
        # Sender and receiver on different CPUs (the forwarder floats): without pinning, a
        # busy machine sometimes puts both on one core, which makes rounds bimodal.
        self._sender_cpu = cpus[0] if len(cpus) >= 2 else None
        self._receiver_cpu = cpus[1] if len(cpus) >= 2 else None
        self.counters = SharedCounters(_SLOTS)
        self._tmp = tempfile.mkdtemp(prefix="chrysalis-bench-")
        self._serial = 0
        self.forwarder_stats: list[dict[str, Any]] = []
        #: Per process-pair trial, in order: each process's CPU share (``<role>_share``: CPU
        #: seconds over wall seconds) and CPU microseconds per received datagram
        #: (``<role>_us``), roles ``sender``, ``forwarder``, ``receiver`` (see ``Busy``).
        self.usage: list[dict[str, float]] = []

    def close(self) -> None:
        """Remove the scratch directory."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _path(self, role: str) -> str:
        self._serial += 1
        return os.path.join(self._tmp, f"{role}-{self._serial}.sock")

    def pair(self, receiver_kind: str, sender_kind: str, *, via_switch: bool = False) -> Trial:
        """One trial: receiver and sender in two processes (plus a forwarder process)."""
        config = self.config
        counters = self.counters
        counters.reset()
        timeout = config.trial_timeout_s
        children: list[Child] = []
        try:
            receiver = Child(
                receiver_main,
                counters,
                config,
                receiver_kind,
                self._path("rx"),
                name=f"receiver[{receiver_kind}]",
                cpu=self._receiver_cpu,
            ).start()
            children.append(receiver)
            destination = receiver.receive(timeout)
            forwarder = None
            if via_switch:
                assert isinstance(destination, DatagramAddr)
                forwarder = Child(forwarder_main, counters, destination, name="forwarder").start()
                children.append(forwarder)
                destination = forwarder.receive(timeout)
            if sender_kind in (RAW_UDP, RAW_UNIX) and isinstance(destination, DatagramAddr):
                # A raw sender to a carrier's receiver (the --case *-recv diagnostics).
                destination = (
                    destination.to_sockaddr() if sender_kind == RAW_UDP else destination.opaque
                )
            sender = Child(
                sender_main,
                counters,
                config,
                sender_kind,
                self._path("tx"),
                destination,
                name=f"sender[{sender_kind}]",
                cpu=self._sender_cpu,
            ).start()
            children.append(sender)
            sent, sender_used = _sender_result(sender.receive(timeout))
            counted, seconds, received, receiver_used = _result(receiver.receive(timeout))
            used = {"sender": sender_used, "receiver": receiver_used}
            if forwarder is not None:
                counters.set(STOP, 1)
                stats = forwarder.receive(timeout)
                assert isinstance(stats, dict)
                self.forwarder_stats.append(stats)
                used["forwarder"] = _used(stats["cpu_wall_s"])
            usage: dict[str, float] = {}
            for role, (cpu, wall) in used.items():
                usage[f"{role}_share"] = cpu / wall if wall > 0 else 0.0
                usage[f"{role}_us"] = cpu / received * 1e6 if received else 0.0
            self.usage.append(usage)
            return Trial(counted, seconds, received, sent)
        finally:
            counters.set(STOP, 1)
            for child in reversed(children):
                child.stop(5.0)

    def forward_cpu(self, kind: str) -> Trial:
        """One forwarder-cost trial (``forward_cpu_main``): the rate is datagrams per CPU
        second of the forwarder."""
        child = Child(forward_cpu_main, self.config, kind, name=f"forward-cpu[{kind}]").start()
        try:
            counted, seconds, received, sent = _result4(child.receive(self.config.trial_timeout_s))
            return Trial(counted, seconds, received, sent)
        finally:
            child.stop(5.0)

    def threads(self, kind: str) -> Trial:
        """One in-process trial: sender and receiver threads in one child process."""
        counters = self.counters
        counters.reset()
        child = Child(inproc_main, counters, self.config, kind, name=f"inproc[{kind}]").start()
        try:
            counted, seconds, received, sent = _result4(child.receive(self.config.trial_timeout_s))
            return Trial(counted, seconds, received, sent)
        finally:
            child.stop(5.0)


def _used(value: object) -> tuple[float, float]:
    if not (isinstance(value, tuple) and len(value) == 2):
        raise BenchmarkError(f"malformed CPU usage {value!r:.200}")
    return float(value[0]), float(value[1])


def _result(value: object) -> tuple[int, float, int, tuple[float, float]]:
    if not (isinstance(value, tuple) and len(value) == 4):
        raise BenchmarkError(f"malformed receiver result {value!r:.200}")
    counted, seconds, received, used = value
    return int(counted), float(seconds), int(received), _used(used)


def _sender_result(value: object) -> tuple[int, tuple[float, float]]:
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], int)):
        raise BenchmarkError(f"malformed sender result {value!r:.200}")
    sent, used = value
    return sent, _used(used)


def _result4(value: object) -> tuple[int, float, int, int]:
    if not (isinstance(value, tuple) and len(value) == 4):
        raise BenchmarkError(f"malformed in-process result {value!r:.200}")
    counted, seconds, received, sent = value
    return int(counted), float(seconds), int(received), int(sent)


# --------------------------------------------------------------------------------------------
# The in-process case: two threads, one process


class _Handoff:
    """The informational in-process reference: a bare bounded deque plus one-shot wakers in
    each direction (no lock, no source addresses, a bound checked without a lock)."""

    __slots__ = ("capacity", "queue", "recv_waker", "send_waker")

    def __init__(self, capacity: int) -> None:
        self.queue: collections.deque[bytes] = collections.deque()
        self.capacity = capacity
        self.recv_waker: Callable[[], None] | None = None
        self.send_waker: Callable[[], None] | None = None


def send_handoff(handoff: _Handoff, pacer: Pacer) -> int:
    """Reference sender thread: append while below capacity, else wait for the receiver."""
    queue = handoff.queue
    append = queue.append
    capacity = handoff.capacity
    payload = PAYLOAD
    event = threading.Event()
    sent = 0
    limit = pacer.next_limit(0)
    while limit >= 0:
        if sent >= limit:
            limit = pacer.next_limit(sent)
            continue
        if len(queue) < capacity:
            append(payload)
            sent += 1
            waker = handoff.recv_waker
            if waker is not None:
                handoff.recv_waker = None
                waker()
            continue
        event.clear()
        handoff.send_waker = event.set
        if len(queue) < capacity:
            continue
        event.wait(POLL_MS / 1000)
    pacer.finish(sent)
    return sent


def recv_handoff(handoff: _Handoff, recorder: Recorder) -> None:
    """Reference receiver thread: pop up to 32 items into caller-owned buffers."""
    queue = handoff.queue
    popleft = queue.popleft
    views = [memoryview(bytearray(RAW_RECV_BUFFER)) for _ in range(DATAGRAM_BATCH_SIZE)]
    batch = DATAGRAM_BATCH_SIZE
    event = threading.Event()
    while True:
        got = 0
        while got < batch and queue:
            item = popleft()
            views[got][: len(item)] = item
            got += 1
        if got:
            waker = handoff.send_waker
            if waker is not None:
                handoff.send_waker = None
                waker()
            recorder.add(got)
            continue
        if recorder.idle():
            return
        event.clear()
        handoff.recv_waker = event.set
        if queue:
            continue
        event.wait(POLL_MS / 1000)


class _QueueHandoff:
    """The in-process baseline: the standard library's bounded, thread-safe handoff
    (``queue.Queue``) carrying ``(source, bytes)`` pairs, plus one-shot wakers in each
    direction (the same waiting scheme as the deque handoff and the carrier)."""

    __slots__ = ("queue", "recv_waker", "send_waker", "source")

    def __init__(self, capacity: int, source: DatagramAddr) -> None:
        self.queue: queue.Queue[tuple[DatagramAddr, bytes]] = queue.Queue(maxsize=capacity)
        self.source = source
        self.recv_waker: Callable[[], None] | None = None
        self.send_waker: Callable[[], None] | None = None


def send_queue(handoff: _QueueHandoff, pacer: Pacer) -> int:
    """Baseline sender thread: ``put_nowait`` a ``(source, payload)`` pair, else wait for the
    receiver."""
    fifo = handoff.queue
    put = fifo.put_nowait
    full = queue.Full
    source = handoff.source
    payload = PAYLOAD
    event = threading.Event()
    sent = 0
    limit = pacer.next_limit(0)
    while limit >= 0:
        if sent >= limit:
            limit = pacer.next_limit(sent)
            continue
        try:
            put((source, payload))
        except full:
            event.clear()
            handoff.send_waker = event.set
            if not fifo.full():
                continue
            event.wait(POLL_MS / 1000)
            continue
        sent += 1
        waker = handoff.recv_waker
        if waker is not None:
            handoff.recv_waker = None
            waker()
    pacer.finish(sent)
    return sent


def recv_queue(handoff: _QueueHandoff, recorder: Recorder) -> None:
    """Baseline receiver thread: ``get_nowait`` up to 32 pairs into caller-owned buffers."""
    fifo = handoff.queue
    get = fifo.get_nowait
    empty = queue.Empty
    buffers = [bytearray(RAW_RECV_BUFFER) for _ in range(DATAGRAM_BATCH_SIZE)]
    batch = DATAGRAM_BATCH_SIZE
    event = threading.Event()
    while True:
        got = 0
        try:
            while got < batch:
                _source, item = get()
                buffers[got][: len(item)] = item
                got += 1
        except empty:
            pass
        if got:
            waker = handoff.send_waker
            if waker is not None:
                handoff.send_waker = None
                waker()
            recorder.add(got)
            continue
        if recorder.idle():
            return
        event.clear()
        handoff.recv_waker = event.set
        if not fifo.empty():
            continue
        event.wait(POLL_MS / 1000)


RAW_INPROC: Final = "queue-threads"
DEQUE_INPROC: Final = "deque-threads"
CHR_INPROC: Final = "inproc-threads"


def inproc_main(link: ChildLink, counters: SharedCounters, config: Config, kind: str) -> None:
    """Child process: one sender thread and one receiver thread of ``kind``."""
    network = InprocNetwork()
    recorder = Recorder(counters, config.trial_timeout_s - 2.0)
    sent_box: list[int] = []
    errors: list[BaseException] = []
    if kind == RAW_INPROC:
        fifo = _QueueHandoff(network.queue_capacity, DatagramAddr.inproc(network.network_id, 1))

        def receive() -> None:
            recv_queue(fifo, recorder)

        def send() -> None:
            sent_box.append(send_queue(fifo, Pacer(counters, config)))

    elif kind == DEQUE_INPROC:
        handoff = _Handoff(network.queue_capacity)

        def receive() -> None:
            recv_handoff(handoff, recorder)

        def send() -> None:
            sent_box.append(send_handoff(handoff, Pacer(counters, config)))

    elif kind == CHR_INPROC:
        rx = network.bind()
        tx = network.bind()

        def receive() -> None:
            recv_chrysalis(rx, recorder, RAW_RECV_BUFFER)

        def send() -> None:
            sent_box.append(send_chrysalis(tx, rx.local_addr, Pacer(counters, config)))

    else:
        raise BenchmarkError(f"unknown in-process kind {kind!r}")

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)
                counters.set(DONE, 1)

        return run

    receiver = threading.Thread(target=guarded(receive), name="receiver", daemon=True)
    sender = threading.Thread(target=guarded(send), name="sender", daemon=True)
    receiver.start()
    sender.start()
    sender.join(config.trial_timeout_s)
    receiver.join(config.trial_timeout_s)
    if kind == CHR_INPROC:
        _close(tx)
        _close(rx)
    if errors:
        raise errors[0]
    if sender.is_alive() or receiver.is_alive() or not sent_box:
        raise BenchmarkError("in-process threads did not finish in time")
    counted, seconds, received = recorder.result()
    link.send((counted, seconds, received, sent_box[0]))


# --------------------------------------------------------------------------------------------
# GSO / GRO detection


def probe_offload() -> dict[str, Any]:
    """What the kernel offers: GSO (``UDP_SEGMENT``) and GRO aggregation on loopback."""
    info: dict[str, Any] = {"gso": False, "gro": False, "gro_aggregates": False}
    try:
        with _raw_udp() as rx, _raw_udp() as tx:
            try:
                tx.getsockopt(17, 103)
                info["gso"] = True
            except OSError:
                return info
            try:
                rx.setsockopt(17, 104, 1)
                info["gro"] = True
            except OSError:
                return info
            tx.sendmsg(
                [PAYLOAD * 2], [(17, 103, struct.pack("@H", PAYLOAD_SIZE))], 0, rx.getsockname()
            )
            ready, _, _ = select.select([rx], [], [], 1.0)
            if ready:
                size, ancdata, _, _ = rx.recvmsg_into(
                    [bytearray(GRO_RECV_BUFFER)], socket.CMSG_SPACE(4)
                )
                info["gro_aggregates"] = size == 2 * PAYLOAD_SIZE and any(
                    level == 17 and kind == 104 for level, kind, _ in ancdata
                )
    except OSError as exc:
        info["error"] = str(exc)
    return info


# --------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True, slots=True)
class Reference:
    """An extra, informational baseline for a case: its trials run in the same rounds as the
    case (``A B R A B R ...``) and are compared with the case's candidate trials in a table row
    of their own, ``name``, without a target."""

    name: str
    label: str
    run: Callable[[], Trial]
    note: str


#: ``CaseResult.extra`` key marking a reference row (its value names the case it belongs to).
REFERENCE_OF: Final = "reference_of"
#: ``CaseResult.extra`` key of the medians of ``Bench.usage`` per side.
CPU_USE: Final = "cpu"


def _median_usage(usage: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median of every ``Bench.usage`` figure over ``usage`` (one dict per trial)."""
    keys = sorted({key for trial in usage for key in trial})
    return {key: round(median([trial[key] for trial in usage if key in trial]), 2) for key in keys}


def _usage_text(use: dict[str, dict[str, float]]) -> str:
    def side(values: dict[str, float]) -> str:
        roles = [role for role in ("sender", "forwarder", "receiver") if f"{role}_us" in values]
        return ", ".join(
            f"{role} {values[f'{role}_share']:.2f} ({values[f'{role}_us']:.1f} µs)"
            for role in roles
        )

    return f"baseline {side(use['baseline'])}; candidate {side(use['candidate'])}"


def run_cases(bench: Bench, offload: dict[str, Any], only: Sequence[str]) -> list[CaseResult]:
    """Run every selected case (ABAB) and return its table rows, in order.

    A case with a :class:`Reference` contributes two rows: the case, then the reference row
    (``extra[REFERENCE_OF]`` names the case; the case's ``extra["reference"]`` holds the
    reference row's JSON record).
    """
    config = bench.config
    results: list[CaseResult] = []

    def case(
        name: str,
        baseline_label: str,
        candidate_label: str,
        target: float | None,
        baseline: Callable[[], Trial],
        candidate: Callable[[], Trial],
        note: str = "",
        extra: dict[str, Any] | None = None,
        reference: Reference | None = None,
        diagnostic: bool = False,
    ) -> None:
        if (only or diagnostic) and name not in only:
            return  # diagnostic cases run only when named
        print(f"[{name}] {baseline_label} vs {candidate_label} ...", file=sys.stderr, flush=True)
        sides = [baseline, candidate] if reference is None else [baseline, candidate, reference.run]
        first_usage = len(bench.usage)
        trials = alternate_sides(sides, config.rounds, budget_s=config.case_budget_s)
        base, cand = trials[0], trials[1]
        result = CaseResult(
            name, baseline_label, candidate_label, target, base, cand, note, extra or {}
        )
        usage = bench.usage[first_usage:]
        side_usage: list[dict[str, float]] = []
        if len(usage) == sum(len(t) for t in trials):  # every side ran process pairs (ABAB)
            side_usage = [_median_usage(usage[k :: len(sides)]) for k in range(len(sides))]
            result.extra[CPU_USE] = {"baseline": side_usage[0], "candidate": side_usage[1]}
        results.append(result)
        print(
            f"[{name}] ratio {result.ratio:.2f}x (rounds {len(base)})", file=sys.stderr, flush=True
        )
        if reference is not None:
            row = CaseResult(
                reference.name,
                reference.label,
                candidate_label,
                None,
                trials[2],
                cand,
                reference.note,
                {REFERENCE_OF: name},
            )
            if side_usage:
                row.extra[CPU_USE] = {"baseline": side_usage[2], "candidate": side_usage[1]}
            result.extra["reference"] = row.to_json()
            results.append(row)
            print(
                f"[{reference.name}] ratio {row.ratio:.2f}x (informational)",
                file=sys.stderr,
                flush=True,
            )

    case(
        "udp",
        "raw UDP sendto/recvfrom_into",
        "UdpSocket (no GSO/GRO)",
        0.9,
        lambda: bench.pair(RAW_UDP, RAW_UDP),
        lambda: bench.pair(CHR_UDP, CHR_UDP),
        "two processes over loopback; sender paced by a credit window",
    )
    gso_ok = bool(offload["gso"])
    case(
        "udp-gso",
        "raw UDP sendto/recvfrom_into",
        "UdpSocket GSO x32 -> GRO receiver",
        2.0 if gso_ok else None,
        lambda: bench.pair(RAW_UDP, RAW_UDP),
        lambda: bench.pair(CHR_UDP_GSO, CHR_UDP_GSO),
        "kernel GSO/GRO detected"
        if gso_ok
        else "kernel has no UDP GSO: the carrier falls back to one sendto per datagram",
        {"offload": offload},
    )
    case(
        "unixgram",
        "raw AF_UNIX sendto/recvfrom_into",
        "UnixDatagramSocket",
        0.9,
        lambda: bench.pair(RAW_UNIX, RAW_UNIX),
        lambda: bench.pair(CHR_UNIX, CHR_UNIX),
        "two processes; the kernel queue never drops (a full queue blocks the sender)",
    )
    for name, raw_kind, carrier_kind, label in (
        ("unixgram-recv", RAW_UNIX, CHR_UNIX, "UnixDatagramSocket"),
        ("udp-recv", RAW_UDP, CHR_UDP, "UdpSocket (no GRO)"),
    ):
        case(
            name,
            f"raw sender, raw receiver ({raw_kind})",
            f"raw sender, {label} receiver",
            None,
            functools.partial(bench.pair, raw_kind, raw_kind),
            functools.partial(bench.pair, carrier_kind, raw_kind),
            "diagnostic, only with --case: the receiver alone, behind the baseline's sender",
            diagnostic=True,
        )
    case(
        "inproc",
        "queue.Queue + wakers (threads)",
        "InprocNetwork (threads)",
        0.9,
        lambda: bench.threads(RAW_INPROC),
        lambda: bench.threads(CHR_INPROC),
        "two threads of one process (the carrier is in-process by definition); the baseline "
        "is the stdlib's bounded thread-safe queue carrying (source, bytes) pairs",
        reference=Reference(
            "inproc-deque",
            "bare deque + wakers (threads)",
            lambda: bench.threads(DEQUE_INPROC),
            "informational: the inproc candidate trials against a bare deque handoff (no lock, "
            "no source address); not a thread-safe bounded carrier, so no target",
        ),
    )
    case(
        "udp-asyncio",
        "UdpSocket, non-blocking loop",
        "UdpSocket via AsyncDatagramSocket",
        None,
        lambda: bench.pair(CHR_UDP, CHR_UDP),
        lambda: bench.pair(CHR_UDP_ASYNC, CHR_UDP_ASYNC),
        "informational: the asyncio adapter's cost over the runtime-neutral loop "
        "(no GSO/GRO on either side)",
    )
    start = len(bench.forwarder_stats)
    case(
        "switch",
        "UdpSocket direct",
        "UdpSocket via DatagramSwitch",
        0.7,
        lambda: bench.pair(CHR_UDP_AUTO, CHR_UDP_AUTO),
        lambda: bench.pair(CHR_UDP_AUTO, CHR_UDP_AUTO, via_switch=True),
        "three processes (sender, forwarder, receiver) vs two; default UdpSocket offloads "
        "(GSO on, GRO on) everywhere, as a node binds its carrier",
        reference=Reference(
            "switch-vs-plain",
            "UdpSocket direct, receiver GRO off",
            lambda: bench.pair(CHR_UDP, CHR_UDP_AUTO),
            "informational: the same switch trials against the cheapest direct receiver: "
            "single datagrams gain nothing from GRO, whose receive path costs more per "
            "datagram, while the switch's regrouped batches reach its receiver as GRO "
            "aggregates; this row shows how much of the switch's ratio comes from that",
        ),
    )
    case(
        "switch-cpu",
        "raw Python forwarder",
        "DatagramSwitch.pump",
        None,
        lambda: bench.forward_cpu(RAW_FORWARDER),
        lambda: bench.forward_cpu(SWITCH_FORWARDER),
        "informational: the forwarder alone, in one process: 2,000 datagrams queued at its "
        "socket, then forwarded to a GRO receiver; rates are datagrams per CPU second of the "
        "forwarder (kernel work included), against the plainest Python forwarder "
        "(`recvfrom_into` + `sendto` per datagram)",
    )
    for result in results:
        if result.name == "switch":
            result.extra["forwarder"] = bench.forwarder_stats[start:]
    return results


# --------------------------------------------------------------------------------------------
# Output


README_SECTION: Final = "## Benchmark"


def report(results: Sequence[CaseResult], meta: dict[str, Any]) -> str:
    """The Markdown section: how it was run, then the table."""
    offload = meta["offload"]
    lines = [
        README_SECTION,
        "",
        f"Measured {meta['date']} on {meta['machine']} with `{meta['command']}` "
        f"(Python {meta['python']}, Linux {meta['kernel']}).",
        "",
        "Datagrams per second for 1,200-byte payloads, counted at the receiver; one sending and "
        "one receiving process per trial (the in-process rows use two threads). Baseline and "
        "candidate runs alternate (ABAB); rates are medians, the ratio is the median of the "
        "per-round ratios. How it is measured: `benchmarks/README.md`.",
        "",
        markdown_table(results),
        "",
    ]
    lines += partial_run_warning(meta["mode"])
    lines += [
        f"Kernel offload: GSO {'yes' if offload['gso'] else 'no'}, GRO "
        f"{'yes' if offload['gro'] else 'no'}, GRO aggregation on loopback "
        f"{'observed' if offload['gro_aggregates'] else 'not observed'}.",
        "",
    ]
    for result in results:
        if result.note:
            lines.append(f"- `{result.name}`: {result.note}.")
    uses = [(r.name, r.extra[CPU_USE]) for r in results if CPU_USE in r.extra]
    if uses:
        lines += [
            "",
            "CPU use of each process while it ran, medians over the trials: the share of one "
            "core (1.00 = busy all the time; a side whose processes all stay well below 1.00 "
            "was slowed by something else, such as other jobs or waiting for each other) and, "
            "in brackets, CPU time per datagram received:",
            "",
        ]
        lines += [f"- `{name}`: {_usage_text(use)}." for name, use in uses]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="fewer, shorter rounds",
        smoke="a few thousand datagrams per trial, one round: proves the script works",
        json_help="also write the results as JSON to this file",
        cases=(),
        case_help="run only this case (repeatable): udp, udp-gso, unixgram, inproc (with its "
        "informational inproc-deque row), udp-asyncio, switch (with its informational "
        "switch-vs-plain row), switch-cpu; diagnostics run only when named: unixgram-recv, "
        "udp-recv (a raw sender with the carrier's receiver against a raw pair)",
        readme="replace the '## Benchmark' section of the package README",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the sender and receiver processes to different CPUs",
    )
    args = parser.parse_args(argv)
    config = SMOKE if args.smoke else QUICK if args.quick else FULL
    offload = probe_offload()
    meta: dict[str, Any] = {
        "mode": run_mode(args),
        **machine_facts("benchmarks/datagram_throughput.py", argv),
        "offload": offload,
        "config": {
            "rounds": config.rounds,
            "seconds": config.seconds,
            "max_datagrams": config.max_datagrams,
            "window": config.window,
            "payload": PAYLOAD_SIZE,
        },
    }
    bench = Bench(config, pin=not args.no_pin)
    started = time.monotonic()
    try:
        results = run_cases(bench, offload, args.case)  # table rows, reference rows included
    except BenchmarkError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.close()
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    section = report(results, meta)
    print(section)
    if args.json is not None:
        cases = [r.to_json() for r in results if REFERENCE_OF not in r.extra]
        document = {**meta, "cases": cases}
        write_json(args.json, document)
    if args.write_readme:
        write_readme_section(ROOT / "packages" / "chrysalis-datagram" / "README.md", section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
