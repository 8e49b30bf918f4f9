"""Worker loops that report to the client that submitted their job once they listen.

Why: without it the client learns that a cluster job's worker loops are up by polling the
scheduler (``squeue`` until the job runs, ``scontrol`` for the nodes' addresses) and then probing
every worker's port: each step waits for the next poll, and each poll starts a process. With it,
the client opens a TCP listener before it submits and passes ``TOKEN@HOST:PORT`` to the job in
``$MONARCH_JOB_REPORT``; each node's worker loop connects there the moment it listens and sends
one line (``_slurm_text.report_line``: its node's rank, name and address). The client attaches
when the last one arrived: no poll interval and no scheduler command on the path to a ready
mesh. The scheduler is still polled, slowly, to see a job that fails or never starts, and a
client the nodes cannot reach falls back to polling (the engine decides when).

The token (random, per submission) only tells this client's workers from stray connections;
trust comes from the attach itself (each worker loop proves the cluster CA's identity over
QUIC), so a forged report can delay nothing beyond a failed attach.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import select
import socket
import time
from typing import Final

from monarch.job._slurm_text import (
    MAX_REPORT_BYTES,
    WorkerReport,
    parse_report,
    parse_report_target,
    report_line,
)

__all__ = ["ReportListener", "local_address", "send_report"]

_log = logging.getLogger("monarch.job.report")

#: Seconds a worker loop spends trying to deliver its report (the client then polls instead).
SEND_TIMEOUT: Final = 5.0
#: Seconds the client waits for one accepted connection's line.
READ_TIMEOUT: Final = 1.0
#: Connections the listener queues (more than one job's nodes connecting at once is fine: the
#: kernel's accept queue holds up to this many, the others retry their SYN).
BACKLOG: Final = 128
#: Where the default-route query points (TEST-NET-1: never contacted; a UDP connect only asks
#: the kernel for a route).
_ROUTE_PROBE: Final = "192.0.2.1"


def local_address() -> str:
    """This host's address for the nodes to connect to: the default route's source address,
    else the one the host name resolves to, else the loopback."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((_ROUTE_PROBE, 9))
        address = str(probe.getsockname()[0])
        if address != "0.0.0.0":
            return address
    with contextlib.suppress(OSError):
        return str(socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)[0][4][0])
    return "127.0.0.1"


class ReportListener:
    """The client's side: a TCP listener on every interface and the value of
    ``$MONARCH_JOB_REPORT`` that names it (``advertise``: the address the nodes connect to,
    default ``local_address()``). Not thread-safe; ``close()`` when done."""

    def __init__(self, advertise: str | None = None) -> None:
        self.token = secrets.token_hex(16)
        self._sock = socket.create_server(("0.0.0.0", 0), backlog=BACKLOG)
        self._sock.setblocking(False)
        host = advertise or local_address()
        self.target = f"{self.token}@{host}:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._sock.close()

    def receive(self, job_id: str, until: float) -> list[WorkerReport]:
        """The reports of job ``job_id`` that arrive before ``until`` (``time.monotonic()``),
        returning as soon as at least one did; lines that are not this client's (another token,
        another job, garbage) are logged and dropped."""
        found: list[WorkerReport] = []
        while not found:
            left = until - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select([self._sock], [], [], left)
            if not readable:
                break
            while True:  # everything queued now
                try:
                    conn, peer = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                with conn:
                    data = _read_line(conn)
                try:
                    found.append(parse_report(data, self.token, job_id))
                except ValueError as exc:
                    _log.warning("dropped a report from %s: %s", peer[0], exc)
        return found


def _read_line(conn: socket.socket) -> bytes:
    """Up to ``MAX_REPORT_BYTES + 1`` bytes, until the peer closes or ``READ_TIMEOUT``."""
    conn.settimeout(READ_TIMEOUT)
    data = b""
    deadline = time.monotonic() + READ_TIMEOUT
    with contextlib.suppress(OSError):
        while len(data) <= MAX_REPORT_BYTES and time.monotonic() < deadline:
            chunk = conn.recv(MAX_REPORT_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
            if data.endswith(b"\n"):
                break
    return data


def _connect(host: str, port: int) -> socket.socket:
    """``socket.create_connection((host, port), SEND_TIMEOUT)``, an ASCII host name given to the
    resolver as bytes: as a str it would load the IDNA codec first (``encodings.idna``, several
    ms of CPU on the worker's path to its report)."""
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    error: OSError = OSError(f"{host!r} resolves to no address")
    for family, kind, proto, _, address in socket.getaddrinfo(name, port, 0, socket.SOCK_STREAM):
        conn = socket.socket(family, kind, proto)
        try:
            conn.settimeout(SEND_TIMEOUT)
            conn.connect(address)
        except OSError as exc:
            conn.close()
            error = exc
            continue
        return conn
    raise error


def send_report(target: str, job_id: str, report: WorkerReport) -> bool:
    """The worker's side: deliver ``report`` to ``target`` (``$MONARCH_JOB_REPORT``); whether
    it was delivered (a failure is logged: the client falls back to polling)."""
    try:
        token, host, port = parse_report_target(target)
        line = report_line(token, job_id, report)
        with _connect(host, port) as conn:
            conn.sendall(line)
            conn.shutdown(socket.SHUT_WR)
    except (OSError, ValueError) as exc:
        _log.warning(
            "could not report to the client (%s): it will find this worker by polling", exc
        )
        return False
    return True
