"""The session state machine: handshake, schema digests, batches and chunks, acknowledgement
and frontiers, scopes, protocol errors, the apply lock and end of stream."""

from __future__ import annotations

import pytest

from chrysalis.core import Pid
from chrysalis.sqlite import (
    MAX_BATCH_ROWS,
    MAX_FRAME_BYTES,
    SESSION_TRANSITIONS,
    Ack,
    BatchChunk,
    BeginBatch,
    Change,
    CommitBatch,
    DuplicatePeerError,
    FrameDecoder,
    FrameTooLargeError,
    Hello,
    Message,
    MissingSchemaError,
    RemoteProtocolError,
    RemoteProtocolErrorKind,
    Replica,
    ReplicaSession,
    Schema,
    SchemaConflictError,
    Scope,
    SessionClosedError,
    SessionState,
    SitePublisher,
    SiteScope,
    SiteScopeError,
    SiteSet,
    Synchronized,
    TableSchema,
    TruncatedFrameError,
    encode_message,
    pack_batch_chunks,
)

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, body TEXT)",
    ["id", "author", "body"],
    ["id"],
)
NOTES_V2 = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, body TEXT NOT NULL)",
    ["id", "author", "body"],
    ["id"],
)
SITE_A, SITE_B = bytes([0xA]) * 16, bytes([0xB]) * 16
PID_A, PID_B = Pid(b"a" * 16), Pid(b"b" * 16)


def _write(replica: Replica, note: str, body: str, author: str = "someone") -> int | None:
    with replica.transaction() as tx:
        tx.execute(
            "INSERT INTO notes VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "author = excluded.author, body = excluded.body",
            (note, author, body),
        )
        tx.capture_upsert("notes", (note,))
    return tx.version


def _rows(replica: Replica) -> list[tuple[object, ...]]:
    return replica.connection.execute("SELECT id, author, body FROM notes ORDER BY id").fetchall()


def _decode(data: bytes) -> list[Message]:
    decoder = FrameDecoder()
    decoder.feed(data)
    out: list[Message] = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    decoder.end_of_stream()
    return out


def _state(session: ReplicaSession) -> SessionState:
    return session.state  # a call, so type checkers do not narrow it between asserts


def _in_flight(session: ReplicaSession) -> int | None:
    return session.batch_in_flight


