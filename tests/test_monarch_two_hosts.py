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
RDMA_ACTORS = ROOT / "packages" / "monarch-rdma" / "tests"
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


RDMA_CLIENT = textwrap.dedent(
    """
    import json, os, sys, warnings

    from monarch.actor import attach_to_workers, shutdown_context
    from monarch.rdma import RDMAAction, RDMABuffer
    from monarch.rdma.providers import shared_memory
    from procs_actors import Where
    from rdma_actors import Holder, Peer

    warnings.simplefilter("ignore")  # RDMATcpFallbackWarning: no ibverbs here

    def pattern(size, seed):
        return bytes((i * 7 + seed) % 251 for i in range(size))

    if __name__ == "__main__":
        hosts = attach_to_workers(workers=[sys.argv[1]])
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        peer = procs.spawn("peer", Peer)
        holder = procs.spawn("holder", Holder)
        size = 3 << 20  # several chunks in flight across the veth link
        # The client's buffer over shareable memory: the shm provider would serve it on one
        # host, across hosts the worker must be served by net.
        mine = shared_memory(size)
        mine[:] = pattern(size, 1)
        buffer = RDMABuffer(mine)
        read_ok = peer.read.call_one(buffer, size).get(timeout=60) == pattern(size, 1)
        peer.write.call_one(buffer, b"written from the worker host").get(timeout=60)
        served = peer.transport.call_one(buffer).get(timeout=60)
        # The worker's buffer, read and written by the client through an action.
        theirs = holder.create_shared.call_one(pattern(size, 2), "memfd").get(timeout=60)
        got = memoryview(bytearray(size))
        RDMAAction().read_remote(got, theirs).submit(timeout=60).get(timeout=60)
        theirs.write_from(memoryview(b"written from the client host")).get(timeout=60)
        content = holder.content.call_one().get(timeout=60)
        buffer.drop().get(timeout=60)
        after_drop = peer.read_error.call_one(buffer).get(timeout=60)
        places = procs.spawn("where", Where).place.call().get(timeout=60).values()
        procs.stop().get(timeout=60)
        hosts.shutdown().get(timeout=60)
        shutdown_context().get(timeout=60)
        print(json.dumps({
            "read_ok": read_ok,
            "written": bytes(mine[:28]).decode(),
            "served": list(served),
            "client_transport": theirs.transport,
            "action_ok": bytes(got) == pattern(size, 2),
            "worker_content": content[:28].decode(),
            "after_drop": after_drop,
            "places": places,
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
            PYTHONPATH=os.pathsep.join(
                [str(ACTORS), str(RDMA_ACTORS), *(p for p in sys.path if p)]
            ),
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

    def start_worker_loop(self, log: Path) -> tuple[subprocess.Popen[bytes], str]:
        """``run_worker_loop_forever`` on the worker host (its stderr in ``log``): the process
        and the address it printed first."""
        with open(log, "wb") as sink:
            daemon = self.run_in(
                "worker",
                [sys.executable, "-m", "monarch.actor._attach", "--address", "udp://10.232.0.2:0"],
                stderr=sink,
            )
        assert daemon.stdout is not None
        ready, _, _ = select.select([daemon.stdout], [], [], 30)
        address = daemon.stdout.readline().decode().strip() if ready else ""
        assert address.startswith("udp://10.232.0.2:"), log.read_text()
        return daemon, address

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
        daemon, address = hosts.start_worker_loop(tmp_path / "worker.log")

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


def test_rdma_buffers_move_between_hosts_over_the_net_provider(tmp_path: Path) -> None:
    """Issue 17's two-host test: ``RDMABuffer`` transfers between a client and a worker in
    different network namespaces, both directions, one of them through an ``RDMAAction``. The
    buffers lie in shareable memory, yet ``shm`` cannot reach across namespaces: ``net`` serves
    them, chunked over the veth link; a dropped buffer then fails on the other host."""
    hosts = TwoHosts(tmp_path)
    try:
        hosts.create()
        daemon, address = hosts.start_worker_loop(tmp_path / "worker.log")
        script = tmp_path / "rdma_client.py"
        script.write_text(RDMA_CLIENT)
        client = hosts.run_in("client", [sys.executable, str(script), address], subprocess.PIPE)
        out, err = client.communicate(timeout=T)
        assert client.returncode == 0, err.decode()[-3000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["read_ok"] is True
        assert result["written"] == "written from the worker host"
        assert result["served"] == ["net", "tcp"]
        assert result["client_transport"] == "net"
        assert result["action_ok"] is True
        assert result["worker_content"] == "written from the client host"
        assert "dropped" in result["after_drop"], result["after_drop"]
        assert result["client_netns"] not in {netns for _, netns in result["places"]}
        assert daemon.wait(timeout=T) == 0
    finally:
        hosts.close()
