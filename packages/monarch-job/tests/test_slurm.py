"""``SlurmJob`` against a real Slurm cluster started by the tests (``_slurm_cluster``: Debian's
slurm-wlm and munge, one controller and two ``slurmd`` node names, ``n1`` and ``n2``, on this
machine, torn down at the end). Skipped, with the reason, where that cluster cannot start.

One job of two hosts: a second client process reconnects to the allocation from the saved job
and runs actors on both nodes, then this process attaches, runs actors on both nodes, loses one
node (its worker loop killed: a supervision error at the client), kills the job, and checks that
Slurm lists no job and that no process of the job is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.actor
import monarch.job._slurm
from monarch.actor import SupervisionError
from monarch.job import SlurmJob, job_load
from monarch.job._report import ReportListener

sys.path.insert(0, str(Path(__file__).parent))  # the workers import cluster_actors by name
from _slurm_cluster import SlurmCluster
from cluster_actors import Where

T = 60.0


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes() + b"\0"
    except OSError:
        return b""


def _processes_with(marker: str, program: str | None = None) -> list[int]:
    """Live processes whose command line contains ``marker`` (and whose program is
    ``program``, when given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            cmdline = b" ".join(argv).decode(errors="replace")
            if program is not None and argv[0].decode(errors="replace") != program:
                continue
            if marker in cmdline and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def eventually(predicate: Callable[[], bool], timeout: float = T) -> bool:
    """Whether ``predicate`` holds within ``timeout`` seconds (checked every 0.1 s): for what
    ends shortly after the call that ends it (a process tearing down, Slurm's bookkeeping)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def _engine_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """``caplog`` sees the engine's INFO records also once the client's runtime started (its
    logging stops ``monarch``'s records from reaching the root logger)."""
    logger = logging.getLogger("monarch.job.slurm")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="monarch.job.slurm"):
            yield
    finally:
        logger.removeHandler(caplog.handler)


RECONNECT = textwrap.dedent("""
    import json, sys
    from monarch.job import job_load
    from cluster_actors import Where
    job = job_load(sys.argv[1])
    hosts = job.state(cached_path=None).hosts
    where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
    print(json.dumps(sorted(n for n, _, _ in where.where.call().get(timeout=60).values())))
""")


def test_a_two_host_job_reconnects_runs_actors_on_both_nodes_and_is_killed(
    slurm: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = _free_udp_port()
    job = SlurmJob(
        {"hosts": 2},
        monarch_port=port,
        log_dir=str(tmp_path),
        exclusive=False,
        time_limit="00:10:00",
        job_start_timeout=60,
        job_name="monarch_test",
    )
    with _engine_log(caplog):
        job.apply()
    job_id = job.job_id
    assert job_id is not None
    # free nodes: allocated while submitted (salloc), not at the controller's next pass
    assert f"Slurm job {job_id}: allocated at once (salloc)" in caplog.text
    try:
        saved = tmp_path / "job.pkl"
        job.dump(str(saved))
        assert job_load(str(saved)).can_run(job)  # the allocation lives: a later client may use it

        other = subprocess.run(
            [sys.executable, "-c", RECONNECT, str(saved)],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        logs = "\n".join(p.read_text() for p in tmp_path.glob("slurm_*"))
        assert other.returncode == 0, f"{other.stderr[-3000:]}\n{logs[-2000:]}"
        assert json.loads(other.stdout.strip().splitlines()[-1]) == ["n1", "n2"]

        with _engine_log(caplog):
            hosts = job.state(cached_path=None).hosts
        # found by its worker loops' reports (_report), not by polling for them
        assert f"Slurm job {job_id}: every worker loop listens" in caplog.text
        assert "polling for them" not in caplog.text
        assert hosts.extent.sizes == [2]
        where: Any = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        places = where.where.call().get(timeout=T).values()
        assert sorted(node for node, _, _ in places) == ["n1", "n2"]
        assert where.add.call(2, 3).get(timeout=T).values() == [5, 5]
        actor_pids = [pid for _, _, pid in places]
        matching = _processes_with(f"monarch.job._host_worker --port {port}", sys.executable)
        loops = [pid for pid in matching if _parent(pid) not in matching]  # not their zygotes
        assert len(loops) == 2, loops  # one worker loop per node (the others are srun's)
        assert all(_alive(pid) for pid in actor_pids)

        # node n2 is lost (its worker loop killed): the fault reaches the client (here its
        # unhandled-fault hook, which by default interrupts the main thread) and calls fail
        faults: list[Any] = []
        heard = threading.Event()

        def hook(failure: Any) -> None:
            faults.append(failure)
            heard.set()

        monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
        (lost,) = [pid for pid in loops if b"SLURMD_NODENAME=n2\0" in _environ(pid)]
        os.kill(lost, signal.SIGKILL)
        assert heard.wait(T), "no supervision event reached the client after a node was lost"
        assert "was lost" in faults[0].report()
        with pytest.raises(SupervisionError, match="was lost"):
            where.where.call().get(timeout=T)
    finally:
        job.kill()
    assert slurm.run("squeue", "-h", "-o", "%i %T") == ""
    assert not job.can_run(job)
    assert [pid for pid in actor_pids if _alive(pid)] == []
    assert _processes_with(f"--port {port}") == []


def test_a_job_slurm_refuses_fails_apply_with_sbatch_s_reason(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = SlurmJob({"hosts": 3}, log_dir=str(tmp_path), exclusive=False)  # the cluster has 2
    with pytest.raises(RuntimeError, match=r"sbatch failed.*submission failed"):
        job.apply()
    assert not job.active


def test_a_job_that_does_not_start_in_time_is_cancelled(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = SlurmJob(
        {"hosts": 1},
        log_dir=str(tmp_path),
        exclusive=False,
        slurm_args=["--begin=now+1hour"],  # stays PENDING
        job_start_timeout=1,
    )
    job.apply()
    job_id = job.job_id
    assert job_id is not None
    try:
        with pytest.raises(RuntimeError, match=f"Slurm job {job_id} did not start within 1 s"):
            job.state(cached_path=None)
    finally:
        job.kill()
    assert slurm.run("squeue", "-h", "-o", "%i %T") == ""


class _Unreachable(ReportListener):
    """A listener the nodes cannot reach (it names a port where nobody listens)."""

    def __init__(self) -> None:
        super().__init__(advertise="127.0.0.1")
        self.target = self.target.rpartition(":")[0] + f":{_free_tcp_port()}"


def _free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_worker_loops_that_cannot_report_are_found_by_polling(
    slurm: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(monarch.job._slurm, "ReportListener", _Unreachable)
    monkeypatch.setattr(monarch.job._slurm, "REPORT_GRACE", 0.5)
    job = SlurmJob(
        {"hosts": 1},
        monarch_port=_free_udp_port(),
        log_dir=str(tmp_path),
        exclusive=False,
        time_limit="00:10:00",
        job_start_timeout=60,
    )
    job.apply()
    try:
        with _engine_log(caplog):
            hosts = job.state(cached_path=None).hosts
        assert "polling for them" in caplog.text
        where: Any = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        assert where.add.call(1, 2).get(timeout=T).values() == [3]
    finally:
        job.kill()
    assert slurm.run("squeue", "-h", "-o", "%i %T") == ""


def test_share_node_asks_for_the_task_s_share_of_the_partition_s_nodes(
    slurm: SlurmCluster,
) -> None:
    job = SlurmJob({"hosts": 2})
    job.share_node(tasks_per_node=1, gpus_per_task=0, partition="debug")
    script = job.batch_script("j")  # the test cluster's nodes: CPUs=1 RealMemory=1000
    assert "#SBATCH --cpus-per-task=1" in script
    assert "#SBATCH --mem=1000M" in script
    assert "#SBATCH --partition=debug" in script
    assert "--exclusive" not in script
    with pytest.raises(ValueError, match="do not fit a node of 1 CPUs"):
        job.share_node(tasks_per_node=2, gpus_per_task=0, partition="debug")
    with pytest.raises(ValueError, match="no nodes in partition 'nosuchpartition'"):
        job.share_node(tasks_per_node=1, gpus_per_task=0, partition="nosuchpartition")


APPLY_AND_EXIT = textwrap.dedent("""
    import sys
    from monarch.job import SlurmJob
    job = SlurmJob({"hosts": 2}, monarch_port=int(sys.argv[2]), log_dir=sys.argv[3],
                   exclusive=False, time_limit="00:10:00", immediate=sys.argv[4] == "1")
    job.apply()
    job.dump(sys.argv[1])
""")


@pytest.mark.parametrize("immediate", [True, False], ids=["salloc", "sbatch"])
def test_the_workers_outlive_the_client_that_applied(
    slurm: SlurmCluster, tmp_path: Path, immediate: bool
) -> None:
    """The client applies and exits; another finds the same worker loops (with ``salloc``, the
    step's ``srun`` this client started lives on in a session of its own)."""
    saved, port = tmp_path / "job.pkl", _free_udp_port()
    done = subprocess.run(
        [sys.executable, "-c", APPLY_AND_EXIT, str(saved), str(port), str(tmp_path),
         "1" if immediate else "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    job = job_load(str(saved))
    try:
        hosts = job.state(cached_path=None).hosts
        where: Any = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        places = where.where.call().get(timeout=T).values()
        assert sorted(node for node, _, _ in places) == ["n1", "n2"]
    finally:
        job.kill()
    assert slurm.run("squeue", "-h", "-o", "%i %T") == ""
    # the step the exited client left (salloc) may still be tearing down just after kill()
    assert eventually(lambda: _processes_with(f"--port {port}") == []), _processes_with(
        f"--port {port}"
    )


def _no_job(slurm: SlurmCluster) -> Callable[[], bool]:
    return lambda: slurm.run("squeue", "-h", "-o", "%i %T") == ""


def test_an_allocation_ends_with_its_worker_loops_after_a_shutdown(
    slurm: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``salloc --no-shell`` allocations outlive their steps: the step's ``sh`` cancels it, as
    a batch job ends with its ``exec srun``, so a later ``state()`` submits anew."""
    port = _free_udp_port()
    job = SlurmJob(
        {"hosts": 1}, monarch_port=port, log_dir=str(tmp_path), exclusive=False,
        time_limit="00:10:00", job_start_timeout=60,
    )  # fmt: skip
    with _engine_log(caplog):
        job.apply()
    try:
        assert "allocated at once (salloc)" in caplog.text
        hosts = job.state(cached_path=None).hosts
        hosts.shutdown().get(timeout=T)  # the worker loop ends normally
        assert eventually(_no_job(slurm)), slurm.run("squeue", "-h", "-o", "%i %T")
        assert not job.can_run(job)  # a cached state() submits anew, not reconnects
        assert eventually(lambda: _processes_with(f"--port {port}") == [])
    finally:
        job.kill()


def test_an_allocation_whose_workers_fail_at_start_is_released(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = SlurmJob(
        {"hosts": 2}, python_exe="/bin/false", log_dir=str(tmp_path), exclusive=False,
        time_limit="00:10:00", job_start_timeout=60,
    )  # fmt: skip
    job.apply()
    try:
        with pytest.raises(RuntimeError, match="ended before its workers listened"):
            job.state(cached_path=None)
        assert eventually(_no_job(slurm)), slurm.run("squeue", "-h", "-o", "%i %T")
    finally:
        job.kill()


def test_an_allocation_salloc_made_silently_is_cancelled_before_sbatch(
    slurm: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--quiet``: ``salloc`` is granted but does not say so; the job is found by its request
    token and cancelled, and the batch job holds the only allocation."""
    job = SlurmJob(
        {"hosts": 1}, log_dir=str(tmp_path), exclusive=False, time_limit="00:10:00",
        slurm_args=["--quiet"],
    )  # fmt: skip
    with _engine_log(caplog):
        job.apply()
    try:
        assert "allocated by salloc but not used; cancelling it" in caplog.text
        assert eventually(lambda: slurm.run("squeue", "-h", "-o", "%i").split() == [job.job_id]), (
            slurm.run("squeue", "-h", "-o", "%i %T")
        )
    finally:
        job.kill()
    assert slurm.run("squeue", "-h", "-o", "%i %T") == ""


def test_sbatch_defaults_in_the_environment_are_honoured(
    slurm: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``salloc`` reads no ``SBATCH_*``: with one set the job is submitted with ``sbatch``."""
    monkeypatch.setenv("SBATCH_TIMELIMIT", "00:07:00")
    job = SlurmJob({"hosts": 1}, log_dir=str(tmp_path), exclusive=False)
    with _engine_log(caplog):
        job.apply()
    try:
        assert "SBATCH_TIMELIMIT set: submitting with sbatch" in caplog.text
        assert slurm.run("squeue", "-h", "-o", "%l").split() == ["7:00"]
    finally:
        job.kill()
    assert slurm.run("squeue", "-h", "-o", "%i %T") == ""
