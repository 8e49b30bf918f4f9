"""The engines' shared pieces without an engine: the worker loop's choice of address, and the
attach helper's check of which worker ports still refuse."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from monarch.job._attach import refused, wait_listening
from monarch.job._host_worker import host_address, main


def test_the_host_address_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MONARCH_HOST_IP", "127.0.0.7")
    assert host_address("127.0.0.9", slurm=False) == "127.0.0.9"
    assert host_address(None, slurm=False) == "127.0.0.7"
    assert host_address("localhost", slurm=False) == "127.0.0.1"  # names are resolved
    with pytest.raises(RuntimeError, match="cannot resolve"):
        host_address("no-such-host.invalid", slurm=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    with pytest.raises(RuntimeError, match="outside a Slurm step"):
        host_address(None, slurm=True)


def test_a_bad_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--port", "0"])
    assert "is not a port" in capsys.readouterr().err


#: Seconds a probe in these tests waits for a refusal.
LATE_REFUSAL = 10.0


def test_only_closed_udp_ports_are_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as open_:
        open_.bind(("127.0.0.1", 0))
        listening = f"udp://127.0.0.1:{open_.getsockname()[1]}"
        closed_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        closed_sock.bind(("127.0.0.1", 0))
        closed = f"udp://127.0.0.1:{closed_sock.getsockname()[1]}"
        closed_sock.close()
        # A refusal is an ICMP message that the kernel may deliver late on a loaded machine
        # (its softirq deferred to ksoftirqd: a 0.05 s probe missed one in CI), so the probes
        # here wait long for refusals; a closed port answers at once, so they end early.
        assert refused([closed], probe_wait=LATE_REFUSAL) == [closed]
        assert refused([listening, closed], probe_wait=2.0) == [closed]  # waits 2 s: listening
        assert wait_listening([closed], timeout=0.3, probe_wait=LATE_REFUSAL) == [closed]

        reopened = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        port = int(closed.rpartition(":")[2])
        timer = threading.Timer(0.2, lambda: reopened.bind(("127.0.0.1", port)))
        timer.start()
        try:
            assert wait_listening([closed, listening], timeout=10) == []
        finally:
            timer.join()
            reopened.close()


def test_under_slurm_without_scontrol_the_host_name_is_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n9")
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol
    monkeypatch.setenv("MONARCH_HOST_IP", "127.0.0.8")
    assert host_address(None, slurm=True) == "127.0.0.8"
    assert "cannot read this node's NodeAddr" in caplog.text


#: Modules the worker loop's process never needs before a client asks it for something: the
#: client side of every engine, the admin endpoint's HTTP server, torch.
NOT_FOR_THE_WORKER_LOOP = (
    "monarch.job._job",
    "monarch.job._process",
    "monarch.job._slurm",
    "monarch.job.kubernetes",
    "http.server",
    "torch",
)


def test_the_worker_loop_imports_only_what_it_needs_with_collection_back_on() -> None:
    probe = (
        "import gc, json, runpy, sys\n"
        "sys.argv = ['_host_worker', '--port', '0']  # refused after the imports: no loop\n"
        "try:\n"
        "    runpy.run_module('monarch.job._host_worker', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"heavy = [m for m in {NOT_FOR_THE_WORKER_LOOP!r} if m in sys.modules]\n"
        "facts = [code, heavy, gc.isenabled(), gc.get_freeze_count() > 1000]\n"
        "facade = sys.modules['monarch.actor']\n"
        "loop = 'monarch.actor._hosts.attach_daemon' in sys.modules\n"
        "deferred = loop and 'Actor' not in vars(facade)\n"
        "print(json.dumps([*facts, deferred, facade.Actor.__module__]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert "is not a port" in done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    code, heavy, collecting, frozen, deferred, actor_module = facts
    assert code == 2
    assert heavy == []
    assert collecting is True  # off only while importing
    assert frozen is True  # what the imports made is out of later collections
    # the worker loop itself, without monarch.actor's facade: that runs on first use
    assert deferred is True
    assert actor_module == "monarch.actor"


def test_an_exec_started_job_host_imports_with_collection_paused_then_frozen() -> None:
    """``python -m monarch.job._host`` (``ProcessJob``'s host where it cannot fork) does as the
    worker loop above: collection off while importing, the imports frozen, then back on."""
    probe = (
        "import gc, json, runpy, sys\n"
        "sys.argv = ['_host', '--help']  # exits after the imports\n"
        "try:\n"
        "    runpy.run_module('monarch.job._host', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print(json.dumps([code, gc.isenabled(), gc.get_freeze_count()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    code, collecting, frozen = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0, done.stderr
    assert collecting is True
    assert frozen > 10_000  # the stack's modules, classes and functions


def test_the_package_imports_its_names_on_first_use() -> None:
    probe = (
        "import json, sys\n"
        "import monarch.job\n"
        "before = 'monarch.actor' in sys.modules\n"
        "from monarch.job import SlurmJob, ProcessJob, JobState, MeshSpec, job_load\n"
        "names = sorted(n for n in monarch.job.__all__ if getattr(monarch.job, n) is None)\n"
        "try:\n"
        "    monarch.job.NoSuchName\n"
        "    missing = None\n"
        "except AttributeError as exc:\n"
        "    missing = str(exc)\n"
        "print(json.dumps([before, SlurmJob.__module__, names, missing]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before, module, unset, missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert before is False
    assert module == "monarch.job._slurm"
    assert unset == []
    assert missing == "module 'monarch.job' has no attribute 'NoSuchName'"
