"""A warm process that forks worker processes on request (``chrysalis scale``'s fork start).

Why: a worker started as a fresh interpreter spends most of its start-up importing the Chrysalis
stack (aioquic or qh3, cryptography, the nameserver and node layers): about 0.8 s per process on
two busy cores, far more than the protocol work of joining a tree. The launcher has imported all
of it already, so it forks one *fork server* (``ForkServer.start``) before it starts anything
else; the fork server warms what the workers will need (``warm``) and then forks each worker,
which starts with every module imported and every lazily loaded library initialised.

Why not fork the launcher directly: by the time it launches workers it runs an event loop, a
QUIC endpoint and sockets; a fork would copy them all. The fork server is forked once, before
any of that, and stays single-threaded: a blocking loop on one socket.

Protocol (a ``SOCK_SEQPACKET`` socket pair, one JSON message per packet):

- launcher -> server: ``{"target": "module:function", "argv": [...], "netns": PATH}`` with
  three descriptors attached (``SCM_RIGHTS``): the worker's stdin, stdout and stderr. The
  worker enters the network namespace named by the file ``PATH`` first (``setns``, where
  ``netns`` is given and not null: ``chrysalis scale --netns``), then runs ``function(argv)``
  with the descriptors as 0, 1 and 2 and exits with the integer it returns (1 after an
  exception, whose traceback goes to its stderr).
- server -> launcher: ``{"spawned": PID}`` (or ``{"error": "..."}``) for each request, in
  request order, and ``{"exited": PID, "status": CODE}`` when a worker ends (``CODE`` as
  ``subprocess.Popen.returncode``: negative for a signal).

Children die with their parent: the server asks the kernel for ``SIGKILL`` when the launcher's
thread that forked it exits (``PR_SET_PDEATHSIG``, Linux), every worker likewise when the
server exits, and the server exits when the launcher's end of the socket closes. So a launcher
killed with ``SIGKILL`` leaves no worker behind. Where there is no ``prctl`` (not Linux) the
socket and the workers' own lifelines (their stdin) remain.

The server's loop, the descriptors' passing, the exit reports and a forked worker's set-up are
``chrysalis.node.forking`` (which monarch-actor's zygote uses too); the requests and the
asyncio client are this module's own.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import gc
import json
import os
import select
import signal
import socket
from collections.abc import Callable, Sequence
from typing import Final, final

from chrysalis.node import forking
from chrysalis.node.netns import enter_netns as _enter_netns

__all__ = ["ForkServer", "ForkServerError", "ForkedProcess"]

_MAX_MESSAGE: Final = 64 * 1024
_MAX_CHILDREN: Final = 8192
"""Workers one server may run at once (a bound on its bookkeeping)."""


class ForkServerError(RuntimeError):
    """The fork server could not be started, could not fork, or has gone."""


@final
class ForkedProcess:
    """A worker forked by the server: the part of ``asyncio.subprocess.Process`` that
    launching uses (``pid``, ``returncode``, ``wait``, ``send_signal``)."""

    __slots__ = ("_exited", "pid", "returncode")

    def __init__(self, pid: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = exited

    async def wait(self) -> int:
        """Wait until the worker ended; its exit status (negative: killed by that signal)."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        """Signal the worker unless its exit was reported already."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        if not self._exited.done():
            self._exited.set_result(code)


