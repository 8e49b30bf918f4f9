"""``chrysalis agent``: a warm process that runs the short client commands (``ls``, ``resolve``,
``ping``, ``pipe``) for the ``chrysalis`` command, so they skip interpreter start and imports.

Why: a client command is mostly imports (issue 22 item 5: ``chrysalis ls`` took about 600 ms,
400 of them importing QUIC, TLS and the nameserver, against 18 ms for ``python -c pass``). No
amount of lazy importing removes that: the command needs that code. A process that imported it
once can *fork* a copy of itself per command instead (as ``ssh``'s control master or the
monarch-actor zygote do); the copy runs exactly what a fresh process would run.

How: ``chrysalis agent start`` starts the agent (detached, its own session) on a Unix stream
socket, by default ``$XDG_RUNTIME_DIR/chrysalis-agent/agent-TAG.sock`` (else
``/tmp/chrysalis-agent-UID/agent-TAG.sock``, ``TAG`` naming this installation:
``chrysalis.node._agent_client.installation_tag``; ``CHRYSALIS_AGENT_SOCKET`` or ``--socket``
name another), in a directory only its user may enter; it holds ``SOCKET.lock`` (``flock``)
while it lives, so one agent serves a socket. **A client command that finds no agent starts
one** (``autostart``): after running alone, ``chrysalis ls`` (``resolve``, ``ping``, ``pipe``)
forks the agent from its own warm process, with a session for its token already joining, so
the next command is answered warm (``CHRYSALIS_AGENT_AUTOSTART=0`` opts out;
``CHRYSALIS_NO_AGENT=1`` neither uses nor starts one; a call of ``main(argv)`` from Python
never starts one, ``main()`` with no arguments being the command line). A socket's directory
is checked (``_prepare_directory``: this user's, not a symbolic link, closed to others; only
the default one is ever created, none chmodded), and so is the agent's user, by the caller,
before it sends anything (``SO_PEERCRED``). While it runs, ``chrysalis ls|resolve|ping|pipe`` (the
``chrysalis`` command, not ``main(out=...)`` from Python) send it their arguments, working
directory and environment, with their standard input, output and error as file descriptors
(``SCM_RIGHTS``; the caller's side is ``chrysalis.node._agent_client``, which imports almost
nothing); the agent checks the caller's user (``SO_PEERCRED``) and then:

- ``ls``, ``resolve`` and ``ping`` (default log level, a ``udp://`` or ``unix://`` token) go to
  a *warm session*: a process forked once per token and settings that stays joined to the
  tree and answers each command with one request to the root
  (``chrysalis.node._agent_session``: freshness, a root that goes away, bounds); the caller
  prints the output it gets back. At most ``MAX_SESSIONS`` sessions; their nodes are listed
  in ``ls`` as ``command=agent``;
- anything else (``pipe``, usage errors, other log levels, cluster URLs, all sessions taken)
  is forked: the child takes the caller's descriptors, directory and environment and runs
  the command's ``main``, writing straight to the caller's terminal or pipes.

A forked command's caller waits for the exit status; if it
is interrupted (Ctrl-C) its connection closes and the agent interrupts the child (``SIGINT``,
then ``SIGKILL`` after ``KILL_GRACE`` seconds). Without an agent, with a stale socket, with
``CHRYSALIS_NO_AGENT=1``, when the agent is busy (``MAX_CHILDREN`` forked commands at once)
or when a session hands the command back (its root did not answer), the command runs in its
own process as before.

What differs from a fresh process: modules are imported once, with the agent's environment, so
settings read at import time come from the environment ``agent start`` saw (the command's own
environment variables are in place before ``main`` runs; restart the agent after changing
module-level settings). ``chrysalis agent stop`` ends it; it also ends after ``--idle-exit``
seconds without a command (600 by default; ``stop`` returns once it ended and released its
lock, and ``serve`` waits up to ``LOCK_WAIT`` seconds for the lock of one that no longer
answers); its sessions leave the tree when it ends (or
after ``chrysalis.node._agent_session.SESSION_IDLE_EXIT`` idle seconds).

Bounds: a request is at most ``MAX_REQUEST`` bytes and carries exactly three descriptors; at
most ``MAX_CHILDREN`` forked commands run at once and ``MAX_SESSIONS`` sessions exist (more
are refused, and run locally).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import fcntl
import importlib
import io
import json
import os
import re
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from chrysalis.node import _agent_client
from chrysalis.node._agent_client import (
    AUTOSTART_ENV,
    DONE,
    REFUSED,
    REQUEST_MAGIC,
    _recv_exactly,
    autostart_enabled,
    decode_request,
    encode_reply,
)
from chrysalis.node._cli import COMMANDS, _command_name, build_parser, main

__all__ = [
    "AGENT_COMMANDS",
    "MAX_CHILDREN",
    "MAX_REQUEST",
    "MAX_SESSIONS",
    "AUTOSTART_ENV",
    "agent_command",
    "autostart",
    "autostart_enabled",
    "default_socket",
    "run_via_agent",
    "serve",
]

AGENT_COMMANDS: Final = frozenset({"ls", "resolve", "ping", "pipe"})
"""Commands the ``chrysalis`` command hands to a running agent."""
MAX_REQUEST: Final = _agent_client.MAX_REQUEST
"""Bytes of one request (arguments, directory, environment)."""
MAX_CHILDREN: Final = 32
"""Forked commands one agent runs at once."""
MAX_SESSIONS: Final = 8
"""Warm sessions (``chrysalis.node._agent_session``: a joined node per token and settings)
one agent keeps; a command for another token runs in a fork while all are taken."""
SESSION_STOP_GRACE: Final = 5.0
"""Seconds a stopping agent gives its sessions to leave the tree before ``SIGKILL``."""
KILL_GRACE: Final = 2.0
"""Seconds between ``SIGINT`` and ``SIGKILL`` for a child whose caller went away."""
DEFAULT_IDLE_EXIT: Final = 600.0
"""Seconds an agent waits for a command before it exits."""
START_TIMEOUT: Final = 30.0
"""Seconds ``agent start`` waits for the new agent to answer (and ``agent stop`` for the old
one to end)."""
LOCK_WAIT: Final = 15.0
"""Seconds ``agent serve`` waits for the lock of an agent that no longer answers (a stopping
one, whose sessions are leaving and forked commands finishing)."""
_LENGTH: Final = struct.Struct("!I")
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class AgentError(Exception):
    """The agent cannot be used or controlled (printed as one line by the CLI)."""


EXPECTED_ERRORS: Final = (AgentError,)


def default_socket() -> Path:
    """``CHRYSALIS_AGENT_SOCKET``, else a socket in a per-user directory."""
    return Path(_agent_client.default_socket())


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


def _recv_raw(sock: socket.socket, max_fds: int = 0) -> tuple[bytes, list[int]]:
    """One frame's payload and the descriptors that came with its first bytes."""
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
        return _recv_exactly(sock, length), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[Any, list[int]]:
    """One JSON frame and the descriptors that came with its first bytes."""
    payload, fds = _recv_raw(sock, max_fds)
    try:
        return json.loads(payload), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# -- the caller ---------------------------------------------------------------------------------


