"""The process layer on the client: its Chrysalis node, worker processes and ``HostMesh``.

Why it looks like this (design "Monarch on Chrysalis"): every Monarch process is one Chrysalis
Node and the namespace tree is the supervision tree.

- Identity: the client's leaf is issued at bootstrap from the *cluster CA*, the development CA
  directory every Chrysalis tool uses (``$CHRYSALIS_DEV_CA_DIR``, else
  ``<tmp>/chrysalis-dev-ca-<uid>``, created mode 0700 on first use). Local workers issue their
  leaves from the same directory and worker daemons on other hosts
  (``run_worker_loop_forever``) from a copy of it, so every process of a program trusts every
  other one and nothing else. The client's PID is its node's PID from the start, so meshes,
  ports and actor addresses made before any worker exists stay valid. If that directory cannot
  be used (insecure, unreadable) the client falls back to a private in-memory CA written to a
  temporary directory for its local workers (attaching remote hosts then fails with the reason).
- The node (a root) starts lazily, on the first ``spawn_procs`` or ``attach_to_workers``. It
  listens on ``$MONARCH_CLIENT_LISTEN`` (default ``udp://0.0.0.0:0``: every interface, so
  hosts started separately can join it); local workers are given ``127.0.0.1`` and remote
  hosts the local address that routes to them.
- ``spawn_procs`` starts one ``python -m monarch.actor._worker`` per rank, each a Node joined
  under the client's node, and returns at once, as the reference does: a thread of its own
  (``bring_up``) waits (bounded) until each worker printed its PID, i.e. joined, runs the
  owner's setup on them (``bootstrap=``, ``proc_bind`` ``cpus``, through a ``ProcSetup`` actor)
  and resolves the mesh's pending state (``_mesh._ProcMeshState.ready``), which
  ``initialized``, actor spawns, calls and stops wait or chain on. The workers get the
  client's ``sys.path`` as ``PYTHONPATH``: actor classes travel by reference. A
  ``bootstrap_command`` or a numactl ``proc_bind`` key starts them with exec instead of the
  zygote; their options then travel in ``MONARCH_WORKER_ARGV``.
- The client's ``InProcessFabric`` gets the node's ``NodeProcessTransport`` as its uplink.
- A reaper per worker turns its exit into ``mark_unreachable`` (queued, outstanding and later
  calls to it fail with ``SupervisionError`` naming the exit status) and, unless the exit was
  asked for (a stop, a kill by the owner, client shutdown), into a *process death* notice:
  every owner of an actor on that process gets a ``MeshFailure`` per rank (``__supervise__``,
  or ``unhandled_fault_hook`` at the root), every other process of the program learns the PID
  is gone (fail fast), and actors owned by actors of the dead process are stopped (children
  never outlive their parent). See ``ProcRuntime.proc_died``.
- Liveness: the client pings every worker it started (``_watchdog``, over the workers' usual
  path); one that leaves them unanswered for ``supervision_watchdog_timeout`` seconds (hung,
  stopped, frozen) is declared dead exactly as if it had exited (``on_unresponsive``) and
  *fenced*: every process refuses what it still sends, and the worker itself, whose heartbeat
  lease ran out, sends nothing more and exits (status 4) as soon as it runs again. Its OS
  process, if it never runs again, is killed with its mesh (stop, shutdown, client exit).
- ``ProcMesh.stop()`` sends ``STOP_PROC`` to the live workers (bounded wait), then waits for
  every worker to exit and kills stragglers; it succeeds after workers crashed.
- A worker whose parent link is gone exits (see ``_worker``): killing the client leaves no
  orphans after about twice ``mesh_orphan_timeout`` seconds.
- Host meshes of hosts started separately (``attach_to_workers``) use the same worker
  processes, started by the worker daemon of each host on the client's request (``_attach``).
- ``spawn_procs`` in a worker's actor asks the client's host agent (``_host_agent``), which
  starts the processes here (``_start_group``, as for the client's own spawns) and SIGKILLs
  them when the process that asked for them exits.

Messages start on the QUIC path through the Node and move to direct lanes where processes can
reach each other (``_node_transport``, ``_lane``); ``MONARCH_FORCE_QUIC=1`` keeps them on QUIC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

# The process layer is imported with monarch.actor rather than on the first spawn_procs: the
# zygote that forks local workers hands them exactly the modules the client had imported, so
# importing it here takes several hundred milliseconds of imports out of every worker's start.
import chrysalis.node  # noqa: F401
from chrysalis.core import DatagramAddr, Pid
from monarch.actor import _client_attach
from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, MeshTrait, Point, Shape, Slice
from monarch.actor._host_agent import NestedProcs, ProcSetup, ensure_agent, spawn_from_worker
from monarch.actor._main_module import main_reference, refuse_while_importing
from monarch.actor._mesh.meshes import ProcMesh, _adopt, _forget, _ProcMeshState, set_host_resolver
from monarch.actor._runtime.client import (
    _frame_limits,
    broadcast_proc_death,
    client,
    set_node_layer,
)
from monarch.actor._runtime.context import _current
from monarch.actor._runtime.watchdog import HeartbeatDriver
from monarch.actor._worker import STARTUP_MARKER
from monarch.actor._zygote import Zygote, ZygoteUnavailableError
from monarch.config import _registry as _config
from monarch.config._registry import ChannelTransport

if TYPE_CHECKING:
    from monarch.actor._attach import HostSession
    from monarch.actor._runtime.client import _Client
    from monarch.actor._transport.node import NodeProcessTransport

__all__ = [
    "CLIENT_LISTEN_ENV",
    "BootstrapCommand",
    "ClientNodeLayer",
    "HostMesh",
    "LocalWorkerGroup",
    "WorkerGroup",
    "default_bootstrap_cmd",
    "this_host",
    "exit_timeout",
    "spawn_timeout",
    "worker_command",
]

#: Seconds ``spawn_procs`` waits for a worker to join and report its PID (the default of the
#: ``host_spawn_ready_timeout`` setting, which ``spawn_timeout()`` reads).
SPAWN_TIMEOUT: Final = 30.0
#: Seconds the ``bootstrap=`` callable (and a ``cpus`` binding) may take on the new processes.
SETUP_TIMEOUT: Final = 120.0
#: Seconds a stopping worker may take to exit before it is killed (the default of the
#: ``process_exit_timeout`` setting, which ``exit_timeout()`` reads).
EXIT_TIMEOUT: Final = 5.0
#: Environment variable: the carrier address the client's node listens on.
CLIENT_LISTEN_ENV: Final = "MONARCH_CLIENT_LISTEN"
_DEFAULT_LISTEN: Final = "udp://0.0.0.0:0"
_MAX_PROCS: Final = 1024
_log = logging.getLogger("monarch.actor.host")


def spawn_timeout() -> float:
    """Seconds a worker may take to start and report in (``host_spawn_ready_timeout``)."""
    return float(_config.get("host_spawn_ready_timeout"))


def exit_timeout() -> float:
    """Seconds a stopped worker may take to exit before it is killed (``process_exit_timeout``)."""
    return float(_config.get("process_exit_timeout"))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def source_ip_toward(host: str) -> str:
    """The local IPv4 address the kernel would use to reach ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return str(probe.getsockname()[0])


