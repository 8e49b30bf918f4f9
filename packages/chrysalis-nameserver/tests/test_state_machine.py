"""The directory against a model under random command sequences (spec 2.1).

The model keeps, per link, what a correct directory must show: the committed entries, the last
publication sequence and the chunks staged so far. Each step checks the command's outcome
against the model where the spec fixes it (delta sequencing, replays, commit results), and
otherwise checks the structural laws: a failed command changes nothing, a visible change bumps
the revision by exactly one and reports exactly the difference, ownership is exclusive.

Issue 15: children also publish their *own* PIDs, and relay the PIDs of other children. The
owner on its own link wins over a relayed entry (which is dropped, its later removal a no-op),
an entry relayed for a PID whose owner is linked is dropped, and admitting a child that already
has a link supersedes the old link (its entries revoked). The accounted bytes always equal the
sum of ``entry_cost`` over the visible (and the staged) entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver import (
    AdmitLink,
    AppendSnapshotChunk,
    ApplyDelta,
    ApplyEffects,
    ApplyError,
    ApplyErrorKind,
    BeginSnapshot,
    CommitSnapshot,
    DirectoryCommand,
    Nameserver,
    ProcEntry,
    PublicationAck,
    RemoveLink,
    ResnapshotRequired,
    entry_cost,
)

AUTH = Pid(b"\xaa" * 16)
LINKS = [LinkId(bytes([n]) * 16) for n in (1, 2, 3)]
CHILDREN = [Pid(bytes([0xC0 + n]) * 16) for n in (1, 2, 3)]
PIDS = [Pid(bytes([n]) * 16) for n in range(1, 7)]
K = ApplyErrorKind

entries = st.builds(
    ProcEntry,
    st.sampled_from([*PIDS * 4, *CHILDREN * 2, CHILDREN[2], CHILDREN[2], AUTH]),
    st.sampled_from(["a", "b"]),
)
_unique = st.lists(entries, max_size=3, unique_by=lambda e: e.pid).map(tuple)
entry_lists = st.one_of(_unique, _unique, _unique, st.lists(entries, max_size=3).map(tuple))
links = st.sampled_from([*LINKS[:2] * 4, LINKS[2]])


@dataclass
class LinkModel:
    child: Pid
    committed: dict[Pid, ProcEntry] = field(default_factory=dict)
    sequence: int | None = None
    staging: tuple[int, int] | None = None  # (snapshot id, base)
    staged: list[tuple[ProcEntry, ...]] = field(default_factory=list)
    last_snapshot: tuple[int, int] | None = None  # (id, chunks) when the last commit was one
    dropped: set[Pid] = field(default_factory=set)  # relayed claims dropped for their owner


class DirectoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ns = Nameserver(AUTH)
        self.model: dict[LinkId, LinkModel] = {}
        self.revision = 0

    # -- helpers ----------------------------------------------------------------------------

    def visible(self) -> dict[Pid, ProcEntry]:
        out: dict[Pid, ProcEntry] = {}
        for state in self.model.values():
            out.update(state.committed)
        return out

    def link_of(self, child: Pid) -> LinkId | None:
        return next((k for k, v in self.model.items() if v.child == child), None)

    def linked_elsewhere(self, state: LinkModel, pid: Pid) -> bool:
        """``pid`` is the child of another link: relaying it is dropped."""
        return pid != state.child and any(
            other.child == pid for other in self.model.values() if other is not state
        )

    def relay_conflict(self, state: LinkModel, pid: Pid) -> bool:
        """``pid`` is relayed and another link shows it."""
        if pid == state.child or self.linked_elsewhere(state, pid):
            return False
        return any(pid in other.committed for other in self.model.values() if other is not state)

    def keep(self, state: LinkModel, entry: ProcEntry) -> None:
        """``state`` now shows ``entry``: the owner takes over a relayed one."""
        for other in self.model.values():
            if other is not state and entry.pid in other.committed:
                assert entry.pid == state.child
                del other.committed[entry.pid]
                other.dropped.add(entry.pid)
        state.committed[entry.pid] = entry

    def run(self, command: DirectoryCommand) -> ApplyEffects | ApplyError:
        before = (self.ns.snapshot(), self.ns.revision, dict(self.ns.child_links()))
        owners = {e.pid: self.ns.owner(e.pid) for e in before[0]}
        try:
            effects = self.ns.apply(command)
        except ApplyError as exc:
            assert (self.ns.snapshot(), self.ns.revision, dict(self.ns.child_links())) == before
            return exc
        after = {e.pid: e for e in self.ns.snapshot()}
        old = {e.pid: e for e in before[0]}
        change = effects.directory_change
        if change is None:
            assert after == old
            assert self.ns.revision == before[1]
        else:
            self.revision += 1
            assert self.ns.revision.value == before[1].value + 1
            assert change.revision == self.ns.revision
            if isinstance(command, AdmitLink):
                assert change.link == effects.superseded
            else:
                assert change.link == command.link
            assert change.upserts == tuple(
                after[p]
                for p in sorted(after)
                if old.get(p) != after[p] or owners.get(p) != self.ns.owner(p)
            )
            assert change.removals == tuple(sorted(set(old) - set(after)))
            assert change.upserts or change.removals
        return effects

    # -- rules ------------------------------------------------------------------------------

    @initialize()
    def admit_two_links(self) -> None:
        self.admit(0, 0)
        self.admit(1, 1)

    @rule(
        link=links,
        snapshot=st.integers(1, 3),
        base=st.integers(0, 4),
        chunks=st.lists(_unique, max_size=2),
    )
    def publish_snapshot(
        self, link: LinkId, snapshot: int, base: int, chunks: list[tuple[ProcEntry, ...]]
    ) -> None:
        self.begin(link, snapshot, base)
        for index, chunk in enumerate(chunks):
            self.append(link, snapshot, index, chunk)
        self.commit(link, snapshot, len(chunks))

    @rule(name=st.sampled_from(["a", "b", "owner"]))
    def owner_links_and_publishes(self, name: str) -> None:
        """The third child (often relayed by the others) links and publishes itself: its
        own entry is what the directory shows, whoever relayed it before."""
        self.admit(2, 2)
        state = self.model.get(LINKS[2])
        if state is None or state.child != CHILDREN[2]:
            return
        used = {state.last_snapshot[0] if state.last_snapshot else 0}
        used.add(state.staging[0] if state.staging else 0)
        snapshot = min({1, 2, 3} - used)
        mine = ProcEntry(CHILDREN[2], name)
        self.publish_snapshot(LINKS[2], snapshot, state.sequence or 0, [(mine,)])
        assert self.ns.get(CHILDREN[2]) == mine
        assert self.ns.owner(CHILDREN[2]) == LINKS[2]

    @rule(relay=st.sampled_from(LINKS[:2]), name=st.sampled_from(["a", "owner"]))
    def squat_then_owner_arrives(self, relay: LinkId, name: str) -> None:
        """Another child publishes the third child's PID before it links (a pre-issued
        identity, a restarting node); then the owner links and publishes itself."""
        if self.link_of(CHILDREN[2]) is None and relay in self.model:
            if self.model[relay].sequence is None:
                self.publish_snapshot(relay, 1, 0, [])
            self.delta(relay, 1, (ProcEntry(CHILDREN[2], "forged"),), ())
        self.owner_links_and_publishes(name)

    @rule(index=st.integers(0, 2), child_index=st.integers(0, 2))
    def admit(self, index: int, child_index: int) -> None:
        link, child = LINKS[index], CHILDREN[child_index]
        result = self.run(AdmitLink(link, child))
        existing = self.model.get(link)
        if existing is not None:
            if existing.child == child:
                assert isinstance(result, ApplyEffects)
                assert result.is_empty
            else:
                assert isinstance(result, ApplyError)
                assert result.kind is K.LINK_ALREADY_EXISTS
        elif (
            old := next((k for k, v in self.model.items() if v.child == child), None)
        ) is not None:
            # A second connection of the same child supersedes the first one.
            assert isinstance(result, ApplyEffects)
            assert result.superseded == old
            assert result.link_response is None
            revoked = self.model.pop(old).committed
            assert (result.directory_change is not None) == bool(revoked)
            self.model[link] = LinkModel(child)
        else:
            assert isinstance(result, ApplyEffects)
            assert result.is_empty
            self.model[link] = LinkModel(child)

    @rule(link=links, snapshot=st.integers(1, 3), base=st.integers(0, 4))
    def begin(self, link: LinkId, snapshot: int, base: int) -> None:
        result = self.run(BeginSnapshot(link, snapshot, base))
        state = self.model.get(link)
        if state is None:
            assert isinstance(result, ApplyError)
            assert result.kind is K.UNKNOWN_LINK
            return
        if state.staging is not None and state.staging[0] == snapshot:
            if state.staging[1] == base:
                assert isinstance(result, ApplyEffects)
                assert result.is_empty
            else:
                assert isinstance(result, ApplyError)
                assert result.kind is K.CONFLICTING_REPLAY
            return
        last = state.last_snapshot
        if state.sequence == base and last is not None and last[0] == snapshot:
            assert isinstance(result, ApplyEffects)
            assert result.is_empty
            return
        if state.sequence is not None and base < state.sequence:
            assert isinstance(result, ApplyError)
            assert result.kind is K.STALE_PUBLICATION_SEQUENCE
            assert (result.expected, result.actual) == (state.sequence, base)
            return
        assert isinstance(result, ApplyEffects)
        assert result.is_empty
        state.staging = (snapshot, base)
        state.staged = []

    @rule(link=links, snapshot=st.integers(1, 3), chunk=st.integers(0, 2), items=entry_lists)
    def append(self, link: LinkId, snapshot: int, chunk: int, items: tuple[ProcEntry, ...]) -> None:
        result = self.run(AppendSnapshotChunk(link, snapshot, chunk, items))
        state = self.model.get(link)
        if isinstance(result, ApplyError):
            return
        assert state is not None
        assert state.staging is not None
        assert state.staging[0] == snapshot
        assert result.is_empty
        if chunk == len(state.staged):
            state.staged.append(items)
        else:
            assert state.staged[chunk] == items

    @rule(link=links, snapshot=st.integers(1, 3), chunks=st.integers(0, 3))
    def commit(self, link: LinkId, snapshot: int, chunks: int) -> None:
        result = self.run(CommitSnapshot(link, snapshot, chunks))
        state = self.model.get(link)
        if state is None:
            assert isinstance(result, ApplyError)
            assert result.kind is K.UNKNOWN_LINK
            return
        if state.staging is None:
            if state.last_snapshot == (snapshot, chunks):
                assert result == ApplyEffects(None, PublicationAck(state.sequence or 0))
            else:
                assert isinstance(result, ApplyError)
                assert result.kind is K.WRONG_SNAPSHOT
            return
        if state.staging[0] != snapshot:
            assert isinstance(result, ApplyError)
            assert result.kind is K.WRONG_SNAPSHOT
            return
        if chunks != len(state.staged):
            assert isinstance(result, ApplyError)
            assert result.kind is K.INCOMPLETE_SNAPSHOT
            return
        staged = {e.pid: e for chunk in state.staged for e in chunk}
        if any(self.relay_conflict(state, pid) for pid in staged):
            assert isinstance(result, ApplyError)
            assert result.kind is K.PID_OWNED_BY_ANOTHER_LINK
            return
        base = state.staging[1]
        assert isinstance(result, ApplyEffects)
        assert result.link_response == PublicationAck(base)
        state.committed = {}
        state.dropped = set()
        for pid, entry in staged.items():
            if self.linked_elsewhere(state, pid):
                state.dropped.add(pid)
            else:
                self.keep(state, entry)
        state.sequence = base
        state.last_snapshot = (snapshot, chunks)
        state.staging = None
        state.staged = []

    @rule(
        link=links,
        offset=st.sampled_from([-1, 0, 1, 1, 1, 1, 1, 1, 2]),
        upserts=entry_lists,
        removals=st.lists(st.sampled_from(PIDS), max_size=2).map(tuple),
    )
    def delta(
        self,
        link: LinkId,
        offset: int,
        upserts: tuple[ProcEntry, ...],
        removals: tuple[Pid, ...],
    ) -> None:
        known = self.model.get(link)
        current = known.sequence if known is not None and known.sequence is not None else 0
        sequence = max(0, current + offset)
        result = self.run(ApplyDelta(link, sequence, upserts, removals))
        state = self.model.get(link)
        if state is None:
            assert isinstance(result, ApplyError)
            return
        valid_upserts = len({e.pid for e in upserts}) == len(upserts) and all(
            e.pid != AUTH for e in upserts
        )
        if not valid_upserts:
            assert isinstance(result, ApplyError)
            assert result.kind in (K.DUPLICATE_PID, K.AUTHORITY_PID)
            return
        if state.staging is not None:
            assert isinstance(result, ApplyError)
            assert result.kind is K.SNAPSHOT_IN_PROGRESS
            return
        if state.sequence is None:
            assert result == ApplyEffects(None, ResnapshotRequired(0))
            return
        current = state.sequence
        if sequence <= current:
            if isinstance(result, ApplyError):
                assert result.kind is K.CONFLICTING_REPLAY
                assert sequence == current
            else:
                assert result == ApplyEffects(None, PublicationAck(current))
            return
        if sequence != current + 1:
            assert result == ApplyEffects(None, ResnapshotRequired(current + 1))
            return
        legal = (
            len(set(removals)) == len(removals)
            and not {e.pid for e in upserts} & set(removals)
            and not any(self.relay_conflict(state, e.pid) for e in upserts)
            and set(removals) <= set(state.committed) | state.dropped
        )
        if isinstance(result, ApplyError):
            assert result.kind in (
                K.DUPLICATE_PID,
                K.PID_BOTH_UPSERTED_AND_REMOVED,
                K.PID_OWNED_BY_ANOTHER_LINK,
                K.PID_NOT_OWNED_BY_LINK,
            )
            assert not legal
            return
        assert legal
        assert result.link_response == PublicationAck(sequence)
        for pid in removals:
            state.committed.pop(pid, None)
            state.dropped.discard(pid)
        for entry in upserts:
            if self.linked_elsewhere(state, entry.pid):
                state.dropped.add(entry.pid)
            else:
                state.dropped.discard(entry.pid)
                self.keep(state, entry)
        state.sequence = sequence
        state.last_snapshot = None

    @rule(link=links, roll=st.integers(0, 3))
    def remove(self, link: LinkId, roll: int) -> None:
        if roll:
            return  # removals are rarer than publications
        result = self.run(RemoveLink(link))
        assert isinstance(result, ApplyEffects)
        assert result.link_response is None
        self.model.pop(link, None)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def directory_matches_model(self) -> None:
        assert {e.pid: e for e in self.ns.snapshot()} == self.visible()
        assert self.ns.revision.value == self.revision

    @invariant()
    def ownership_is_exclusive_and_consistent(self) -> None:
        for link, state in self.model.items():
            assert self.ns.link_pids(link) == frozenset(state.committed)
            assert self.ns.link_sequence(link) == state.sequence
            for pid in state.committed:
                assert self.ns.owner(pid) == link
        assert dict(self.ns.child_links()) == {s.child: link for link, s in self.model.items()}
        assert AUTH not in self.ns
        assert Pid.LINK_LOCAL not in self.ns

    @invariant()
    def accounted_bytes_match_the_entries(self) -> None:
        assert self.ns.bytes_used == sum(entry_cost(e) for e in self.ns.snapshot())
        staged = sum(
            entry_cost(e) for s in self.model.values() for chunk in s.staged for e in chunk
        )
        assert self.ns.staged_bytes == staged


DirectoryMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=30, deadline=None
)
TestDirectoryMachine = DirectoryMachine.TestCase
