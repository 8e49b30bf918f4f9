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

- client -> zygote: ``{"target": "module:function", "workers": [[ARG, ...], ...], "env":
  {...}}`` (``env`` optional: the children's whole environment): one request for every process
  of a batch (a whole ``spawn_procs`` mesh: the zygote forks them back to back, and they start
  up in parallel while it forks the next, with one round trip for them all). Attached
  (``SCM_RIGHTS``), for each worker in order: the write end of its stdout pipe, then that of
  its stderr pipe where ``"stderr": true`` and the read end of its stdin where ``"stdin":
  true``. A worker runs ``function(argv)`` (by default ``monarch.actor._hosts.worker:main``,
  ``WORKER_TARGET``) with those pipes as its standard output (and error) and the stdin given
  (else ``/dev/null``) as its standard input, and exits with the integer it returns; it closes
  the descriptors of the others. With ``"identities": CA_DIR`` each worker is handed a
  Chrysalis identity the zygote issued ahead from the development CA in that directory
  (``handed_identity``; see "Identities issued ahead" below).
- zygote -> client: ``{"spawned": [PID, ...]}`` for each request, in request order, one PID
  per worker in order, with ``"error": "..."`` where it could not fork them all (the PIDs are
  then those of the workers forked before the failure), and ``{"exited": PID, "status":
  CODE}`` when a worker ends (``CODE`` as ``subprocess.Popen.returncode``: negative for a
  signal).

The zygote exits when the client's end of the socket closes (the client exited or was killed);
its workers notice the loss of their parent link and exit on their own (see ``worker``).

Identities issued ahead: a worker's first act is to issue its leaf (key generation, the
certificate builder, the CA loaded from disk): 4 ms of its CPU on a quiet machine, up to 40 ms
of wall time when four workers start on two cores, much of it copy-on-write page faults on
the zygote's heap. The zygote instead issues ``IDENTITY_BATCH`` identities in a row when a
request wants more than it holds (paying those faults once per batch), pops one before each
fork and leaves it in a module global the worker takes (``handed_identity``). The identity
contract is unchanged: every worker gets a key and certificate of its own, never handed to
another (popped before the fork that hands it), and its PID is derived from that leaf. A
worker's memory holds the identities issued ahead for later workers, as it holds the CA's key
(it reads the CA directory): every process of one program is in one trust domain. The same
mechanism as ``chrysalis scale``'s fork server (``ForkServer.start(prepare=...)``).