def worker_command(
    *,
    parent: str,
    authority: str,
    ca_dir: Path | str,
    label: str,
    idle: float,
    main: tuple[str, str] | None,
    listen: str | None = None,
    exit_with_stdin: bool = False,
) -> list[str]:
    """The command line of one worker process (``python -m monarch.actor._worker``)."""
    command = [
        sys.executable, "-m", "monarch.actor._worker",
        "--parent", parent,
        "--authority", authority,
        "--ca-dir", str(ca_dir),
        "--label", label,
        "--idle-timeout", str(float(idle)),
    ]  # fmt: skip
    if main is not None:
        command += ["--main", f"{main[0]}:{main[1]}"]
    if listen is not None:
        command += ["--listen", listen]
    if exit_with_stdin:
        command.append("--exit-with-stdin")
    return command


class BootstrapCommand:
    """The command that starts one process of a ``spawn_procs`` (``bootstrap_command=``).

    The reference's fields and methods: ``program``, ``arg0`` (the ``argv[0]`` the program sees;
    ``None``: the program itself), ``args``, ``env`` (applied on top of the spawning side's
    environment; a ``None`` value removes a variable; the property returns a copy, assign it to
    replace the mapping) and ``inherit_env`` (``False``: start from an empty environment), and
    ``with_env(mapping)`` (a new command with ``mapping`` merged into ``env``).

    Why the worker's options travel in the environment: this implementation's worker is
    ``python -m monarch.actor._worker``, not the reference's ``bootstrap_main``, and it needs
    its options (parent address, authority, CA directory, ...). They are passed as JSON in
    ``MONARCH_WORKER_ARGV``, so a custom command only has to end up running our worker entry
    point (for instance a wrapper script that sets things up, then ``exec``s it) and need not
    forward any arguments. Unlike the reference's, this class pickles (an actor's
    ``spawn_procs`` sends it to the client's host agent).
    """

    __slots__ = ("_env", "arg0", "args", "inherit_env", "program")

    def __init__(
        self,
        program: str,
        arg0: str | None,
        args: Sequence[str],
        env: Mapping[str, str | None],
        inherit_env: bool = True,
    ) -> None:
        if not isinstance(program, str) or not program:
            raise TypeError(f"BootstrapCommand program must be a non-empty str, got {program!r}")
        if arg0 is not None and not isinstance(arg0, str):
            raise TypeError(f"BootstrapCommand arg0 must be a str or None, got {arg0!r}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise TypeError("BootstrapCommand args must be a list of str")
        self.program = program
        self.arg0 = arg0
        self.args = list(args)
        self.inherit_env = bool(inherit_env)
        self._env: dict[str, str | None] = {}
        self.env = env

    @property
    def env(self) -> dict[str, str | None]:
        """A copy of the environment changes (``None``: remove the variable)."""
        return dict(self._env)

    @env.setter
    def env(self, value: Mapping[str, str | None]) -> None:
        checked: dict[str, str | None] = {}
        for key, item in dict(value).items():
            if not isinstance(key, str) or not (item is None or isinstance(item, str)):
                raise TypeError("BootstrapCommand env maps str names to str values or None")
            checked[key] = item
        self._env = checked

    def with_env(self, env: Mapping[str, str | None]) -> BootstrapCommand:
        """A new command whose environment changes are this one's updated with ``env``."""
        return BootstrapCommand(
            self.program, self.arg0, self.args, {**self._env, **env}, self.inherit_env
        )

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment a process started with this command gets, spawned from ``base``."""
        result = dict(base) if self.inherit_env else {}
        for key, value in self._env.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = value
        return result

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            BootstrapCommand,
            (self.program, self.arg0, self.args, self._env, self.inherit_env),
        )

    def __repr__(self) -> str:
        arg0 = "" if self.arg0 is None else f", arg0={self.arg0!r}"
        return (
            f"BootstrapCommand(program={self.program!r}{arg0}, args={self.args!r}, "
            f"env={self._env!r}, inherit_env={self.inherit_env})"
        )


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command this client starts its workers with: ``sys.executable -m
    monarch.actor._worker`` (this implementation's entry point, not the reference's
    ``monarch._src.actor.bootstrap_main``), inheriting the environment. A base for
    ``with_env({...})``; a custom program must end up running that module (see
    ``BootstrapCommand``)."""
    return BootstrapCommand(sys.executable, None, _WORKER_ARGS, {})


#: The arguments that run this implementation's worker under a Python interpreter.
_WORKER_ARGS: Final = ("-m", "monarch.actor._worker")


#: ``proc_bind`` keys applied with numactl (a command prefix) and the one applied in-process.
_NUMACTL_KEYS: Final = ("cpunodebind", "membind", "physcpubind")
_PROC_BIND_KEYS: Final = (*_NUMACTL_KEYS, "cpus")
_MAX_CPU: Final = 1 << 16


def parse_cpus(spec: str) -> list[int]:
    """A CPU list as taskset and numactl write it (``"0"``, ``"0-3,6"``), as sorted ints."""
    cpus: set[int] = set()
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f"proc_bind cpus {spec!r} is not a CPU list like '0-3,6'") from None
        if not 0 <= low <= high < _MAX_CPU:
            raise ValueError(f"proc_bind cpus {spec!r} has a bad range {part.strip()!r}")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


