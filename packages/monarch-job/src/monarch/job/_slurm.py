"""``SlurmJob``: hosts from a Slurm cluster through the real ``sbatch``/``squeue``/``scontrol``/
``scancel`` commands.

Why this shape (Monarch's ``SlurmJob``, API-compatible): ``apply()`` makes ONE allocation for
all meshes whose single ``srun`` step runs our worker loop (``python -m
monarch.job._host_worker``) once on every allocated node, listening on the node's ``NodeAddr``
and ``monarch_port``. It first asks ``salloc --no-shell --immediate`` for the nodes (the
controller grants an interactive allocation while it is submitted; a batch job waits for its
next scheduling pass, up to a second later even on an idle cluster) and starts the step from
here (``srun --jobid``, in a session of its own: it outlives this client, as the allocation
does, and ``scancel``s the allocation when it ends, as a batch job ends with its step); when
the nodes are not free at once (or ``immediate=False``, or in batch mode) it submits
a batch job with ``sbatch`` whose script runs that step (also while ``SBATCH_*``/``SALLOC_*``
defaults are set: each command reads only its own). Before either, the client opens a TCP
listener and passes it to the job (``$MONARCH_JOB_REPORT``, ``_report``); each worker loop
connects there once it listens and says where (its ``SLURM_NODEID``, node name and address), so
``state()`` attaches as soon as the last one did, polling ``squeue`` meanwhile only to see a job
that ends or never starts. Nodes that cannot reach the client are found by polling instead
(``REPORT_GRACE`` after the job runs): ``squeue`` until it runs, ``scontrol`` for the nodes'
addresses, ``udp://NODEADDR:PORT`` computed on both sides (no shared file system needed either
way). The nodes are split among the meshes in allocation order (the order of ``SLURM_NODEID``).
``kill()`` ends what this client spawned there, ``scancel``s the job and waits (bounded) until
Slurm no longer lists it, so its processes are gone. The job pickles as the job id and node list
only: a later client process reconnects to the same allocation (``job_load`` then ``state()``)
while the job runs.

Batch mode (``apply(client_script="train.py --lr 0.1")``): the job is saved to
``.monarch/job_state.pkl`` (in the submitting directory, which must be on a file system the
first node shares) and the batch script starts the worker loops in the background, then runs
``python_exe train.py --lr 0.1`` on the first node with ``MONARCH_BATCH_JOB=1``; there the saved
job takes its allocation from ``$SLURM_JOB_ID``, so the client's ``SlurmJob(...).state()`` (or
``job_load().state()``) attaches to the job it runs in. When the client exits, the script stops
the worker loops and the job ends with the client's exit status. (A batch client should not call
``kill()``: that cancels the allocation it runs in.)

Differences from the reference: the worker loop speaks Chrysalis over UDP (``udp://``), not
``tcp://``; ``python_exe`` defaults to this interpreter (``sys.executable``) rather than
``"python"``; ``share_node`` reads the partition's nodes with ``sinfo`` (Monarch's asks
``clusterscope``); ``out_of_cluster``/``attach_to`` (a gateway worker for a client outside the
cluster's network) are not implemented (``NotImplementedError``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from monarch.actor import HostMesh
from monarch.job._attach import attach_retrying, prepare_client
from monarch.job._cluster_url import PORT_COMMENT
from monarch.job._job import DEFAULT_JOB_PATH, JobState, JobTrait
from monarch.job._report import ReportListener
from monarch.job._slurm_text import (
    ACTIVE_STATES,
    REPORT_ENV,
    REQUEST_COMMENT,
    SbatchSpec,
    WorkerReport,
    jobs_with_comment,
    node_addrs,
    node_share,
    parse_allocation,
    parse_granted,
    parse_job_id,
    parse_sinfo_nodes,
    parse_squeue,
    salloc_argv,
    sbatch_script,
    step_argv,
    submission_defaults,
)

__all__ = ["SlurmJob"]

_log = logging.getLogger("monarch.job.slurm")

#: Seconds one Slurm command may take.
COMMAND_TIMEOUT: Final = 60.0
#: Seconds ``state()`` waits for the worker loops of a running job to accept the client.
WORKER_START_TIMEOUT: Final = 120.0
#: Seconds ``kill()`` waits for Slurm to stop listing a cancelled job.
KILL_TIMEOUT: Final = 60.0
_POLL_FIRST, _POLL_MAX = 0.1, 2.0
#: While a job waits to start: at most this many seconds between two ``squeue`` calls during
#: its first ``START_POLL_WINDOW`` seconds, then ``_POLL_MAX``. A job that starts at once is
#: seen within 0.5 s (before its worker loops can listen: starting Python and importing the
#: stack takes longer), and a job that queues for minutes costs the controller one call every
#: 2 s only.
START_POLL_FAST: Final = 0.5
START_POLL_WINDOW: Final = 30.0
#: Seconds after ``squeue`` first says the job runs that a client waiting for its worker loops'
#: reports (``_report``) gives up on the missing ones and finds them by polling instead (the
#: nodes may not reach the client: a firewall, a client outside the cluster's network).
REPORT_GRACE: Final = 10.0
#: Set (to ``1``) for the client a batch-mode job runs inside its allocation.
BATCH_JOB_ENV: Final = "MONARCH_BATCH_JOB"


def in_batch_job() -> bool:
    """Whether this process is the client a batch-mode job runs (``MONARCH_BATCH_JOB=1``)."""
    return os.environ.get(BATCH_JOB_ENV) == "1"


class SlurmJob(JobTrait):
    """A job whose meshes are nodes of a Slurm allocation (see the module docstring).

    ``meshes`` maps mesh names to node counts; the other options become ``#SBATCH``
    directives (``slurm_args``: extra ones, each starting with ``-``), or the same options of
    ``salloc`` (``immediate``: nodes free now are allocated with ``salloc --no-shell`` and the
    worker step started from this client; False: always a batch job). ``job_start_timeout``
    bounds the wait for the job to start running (None: wait as long as it queues).
    ``ca``: the cluster CA directory the workers and the client share (on a shared file system;
    ``"trust_all_connections"``: the development CA).
    """

    def __init__(
        self,
        meshes: dict[str, int],
        python_exe: str | None = None,
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: int | None = None,
        account: str | None = None,
        qos: str | None = None,
        bind_to: str | None = None,
        ca: str = "trust_all_connections",
        out_of_cluster: bool = False,
        attach_to: str | None = None,
        immediate: bool = True,
    ) -> None:
        super().__init__()
        if not meshes:
            raise ValueError("SlurmJob needs at least one mesh")
        for name, count in meshes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"mesh name {name!r} is not an identifier")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"mesh {name!r} needs a positive number of nodes, got {count!r}")
        if not 0 < monarch_port < 65536:
            raise ValueError(f"monarch_port {monarch_port} is not a port")
        if isinstance(slurm_args, str):
            raise TypeError("slurm_args is a sequence of options, not one str")
        if out_of_cluster or attach_to is not None:
            raise NotImplementedError(
                "SlurmJob(out_of_cluster=True / attach_to=...): a client outside the cluster's "
                "network reaching the nodes through a gateway worker is not implemented; the "
                "client must reach every node's worker loop over UDP (run it on a login node)"
            )
        self._meshes = dict(meshes)
        self._python_exe = python_exe or sys.executable
        self._slurm_args = tuple(slurm_args)
        self._port = monarch_port
        self._job_name = job_name
        self._ntasks_per_node = ntasks_per_node
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = os.path.abspath(log_dir if log_dir is not None else os.getcwd())
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._bind_to = bind_to
        self._ca = ca
        self._immediate = immediate
        # the allocation (pickled)
        self._slurm_job_id: str | None = None
        self._all_hostnames: list[str] = []
        self._addresses: list[str] = []
        self._batch = False  # saved by apply(client_script=...) for the client inside
        # this process's attachments and its listener for the worker loops' reports (never
        # pickled)
        self._attached: dict[str, HostMesh] = {}
        self._reports: ReportListener | None = None
        self._step: subprocess.Popen[bytes] | None = None  # the workers' srun (immediate)
        self.batch_script(self._unique_name())  # check every option now, not at apply()

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Add (or resize) mesh ``name`` of ``num_nodes`` nodes, before ``apply()``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"mesh name {name!r} is not an identifier")
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"mesh {name!r} needs a positive number of nodes, got {num_nodes!r}")
        if self.active:
            raise RuntimeError("add_mesh() after apply(): kill() the job first")
        self._meshes[name] = num_nodes

    def share_node(self, tasks_per_node: int, gpus_per_task: int, partition: str) -> None:
        """Share nodes with other jobs: not exclusive, and each task asks for its share of a
        node of ``partition`` (``gpus_per_task`` of the node's GPUs, or 1/``tasks_per_node``
        of a GPU-less node): that fraction of the node's CPUs and memory, read with ``sinfo``
        (the smallest node of the partition). Monarch's uses ``clusterscope`` for the same
        reading; here the Slurm commands do. ``ValueError`` when the share does not fit."""
        if isinstance(tasks_per_node, bool) or not isinstance(tasks_per_node, int):
            raise TypeError(f"tasks_per_node must be an int, not {tasks_per_node!r}")
        if isinstance(gpus_per_task, bool) or not isinstance(gpus_per_task, int):
            raise TypeError(f"gpus_per_task must be an int, not {gpus_per_task!r}")
        out = _run(["sinfo", "-h", "-p", partition, "-o", "%c|%m|%G"])
        cpus, mem = node_share(parse_sinfo_nodes(out, partition), tasks_per_node, gpus_per_task)
        self._exclusive = False
        self._cpus_per_task = cpus
        self._mem = mem
        self._partition = partition
        self.batch_script(self._unique_name())  # still a valid script

    # -- pickling -------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_attached"] = {}
        state["_reports"] = None
        state["_step"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_immediate": True, "_step": None, **state})
        batch_job = os.environ.get("SLURM_JOB_ID") if in_batch_job() else None
        if self._slurm_job_id is None and self.__dict__.get("_batch") and batch_job:
            # saved by apply(client_script=...) before submission; loaded by that client
            # inside the allocation: this is the job it runs in
            self._slurm_job_id = batch_job
            self._status = "running"

    # -- the batch script -------------------------------------------------------------------------
    @property
    def job_id(self) -> str | None:
        """The Slurm job id once applied."""
        return self._slurm_job_id

    def _unique_name(self) -> str:
        return f"{self._job_name}_{os.getpid()}"

    def worker_argv(self) -> list[str]:
        """The command ``srun`` runs once on every node."""
        argv = [self._python_exe, "-m", "monarch.job._host_worker", "--port", str(self._port)]
        argv += ["--host", self._bind_to] if self._bind_to else ["--slurm-node-addr"]
        if self._ca != "trust_all_connections":
            argv += ["--ca", self._ca]
        return argv

    def batch_script(self, unique_name: str, client_script: str | None = None) -> str:
        """The script ``apply()`` submits (``ValueError`` for a bad option); with
        ``client_script`` (a script path and its arguments, shell-split), the batch-mode one."""
        client = None
        if client_script is not None:
            client = (self._python_exe, *shlex.split(client_script))
        return sbatch_script(
            SbatchSpec(
                job_name=unique_name,
                nodes=sum(self._meshes.values()),
                worker_argv=tuple(self.worker_argv()),
                output=os.path.join(self._log_dir, f"slurm_%j_{unique_name}.out"),
                error=os.path.join(self._log_dir, f"slurm_%j_{unique_name}.err"),
                ntasks_per_node=self._ntasks_per_node,
                time_limit=self._time_limit,
                partition=self._partition,
                exclusive=self._exclusive,
                gpus_per_node=self._gpus_per_node,
                cpus_per_task=self._cpus_per_task,
                mem=self._mem,
                account=self._account,
                qos=self._qos,
                slurm_args=self._slurm_args,
                client_argv=client,
            )
        )

    # -- engine hooks ---------------------------------------------------------------------------
    def _create(self, client_script: str | None) -> None:
        name = self._unique_name()
        script = self.batch_script(name, client_script)
        os.makedirs(self._log_dir, exist_ok=True)
        if client_script is not None:  # the client inside the allocation loads it
            self._batch = True
            try:
                self.dump(DEFAULT_JOB_PATH)
            finally:
                self._batch = False
        env = {k: v for k, v in os.environ.items() if k != REPORT_ENV}
        self._close_reports()
        if client_script is None:  # a client elsewhere: the worker loops report to it
            try:
                self._reports = ReportListener()
            except OSError as exc:
                _log.warning("no listener for the worker loops' reports (%s): polling", exc)
            else:
                env[REPORT_ENV] = self._reports.target
        try:
            job_id = self._allocate_now(script) if client_script is None else None
            if job_id is None:
                self._slurm_job_id = parse_job_id(_run(["sbatch"], stdin=script, env=env))
            else:
                self._slurm_job_id = job_id
                self._start_step(job_id, name, env)
        except BaseException:
            self._close_reports()
            raise
        self._all_hostnames = []
        self._addresses = []
        _log.info(
            "submitted Slurm job %s (%d nodes); logs in %s",
            self._slurm_job_id,
            sum(self._meshes.values()),
            os.path.join(self._log_dir, f"slurm_{self._slurm_job_id}_{name}.out"),
        )

    def _allocate_now(self, script: str) -> str | None:
        """With ``immediate``: the job id of an allocation ``salloc`` granted at once (Slurm
        schedules a batch job only at its controller's next pass, up to a second later), else
        None (nodes busy, an option ``salloc`` refuses, no ``salloc``, ``SBATCH_*``/``SALLOC_*``
        defaults set: ``sbatch`` then queues the job, or says why not). An allocation
        ``salloc`` may have made but did not name as granted (it timed out, ``--quiet``) is
        cancelled first: none is left held until its time limit."""
        if not self._immediate:
            return None
        defaults = submission_defaults(os.environ)
        if defaults:  # salloc reads SALLOC_*, sbatch SBATCH_*: the user's would be lost
            _log.info("%s set: submitting with sbatch", ", ".join(defaults))
            return None
        # the port in the job's comment, for slurm:// URLs (a batch job's is in its script),
        # and a token naming this request (to find an allocation salloc did not name)
        token = secrets.token_hex(8)
        comment = f"{PORT_COMMENT}{self._port} {REQUEST_COMMENT}{token}"
        try:
            argv = salloc_argv(script, comment=comment)
        except ValueError as exc:  # a directive only sbatch's own reading accepts
            _log.info("salloc: %s; submitting with sbatch", exc)
            return None
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:  # no salloc
            _log.info("salloc: %s; submitting with sbatch", exc)
            return None
        except subprocess.TimeoutExpired as exc:  # granted or pending, perhaps: cancel it
            _log.info("salloc: %s; submitting with sbatch", exc)
            self._cancel_request(parse_allocation(exc.stderr), token)
            return None
        job_id = parse_granted(done.stderr) if done.returncode == 0 else None
        if job_id is None:
            _log.info("no allocation at once (%s); submitting with sbatch", done.stderr.strip())
            named = parse_allocation(done.stderr)
            if named is not None or done.returncode <= 0:  # <= 0: allocated, maybe silently
                self._cancel_request(named, token)
        else:
            _log.info("Slurm job %s: allocated at once (salloc); starting its worker step", job_id)
        return job_id

    def _cancel_request(self, job_id: str | None, token: str) -> None:
        """Cancel the allocation an unused ``salloc`` made: ``job_id`` when its output named
        it, else this user's jobs of this name whose comment holds the request's ``token``."""
        ids = [job_id] if job_id is not None else []
        if job_id is None:
            with contextlib.suppress(RuntimeError):
                listed = _run(
                    ["squeue", "-h", "-u", str(os.getuid()), "-n", self._unique_name(),
                     "-o", "%i|%k"]
                )  # fmt: skip
                ids = jobs_with_comment(listed, f"{REQUEST_COMMENT}{token}")
        for stray in ids:
            _log.warning("Slurm job %s: allocated by salloc but not used; cancelling it", stray)
            try:
                _run(["scancel", stray])
            except RuntimeError as exc:
                _log.warning("scancel %s: %s", stray, exc)

    def _start_step(self, job_id: str, name: str, env: dict[str, str]) -> None:
        """Start the worker loops of the granted allocation ``job_id``: the batch script's
        ``srun`` step, run from here in a session of its own (it outlives this client, as the
        allocation does, until ``kill()``), its output in the log files a batch job's would
        be; when the step ends (the worker loops shut down, one failed, ``kill()``) its ``sh``
        cancels the allocation, as a batch job ends with its script's ``exec srun``. The
        step's options come from the command line only (a client inside another job
        does not pass that job's ``$SLURM_*`` on). ``scancel`` when it cannot start."""
        step_env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        stem = os.path.join(self._log_dir, f"slurm_{job_id}_{name}")
        argv = step_argv(job_id, sum(self._meshes.values()), self.worker_argv())
        try:
            with open(stem + ".out", "ab") as out, open(stem + ".err", "ab") as err:
                self._step = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=step_env,
                    start_new_session=True,
                )  # fmt: skip
        except BaseException:
            with contextlib.suppress(RuntimeError):
                _run(["scancel", job_id])
            raise

    def _step_alive(self, job_id: str, waited: float) -> bool:
        """Whether this client started the job's worker step and it runs (``srun`` ends when
        the job does: cancelled, out of time, a node lost), for the first ``REPORT_GRACE``
        seconds (then ``squeue`` decides, as for a batch job); ``RuntimeError`` when it ended."""
        if self._step is None or waited > REPORT_GRACE:
            return False
        if self._step.poll() is None:
            return True
        with contextlib.suppress(RuntimeError):  # its sh cancels it too; it may not have run
            _run(["scancel", job_id])
        raise RuntimeError(
            f"the worker step of Slurm job {job_id} ended before its workers listened (srun "
            f"exited {self._step.returncode}; logs in {self._log_dir})"
        )

    def _state(self) -> JobState:
        job_id = self._require_job_id()
        listening = False
        if not self._addresses:
            reported = self._wait_reported(job_id) if self._reports is not None else None
            self._close_reports()
            if reported is not None:
                self._all_hostnames = [r.node_name for r in reported]
                self._addresses = [r.address for r in reported]
                listening = True  # each reported once it listened: no probe needed
            else:
                self._all_hostnames = self._wait_running(job_id)
                names = ",".join(self._all_hostnames)
                addrs = node_addrs(
                    _run(["scontrol", "show", "node", "-o", names]), self._all_hostnames
                )
                self._addresses = [f"udp://{a}:{self._port}" for a in addrs]
        meshes: dict[str, HostMesh] = {}
        index = 0
        try:
            for name, count in self._meshes.items():
                workers = self._addresses[index : index + count]
                index += count
                meshes[name] = self._attach(job_id, name, workers, listening)
        except BaseException:
            for mesh in meshes.values():
                with contextlib.suppress(Exception):
                    mesh.stop().get(timeout=10)
            raise
        self._attached.update(meshes)
        return JobState(meshes)

    def _close_reports(self) -> None:
        if self._reports is not None:
            self._reports.close()
            self._reports = None

    def _kill(self) -> None:
        self._close_reports()
        for mesh in self._attached.values():
            with contextlib.suppress(Exception):
                mesh.kill().get(timeout=10)
        self._attached.clear()
        job_id = self._slurm_job_id
        if job_id is None:
            return
        try:
            _run(["scancel", job_id])
        except RuntimeError as exc:
            _log.warning("scancel %s: %s", job_id, exc)
        deadline = time.monotonic() + KILL_TIMEOUT
        interval = _POLL_FIRST
        while self._still_running(job_id):  # RUNNING/COMPLETING while its processes are killed
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Slurm job {job_id} is still listed {KILL_TIMEOUT:g} s after scancel"
                )
            time.sleep(interval)
            interval = min(interval * 2, _POLL_MAX)
        step, self._step = self._step, None
        if step is not None:  # this client's srun of the worker step ends with the job
            try:
                step.wait(timeout=KILL_TIMEOUT)
            except subprocess.TimeoutExpired:
                step.kill()
                step.wait()
        _log.info("Slurm job %s cancelled; its processes are gone", job_id)
        self._slurm_job_id = None
        self._all_hostnames = []
        self._addresses = []

    def can_run(self, spec: JobTrait) -> bool:
        return (
            isinstance(spec, SlurmJob)
            and spec._meshes == self._meshes
            and spec._python_exe == self._python_exe
            and spec._port == self._port
            and spec._slurm_args == self._slurm_args
            and spec._job_name == self._job_name
            and spec._ntasks_per_node == self._ntasks_per_node
            and spec._time_limit == self._time_limit
            and spec._partition == self._partition
            and spec._gpus_per_node == self._gpus_per_node
            and spec._cpus_per_task == self._cpus_per_task
            and spec._mem == self._mem
            and spec._account == self._account
            and spec._qos == self._qos
            and spec._bind_to == self._bind_to
            and spec._ca == self._ca
            and self._job_active()
        )

    # -- helpers --------------------------------------------------------------------------------
    def _require_job_id(self) -> str:
        if self._slurm_job_id is None:
            raise RuntimeError("the Slurm job was not submitted (apply() first)")
        return self._slurm_job_id

    def _squeue(self, job_id: str) -> tuple[str, str] | None:
        try:
            return parse_squeue(_run(["squeue", "-h", "-j", job_id, "-o", "%T|%N"]))
        except RuntimeError as exc:
            if "Invalid job id" in str(exc):  # purged from the controller: long gone
                return None
            raise

    def _still_running(self, job_id: str) -> bool:
        listed = self._squeue(job_id)
        return listed is not None and (listed[0] in ACTIVE_STATES or listed[0] == "COMPLETING")

    def _job_active(self) -> bool:
        if self._slurm_job_id is None:
            return False
        listed = self._squeue(self._slurm_job_id)
        return listed is not None and listed[0] in ACTIVE_STATES

    def _wait_running(self, job_id: str) -> list[str]:
        """The allocated node names once the job runs (bounded by ``job_start_timeout``)."""
        timeout = self._job_start_timeout
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        interval = _POLL_FIRST
        while True:
            listed = self._squeue(job_id)
            if listed is None:
                raise RuntimeError(f"Slurm job {job_id} is no longer listed by squeue")
            state, nodelist = listed
            if state == "RUNNING" and nodelist:
                names = _run(["scontrol", "show", "hostnames", nodelist]).split()
                expected = sum(self._meshes.values())
                if len(names) != expected:
                    raise RuntimeError(
                        f"Slurm job {job_id} runs on {len(names)} nodes ({nodelist}), "
                        f"not the {expected} asked for"
                    )
                _log.info("Slurm job %s runs on %s", job_id, nodelist)
                return names
            if state not in ACTIVE_STATES:
                raise RuntimeError(f"Slurm job {job_id} ended before running: {state}")
            if deadline is not None and time.monotonic() > deadline:
                self._kill()
                raise RuntimeError(
                    f"Slurm job {job_id} did not start within {timeout} s (state {state}); "
                    "it was cancelled"
                )
            time.sleep(interval)  # squeue has no notification: poll with back-off
            interval = start_poll_interval(interval, time.monotonic() - started)

    def _wait_reported(self, job_id: str) -> list[WorkerReport] | None:
        """The worker loops' reports in node order, once every node's arrived (they listen
        then); None when the job runs but some never reported within ``REPORT_GRACE`` (the
        caller polls instead). Meanwhile ``squeue`` is asked, at the start-poll intervals, only
        whether the job still queues or runs (``RuntimeError`` when it ended, or did not start
        within ``job_start_timeout``: then it is cancelled)."""
        assert self._reports is not None
        expected = sum(self._meshes.values())
        reports: dict[int, WorkerReport] = {}
        started = time.monotonic()
        timeout = self._job_start_timeout
        interval = START_POLL_FAST
        next_poll = started + interval
        running_since: float | None = None
        prepare_client()  # while the worker loops start
        while len(reports) < expected:
            now = time.monotonic()
            if now >= next_poll and self._step_alive(job_id, now - started):
                # a step this client started runs only while the job does: no squeue needed
                interval = start_poll_interval(interval, now - started)
                next_poll, running_since = now + interval, running_since or started
            elif now >= next_poll:
                listed = self._squeue(job_id)
                if listed is None:
                    raise RuntimeError(f"Slurm job {job_id} is no longer listed by squeue")
                state = listed[0]
                if state not in ACTIVE_STATES:
                    raise RuntimeError(
                        f"Slurm job {job_id} ended before its workers listened: {state}"
                    )
                if state == "RUNNING":
                    running_since = now if running_since is None else running_since
                    if now - running_since > REPORT_GRACE:
                        missing = sorted(set(range(expected)) - set(reports))
                        _log.warning(
                            "Slurm job %s: no report from nodes %s %g s after it started; "
                            "polling for them",
                            job_id,
                            missing,
                            REPORT_GRACE,
                        )
                        return None
                elif timeout is not None and now - started > timeout:
                    self._kill()
                    raise RuntimeError(
                        f"Slurm job {job_id} did not start within {timeout} s (state {state}); "
                        "it was cancelled"
                    )
                interval = start_poll_interval(interval, now - started)
                next_poll = now + interval
            for report in self._reports.receive(job_id, next_poll):
                if report.node_id >= expected or report.node_id in reports:
                    _log.warning("Slurm job %s: unexpected report %s", job_id, report)
                    continue
                reports[report.node_id] = report
        _log.info(
            "Slurm job %s: every worker loop listens (%s)",
            job_id,
            ", ".join(r.address for r in reports.values()),
        )
        return [reports[i] for i in range(expected)]

    def _attach(self, job_id: str, name: str, workers: list[str], listening: bool) -> HostMesh:
        return attach_retrying(
            name,
            workers,
            ca=self._ca,
            alive=self._job_active,
            timeout=WORKER_START_TIMEOUT,
            where=f"Slurm job {job_id} (logs in {self._log_dir})",
            listening=listening,
        )


def start_poll_interval(previous: float, waited: float) -> float:
    """The seconds to wait before the next ``squeue`` while a job waits to start, after waiting
    ``previous`` seconds last time and ``waited`` in all: doubling from ``_POLL_FIRST``, capped
    at ``START_POLL_FAST`` during the first ``START_POLL_WINDOW`` seconds, then ``_POLL_MAX``."""
    if previous <= 0 or waited < 0:
        raise ValueError(f"poll intervals and waits are positive, got {previous!r}, {waited!r}")
    cap = START_POLL_FAST if waited < START_POLL_WINDOW else _POLL_MAX
    return min(previous * 2, cap)


def _run(argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run a Slurm command; its stdout, or ``RuntimeError`` with its stderr."""
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise RuntimeError(
            f"{argv[0]} is not installed (SlurmJob needs the Slurm commands)"
        ) from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{' '.join(argv)} did not answer within {COMMAND_TIMEOUT:g} s"
        ) from None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout
