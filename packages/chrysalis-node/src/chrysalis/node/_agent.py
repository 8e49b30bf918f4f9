"""``chrysalis agent``: a warm process that runs the short client commands (``ls``, ``resolve``,
``ping``, ``pipe``) for the ``chrysalis`` command, so they skip interpreter start and imports.

Why: a client command is mostly imports (issue 22 item 5: ``chrysalis ls`` took about 600 ms,
400 of them importing QUIC, TLS and the nameserver, against 18 ms for ``python -c pass``). No
amount of lazy importing removes that: the command needs that code. A process that imported it
once can *fork* a copy of itself per command instead (as ``ssh``'s control master or the
monarch-actor zygote do); the copy runs exactly what a fresh process would run.

How: ``chrysalis agent start`` starts the agent (detached, its own session) on a Unix stream
socket, by default ``$XDG_RUNTIME_DIR/chrysalis-agent/agent.sock`` (else
``/tmp/chrysalis-agent-UID/agent.sock``; ``CHRYSALIS_AGENT_SOCKET`` or ``--socket`` name another),
in a directory only its user may enter. While it runs, ``chrysalis ls|resolve|ping|pipe`` (the
``chrysalis`` command, not ``main(out=...)`` from Python) send it their arguments, working
directory and environment, with their standard input, output and error as file descriptors
(``SCM_RIGHTS``); the agent checks the caller's user (``SO_PEERCRED``), forks, and the child
takes the caller's descriptors, directory and environment and runs the command's ``main``: it
writes straight to the caller's terminal or pipes. The caller waits for the exit status; if it
is interrupted (Ctrl-C) its connection closes and the agent interrupts the child (``SIGINT``,
then ``SIGKILL`` after ``KILL_GRACE`` seconds). Without an agent, with a stale socket, with
``CHRYSALIS_NO_AGENT=1``, or when the agent is busy (``MAX_CHILDREN`` commands at once), the
command runs in its own process as before: the agent only ever makes it faster.

What differs from a fresh process: modules are imported once, with the agent's environment, so
settings read at import time come from the environment ``agent start`` saw (the command's own
environment variables are in place before ``main`` runs; restart the agent after changing
module-level settings). ``chrysalis agent stop`` ends it; it also ends after ``--idle-exit``
seconds without a command (600 by default).

Bounds: a request is at most ``MAX_REQUEST`` bytes and carries exactly three descriptors; at
most ``MAX_CHILDREN`` commands run at once (more are refused, and run locally).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from chrysalis.node._cli import COMMANDS, _command_name, main

__all__ = [
    "AGENT_COMMANDS",
    "MAX_CHILDREN",
    "MAX_REQUEST",
    "agent_command",
    "default_socket",
    "run_via_agent",
    "serve",
]

AGENT_COMMANDS: Final = frozenset({"ls", "resolve", "ping", "pipe"})
"""Commands the ``chrysalis`` command hands to a running agent."""
MAX_REQUEST: Final = 1 << 20
"""Bytes of one request (arguments, directory, environment as JSON)."""
MAX_CHILDREN: Final = 32
"""Commands one agent runs at once."""
KILL_GRACE: Final = 2.0
"""Seconds between ``SIGINT`` and ``SIGKILL`` for a child whose caller went away."""
DEFAULT_IDLE_EXIT: Final = 600.0
"""Seconds an agent waits for a command before it exits."""
START_TIMEOUT: Final = 30.0
"""Seconds ``agent start`` waits for the new agent to answer."""
_NO_AGENT_ENV: Final = "CHRYSALIS_NO_AGENT"
_SOCKET_ENV: Final = "CHRYSALIS_AGENT_SOCKET"
_LENGTH: Final = struct.Struct("!I")
_in_child = False
"""Set in a forked child: its command runs here, never handed to the agent again."""


class AgentError(Exception):
    """The agent cannot be used or controlled (printed as one line by the CLI)."""


EXPECTED_ERRORS: Final = (AgentError,)


def default_socket() -> Path:
    """``CHRYSALIS_AGENT_SOCKET``, else a socket in a per-user directory."""
    named = os.environ.get(_SOCKET_ENV)
    if named:
        return Path(named)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "chrysalis-agent" / "agent.sock"
    return Path(f"/tmp/chrysalis-agent-{os.getuid()}") / "agent.sock"


# -- framing ------------------------------------------------------------------------------------


def _send_frame(sock: socket.socket, record: object, fds: Sequence[int] = ()) -> None:
    data = json.dumps(record).encode()
    if len(data) > MAX_REQUEST:
        raise AgentError(f"request of {len(data)} bytes is over {MAX_REQUEST}")
    payload = _LENGTH.pack(len(data)) + data
    ancillary = (
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    )
    sent = sock.sendmsg([payload], ancillary)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 16))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[Any, list[int]]:
    """One frame and the descriptors that came with its first bytes."""
    space = socket.CMSG_SPACE(max_fds * array.array("i").itemsize) if max_fds else 0
    head, ancillary, _flags, _addr = sock.recvmsg(_LENGTH.size, space)
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(data[: len(data) - len(data) % got.itemsize])
            fds.extend(got)
    try:
        if not head:
            raise ConnectionError("the peer closed the connection")
        head += _recv_exactly(sock, _LENGTH.size - len(head)) if len(head) < _LENGTH.size else b""
        (length,) = _LENGTH.unpack(head)
        if length > MAX_REQUEST:
            raise AgentError(f"frame of {length} bytes is over {MAX_REQUEST}")
        return json.loads(_recv_exactly(sock, length)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# -- the caller ---------------------------------------------------------------------------------


def run_via_agent(argv: Sequence[str], path: Path | None = None) -> int | None:
    """Run ``chrysalis ARGV`` in the agent with this process's standard streams, directory and
    environment; its exit status, or ``None`` when no agent can take it (then run it here)."""
    if _in_child or os.environ.get(_NO_AGENT_ENV) == "1":
        return None
    target = path or default_socket()
    if not target.exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(str(target))
            request = {"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ)}
            _send_frame(sock, request, (0, 1, 2))
            reply, _ = _recv_frame(sock)
        except KeyboardInterrupt:
            return 130  # closing the connection interrupts the command in the agent
        except (OSError, ValueError, AgentError):
            return None  # a stale socket, an agent that went away: run it here
        if not isinstance(reply, dict) or not isinstance(reply.get("rc"), int):
            return None  # refused (busy) or not an agent: run it here
        return int(reply["rc"])
    finally:
        sock.close()


def _control(path: Path, op: str, timeout: float = 5.0) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        _send_frame(sock, {"op": op})
        reply, _ = _recv_frame(sock)
    except (OSError, ValueError) as exc:
        raise AgentError(f"no agent answers on {path} ({exc})") from None
    finally:
        sock.close()
    if not isinstance(reply, dict):
        raise AgentError(f"not an agent on {path}")
    return reply


# -- the agent ----------------------------------------------------------------------------------


def _prepare_directory(path: Path) -> None:
    """The socket's directory exists, belongs to this user and only they may enter it."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise AgentError(f"{directory} belongs to another user")
    if info.st_mode & 0o077:
        os.chmod(directory, 0o700)