class ProcBinding:
    """One process's ``proc_bind`` entry, checked: the numactl prefix and the CPU set."""

    __slots__ = ("cpus", "numactl", "numactl_missing")

    def __init__(self, entry: Mapping[str, Any]) -> None:
        if not isinstance(entry, Mapping):
            raise TypeError(f"each proc_bind entry must be a dict, got {entry!r}")
        options: list[str] = []
        self.cpus: list[int] | None = None
        for key, value in entry.items():
            if key not in _PROC_BIND_KEYS:
                raise ValueError(
                    f"unknown proc_bind key {key!r} (expected one of {', '.join(_PROC_BIND_KEYS)})"
                )
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise TypeError(f"proc_bind {key} must be a str, got {value!r}")
            text = str(value)
            if key == "cpus":
                self.cpus = parse_cpus(text)
            else:
                options.append(f"--{key}={text}")
        self.numactl: list[str] = []
        # Why not raised here: on attached hosts the daemon's host runs numactl, not this one
        # (``spawn_procs`` raises it at once for processes of this host).
        self.numactl_missing: str | None = None
        if options:
            numactl = shutil.which("numactl")
            if numactl is None:
                self.numactl_missing = (
                    f"proc_bind {', '.join(o.split('=')[0][2:] for o in options)} needs "
                    "numactl, which is not installed on this host (a 'cpus' binding needs no "
                    "tool)"
                )
            self.numactl = [numactl or "numactl", *options]


def check_proc_bind(
    proc_bind: Sequence[Mapping[str, Any]] | None, procs_per_host: int
) -> list[ProcBinding] | None:
    """Check ``proc_bind`` as the reference does (one entry per process on a host)."""
    if proc_bind is None:
        return None
    if isinstance(proc_bind, Mapping | str) or not isinstance(proc_bind, Sequence):
        raise TypeError("proc_bind must be a list of dicts, one per process on a host")
    if len(proc_bind) != procs_per_host:
        raise ValueError(
            f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({procs_per_host})"
        )
    return [ProcBinding(entry) for entry in proc_bind]


def bootstrap_commands(
    bootstrap_command: Any, extent: Extent
) -> list[BootstrapCommand | None] | None:
    """One command per process (rank order) from a ``BootstrapCommand`` or a callable
    ``Point -> BootstrapCommand`` (called once per point of the whole extent)."""
    if bootstrap_command is None:
        return None
    if isinstance(bootstrap_command, BootstrapCommand):
        return [bootstrap_command] * extent.nelements
    if not callable(bootstrap_command):
        raise TypeError(
            "bootstrap_command must be a BootstrapCommand or a callable Point -> "
            f"BootstrapCommand, got {bootstrap_command!r}"
        )
    commands: list[BootstrapCommand | None] = []
    for point in extent.points():
        command = bootstrap_command(point)
        if not isinstance(command, BootstrapCommand):
            raise TypeError(
                f"bootstrap_command({point}) returned {command!r}, not a BootstrapCommand"
            )
        commands.append(command)
    return commands


def exec_spec(
    command: Sequence[str],
    custom: BootstrapCommand | None,
    numactl: Sequence[str],
    env: Mapping[str, str],
) -> tuple[list[str], str | None, dict[str, str]]:
    """(argv, executable, environment) of one exec'd worker: ``command`` (our worker command
    line), run by ``custom`` when given (the worker options then travel in
    ``MONARCH_WORKER_ARGV``), behind ``numactl`` options when given."""
    from monarch.actor._worker import WORKER_ARGV_ENV

    if custom is None:
        return [*numactl, *command], None, dict(env)
    environment = custom.environment(env)
    environment[WORKER_ARGV_ENV] = json.dumps(list(command[3:]))  # after "python -m module"
    if numactl:  # numactl execs the program: it sees the program as its argv[0]
        return [*numactl, custom.program, *custom.args], None, environment
    return [custom.arg0 or custom.program, *custom.args], custom.program, environment


class WorkerProcess(Protocol):
    """What spawning uses of a worker process: ``subprocess.Popen`` or ``ZygoteProcess``."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


_worker_process = False
_worker_pid: bytes | None = None
_worker_authority: bytes | None = None


def mark_worker_process() -> None:
    """Called by ``_worker.main``: this process is a worker, not a client."""
    global _worker_process
    _worker_process = True


def register_worker(pid: bytes, authority: bytes) -> None:
    """Called by ``_worker.main`` once its identity exists: its own PID and its client's (whose
    host agent spawns the processes this worker's actors ask for, see ``_host_agent``)."""
    global _worker_pid, _worker_authority
    _worker_pid, _worker_authority = pid, authority


def _in_worker_process() -> bool:
    return _worker_process


