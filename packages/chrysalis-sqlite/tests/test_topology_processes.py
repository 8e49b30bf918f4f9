"""Five processes in a tree over UDP, each a ``Node`` with a ``ReplicationTopology`` on its own
database file, writing concurrently; one leaf is killed with SIGKILL mid-stream and restarted
from its file (with a fresh identity, so a fresh PID). Every database must end up with every
row: nothing committed is lost, nothing is duplicated.

The same file is the worker: ``python test_topology_processes.py worker ...``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chrysalis.sqlite import Replica, TableSchema

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, n INTEGER)",
    columns=["id", "author", "n"],
    primary_key=["id"],
)
WRITES = 30
WRITE_INTERVAL = 0.03
TREE = (("root", None), ("a", "root"), ("b", "root"), ("a1", "a"), ("b1", "b"))
DEADLINE = 18.0


# -- worker ---------------------------------------------------------------------------------


def _worker(ca_dir: str, db: str, name: str, info: str, parent: str, limit: str) -> None:
    from chrysalis.core import DatagramAddr, Pid
    from chrysalis.node import JoinSettings, Node
    from chrysalis.quic._devca import DevelopmentCA
    from chrysalis.sqlite._topology import ReplicationTopology

    async def main() -> None:
        identity = DevelopmentCA.load_or_create(Path(ca_dir)).issue()
        join = None
        if parent:
            address, pid = parent.split()
            join = JoinSettings(DatagramAddr.parse(address), Pid.parse(pid), retry_delay=0.1)
        node = Node(identity, listen="udp://127.0.0.1:0", parent=join)
        replica = Replica(db, [NOTES])
        topology = ReplicationTopology(node, replica, retry_delay=0.1, poll_interval=0.1)
        async with node, topology:
            tmp = info + ".tmp"
            Path(tmp).write_text(f"{node.local_addr} {node.pid.hex()}\n")
            os.replace(tmp, info)
            await node.wait_connected()
            (done,) = replica.connection.execute(
                "SELECT COUNT(*) FROM notes WHERE author = ?", (name,)
            ).fetchone()
            # a restarted worker resumes where it stopped; the first life of the leaf that is
            # killed stops short of the last row, so the kill always finds rows still to write
            # however fast the writes run against the root's replication
            for i in range(done, int(limit)):
                with replica.transaction() as tx:
                    tx.upsert("notes", (f"{name}-{i}", name, i))
                await asyncio.sleep(WRITE_INTERVAL)
            await asyncio.Event().wait()  # serve until killed

    asyncio.run(main())


# -- test -----------------------------------------------------------------------------------


def _wait_for(predicate: object, deadline: float, what: str) -> None:
    assert callable(predicate)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _count(db: Path, author: str | None = None) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
        try:
            if author is None:
                (n,) = conn.execute("SELECT COUNT(*) FROM notes").fetchone()
            else:
                (n,) = conn.execute(
                    "SELECT COUNT(*) FROM notes WHERE author = ?", (author,)
                ).fetchone()
            return int(n)
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return 0  # not created yet, or busy: ask again


@pytest.mark.slow
def test_five_processes_converge_after_a_leaf_is_killed_and_restarted(tmp_path: Path) -> None:
    from chrysalis.quic._devca import DevelopmentCA

    ca_dir = tmp_path / "ca"
    DevelopmentCA.load_or_create(ca_dir)
    deadline = time.monotonic() + DEADLINE
    procs: dict[str, subprocess.Popen[bytes]] = {}
    infos = {name: tmp_path / f"{name}.info" for name, _ in TREE}
    dbs = {name: tmp_path / f"{name}.db" for name, _ in TREE}
    logs: list[Path] = []

    def spawn(name: str, parent: str | None, limit: int = WRITES) -> None:
        parent_info = infos[parent].read_text().strip() if parent else ""
        log = tmp_path / f"{name}.{len(logs)}.log"
        logs.append(log)
        with log.open("wb") as out:
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "worker",
                    str(ca_dir),
                    str(dbs[name]),
                    name,
                    str(infos[name]),
                    parent_info,
                    str(limit),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    try:
        for level in (("root",), ("a", "b"), ("a1", "b1")):
            for name in level:
                spawn(name, dict(TREE)[name], WRITES - 1 if name == "a1" else WRITES)
            for name in level:
                _wait_for(infos[name].exists, deadline, f"{name} to start")
        # kill the leaf a1 mid-stream: some of its rows have reached the root already
        _wait_for(lambda: _count(dbs["root"], "a1") >= 5, deadline, "a1's first rows at root")
        procs["a1"].send_signal(signal.SIGKILL)
        procs["a1"].wait(5)
        # a read-write open rolls back the transaction the kill interrupted (a hot journal,
        # which a read-only connection cannot roll back and so would report as unreadable)
        recovered = sqlite3.connect(dbs["a1"], timeout=5.0)
        try:
            (written_before,) = recovered.execute(
                "SELECT COUNT(*) FROM notes WHERE author = 'a1'"
            ).fetchone()
        finally:
            recovered.close()
        assert 5 <= written_before < WRITES, written_before
        infos["a1"].unlink()
        spawn("a1", "a")
        total = WRITES * len(TREE)
        _wait_for(
            lambda: all(_count(db) == total for db in dbs.values()),
            deadline,
            "every database to hold every row",
        )
        for name, db in dbs.items():
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
            try:
                got = set(conn.execute("SELECT id, author, n FROM notes").fetchall())
            finally:
                conn.close()
            want = {(f"{a}-{i}", a, i) for a, _ in TREE for i in range(WRITES)}
            assert got == want, name
    except AssertionError:
        for log in logs:
            sys.stderr.write(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}\n")
        raise
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in procs.values():
            proc.wait(5)


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "worker":
    _worker(*sys.argv[2:8])