def run_via_agent(argv: Sequence[str], path: Path | None = None) -> int | None:
    """Run ``chrysalis ARGV`` in the agent with this process's standard streams, directory and
    environment; its exit status, or ``None`` when no agent can take it (then run it here).
    (``chrysalis.node._agent_client.run_via_agent``, which the command itself uses.)"""
    return _agent_client.run_via_agent(argv, None if path is None else str(path))


def _control(path: Path, op: str, timeout: float = 5.0) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        uid = _agent_client.peer_uid(sock)
        if uid != os.getuid():
            raise AgentError(f"{path} is served by another user (uid {uid}), not an agent")
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


def _is_default_directory(directory: Path) -> bool:
    return directory == Path(_agent_client.default_directory())


def _prepare_directory(path: Path, *, create: bool = True) -> None:
    """Check the socket's directory (``AgentError``, saying why, when an agent must not use
    it): a real directory (not a symbolic link: ``lstat``) of this user's; the per-user
    default (``_agent_client.default_directory``) must be mode 0700, a directory named
    explicitly (``--socket``, ``CHRYSALIS_AGENT_SOCKET``) must at least be writable by no one
    else. Nothing is ever chmodded. ``create``: a missing directory is created first, mode
    0700 (the autostart path creates only the default one)."""
    directory = path.parent
    default = _is_default_directory(directory)
    if create:
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700, parents=not default)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        raise AgentError(f"the agent's directory {directory} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise AgentError(f"the agent's directory {directory} is a symbolic link: not using it")
    if not stat.S_ISDIR(info.st_mode):
        raise AgentError(f"the agent's directory {directory} is not a directory")
    if info.st_uid != os.getuid():
        raise AgentError(
            f"the agent's directory {directory} belongs to another user (uid {info.st_uid}):"
            " not using it"
        )
    loose = info.st_mode & (0o077 if default else 0o022)
    if loose:
        mode = stat.S_IMODE(info.st_mode)
        raise AgentError(
            f"the agent's directory {directory} is mode {mode:04o}, open to other users"
            " (chmod 700 it to use an agent there)"
        )


def _refuse_if_running(path: Path) -> None:
    """``AgentError`` when an agent answers on ``path``."""
    try:
        reply = _control(path, "status", timeout=2.0)
    except AgentError:
        return
    raise AgentError(f"an agent already runs on {path} (pid {reply.get('pid')})")


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _lock(path: Path) -> int:
    """Take ``PATH.lock`` (``flock``, exclusive, not waiting): the descriptor holding it, which
    an agent keeps open for its life, so that two agents starting at once on one socket cannot
    both bind it (the second would unlink the first's socket). ``AgentError`` while another
    process holds it (an agent runs or is starting)."""
    lock = _lock_path(path)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AgentError(f"an agent runs or is starting on {path} ({lock} is locked)") from None
    return fd


def _lock_when_free(path: Path, wait: float, log: TextIO | None = None) -> int:
    """``_lock``, waiting up to ``wait`` seconds while the lock's holder answers on no socket
    (an agent that was stopped and is still ending: its sessions leave, its forked commands
    finish; said once on ``log``). ``AgentError`` at once when an agent answers on
    ``path``."""
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            return _lock(path)
        except AgentError:
            _refuse_if_running(path)
            if time.monotonic() >= deadline:
                raise
            if not said and log is not None:
                print(
                    f"chrysalis agent: waiting up to {wait:g} s for {_lock_path(path)}"
                    " (an agent that no longer answers is ending)",
                    file=log,
                    flush=True,
                )
                said = True
            time.sleep(0.1)


def _lock_is_free(path: Path) -> bool:
    try:
        os.close(_lock(path))
    except AgentError:
        return False
    return True


def _bind(
    path: Path, lock_wait: float = LOCK_WAIT, log: TextIO | None = None
) -> tuple[socket.socket, int]:
    """The agent's listener on ``path`` and the descriptor of its lock (``_lock``, waited
    for up to ``lock_wait`` seconds while no agent answers: ``_lock_when_free``)."""
    _prepare_directory(path)
    lock = _lock_when_free(path, lock_wait, log)
    try:
        _refuse_if_running(path)
    except BaseException:
        os.close(lock)
        raise
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket of an agent that died
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(64)
    except BaseException:
        listener.close()
        os.close(lock)
        raise
    return listener, lock


def _warm_up() -> None:
    """Import what the agent's commands (and its sessions) need, once, before any fork."""
    for name in AGENT_COMMANDS:
        importlib.import_module(COMMANDS[name].module)
    importlib.import_module("chrysalis.node._agent_session")


class _Child:
    """A command forked for one caller (its connection gets the exit status)."""

    __slots__ = ("conn", "interrupted_at", "pid", "pidfd")

    def __init__(self, pid: int, pidfd: int, conn: socket.socket) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.conn = conn
        self.interrupted_at: float | None = None


class _Session:
    """A warm session process (``chrysalis.node._agent_session``) and its end of the pair."""

    __slots__ = ("ctrl", "key", "pid", "pidfd", "served")

    def __init__(self, key: str, pid: int, pidfd: int, ctrl: socket.socket) -> None:
        self.key = key
        self.pid = pid
        self.pidfd = pidfd
        self.ctrl = ctrl
        self.served = 0


def _in_child(listener: socket.socket, keep: int = -1) -> None:
    """In any forked child: never hand a command to the agent again, default signals, and
    nothing of the agent's left open (its listener, selector, callers' connections, other
    children's pidfds) but descriptors 0 to 2 and ``keep``."""
    _agent_client._in_child = True
    listener.close()
    _reset_logging()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if keep < 0:
        os.closerange(3, _max_fd())
    else:
        os.closerange(3, keep)
        os.closerange(keep + 1, _max_fd())


def _reset_logging(level: str | None = None) -> None:
    """Forget the logging configuration this process inherited (the root logger's level and
    handlers, set by whichever command's ``--log-level`` started the agent, writing to that
    process's stderr): a forked command's ``main`` and a session configure it again from
    their own arguments. ``level``: configure it now (``basicConfig``, on ``sys.stderr``)."""
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    if level is not None:
        logging.basicConfig(level=level.upper(), format="%(name)s %(levelname)s %(message)s")


def _adopt(cwd: str, env: dict[str, str]) -> None:
    """Take the caller's working directory and environment."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import tempfile

    tempfile.tempdir = None  # found again from this environment's TMPDIR


def _run_child(
    argv: list[str], cwd: str, env: dict[str, str], fds: list[int], listener: socket.socket
) -> None:
    """In the forked child: become the caller's command and exit with its status."""
    status = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _in_child(listener)
        _adopt(cwd, env)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own streams)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        status = main(argv)
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