def forward_output(stream: IO[bytes] | None) -> None:
    """Copy what a worker writes to its stdout after its PID line to this process's stdout.

    Why: the pipe carries the readiness line; a worker that prints more than a pipe's buffer
    would block in ``print`` if nobody read it. A daemon thread copies it on (as written, no
    prefix: like a process sharing the terminal) and closes the pipe at end of file.
    """
    if stream is None:
        return

    def run() -> None:
        fd = stream.fileno()
        try:
            while chunk := os.read(fd, 65536):
                _copy_to_stdout(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                stream.close()

    threading.Thread(target=run, name="monarch-worker-stdout", daemon=True).start()


_zygote_lock = threading.Lock()
_zygote_instance: Zygote | None = None
#: The zygote's entry point for a worker (``_worker.forked_main``).
FORKED_WORKER: Final = "monarch.actor._worker:forked_main"


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


def _copy_to_stdout(chunk: bytes) -> None:
    """Write a worker's output to this process's stdout as it came (dropped if it is closed)."""
    if not chunk:
        return
    out = getattr(sys.stdout, "buffer", None)
    try:
        if out is not None:
            out.write(chunk)
            out.flush()
        else:
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
    except (OSError, ValueError):  # our stdout is closed: keep draining
        pass


_MARKER = STARTUP_MARKER.encode()
#: Longest start-up line value kept (a failure message, a stage).
_MAX_STARTUP_VALUE: Final = 8192


def _await_startup(popen: WorkerProcess, deadline: float) -> Pid | str:
    """Read one worker's start-up lines (see ``_worker``) until its PID; why not, on failure.

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


class ClientNodeLayer:
    """The client's identity, and (lazily) its root node, transport and worker groups."""

    def __init__(self) -> None:
        from chrysalis.quic import DevelopmentCA, default_dev_ca_directory

        directory = default_dev_ca_directory()
        self.cluster_ca_dir: Path | None = directory
        self.ca_problem = ""
        try:
            self._ca = DevelopmentCA.load_or_create(directory)
        except (OSError, ValueError) as exc:  # IdentityError is a ValueError
            self.ca_problem = f"the cluster CA directory {directory} cannot be used: {exc}"
            _log.warning("%s; using a private in-memory CA", self.ca_problem)
            self.cluster_ca_dir = None
            self._ca = DevelopmentCA.create("monarch client CA")
        self.identity = self._ca.issue()
        self._lock = threading.Lock()
        self._node: Any = None
        self._client: _Client | None = None
        self.transport: NodeProcessTransport | None = None
        self.ca_dir: Path | None = self.cluster_ca_dir
        self._temporary_ca = False
        self.groups: list[WorkerGroup] = []
        self.watchdog: HeartbeatDriver | None = None
        """Heartbeats to the workers (started with the node)."""
        self.sessions: list[HostSession] = []
        self.closed = False

        self.nested = NestedProcs(self)
        """Process groups spawned for workers, by owner (``_host_agent``)."""

    @property
    def pid(self) -> Pid:
        """The client's PID (its node's, once started)."""
        return self.identity.pid

    @property
    def ca_certificate_pem(self) -> bytes:
        """The client's CA certificate (what every process of the program must trust)."""
        from cryptography.hazmat.primitives import serialization

        return self._ca.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def node(self) -> Any:
        """The started node (``RuntimeError`` before ``ensure_started``)."""
        if self._node is None:
            raise RuntimeError("the client's node is not started")
        return self._node

    def ensure_started(self, client: _Client) -> tuple[str, str, Path]:
        """Start the node once; return (local parent address, authority hex, CA directory)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the client runtime was shut down")
            if self._node is None:
                if self.ca_dir is None:
                    self.ca_dir = self._write_ca()
                    self._temporary_ca = True
                self._client = client
                self._node, self.transport = asyncio.run_coroutine_threadsafe(
                    self._start(client), client.loop.loop
                ).result(SPAWN_TIMEOUT)
                client.fabric.uplink = self.transport
                self.watchdog = HeartbeatDriver(client.runtime, client.loop)
            assert self.ca_dir is not None
            return self.parent_address(None), self.pid.hex(), self.ca_dir

    def parent_address(self, toward: str | None) -> str:
        """The node's address as a process at ``toward`` (an IP; ``None``: this host) dials
        it: a wildcard bind is replaced by the loopback or by the route's source address."""
        addr = self.node.local_addr
        if addr.scheme != "udp" or not addr.ip.is_unspecified:
            return str(addr)
        ip = "127.0.0.1" if toward is None else source_ip_toward(toward)
        return f"udp://{ip}:{addr.port}"

    def _write_ca(self) -> Path:
        from cryptography.hazmat.primitives import serialization

        directory = Path(tempfile.mkdtemp(prefix="monarch-ca-"))  # mode 0700
        key = self._ca.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for name, data in (("ca.key", key), ("ca.pem", self.ca_certificate_pem)):
            fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        return directory

    async def _start(self, client: _Client) -> tuple[Any, NodeProcessTransport]:
        from chrysalis.node import JoinSettings, Node
        from chrysalis.quic import QuicConfig
        from monarch.actor._transport.node import NodeProcessTransport

        idle = float(_config.get("mesh_orphan_timeout"))
        listen = os.environ.get(CLIENT_LISTEN_ENV) or _DEFAULT_LISTEN
        quic = QuicConfig(idle_timeout=idle, keepalive_interval=idle / 4)
        parent = _client_attach.attached_to()
        if parent is None:
            node = Node.serve(self.identity, listen, quic_config=quic)
            await node.__aenter__()
        else:  # ``attach(addr)``: join under that node instead of being a root
            node = Node(
                self.identity,
                listen=listen,
                parent=JoinSettings(DatagramAddr.parse(parent), None),
                quic_config=quic,
            )
            await node.__aenter__()
            try:
                await asyncio.wait_for(node.wait_connected(), _client_attach.ATTACH_TIMEOUT)
            except BaseException as exc:
                await node.aclose()
                raise RuntimeError(
                    f"attach({parent!r}): the client's node could not join there within "
                    f"{_client_attach.ATTACH_TIMEOUT:g} s: {exc or type(exc).__name__}"
                ) from None
        transport = NodeProcessTransport(
            node,
            client.loop,
            deliver=client.fabric.deliver_inbound,
            undeliverable=client.fabric.bounce_inbound,
            limits=_frame_limits,
            hosts=client.fabric.hosts,
            identity=self.identity,
        )
        transport.start()
        return node, transport

    def process_died(self, pid: Pid, reason: str, *, failure: bool, fenced: bool = False) -> None:
        """A worker process is gone (any thread): fail calls to it now and, for a failure,
        tell the owners of its actors and every other process of the program. ``fenced``: it
        was declared dead for not answering heartbeats and may still run (its messages are
        refused from now on, here and in every process told)."""
        watchdog = self.watchdog
        if watchdog is not None:
            watchdog.forget(pid)
        transport = self.transport
        if transport is not None:
            transport.mark_unreachable(pid, reason, fence=fenced)
        self.nested.process_gone(pid)  # what it spawned from inside dies with it
        client = self._client
        if not failure or client is None or client.loop.closed:
            return

        with self._lock:
            others = [p for group in self.groups for p in group.live_pids() if p != pid]
        broadcast_proc_death(client, pid, reason, others, fenced=fenced)

    def shutdown(self, client: _Client, timeout: float) -> None:
        """Kill leftover workers, detach from remote hosts, close the transport and node,
        remove a temporary CA directory."""
        with self._lock:
            self.closed = True
            node, self._node = self._node, None
            transport, self.transport = self.transport, None
            groups, self.groups = self.groups, []
            sessions, self.sessions = self.sessions, []
            watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.close()
        self.nested.clear()
        for group in groups:
            group.kill()
        if node is not None and not client.loop.closed:

            async def close() -> None:
                for session in sessions:
                    await session.detach()
                if transport is not None:
                    await transport.aclose()
                await node.aclose()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), client.loop.loop).result(timeout)
        client.fabric.uplink = None
        if self._temporary_ca and self.ca_dir is not None:
            shutil.rmtree(self.ca_dir, ignore_errors=True)