class Pair:
    """Two replicas and a session pair between them, with manual control over delivery."""

    def __init__(
        self, schema_a: TableSchema = NOTES, schema_b: TableSchema = NOTES, **kwargs: int
    ) -> None:
        self.a = Replica(":memory:", [schema_a], site_id=SITE_A)
        self.b = Replica(":memory:", [schema_b], site_id=SITE_B)
        self.at_a = ReplicaSession(self.a, PID_B, SitePublisher.local(SITE_A), **kwargs)
        self.at_b = ReplicaSession(self.b, PID_A, SitePublisher.local(SITE_B), **kwargs)
        self.to_b = bytearray()
        self.to_a = bytearray()

    def collect(self) -> None:
        self.to_b += self.at_a.data_to_send()
        self.to_a += self.at_b.data_to_send()

    def deliver_to_b(self) -> list[Message]:
        self.collect()
        data, self.to_b[:] = bytes(self.to_b), b""
        self.at_b.receive_data(data)
        self.collect()
        return _decode(data)

    def deliver_to_a(self) -> list[Message]:
        self.collect()
        data, self.to_a[:] = bytes(self.to_a), b""
        self.at_a.receive_data(data)
        self.collect()
        return _decode(data)

    def pump(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            self.collect()
            if not self.to_a and not self.to_b:
                self.at_a.poll()
                self.at_b.poll()
                self.collect()
                if not self.to_a and not self.to_b:
                    return
            self.deliver_to_b()
            self.deliver_to_a()
        raise AssertionError("the pair did not go quiet")

    def close(self) -> None:
        self.at_a.close()
        self.at_b.close()
        self.a.close()
        self.b.close()


def _clock(replica: Replica) -> list[tuple[object, ...]]:
    """The clock entries of ``notes``: key, version, origin site id, seq, deleted (pending
    local versions folded first)."""
    replica._fold_all()
    return replica.connection.execute(
        "SELECT c._k0, c._version, o.site_id, c._seq, c._deleted "
        "FROM __chrysalis_clock_v1_notes AS c "
        "JOIN __chrysalis_origins_v1 AS o ON o.position = c._origin ORDER BY c._k0"
    ).fetchall()


def test_transition_table_covers_the_documented_states() -> None:
    states = {state for state, _ in SESSION_TRANSITIONS} | set(SESSION_TRANSITIONS.values())
    assert states == {SessionState.AWAIT_HELLO, SessionState.READY, SessionState.IN_BATCH}
    assert SESSION_TRANSITIONS[(SessionState.AWAIT_HELLO, Hello)] is SessionState.READY
    assert SESSION_TRANSITIONS[(SessionState.READY, BeginBatch)] is SessionState.IN_BATCH
    assert SESSION_TRANSITIONS[(SessionState.IN_BATCH, CommitBatch)] is SessionState.READY
    assert (SessionState.IN_BATCH, Schema) not in SESSION_TRANSITIONS


def test_handshake_sends_hello_then_schema_digests() -> None:
    pair = Pair()
    first = _decode(pair.at_a.data_to_send())
    assert first == [Hello(SITE_A, SiteScope.explicit(SiteSet(0, [SITE_A])))]
    pair.at_a.receive_data(encode_message(Hello(SITE_B, SitePublisher.local(SITE_B).scope)))
    after = _decode(pair.at_a.data_to_send())
    assert after[0] == Schema("notes", NOTES.schema_hash)
    assert pair.at_a.state is SessionState.READY
    assert pair.at_a.peer_site_id == SITE_B
    pair.close()


def test_replicas_exchange_explicitly_captured_rows() -> None:
    pair = Pair()
    _write(pair.a, "from-a", "hello", "alice")
    _write(pair.b, "from-b", "hi", "bob")
    pair.pump()
    expected = [("from-a", "alice", "hello"), ("from-b", "bob", "hi")]
    assert _rows(pair.a) == expected
    assert _rows(pair.b) == expected
    assert pair.at_a.peer_synchronized
    assert pair.at_b.peer_synchronized
    _write(pair.a, "from-a", "updated", "alice")
    pair.pump()
    assert _rows(pair.b)[0] == ("from-a", "alice", "updated")
    stats = pair.at_a.statistics()
    assert stats.batches_sent == stats.batches_acked == 2
    assert stats.changes_sent == 2
    assert stats.changes_applied == 1
    pair.close()


def test_frontier_advances_only_after_the_ack() -> None:
    pair = Pair()
    version = _write(pair.a, "n1", "v1")
    pair.deliver_to_b()  # A's Hello
    pair.deliver_to_a()  # B's Hello and schema digest
    batch = pair.deliver_to_b()  # A's schema digest and the batch
    assert any(isinstance(m, BeginBatch) for m in batch)
    assert _rows(pair.b) == [("n1", "someone", "v1")]  # applied and durable at B...
    frontier = pair.a.peer_frontier(PID_B, SITE_B)
    assert frontier[SITE_A].synced_at == 0  # ...but A has not heard the Ack yet
    assert _in_flight(pair.at_a) == 1
    assert Ack(1) in _decode(bytes(pair.to_a))
    pair.deliver_to_a()
    assert pair.a.peer_frontier(PID_B, SITE_B)[SITE_A].synced_at == version
    assert _in_flight(pair.at_a) is None
    pair.close()


def test_a_lost_ack_means_the_batch_is_sent_again_and_deduplicated() -> None:
    pair = Pair()
    _write(pair.a, "n1", "v1")
    pair.deliver_to_b()
    pair.deliver_to_a()
    pair.deliver_to_b()  # B applies the batch; its Ack now sits in pair.to_a
    pair.at_a.close()  # the link drops: the Ack is lost
    pair.at_b.close()
    assert pair.a.peer_frontier(PID_B, SITE_B)[SITE_A].synced_at == 0
    again = Pair.__new__(Pair)
    again.a, again.b, again.to_a, again.to_b = pair.a, pair.b, bytearray(), bytearray()
    again.at_a = ReplicaSession(pair.a, PID_B, SitePublisher.local(SITE_A))
    again.at_b = ReplicaSession(pair.b, PID_A, SitePublisher.local(SITE_B))
    again.pump()
    stats = again.at_b.statistics()
    assert stats.changes_received == 1
    assert stats.changes_logged == 0  # the resent change was a duplicate
    assert pair.a.peer_frontier(PID_B, SITE_B)[SITE_A].synced_at == 1
    assert _rows(pair.b) == [("n1", "someone", "v1")]
    again.close()


def test_change_chunks_are_bounded_and_ordered() -> None:
    big = [b"%d" % i + b"x" * (700 * 1024) for i in range(2)]
    frames = pack_batch_chunks(big)
    assert len(frames) == 2
    assert [frame[9:10] for frame in frames] == [b"0", b"1"]
    small = [b"s" * 100] * 30
    (one,) = pack_batch_chunks(small, target_bytes=5 + 100 * 30)
    assert len(pack_batch_chunks(small, target_bytes=5 + 100 * 30 - 1)) == 2
    assert len(one) == 4 + 5 + 3000
    assert pack_batch_chunks([]) == []


def test_change_chunk_rejects_one_oversized_change() -> None:
    with pytest.raises(FrameTooLargeError):
        pack_batch_chunks([b"x" * MAX_FRAME_BYTES])


def test_sessions_split_batches_into_chunks_and_apply_each() -> None:
    pair = Pair(chunk_target_bytes=200)
    with pair.a.transaction() as tx:
        for i in range(10):
            tx.execute("INSERT INTO notes VALUES (?, 'a', ?)", (f"n{i}", "x" * 50))
            tx.capture_upsert("notes", (f"n{i}",))
    pair.deliver_to_b()
    pair.deliver_to_a()
    batch = pair.deliver_to_b()
    chunks = [m for m in batch if isinstance(m, BatchChunk)]
    assert len(chunks) > 3
    assert [c.seq for chunk in chunks for c in chunk.changes] == list(range(10))
    assert len(_rows(pair.b)) == 10
    pair.close()


def test_peer_batches_stop_before_exceeding_the_byte_budget() -> None:
    pair = Pair()
    three_mib = "x" * (3 * 1024 * 1024)
    _write(pair.a, "g1", three_mib)
    _write(pair.a, "g2", three_mib)
    pair.deliver_to_b()
    pair.deliver_to_a()
    first = pair.deliver_to_b()
    first_changes = [c for m in first if isinstance(m, BatchChunk) for c in m.changes]
    assert [c.db_version for c in first_changes] == [1]  # the second 3 MiB group is deferred
    pair.deliver_to_a()  # the Ack releases the next batch
    second = pair.deliver_to_b()
    second_changes = [c for m in second if isinstance(m, BatchChunk) for c in m.changes]
    assert [c.db_version for c in second_changes] == [2]
    assert len(_rows(pair.b)) == 2
    pair.close()


def test_batches_take_whole_version_groups_up_to_the_row_limit() -> None:
    pair = Pair()
    group = MAX_BATCH_ROWS * 3 // 4
    for version in (1, 2):
        with pair.a.transaction() as tx:
            tx.executemany(
                "INSERT INTO notes VALUES (?, 'a', 'b')",
                [(f"v{version}-{i}",) for i in range(group)],
            )
            for i in range(group):
                tx.capture_upsert("notes", (f"v{version}-{i}",))
    pair.deliver_to_b()
    pair.deliver_to_a()
    first = pair.deliver_to_b()
    versions = {c.db_version for m in first if isinstance(m, BatchChunk) for c in m.changes}
    assert versions == {1}
    assert pair.b.connection.execute("SELECT COUNT(*) FROM notes").fetchone() == (group,)
    pair.pump()
    assert pair.b.connection.execute("SELECT COUNT(*) FROM notes").fetchone() == (2 * group,)
    pair.close()


def test_schema_mismatch_is_a_clear_error_and_corrupts_nothing() -> None:
    pair = Pair(schema_b=NOTES_V2)
    _write(pair.a, "from-a", "hello")
    _write(pair.b, "from-b", "hi")
    before_a = _clock(pair.a)
    pair.deliver_to_b()  # A's Hello
    with pytest.raises(SchemaConflictError) as conflict:
        pair.deliver_to_a()  # B's Hello and its digest for "notes"
    assert conflict.value.table == "notes"
    assert conflict.value.local_hash == NOTES.schema_hash
    assert conflict.value.peer_hash == NOTES_V2.schema_hash
    assert "notes" in str(conflict.value)
    assert pair.at_a.state is SessionState.FAILED
    assert pair.at_a.error is conflict.value
    with pytest.raises(SessionClosedError):
        pair.at_a.poll()
    # nothing crossed, nothing changed, no frontier moved
    assert _rows(pair.a) == [("from-a", "someone", "hello")]
    assert _rows(pair.b) == [("from-b", "someone", "hi")]
    assert _clock(pair.a) == before_a
    assert all(e.synced_at == 0 for e in pair.a.peer_frontier(PID_B, SITE_B).values())
    # the other side fails the same way when A's digest reaches it
    pair.at_b.receive_data(b"")
    with pytest.raises(SchemaConflictError):
        pair.at_b.receive_data(encode_message(Schema("notes", NOTES.schema_hash)))
    assert _rows(pair.b) == [("from-b", "someone", "hi")]
    pair.close()


def test_a_table_the_peer_lacks_is_a_missing_schema() -> None:
    other = TableSchema(
        "other", "CREATE TABLE IF NOT EXISTS other (id TEXT PRIMARY KEY)", ["id"], ["id"]
    )
    pair = Pair(schema_b=other)
    pair.deliver_to_b()
    with pytest.raises(MissingSchemaError):
        pair.deliver_to_a()
    pair.close()


def test_changes_wait_until_the_peer_announced_their_table() -> None:
    pair = Pair()
    _write(pair.a, "n1", "v1")
    hello_b = encode_message(Hello(SITE_B, SitePublisher.local(SITE_B).scope))
    pair.at_a.receive_data(hello_b)  # B's Hello, without its schema digest
    sent = _decode(pair.at_a.data_to_send())
    assert not any(isinstance(m, BeginBatch | Synchronized) for m in sent)
    pair.at_a.poll()
    assert not any(isinstance(m, BeginBatch) for m in _decode(pair.at_a.data_to_send()))
    pair.at_a.receive_data(encode_message(Schema("notes", NOTES.schema_hash)))
    assert any(isinstance(m, BeginBatch) for m in _decode(pair.at_a.data_to_send()))
    pair.close()


def _fresh_session() -> tuple[Replica, ReplicaSession]:
    replica = Replica(":memory:", [NOTES], site_id=SITE_A)
    session = ReplicaSession(replica, PID_B, SitePublisher.local(SITE_A))
    session.data_to_send()
    return replica, session


def _hello_b() -> bytes:
    return encode_message(Hello(SITE_B, SitePublisher.local(SITE_B).scope))


@pytest.mark.parametrize(
    ("messages", "kind"),
    [
        ([Ack(1)], RemoteProtocolErrorKind.MISSING_HELLO),
        (["hello", "hello"], RemoteProtocolErrorKind.UNEXPECTED_HELLO),
        (["hello", Ack(1)], RemoteProtocolErrorKind.UNEXPECTED_ACK),
        (["hello", BatchChunk(())], RemoteProtocolErrorKind.UNEXPECTED_BATCH),
        (["hello", CommitBatch()], RemoteProtocolErrorKind.UNEXPECTED_BATCH),
        (["hello", BeginBatch(1), BeginBatch(2)], RemoteProtocolErrorKind.UNEXPECTED_BATCH),
        (
            ["hello", BeginBatch(1), Schema("notes", NOTES.schema_hash)],
            RemoteProtocolErrorKind.UNEXPECTED_BATCH,
        ),
        (["hello", BeginBatch(1), Synchronized()], RemoteProtocolErrorKind.UNEXPECTED_BATCH),
        ([Hello(b"short", SiteScope.complement())], RemoteProtocolErrorKind.INVALID_SITE_ID),
        ([Hello(SITE_A, SiteScope.complement())], RemoteProtocolErrorKind.SAME_SITE),
    ],
)
def test_protocol_violations_end_the_session(
    messages: list[Message | str], kind: RemoteProtocolErrorKind
) -> None:
    replica, session = _fresh_session()
    data = b"".join(_hello_b() if m == "hello" else encode_message(m) for m in messages)  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError) as error:
        session.receive_data(data)
    assert error.value.kind is kind
    assert session.state is SessionState.FAILED
    assert not session.is_live
    assert replica.db_version == 0
    # the failed session released its peer slot
    ReplicaSession(replica, PID_B, SitePublisher.local(SITE_A)).close()
    replica.close()