def _run_session_child(
    ctrl: socket.socket,
    args: argparse.Namespace,
    cwd: str,
    env: dict[str, str],
    listener: socket.socket,
) -> None:
    """In the forked session process: serve commands until the session ends, then exit."""
    status = 1
    try:
        _in_child(listener, keep=ctrl.fileno())
        _adopt(cwd, env)
        from chrysalis.node._agent_session import run_session

        status = run_session(ctrl, args)
    except KeyboardInterrupt:
        status = 0
    except BaseException as exc:
        with contextlib.suppress(Exception):
            print(f"chrysalis agent: session failed: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(status)


def _max_fd() -> int:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 16


def _refuse(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(encode_reply(REFUSED, 0))
    conn.close()


class _Agent:
    """The agent's state: its listener, forked commands and warm sessions."""

    def __init__(self, path: Path, listener: socket.socket, log: TextIO | None) -> None:
        self.path = path
        self.listener = listener
        self.log = log
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "listen")
        self.children: dict[int, _Child] = {}
        self.sessions: dict[str, _Session] = {}
        self.served = 0
        self.warm = 0
        self.stopping = False
        self.parser = build_parser()

    def note(self, text: str) -> None:
        if self.log is not None:
            print(f"chrysalis agent: {text}", file=self.log, flush=True)

    # -- forked commands ---------------------------------------------------------------------

    def reap(self, child: _Child) -> None:
        _pid, wait_status = os.waitpid(child.pid, 0)
        self.selector.unregister(child.pidfd)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(child.conn)
        os.close(child.pidfd)
        self.children.pop(child.pid, None)
        with contextlib.suppress(OSError):
            child.conn.sendall(encode_reply(DONE, os.waitstatus_to_exitcode(wait_status)))
        child.conn.close()

    def fork_command(
        self, argv: list[str], cwd: str, env: dict[str, str], fds: list[int], conn: socket.socket
    ) -> None:
        pid = os.fork()
        if pid == 0:  # the child never returns
            _run_child(argv, cwd, env, fds, self.listener)
        for fd in fds:
            os.close(fd)
        conn.settimeout(None)
        child = _Child(pid, os.pidfd_open(pid), conn)
        self.children[pid] = child
        self.selector.register(child.pidfd, selectors.EVENT_READ, ("exit", child))
        self.selector.register(conn, selectors.EVENT_READ, ("caller", child))

    # -- warm sessions -----------------------------------------------------------------------

    def warm_key(
        self, argv: list[str], cwd: str, env: dict[str, str]
    ) -> tuple[str, argparse.Namespace] | None:
        """The session key of a command a session may answer (parsed here, with the
        agent's parser), else ``None``: it is forked (so a usage error, or a token of a
        cluster scheme, which may need a slow resolver, is handled in the fork)."""
        from chrysalis.node._agent_session import WARM_COMMANDS, session_key

        if _command_name(argv) not in WARM_COMMANDS:
            return None
        if any(_SCHEME.match(w) and not w.startswith(("udp://", "unix://")) for w in argv):
            return None
        try:
            with (
                contextlib.redirect_stderr(io.StringIO()),
                contextlib.redirect_stdout(io.StringIO()),
            ):
                args = self.parser.parse_args(argv)
        except SystemExit:
            return None
        key = session_key(args, cwd, env)
        return None if key is None else (key, args)

    def start_session(
        self, key: str, args: argparse.Namespace, cwd: str, env: dict[str, str]
    ) -> _Session | None:
        if len(self.sessions) >= MAX_SESSIONS or self.stopping:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the session never returns
            ours.close()
            _run_session_child(theirs, args, cwd, env, self.listener)
        theirs.close()
        ours.setblocking(False)
        session = _Session(key, pid, os.pidfd_open(pid), ours)
        self.sessions[key] = session
        self.selector.register(session.pidfd, selectors.EVENT_READ, ("session", session))
        self.note(f"session {pid} joins at {args.token}")
        return session

    def hand_over(self, session: _Session, argv: list[str], conn: socket.socket) -> bool:
        """Give ``conn`` and the command to ``session``; ``False`` when it cannot take it."""
        message = json.dumps({"argv": argv}).encode()
        try:
            session.ctrl.sendmsg(
                [message],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", conn.fileno()))],
            )
        except OSError:
            return False
        conn.close()
        session.served += 1
        return True

    def end_session(self, session: _Session) -> None:
        _pid, wait_status = os.waitpid(session.pid, 0)
        self.selector.unregister(session.pidfd)
        os.close(session.pidfd)
        session.ctrl.close()
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]
        code = os.waitstatus_to_exitcode(wait_status)
        self.note(f"session {session.pid} ended (status {code}, {session.served} commands)")

    def stop_sessions(self) -> None:
        for session in self.sessions.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(session.pid, signal.SIGTERM)

    # -- requests ----------------------------------------------------------------------------

    def accept(self, conn: socket.socket) -> bool:
        """Handle one connection: a control request (answered at once), a command for a
        warm session (handed over) or one to fork. Returns whether ``stop`` was asked."""
        conn.settimeout(5.0)
        try:
            if _agent_client.peer_uid(conn) != os.getuid():
                conn.close()  # another user: not a word
                return False
            payload, fds = _recv_raw(conn, max_fds=3)
        except (OSError, ValueError, AgentError):
            conn.close()
            return False
        if not payload.startswith(REQUEST_MAGIC):
            for fd in fds:
                os.close(fd)
            return self.control(conn, payload)
        try:
            argv, cwd, env = decode_request(payload)
        except ValueError:
            argv, cwd, env = [], "", {}
        valid = len(fds) == 3 and _command_name(argv) in AGENT_COMMANDS
        if not valid:
            for fd in fds:
                os.close(fd)
            _refuse(conn)
            return False
        warm = self.warm_key(argv, cwd, env)
        if warm is not None:
            key, args = warm
            session = self.sessions.get(key) or self.start_session(key, args, cwd, env)
            if session is not None and self.hand_over(session, argv, conn):
                for fd in fds:
                    os.close(fd)
                self.served += 1
                self.warm += 1
                return False
        if len(self.children) >= MAX_CHILDREN:
            for fd in fds:
                os.close(fd)
            _refuse(conn)
            return False
        self.fork_command(argv, cwd, env, fds, conn)
        self.served += 1
        return False

    def control(self, conn: socket.socket, payload: bytes) -> bool:
        try:
            request = json.loads(payload)
        except ValueError:
            request = None
        op = request.get("op") if isinstance(request, dict) else None
        if op not in ("status", "stop"):
            _refuse(conn)  # not a request of this agent's
            return False
        with contextlib.suppress(OSError):
            _send_frame(
                conn,
                {
                    "pid": os.getpid(),
                    "socket": str(self.path),
                    "running": len(self.children),
                    "served": self.served,
                    "warm": self.warm,
                    "sessions": [
                        {"pid": s.pid, "served": s.served} for s in self.sessions.values()
                    ],
                },
            )
        conn.close()
        return bool(op == "stop")

    # -- the loop ----------------------------------------------------------------------------

    def run(self, idle_exit: float) -> None:
        last = stopped_at = time.monotonic()
        while not self.stopping or self.children or self.sessions:
            now = time.monotonic()
            if not self.children and not self.stopping and now - last > idle_exit:
                self.note(f"idle for {idle_exit:g} s: exiting")
                break
            if self.stopping and now - stopped_at > SESSION_STOP_GRACE:
                for session in self.sessions.values():  # did not leave in time
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(session.pid, signal.SIGKILL)
            for child in list(self.children.values()):
                if child.interrupted_at is not None and now - child.interrupted_at > KILL_GRACE:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGKILL)
            for key, _events in self.selector.select(timeout=0.5):
                what = key.data
                if what == "listen":
                    conn, _ = self.listener.accept()
                    if self.accept(conn):
                        self.note("stop requested")
                        self.stopping = True
                        self.selector.unregister(self.listener)
                        self.listener.close()
                        with contextlib.suppress(FileNotFoundError):
                            self.path.unlink()  # new callers run their commands themselves
                        self.stop_sessions()
                        stopped_at = time.monotonic()
                    last = time.monotonic()
                elif isinstance(what, tuple) and what[0] == "exit":
                    self.reap(what[1])
                    last = time.monotonic()
                elif isinstance(what, tuple) and what[0] == "session":
                    self.end_session(what[1])
                elif isinstance(what, tuple) and what[0] == "caller":
                    child = what[1]
                    self.selector.unregister(child.conn)  # gone (or spoke out of turn)
                    child.interrupted_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGINT)

    def close(self) -> None:
        if self.listener.fileno() >= 0:  # first: new callers run alone, not wait on a backlog
            self.selector.unregister(self.listener)
            self.listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        self.stop_sessions()  # they leave the tree cleanly, within a grace period
        deadline = time.monotonic() + SESSION_STOP_GRACE
        for session in list(self.sessions.values()):
            while time.monotonic() < deadline:
                done, _status = os.waitpid(session.pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.02)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(session.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(session.pid, 0)
        self.selector.close()


Command = tuple[list[str], str, dict[str, str]]
"""A command as the agent receives it: its arguments, working directory and environment."""


def serve(
    path: Path,
    idle_exit: float = DEFAULT_IDLE_EXIT,
    *,
    log: TextIO | None = None,
    first: Command | None = None,
) -> int:
    """Run an agent on ``path`` until ``stop`` or ``idle_exit`` seconds without a command.
    ``first``: a command just run alone (``autostart``): when a warm session could answer it,
    that session is started at once, so the same command's next run finds it joined."""
    listener, lock = _bind(path, log=log)
    try:
        _warm_up()
        agent = _Agent(path, listener, log)
        signal.signal(signal.SIGTERM, _terminate)
        agent.note(f"serving on {path} (pid {os.getpid()})")
        if first is not None:
            argv, cwd, env = first
            warm = agent.warm_key(argv, cwd, env)
            if warm is not None:
                agent.start_session(warm[0], warm[1], cwd, env)
        try:
            agent.run(idle_exit)
        except KeyboardInterrupt:
            agent.note("terminated")
        finally:
            agent.close()
    finally:
        os.close(lock)  # the socket is gone: another agent may start
    return 0


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM: the same orderly end as Ctrl-C


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
        # Its socket goes at once; its lock when its sessions left and its forked commands
        # ended: until then no new agent could start on this socket.
        deadline = time.monotonic() + START_TIMEOUT
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        while not _lock_is_free(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        out.write(f"stopped the agent {reply.get('pid')} on {path}\n")
        if not _lock_is_free(path):
            out.write(
                f"(it is still finishing its commands after {START_TIMEOUT:g} s; a new agent"
                f" waits up to {LOCK_WAIT:g} s for it)\n"
            )
        return 0
    assert action == "start"
    _refuse_if_running(path)
    _prepare_directory(path)
    log = _spawn(path, args.idle_exit)
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


# -- starting an agent from a command that found none --------------------------------------------


def _log_path(path: Path) -> Path:
    return path.with_suffix(".log")


def _spawn(path: Path, idle_exit: float) -> Path:
    """Start ``chrysalis agent serve`` on ``path`` as a fresh interpreter, detached (its own
    session, output appended to the log beside the socket); the log's path."""
    import subprocess

    log = _log_path(path)
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
                str(idle_exit),
            ],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,
        )
    return log