class WorkerGroup:
    """The worker processes of one ``spawn_procs`` call: their PIDs (by rank), exit events,
    and how to stop and kill them. Subclasses start the processes (``LocalWorkerGroup`` on
    this host, ``_attach.RemoteWorkerGroup`` through a host's worker daemon)."""

    def __init__(self, layer: ClientNodeLayer, labels: Sequence[str]) -> None:
        self._layer = layer
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

    def exit_expected(self) -> bool:
        """True once the owner stopped or killed these processes (their exit is no failure)."""
        return self.killed or (self.state is not None and self.state.stopped)

    def on_exit(self, rank: int, reason: str, *, expected: bool = False) -> None:
        """The worker at ``rank`` exited (any thread; once per rank); ``expected``: the
        caller knows the exit is no failure."""
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
            self._layer.process_died(self.pids[rank], reason, failure=failure)
        finally:  # set last: once set, the notices of this exit are out (flush_supervision)
            self.exited[rank].set()

    def watch_liveness(self) -> None:
        """Start the heartbeats to every worker of the group (once their PIDs are known)."""
        watchdog = self._layer.watchdog
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
        self._layer.process_died(
            self.pids[rank], reason, failure=not self.exit_expected(), fenced=True
        )

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
        watchdog = self._layer.watchdog
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

    def __init__(self, layer: ClientNodeLayer, labels: Sequence[str]) -> None:
        super().__init__(layer, labels)
        self.popens: list[WorkerProcess] = []

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
        for rank, label in enumerate(self.labels):
            if self.killed:  # killed while starting: start no more
                break
            command = worker_command(
                parent=parent, authority=authority, ca_dir=ca_dir, label=label, idle=idle,
                main=main,
            )  # fmt: skip
            custom = commands[rank] if commands is not None else None
            prefix = numactl[rank] if numactl is not None else ()
            if zygote is not None and custom is None and not prefix:
                try:
                    self.popens.append(zygote.spawn(command[3:], target=FORKED_WORKER, env=env))
                    continue
                except ZygoteUnavailableError as exc:
                    _log.warning("forking workers failed (%s); starting them with exec", exc)
                    zygote = None
            argv, executable, environment = exec_spec(command, custom, prefix, env)
            try:
                process = subprocess.Popen(
                    argv,
                    executable=executable,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    env=environment,
                )
            except OSError as exc:
                self.kill()
                raise RuntimeError(f"worker process {label} could not be started: {exc}") from exc
            self.popens.append(process)
        if self.killed:
            self.kill()
            raise RuntimeError("the processes were killed while they started")
        pids = read_worker_pids(self.popens, self.labels, spawn_timeout())
        if isinstance(pids, str):
            self.kill()
            raise RuntimeError(pids)
        self.pids = pids
        for rank, popen in enumerate(self.popens):
            forward_output(popen.stdout)
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
            rank, f"process {self.labels[rank]} (os pid {popen.pid}) {_describe_exit(code)}"
        )

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