def _refuse_if_running(path: Path) -> None:
    """``AgentError`` when an agent answers on ``path``."""
    try:
        reply = _control(path, "status", timeout=2.0)
    except AgentError:
        return
    raise AgentError(f"an agent already runs on {path} (pid {reply.get('pid')})")


def _bind(path: Path) -> socket.socket:
    _prepare_directory(path)
    _refuse_if_running(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket of an agent that died
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    return listener


def _warm_up() -> None:
    """Import what the agent's commands need, once, before any fork."""
    for name in AGENT_COMMANDS:
        importlib.import_module(COMMANDS[name].module)


class _Child:
    __slots__ = ("conn", "interrupted_at", "pid", "pidfd")

    def __init__(self, pid: int, pidfd: int, conn: socket.socket) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.conn = conn
        self.interrupted_at: float | None = None


def _run_child(request: dict[str, Any], fds: list[int], listener: socket.socket) -> None:
    """In the forked child: become the caller's command and exit with its status."""
    global _in_child
    _in_child = True
    status = 1
    try:
        listener.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        # Nothing else of the agent's stays open here: its listener, selector, other
        # callers' connections and children's pidfds, and the descriptors just duplicated.
        os.closerange(3, _max_fd())
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own streams)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        status = main([str(a) for a in request["argv"]])
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        status = 130
    except BaseException as exc:  # the command's own errors are printed by main
        with contextlib.suppress(Exception):
            print(f"chrysalis: error: agent child failed: {exc!r}", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _max_fd() -> int:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 16


def serve(path: Path, idle_exit: float = DEFAULT_IDLE_EXIT, *, log: TextIO | None = None) -> int:
    """Run an agent on ``path`` until ``stop`` or ``idle_exit`` seconds without a command."""
    listener = _bind(path)
    _warm_up()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    children: dict[int, _Child] = {}
    served = 0
    last = time.monotonic()
    stopping = False

    def note(text: str) -> None:
        if log is not None:
            print(f"chrysalis agent: {text}", file=log, flush=True)

    def reap(child: _Child, status: int) -> None:
        selector.unregister(child.pidfd)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(child.conn)
        os.close(child.pidfd)
        children.pop(child.pid, None)
        with contextlib.suppress(OSError):
            _send_frame(child.conn, {"rc": status})
        child.conn.close()

    signal.signal(signal.SIGTERM, _terminate)
    note(f"serving on {path} (pid {os.getpid()})")
    try:
        while not stopping or children:
            now = time.monotonic()
            if not children and not stopping and now - last > idle_exit:
                note(f"idle for {idle_exit:g} s: exiting")
                break
            for child in list(children.values()):
                if child.interrupted_at is not None and now - child.interrupted_at > KILL_GRACE:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGKILL)
            for key, _events in selector.select(timeout=0.5):
                what = key.data
                if what == "listen":
                    conn, _ = listener.accept()
                    started, stop = _accept(conn, listener, selector, children, path, served)
                    served += started
                    if stop:
                        note("stop requested")
                        stopping = True
                        selector.unregister(listener)
                        listener.close()
                        with contextlib.suppress(FileNotFoundError):
                            path.unlink()  # new callers run their commands themselves
                    last = time.monotonic()
                elif isinstance(what, tuple) and what[0] == "exit":
                    child = what[1]
                    _pid, wait_status = os.waitpid(child.pid, 0)
                    reap(child, os.waitstatus_to_exitcode(wait_status))
                    last = time.monotonic()
                elif isinstance(what, tuple) and what[0] == "caller":
                    child = what[1]
                    selector.unregister(child.conn)  # gone (or spoke out of turn): interrupt
                    child.interrupted_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGINT)
    except KeyboardInterrupt:
        note("terminated")
    finally:
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        selector.close()
        if listener.fileno() >= 0:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return 0


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM: the same orderly end as Ctrl-C


def _accept(
    conn: socket.socket,
    listener: socket.socket,
    selector: selectors.BaseSelector,
    children: dict[int, _Child],
    path: Path,
    served: int,
) -> tuple[int, bool]:
    """Handle one connection: a control request (answered at once) or a command (forked).
    Returns (1 when a command was started, whether ``stop`` was asked)."""
    conn.settimeout(5.0)
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            conn.close()  # another user: not a word
            return 0, False
        request, fds = _recv_frame(conn, max_fds=3)
    except (OSError, ValueError, AgentError):
        conn.close()
        return 0, False
    if not isinstance(request, dict):
        for fd in fds:
            os.close(fd)
        conn.close()
        return 0, False
    op = request.get("op")
    if op is not None:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            _send_frame(
                conn,
                {
                    "pid": os.getpid(),
                    "socket": str(path),
                    "running": len(children),
                    "served": served,
                },
            )
        conn.close()
        return 0, op == "stop"
    argv = request.get("argv")
    valid = (
        len(fds) == 3
        and isinstance(argv, list)
        and all(isinstance(word, str) for word in argv)
        and _command_name(argv) in AGENT_COMMANDS
        and isinstance(request.get("cwd"), str)
        and isinstance(request.get("env"), dict)
    )
    if not valid or len(children) >= MAX_CHILDREN:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            _send_frame(conn, {"refused": "busy" if valid else "not a command the agent runs"})
        conn.close()
        return 0, False
    pid = os.fork()
    if pid == 0:  # the child never returns
        _run_child(request, fds, listener)
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    child = _Child(pid, os.pidfd_open(pid), conn)
    children[pid] = child
    selector.register(child.pidfd, selectors.EVENT_READ, ("exit", child))
    selector.register(conn, selectors.EVENT_READ, ("caller", child))
    return 1, False


# -- the `chrysalis agent` command --------------------------------------------------------------


def agent_command(args: argparse.Namespace, out: TextIO) -> int:
    """``chrysalis agent start|stop|status|serve``."""
    path = Path(args.socket) if args.socket else default_socket()
    action = args.agent_command
    if action == "serve":  # in the foreground (what `start` runs, detached)
        return serve(path, args.idle_exit, log=sys.stderr)
    if action == "status":
        reply = _control(path, "status")
        out.write(json.dumps(reply) + "\n" if args.json else _status_text(reply) + "\n")
        return 0
    if action == "stop":
        reply = _control(path, "stop")
        deadline = time.monotonic() + START_TIMEOUT
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        out.write(f"stopped the agent {reply.get('pid')} on {path}\n")
        return 0
    assert action == "start"
    _refuse_if_running(path)
    _prepare_directory(path)
    import subprocess

    log = path.with_suffix(".log")
    with open(log, "ab") as sink:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chrysalis.node._cli",
                "agent",
                "serve",
                "--socket",
                str(path),
                "--idle-exit",
                str(args.idle_exit),
            ],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            reply = _control(path, "status", timeout=2.0)
            break
        except AgentError:
            if time.monotonic() > deadline:
                raise AgentError(
                    f"the agent did not start within {START_TIMEOUT:g} s: see {log}"
                ) from None
            time.sleep(0.05)
    out.write(f"agent {reply.get('pid')} serving on {path} (log {log})\n")
    return 0


def _status_text(reply: dict[str, Any]) -> str:
    return (
        f"agent {reply.get('pid')} on {reply.get('socket')}: "
        f"{reply.get('running')} running, {reply.get('served')} served"
    )
