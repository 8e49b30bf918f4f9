"""Persistent scale experiments end to end (issue 22): ``chrysalis scale --persist`` launches
a 5-process tree on loopback (task-head: root + 2 Unix leaves, a UDP head + 1 Unix leaf),
every process with its own replicated experiment database. An echo experiment is submitted
from a leaf that is not the root and inspected from a third process. The tree restarts a
worker that dies, once (``--restart 1``): a source killed with SIGKILL while it runs its claim
comes back with the same PID and resumes the claim, which finishes with results; killed a
second time, it is given up on and its work is reported failed, not lost.

About 30 s on two busy cores: one tree, a dozen short ``chrysalis admin`` clients."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chrysalis.node import DEFAULT_REJOIN_TIMEOUT

pytest.importorskip("chrysalis.sqlite")

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, eventually, read_ready, run_json, start_node, stop_all

pytestmark = pytest.mark.slow


def claim_state(database: Path, experiment: str) -> str | None:
    """The state of ``experiment``'s claim in one process's replica file (read-only; ``None``
    while there is no claim or the file is busy)."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1.0)
        ) as conn:
            row = conn.execute(
                "SELECT state FROM scale_claim WHERE experiment = ?", (experiment,)
            ).fetchone()
    except sqlite3.OperationalError:
        return None
    return None if row is None else str(row[0])


def restarted_as(log: Path, rank: int, nth: int) -> int | None:
    """The OS process ID of ``rank``'s ``nth`` restart, from the launcher's log line."""
    pattern = rf"\[root\] rank {rank} \(\w+\) restarted as process (\d+) in \S+ s \(restart {nth} "
    found = re.search(pattern, log.read_text(errors="replace"))
    return None if found is None else int(found.group(1))


class Tree:
    """A running ``chrysalis scale --persist`` tree: its ``READY`` record, its launcher's log
    and the environment of its clients (the tree's CA)."""

    def __init__(self, ready: dict[str, Any], log: Path) -> None:
        self.ready = ready
        self.log = log
        self.env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=ready["ca_dir"])

    def json(self, *argv: str) -> Any:
        """``chrysalis ARGV --json`` (bounded); its decoded output (it must succeed)."""
        command = [*CLI, *argv, "--json", "--timeout", "30"]
        code, record, stderr = run_json(command, self.env, timeout=45)
        assert code == 0, stderr
        return record

    def admin(self, rank: str, *args: str) -> Any:
        """``chrysalis admin`` at rank ``rank``'s token."""
        return self.json("admin", self.ready["tokens"][rank], *args)

    def echo(self, rank: str, name: str, source: str, destination: str) -> None:
        """Submit (at ``rank``) and wait for a 3-echo experiment without baselines from the
        ``source`` selector to ``destination``, which must end ``done`` with every echo."""
        done = self.admin(
            rank, "submit", name, "--sources", source, "--destinations", destination,
            "--count", "3", "--payload", "64", "--no-baselines", "--wait",
        )  # fmt: skip
        assert done["status"] == "done", done
        (result,) = self.admin(rank, "show", name)["results"]
        assert (result["status"], result["completed"], result["error"]) == ("ok", 3, "")


@contextlib.contextmanager
def persistent_tree(tmp_path: Path, idle_timeout: float) -> Iterator[Tree]:
    """5 processes with ``--persist --restart 1`` (task-head: root + 2 Unix leaves, a UDP head
    + 1 Unix leaf); stopped, and checked to exit cleanly, after the block."""
    log = tmp_path / "scale.log"
    argv = [*CLI, "scale", "--nodes", "5", "--nodes-per-task", "3", "--persist"]
    argv += ["--workdir", str(tmp_path / "w"), "--idle-timeout", f"{idle_timeout:g}"]
    argv += ["--join-timeout-secs", "80", "--restart", "1", "--restart-backoff", "0.2"]
    with log.open("wb") as err:
        scale = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
    try:
        yield Tree(read_ready(scale, log), log)
    finally:
        # the root's own stop is bounded at three 5 s graces (lifeline, SIGTERM, SIGKILL of
        # its workers); 10 s here cut a root short in a loaded CI run, its workers still ending
        stop_all([scale], grace=30)
    assert scale.returncode == 0, log.read_text()[-2000:]


