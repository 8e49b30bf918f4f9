"""Convergence of many replicas under random delivery, duplication, partitions and crashes,
checked against a last-writer-wins model computed independently of the implementation."""

from __future__ import annotations

import contextlib
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import Replica, TableSchema
from chrysalis.sqlite.testing import ReplicaNetwork

KV = TableSchema(
    "kv",
    "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT, writer TEXT)",
    ["k", "v", "writer"],
    ["k"],
)
KEYS = ["k0", "k1", "k2", "k3"]


def _site(index: int) -> bytes:
    # deliberately not in node order, so site-id tie breaks differ from index order
    return bytes([(index * 7 + 3) % 256]) * 16


@dataclass
class Model:
    """The expected outcome, computed from the writes alone: per key, the write with the
    greatest (version, site id, seq) wins; a winning delete means no row."""

    writes: list[tuple[int, bytes, int, str, str | None]] = field(default_factory=list)

    def best(self) -> dict[str, tuple[tuple[int, bytes, int], str | None]]:
        best: dict[str, tuple[tuple[int, bytes, int], str | None]] = {}
        for version, site, seq, key, value in self.writes:
            if key not in best or (version, site, seq) > best[key][0]:
                best[key] = ((version, site, seq), value)
        return best

    def expected(self) -> list[tuple[str, str]]:
        return sorted((k, v) for k, (_, v) in self.best().items() if v is not None)

    def winners(self) -> dict[str, tuple[int, bytes, int, bool]]:
        """Per key, the winning origin tuple and whether it is a delete (a tombstone)."""
        return {k: (*stamp, v is None) for k, (stamp, v) in self.best().items()}


