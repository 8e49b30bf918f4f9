"""A warm process that forks Monarch worker processes on request.

Why: a worker started with ``python -m monarch.actor._worker`` spends most of its start-up
importing the Chrysalis stack (aioquic, cryptography, the node layer): several hundred
milliseconds per process, far more than the rest of spawning (identity, joining the client's
node). The client has imported all of it already, so on POSIX it forks one *zygote* the first
time it spawns workers; the zygote forks each worker, which starts with every module warm.

Why not fork the client directly: the client runs threads (its runtime loop, actor threads), and
a fork copies their locks in whatever state they are in. The zygote is forked once, from the
thread that calls ``spawn_procs``, and runs single-threaded from then on, so every worker is
forked from a process without other threads. ``os.register_at_fork`` handlers of the libraries
involved (logging, threading) reset their state in the zygote.

Protocol (a ``SOCK_SEQPACKET`` socket pair, one JSON message per packet):

- client -> zygote: ``{"target": "module:function", "argv": [...], "env": {...}}`` (``env``
  optional: the child's whole environment) with the write end of the worker's stdout pipe attached
  (``SCM_RIGHTS``), optionally followed by the read end of its stdin; the worker runs
  ``function(argv)`` (by default ``monarch.actor._hosts.worker:main``, ``WORKER_TARGET``) with
  that pipe as its standard output and the stdin given (else ``/dev/null``) as its standard
  input, and exits with the integer it returns.
- zygote -> client: ``{"spawned": PID}`` (or ``{"error": "..."}``) for each request, in request
  order, and ``{"exited": PID, "status": CODE}`` when a worker ends (``CODE`` as
  ``subprocess.Popen.returncode``: negative for a signal).

The zygote exits when the client's end of the socket closes (the client exited or was killed);
its workers notice the loss of their parent link and exit on their own (see ``worker``).
"""

from __future__ import annotations

import _imp
import array
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, Final

__all__ = ["WORKER_TARGET", "Zygote", "ZygoteProcess", "ZygoteUnavailableError"]

_MAX_MESSAGE: Final = 128 * 1024  # a whole environment fits
#: What a zygote child runs unless told otherwise.
WORKER_TARGET: Final = "monarch.actor._hosts.worker:main"
#: Workers one zygote may run at once (a bound on its bookkeeping).
_MAX_CHILDREN: Final = 4096
#: Rounds ``fork_between_imports`` waits for other threads' imports before forking anyway.
_IMPORT_SETTLE_ROUNDS: Final = 16


def _importing_now() -> list[str]:
    """Modules whose import is in progress (their body is running) in some thread."""
    return [
        name
        for name, module in list(sys.modules.items())
        if getattr(getattr(module, "__spec__", None), "_initializing", False)
    ]


def fork_between_imports() -> int:
    """``os.fork()`` at a moment when no other thread is importing a module.

    A thread running a module's body holds that module's import lock; a fork copies the lock
    held and not the thread, so in the child every later import of that module (``pickle``
    finding ``cloudpickle``'s functions, say) waits forever. So: wait for each import in flight
    (importing it here blocks until the other thread finished it), then fork while holding the
    global import lock, which keeps other threads from starting a new import meanwhile. Imports
    in progress in the calling thread (a fork from a module body) cannot be waited for and are
    left as they are; after ``_IMPORT_SETTLE_ROUNDS`` rounds it forks anyway."""
    ours: set[str] = set()
    for _ in range(_IMPORT_SETTLE_ROUNDS):
        for name in _importing_now():
            if name in ours:
                continue
            with contextlib.suppress(Exception):  # a failing import is its own thread's error
                importlib.import_module(name)
            if name in _importing_now():
                ours.add(name)  # still running: this thread's own import
        _imp.acquire_lock()
        try:
            if set(_importing_now()) <= ours:
                return os.fork()  # the child releases the lock below too
        finally:
            _imp.release_lock()
    return os.fork()


class ZygoteUnavailableError(RuntimeError):
    """The zygote could not be started or has gone; callers fall back to exec."""