def test_a_batch_chunk_is_applied_as_soon_as_it_arrives() -> None:
    replica, session = _fresh_session()
    change = Change("notes", ("n",), ("n", "x", "y"), 4, SITE_B, 0)
    session.receive_data(_hello_b() + encode_message(BeginBatch(7)))
    session.receive_data(encode_message(BatchChunk((change,))))
    assert session.state is SessionState.IN_BATCH
    assert _rows(replica) == [("n", "x", "y")]
    session.data_to_send()
    session.receive_data(encode_message(CommitBatch()))
    assert Ack(7) in _decode(session.data_to_send())
    assert replica.db_version == 4
    replica.close()


def test_only_one_live_session_per_peer() -> None:
    replica, session = _fresh_session()
    with pytest.raises(DuplicatePeerError):
        ReplicaSession(replica, PID_B, SitePublisher.local(SITE_A))
    other = ReplicaSession(replica, Pid(b"c" * 16), SitePublisher.local(SITE_A))
    session.close()
    ReplicaSession(replica, PID_B, SitePublisher.local(SITE_A)).close()
    other.close()
    with pytest.raises(ValueError, match="another site"):
        ReplicaSession(replica, PID_B, SitePublisher.local(SITE_B))
    replica.close()


def test_clean_end_of_stream_closes_and_truncation_fails() -> None:
    replica, session = _fresh_session()
    session.receive_data(_hello_b())
    session.receive_eof()
    assert session.state is SessionState.CLOSED
    assert session.peer_scope is None
    with pytest.raises(SessionClosedError):
        session.receive_data(b"")
    truncated = ReplicaSession(replica, PID_B, SitePublisher.local(SITE_A))
    truncated.receive_data(_hello_b()[:-2])
    with pytest.raises(TruncatedFrameError):
        truncated.receive_eof()
    assert truncated.state is SessionState.FAILED
    replica.close()


