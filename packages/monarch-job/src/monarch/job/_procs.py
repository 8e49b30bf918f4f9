"""Local processes of a job's hosts: start one with its address reported on a pipe, tell
whether it still is the process we started, and end it with everything it started.

A host process runs in a session of its own (``start_new_session``): its worker processes stay
in that session, so ending a host means ending its session (found through ``/proc``), which
reaches workers already reparented to init. A pid is only trusted together with its start
time (``/proc/PID/stat``), so a recycled pid is never signalled. Waiting for exits uses pidfds
(Linux 5.3+; they work for processes that are not our children: a later client process ends
the hosts a former one started), with a bounded wait and no polling.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from monarch.job._spec import parse_ready_line

__all__ = [
    "HostProcess",
    "end_sessions",
    "process_start_time",
    "session_members",
    "start_host",
    "wait_ready",
]

#: Seconds a host has to report its address.
READY_TIMEOUT: Final = 60.0
#: Seconds between SIGTERM and SIGKILL when ending hosts, and the most the SIGKILL may take.
KILL_GRACE: Final = 2.0
KILL_WAIT: Final = 10.0


class _Polled(Protocol):
    """A started process as ``subprocess.Popen`` and the zygote's processes show it."""

    pid: int

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class HostProcess:
    """A started host process as a job records it (plain, picklable data)."""

    key: str
    pid: int
    start_time: int
    address: str
    netns: str | None = None
    log: str | None = None


def process_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of ``pid``, None if there is no such process
    (or it is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def is_alive(pid: int, start_time: int) -> bool:
    """Whether the process we started as ``pid`` at ``start_time`` still runs."""
    return process_start_time(pid) == start_time


def session_members(leaders: Mapping[int, int]) -> list[int]:
    """Live pids in the sessions of ``leaders`` (session id -> its leader's start time) that
    did not start before their leader (so not a recycled session id)."""
    found: list[int] = []
    own = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == own:
            continue
        pid = int(entry)
        try:
            sid = os.getsid(pid)
        except OSError:
            continue
        leader_start = leaders.get(sid)
        if leader_start is None:
            continue
        started = process_start_time(pid)
        if started is not None and started >= leader_start:
            found.append(pid)
    return found


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait (bounded) for ``pids`` to exit; the ones still running at the end."""
    fds: dict[int, int] = {}
    left: list[int] = []
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
        except OSError:  # no pidfds here: judged by /proc at the end
            left.append(pid)
    try:
        deadline = time.monotonic() + timeout
        while fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], remaining)
            for fd in ready:
                os.close(fd)
                fds.pop(fd)
        left.extend(fds.values())
    finally:
        for fd in fds:
            os.close(fd)
    return [pid for pid in left if process_start_time(pid) is not None]


def end_sessions(hosts: Sequence[HostProcess]) -> list[int]:
    """End every host of ``hosts`` and every process in its session: SIGTERM, up to
    ``KILL_GRACE`` seconds, then SIGKILL; returns the pids still alive after ``KILL_WAIT``
    more seconds (empty when all are gone)."""
    leaders = {h.pid: h.start_time for h in hosts if process_start_time(h.pid) == h.start_time}
    sessions = {h.pid: h.start_time for h in hosts}
    members = session_members(sessions)
    targets = sorted(set(members) | set(leaders))
    _signal(targets, signal.SIGTERM)
    left = _wait_gone(targets, KILL_GRACE)
    left = sorted(set(left) | set(session_members(sessions)))  # started meanwhile
    _signal(left, signal.SIGKILL)
    return _wait_gone(left, KILL_WAIT)


def start_host(
    key: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: str,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a host process (``argv`` without the ``--ready-fd`` option, which this adds) in a
    session of its own, stdout and stderr to ``log_path``; returns it and the read end of its
    ready pipe."""
    read_fd, write_fd = os.pipe()
    try:
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [*argv, "--ready-fd", str(write_fd)],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return popen, read_fd


def wait_ready(
    started: Mapping[str, tuple[_Polled, int]],
    timeout: float = READY_TIMEOUT,
    logs: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The address each host reported on its ready pipe (host key -> ``udp://IP:PORT``),
    waiting at most ``timeout`` seconds for all; closes the pipes. ``RuntimeError`` naming the
    hosts that exited or said nothing in time, with the tail of their logs."""
    pending = {fd: key for key, (_popen, fd) in started.items()}
    data: dict[str, bytes] = dict.fromkeys(started, b"")
    addresses: dict[str, str] = {}
    problems: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(pending), [], [], remaining)
            for fd in ready:
                key = pending[fd]
                chunk = os.read(fd, 4096)
                if not chunk:
                    pending.pop(fd)
                    os.close(fd)
                    code = started[key][0].poll()
                    problems[key] = (
                        f"exited with status {code} before it listened"
                        if code is not None
                        else "closed its ready pipe without an address"
                    )
                    continue
                data[key] += chunk
                try:
                    address = parse_ready_line(data[key])
                except ValueError as exc:
                    problems[key] = str(exc)
                    address = None
                    pending.pop(fd)
                    os.close(fd)
                if address is not None:
                    addresses[key] = address
                    pending.pop(fd)
                    os.close(fd)
    finally:
        for fd, key in pending.items():
            os.close(fd)
            problems.setdefault(key, f"reported no address within {timeout:g} s")
    if problems:
        lines = []
        for key, why in sorted(problems.items()):
            tail = _tail((logs or {}).get(key))
            lines.append(f"host {key}: {why}" + (f"\n  log tail:\n{tail}" if tail else ""))
        raise RuntimeError("job hosts failed to start:\n" + "\n".join(lines))
    return addresses


def _tail(path: str | None, limit: int = 2000) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(f"    {line}" for line in text.splitlines()[-20:])
