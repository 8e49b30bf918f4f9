"""Accepted clocks are bounded (issue 15): a peer whose changes carry a version near 2**63
used to raise every receiver's clock, be relayed onward, and leave every local write failing
with ``CorruptMetadataError``. Now a version beyond the bound is refused, the error names the
peer, nothing of it is applied or relayed, and local writes go on."""

from __future__ import annotations

import pytest

from chrysalis.sqlite import (
    DEFAULT_MAX_CLOCK_DRIFT,
    MAX_ACCEPTED_VERSION,
    Change,
    ClockBoundError,
    CorruptMetadataError,
    Replica,
    TableSchema,
    hlc_version,
)
from chrysalis.sqlite.testing import ReplicaNetwork

KV = TableSchema(
    "kv",
    "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT)",
    ["k", "v"],
    ["k"],
)
NEAR_2_63 = 2**63 - 2


def _site(n: int) -> bytes:
    return bytes([n]) * 16


def _put(replica: Replica, key: str, value: str) -> int:
    with replica.transaction() as tx:
        tx.upsert("kv", (key, value))
    assert tx.version is not None
    return tx.version


def _rows(replica: Replica) -> list[tuple[str, str]]:
    return replica.connection.execute("SELECT k, v FROM kv ORDER BY k").fetchall()


def _set_clock(replica: Replica, version: int) -> None:
    with replica._write() as conn:
        conn.execute("UPDATE __chrysalis_replica_v1 SET db_version = ?", (version,))


def test_a_hostile_peer_cannot_stop_writes_and_nothing_of_it_is_relayed() -> None:
    net = ReplicaNetwork(seed=5)
    alice, bob, mallory = (Replica(":memory:", [KV], site_id=_site(n)) for n in (1, 2, 9))
    for name, replica in (("alice", alice), ("bob", bob), ("mallory", mallory)):
        net.add(name, replica)
    net.connect("alice", "bob")
    _put(alice, "a", "1")
    net.settle()
    _set_clock(mallory, NEAR_2_63)  # a hostile (or broken) replica
    assert _put(mallory, "evil", "x") == NEAR_2_63 + 1
    net.connect("alice", "mallory")
    with pytest.raises(ClockBoundError) as refused:
        net.settle()
    error = refused.value
    assert error.peer_site == mallory.site_id
    assert error.version == NEAR_2_63 + 1
    assert mallory.site_id.hex() in str(error)
    assert str(net.pid("mallory")) in str(error)
    assert str(NEAR_2_63 + 1) in str(error)
    assert "e+" not in str(error)
    net.crash("mallory")
    net.settle()  # the rest of the replication goes on
    for replica in (alice, bob):
        assert replica.db_version < 100  # no clock was raised
        assert ("evil", "x") not in _rows(replica)  # nothing applied, nothing relayed
    _put(alice, "b", "2")
    _put(bob, "c", "3")
    net.settle()
    assert _rows(alice) == _rows(bob) == [("a", "1"), ("b", "2"), ("c", "3")]


def test_apply_changes_refuses_a_version_beyond_the_bound_and_keeps_nothing() -> None:
    alice = Replica(":memory:", [KV], site_id=_site(1))
    try:
        bad = Change("kv", ("z",), ("z", "1"), MAX_ACCEPTED_VERSION + 1, _site(9), 0)
        good = Change("kv", ("y",), ("y", "1"), 5, _site(9), 0)
        with pytest.raises(ClockBoundError, match=str(MAX_ACCEPTED_VERSION + 1)):
            alice.apply_changes([good, bad])
        assert alice.db_version == 0
        assert _rows(alice) == []
        at_bound = Change("kv", ("x",), ("x", "1"), MAX_ACCEPTED_VERSION, _site(9), 0)
        assert alice.apply_changes([at_bound]).applied == 1
        # the most a peer can raise the clock to still leaves room for local writes
        assert _put(alice, "mine", "v") == MAX_ACCEPTED_VERSION + 1
    finally:
        alice.close()


def test_with_a_clock_versions_are_hybrid_and_the_drift_is_bounded() -> None:
    now = [1_800_000_000.0]  # seconds, passed in: the core reads no clock
    alice = Replica(":memory:", [KV], site_id=_site(1), clock=lambda: now[0], max_clock_drift=30.0)
    try:
        first = _put(alice, "a", "1")
        assert first == hlc_version(now[0])
        assert _put(alice, "a", "2") == first + 1  # within one millisecond: the logical part
        ahead = hlc_version(now[0] + 31.0)
        early = Change("kv", ("b",), ("b", "x"), ahead, _site(9), 0)
        with pytest.raises(ClockBoundError, match="30"):
            alice.apply_changes([early])
        within = Change("kv", ("c",), ("c", "x"), hlc_version(now[0] + 29.0), _site(9), 0)
        assert alice.apply_changes([within]).applied == 1
        assert alice.db_version == within.db_version
        now[0] += 2.0  # the same change is acceptable once local time has caught up
        assert alice.apply_changes([early]).applied == 1
        assert _put(alice, "d", "1") == ahead + 1
        now[0] += 100.0
        assert _put(alice, "e", "1") == hlc_version(now[0])
    finally:
        alice.close()


def test_clock_arguments_are_checked() -> None:
    assert DEFAULT_MAX_CLOCK_DRIFT > 0
    for drift in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_clock_drift"):
            Replica(":memory:", [KV], max_clock_drift=drift)
    broken = Replica(":memory:", [KV], clock=lambda: float("nan"))
    try:
        with pytest.raises(ValueError, match="clock"), broken.transaction() as tx:
            tx.upsert("kv", ("a", "1"))
        assert _rows(broken) == []
    finally:
        broken.close()


def test_a_clock_already_at_its_maximum_is_reported_as_an_integer() -> None:
    # a database whose clock a peer pushed to the top before accepted versions were bounded
    alice = Replica(":memory:", [KV], site_id=_site(1))
    try:
        _set_clock(alice, 2**63 - 1)
        with pytest.raises(CorruptMetadataError) as failed, alice.transaction() as tx:
            tx.upsert("kv", ("a", "1"))
        message = str(failed.value)
        assert str(2**63 - 1) in message
        assert "e+18" not in message
        assert "overflow" in message
        assert _rows(alice) == []
    finally:
        alice.close()
