"""Nodes on separate hosts (issue 5): three network namespaces joined by veth pairs, each with
its own addresses, created and removed by the test itself.

    host A (10.231.0.1)  --veth--  host B (10.231.0.2, 10.231.1.1)  --veth--  host C (10.231.1.2)
      root (UDP)                     b: child of root (UDP)                     c1: child of b
                                     b1: child of b (Unix carrier)                  (UDP)

A and C have no IP route to each other (B does not forward IP): C reaches B's address
10.231.0.2 through a static route towards B, and everything between the root and c1 is relayed
by b's datagram switch. So ``ls`` at the root listing c1, and echoes between the root and c1 in
both directions, prove gateway forwarding across hosts rather than a shared loopback.

The namespaces get unique names per run; processes are killed and namespaces deleted in
``finally``. Without the rights or tools to create namespaces (not root, no iproute2) the test
is skipped with the reason.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, eventually, run_json, start_node, stop_all

pytestmark = [pytest.mark.slow, pytest.mark.netns]

IDLE = "10"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)


def _must(*args: str) -> None:
    done = _ip(*args)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"


class Hosts:
    """Namespaces ``a``, ``b``, ``c`` (unique names) and the processes started in them."""

    def __init__(self, tmp: Path) -> None:
        tag = f"chr{os.getpid()}{secrets.token_hex(3)}"
        self.names = {host: f"{tag}-{host}" for host in "abc"}
        self.created: list[str] = []
        self.tmp = tmp
        self.env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}

    def create(self) -> None:
        """Add the namespaces (skip the test if the first cannot be made), then the links."""
        for host, name in self.names.items():
            try:
                done = _ip("netns", "add", name)
            except (OSError, subprocess.SubprocessError) as exc:
                pytest.skip(f"cannot run 'ip netns add' ({exc}): needs iproute2 and root")
            if done.returncode != 0:
                assert host == "a", f"ip netns add {name}: {done.stderr.strip()}"
                pytest.skip(f"cannot create network namespaces: {done.stderr.strip()}")
            self.created.append(name)
            _must("-n", name, "link", "set", "lo", "up")
        self._link("a", "10.231.0.1/24", "b", "10.231.0.2/24")
        self._link("b", "10.231.1.1/24", "c", "10.231.1.2/24")
        _must("-n", self.names["c"], "route", "add", "10.231.0.2/32", "via", "10.231.1.1")

    def _link(self, left: str, left_ip: str, right: str, right_ip: str) -> None:
        # Created inside ``left`` with the peer end moved into ``right`` (veth "v<here><there>"):
        # the host namespace never sees these interfaces, so nothing outside the test is touched.
        there, here = f"v{right}{left}", f"v{left}{right}"
        _must("-n", self.names[left], "link", "add", here, "type", "veth",
              "peer", "name", there, "netns", self.names[right])  # fmt: skip
        for host, dev, address in ((left, here, left_ip), (right, there, right_ip)):
            _must("-n", self.names[host], "addr", "add", address, "dev", dev)
            _must("-n", self.names[host], "link", "set", dev, "up")

    def in_host(self, host: str, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[host], *args]

    def start(self, name: str, host: str, *args: str) -> str:
        command = [*CLI, *args, "--echo", "--idle-timeout", IDLE, "--timeout", "20"]
        argv = self.in_host(host, command)
        proc, line = start_node(argv, self.env, self.tmp / f"{name}.log")
        self.procs[name] = proc
        self.tokens[name] = line
        return line

    def pid(self, name: str) -> str:
        return self.tokens[name].rsplit("=", 1)[1]

    def cli(self, host: str, *args: str) -> tuple[int, Any, str]:
        command = [*CLI, *args, "--json", "--timeout", "20"]
        return run_json(self.in_host(host, command), self.env, timeout=40)

    def members(self) -> dict[str, dict[str, Any]]:
        rc, entries, err = self.cli("a", "ls", self.tokens["root"])
        assert rc == 0, err
        return {e["pid"]: e for e in entries if e["labels"].get("command") in ("serve", "join")}

    def close(self) -> None:
        stop_all(self.procs.values())
        for name in reversed(self.created):  # deleting a namespace removes its veth ends
            _ip("netns", "delete", name)


def assert_pings_ok(results: dict[str, Any], expected: set[str]) -> None:
    assert set(results) == expected, sorted(results)
    failed = {pid: r for pid, r in results.items() if not r["ok"]}
    assert not failed, failed


def test_nodes_on_three_hosts_resolve_and_echo_through_a_gateway(tmp_path: Path) -> None:
    hosts = Hosts(tmp_path)
    try:
        hosts.create()
        unreachable = subprocess.run(
            hosts.in_host("a", ["ip", "route", "get", "10.231.1.2"]),
            capture_output=True,
            timeout=10,
            check=False,
        )
        assert unreachable.returncode != 0, "host A must have no IP route to host C"

        root = hosts.start("root", "a", "serve", "--listen", "udp://10.231.0.1:0")
        assert root.startswith("udp://10.231.0.1:")
        b = hosts.start("b", "b", "join", root, "--listen", "udp://10.231.0.2:0")
        hosts.start("b1", "b", "join", b, "--listen", "unix://*")
        c1 = hosts.start("c1", "c", "join", b, "--listen", "udp://10.231.1.2:0")
        assert c1.startswith("udp://10.231.1.2:")
        everyone = {hosts.pid(name) for name in hosts.tokens}
        assert len(everyone) == 4

        eventually(lambda: set(hosts.members()) == everyone, 30, "all 4 processes at the root")
        members = hosts.members()
        assert members[hosts.pid("c1")]["labels"]["command"] == "join"
        assert members[hosts.pid("root")]["labels"]["role"] == "root"

        rc, from_root, err = hosts.cli("a", "ping", root)
        assert rc == 0, err
        assert_pings_ok(from_root, everyone)  # root -> c1 crosses b's switch
        rc, from_c, err = hosts.cli("c", "ping", c1)
        assert rc == 0, err
        assert_pings_ok(from_c, everyone)  # c1 -> root, the other way round
        rc, record, err = hosts.cli("b", "resolve", b, hosts.pid("c1"))
        assert rc == 0, err
        assert record["pid"] == hosts.pid("c1")
    finally:
        hosts.close()
