"""A real tree of 7 ``chrysalis`` processes (issue 5): root on UDP, child A on UDP, child B on
Unix, two grandchildren under each (one per carrier). Every process answers echo pings routed
through every other process; ``kill -9`` of A fences its subtree out of the root's namespace
while B's subtree still answers; restarting A (same identity, same address) lets its children
reconnect on their own and the tree heals.

The echo checks run ``chrysalis ping TOKEN`` once per process: a short-lived client joins under
that process and dials every echo node, so every process resolves and forwards towards every
other (the dials leave from the client, one hop below the process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, eventually, run_json, start_node, stop_all

pytestmark = pytest.mark.slow

IDLE = "3"  # QUIC idle timeout of every node: a killed process is fenced about 3 s later


class Tree:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}

    def start(self, name: str, *args: str) -> str:
        argv = [*CLI, *args, "--echo", "--idle-timeout", IDLE, "--timeout", "20"]
        proc, line = start_node(argv, self.env, self.tmp / f"{name}.log")
        self.procs[name] = proc
        self.tokens[name] = line
        return line

    def pid(self, name: str) -> str:
        return self.tokens[name].rsplit("=", 1)[1]

    def cli(self, *args: str) -> tuple[int, Any, str]:
        return run_json([*CLI, *args, "--json", "--timeout", "15"], self.env, timeout=30)

    def members(self) -> set[str]:
        rc, entries, err = self.cli("ls", self.tokens["root"])
        assert rc == 0, err
        return {e["pid"] for e in entries if e["labels"].get("command") in ("serve", "join")}

    def pings(self, names: list[str]) -> dict[str, dict[str, Any]]:
        running = {
            name: subprocess.Popen(
                [*CLI, "ping", self.tokens[name], "--json", "--timeout", "20"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
            )
            for name in names
        }
        results = {}
        for name, proc in running.items():
            out, err = proc.communicate(timeout=40)
            assert out, f"ping via {name} printed nothing: {err.decode()[-500:]}"
            results[name] = json.loads(out)
        return results

    def kill_all(self) -> None:
        stop_all(self.procs.values())


def assert_all_ok(results: dict[str, dict[str, Any]], expected: set[str]) -> None:
    for via, targets in results.items():
        assert set(targets) == expected, f"via {via}: targets {sorted(targets)}"
        failed = {pid: r for pid, r in targets.items() if not r["ok"]}
        assert not failed, f"via {via}: {failed}"


def test_seven_process_tree_resolves_echoes_fences_and_heals(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    try:
        rc, issued, err = tree.cli("identity", "issue", "--out", str(tmp_path / "a-id"))
        assert rc == 0, err
        root = tree.start("root", "serve", "--listen", "udp://127.0.0.1:0")
        a = tree.start(
            "a", "join", root, "--listen", "udp://127.0.0.1:0",
            "--identity-dir", str(tmp_path / "a-id"),
        )  # fmt: skip
        assert tree.pid("a") == issued["pid"]
        b = tree.start("b", "join", root, "--listen", f"unix://{tmp_path}/b.sock")
        tree.start("a1", "join", a, "--listen", "udp://127.0.0.1:0")
        tree.start("a2", "join", a, "--listen", "unix://*")
        tree.start("b1", "join", b, "--listen", "unix://*")
        tree.start("b2", "join", b, "--listen", "udp://127.0.0.1:0")
        everyone = {tree.pid(name) for name in tree.tokens}
        assert len(everyone) == 7
        eventually(lambda: tree.members() == everyone, 30, "all 7 processes in the namespace")

        assert_all_ok(tree.pings(list(tree.tokens)), everyone)

        tree.procs["a"].send_signal(signal.SIGKILL)
        tree.procs["a"].wait(timeout=10)
        survivors = {tree.pid(name) for name in ("root", "b", "b1", "b2")}
        eventually(lambda: tree.members() == survivors, 20, "A's subtree fenced and removed")
        assert_all_ok(tree.pings(["root", "b1", "b2"]), survivors)

        address = a.split("?", 1)[0]
        restarted = tree.start(
            "a", "join", root, "--listen", address, "--identity-dir", str(tmp_path / "a-id")
        )
        assert restarted == a
        eventually(lambda: tree.members() == everyone, 30, "A's children rejoined")
        assert_all_ok(tree.pings(["a1", "b2"]), everyone)
    finally:
        tree.kill_all()