def test_local_scope_changes_are_announced_and_peer_scopes_checked() -> None:
    replica = Replica(":memory:", [NOTES], site_id=SITE_A)
    upstream = SitePublisher.local(SITE_A)
    session = ReplicaSession(replica, PID_B, upstream)
    session.receive_data(encode_message(Hello(SITE_B, SiteScope.complement())))
    session.data_to_send()
    child = bytes([0xC]) * 16
    upstream.set([SITE_A, child])
    session.poll()
    sent = _decode(session.data_to_send())
    assert Scope(SiteScope.explicit(SiteSet(1, [SITE_A, child]))) in sent
    assert session.local_scope == upstream.scope
    # the peer's complement may not switch to an explicit scope mid-session
    with pytest.raises(SiteScopeError):
        session.receive_data(encode_message(Scope(SiteScope.explicit(SiteSet(1, [SITE_B])))))
    replica.close()


def test_peer_scope_updates_are_recorded_and_replays_ignored() -> None:
    replica = Replica(":memory:", [NOTES], site_id=SITE_A)
    session = ReplicaSession(replica, PID_B, SitePublisher.complement(SITE_A))
    session.receive_data(encode_message(Hello(SITE_B, SitePublisher.local(SITE_B).scope)))
    grown = SiteScope.explicit(SiteSet(1, [SITE_B, bytes([0xC]) * 16]))
    session.receive_data(encode_message(Scope(grown)) + encode_message(Scope(grown)))
    assert session.peer_scope == grown
    with pytest.raises(SiteScopeError):
        session.receive_data(encode_message(Scope(SitePublisher.local(SITE_B).scope)))
    replica.close()