def autostart(
    path: Path | None = None,
    idle_exit: float = DEFAULT_IDLE_EXIT,
    *,
    first: Command | None = None,
) -> int | None:
    """Start an agent on ``path`` (default: ``default_socket()``) from this process, which just
    ran a client command alone and so has imported what the agent needs: a double fork (the
    agent in a session of its own, not this process's child, its standard streams on the log
    beside the socket, no other descriptor of this process kept, the working directory ``/``)
    that runs ``serve`` (with ``first``, the command this process ran: its session starts
    joining at once). It costs this process a fork and one short wait, not an interpreter
    start: the next ``ls`` finds the agent warm. A process with other threads running does not
    fork (a fork copies none of them, and a lock one held stays held): it spawns ``agent
    serve`` as a fresh interpreter instead (``_spawn``). Returns the agent's process ID (0 for
    a spawned one); ``None``, starting nothing, when an agent runs or is starting on ``path``
    (its lock is held) or the socket's directory is not usable."""
    path = default_socket() if path is None else path
    try:
        # Only the default per-user directory is created: a directory named explicitly
        # (CHRYSALIS_AGENT_SOCKET) is used as it is, or not at all; none is ever chmodded.
        _prepare_directory(path, create=_is_default_directory(path.parent))
    except AgentError as exc:
        sys.stderr.write(f"chrysalis: warning: not starting an agent: {exc}\n")
        return None
    except OSError:
        return None
    try:
        os.close(_lock(path))  # free: the agent takes it again (a race loses there, harmlessly)
    except (AgentError, OSError):
        return None
    if threading.active_count() > 1:
        _spawn(path, idle_exit)
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked process
        status = 1
        try:
            os.close(read)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            _become_agent(path, idle_exit, write, first)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    try:
        os.waitpid(child, 0)
        reply = os.read(read, 16)
    finally:
        os.close(read)
    return int(reply) if reply.isdigit() else None


def _become_agent(path: Path, idle_exit: float, report: int, first: Command | None) -> None:
    """In the grandchild of ``autostart``: detach from the caller and serve until idle."""
    log = os.open(_log_path(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.write(report, str(os.getpid()).encode())
    import gc

    gc.collect()  # garbage closes its descriptors now, before they are closed and reused
    os.closerange(3, _max_fd())  # the caller's pipes (a shell's `$(...)` waits for their EOF)
    os.chdir("/")
    with contextlib.suppress(OSError):  # its name in `ps -e` and `top` (argv stays the command's)
        Path("/proc/self/comm").write_text("chrysalis-agent")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _reset_logging("warning")  # the agent's own level (`agent serve`'s), not the command's
    with contextlib.suppress(AgentError):  # another agent took the socket first
        serve(path, idle_exit, log=sys.stderr, first=first)