def _start_group(
    client: _Client,
    sessions: Sequence[HostSession] | None,
    extent: Extent,
    local: Extent,
    mesh_name: str,
    *,
    group: LocalWorkerGroup | None = None,
    commands: Sequence[BootstrapCommand | None] | None = None,
    numactl: Sequence[Sequence[str]] | None = None,
) -> WorkerGroup:
    """Start the processes of one ``spawn_procs``: ``local`` on this host (``sessions`` is
    None; into ``group`` when given) or on every host of ``sessions`` (``extent``: the host
    dimensions, then ``local``). ``commands`` and ``numactl``: per rank, this host only."""
    layer = client.node_layer
    parent, authority, ca_dir = layer.ensure_started(client)
    started: WorkerGroup
    if sessions is None:
        local_group = group or LocalWorkerGroup(layer, [f"{mesh_name}{p}" for p in local.points()])
        with layer._lock:
            if layer.closed:  # shut down since ensure_started: it would never kill the group
                raise RuntimeError("the client runtime was shut down")
            layer.groups.append(local_group)
        local_group.start(parent, authority, ca_dir, commands=commands, numactl=numactl)
        started = local_group
    else:
        from monarch.actor._attach import spawn_on_hosts

        started = spawn_on_hosts(
            layer, sessions, extent, local, mesh_name, commands=commands, numactl=numactl
        )
    # The workers' actors may ask the host agent for processes once they exist. It starts
    # after the first workers, so the zygote is forked before the agent's thread exists.
    ensure_agent(client)
    return started


class _SpawnOptions:
    """The checked ``bootstrap``, ``proc_bind`` and ``bootstrap_command`` of one
    ``spawn_procs``, per rank (``procs``: how many processes in all; ``proc_bind`` entries
    repeat on every host)."""

    __slots__ = ("bootstrap", "commands", "cpus", "numactl", "numactl_missing")

    def __init__(
        self,
        bootstrap: Callable[[], Any] | None,
        bindings: Sequence[ProcBinding] | None,
        commands: list[BootstrapCommand | None] | None,
        procs: int,
    ) -> None:
        self.bootstrap = bootstrap
        self.commands = commands
        self.cpus: list[list[int] | None] | None = None
        self.numactl: list[list[str]] | None = None
        self.numactl_missing = next(
            (b.numactl_missing for b in bindings or () if b.numactl_missing), None
        )
        if bindings:
            per = len(bindings)
            if any(b.cpus is not None for b in bindings):
                self.cpus = [bindings[rank % per].cpus for rank in range(procs)]
            if any(b.numactl for b in bindings):
                self.numactl = [bindings[rank % per].numactl for rank in range(procs)]

    @property
    def needs_setup(self) -> bool:
        """True if the owner runs something on the new processes before they are ready."""
        return self.bootstrap is not None or self.cpus is not None


def run_setup(procs: Sequence[ProcId], shape: Shape, name: str, options: _SpawnOptions) -> None:
    """Run the owner's setup on every new process (``_host_agent.ProcSetup``), as the calling
    actor (or client); ``ActorError`` if ``bootstrap`` raised on a process."""
    import uuid

    mesh = ProcMesh(procs, shape, owned=False, name=name)
    setup: Any = mesh._spawn("setup", f"monarch-setup-{uuid.uuid4().hex[:12]}", ProcSetup, (), {})
    _forget(setup)
    future = setup.setup.call(options.bootstrap, options.cpus)
    try:
        future.get(timeout=SETUP_TIMEOUT)
    except TimeoutError:
        raise RuntimeError(
            f"the bootstrap of proc mesh {name!r} did not finish within {SETUP_TIMEOUT:.0f} s"
        ) from None


def bring_up(
    state: _ProcMeshState,
    shape: Shape,
    name: str,
    start: Callable[[], list[ProcId]],
    options: _SpawnOptions,
    cleanup: Callable[[], None],
) -> None:
    """Start the processes of one ``spawn_procs`` on a thread of its own (in the caller's
    context: the setup is sent as the owner) and resolve ``state.ready``: with the process
    ids once ``start()`` returned and the setup ran, or with the error, after ``cleanup()``
    ended whatever had started. Every step is bounded, so ``ready`` always resolves."""
    import contextvars

    ready = state.ready
    assert ready is not None
    context = contextvars.copy_context()

    def run() -> None:
        try:
            procs = tuple(start())
            if options.needs_setup and not state.stopped:
                run_setup(procs, shape, name, options)
        except BaseException as exc:  # every outcome resolves ``ready``
            with contextlib.suppress(Exception):
                cleanup()
            ready.set_exception(exc)
        else:
            ready.set_result(procs)

    threading.Thread(
        target=context.run, args=(run,), name="monarch-spawn-procs", daemon=True
    ).start()


