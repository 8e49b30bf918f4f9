"""Fork servers: a warm, single-threaded process that forks workers on request over a Unix socket.

Why: a process that has imported a large stack (the Chrysalis layers, aioquic, cryptography)
starts workers far faster by forking them than by exec'ing fresh interpreters, but it should
not fork itself once it runs threads, an event loop or sockets (a fork copies them, their locks
in whatever state they are in). So it forks one *fork server* early (``fork_server``), which
stays single-threaded and forks each worker when asked. Two fork servers use this module:
``chrysalis scale``'s (``chrysalis.node._forkserver``) and monarch-actor's zygote
(``monarch.actor._hosts.zygote``); each defines its own requests and client, and shares the
machinery here:

- ``fork_server`` forks the server process with a ``SOCK_SEQPACKET`` socket pair to it;
- ``serve`` is the server's loop: it waits on the socket and on ``SIGCHLD`` (through a wake-up
  pipe), reaps ended workers and reports each one to the client as ``{"exited": PID,
  "status": CODE}`` (one JSON packet; ``CODE`` as ``subprocess.Popen.returncode``: negative for
  a signal), hands every request with the descriptors attached to it (``SCM_RIGHTS``) to the
  caller's handler, and returns on end of file;
- ``receive`` reads one such packet and its descriptors;
- ``run_child`` is a forked worker's side: it drops what it inherited from the server, takes
  the descriptors given as its standard streams, runs ``"module:function"`` on its arguments and
  exits with the integer it returns;
- ``die_with_parent`` asks the kernel to ``SIGKILL`` the calling process when its parent exits
  (``PR_SET_PDEATHSIG``, Linux only).

The server's loop, ``run_child`` and ``die_with_parent`` run in forked processes only; the
client side (sending requests, matching replies, following exits) is each user's own, since
one runs in an asyncio event loop and the other in threads.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, NoReturn, final

__all__ = [
    "MAX_CHILDREN",
    "ServerLoop",
    "can_fork_server",
    "die_with_parent",
    "fork_server",
    "receive",
    "run_child",
    "serve",
]

MAX_CHILDREN: Final = 8192
"""The most workers ``ServerLoop.children`` may count at once (users may bound it lower)."""
_PR_SET_PDEATHSIG: Final = 1
_FD_SIZE: Final = array.array("i").itemsize


def die_with_parent(parent: int) -> None:
    """``SIGKILL`` this process when ``parent``, its parent's PID, exits (Linux; elsewhere
    only the check below); exit now with status 1 if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def can_fork_server() -> bool:
    """Whether this platform can run ``fork_server`` (``os.fork`` and ``SOCK_SEQPACKET``)."""
    return hasattr(os, "fork") and hasattr(socket, "SOCK_SEQPACKET")


def fork_server(
    serve_forever: Callable[[socket.socket], int],
    *,
    fork: Callable[[], int] = os.fork,
    lifeline: bool = False,
) -> tuple[socket.socket, int]:
    """Fork a server process that runs ``serve_forever(its_socket)`` and exits with the integer
    it returns (1 after an exception); return the caller's blocking end of the socket pair
    (``SOCK_SEQPACKET``) and the server's PID. ``fork`` forks (``os.fork`` unless the caller
    needs more care); with ``lifeline`` the server dies with the calling thread
    (``die_with_parent``). Standard output and error are flushed first, so that the server does
    not write the caller's buffered output again. ``OSError`` where the socket pair or the
    fork fails, or where this platform cannot (``can_fork_server``)."""
    if not can_fork_server():
        raise OSError("this platform cannot fork a server with a SOCK_SEQPACKET socket pair")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    try:
        pid = fork()
    except BaseException:
        ours.close()
        theirs.close()
        raise
    if pid == 0:  # pragma: no cover - runs in the server
        code = 1
        try:
            ours.close()
            if lifeline:
                die_with_parent(parent)
            code = serve_forever(theirs)
        finally:
            os._exit(code)
    theirs.close()
    return ours, pid