class ZygoteProcess:
    """A worker forked by the zygote, with the part of ``subprocess.Popen`` that spawning uses."""

    def __init__(self, zygote: Zygote, pid: int, stdout: IO[bytes]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.stdin: IO[bytes] | None = None  # the write end its spawner kept, if any
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        """The exit code, or ``None`` while the worker runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker to end; ``subprocess.TimeoutExpired`` after ``timeout``."""
        if not self._exited.wait(timeout):
            import subprocess

            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the worker unless it has been reaped already."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The client's handle on its zygote process (see the module docstring)."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self.parent = os.getpid()  # a forked client must not use its parent's zygote
        self._lock = threading.Lock()  # one request at a time: replies come in request order
        self._state = threading.Condition()
        self._replies: list[dict[str, object]] = []
        self._children: dict[int, ZygoteProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="monarch-zygote", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls) -> Zygote:
        """Fork the zygote from the calling thread; ``ZygoteUnavailableError`` if impossible."""
        if not hasattr(os, "fork") or not hasattr(socket, "SOCK_SEQPACKET"):
            raise ZygoteUnavailableError("this platform cannot fork a zygote")
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            pid = fork_between_imports()
        if pid == 0:  # pragma: no cover - runs in the zygote
            code = 1
            try:
                parent.close()
                code = _serve(child)
            finally:
                os._exit(code)
        child.close()
        return cls(parent, pid)

    @property
    def alive(self) -> bool:
        return not self._closed

    def spawn(
        self,
        argv: Sequence[str],
        target: str = WORKER_TARGET,
        env: Mapping[str, str] | None = None,
        stdin: int | None = None,
    ) -> ZygoteProcess:
        """Fork one process running ``target(argv)`` with ``env`` as its environment (the
        zygote's when None); its stdout is the returned pipe, its stdin the descriptor
        ``stdin`` (the caller keeps and closes its own copy; ``/dev/null`` when None)."""
        read_fd, write_fd = os.pipe()
        passed = [write_fd] if stdin is None else [write_fd, stdin]
        try:
            with self._lock:
                if self._closed:
                    raise ZygoteUnavailableError("the zygote has exited")
                request: dict[str, object] = {"target": target, "argv": list(argv)}
                if env is not None:
                    request["env"] = dict(env)
                message = json.dumps(request).encode()
                if len(message) > _MAX_MESSAGE:
                    raise ValueError("worker command line too long for the zygote protocol")
                try:
                    self._sock.sendmsg(
                        [message],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", passed))],
                    )
                except OSError as exc:
                    raise ZygoteUnavailableError(f"the zygote has gone: {exc}") from exc
                reply = self._next_reply()
        finally:
            os.close(write_fd)
        if "spawned" not in reply:
            os.close(read_fd)
            raise ZygoteUnavailableError(f"the zygote could not fork: {reply.get('error')}")
        pid = int(str(reply["spawned"]))
        process = ZygoteProcess(self, pid, os.fdopen(read_fd, "rb", buffering=0))
        with self._state:
            self._children[pid] = process
            early = self._early_exits.pop(pid, None)
        if early is not None:
            process._set_exit(early)
        return process

    def _next_reply(self) -> dict[str, object]:
        with self._state:
            while not self._replies:
                if self._closed:
                    raise ZygoteUnavailableError("the zygote has exited")
                self._state.wait()
            return self._replies.pop(0)

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(_MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                if "exited" in message:
                    pid, code = int(message["exited"]), int(message["status"])
                    with self._state:
                        process = self._children.pop(pid, None)
                        if process is None and len(self._early_exits) < _MAX_CHILDREN:
                            self._early_exits[pid] = code  # exited before spawn() saw it
                    if process is not None:
                        process._set_exit(code)
                else:
                    with self._state:
                        self._replies.append(message)
                        self._state.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with self._state:
                self._closed = True
                orphans = list(self._children.values())
                self._children.clear()
                self._state.notify_all()
            # The zygote is gone, so nobody reaps these; report them as lost, not running.
            for process in orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, 0)
                    continue
                process._set_exit(-int(signal.SIGKILL))

    def close(self) -> None:
        """Close the socket; the zygote exits (its workers run on until they are stopped)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _serve(sock: socket.socket) -> int:  # pragma: no cover - runs in the zygote
    """The zygote's loop: fork workers on request, report their exits, end on EOF."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client handles ^C and stops workers
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"exited": pid, "status": _exit_code(status)}).encode())
        if sock.fileno() not in ready:
            continue
        try:
            data, ancdata, _, _ = sock.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(8))
        except OSError:
            return 0
        if not data:
            return 0
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        try:
            request = json.loads(data)
            argv = [str(a) for a in request["argv"]]
            target = str(request.get("target", WORKER_TARGET))
            env = request.get("env")
            if env is not None and not isinstance(env, dict):
                raise ValueError("env must be an object")
            if len(fds) not in (1, 2):
                raise ValueError("expected a stdout descriptor and at most a stdin one")
            if len(children) >= _MAX_CHILDREN:
                raise ValueError(f"more than {_MAX_CHILDREN} workers")
            pid = fork_between_imports()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": repr(exc)}).encode())
            continue
        if pid == 0:
            stdin_fd = fds[1] if len(fds) > 1 else None
            _run_worker(sock, (wake_r, wake_w), fds[0], target, argv, env, stdin_fd)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"spawned": pid}).encode())


def _run_worker(  # pragma: no cover - runs in a forked worker
    sock: socket.socket,
    wake: tuple[int, int],
    stdout_fd: int,
    target: str,
    argv: list[str],
    env: dict[str, str] | None,
    stdin_fd: int | None = None,
) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sock.close()
        for fd in wake:
            os.close(fd)
        source = os.open(os.devnull, os.O_RDONLY) if stdin_fd is None else stdin_fd
        os.dup2(source, 0)
        os.close(source)
        os.dup2(stdout_fd, 1)
        os.close(stdout_fd)
        # The client's sys.std* may be anything (a notebook's stream, a test runner's capture):
        # the child writes to its own descriptors, like an exec'd process.
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        if env is not None:
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        import importlib

        module, _, function = target.partition(":")
        code = getattr(importlib.import_module(module), function)(argv)
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
