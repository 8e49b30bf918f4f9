"""Worker processes of the client: their groups, start-up, exits and the worker-process flags.

Why a module of its own: a ``WorkerGroup`` is the set of processes of one ``spawn_procs`` call
(``LocalWorkerGroup`` here, children of the client's OS process, forked by the client's zygote
or exec'd; ``attach_session.RemoteWorkerGroup`` on attached hosts). It knows its processes'
PIDs, exit events and how to stop and kill them; what an exit means for the program is its
owner's business, told through the ``on_exit`` callback it is built with
(``ClientNodeLayer.process_died``), and its heartbeats come from the watchdog that callback's
owner hands it. So groups import nothing of the client's node.

- A reaper per worker turns its exit into ``on_exit``: a failure unless it was asked for (a
  stop, a kill by the owner, client shutdown).
- Liveness: a worker that leaves the heartbeats unanswered for ``supervision_watchdog_timeout``
  seconds is declared dead exactly as if it had exited (``on_unresponsive``) and fenced.
- ``stop()`` waits (bounded) for the ``STOP_PROC`` acknowledgements and the exits, and kills
  stragglers; ``kill()`` SIGKILLs at once.
- Start-up: each worker prints its PID on stdout once joined (``read_worker_pids``), after
  optional stage lines; what else it prints is the program's output and is forwarded.
- Process lifecycle records (``_runtime.telemetry.record_lifecycle``, subject ``proc``): a
  group records ``proc_starting`` as it starts a worker, ``proc_ready`` once its PID line came,
  and ``proc_exited`` (``exit_reason``: ``exit code N`` or ``signal SIGKILL``) once it is reaped,
  in the process that owns the group.

Also here: whether this process is a worker (``mark_worker_process``, ``register_worker``,
called by ``worker.main``) and the client's zygote (``zygote``), forked on first use.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, Protocol

from chrysalis.core import Pid
from monarch.actor._base.future import Future, _Cell
from monarch.actor._hosts.commands import (
    EXIT_TIMEOUT,
    STARTUP_MARKER,
    BootstrapCommand,
    _describe_exit,
    exec_worker,
    exit_timeout,
    spawn_timeout,
    worker_command,
)
from monarch.actor._hosts.zygote import Zygote, ZygoteUnavailableError
from monarch.actor._runtime import telemetry as _telemetry
from monarch.actor._runtime.logging import LineAggregator, LinePrefixer, rank_prefix
from monarch.actor._runtime.main_module import main_reference
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._runtime.watchdog import (
    HeartbeatDriver,
)
from monarch.config import _registry as _config
from monarch.config._registry import ChannelTransport

if TYPE_CHECKING:
    from monarch.actor._mesh.meshes import (
        _ProcMeshState,
    )

__all__ = [
    "ExitCallback",
    "LocalWorkerGroup",
    "OutputForwarder",
    "WorkerGroup",
    "WorkerProcess",
    "check_spawn_method",
    "exit_reason",
    "forward_output",
    "mark_worker_process",
    "read_worker_pids",
    "register_worker",
]

_log = logging.getLogger("monarch.actor.host.groups")


class ExitCallback(Protocol):
    """What a group calls when one of its processes is gone (any thread, once per process):
    ``ClientNodeLayer.process_died``. ``failure``: the owner did not ask for it; ``fenced``:
    declared dead for not answering heartbeats, it may still run."""

    def __call__(self, pid: Pid, reason: str, *, failure: bool, fenced: bool = False) -> None: ...


class WorkerProcess(Protocol):
    """What spawning uses of a worker process: ``subprocess.Popen`` or ``ZygoteProcess``."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    @property
    def stderr(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


_worker_process = False
_worker_pid: bytes | None = None
_worker_authority: bytes | None = None


def mark_worker_process() -> None:
    """Called by ``worker.main``: this process is a worker, not a client."""
    global _worker_process
    _worker_process = True


def register_worker(pid: bytes, authority: bytes) -> None:
    """Called by ``worker.main`` once its identity exists: its own PID and its client's (whose
    host agent spawns the processes this worker's actors ask for, see ``agent``)."""
    global _worker_pid, _worker_authority
    _worker_pid, _worker_authority = pid, authority


def _in_worker_process() -> bool:
    return _worker_process


def exit_reason(status: int) -> str:
    """A ``proc_exited`` record's reason for a wait status: ``exit code N`` or, for a process
    killed by a signal (a negative status), ``signal SIGKILL``."""
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"exit code {status}"


def forward_output(stream: IO[bytes] | None, prefix: bytes = b"") -> None:
    """Copy what one worker writes to its stdout after its PID line to this process's stdout,
    each line with ``prefix`` (``OutputForwarder`` of one stream)."""
    OutputForwarder([stream], [prefix]).start()


class OutputForwarder:
    """Copies the stdout pipes of a group's workers to this process's stdout, one daemon thread
    for them all.

    Why: the pipe carries the readiness line; a worker that prints more than a pipe's buffer
    would block in ``print`` if nobody read it. Each complete line gets its worker's prefix
    (``_runtime.logging.rank_prefix``: ``[1] ``, unless ``prefix_with_rank`` is off;
    ``LinePrefixer``); with a window set (``set_window``, from ``ProcMesh.logging_option(
    stream_to_client=True, aggregate_window_sec=N)``) repeated lines of the whole group are
    merged (``LineAggregator``) and written once per window. Each pipe is closed at its end of
    file; the thread ends when every pipe did, writing what the aggregator held.
    """

    def __init__(
        self,
        streams: Sequence[IO[bytes] | None],
        prefixes: Sequence[bytes],
        write: Callable[[bytes], None] | None = None,
    ) -> None:
        #: Where the lines go: this process's stdout (default) or stderr (``copy_to_stderr``).
        self._copy = write if write is not None else _copy_to_stdout
        self._streams = {
            stream.fileno(): (stream, LinePrefixer(prefix))
            for stream, prefix in zip(streams, prefixes, strict=True)
            if stream is not None
        }
        self._lock = threading.Lock()
        self._aggregator: LineAggregator | None = None
        self._closed = not self._streams
        self._wake_read, self._wake_write = os.pipe() if self._streams else (-1, -1)
        if self._streams:
            os.set_blocking(self._wake_write, False)

    def set_window(self, seconds: float | None) -> None:
        """Aggregate repeated lines over ``seconds`` (None or 0: write each line as it comes;
        what was held is written now). Any thread."""
        with self._lock:
            old = self._aggregator
            if old is not None and seconds is not None and old.window == seconds:
                return
            self._aggregator = LineAggregator(seconds) if seconds else None
            held = old.flush(time.time()) if old is not None else []
            if not self._closed:  # the thread waits on the new deadline
                with contextlib.suppress(OSError):
                    os.write(self._wake_write, b"w")
        self._copy(b"".join(held))

    def start(self) -> None:
        if self._streams:
            name = (
                "monarch-worker-stdout"
                if self._copy is _copy_to_stdout
                else "monarch-worker-output"
            )
            threading.Thread(target=self._run, name=name, daemon=True).start()

    def _write(self, lines: list[bytes]) -> None:
        with self._lock:
            aggregator = self._aggregator
            if aggregator is not None:
                now = time.time()
                lines = [out for line in lines for out in aggregator.add(line, now)]
        self._copy(b"".join(lines))

    def _timeout(self) -> float | None:
        """Write the window's block if it ended; how long to wait for the next end."""
        with self._lock:
            aggregator = self._aggregator
            if aggregator is None:
                return None
            ended = aggregator.poll(time.time())
            deadline = aggregator.deadline()
        self._copy(b"".join(ended))
        return None if deadline is None else max(0.0, deadline - time.time())

    def _run(self) -> None:
        try:
            while self._streams:
                timeout = self._timeout()
                fds = [*self._streams, self._wake_read]
                ready, _, _ = select.select(fds, [], [], timeout)
                for fd in ready:
                    if fd == self._wake_read:
                        with contextlib.suppress(OSError):
                            os.read(fd, 4096)
                        continue
                    stream, prefixer = self._streams[fd]
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError:
                        chunk = b""
                    if chunk:
                        self._write(prefixer.feed(chunk))
                        continue
                    del self._streams[fd]
                    self._write(prefixer.flush())
                    with contextlib.suppress(OSError):
                        stream.close()
        finally:
            for stream, _ in self._streams.values():
                with contextlib.suppress(OSError):
                    stream.close()
            with self._lock:
                self._closed = True
                for fd in (self._wake_read, self._wake_write):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.set_window(None)  # write what was held


_collected_once = False
"""Whether this process ran its one full collection while its first workers started."""


def _collect_once() -> None:
    """One full collection of this process, the first time its workers start (called once
    they were forked or exec'd, before waiting for them).

    Why: the collector's first full pass after the imports (its threshold is relative to the
    objects alive at the previous one, made when few were) otherwise lands in a later spawn,
    on the runtime loop's thread while it takes the workers' joins: 25 to 130 ms of a
    4-process spawn, why a client's first such spawn was its slowest. Here it takes about 18
    ms of the calling thread while the first workers start up on their own (they dial the
    client only some 40 ms after their fork). Only the collection runs: the program's
    collector settings stay as they are."""
    global _collected_once
    if not _collected_once:
        _collected_once = True
        gc.collect()


_zygote_lock = threading.Lock()
_zygote_instance: Zygote | None = None
#: The zygote's entry point for a worker (``worker.forked_main``).
FORKED_WORKER: Final = "monarch.actor._hosts.worker:forked_main"


def _zygote() -> Zygote | None:
    """This process's zygote, forked on first use; None where forking is unavailable."""
    global _zygote_instance
    with _zygote_lock:
        current = _zygote_instance
        if current is not None and current.alive and current.parent == os.getpid():
            return current
        try:
            _zygote_instance = Zygote.start()
        except (ZygoteUnavailableError, OSError) as exc:
            _log.info("no zygote (%s): workers start with exec", exc)
            _zygote_instance = None
        return _zygote_instance


def _copy_to(stream: IO[str], chunk: bytes) -> None:
    if not chunk:
        return
    out = getattr(stream, "buffer", None)
    try:
        if out is not None:
            out.write(chunk)
            out.flush()
        else:
            stream.write(chunk.decode("utf-8", "replace"))
            stream.flush()
    except (OSError, ValueError):  # our stream is closed: keep draining
        pass


def _copy_to_stdout(chunk: bytes) -> None:
    """Write a worker's output to this process's stdout as it came (dropped if it is closed)."""
    _copy_to(sys.stdout, chunk)


def copy_to_stderr(chunk: bytes) -> None:
    """Write a worker's stderr output to this process's stderr (dropped if it is closed)."""
    _copy_to(sys.stderr, chunk)


_MARKER = STARTUP_MARKER.encode()
#: Longest start-up line value kept (a failure message, a stage).
_MAX_STARTUP_VALUE: Final = 8192


def _await_startup(popen: WorkerProcess, deadline: float) -> Pid | str:
    """Read one worker's start-up lines (see ``worker``) until its PID; why not, on failure.

    Anything else on the pipe is the program's output (the client's main module printed it
    while the worker imported it) and goes to this process's stdout, in order; so do bytes
    after the PID line. The pipe is read with ``os.read`` (never through its buffer), as
    ``forward_output`` reads it afterwards.
    """
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    pending = b""
    stage = ""
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else None
        if not chunk:  # the deadline passed (None), or end of file (b""): it is exiting
            _copy_to_stdout(pending)
            status = popen.poll()
            if status is None and chunk is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = popen.wait(1.0)
            why = "did not start in time" if status is None else _describe_exit(status)
            return f"{why} (while {stage})" if stage else why
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line, pending = pending[:end], pending[end + 1 :]
            text, marker, rest = line.partition(_MARKER)
            _copy_to_stdout(text if marker else line + b"\n")
            if not marker:
                continue
            kind, _, raw = rest.partition(b" ")
            value = raw[:_MAX_STARTUP_VALUE].decode("utf-8", "replace")
            if kind == b"ready":
                _copy_to_stdout(pending)
                try:
                    return Pid(bytes.fromhex(value))
                except ValueError:
                    return f"sent a malformed start-up line ({value[:80]!r})"
            if kind == b"failed":
                return f"could not start: {value}"
            if kind == b"stage":
                stage = value
        if len(pending) > 65536:  # a long line: pass it on, keeping what may start a marker
            keep = len(_MARKER) - 1
            _copy_to_stdout(pending[:-keep])
            pending = pending[-keep:]


def read_worker_pids(
    popens: Sequence[WorkerProcess], labels: Sequence[str], timeout: float
) -> list[Pid] | str:
    """Wait (bounded) for each worker's PID line (``_await_startup``); the reason on failure:
    ``"worker process LABEL could not start: WHY"`` (the worker said why), ``... exited with
    status N`` or ``... did not start in time``, with the stage it was in."""
    pids: list[Pid] = []
    deadline = time.monotonic() + timeout
    for label, popen in zip(labels, popens, strict=True):
        outcome = _await_startup(popen, deadline)
        if isinstance(outcome, str):
            return f"worker process {label} {outcome}"
        pids.append(outcome)
    return pids


class WorkerGroup:
    """The worker processes of one ``spawn_procs`` call: their PIDs (by rank), exit events,
    and how to stop and kill them. Subclasses start the processes (``LocalWorkerGroup`` on
    this host, ``attach_session.RemoteWorkerGroup`` through a host's worker daemon).

    ``on_exit`` is told of every process gone (module docstring); ``watchdog`` returns the
    heartbeat driver of the moment (``None``: no heartbeats), read when heartbeats start or
    stop, since the client's node (and its driver) may start after the group is made."""

    def __init__(
        self,
        labels: Sequence[str],
        on_exit: ExitCallback,
        watchdog: Callable[[], HeartbeatDriver | None] = lambda: None,
    ) -> None:
        self._process_died = on_exit
        self._watchdog = watchdog
        self.labels = list(labels)
        self.pids: list[Pid] = []
        self.exited: list[threading.Event] = []
        self._exit_lock = threading.Lock()
        self._exiting: set[int] = set()
        self.state: _ProcMeshState | None = None
        """The proc mesh state (set by ``spawn_procs``): a stop makes exits expected."""
        self.killed = False
        self.fenced: set[int] = set()
        """Ranks declared dead for not answering heartbeats whose OS process has not exited."""
        self._exit_recorded: set[int] = set()
        self.output_window: float | None = None
        """``set_output_window``'s: kept for workers whose output is copied later."""

    def record(self, event: str, rank: int, reason: str = "") -> None:
        """Record lifecycle ``event`` (``proc_starting``, ``proc_ready``, ``proc_exited``) of
        the worker at ``rank`` in this process (``_runtime.telemetry.record_lifecycle``): its
        label, its PID (hex) once known, its rank and the group's size."""
        _telemetry.record_lifecycle(
            event,
            "proc",
            self.labels[rank],
            _tracing.process_label(),
            actor_id=self.pids[rank].hex() if rank < len(self.pids) else "",
            rank=rank,
            size=len(self.labels),
            reason=reason,
        )

    def record_exit(self, rank: int, reason: str) -> None:
        """Record ``proc_exited`` of the worker at ``rank`` (once per rank)."""
        with self._exit_lock:
            if rank in self._exit_recorded:
                return
            self._exit_recorded.add(rank)
        self.record("proc_exited", rank, reason)

    def set_output_window(self, seconds: float | None) -> None:
        """Merge repeated output lines of these workers over ``seconds`` (None: off), as
        ``ProcMesh.logging_option`` asks; where their output is copied to this process."""
        self.output_window = seconds

    def exit_expected(self) -> bool:
        """True once the owner stopped or killed these processes (their exit is no failure)."""
        return self.killed or (self.state is not None and self.state.stopped)

    def on_exit(
        self, rank: int, reason: str, *, expected: bool = False, status: int | None = None
    ) -> None:
        """The worker at ``rank`` exited (any thread; once per rank); ``expected``: the
        caller knows the exit is no failure; ``status``: its wait status where it was reaped
        (else ``reason`` is the ``proc_exited`` record's reason: a lost host)."""
        self.record_exit(rank, reason if status is None else exit_reason(status))
        with self._exit_lock:
            fenced = rank in self.fenced
            self.fenced.discard(rank)
            if rank in self._exiting:
                if fenced:  # declared dead before: its exit only ends the wait for it
                    self.exited[rank].set()
                return
            self._exiting.add(rank)
        failure = not (expected or self.exit_expected())
        try:
            self._process_died(self.pids[rank], reason, failure=failure)
        finally:  # set last: once set, the notices of this exit are out (flush_supervision)
            self.exited[rank].set()

    def watch_liveness(self) -> None:
        """Start the heartbeats to every worker of the group (once their PIDs are known)."""
        watchdog = self._watchdog()
        if watchdog is None:
            return
        for rank, pid in enumerate(self.pids):
            watchdog.watch(pid, partial(self.on_unresponsive, rank))

    def on_unresponsive(self, rank: int, silence: float, timeout: float) -> None:
        """The worker at ``rank`` left the heartbeats unanswered for ``silence`` seconds (any
        thread): it is declared dead, a failure as its exit would be (unless the owner stopped
        or killed the group), and fenced. Its OS process may still exist (stopped, hung): it
        exits by itself when it runs again, or is killed with the group."""
        with self._exit_lock:
            if rank in self._exiting or self.exited[rank].is_set():
                return
            self._exiting.add(rank)
            self.fenced.add(rank)
        reason = (
            f"process {self.labels[rank]}{self._where(rank)} stopped answering heartbeats: "
            f"silent for {silence:.1f} s (supervision_watchdog_timeout {timeout:g} s), declared "
            "dead and fenced"
        )
        self._process_died(self.pids[rank], reason, failure=not self.exit_expected(), fenced=True)

    def _where(self, rank: int) -> str:
        """`` (os pid N)`` where the OS process id is known."""
        return ""

    def live_pids(self) -> list[Pid]:
        """PIDs of the workers still running (a fenced one is not)."""
        with self._exit_lock:
            fenced = set(self.fenced)
        return [
            pid
            for rank, (pid, gone) in enumerate(zip(self.pids, self.exited, strict=False))
            if not gone.is_set() and rank not in fenced
        ]

    def alive(self, rank: int) -> bool:
        """True while the worker at ``rank`` runs and was not declared dead."""
        return not self.exited[rank].is_set() and rank not in self.fenced

    def _kill_ranks(self, ranks: Sequence[int]) -> None:
        raise NotImplementedError

    def stop(self, ranks: Sequence[int], stop_procs: Future[None] | None) -> Future[None]:
        """Wait for the ``STOP_PROC`` acknowledgements (bounded), then for the workers at
        ``ranks`` to exit; kill those that do not. Resolves to ``None`` in every case."""
        cell: _Cell[None] = _Cell()
        self._unwatch(ranks)

        def run() -> None:
            bound = float(_config.get("stop_actor_timeout")) + 2.0
            with self._exit_lock:
                fenced = [rank for rank in ranks if rank in self.fenced]
            if fenced:  # declared dead: nothing to wait for
                self._kill_ranks(fenced)
            if stop_procs is not None:
                stop_procs._cell.wait(bound)
            deadline = time.monotonic() + exit_timeout()
            for rank in ranks:
                self.exited[rank].wait(max(0.0, deadline - time.monotonic()))
            stragglers = [rank for rank in ranks if not self.exited[rank].is_set()]
            if stragglers:
                self._kill_ranks(stragglers)
                for rank in stragglers:
                    self.exited[rank].wait(EXIT_TIMEOUT)
            cell.set_result(None)

        threading.Thread(target=run, name="monarch-proc-stop", daemon=True).start()
        return Future._create(cell)

    def _unwatch(self, ranks: Sequence[int]) -> None:
        """No more heartbeats to ``ranks``: their owner stops them (a slow stop is no hang)."""
        watchdog = self._watchdog()
        if watchdog is not None:
            for rank in ranks:
                if rank < len(self.pids):
                    watchdog.forget(self.pids[rank])

    def kill(self) -> None:
        """SIGKILL every worker still running (their exits are not failures)."""
        self.killed = True
        self._unwatch(range(len(self.pids)))
        self._kill_ranks([rank for rank in range(len(self.pids)) if not self.exited[rank].is_set()])


class LocalWorkerGroup(WorkerGroup):
    """Worker processes on this host, children of the client's OS process."""

    def __init__(
        self,
        labels: Sequence[str],
        on_exit: ExitCallback,
        watchdog: Callable[[], HeartbeatDriver | None] = lambda: None,
    ) -> None:
        super().__init__(labels, on_exit, watchdog)
        self.popens: list[WorkerProcess] = []
        self.output: OutputForwarder | None = None
        """Copies the workers' stdout here (once they started)."""
        self.errors: OutputForwarder | None = None
        """Copies the workers' stderr to this process's stderr (from their start)."""

    def set_output_window(self, seconds: float | None) -> None:
        super().set_output_window(seconds)
        for forwarder in (self.output, self.errors):
            if forwarder is not None:
                forwarder.set_window(seconds)

    def start(
        self,
        parent: str,
        authority: str,
        ca_dir: Path,
        *,
        commands: Sequence[BootstrapCommand | None] | None = None,
        numactl: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """Start every worker and wait (bounded) for each to report its PID. ``commands``
        (per rank) replace the worker's program; ``numactl`` (per rank) prefixes it. Either
        means an exec'd worker: a zygote fork can run neither."""
        idle = float(_config.get("mesh_orphan_timeout"))
        # Workers import what the client can import (actor classes are pickled by reference).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        if _config.get("force_quic"):  # a runtime override reaches the workers too
            env["MONARCH_FORCE_QUIC"] = "1"
        transport = _config.get("default_transport")  # enable_transport reaches them too
        if isinstance(transport, ChannelTransport) and transport is not ChannelTransport.Unix:
            env["HYPERACTOR_MESH_DEFAULT_TRANSPORT"] = transport.value
        main = main_reference()
        method = check_spawn_method()
        zygote = _zygote() if method == "zygote" else None
        commands_by_rank = [
            worker_command(
                parent=parent,
                authority=authority,
                ca_dir=ca_dir,
                label=label,
                idle=idle,
                main=main,
            )
            for label in self.labels
        ]
        customs = [
            commands[rank] if commands is not None else None for rank in range(len(self.labels))
        ]
        prefixes = [
            numactl[rank] if numactl is not None else () for rank in range(len(self.labels))
        ]
        # Every worker the zygote can fork (no custom command, no numactl) in one request: it
        # forks them back to back and they start up in parallel.
        forkable = [
            rank for rank in range(len(self.labels)) if customs[rank] is None and not prefixes[rank]
        ]
        forked: dict[int, WorkerProcess] = {}
        if zygote is not None and forkable and not self.killed:
            try:
                started, error = zygote.spawn_many(
                    [commands_by_rank[rank][3:] for rank in forkable],
                    target=FORKED_WORKER,
                    env=env,
                    stderr=True,
                    identities=ca_dir,
                )
            except ZygoteUnavailableError as exc:
                started, error = [], str(exc)
            forked = dict(zip(forkable, started, strict=False))
            if error is not None:
                _log.warning("forking workers failed (%s); starting them with exec", error)
        for rank, label in enumerate(self.labels):
            if rank in forked:
                self.popens.append(forked[rank])
                self.record("proc_starting", rank, f"os pid {forked[rank].pid}")
                continue
            if self.killed:  # killed while starting: start no more, end those forked
                for later in range(rank + 1, len(self.labels)):
                    if later in forked:
                        forked[later].kill()
                break
            try:
                process = exec_worker(
                    commands_by_rank[rank],
                    customs[rank],
                    prefixes[rank],
                    env,
                    stdin=subprocess.DEVNULL,
                )
            except OSError as exc:
                self._abandon()
                raise RuntimeError(f"worker process {label} could not be started: {exc}") from exc
            self.popens.append(process)
            self.record("proc_starting", rank, f"os pid {process.pid}")
        ranked = bool(_config.get("prefix_with_rank"))
        # Their stderr has no handshake: copied from the start (a worker that writes much
        # while it starts never blocks on a full pipe), each line with its rank too.
        self.errors = OutputForwarder(
            [popen.stderr for popen in self.popens],
            [rank_prefix(rank) if ranked else b"" for rank in range(len(self.popens))],
            copy_to_stderr,
        )
        self.errors.set_window(self.output_window)
        self.errors.start()
        if self.killed:
            self._abandon()
            raise RuntimeError("the processes were killed while they started")
        _collect_once()
        pids = read_worker_pids(self.popens, self.labels, spawn_timeout())
        if isinstance(pids, str):
            self._abandon()
            raise RuntimeError(pids)
        self.pids = pids
        for rank in range(len(pids)):
            self.record("proc_ready", rank)
        self.output = OutputForwarder(
            [popen.stdout for popen in self.popens],
            [rank_prefix(rank) if ranked else b"" for rank in range(len(self.popens))],
        )
        self.output.set_window(self.output_window)
        self.output.start()
        for rank, popen in enumerate(self.popens):
            self.exited.append(threading.Event())
            threading.Thread(
                target=self._reap, args=(rank, popen), name="monarch-reaper", daemon=True
            ).start()
        self.watch_liveness()

    def _where(self, rank: int) -> str:
        return f" (os pid {self.popens[rank].pid})"

    def _reap(self, rank: int, popen: WorkerProcess) -> None:
        code = popen.wait()  # forward_output closes stdout at its end of file
        self.on_exit(
            rank,
            f"process {self.labels[rank]} (os pid {popen.pid}) {_describe_exit(code)}",
            status=code,
        )

    def _abandon(self) -> None:
        """A start that failed: kill and reap what was started, recording each exit."""
        self.kill()
        for rank, popen in enumerate(self.popens):
            status = popen.poll()
            self.record_exit(rank, "did not start" if status is None else exit_reason(status))

    def _kill_ranks(self, ranks: Sequence[int]) -> None:
        for rank in ranks:
            popen = self.popens[rank]
            if popen.poll() is None:
                popen.kill()

    def kill(self) -> None:
        """SIGKILL every worker still running and reap them (bounded)."""
        self.killed = True
        self._unwatch(range(len(self.pids)))
        for popen in self.popens:
            if popen.poll() is None:
                popen.kill()
        for popen in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(EXIT_TIMEOUT)


def check_spawn_method() -> str:
    """The configured ``worker_spawn_method`` (``ValueError`` for an unknown one)."""
    method = str(_config.get("worker_spawn_method"))
    if method not in ("zygote", "exec"):
        raise ValueError(f"worker_spawn_method must be 'zygote' or 'exec', not {method!r}")
    return method