def receive(sock: socket.socket, max_bytes: int, max_fds: int) -> tuple[bytes, list[int]]:
    """One packet of at most ``max_bytes`` from ``sock`` and the descriptors passed with it
    (``SCM_RIGHTS``, room for ``max_fds``; the caller owns and closes them). Empty bytes at end
    of file; ``OSError`` as ``recvmsg`` raises it."""
    data, ancdata, _, _ = sock.recvmsg(max_bytes, socket.CMSG_SPACE(max_fds * _FD_SIZE))
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % _FD_SIZE])
    return data, list(fds)


@final
@dataclass(eq=False)
class ServerLoop:
    """What a request handler of ``serve`` works with: the server's socket, its ``SIGCHLD``
    wake-up pipe (both to be dropped by ``run_child`` in a worker) and the PIDs of the workers
    it runs (the handler adds every worker it forks; ``serve`` removes those reaped)."""

    sock: socket.socket
    wake: tuple[int, int]
    children: set[int] = field(default_factory=set)


def serve(
    sock: socket.socket,
    handle: Callable[[ServerLoop, bytes, list[int]], None],
    *,
    max_bytes: int,
    max_fds: int,
) -> int:  # pragma: no cover - runs in a fork server (tests/test_forking.py runs it forked)
    """The server's loop (module docstring): call ``handle(loop, request, descriptors)`` for
    each request (it forks, replies and closes the descriptors), report each reaped worker as
    ``{"exited": PID, "status": CODE}``; return 0 when the client's end closes."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    loop = ServerLoop(sock, (wake_r, wake_w))
    while True:
        try:
            ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        _report_exits(loop)
        if sock.fileno() not in ready:
            continue
        try:
            data, fds = receive(sock, max_bytes, max_fds)
        except OSError:
            return 0
        if not data:
            for fd in fds:
                os.close(fd)
            return 0
        handle(loop, data, fds)


def _report_exits(loop: ServerLoop) -> None:  # pragma: no cover - runs in a fork server
    while loop.children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            loop.children.clear()
            return
        if pid == 0:
            return
        loop.children.discard(pid)
        with contextlib.suppress(OSError):
            code = os.waitstatus_to_exitcode(status)
            loop.sock.send(json.dumps({"exited": pid, "status": code}).encode())


def run_child(
    loop: ServerLoop,
    target: str,
    argv: list[str],
    stdio: Sequence[int | None],
    *,
    parent: int | None = None,
    prepare: Callable[[], None] | None = None,
) -> NoReturn:  # pragma: no cover - runs in a forked worker
    """In a worker just forked by ``serve``'s handler: die with the server if ``parent`` (its
    PID) is given (``die_with_parent``), restore the default handling of ``SIGCHLD`` and
    ``SIGINT``, close the server's socket and wake-up pipe, make ``stdio`` (a descriptor, or
    None for ``/dev/null``) its descriptors 0, 1, 2 in order (fewer than three keep the rest
    inherited; each given one is closed), point ``sys.std*`` at them, call ``prepare()`` (the
    worker's own set-up: its environment, its network namespace) and exit with the integer
    that ``function(argv)`` of ``target`` (``"module:function"``) returns (0 for another
    value; 1 after an exception, whose traceback goes to its standard error)."""
    code = 1
    try:
        if parent is not None:
            die_with_parent(parent)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loop.sock.close()
        for fd in loop.wake:
            os.close(fd)
        for target_fd, given in enumerate(stdio):
            source = os.open(os.devnull, os.O_RDONLY) if given is None else given
            os.dup2(source, target_fd)
            os.close(source)
        # Whatever the client's sys.std* were (a notebook's stream, a test runner's capture),
        # the worker writes to its own descriptors, like an exec'd process.
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        if prepare is not None:
            prepare()
        module, _, function = target.partition(":")
        result = getattr(importlib.import_module(module), function)(argv)
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