def test_an_experiment_submitted_at_a_leaf_is_run_and_inspected_elsewhere(tmp_path: Path) -> None:
    work = tmp_path / "w"
    with persistent_tree(tmp_path, idle_timeout=5) as tree:
        ready, log, admin = tree.ready, tree.log, tree.admin
        nodes = admin("2", "nodes")
        by_rank = {n["rank"]: n for n in nodes}
        assert sorted(by_rank) == [0, 1, 2, 3, 4]
        assert {n["state"] for n in nodes} == {"live"}
        assert by_rank[4]["parent"] == by_rank[3]["pid"]  # lineage: leaf 4 under head 3
        assert (by_rank[3]["carrier"], by_rank[4]["carrier"]) == ("udp", "unixgram")
        pid = {rank: n["pid"] for rank, n in by_rank.items()}

        # submitted at leaf 2 (not the root), run by leaf 1 and leaf 4 against everyone
        submitted = admin(
            "2", "submit", "e1", "--sources", "rank:1,rank:4", "--destinations", "all",
            "--count", "3", "--payload", "64", "--wait",
        )  # fmt: skip
        assert submitted["status"] == "done"
        assert submitted["submitted_by"] not in pid.values()  # the admin client itself

        report = admin("3", "show", "e1")  # inspected from the head of the other task
        assert report["status"] == "done"
        pairs = {(r["source"], r["destination"]): r for r in report["results"]}
        assert set(pairs) == {(s, d) for s in (pid[1], pid[4]) for d in pid.values() if d != s}
        for result in pairs.values():
            assert (result["status"], result["completed"], result["error"]) == ("ok", 3, "")
            assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
            # the direct baselines of the same run, each pair's own (values sane, no timings)
            baselines = result["baselines"]
            assert sorted(baselines) == ["chrysalis-pooled", "quic", "tcp", "udp", "unix"], result
            for method, figures in baselines.items():
                assert (method, figures["completed"], figures["error"]) == (method, 3, "")
                assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
                assert result["ratios"][method]["p50"] > 0
        assert set(report["summary"]["baseline_ratios"]) == {
            "chrysalis-pooled",
            "quic",
            "tcp",
            "udp",
            "unix",
        }
        assert report["summary"]["completed"] == report["summary"]["planned"] == 24
        assert [e["name"] for e in admin("0", "experiments")] == ["e1"]

        # a stream transfer from the leaf under the other task's head to leaf 1, across heads
        admin(
            "4", "submit", "t1", "--kind", "stream-transfer", "--sources", "rank:4",
            "--destinations", "rank:1", "--payload", str(1 << 20), "--count", "2", "--wait",
        )  # fmt: skip
        (transfer,) = admin("2", "show", "t1")["results"]
        assert (transfer["status"], transfer["completed"], transfer["error"]) == ("ok", 2, "")
        assert transfer["mib_per_second"] > 0
        assert sorted(transfer["baselines"]) == ["quic", "tcp", "udp", "unix"]
        assert transfer["baselines"]["udp"]["error"].startswith("not applicable")
        for method in ("quic", "tcp", "unix"):
            assert transfer["baselines"][method]["completed"] == 2, transfer["baselines"]
            assert transfer["ratios"][method]["throughput"] > 0

        # cancelled from the root while leaf 1 runs it: its claim ends, no results stay open
        admin(
            "2", "submit", "slow", "--sources", "rank:1", "--destinations", "rank:2",
            "--count", "100000", "--warmup", "0", "--run-timeout", "120",
        )  # fmt: skip
        assert admin("0", "cancel", "slow")["status"] == "cancelled"

        def cancelled() -> bool:
            report = admin("4", "show", "slow")
            return bool(report["status"] == report["claims"][0]["state"] == "cancelled")

        eventually(cancelled, 20, "the cancel to reach every process")

        # a source killed with -9 while it runs its claim is restarted with its identity and
        # resumes the claim (attempt 2, by incarnation 2), which finishes with results
        admin(
            "2", "submit", "again", "--sources", "rank:4", "--destinations", "rank:1",
            "--count", "1000", "--warmup", "0", "--run-timeout", "120", "--no-baselines",
        )  # fmt: skip
        source_db = work / "db" / "node-4.db"
        eventually(
            lambda: claim_state(source_db, "again") in ("running", "done"), 20, "the claim to run"
        )
        assert claim_state(source_db, "again") == "running", "finished before the kill"
        os.kill(ready["processes"]["4"], signal.SIGKILL)  # forked: no command line of its own
        eventually(lambda: restarted_as(log, 4, 1) is not None, 30, "rank 4 to be restarted")
        process = restarted_as(log, 4, 1)
        assert process is not None
        assert process != ready["processes"]["4"]

        def finished() -> bool:
            return bool(admin("3", "show", "again")["status"] in ("done", "failed"))

        eventually(finished, 90, "the resumed claim to finish")
        report = admin("3", "show", "again")
        assert report["status"] == "done", report
        (claim,) = report["claims"]
        assert (claim["state"], claim["attempt"], claim["incarnation"]) == ("done", 2, 2), claim
        (result,) = report["results"]
        assert (result["status"], result["completed"], result["error"]) == ("ok", 1000, "")
        (again,) = admin("0", "nodes", "rank:4")
        assert (again["pid"], again["state"], again["incarnation"]) == (pid[4], "live", 2)

        # killed again while it holds a claim, past its one restart: its work fails, it is
        # declared lost (never silently resumed or dropped)
        admin(
            "2", "submit", "long", "--sources", "rank:4", "--destinations", "rank:3",
            "--count", "100000", "--warmup", "0", "--run-timeout", "120",
        )  # fmt: skip
        # killed once it holds the claim: a kill racing the submission's replication (the
        # root reaping the exit before the submission reached it) is not what is tested here
        eventually(lambda: claim_state(source_db, "long") == "running", 20, "the claim to run")
        os.kill(process, signal.SIGKILL)

        def failed() -> bool:
            claims = admin("1", "show", "long")["claims"]
            return bool(claims) and claims[0]["state"] == "failed"

        eventually(failed, 20, "the killed source's claim to be reported failed")
        claim = admin("1", "show", "long")["claims"][0]
        assert "exited with status -9, given up after 1 restart" in claim["error"]
        assert admin("0", "nodes", "rank:4")[0]["state"] == "lost"
        assert restarted_as(log, 4, 2) is None