The server's loop, the descriptors' passing, the exit reports and a forked worker's set-up are
``chrysalis.node.forking`` (which ``chrysalis scale``'s fork server uses too); the batches and
environments of the requests, and the threaded client, are the zygote's own.
"""

from __future__ import annotations

import _imp
import array
import contextlib
import functools
import gc
import importlib
import json
import os
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from chrysalis.node import forking
from chrysalis.quic import DevelopmentIdentityProvider, Identity

__all__ = [
    "IDENTITY_BATCH",
    "MAX_BATCH",
    "WORKER_TARGET",
    "Zygote",
    "ZygoteProcess",
    "ZygoteUnavailableError",
    "handed_identity",
]

_MAX_MESSAGE: Final = 128 * 1024  # a whole environment fits
#: What a zygote child runs unless told otherwise.
WORKER_TARGET: Final = "monarch.actor._hosts.worker:main"
#: Workers in one request (their descriptors must fit one message: the kernel passes at most
#: 253 per message, ``SCM_MAX_FD``); a larger batch is sent as several requests.
MAX_BATCH: Final = 64
#: Workers one zygote may run at once (a bound on its bookkeeping).
_MAX_CHILDREN: Final = 4096
#: Identities the zygote issues in one go, ahead of the workers that take them (at most this
#: many, plus a request's size, are held at once).
IDENTITY_BATCH: Final = 16
#: Longest CA directory path a request may name.
_MAX_CA_DIR: Final = 4096
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


def _fork_quietly() -> int:
    """``fork_between_imports``, without Python's warning about forking with threads (3.12+):
    the zygote runs single-threaded from then on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return fork_between_imports()


_ISSUED: list[tuple[str, Identity]] = []
"""In the zygote: identities issued ahead, with the CA directory each came from."""
_HANDED: list[tuple[str, Identity]] = []
"""At most one: the identity handed to the worker about to be forked (set in the zygote right
before the fork; the worker takes it with ``handed_identity``, the next fork replaces it)."""


def _issue_ahead(ca_dir: str, wanted: int) -> None:  # pragma: no cover - runs in the zygote
    """Hold at least ``wanted`` identities of ``ca_dir``'s CA: issue ``IDENTITY_BATCH`` more
    (or ``wanted``, if larger) when fewer are held. Those of another CA are dropped."""
    _ISSUED[:] = [entry for entry in _ISSUED if entry[0] == ca_dir]
    if len(_ISSUED) >= wanted:
        return
    provider = DevelopmentIdentityProvider(ca_dir)
    _ISSUED.extend((ca_dir, provider.issue_identity()) for _ in range(max(wanted, IDENTITY_BATCH)))


def _hand_next() -> None:  # pragma: no cover - runs in the zygote
    """Before a fork: move the next identity issued ahead to ``_HANDED`` (none if none left)."""
    _HANDED[:] = [_ISSUED.pop()] if _ISSUED else []


def handed_identity(ca_dir: Path | str) -> Identity | None:
    """In a worker forked by the zygote: the identity it was handed (see the module docstring),
    once; ``None`` if none was (an exec'd worker, a request without ``identities``) or it is
    another CA directory's."""
    if not _HANDED:
        return None
    directory, identity = _HANDED.pop()
    return identity if directory == str(ca_dir) else None


class ZygoteUnavailableError(RuntimeError):
    """The zygote could not be started or has gone; callers fall back to exec."""


class ZygoteProcess:
    """A worker forked by the zygote, with the part of ``subprocess.Popen`` that spawning uses."""

    def __init__(
        self, zygote: Zygote, pid: int, stdout: IO[bytes], stderr: IO[bytes] | None = None
    ) -> None:
        self._zygote = zygote
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.stdin: IO[bytes] | None = None  # the write end its spawner kept, if any
        self.stderr: IO[bytes] | None = stderr
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
        if not forking.can_fork_server():
            raise ZygoteUnavailableError("this platform cannot fork a zygote")
        parent, pid = forking.fork_server(_serve, fork=_fork_quietly)
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
        stderr: bool = False,
    ) -> ZygoteProcess:
        """Fork one process running ``target(argv)`` with ``env`` as its environment (the
        zygote's when None); its stdout is the returned pipe, and so is its stderr with
        ``stderr`` (else it shares the zygote's); its stdin is the descriptor ``stdin`` (the
        caller keeps and closes its own copy; ``/dev/null`` when None)."""
        processes, error = self._request(
            [argv], target, env, None if stdin is None else [stdin], stderr
        )
        if error is not None:
            raise ZygoteUnavailableError(f"the zygote could not fork: {error}")
        return processes[0]

    def spawn_many(
        self,
        argvs: Sequence[Sequence[str]],
        target: str = WORKER_TARGET,
        env: Mapping[str, str] | None = None,
        stderr: bool = False,
        identities: Path | str | None = None,
    ) -> tuple[list[ZygoteProcess], str | None]:
        """Fork one process per ``argvs`` entry, as ``spawn`` does (stdin ``/dev/null``), with
        one request per ``MAX_BATCH`` of them: the processes start up in parallel; with
        ``identities`` (a development CA directory) each is handed an identity of that CA
        issued ahead (``handed_identity``). Returns the
        processes forked, in order, and why the others were not (None when all were): the
        caller starts those another way. ``ZygoteUnavailableError`` if the zygote has gone
        before the first was forked."""
        processes: list[ZygoteProcess] = []
        for first in range(0, len(argvs), MAX_BATCH):
            try:
                batch, error = self._request(
                    argvs[first : first + MAX_BATCH], target, env, None, stderr, identities
                )
            except ZygoteUnavailableError as exc:
                if not processes:
                    raise
                return processes, str(exc)
            processes.extend(batch)
            if error is not None:
                return processes, error
        return processes, None

    def _request(
        self,
        argvs: Sequence[Sequence[str]],
        target: str,
        env: Mapping[str, str] | None,
        stdins: Sequence[int] | None,
        stderr: bool,
        identities: Path | str | None = None,
    ) -> tuple[list[ZygoteProcess], str | None]:
        """One request (at most ``MAX_BATCH`` workers): the processes forked and the
        zygote's error, if it could not fork them all."""
        if not 0 < len(argvs) <= MAX_BATCH:
            raise ValueError(f"a zygote request forks 1 to {MAX_BATCH} workers, not {len(argvs)}")
        outs = [os.pipe() for _ in argvs]
        errs = [os.pipe() for _ in argvs] if stderr else []
        ours = [w for _, w in outs] + [w for _, w in errs]  # closed below, whatever happens
        passed: list[int] = []
        for index in range(len(argvs)):
            passed.append(outs[index][1])
            if stderr:
                passed.append(errs[index][1])
            if stdins is not None:
                passed.append(stdins[index])
        kept = [r for r, _ in outs] + [r for r, _ in errs]  # handed to the processes or closed
        try:
            with self._lock:
                if self._closed:
                    raise ZygoteUnavailableError("the zygote has exited")
                request: dict[str, object] = {
                    "target": target,
                    "workers": [list(argv) for argv in argvs],
                }
                if env is not None:
                    request["env"] = dict(env)
                if stderr:
                    request["stderr"] = True
                if stdins is not None:
                    request["stdin"] = True
                if identities is not None:
                    request["identities"] = str(identities)
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
        except BaseException:
            for fd in kept:
                os.close(fd)
            raise
        finally:
            for fd in ours:
                os.close(fd)
        spawned = reply.get("spawned")
        pids = [int(pid) for pid in spawned] if isinstance(spawned, list) else []
        pids = pids[: len(argvs)]
        processes: list[ZygoteProcess] = []
        for index, pid in enumerate(pids):
            process = ZygoteProcess(
                self,
                pid,
                os.fdopen(outs[index][0], "rb", buffering=0),
                os.fdopen(errs[index][0], "rb", buffering=0) if stderr else None,
            )
            with self._state:
                self._children[pid] = process
                early = self._early_exits.pop(pid, None)
            if early is not None:
                process._set_exit(early)
            processes.append(process)
        for index in range(len(pids), len(argvs)):  # not forked: nobody writes to these
            os.close(outs[index][0])
            if stderr:
                os.close(errs[index][0])
        if len(pids) < len(argvs):
            return processes, str(reply.get("error") or "no process id in the zygote's reply")
        return processes, None

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


