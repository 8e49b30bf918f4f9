"""``SlurmJob``'s batch script and its reading of the Slurm commands' output, without Slurm
(the sans-IO ``_slurm_text`` and the script ``SlurmJob`` builds from its options)."""

from __future__ import annotations

import os
import pickle
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import monarch.job._slurm
from monarch.job import SlurmJob
from monarch.job._cluster_url import PORT_COMMENT, worker_port_in_comment
from monarch.job._slurm import start_poll_interval
from monarch.job._slurm_text import (
    NodeShape,
    SbatchSpec,
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


def _spec(**changes: object) -> SbatchSpec:
    fields: dict[str, object] = {
        "job_name": "j",
        "nodes": 2,
        "worker_argv": ("python", "-m", "w"),
        "output": "/l/o",
        "error": "/l/e",
    }
    fields.update(changes)
    return SbatchSpec(**fields)  # type: ignore[arg-type]


def _directives(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def test_every_option_becomes_its_directive_and_srun_runs_one_worker_per_node() -> None:
    job = SlurmJob(
        {"trainers": 2, "dataloaders": 1},
        python_exe="/opt/py/bin/python",
        slurm_args=["--constraint=a100", "--reservation=r1"],
        monarch_port=23456,
        job_name="train",
        time_limit="01:30:00",
        partition="gpu",
        log_dir="/logs",
        gpus_per_node=8,
        cpus_per_task=16,
        mem="200G",
        account="acct",
        qos="high",
    )
    script = job.batch_script("train_7")
    assert script.startswith("#!/bin/bash\n")
    assert _directives(script) == [
        "--job-name=train_7",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--output=/logs/slurm_%j_train_7.out",
        "--error=/logs/slurm_%j_train_7.err",
        "--time=01:30:00",
        "--partition=gpu",
        "--gpus-per-node=8",
        "--cpus-per-task=16",
        "--mem=200G",
        "--account=acct",
        "--qos=high",
        "--exclusive",
        "--constraint=a100",
        "--reservation=r1",
    ]
    srun = [line for line in script.splitlines() if "srun" in line]
    assert srun == [
        "exec srun --nodes=3 --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/py/bin/python -m "
        "monarch.job._host_worker --port 23456 --slurm-node-addr"
    ]


def test_defaults_add_no_optional_directive_and_bind_to_and_ca_reach_the_worker() -> None:
    job = SlurmJob({"hosts": 1}, exclusive=False, bind_to="10.0.0.5", ca="/shared/ca")
    assert [d.split("=")[0] for d in _directives(job.batch_script("x"))] == [
        "--job-name", "--nodes", "--ntasks-per-node", "--output", "--error",
    ]  # fmt: skip
    assert job.worker_argv() == [
        sys.executable, "-m", "monarch.job._host_worker", "--port", "22222",
        "--host", "10.0.0.5", "--ca", "/shared/ca",
    ]  # fmt: skip


def test_arguments_are_shell_quoted() -> None:
    script = sbatch_script(_spec(worker_argv=("/my dir/python", "-c", "print('$HOME')")))
    assert script.splitlines()[-1].endswith("'/my dir/python' -c 'print('\"'\"'$HOME'\"'\"')'")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"partition": "gpu\nrm -rf /"}, "line break"),
        ({"job_name": "a\rb"}, "line break"),
        ({"slurm_args": ("--x=1\necho hi",)}, "line break"),
        ({"slurm_args": ("constraint=a100",)}, "not an sbatch option"),
        ({"nodes": 0}, "positive"),
        ({"gpus_per_node": 0}, "positive"),
        ({"worker_argv": ()}, "empty"),
        ({"mem": ""}, "1 to"),
        ({"slurm_args": ("-x",) * 257}, "at most"),
    ],
)
def test_bad_options_are_refused_with_the_reason(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sbatch_script(_spec(**changes))


def test_a_bad_option_fails_at_construction_not_at_apply() -> None:
    with pytest.raises(ValueError, match="line break"):
        SlurmJob({"hosts": 1}, qos="a\nb")
    with pytest.raises(ValueError, match="positive number of nodes"):
        SlurmJob({"hosts": 0})
    with pytest.raises(ValueError, match="identifier"):
        SlurmJob({"my hosts": 1})
    with pytest.raises(ValueError, match="not a port"):
        SlurmJob({"hosts": 1}, monarch_port=70000)
    with pytest.raises(TypeError, match="sequence"):
        SlurmJob({"hosts": 1}, slurm_args="--exclusive")


@given(st.text(min_size=1, max_size=40))
def test_no_value_can_add_a_line_to_the_script(value: str) -> None:
    try:
        script = sbatch_script(_spec(partition=value, slurm_args=("-" + value,)))
    except ValueError:
        assert any((c.isspace() and c != " ") or ord(c) < 32 or ord(c) == 127 for c in value)
        return
    assert len(script.splitlines()) == len(sbatch_script(_spec()).splitlines()) + 2


def test_the_job_id_and_the_queue_state_are_read() -> None:
    assert parse_job_id("Submitted batch job 4711\n") == "4711"
    assert parse_job_id("4712;cluster\n") == "4712"
    with pytest.raises(ValueError, match="no job id"):
        parse_job_id("sbatch: error: Batch job submission failed")
    assert parse_squeue("RUNNING|n[1-2]\n") == ("RUNNING", "n[1-2]")
    assert parse_squeue("PENDING|\n") == ("PENDING", "")
    assert parse_squeue("") is None


def test_node_addresses_come_in_the_asked_order() -> None:
    out = (
        "NodeName=n2 Arch=x86_64 NodeAddr=10.0.0.3 NodeHostName=b OS=Linux 6.1 #1 SMP\n"
        "NodeName=n1 Arch=x86_64 NodeAddr=10.0.0.2 NodeHostName=a\n"
        "NodeName=n3 Arch=x86_64 NodeHostName=c\n"
    )
    assert node_addrs(out, ["n1", "n2", "n3"]) == ["10.0.0.2", "10.0.0.3", "n3"]
    with pytest.raises(ValueError, match="n4"):
        node_addrs(out, ["n1", "n4"])


def test_the_job_pickles_without_its_attachments_and_keeps_its_allocation() -> None:
    job = SlurmJob({"hosts": 2}, partition="p")
    job._slurm_job_id = "12"
    job._addresses = ["udp://10.0.0.2:22222", "udp://10.0.0.3:22222"]
    job._attached = {"hosts": object()}  # type: ignore[dict-item]
    copy = pickle.loads(pickle.dumps(job))
    assert copy.job_id == "12"
    assert copy._addresses == job._addresses
    assert copy._attached == {}
    assert not copy.can_run(SlurmJob({"hosts": 3}, partition="p"))  # another spec: no query


def test_batch_mode_starts_the_workers_in_the_background_and_runs_the_client() -> None:
    job = SlurmJob({"hosts": 2}, python_exe="/opt/py", log_dir="/logs", monarch_port=4000)
    script = job.batch_script("train", "train.py --lr '0.1 x'")
    lines = script.splitlines()
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert lines[srun].endswith("-m monarch.job._host_worker --port 4000 --slurm-node-addr &")
    assert lines[srun + 1 :] == [
        "workers=$!",
        "MONARCH_BATCH_JOB=1 /opt/py train.py --lr '0.1 x'",
        "status=$?",
        'kill "$workers" 2>/dev/null',
        'wait "$workers"',
        'exit "$status"',
    ]
    assert "exec srun" not in script
    with pytest.raises(ValueError, match="client command"):
        job.batch_script("train", "train.py 'x\nrm -rf /'")  # a quoted line break


def test_a_batch_job_saved_before_submission_is_the_running_job_inside_its_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = SlurmJob({"hosts": 2}, log_dir="/logs")
    job._batch = True
    saved = pickle.dumps(job)
    assert pickle.loads(saved).job_id is None  # outside the allocation: not applied
    monkeypatch.setenv("MONARCH_BATCH_JOB", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    inside = pickle.loads(saved)
    assert inside.job_id == "77"
    assert inside.active
    job._batch = False
    assert pickle.loads(pickle.dumps(job)).job_id is None  # only batch-mode saves


def test_the_start_poll_doubles_up_to_half_a_second_then_two() -> None:
    polls: list[tuple[float, float]] = []  # (seconds waited so far, the next interval)
    interval, waited = 0.1, 0.0
    while waited < 40:
        waited += interval
        interval = start_poll_interval(interval, waited)
        polls.append((waited, interval))
    assert [i for _, i in polls[:4]] == pytest.approx([0.2, 0.4, 0.5, 0.5])
    assert max(i for w, i in polls if w < 30) == 0.5  # a job that starts soon is seen soon
    assert polls[-1][1] == 2.0  # one that queues costs the controller little
    with pytest.raises(ValueError, match="positive"):
        start_poll_interval(0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        start_poll_interval(0.1, -1.0)


def test_add_mesh_adds_nodes_to_the_one_job_before_apply() -> None:
    job = SlurmJob({"trainers": 2})
    job.add_mesh("dataloaders", 3)
    assert "#SBATCH --nodes=5" in job.batch_script("j")
    job.add_mesh("trainers", 1)  # resized
    assert "#SBATCH --nodes=4" in job.batch_script("j")
    with pytest.raises(ValueError, match="identifier"):
        job.add_mesh("not a name", 1)
    with pytest.raises(ValueError, match="positive"):
        job.add_mesh("more", 0)


def test_out_of_cluster_clients_are_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match="gateway"):
        SlurmJob({"hosts": 1}, out_of_cluster=True)
    with pytest.raises(NotImplementedError, match="gateway"):
        SlurmJob({"hosts": 1}, attach_to="tcp://login:26600")


def test_sinfo_node_shapes_are_read_with_their_gpus() -> None:
    out = "96|1000000|gpu:8\n96+|2000000|gpu:h100:8(S:0-1)\n8|64000|(null)\nbad line\n"
    assert parse_sinfo_nodes(out, "p") == [
        NodeShape(96, 1000000, 8),
        NodeShape(96, 2000000, 8),
        NodeShape(8, 64000, 0),
    ]
    with pytest.raises(ValueError, match="no nodes in partition 'p'"):
        parse_sinfo_nodes("", "p")


def test_a_node_share_is_the_task_s_fraction_of_the_smallest_node() -> None:
    gpu_nodes = [NodeShape(96, 1_000_000, 8), NodeShape(128, 2_000_000, 8)]
    assert node_share(gpu_nodes, tasks_per_node=2, gpus_per_task=4) == (48, "500000M")
    assert node_share(gpu_nodes, tasks_per_node=8, gpus_per_task=1) == (12, "125000M")
    assert node_share([NodeShape(8, 64000, 0)], tasks_per_node=4, gpus_per_task=0) == (
        2,
        "16000M",
    )
    assert node_share([NodeShape(1, 1000, 0)], tasks_per_node=1, gpus_per_task=0) == (1, "1000M")
    with pytest.raises(ValueError, match="do not fit a node of 8 GPUs"):
        node_share(gpu_nodes, tasks_per_node=3, gpus_per_task=4)
    with pytest.raises(ValueError, match="do not fit a node of 8 CPUs"):
        node_share([NodeShape(8, 64000, 0)], tasks_per_node=9, gpus_per_task=0)
    with pytest.raises(ValueError, match="positive"):
        node_share(gpu_nodes, tasks_per_node=0, gpus_per_task=1)


def test_salloc_asks_for_what_the_batch_script_asks_but_its_output_files() -> None:
    script = sbatch_script(
        _spec(time_limit="01:00:00", partition="gpu", exclusive=True,
              slurm_args=("--constraint=h100", "--comment='a b'"))
    )  # fmt: skip
    argv = salloc_argv(script)
    assert argv[:3] == ["salloc", "--no-shell", "--immediate=1"]
    assert argv[3:] == [
        "--job-name=j",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=01:00:00",
        "--partition=gpu",
        "--exclusive",
        "--constraint=h100",
        "--comment=a b",
    ]  # fmt: skip  (a directive's words as sbatch reads them: shell-split)
    with pytest.raises(ValueError):  # the caller submits with sbatch then
        salloc_argv("#SBATCH --comment='unclosed\n")


def test_salloc_s_grant_and_the_step_command_are_read_and_built() -> None:
    assert parse_granted("salloc: Granted job allocation 42\n") == "42"
    assert parse_granted("salloc: error: Unable to allocate resources: busy\n") is None
    argv = step_argv("42", 3, ["py", "-m", "w"])
    assert argv[:2] == ["sh", "-c"]
    assert argv[3] == "42"  # $0: the job the step cancels at its end
    assert argv[4:] == [
        "srun", "--jobid=42", "--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        "py", "-m", "w",
    ]  # fmt: skip
    assert 'scancel "$0"' in argv[2]
    with pytest.raises(ValueError, match="not a number"):
        step_argv("42;rm", 1, ["w"])
    with pytest.raises(ValueError, match="nodes"):
        step_argv("42", 0, ["w"])
    with pytest.raises(ValueError, match="empty"):
        step_argv("42", 1, [])


def test_a_salloc_job_names_its_port_in_its_comment_for_slurm_urls() -> None:
    argv = salloc_argv(sbatch_script(_spec()), comment=f"{PORT_COMMENT}23001")
    assert argv[-1] == "--comment=monarch_port=23001"
    assert [a for a in argv if a.startswith("--comment")] == [argv[-1]]
    assert worker_port_in_comment("monarch_port=23001") == 23001
    assert worker_port_in_comment("mine, monarch_port=80") == 80
    assert worker_port_in_comment("monarch_port=1 mine monarch_port=80") == 80  # ours: last
    for other in ("", "monarch_port=", "monarch_port=99999", "monarch_port=0", "port=1"):
        assert worker_port_in_comment(other) is None
    with pytest.raises(ValueError):
        salloc_argv("", comment="two\nlines")


@pytest.mark.parametrize(
    "directives",
    [("--comment='mine, monarch_port=9'",), ("--comment 'mine, monarch_port=9'",),
     ("--comment=old", "--comment='mine, monarch_port=9'")],
)  # fmt: skip
def test_a_user_s_comment_keeps_the_port_in_the_salloc_job_s_comment(
    directives: tuple[str, ...],
) -> None:
    argv = salloc_argv(sbatch_script(_spec(slurm_args=directives)), comment="monarch_port=23001")
    comments = [a for a in argv if a.startswith("--comment")]
    assert comments == ["--comment=mine, monarch_port=9 monarch_port=23001"]
    assert argv[-1] == comments[0]  # one --comment, the last option
    assert worker_port_in_comment(comments[0].partition("=")[2]) == 23001
    assert "mine, monarch_port=9" not in argv  # a separate value word is not passed on alone


def test_any_allocation_salloc_names_is_read_also_from_partial_output() -> None:
    assert parse_allocation("salloc: Granted job allocation 42\n") == "42"
    assert parse_allocation("salloc: Pending job allocation 7\nsalloc: job 7 queued") == "7"
    assert parse_allocation(b"salloc: Job allocation 9 has been revoked.\n") == "9"
    assert parse_allocation(None) is None
    assert parse_allocation("salloc: error: Unable to allocate resources: busy\n") is None


def test_the_jobs_of_a_salloc_request_are_found_by_its_comment_token() -> None:
    listed = "12|monarch_port=1 monarch_request=ab\n13|monarch_request=abc\n14|x,monarch_request=ab"
    assert jobs_with_comment(listed, "monarch_request=ab") == ["12", "14"]
    assert jobs_with_comment("", "monarch_request=ab") == []
    assert jobs_with_comment("junk monarch_request=ab\n", "monarch_request=ab") == []


def test_sbatch_and_salloc_defaults_in_the_environment_are_named() -> None:
    environ = {"SBATCH_ACCOUNT": "lab", "SALLOC_QOS": "hi", "SBATCH_EMPTY": "", "SLURM_CONF": "x"}
    assert submission_defaults(environ) == ["SALLOC_QOS", "SBATCH_ACCOUNT"]
    assert submission_defaults({"PATH": "/bin"}) == []


def _fake_commands(directory: Path, **scripts: str) -> Path:
    """Shell scripts named after Slurm commands in ``directory`` (put first on ``PATH``); each
    appends its arguments to ``calls`` before running its body."""
    calls = directory / "calls"
    for name, body in scripts.items():
        path = directory / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        path.chmod(0o755)
    return calls


def _calls(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def test_the_worker_step_cancels_its_allocation_when_it_ends(tmp_path: Path) -> None:
    calls = _fake_commands(tmp_path, srun="exit 3", scancel="exit 0")
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(step_argv("42", 2, ["w", "--port 1"]), env=env, timeout=30, check=False)
    assert done.returncode == 3  # the step's status
    assert _calls(calls) == [
        "srun --jobid=42 --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 w --port 1",
        "scancel 42",
    ]


@pytest.mark.parametrize(
    ("salloc", "cancelled"),
    [
        ('echo "salloc: Granted job allocation 77" >&2; exec sleep 30', "scancel 77"),  # timed out
        ("exit 0", "scancel 12"),  # granted silently (--quiet): found by its request token
        ('echo "salloc: Pending job allocation 78" >&2; exit 1', "scancel 78"),
    ],
)
def test_an_allocation_salloc_made_but_did_not_grant_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, salloc: str, cancelled: str
) -> None:
    squeue = 'echo "11|monarch_request=other"; echo "12|monarch_port=22222 monarch_request=feed"'
    calls = _fake_commands(tmp_path, salloc=salloc, squeue=squeue, scancel="exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(monarch.job._slurm, "COMMAND_TIMEOUT", 1.0)
    monkeypatch.setattr(secrets, "token_hex", lambda _: "feed")
    for name in submission_defaults(os.environ):
        monkeypatch.delenv(name)
    job = SlurmJob({"hosts": 1}, log_dir=str(tmp_path))
    assert job._allocate_now(job.batch_script("j")) is None  # sbatch then
    assert [c for c in _calls(calls) if c.startswith("scancel")] == [cancelled]


def test_salloc_is_not_asked_while_sbatch_defaults_are_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_commands(tmp_path, salloc='echo "salloc: Granted job allocation 5" >&2')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    job = SlurmJob({"hosts": 1}, log_dir=str(tmp_path))
    monkeypatch.setenv("SBATCH_ACCOUNT", "lab")
    assert job._allocate_now(job.batch_script("j")) is None
    assert _calls(calls) == []
    monkeypatch.delenv("SBATCH_ACCOUNT")
    for name in submission_defaults(os.environ):
        monkeypatch.delenv(name)
    assert job._allocate_now(job.batch_script("j")) == "5"
    assert len(_calls(calls)) == 1