class HostMesh(MeshTrait):
    """A mesh of hosts. ``this_host()`` is the client's own host (extent ``{}``);
    ``attach_to_workers`` makes one of hosts started separately (extent ``{hosts: N}``).

    ``spawn_procs(per_host)`` starts one worker process per point of ``per_host`` on every host
    of this mesh and returns the owned ``ProcMesh`` (extent: the host dimensions, then
    ``per_host``). ``stop()`` stops every proc mesh spawned from this handle and keeps it (and
    the hosts' worker daemons) usable; ``shutdown()`` does the same, then ends the worker
    daemons and makes the handle unusable; ``kill()`` force-kills every process at once.

    ``target`` says which hosts a *reference* means wherever it is used (it pickles with the
    handle): ``client`` (the client's host), ``proc:<PID hex>`` (the host of that process:
    ``this_host()`` in a worker, ``ProcMesh.host_mesh``) or ``attached:<token>`` (attached
    hosts, looked up in the client's table when the handle was pickled). In a worker,
    ``spawn_procs`` asks the client's host agent (``_host_agent``) to start the processes.
    """

    def __init__(
        self,
        shape: Shape,
        *,
        owned: bool,
        name: str = "host",
        hosts: Sequence[HostSession] | None = None,
        attached_ref: bool = False,
        target: str | None = None,
        _registry: tuple[list[ProcMesh], threading.Lock] | None = None,
    ) -> None:
        self._shape = shape
        self._attached_ref = attached_ref
        if target is None:
            target = "client" if hosts is None else f"attached:{os.urandom(12).hex()}"
        self._target = target
        self._owned = owned
        self._name = name
        self._hosts = list(hosts) if hosts is not None else None
        # Proc meshes spawned from this mesh *or its slices* (shared with them), so stopping
        # the owner stops everything spawned on its hosts.
        self._spawned, self._lock = _registry or ([], threading.Lock())
        self._shut_down = False
        self._python: str | None = None  # with_python_executable

    # -- MeshTrait ---------------------------------------------------------------------------
    @property
    def _ndslice(self) -> Slice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        mesh = HostMesh(
            shape,
            owned=False,
            name=self._name,
            hosts=self._hosts,
            attached_ref=self._attached_ref,
            target=self._target,
            _registry=(self._spawned, self._lock),
        )
        mesh._python = self._python
        return mesh

    # -- API -----------------------------------------------------------------------------------
    @property
    def initialized(self) -> Future[bool]:
        """Resolves to ``True`` (hosts are attached before the handle exists)."""
        return Future._completed(True)

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """This mesh, spawning its processes with ``python_executable`` (the interpreter that
        runs ``-m monarch.actor._worker``) instead of the client's ``sys.executable``, unless
        a ``spawn_procs`` call gives its own ``bootstrap_command``. Their own ``this_host()
        .spawn_procs`` then uses that interpreter too (it is their ``sys.executable``). The
        interpreter must be able to import this package (the client's ``sys.path`` is passed
        on as ``PYTHONPATH``); one that cannot start fails ``initialized``."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError(f"python_executable must be a non-empty str, got {python_executable!r}")
        mesh = HostMesh(
            self._shape,
            owned=self._owned,
            name=self._name,
            hosts=self._hosts,
            attached_ref=self._attached_ref,
            target=self._target,
            _registry=(self._spawned, self._lock),
        )
        mesh._python = python_executable
        return mesh

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, Any]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        """Start one worker process per point of ``per_host`` on every host; return their
        ``ProcMesh`` at once (as the reference: the processes start in the background).

        ``await pm.initialized`` (or ``.get()``) resolves to ``True`` once every process
        joined and ran ``bootstrap``; it raises if they could not be brought up (a failing
        ``bootstrap`` is an ``ActorError``). Spawning actors on the mesh does not wait;
        calls, stops and pickling wait (bounded) for the processes and fail with the same
        error if the spawn failed.

        ``bootstrap``: a sync or async zero-argument callable run on every new process before
        any user actor. ``proc_bind``: one dict per process on a host; ``cpus`` (a CPU list
        such as ``"0-3,6"``) binds the process with ``sched_setaffinity``, ``cpunodebind``,
        ``membind`` and ``physcpubind`` start it under ``numactl`` (``RuntimeError`` if it is
        not installed). ``bootstrap_command``: a ``BootstrapCommand`` or a callable ``Point ->
        BootstrapCommand`` (see ``default_bootstrap_cmd``): the program that starts each
        process; it must end up running ``monarch.actor._worker``.

        Raised at once: ``RuntimeError`` after ``shutdown`` or for a lost host; ``ValueError``
        for a label of the host mesh, a bad size or a ``proc_bind`` of the wrong length;
        ``TypeError`` for arguments of the wrong type (on attached hosts a missing numactl or
        a command the host's worker loop cannot start fail ``initialized``). In a worker's
        actor the processes are started by the client (``_host_agent``) and owned by the
        calling actor; past the nesting bounds (``MAX_SPAWN_DEPTH`` levels,
        ``MAX_NESTED_PROCS`` processes) ``initialized`` raises ``RuntimeError``.
        """
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        sizes = dict(per_host or {})
        for label, size in sizes.items():
            if not isinstance(label, str) or isinstance(size, bool) or not isinstance(size, int):
                raise TypeError("per_host maps dimension names to int sizes")
            if label in self._shape.labels:
                raise ValueError(f"per_host label {label!r} is already a host mesh label")
            if size < 1:
                raise ValueError(f"per_host size for {label!r} must be at least 1, got {size}")
        local = Extent(list(sizes), list(sizes.values()))
        extent = Extent(
            [*self._shape.labels, *local.labels],
            [*self._shape.ndslice.sizes, *local.sizes],
        )
        if extent.nelements > _MAX_PROCS:
            raise ValueError(f"at most {_MAX_PROCS} processes per spawn_procs call")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a zero-argument callable, got {bootstrap!r}")
        if bootstrap_command is None and self._python is not None:
            bootstrap_command = BootstrapCommand(self._python, None, _WORKER_ARGS, {})
        options = _SpawnOptions(
            bootstrap,
            check_proc_bind(proc_bind, local.nelements),
            bootstrap_commands(bootstrap_command, extent),
            extent.nelements,
        )
        if options.numactl_missing is not None and self._hosts is None:
            raise RuntimeError(options.numactl_missing)  # attached hosts: their daemon says
        mesh_name = name or "procs"
        ranks = list(self._shape.ndslice)
        shape = Shape.from_extent(extent)
        state = _ProcMeshState(ready=_Cell())
        if _in_worker_process():
            ctx = _current()
            if ctx is None:
                raise RuntimeError(
                    "spawn_procs in a worker process must be called by an actor (the actor "
                    "owns the processes)"
                )
            mesh = ProcMesh(None, shape, owned=True, state=state, name=mesh_name)
            spawn_from_worker(self._target, ranks, extent, local, mesh_name, state, options)
            _adopt(ctx._cell, mesh)
            return mesh
        c = client()
        sessions: list[HostSession] | None
        if self._hosts is not None:
            sessions = [self._hosts[rank] for rank in ranks]
        else:
            sessions = c.node_layer.nested.resolve(self._target, ranks)
        local_group: LocalWorkerGroup | None = None
        if sessions is None:
            check_spawn_method()
            local_group = LocalWorkerGroup(
                c.node_layer, [f"{mesh_name}{p}" for p in local.points()]
            )
            state.adopt_group(local_group)
        else:
            for session in sessions:  # a host known to be gone fails now, not in the background
                if session.lost is not None:
                    raise RuntimeError(session.lost)

        def start() -> list[ProcId]:
            group = _start_group(
                c, sessions, extent, local, mesh_name,
                group=local_group, commands=options.commands, numactl=options.numactl,
            )  # fmt: skip
            if state.adopt_group(group):  # HostMesh.kill() while it started
                group.kill()
                raise RuntimeError("the processes were killed while they started")
            return [ProcId(pid, label) for pid, label in zip(group.pids, group.labels, strict=True)]

        def cleanup() -> None:
            group = state.group
            if group is not None:
                group.killed = True  # their exits are no failures: the owner learns why
                group.kill()

        mesh = ProcMesh(None, shape, owned=True, state=state, name=mesh_name)
        ctx = _current()
        _adopt(ctx._cell if ctx is not None else c.root, mesh)
        with self._lock:
            self._spawned.append(mesh)
        bring_up(state, shape, mesh_name, start, options, cleanup)
        return mesh

    def _stop_spawned(self, then: Callable[[], None] | None = None) -> Future[None]:
        with self._lock:
            meshes = list(self._spawned)
            self._spawned.clear()
        futures = [m.stop() for m in meshes if m._owned and not m._state.stopped]  # type: ignore[union-attr]
        cell: _Cell[None] = _Cell()

        def run() -> None:
            for future in futures:
                future._cell.wait(float(_config.get("stop_actor_timeout")) + EXIT_TIMEOUT + 2)
            try:
                if then is not None:
                    then()
            finally:
                cell.set_result(None)

        threading.Thread(target=run, name="monarch-host-stop", daemon=True).start()
        return Future._create(cell)

    def stop(self) -> Future[None]:
        """Stop every proc mesh spawned from this handle or its slices (the handle and the
        hosts' worker daemons stay usable). ``RuntimeError`` on a reference."""
        if not self._owned:
            raise RuntimeError(
                "HostMesh cannot be stopped: this is a reference instead of owned "
                "(a slice or an unpickled copy)"
            )
        return self._stop_spawned()

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh spawned from this handle, then end the worker daemons of
        attached hosts; later ``spawn_procs`` raise."""
        self._claim_end("shut down")
        self._forget_target()
        hosts = self._hosts
        return self._stop_spawned(None if hosts is None else lambda: _end_hosts(hosts, kill=False))

    def kill(self) -> Future[None]:
        """Force-kill: SIGKILL every process spawned from this handle at once (attached
        hosts' worker daemons kill theirs and exit immediately). The exits are not failures;
        the handle becomes unusable."""
        self._claim_end("killed")
        self._forget_target()
        with self._lock:
            meshes = list(self._spawned)
            self._spawned.clear()
        groups = [
            group
            for group in (m._state.request_kill() for m in meshes if m._state is not None)
            if group is not None
        ]  # a group still starting is killed by its starting thread
        if self._hosts is not None:
            _end_hosts(self._hosts, kill=True)
        for group in groups:
            group.kill()
        return Future._completed(None)

    def _forget_target(self) -> None:
        if self._hosts is not None and not _in_worker_process():
            client().node_layer.nested.forget_hosts(self._target.partition(":")[2])

    def _claim_end(self, what: str) -> None:
        if not self._owned:
            raise RuntimeError(
                f"HostMesh cannot be {what}: this is a reference instead of owned "
                "(a slice or an unpickled copy)"
            )
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        self._shut_down = True

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owned and not self._shut_down:
            await self.shutdown()

    def __reduce__(self) -> tuple[Any, ...]:
        if self._hosts is not None and not self._shut_down:
            # Attached hosts: references find their sessions in the client's table.

            token = self._target.partition(":")[2]
            client().node_layer.nested.register_hosts(token, self._hosts)
        return (
            _rebuild_host_mesh,
            (self._shape, self._name, self._hosts is not None, self._target),
        )

    def __repr__(self) -> str:
        owned = "owned" if self._owned else "ref"
        return f"<HostMesh {self._name} {self.extent} ({owned})>"


def _end_hosts(hosts: Sequence[HostSession], *, kill: bool) -> None:
    for session in hosts:
        session.end(kill=kill)


def _rebuild_host_mesh(
    shape: Shape, name: str, attached: bool = False, target: str = "client"
) -> HostMesh:
    return HostMesh(shape, owned=False, name=name, attached_ref=attached, target=target)


def this_host() -> HostMesh:
    """The host of this process as a host mesh with an empty extent: on the client its own
    (owned, one per client runtime); in a worker a reference to the worker's host, where
    ``spawn_procs`` starts processes owned by the calling actor (``_host_agent``)."""
    if _in_worker_process():
        if _worker_pid is None:
            refuse_while_importing("this_host()")
            raise RuntimeError("this worker process has not joined its client yet")
        return HostMesh(Shape.unity(), owned=False, target=f"proc:{_worker_pid.hex()}")
    c = client()
    with c.host_lock:
        if c.host_mesh is None or c.host_mesh._shut_down:
            c.host_mesh = HostMesh(Shape.unity(), owned=True)
        return c.host_mesh


def _host_of(target: str) -> HostMesh:
    return HostMesh(Shape.unity(), owned=False, target=target)


set_node_layer(ClientNodeLayer)  # hook H3: the client's node layer
set_host_resolver(_host_of)  # hook H4: ``ProcMesh.host_mesh``
