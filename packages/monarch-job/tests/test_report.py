"""Worker loops reporting to the client that submitted their job (``_report`` and the report
format of ``_slurm_text``), without Slurm: the line's round trip, what a client drops, the
listener and the sender over loopback, and a real worker loop (``_host_worker`` under a faked
Slurm step environment) that reports the address it listens on once it listens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.job._attach import refused
from monarch.job._report import ReportListener, local_address, send_report
from monarch.job._slurm_text import (
    MAX_REPORT_BYTES,
    REPORT_ENV,
    WorkerReport,
    parse_report,
    parse_report_target,
    report_line,
)

TOKEN = "0123456789abcdef0123456789abcdef"
T = 60.0

_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
_addresses = st.builds(
    lambda ip, port: f"udp://{ip}:{port}",
    st.ip_addresses(v=4).map(str),
    st.integers(1, 65535),
)


@given(
    node_id=st.integers(0, 99999),
    name=_names,
    address=_addresses,
    job=st.integers(1, 10**9).map(str),
)
def test_a_report_reads_back_as_written(node_id: int, name: str, address: str, job: str) -> None:
    report = WorkerReport(node_id, name, address)
    line = report_line(TOKEN, job, report)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert parse_report(line, TOKEN, job) == report


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a worker report"),
        (b"GET / HTTP/1.1\r\n", "not a worker report"),
        (b"\xff" * 10, "ASCII"),
        (b"x" * (MAX_REPORT_BYTES + 1), "at most"),
        (f"monarch-job-report/1 {'f' * 32} 7 0 n1 udp://127.0.0.2:1\n".encode(), "another token"),
        (f"monarch-job-report/1 {TOKEN} 8 0 n1 udp://127.0.0.2:1\n".encode(), "of job 8"),
        (f"monarch-job-report/1 {TOKEN} 7 -1 n1 udp://127.0.0.2:1\n".encode(), "not a number"),
        (f"monarch-job-report/1 {TOKEN} 7 0 n;1 udp://127.0.0.2:1\n".encode(), "host name"),
        (f"monarch-job-report/1 {TOKEN} 7 0 n1 tcp://127.0.0.2:1\n".encode(), "udp://"),
    ],
)
def test_a_client_drops_what_is_not_its_job_s_report(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_report(data, TOKEN, "7")


def test_the_report_target_is_token_at_host_port() -> None:
    assert parse_report_target(f"{TOKEN}@10.0.0.5:4242") == (TOKEN, "10.0.0.5", 4242)
    assert parse_report_target(f"{TOKEN}@[fe80::1]:1") == (TOKEN, "fe80::1", 1)
    for bad in ["", "10.0.0.5:4242", "nothex@1.2.3.4:5", f"{TOKEN}@1.2.3.4", f"{TOKEN}@h:0"]:
        with pytest.raises(ValueError, match="MONARCH_JOB_REPORT"):
            parse_report_target(bad)


def test_the_listener_gets_its_job_s_reports_and_drops_the_others() -> None:
    listener = ReportListener(advertise="127.0.0.1")
    try:
        token, host, port = parse_report_target(listener.target)
        assert token == listener.token
        assert host == "127.0.0.1"
        deadline = time.monotonic() + 0.2
        assert listener.receive("7", deadline) == []  # nothing sent: returns at the deadline
        assert time.monotonic() >= deadline

        with socket.create_connection((host, port), timeout=T) as stranger:
            stranger.sendall(b"hello\n")
        other_job = report_line(token, "8", WorkerReport(0, "n1", "udp://127.0.0.2:1"))
        with socket.create_connection((host, port), timeout=T) as stale:
            stale.sendall(other_job)
        mine = WorkerReport(1, "n2", "udp://127.0.0.3:22222")
        sender = threading.Thread(target=send_report, args=(listener.target, "7", mine))
        sender.start()
        got: list[WorkerReport] = []
        deadline = time.monotonic() + T
        while not got and time.monotonic() < deadline:
            got += listener.receive("7", deadline)
        sender.join(T)
        assert got == [mine]
    finally:
        listener.close()
    assert not send_report(listener.target, "7", mine)  # closed: the worker logs and goes on


def test_the_advertised_address_is_not_a_wildcard() -> None:
    address = local_address()
    socket.inet_aton(address)
    assert address != "0.0.0.0"


def test_a_worker_loop_reports_once_it_listens(tmp_path: Path) -> None:
    """``_host_worker`` as a Slurm step starts it (``SLURM_JOB_ID``, ``SLURM_NODEID``,
    ``SLURMD_NODENAME``, ``$MONARCH_JOB_REPORT``): the client's listener gets node 3's report,
    and the reported address listens when it arrives."""
    listener = ReportListener(advertise="127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ)
    env.update(
        {
            REPORT_ENV: listener.target,
            "SLURM_JOB_ID": "41",
            "SLURM_NODEID": "3",
            "SLURMD_NODENAME": "n4",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
    )
    argv = [sys.executable, "-m", "monarch.job._host_worker", "--port", str(port)]
    worker = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--log-level", "WARNING"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        got: list[WorkerReport] = []
        deadline = time.monotonic() + T
        while not got and time.monotonic() < deadline and worker.poll() is None:
            got += listener.receive("41", min(deadline, time.monotonic() + 0.5))
        assert got == [WorkerReport(3, "n4", f"udp://127.0.0.1:{port}")], worker.poll()
        assert refused([got[0].address]) == []  # it listened before it said so
    finally:
        listener.close()
        worker.kill()
        _, err = worker.communicate(timeout=T)
    assert b"Traceback" not in err, err.decode(errors="replace")
