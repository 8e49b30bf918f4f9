"""The directory against a model under random command sequences (spec 2.1).

The model keeps, per link, what a correct directory must show: the committed entries, the last
publication sequence and the chunks staged so far. Each step checks the command's outcome
against the model where the spec fixes it (delta sequencing, replays, commit results), and
otherwise checks the structural laws: a failed command changes nothing, a visible change bumps
the revision by exactly one and reports exactly the difference, ownership is exclusive.
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
)

AUTH = Pid(b"\xaa" * 16)
LINKS = [LinkId(bytes([n]) * 16) for n in (1, 2, 3)]
CHILDREN = [Pid(bytes([0xC0 + n]) * 16) for n in (1, 2, 3)]
PIDS = [Pid(bytes([n]) * 16) for n in range(1, 7)]
K = ApplyErrorKind

entries = st.builds(ProcEntry, st.sampled_from([*PIDS * 6, AUTH]), st.sampled_from(["a", "b"]))
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

    def run(self, command: DirectoryCommand) -> ApplyEffects | ApplyError:
        before = (self.ns.snapshot(), self.ns.revision, dict(self.ns.child_links()))
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
            assert change.link == command.link
            assert change.upserts == tuple(
                after[p] for p in sorted(after) if old.get(p) != after[p]
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
        elif any(state.child == child for state in self.model.values()):
            assert isinstance(result, ApplyError)
            assert result.kind is K.CHILD_ALREADY_LINKED
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
        others = {p for other in self.model.values() if other is not state for p in other.committed}
        if staged.keys() & others:
            assert isinstance(result, ApplyError)
            assert result.kind is K.PID_OWNED_BY_ANOTHER_LINK
            return
        base = state.staging[1]
        assert isinstance(result, ApplyEffects)
        assert result.link_response == PublicationAck(base)
        state.committed = staged
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
        if isinstance(result, ApplyError):
            owners = {
                p for other in self.model.values() if other is not state for p in other.committed
            }
            assert result.kind in (
                K.DUPLICATE_PID,
                K.PID_BOTH_UPSERTED_AND_REMOVED,
                K.PID_OWNED_BY_ANOTHER_LINK,
                K.PID_NOT_OWNED_BY_LINK,
            )
            legal = (
                len(set(removals)) == len(removals)
                and not {e.pid for e in upserts} & set(removals)
                and not {e.pid for e in upserts} & owners
                and set(removals) <= set(state.committed)
            )
            assert not legal
            return
        assert result.link_response == PublicationAck(sequence)
        for pid in removals:
            del state.committed[pid]
        for entry in upserts:
            state.committed[entry.pid] = entry
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


DirectoryMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=30, deadline=None
)
TestDirectoryMachine = DirectoryMachine.TestCase
