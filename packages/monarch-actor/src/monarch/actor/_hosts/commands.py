"""How a worker process is started: its command line, the ``spawn_procs`` options that change
it, the worker's start-up protocol, and the bounds of starting and stopping processes.

Why one module: the client's local workers (``groups``), the worker daemons of attached hosts
(``attach_daemon``) and the worker itself (``worker``) must agree on these, and none of them
needs any of the others for it. ``python -m monarch.actor._worker`` stays the documented entry
point; a ``bootstrap_command`` or a numactl ``proc_bind`` key starts workers with exec, their
options then travelling in ``WORKER_ARGV_ENV``. ``bind_cpus`` runs in the new process
(``spawn.ProcSetup``). Pure: no process is started here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from monarch.actor._base.shape import Extent
from monarch.config import _registry as _config

__all__ = [
    "EXIT_TIMEOUT",
    "FAILED_LINE",
    "READY_LINE",
    "SETUP_TIMEOUT",
    "SPAWN_TIMEOUT",
    "STAGE_LINE",
    "STARTUP_MARKER",
    "WORKER_ARGV_ENV",
    "BootstrapCommand",
    "ProcBinding",
    "bind_cpus",
    "bootstrap_commands",
    "exec_worker",
    "check_proc_bind",
    "default_bootstrap_cmd",
    "exec_spec",
    "exit_timeout",
    "parse_cpus",
    "source_ip_toward",
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
#: Environment variable: the worker's options as a JSON list of strings, read when the worker
#: is started without arguments. A custom ``BootstrapCommand`` (a wrapper script, another
#: interpreter) then only has to end up running the worker module; it need not forward arguments.
WORKER_ARGV_ENV: Final = "MONARCH_WORKER_ARGV"
#: Start-up lines on a worker's stdout (see ``worker``): the marker, a kind, a space, a value.
STARTUP_MARKER: Final = "\x00monarch-worker "
READY_LINE: Final = STARTUP_MARKER + "ready "  # + this worker's PID (hex)
FAILED_LINE: Final = STARTUP_MARKER + "failed "  # + why it cannot start
STAGE_LINE: Final = STARTUP_MARKER + "stage "  # + what it is doing now


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
    if custom is None:
        return [*numactl, *command], None, dict(env)
    environment = custom.environment(env)
    environment[WORKER_ARGV_ENV] = json.dumps(list(command[3:]))  # after "python -m module"
    if numactl:  # numactl execs the program: it sees the program as its argv[0]
        return [*numactl, custom.program, *custom.args], None, environment
    return [custom.arg0 or custom.program, *custom.args], custom.program, environment


def exec_worker(
    command: Sequence[str],
    custom: BootstrapCommand | None,
    numactl: Sequence[str],
    env: Mapping[str, str],
    *,
    stdin: int,
) -> subprocess.Popen[bytes]:
    """Start one exec'd worker (``exec_spec``) with its stdout and stderr on pipes and
    ``stdin`` (``subprocess.PIPE``: it exits with its parent's end; ``DEVNULL``). ``OSError``
    (or ``ValueError``) when it cannot start."""
    argv, executable, environment = exec_spec(command, custom, numactl, env)
    return subprocess.Popen(
        argv,
        executable=executable,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )


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


def bind_cpus(cpus: Sequence[int]) -> None:
    """Bind every thread of this process to ``cpus`` (``proc_bind`` key ``cpus``).

    Why every thread: Linux affinity is per thread, and by the time the owner's setup runs the
    worker has its runtime and transport threads; threads started later inherit the mask of
    the thread that starts them, which is then bound too."""
    mask = set(cpus)
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, mask)
