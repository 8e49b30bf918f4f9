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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ACTIVE_STATES",
    "DEFAULTS_PREFIXES",
    "MAX_REPORT_BYTES",
    "REPORT_ENV",
    "REQUEST_COMMENT",
    "TERMINAL_STATES",
    "SbatchSpec",
    "WorkerReport",
    "NodeShape",
    "jobs_with_comment",
    "node_addrs",
    "node_share",
    "parse_sinfo_nodes",
    "parse_allocation",
    "parse_granted",
    "parse_job_id",
    "parse_report",
    "parse_report_target",
    "parse_squeue",
    "report_line",
    "salloc_argv",
    "sbatch_script",
    "step_argv",
    "submission_defaults",
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
_GRANTED = re.compile(r"Granted job allocation (\d+)")
_ALLOCATION = re.compile(r"[Jj]ob allocation (\d+)")
#: ``#SBATCH`` options ``salloc`` has no use for (the worker step's output goes where its
#: ``srun`` is told).
_BATCH_ONLY: Final = ("--output=", "--error=")
#: What names one ``salloc`` request in its job's comment (``REQUEST_COMMENT`` + a random token):
#: an allocation ``salloc`` made without saying so is found by it (and cancelled).
REQUEST_COMMENT: Final = "monarch_request="
#: The environment variable through which a submitting client asks each node's worker loop to
#: report once it listens: ``TOKEN@HOST:PORT`` (a TCP listener of the client).
REPORT_ENV: Final = "MONARCH_JOB_REPORT"
#: The longest report (one line) a client reads.
MAX_REPORT_BYTES: Final = 512
_REPORT_MAGIC: Final = "monarch-job-report/1"
_TOKEN = re.compile(r"[0-9a-f]{16,64}")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_WORKER_ADDRESS = re.compile(r"udp://[0-9A-Za-z.:\[\]-]{1,255}:\d{1,5}")


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


def salloc_argv(script: str, comment: str | None = None) -> list[str]:
    """``salloc --no-shell --immediate`` asking for what a batch script's ``#SBATCH`` directives
    ask (but its output files): an allocation now, or a refusal now (then ``sbatch`` queues it).

    Why: Slurm schedules a batch job at its controller's next background pass (up to a second
    after ``sbatch`` returns, whatever the cluster's load), an interactive allocation while it is
    submitted; ``--no-shell`` keeps the allocation without a process on the client's machine.
    ``comment``: added to the job's comment (``SlurmJob`` names its port there: no batch script
    does), after the user's own ``--comment`` when the directives have one (one ``--comment``,
    the last option: a user's alone would hide the port from ``slurm://`` URLs)."""
    argv = ["salloc", "--no-shell", "--immediate=1"]
    words: list[str] = []
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            words += [w for w in shlex.split(line[8:]) if not w.startswith(_BATCH_ONLY)]
    if comment is None:
        return argv + words
    _clean("comment", comment)
    theirs: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--comment" and index + 1 < len(words):  # sbatch reads the next word
            theirs.append(words[index + 1])
            index += 2
            continue
        if word.startswith("--comment="):
            theirs.append(word.removeprefix("--comment="))
        else:
            argv.append(word)
        index += 1
    merged = " ".join([theirs[-1], comment] if theirs and theirs[-1] else [comment])
    argv.append(f"--comment={_clean('comment', merged)}")
    return argv


def parse_granted(stderr: str) -> str | None:
    """The job id in ``salloc``'s ``Granted job allocation N``; None when it says none."""
    match = _GRANTED.search(stderr)
    return match.group(1) if match else None


def parse_allocation(output: str | bytes | None) -> str | None:
    """The job id of any allocation ``salloc``'s output names (``Granted``, ``Pending``, ``Job
    allocation N has been revoked``), also partial output (a ``TimeoutExpired``'s bytes); None
    when it names none."""
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    match = _ALLOCATION.search(output or "")
    return match.group(1) if match else None


#: The ``sbatch`` and ``salloc`` input environment variables (a site's or a user's defaults:
#: ``SBATCH_ACCOUNT``, ``SBATCH_PARTITION``, ``SALLOC_QOS``, ...): each command reads only its
#: own, so while any is set the allocation is asked with ``sbatch`` only.
DEFAULTS_PREFIXES: Final = ("SBATCH_", "SALLOC_")


def submission_defaults(environ: Mapping[str, str]) -> list[str]:
    """The names of the ``SBATCH_*``/``SALLOC_*`` variables set (non-empty) in ``environ``,
    sorted: ``salloc`` would not ask for what ``sbatch`` would (or the other way round)."""
    return sorted(k for k, v in environ.items() if k.startswith(DEFAULTS_PREFIXES) and v)