def _serve(sock: socket.socket) -> int:  # pragma: no cover - runs in the zygote
    """The zygote's loop: fork workers on request, report their exits, end on EOF."""
    # Everything inherited from the client lives as long as the zygote and its workers: move it
    # out of the cyclic collector's reach once, here, so that no worker's collections (its
    # full ``gc.collect()`` before it reports ready, the automatic ones while it starts) walk
    # the client's whole heap again (about 100 ms per worker on a loaded 2-core machine).
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client handles ^C and stops workers
    return forking.serve(sock, _fork_batch, max_bytes=_MAX_MESSAGE, max_fds=3 * MAX_BATCH)


def _fork_batch(  # pragma: no cover - runs in the zygote
    loop: forking.ServerLoop, data: bytes, fds: list[int]
) -> None:
    """Serve one request (module docstring): fork its workers back to back, then send one
    reply; the zygote's copies of the descriptors are closed in every case."""
    pids: list[int] = []
    error: str | None = None
    try:
        request = json.loads(data)
        workers = request["workers"]
        if not isinstance(workers, list) or not 0 < len(workers) <= MAX_BATCH:
            raise ValueError(f"workers must be a list of 1 to {MAX_BATCH} command lines")
        argvs = [[str(a) for a in argv] for argv in workers]
        target = str(request.get("target", WORKER_TARGET))
        env = request.get("env")
        if env is not None and not isinstance(env, dict):
            raise ValueError("env must be an object")
        with_stderr = bool(request.get("stderr"))
        with_stdin = bool(request.get("stdin"))
        ca_dir = request.get("identities")
        if ca_dir is not None and not (isinstance(ca_dir, str) and 0 < len(ca_dir) <= _MAX_CA_DIR):
            raise ValueError("identities must name a CA directory")
        per_worker = 1 + with_stderr + with_stdin
        if len(fds) != per_worker * len(argvs):
            raise ValueError(f"expected {per_worker * len(argvs)} descriptors, got {len(fds)}")
        if ca_dir is not None:
            try:
                _issue_ahead(ca_dir, len(argvs))
            except Exception as exc:  # the workers issue their own (and report the problem)
                _ISSUED.clear()
                print(f"monarch zygote: no identities issued ahead: {exc!r}", file=sys.stderr)
        for index, argv in enumerate(argvs):
            if len(loop.children) >= _MAX_CHILDREN:
                raise ValueError(f"more than {_MAX_CHILDREN} workers")
            own = fds[index * per_worker : (index + 1) * per_worker]
            if ca_dir is not None:
                _hand_next()
            pid = fork_between_imports()
            if pid == 0:
                for fd in fds:  # the other workers' descriptors: theirs alone
                    if fd not in own:
                        os.close(fd)
                # Standard input (the one sent, else /dev/null), output, then error if sent.
                stdio = [own[-1] if with_stdin else None, *own[: 2 if with_stderr else 1]]
                prepare = None if env is None else functools.partial(_set_environment, env)
                forking.run_child(loop, target, argv, stdio, prepare=prepare)
            loop.children.add(pid)
            pids.append(pid)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        error = repr(exc)
    _HANDED.clear()  # the zygote keeps no copy of an identity it handed
    for fd in fds:
        os.close(fd)
    reply: dict[str, object] = {"spawned": pids}
    if error is not None:
        reply["error"] = error
    loop.sock.send(json.dumps(reply).encode())


def _set_environment(env: dict[str, str]) -> None:  # pragma: no cover - in a worker
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
