"""One Monarch program on two hosts (issue 7): a worker loop in its own network namespace,
attached over UDP by a client in another one.

    client host (10.232.0.1)  --veth--  worker host (10.232.0.2)
      client script: attach_to_workers      run_worker_loop_forever (python -m
      spawn_procs, calls, broadcast, stop    monarch.actor._attach) and its worker processes

Both namespaces are created (with unique names) and deleted by the test; the host namespace
never sees the veth pair. The two hosts share nothing but the veth link and the cluster CA
directory (``CHRYSALIS_DEV_CA_DIR``), so the worker processes reaching the client, the calls,
and the network-namespace inode each worker reports prove the program spans the two hosts.
Without the rights or tools to create namespaces the test is skipped with the reason. The
namespace helpers are the node layer's (``packages/chrysalis-node/tests/test_netns.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.netns]

ROOT = Path(__file__).resolve().parent.parent
ACTORS = ROOT / "packages" / "monarch-actor" / "tests"
T = 60


def _node_netns_helpers() -> ModuleType:
    path = ROOT / "packages" / "chrysalis-node" / "tests" / "test_netns.py"
    spec = importlib.util.spec_from_file_location("_chrysalis_node_netns_helpers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _node_netns_helpers()

CLIENT = textwrap.dedent(
    """
    import json, os, sys

    from monarch.actor import attach_to_workers, shutdown_context
    from procs_actors import Counter, Where

    if __name__ == "__main__":
        hosts = attach_to_workers(workers=[sys.argv[1]])
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        where = procs.spawn("where", Where)
        places = where.place.call().get(timeout=30).values()
        counters = procs.spawn("counters", Counter, 10)
        counters.incr.broadcast(5)
        values = counters.get.call().get(timeout=30).values()
        one = counters.slice(gpus=1).get.call_one().get(timeout=30)
        procs.stop().get(timeout=30)
        hosts.shutdown().get(timeout=30)
        shutdown_context().get(timeout=30)
        print(json.dumps({
            "places": places, "values": values, "one": one,
            "client_netns": os.stat("/proc/self/ns/net").st_ino,
        }), flush=True)
    """
)


class TwoHosts:
    """Namespaces ``client`` and ``worker`` joined by one veth pair."""

    def __init__(self, tmp: Path) -> None:
        tag = f"mon{os.getpid()}{secrets.token_hex(3)}"
        self.names = {"client": f"{tag}-c", "worker": f"{tag}-w"}
        self.created: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(
            os.environ,
            CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"),
            PYTHONPATH=os.pathsep.join([str(ACTORS), *(p for p in sys.path if p)]),
            MONARCH_MESH_ORPHAN_TIMEOUT="3.0",
        )

    def create(self) -> None:
        for host, name in self.names.items():
            try:
                done = helpers._ip("netns", "add", name)
            except (OSError, subprocess.SubprocessError) as exc:
                pytest.skip(f"cannot run 'ip netns add' ({exc}): needs iproute2 and root")
            if done.returncode != 0:
                assert host == "client", f"ip netns add {name}: {done.stderr.strip()}"
                pytest.skip(f"cannot create network namespaces: {done.stderr.strip()}")
            self.created.append(name)
            helpers._must("-n", name, "link", "set", "lo", "up")
        client, worker = self.names["client"], self.names["worker"]
        helpers._must("-n", client, "link", "add", "vcw", "type", "veth",
                      "peer", "name", "vwc", "netns", worker)  # fmt: skip
        for name, dev, address in (
            (client, "vcw", "10.232.0.1/24"),
            (worker, "vwc", "10.232.0.2/24"),
        ):
            helpers._must("-n", name, "addr", "add", address, "dev", dev)
            helpers._must("-n", name, "link", "set", dev, "up")

    def run_in(self, host: str, args: list[str], stderr: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.names[host], *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=self.env,
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for name in reversed(self.created):  # deleting a namespace removes its veth end
            helpers._ip("netns", "delete", name)


@pytest.mark.parametrize("mode", ["lanes", "force-quic"])
def test_a_client_attaches_a_worker_host_in_another_namespace(tmp_path: Path, mode: str) -> None:
    """Over direct lanes (TLS over TCP across the hosts) and with ``force_quic``, which the
    client's hello passes on to the worker host's processes."""
    hosts = TwoHosts(tmp_path)
    if mode == "force-quic":
        hosts.env["MONARCH_FORCE_QUIC"] = "1"
    try:
        hosts.create()
        worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (owned by the process)
        daemon = hosts.run_in(
            "worker",
            [sys.executable, "-m", "monarch.actor._attach", "--address", "udp://10.232.0.2:0"],
            stderr=worker_log,
        )
        worker_log.close()
        assert daemon.stdout is not None
        ready, _, _ = select.select([daemon.stdout], [], [], 30)
        address = daemon.stdout.readline().decode().strip() if ready else ""
        assert address.startswith("udp://10.232.0.2:"), (tmp_path / "worker.log").read_text()

        script = tmp_path / "client.py"
        script.write_text(CLIENT)
        client = hosts.run_in(
            "client",
            [sys.executable, str(script), address],
            stderr=subprocess.PIPE,
        )
        out, err = client.communicate(timeout=T)
        assert client.returncode == 0, err.decode()[-3000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["values"] == [15, 16]
        assert result["one"] == 16
        pids = {pid for pid, _ in result["places"]}
        namespaces = {netns for _, netns in result["places"]}
        assert len(pids) == 2
        assert len(namespaces) == 1
        assert result["client_netns"] not in namespaces
        assert daemon.wait(timeout=T) == 0  # HostMesh.shutdown() ended the worker loop
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in pids):  # same PID namespace
            assert time.monotonic() < deadline, "worker processes outlived their host"
            time.sleep(0.1)
    finally:
        hosts.close()