def test_sessions_wait_while_the_application_holds_a_transaction() -> None:
    replica, session = _fresh_session()
    change = Change("notes", ("n",), ("n", "x", "y"), 4, SITE_B, 0)
    tx = replica.transaction()
    session.receive_data(
        _hello_b()
        + encode_message(BeginBatch(1))
        + encode_message(BatchChunk((change,)))
        + encode_message(CommitBatch())
    )
    session.poll()
    assert _state(session) is SessionState.AWAIT_HELLO  # nothing handled yet
    assert session.data_to_send() == b""
    tx.rollback()
    session.poll()
    assert _state(session) is SessionState.READY
    assert _rows(replica) == [("n", "x", "y")]
    assert Ack(1) in _decode(session.data_to_send())
    replica.close()


def test_statistics_add_up_and_origin_tuples_are_kept() -> None:
    pair = Pair()
    _write(pair.a, "n", "x")
    pair.pump()
    a, b = pair.at_a.statistics(), pair.at_b.statistics()
    assert a.bytes_sent == b.bytes_received
    assert b.bytes_sent == a.bytes_received
    assert (a.changes_sent, b.changes_received, b.changes_logged, b.changes_applied) == (1, 1, 1, 1)
    # relays keep origin identities: B records A's change under A's own tuple
    assert _clock(pair.b) == [("n", 1, SITE_A, 0, 0)]
    assert _rows(pair.b) == [("n", "someone", "x")]
    pair.close()