class Cluster:
    """Replicas on a ``ReplicaNetwork`` plus the model of every committed write."""

    def __init__(
        self,
        n: int,
        parents: list[int],
        seed: int,
        *,
        mesh: bool = False,
        folder: Path | None = None,
        **network: Any,
    ) -> None:
        self.names = [f"r{i}" for i in range(n)]
        self.folder = folder
        self.net = ReplicaNetwork(seed, **network)
        self.model = Model()
        self.rng = random.Random(seed)
        for i, name in enumerate(self.names):
            self.net.add(name, Replica(self._path(name), [KV], site_id=_site(i)))
        if mesh:
            for i in range(n):
                for j in range(i + 1, n):
                    self.net.connect(self.names[i], self.names[j], topology=False)
        else:
            for child, parent in enumerate(parents, start=1):
                self.net.connect(self.names[parent], self.names[child])

    def _path(self, name: str) -> str:
        return ":memory:" if self.folder is None else str(self.folder / f"{name}.sqlite")

    def write(self, node: int, edits: list[tuple[str, str | None]]) -> None:
        replica = self.net.replica(self.names[node])
        # without folding: the entries written so far, and the pending local versions
        (pending,) = replica.connection.execute(
            "SELECT max(db_version) FROM __chrysalis_versions_v1"
        ).fetchone()
        folded = self.winners(self.names[node], fold=False).values()
        seen = max([v for v, *_ in folded] + [pending or 0])
        with replica.transaction() as tx:
            for key, value in edits:
                if value is None:
                    tx.execute("DELETE FROM kv WHERE k = ?", (key,))
                    tx.capture_delete("kv", (key,))
                else:
                    tx.execute(
                        "INSERT INTO kv VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE SET "
                        "v = excluded.v, writer = excluded.writer",
                        (key, value, self.names[node]),
                    )
                    tx.capture_upsert("kv", (key,))
        assert tx.version is not None
        # Lamport clock: a local write is newer than everything the replica has seen
        assert tx.version > seen
        for seq, (key, value) in enumerate(edits):
            self.model.writes.append((tx.version, replica.site_id, seq, key, value))

    def rows(self, name: str) -> list[tuple[str, str]]:
        return (
            self.net.replica(name).connection.execute("SELECT k, v FROM kv ORDER BY k").fetchall()
        )

    def winners(self, name: str, *, fold: bool = True) -> dict[str, tuple[int, bytes, int, bool]]:
        """The replica's clock entries of ``kv``: per key, the winning origin tuple and
        whether the row is a tombstone (pending local versions folded first, unless
        ``fold`` is false)."""
        replica = self.net.replica(name)
        if fold:
            replica._fold_all()
        rows = replica.connection.execute(
            "SELECT c._k0, c._version, o.site_id, c._seq, c._deleted "
            "FROM __chrysalis_clock_v1_kv AS c "
            "JOIN __chrysalis_origins_v1 AS o ON o.position = c._origin"
        )
        return {k: (v, site, seq, bool(d)) for k, v, site, seq, d in rows}

    def check_converged(self) -> None:
        expected = self.model.expected()
        winners = self.model.winners()
        collected: dict[bytes, int] = {}
        for name in self.names:
            for site, through in self.collected(name).items():
                collected[site] = max(collected.get(site, 0), through)
        for name in self.names:
            assert self.rows(name) == expected, name
            held = self.winners(name)
            for key, winner in winners.items():
                if winner[3] and held.get(key, winner)[3] and held.get(key) != winner:
                    # a collected tombstone (here, or before this replica first synced): gone,
                    # or replaced by an older delete a newcomer sent after it went (the row
                    # is absent either way, and no upsert between the two can arrive: known
                    # peers held the newer one, a newcomer's older upserts are refused)
                    assert collected.get(winner[1], 0) >= winner[0], (name, key)
                else:
                    assert held.get(key) == winner, (name, key)
            assert held.keys() <= winners.keys(), name

    def collected(self, name: str) -> dict[bytes, int]:
        """Per origin site, the greatest tombstone version ``name`` collected."""
        rows = self.net.replica(name).connection.execute(
            "SELECT o.site_id, c.collected_through FROM __chrysalis_gc_collected_v1 AS c "
            "JOIN __chrysalis_origins_v1 AS o ON o.position = c.origin"
        )
        return {bytes(site): int(through) for site, through in rows}

    def collect_garbage(self, node: int, budget: int) -> None:
        """Run the collector on one replica, within its rules: only once the replica knows
        every peer it links to (peers it has not met are protected by the retention horizon
        in real use; here the horizon is zero)."""
        name = self.names[node]
        with contextlib.suppress(RuntimeError):  # a crashed node
            replica = self.net.replica(name)
            known = {
                bytes(site)
                for (site,) in replica.connection.execute(
                    "SELECT peer_site_id FROM __chrysalis_gc_peers_v1 WHERE forgotten = 0"
                )
            }
            neighbours = {
                self.net.replica(link.child if link.parent == name else link.parent).site_id
                for link in self.net.links
                if name in (link.parent, link.child)
            }
            if neighbours <= known:
                replica.collect_garbage(now=0.0, retention=0.0, budget=budget)

    def check_frontiers_are_backed_by_the_peer(self) -> None:
        """A frontier never claims more than the peer durably holds: every row whose winning
        change here is of an origin and at most ``synced_at`` is won at the peer by that change
        or a greater one (frontiers move only after the Ack). Nothing is folded here, so that
        pending versions live on between operations: a pending version only ever raises
        entries, and a change applied at the peer was compared after folding there."""
        for link in self.net.links:
            for here, there in ((link.parent, link.child), (link.child, link.parent)):
                try:
                    mine = self.net.replica(here)
                    theirs = self.net.replica(there)
                except RuntimeError:
                    continue  # a crashed end
                frontier = mine.peer_frontier(self.net.pid(there), theirs.site_id)
                theirs_won = self.winners(there, fold=False)
                collected = self.collected(there)
                for key, (version, site, seq, dead) in self.winners(here, fold=False).items():
                    entry = frontier.get(site)
                    if entry is not None and version <= entry.synced_at:
                        if key not in theirs_won and dead:
                            # the peer collected the tombstone (or one of a greater version)
                            assert max(collected.values(), default=0) >= version
                            continue
                        assert key in theirs_won, (here, there, key)
                        assert theirs_won[key][:3] >= (version, site, seq), (here, there, key)

    def fold(self, node: int, budget: int | None) -> None:
        """Fold pending local versions of one replica now: ``budget`` keys (whole versions)
        in one transaction, or all of them (``None``)."""
        with contextlib.suppress(RuntimeError):  # a crashed node
            replica = self.net.replica(self.names[node])
            with replica._write() as conn:
                replica._fold(conn, budget)

    def close(self) -> None:
        for name in self.names:
            with contextlib.suppress(RuntimeError):
                self.net.replica(name).close()