def step_argv(job_id: str, nodes: int, worker_argv: Sequence[str]) -> list[str]:
    """The command that starts the worker command once on each of ``nodes`` nodes of the
    allocation ``job_id`` (the ``srun`` step a batch script runs, started from outside the job)
    and then ends the allocation (``scancel``, whatever the step's exit): a ``salloc
    --no-shell`` allocation, unlike a batch job, outlives its last step. ``sh`` exits with the
    step's status."""
    _positive("nodes", nodes)
    if not job_id.isdigit():
        raise ValueError(f"job id {job_id!r} is not a number")
    if not worker_argv:
        raise ValueError("the worker command is empty")
    head = [f"--jobid={job_id}", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    return ["sh", "-c", _STEP_THEN_CANCEL, job_id, "srun", *head, *worker_argv]


#: ``sh -c`` script of ``step_argv``: ``$0`` is the job id, ``"$@"`` the ``srun`` command.
_STEP_THEN_CANCEL: Final = '"$@"; status=$?; scancel "$0"; exit "$status"'


def jobs_with_comment(squeue_stdout: str, word: str) -> list[str]:
    """The job ids in ``squeue -h -o '%i|%k'`` whose comment holds ``word`` (a whole word)."""
    ids = []
    for line in squeue_stdout.splitlines():
        job_id, bar, comment = line.strip().partition("|")
        if bar and job_id.isdigit() and word in comment.replace(",", " ").split():
            ids.append(job_id)
    return ids


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


@dataclass(frozen=True)
class WorkerReport:
    """What a worker loop tells the client that submitted its job once it listens: its node's
    rank in the allocation (``$SLURM_NODEID``), its node name and the address it listens on."""

    node_id: int
    node_name: str
    address: str


def parse_report_target(value: str) -> tuple[str, str, int]:
    """``(token, host, port)`` from ``$MONARCH_JOB_REPORT`` (``TOKEN@HOST:PORT``);
    ``ValueError`` naming what is wrong."""
    token, at, target = value.strip().partition("@")
    host, colon, port = target.rpartition(":")
    if not at or not colon or not _TOKEN.fullmatch(token):
        raise ValueError(f"{REPORT_ENV} {value[:100]!r} is not TOKEN@HOST:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536 or not host or _unsafe(host):
        raise ValueError(f"{REPORT_ENV} {value[:100]!r} has no usable HOST:PORT")
    return token, host.strip("[]"), int(port)


def report_line(token: str, job_id: str, report: WorkerReport) -> bytes:
    """The one line a worker loop sends (``parse_report`` reads it)."""
    line = (
        f"{_REPORT_MAGIC} {token} {job_id} {report.node_id} {report.node_name} {report.address}\n"
    )
    if len(line) > MAX_REPORT_BYTES:
        raise ValueError(f"a report of {len(line)} bytes is over {MAX_REPORT_BYTES}")
    return line.encode()


def parse_report(data: bytes, token: str, job_id: str) -> WorkerReport:
    """The report in ``data`` when it carries ``token`` and ``job_id`` (this client's request,
    this job); ``ValueError`` saying why not otherwise (a stale job's or a stranger's line)."""
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"a report is at most {MAX_REPORT_BYTES} bytes, got {len(data)}")
    try:
        words = data.decode("ascii").split()
    except UnicodeDecodeError:
        raise ValueError("a report is ASCII text") from None
    if len(words) != 6 or words[0] != _REPORT_MAGIC:
        raise ValueError(f"not a worker report: {data[:80]!r}")
    _, their_token, their_job, node_id, node_name, address = words
    if their_token != token:
        raise ValueError("a report with another token (not this client's request)")
    if their_job != job_id:
        raise ValueError(f"a report of job {their_job}, not {job_id}")
    if not node_id.isdigit() or len(node_id) > 6:
        raise ValueError(f"a report's node id {node_id!r} is not a number")
    if not _NODE_NAME.fullmatch(node_name):
        raise ValueError(f"a report's node name {node_name!r} is not a host name")
    if not _WORKER_ADDRESS.fullmatch(address):
        raise ValueError(f"a report's address {address!r} is not udp://HOST:PORT")
    return WorkerReport(int(node_id), node_name, address)


@dataclass(frozen=True)
class NodeShape:
    """One kind of node of a partition: its CPUs, memory (MB) and GPUs."""

    cpus: int
    memory_mb: int
    gpus: int


def _gpus_in_gres(gres: str) -> int:
    """The GPU count in ``sinfo``'s ``%G`` (``gpu:8``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_sinfo_nodes(stdout: str, partition: str) -> list[NodeShape]:
    """The node shapes of ``sinfo -h -p PARTITION -o '%c|%m|%G'`` (``ValueError`` naming the
    partition when it lists none)."""
    shapes = []
    for line in stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3:
            continue
        cpus, memory, gres = fields
        cpus, memory = cpus.rstrip("+"), memory.rstrip("+")
        if cpus.isdigit() and memory.isdigit():
            shapes.append(NodeShape(int(cpus), int(memory), _gpus_in_gres(gres)))
    if not shapes:
        raise ValueError(f"sinfo lists no nodes in partition {partition!r}")
    return shapes


def node_share(
    shapes: Sequence[NodeShape], tasks_per_node: int, gpus_per_task: int
) -> tuple[int, str]:
    """``(cpus_per_task, mem)`` for a task that takes ``gpus_per_task`` GPUs of a node (or,
    on nodes without GPUs, ``1/tasks_per_node`` of it): that fraction of the CPUs (at least
    one) and of the memory, on the smallest node shape so any node of the partition fits."""
    _positive("tasks_per_node", tasks_per_node)
    if gpus_per_task < 0:
        raise ValueError(f"gpus_per_task must not be negative, got {gpus_per_task}")
    if not shapes:
        raise ValueError("no node shapes to share")
    cpus = min(s.cpus for s in shapes)
    memory = min(s.memory_mb for s in shapes)
    gpus = min(s.gpus for s in shapes)
    if gpus_per_task:
        if gpus_per_task * tasks_per_node > gpus:
            raise ValueError(
                f"{tasks_per_node} tasks of {gpus_per_task} GPUs do not fit a node of {gpus} GPUs"
            )
        share_cpus, share_mem = cpus * gpus_per_task // gpus, memory * gpus_per_task // gpus
    else:
        if tasks_per_node > cpus:
            raise ValueError(f"{tasks_per_node} tasks do not fit a node of {cpus} CPUs")
        share_cpus, share_mem = cpus // tasks_per_node, memory // tasks_per_node
    return max(1, share_cpus), f"{max(1, share_mem)}M"
