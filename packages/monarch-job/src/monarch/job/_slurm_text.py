"""What ``SlurmJob`` writes to and reads from the Slurm commands, without running them (sans-IO):
the ``sbatch`` script, ``sbatch``'s job id, ``squeue``'s state and node list, ``scontrol``'s
node addresses.

Every value that goes into the script is checked first (``ValueError`` naming it): a line break
or a control character would end an ``#SBATCH`` line and start a shell command, and a directive
that does not start with ``-`` is not one (Slurm would silently ignore it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "SbatchSpec",
    "node_addrs",
    "parse_job_id",
    "parse_squeue",
    "sbatch_script",
]

#: Job states in which the allocation exists or will (``squeue``'s ``%T``).
ACTIVE_STATES: Final = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD"}
)
#: Job states after which the allocation is gone or going.
TERMINAL_STATES: Final = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "DEADLINE", "FAILED",
        "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT",
    }
)  # fmt: skip
#: The most directives a job may add (``slurm_args``) and the longest value of any one.
MAX_DIRECTIVES: Final = 256
MAX_VALUE_CHARS: Final = 4096
_JOB_ID = re.compile(r"Submitted batch job (\d+)")


@dataclass(frozen=True)
class SbatchSpec:
    """Everything the batch script says (``SlurmJob``'s options and the worker command)."""

    job_name: str
    nodes: int
    worker_argv: tuple[str, ...]
    output: str
    error: str
    ntasks_per_node: int = 1
    time_limit: str | None = None
    partition: str | None = None
    exclusive: bool = True
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    account: str | None = None
    qos: str | None = None
    slurm_args: tuple[str, ...] = ()
    #: Batch mode: the client command the script runs after starting the workers (None: the
    #: script runs only the workers, and a client elsewhere attaches).
    client_argv: tuple[str, ...] | None = None


def _clean(what: str, value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value or len(value) > MAX_VALUE_CHARS:
        raise ValueError(f"{what} must have 1 to {MAX_VALUE_CHARS} characters, got {len(value)}")
    if _unsafe(value):
        raise ValueError(f"{what} {value!r} contains a line break or a control character")
    return value


def _unsafe(value: str) -> bool:
    """Whether ``value`` holds a control character or anything a reader might take for a line
    break (bash splits only at newlines; other tools at any Unicode line separator)."""
    return len(f"x{value}x".splitlines()) != 1 or any(ord(c) < 32 or ord(c) == 127 for c in value)


def _positive(what: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def sbatch_script(spec: SbatchSpec) -> str:
    """The batch script: ``#SBATCH`` directives, then one ``srun`` step running the worker
    command once per node (``--ntasks-per-node=1``: one worker loop per host)."""
    _positive("nodes", spec.nodes)
    _positive("ntasks_per_node", spec.ntasks_per_node)
    if not spec.worker_argv:
        raise ValueError("the worker command is empty")
    if len(spec.slurm_args) > MAX_DIRECTIVES:
        raise ValueError(f"at most {MAX_DIRECTIVES} slurm_args, got {len(spec.slurm_args)}")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={_clean('job_name', spec.job_name)}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={spec.ntasks_per_node}",
        f"#SBATCH --output={_clean('output', spec.output)}",
        f"#SBATCH --error={_clean('error', spec.error)}",
    ]
    optional: list[tuple[str, str | int | None]] = [
        ("time", spec.time_limit),
        ("partition", spec.partition),
        ("gpus-per-node", spec.gpus_per_node),
        ("cpus-per-task", spec.cpus_per_task),
        ("mem", spec.mem),
        ("account", spec.account),
        ("qos", spec.qos),
    ]
    for key, value in optional:
        if value is None:
            continue
        if isinstance(value, int):
            _positive(key.replace("-", "_"), value)
        lines.append(f"#SBATCH --{key}={_clean(key, str(value))}")
    if spec.exclusive:
        lines.append("#SBATCH --exclusive")
    for arg in spec.slurm_args:
        if not _clean("a slurm_args entry", arg).startswith("-"):
            raise ValueError(f"slurm_args entry {arg!r} is not an sbatch option (starts with -)")
        lines.append(f"#SBATCH {arg}")
    command = " ".join(shlex.quote(_clean("the worker command", a)) for a in spec.worker_argv)
    srun = f"srun --nodes={spec.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {command}"
    if spec.client_argv is None:
        lines += [
            "",
            "# one Monarch worker loop per allocated host; the job ends when they do",
            f"exec {srun}",
            "",
        ]
        return "\n".join(lines)
    if not spec.client_argv:
        raise ValueError("the client command is empty")
    client = " ".join(shlex.quote(_clean("the client command", a)) for a in spec.client_argv)
    lines += [
        "",
        "# batch mode: one Monarch worker loop per allocated host in the background, the client",
        "# here (its SlurmJob reconnects to this allocation); the job ends with the client",
        f"{srun} &",
        "workers=$!",
        f"MONARCH_BATCH_JOB=1 {client}",
        "status=$?",
        'kill "$workers" 2>/dev/null',
        'wait "$workers"',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def parse_job_id(stdout: str) -> str:
    """The job id in ``sbatch``'s output (``Submitted batch job N``, or ``N`` with
    ``--parsable``)."""
    match = _JOB_ID.search(stdout)
    if match:
        return match.group(1)
    first = stdout.strip().split(";")[0]
    if first.isdigit():
        return first
    raise ValueError(f"no job id in sbatch's output {stdout.strip()[:200]!r}")


def parse_squeue(stdout: str) -> tuple[str, str] | None:
    """``(state, nodelist)`` from ``squeue -h -j ID -o '%T|%N'``; None when the job is no
    longer listed."""
    for line in stdout.splitlines():
        if "|" in line:
            state, _, nodelist = line.strip().partition("|")
            return state.strip(), nodelist.strip()
    return None


def node_addrs(scontrol_stdout: str, names: Sequence[str]) -> list[str]:
    """Each node's ``NodeAddr`` (in ``names``' order) from ``scontrol show node -o``."""
    found: dict[str, str] = {}
    for line in scontrol_stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = fields.get("NodeName")
        if name:
            found[name] = fields.get("NodeAddr") or name
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"scontrol does not report the nodes {missing}")
    return [found[n] for n in names]