def test_a_head_killed_with_sigkill_comes_back_and_its_leaf_reconnects(tmp_path: Path) -> None:
    """A task head restarted (``--restart 1``) with its identity, port and Unix path: it comes
    back as the same PID (incarnation 2); its leaf, never restarted (incarnation 1), reconnects
    by its parent link's retries and is resolvable at the root again, and an echo from the
    other task to that leaf crosses the restarted head."""
    # 3 s: the leaf under the restarted head is out of the root's view for about one idle
    # timeout (it notices its lost link, then joins again), within the root's grace of two
    # (with 5 s and that grace, one run in seven here still failed)
    with persistent_tree(tmp_path, idle_timeout=3) as tree:
        ready, log, admin = tree.ready, tree.log, tree.admin

        def at_root() -> set[str]:
            return {str(entry["pid"]) for entry in tree.json("ls", ready["tokens"]["0"])}

        by_rank = {n["rank"]: n for n in admin("1", "nodes")}
        assert (by_rank[3]["role"], by_rank[4]["parent"]) == ("head", by_rank[3]["pid"])
        pid = {rank: n["pid"] for rank, n in by_rank.items()}
        assert set(pid.values()) <= at_root()

        os.kill(ready["processes"]["3"], signal.SIGKILL)
        eventually(lambda: restarted_as(log, 3, 1) is not None, 30, "head 3 to be restarted")
        process = restarted_as(log, 3, 1)
        assert process is not None
        assert process != ready["processes"]["3"]

        def back() -> bool:
            nodes = {n["rank"]: n for n in admin("1", "nodes")}
            head, leaf = nodes[3], nodes[4]
            return bool(
                (head["pid"], head["state"], head["incarnation"]) == (pid[3], "live", 2)
                and (leaf["pid"], leaf["state"], leaf["incarnation"]) == (pid[4], "live", 1)
                and set(pid.values()) <= at_root()  # the leaf under the new head too
            )

        eventually(back, 60, "the restarted head and its leaf to be live and resolvable")
        tree.echo("1", "through", "rank:1", "rank:4")
        assert restarted_as(log, 4, 1) is None  # the leaf was never restarted