@final
class ForkServer:
    """The launcher's handle on its fork server (see the module docstring).

    ``start`` forks it (call it before the process runs an event loop's I/O, threads or
    sockets it must not share: they are copied into the server and every worker);
    ``spawn`` forks one worker from it, ``close`` ends it. ``on_exit`` is called with every
    worker that ends, in the launcher's event loop."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self._replies: list[asyncio.Future[dict[str, object]]] = []
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.on_exit: Callable[[ForkedProcess], None] | None = None

    @classmethod
    def start(
        cls,
        warm: Callable[[], None] | None = None,
        *,
        prepare: Callable[[], None] | None = None,
    ) -> ForkServer:
        """Fork the server from the calling thread; it runs ``warm()`` once (import and
        initialise what workers use), freezes the garbage collector's heap (so workers do
        not copy its pages by collecting them) and serves, calling ``prepare()`` before each
        fork (what it leaves in module state is the next worker's: e.g. an identity issued
        ahead, in a batch; an exception there fails that spawn). ``ForkServerError`` where
        this platform cannot fork or pass descriptors."""
        if not forking.can_fork_server():
            raise ForkServerError("this platform cannot run a fork server")
        ours, pid = forking.fork_server(lambda sock: _serve(sock, warm, prepare), lifeline=True)
        ours.setblocking(False)
        return cls(ours, pid)

    @property
    def alive(self) -> bool:
        """Whether the server still answers."""
        return not self._closed

    def _attach(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._lock = asyncio.Lock()
            loop.add_reader(self._sock.fileno(), self._on_readable)
        elif self._loop is not loop:
            raise ForkServerError("a fork server serves one event loop")
        assert self._lock is not None
        return self._lock

    async def spawn(
        self,
        target: str,
        argv: Sequence[str],
        *,
        stdin: int,
        stdout: int,
        stderr: int,
        netns: str | None = None,
    ) -> ForkedProcess:
        """Fork one worker running ``target`` (``"module:function"``) on ``argv`` with the
        three descriptors as its standard streams (the caller keeps and closes its copies),
        in the network namespace named by the file ``netns`` if given (a worker that cannot
        enter it exits with status 1, the reason on its stderr).
        ``ForkServerError`` if the server is gone or could not fork."""
        lock = self._attach()
        message = json.dumps({"target": target, "argv": list(argv), "netns": netns}).encode()
        if len(message) > _MAX_MESSAGE:
            raise ValueError(f"a spawn request of {len(message)} bytes exceeds {_MAX_MESSAGE}")
        async with lock:
            if self._closed:
                raise ForkServerError("the fork server has exited")
            assert self._loop is not None
            reply_future: asyncio.Future[dict[str, object]] = self._loop.create_future()
            self._replies.append(reply_future)
            fds = array.array("i", [stdin, stdout, stderr])
            try:
                # One small packet on a local socket pair: only a full buffer blocks it, and
                # the server answers every request before it reads the next.
                self._sock.setblocking(True)
                try:
                    self._sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                finally:
                    self._sock.setblocking(False)
            except OSError as exc:
                self._replies.remove(reply_future)
                self._lost()
                raise ForkServerError(f"the fork server has gone: {exc}") from exc
            reply = await reply_future
        if "spawned" not in reply:
            raise ForkServerError(f"the fork server could not fork: {reply.get('error')}")
        pid = int(str(reply["spawned"]))
        process = ForkedProcess(pid, self._loop.create_future())
        self._children[pid] = process
        early = self._early.pop(pid, None)
        if early is not None:
            self._exit(process, early)
        return process

    def _exit(self, process: ForkedProcess, code: int) -> None:
        process._set_exit(code)
        if self.on_exit is not None:
            self.on_exit(process)

    def _on_readable(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            message = json.loads(data)
            if "exited" in message:
                pid, code = int(message["exited"]), int(message["status"])
                process = self._children.pop(pid, None)
                if process is not None:
                    self._exit(process, code)
                elif len(self._early) < _MAX_CHILDREN:
                    self._early[pid] = code  # ended before its spawn reply was handled
            elif self._replies:
                future = self._replies.pop(0)
                if not future.done():
                    future.set_result(message)

    def _lost(self) -> None:
        """The server has gone: fail pending spawns; its workers died with it (killed by
        their death signal), so report every one still counted as running as killed."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
        for future in self._replies:
            if not future.done():
                future.set_result({"error": "the fork server has exited"})
        self._replies.clear()
        orphans, self._children = list(self._children.values()), {}
        for process in orphans:
            self._exit(process, -int(signal.SIGKILL))

    def close(self) -> None:
        """End the server (its remaining workers die with it) and reap it (bounded)."""
        self._lost()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for _ in range(200):  # the server exits on EOF at once; 2 s at most, then kill it
            with contextlib.suppress(ChildProcessError):
                pid, _status = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    select.select([], [], [], 0.01)
                    continue
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _serve(
    sock: socket.socket,
    warm: Callable[[], None] | None,
    prepare: Callable[[], None] | None = None,
) -> int:  # pragma: no cover - runs in the fork server
    """The server's loop: fork workers on request, report their exits, end on EOF."""
    signal.set_wakeup_fd(-1)  # the launcher's event loop owns the inherited wake-up socket
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C reaches the launcher, which stops workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if warm is not None:
        warm()
    gc.collect()
    gc.freeze()  # workers inherit a frozen heap: collections in them do not touch its pages
    handler = functools.partial(_fork_worker, prepare=prepare)
    return forking.serve(sock, handler, max_bytes=_MAX_MESSAGE, max_fds=3)


def _fork_worker(
    loop: forking.ServerLoop,
    data: bytes,
    fds: list[int],
    *,
    prepare: Callable[[], None] | None = None,
) -> None:  # pragma: no cover - runs in the fork server
    """Serve one request (module docstring); the server's copies of the descriptors are closed
    in every case."""
    try:
        request = json.loads(data)
        argv = [str(a) for a in request["argv"]]
        target = str(request["target"])
        netns = request.get("netns")
        if netns is not None and not isinstance(netns, str):
            raise TypeError(f"netns must be a path, not {netns!r}")
        if len(fds) != 3:
            raise ValueError(f"expected 3 descriptors, got {len(fds)}")
        if len(loop.children) >= _MAX_CHILDREN:
            raise ValueError(f"more than {_MAX_CHILDREN} workers")
        if prepare is not None:
            prepare()
        server = os.getpid()
        pid = os.fork()
    except Exception as exc:  # the request fails; the server serves on
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            loop.sock.send(json.dumps({"error": repr(exc)}).encode())
        return
    if pid == 0:
        # The network namespace is entered before the worker binds anything; a failure goes
        # to its own log.
        prepare = None if netns is None else functools.partial(_enter_netns, netns)
        forking.run_child(loop, target, argv, fds, parent=server, prepare=prepare)
    for fd in fds:
        os.close(fd)
    loop.children.add(pid)
    with contextlib.suppress(OSError):
        loop.sock.send(json.dumps({"spawned": pid}).encode())