edits = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.text("abc", max_size=2))),
    min_size=1,
    max_size=3,
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[int], int, bool, list[tuple[Any, ...]]]:
    n = draw(st.integers(2, 5))
    parents = [draw(st.integers(0, i - 1)) for i in range(1, n)]
    links = n - 1  # cut/heal indexes wrap around the actual link count (mesh has more)
    operation = st.one_of(
        st.tuples(st.just("write"), st.integers(0, n - 1), edits),
        st.tuples(st.just("write"), st.integers(0, n - 1), edits),
        st.tuples(st.just("run"), st.integers(1, 60)),
        st.tuples(st.just("fold"), st.integers(0, n - 1), st.sampled_from([1, 3, None])),
        st.tuples(st.just("gc"), st.integers(0, n - 1), st.sampled_from([1, 2, 4096])),
        st.tuples(st.just("cut"), st.integers(0, links - 1)),
        st.tuples(st.just("heal"), st.integers(0, links - 1)),
        st.tuples(st.just("lose_acks"), st.integers(0, links - 1), st.booleans()),
    )
    return (
        n,
        parents,
        draw(st.integers(0, 2**32 - 1)),
        draw(st.booleans()),
        draw(st.lists(operation, max_size=30)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_concurrent_writes_converge_to_the_lww_model(
    scenario: tuple[int, list[int], int, bool, list[tuple[Any, ...]]],
) -> None:
    n, parents, seed, mesh, operations = scenario
    cluster = Cluster(
        n,
        parents,
        seed,
        mesh=mesh,
        max_fragment=97,
        partition_rate=0.01,
        heal_rate=0.05,
        duplicate_rate=0.01,
    )
    links = cluster.net.links
    try:
        for op in operations:
            if op[0] == "write":
                cluster.write(op[1], op[2])
            elif op[0] == "run":
                for _ in range(op[1]):
                    cluster.net.step()
            elif op[0] == "fold":
                cluster.fold(op[1], op[2])
            elif op[0] == "gc":
                cluster.collect_garbage(op[1], op[2])
            else:
                link = links[op[1] % len(links)]
                if op[0] == "cut":
                    cluster.net.cut(link.parent, link.child)
                elif op[0] == "heal":
                    cluster.net.heal(link.parent, link.child)
                else:
                    ends = (link.parent, link.child) if op[2] else (link.child, link.parent)
                    cluster.net.lose_acks(*ends)
            cluster.check_frontiers_are_backed_by_the_peer()
        cluster.net.heal_all()
        cluster.net.settle(max_steps=50_000)
        cluster.check_converged()
        cluster.check_frontiers_are_backed_by_the_peer()
        # once settled, every replica may collect; the result must not change
        for node in range(n):
            cluster.collect_garbage(node, 4096)
        cluster.check_converged()
        cluster.check_frontiers_are_backed_by_the_peer()
    finally:
        cluster.close()


@pytest.mark.parametrize("seed", range(4))
def test_a_fault_free_tree_delivers_each_change_once_per_replica(seed: int) -> None:
    rng = random.Random(seed)
    n = 5
    parents = [rng.randrange(i) for i in range(1, n)]
    cluster = Cluster(n, parents, seed, max_fragment=50)
    try:
        for _ in range(15):
            cluster.write(rng.randrange(n), [(rng.choice(KEYS), rng.choice(["x", "y", None]))])
            cluster.net.run(rng.randrange(30))
        cluster.net.settle()
        cluster.check_converged()
        for link in cluster.net.links:
            for session in (link.at_parent, link.at_child):
                assert session is not None
                stats = session.statistics()
                # split horizon: no change comes back toward its origin subtree, none twice
                assert stats.changes_received == stats.changes_logged
                assert session.peer_synchronized
    finally:
        cluster.close()


def test_partitioned_halves_converge_after_healing() -> None:
    cluster = Cluster(4, [0, 1, 0], seed=7)  # r0 - r1 - r2, and r0 - r3
    try:
        cluster.net.settle()
        cluster.net.cut("r0", "r1")
        cluster.write(2, [("k0", "left")])
        cluster.write(3, [("k0", "right"), ("k1", "only-right")])
        cluster.write(1, [("k1", None)])
        cluster.net.settle()
        assert cluster.rows("r2") != cluster.rows("r3")  # the halves diverged meanwhile
        cluster.net.heal("r0", "r1")
        cluster.net.settle()
        cluster.check_converged()
    finally:
        cluster.close()


@pytest.mark.parametrize(("seed", "victim"), [(1, 0), (2, 1), (3, 2), (4, 1)])
def test_a_replica_restarted_from_its_file_mid_stream_loses_nothing(
    tmp_path: Path, seed: int, victim: int
) -> None:
    rng = random.Random(seed)
    cluster = Cluster(3, [0, 1], seed, folder=tmp_path, max_fragment=40, chunk_target_bytes=300)
    name = cluster.names[victim]
    try:
        for round_ in range(3):
            for node in range(3):
                cluster.write(
                    node, [(k, f"{node}-{round_}-{rng.randrange(9)}") for k in rng.sample(KEYS, 3)]
                )
            cluster.net.run(rng.randrange(5, 60))  # crash somewhere inside the stream
            for node in range(3):
                cluster.collect_garbage(node, rng.choice([1, 4096]))
        # an application transaction is open (uncommitted) when the process dies
        doomed = cluster.net.replica(name).transaction()
        doomed.execute("INSERT INTO kv VALUES ('lost', 'never committed', 'x')")
        doomed.capture_upsert("kv", ("lost",))
        cluster.net.crash(name).close()
        for node in range(3):
            if node != victim:
                cluster.write(node, [(rng.choice(KEYS), f"while-down-{node}")])
        cluster.net.run(40)
        cluster.net.restart(name, Replica(tmp_path / f"{name}.sqlite", [KV]))
        assert cluster.net.replica(name).site_id == _site(victim)  # same incarnation
        cluster.net.run(rng.randrange(40))
        cluster.write(victim, [("k0", "after-restart")])
        cluster.net.settle()
        for node in range(3):
            cluster.collect_garbage(node, 4096)
        cluster.check_converged()
        for other in cluster.names:
            keys = [k for k, _ in cluster.rows(other)]
            assert "lost" not in keys
        cluster.check_frontiers_are_backed_by_the_peer()
    finally:
        cluster.close()


def test_restart_with_a_fresh_database_is_a_new_incarnation() -> None:
    with tempfile.TemporaryDirectory() as folder:
        cluster = Cluster(2, [0], seed=3, folder=Path(folder))
        try:
            cluster.write(0, [("k0", "a")])
            cluster.net.settle()
            cluster.net.crash("r1").close()
            (Path(folder) / "r1.sqlite").unlink()
            fresh = Replica(Path(folder) / "r1.sqlite", [KV], site_id=bytes([0xEE]) * 16)
            cluster.net.restart("r1", fresh)
            cluster.net.settle()
            # the new incarnation has its own frontier and received everything again
            assert cluster.rows("r1") == [("k0", "a")]
            r0 = cluster.net.replica("r0")
            assert r0.peer_frontier(cluster.net.pid("r1"), fresh.site_id)[_site(0)].synced_at == 1
        finally:
            cluster.close()


def test_keys_with_a_nul_are_relayed_whole() -> None:
    # r1 relays r0's changes to r2 from the versions it recorded; a key's NUL must survive
    cluster = Cluster(3, [0, 1], seed=5)  # r0 - r1 - r2
    try:
        cluster.write(0, [("k\0a", "one"), ("k", "two"), ("\0", "three")])
        cluster.write(2, [("k\0b", "four")])
        cluster.net.settle()
        cluster.check_converged()
        assert len(cluster.rows("r1")) == 4
    finally:
        cluster.close()