def test_a_hung_head_declared_lost_returns_live_and_claims_new_work(tmp_path: Path) -> None:
    """A UDP head stopped with SIGSTOP while it runs a claim leaves the root's view with its
    leaf (their links idle out) and both are declared lost after the grace, its claim failed;
    resumed with SIGCONT, the head joins the root again and its leaf joins the head: the root
    records both live again (the same incarnation, the loss and the return recorded), the
    failed claim stays failed, and the head claims and runs new work, whose echoes succeed.

    The return is bounded: within one idle timeout plus ``DEFAULT_REJOIN_TIMEOUT`` of the
    resume (``Node.rejoin_timeout``; measured well under a second). Before, the head fed the
    datagrams queued in its socket during the stop to its connections before their idle
    timers fired: the connections the root had discarded lived on, one idle timeout at
    least, and up to 38 s where the late acknowledgements inflated the RTT (three PTOs floor
    the idle timeout); the head's parent link came back that late, and its first echoes went
    out on a dead pooled connection (README, "A hung head that resumes")."""
    with persistent_tree(tmp_path, idle_timeout=3) as tree:
        ready, log, admin = tree.ready, tree.log, tree.admin
        before = {n["rank"]: n for n in admin("1", "nodes")}
        admin(
            "1", "submit", "before", "--sources", "rank:3", "--destinations", "rank:0",
            "--count", "100000", "--warmup", "0", "--run-timeout", "300", "--no-baselines",
        )  # fmt: skip
        source_db = tmp_path / "w" / "db" / "node-3.db"
        eventually(lambda: claim_state(source_db, "before") == "running", 20, "the claim to run")
        process = ready["processes"]["3"]

        def states() -> tuple[str, str]:
            nodes = {n["rank"]: n for n in admin("1", "nodes")}
            return (str(nodes[3]["state"]), str(nodes[4]["state"]))

        os.kill(process, signal.SIGSTOP)
        try:
            # its links idle out (3 s), then the root's grace (6 s) runs out
            eventually(lambda: states() == ("lost", "lost"), 60, "head and leaf to be lost")
        finally:
            os.kill(process, signal.SIGCONT)
            resumed = time.time()  # the root's ledger times are wall-clock times of this host
        (failed,) = admin("1", "show", "before")["claims"]
        assert failed["state"] == "failed", failed
        assert "its node left the namespace" in failed["error"]

        eventually(lambda: states() == ("live", "live"), 60, "head and leaf to be live again")
        after = {n["rank"]: n for n in admin("1", "nodes")}
        text = log.read_text(errors="replace")
        for rank in (3, 4):
            node = after[rank]
            assert (node["pid"], node["incarnation"], node["losses"]) == (
                before[rank]["pid"],
                1,
                1,
            ), node
            assert node["returned_reason"] == "it is resolvable at the root again"
            assert 0 < node["lost_at"] <= node["returned_at"]
            # back within Node.rejoin_timeout of the resume (3 s idle timeout + 5 s)
            assert node["returned_at"] - resumed <= 3 + DEFAULT_REJOIN_TIMEOUT, node
            assert f"[root] {node['pid'][:8]} returned: " in text

        # new work addressed to it is claimed and run by the same incarnation, and its echoes,
        # the first since the return, get their answers: to the root and across it to leaf 1
        done = admin(
            "2", "submit", "after", "--sources", "rank:3", "--destinations", "rank:0,rank:1",
            "--count", "3", "--payload", "64", "--no-baselines", "--wait",
        )  # fmt: skip
        assert done["status"] == "done", done
        report = admin("1", "show", "after")
        (claim,) = report["claims"]
        assert (claim["state"], claim["incarnation"], claim["attempt"]) == ("done", 1, 1)
        results = {r["destination"]: r for r in report["results"]}
        assert sorted(results) == sorted([after[0]["pid"], after[1]["pid"]])
        for result in results.values():
            assert result["source"] == after[3]["pid"]
            assert (result["status"], result["completed"], result["error"]) == ("ok", 3, ""), result
        report = admin("0", "show", "before")  # the failure at the loss was not retracted
        assert report["status"] == "failed"
        assert report["claims"] == [failed]
        assert report["results"] == []


def test_admin_at_a_node_without_experiment_tables_says_so(tmp_path: Path) -> None:
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca"))
    root, token = start_node([*CLI, "serve", "--timeout", "20"], env, tmp_path / "root.log")
    try:
        code, _record, stderr = run_json(
            [*CLI, "admin", token, "nodes", "--json", "--timeout", "20"], env, timeout=40
        )
    finally:
        stop_all([root])
    assert code == 1
    assert "keeps no experiment tables" in stderr
    assert stderr.count("\n") == 1  # one line, no traceback
