"""A Monarch program that names its worker loop ``tcp://127.0.0.1:PORT`` (as programs written
for Meta's Monarch do) runs unchanged: ``tcp://HOST:PORT`` is the same host and port over our
UDP carrier, for ``run_worker_loop_forever`` and ``attach_to_workers`` alike."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
T = 60.0

WORKER = textwrap.dedent(
    """
    import logging, sys
    from monarch.actor import run_worker_loop_forever

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_worker_loop_forever(address=sys.argv[1], ca="trust_all_connections")
    """
)

CLIENT = textwrap.dedent(
    """
    import json, os, sys, time
    from monarch.actor import attach_to_workers, shutdown_context
    from procs_actors import Where

    if __name__ == "__main__":
        hosts = attach_to_workers(workers=[sys.argv[1]], ca="trust_all_connections")
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        where = procs.spawn("where", Where)
        sums = where.add.call(2, 3).get(timeout=60).values()
        pids = [pid for pid, _ in where.place.call().get(timeout=60).values()]
        hosts.shutdown().get(timeout=60)
        started = time.monotonic()
        try:
            attach_to_workers(workers=[sys.argv[2]], ca="trust_all_connections")
            wrong = "attached?"
        except RuntimeError as exc:
            wrong = str(exc)
        took = time.monotonic() - started
        shutdown_context().get(timeout=60)
        print(json.dumps({"sums": sums, "pids": pids, "wrong": wrong, "took": took}), flush=True)
    """
)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_program_using_tcp_addresses_runs_unchanged(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca"),
        PYTHONPATH=os.pathsep.join([str(HERE), *(p for p in sys.path if p)]),
    )
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "client.py").write_text(CLIENT)
    port, unused = _free_udp_port(), _free_udp_port()
    address = f"tcp://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [sys.executable, str(tmp_path / "worker.py"), address],
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert worker.stderr is not None
        seen = b""
        deadline = time.monotonic() + T
        while b"listening on" not in seen:  # the worker loop's own log line: it listens
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([worker.stderr], [], [], max(remaining, 0))
            assert ready, f"the worker loop did not listen: {seen.decode()[-2000:]}"
            chunk = os.read(worker.stderr.fileno(), 4096)
            assert chunk, f"the worker loop exited: {seen.decode()[-2000:]}"
            seen += chunk
        assert f"udp://127.0.0.1:{port}".encode() in seen  # tcp:// became the same UDP port
        done = subprocess.run(
            [sys.executable, str(tmp_path / "client.py"), address, f"tcp://127.0.0.1:{unused}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=2 * T,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["sums"] == [5, 5]
        assert len(set(result["pids"])) == 2
        assert f"udp://127.0.0.1:{unused}" in result["wrong"]  # the address, in the message
        assert result["took"] < 40.0  # bounded (ATTACH_TIMEOUT)
        assert worker.wait(timeout=T) == 0  # HostMesh.shutdown() ended the worker loop
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=T)
        if worker.stderr is not None:
            worker.stderr.close()
