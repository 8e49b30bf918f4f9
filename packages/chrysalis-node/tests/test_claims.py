"""The claim protocol (``chrysalis.node._claims``): unit tests of each rule and a model-based
test (hypothesis ``RuleBasedStateMachine``) of claims, restarts, duplicate deliveries, lost
nodes and cancels. Pure: no sockets, no clock; the time is a counter."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from chrysalis.node._claims import (
    CLAIM_TRANSITIONS,
    MAX_EXPERIMENTS,
    TERMINAL,
    ClaimEvent,
    ClaimRecord,
    ClaimState,
    ExperimentLedger,
    ExperimentSpec,
    LedgerError,
    Liveness,
    LossVerdict,
    NodeRecord,
    NodeState,
    Record,
    ResultRecord,
    StaleClaimError,
    Work,
    select_nodes,
)

PIDS = [f"{i:032x}" for i in (0xA1, 0xB2, 0xC3, 0xD4)]
NAMES = ["e1", "e2", "e3"]


def _node(pid: str, rank: int = 0) -> NodeRecord:
    return NodeRecord(pid, 0, rank, "", 0, 0, "root", "udp", "udp://127.0.0.1:1", "", 1.0)


def _ok(work: ClaimRecord, destinations: tuple[str, ...]) -> list[ResultRecord]:
    return [
        ResultRecord(work.experiment, work.source, d, "ok", 3, 3, 0.01, 1.0, 2.0, 2.0, 1.2, 2.0)
        for d in destinations
    ]


def _ledger(*pids: str) -> ExperimentLedger:
    ledger = ExperimentLedger()
    for rank, pid in enumerate(pids):
        ledger.register(_node(pid, rank), now=1.0)
    return ledger


def _claimed(a: str, b: str) -> tuple[ExperimentLedger, Work]:
    """A ledger of ``a`` and ``b`` where ``a`` claimed experiment e1 (``a`` to ``b``)."""
    ledger = _ledger(a, b)
    ledger.submit(ExperimentSpec("e1"), [a], [b], submitted_by=b, now=2.0)
    work, _ = ledger.next_work(a, 3.0)
    assert work is not None
    return ledger, work


# -- unit tests --------------------------------------------------------------------------------


def test_a_node_claims_its_work_once_and_a_duplicate_poll_writes_nothing() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    ledger.submit(ExperimentSpec("e1"), [a], [a, b], submitted_by=b, now=2.0)
    assert ledger.next_work(b, 3.0)[0] is None  # b is no source
    work, decision = ledger.next_work(a, 3.0)
    assert work is not None
    assert work.destinations == (b,)
    assert [type(r) for r in decision.records] == [ClaimRecord]
    again, nothing = ledger.next_work(a, 4.0)
    assert again == work
    assert not nothing
    assert ledger.status("e1") == "running"


def test_a_claim_survives_a_restart_and_fences_the_old_incarnation() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    ledger.submit(ExperimentSpec("e1"), [a], [b], submitted_by=a, now=2.0)
    old, _ = ledger.next_work(a, 3.0)
    assert old is not None
    ledger.start(old.claim, 3.5)
    ledger.register(_node(a), now=4.0)  # restart, same PID
    assert ledger.nodes[a].incarnation == 2
    new, decision = ledger.next_work(a, 5.0)
    assert new is not None
    assert new.resumed
    assert decision
    assert (new.claim.attempt, new.claim.claimed_at, new.claim.incarnation) == (2, 3.0, 2)
    with pytest.raises(StaleClaimError, match="now attempt 2 of incarnation 2"):
        ledger.finish(old.claim, _ok(old.claim, (b,)), 6.0)
    ledger.start(new.claim, 6.0)
    ledger.finish(new.claim, _ok(new.claim, (b,)), 7.0)
    assert ledger.status("e1") == "done"
    with pytest.raises(LedgerError, match="already ended"):
        ledger.cancel("e1", 7.5)
    assert not ledger.finish(new.claim, _ok(new.claim, (b,)), 8.0)  # a duplicate report


def test_a_lost_source_fails_claimed_and_unclaimed_work() -> None:
    a, b, c = PIDS[:3]
    ledger = _ledger(a, b, c)
    ledger.submit(ExperimentSpec("e1"), [a, b], [c], submitted_by=c, now=2.0)
    work, _ = ledger.next_work(a, 3.0)
    assert work is not None
    decision = ledger.node_lost(a, 4.0, "exit status -9")
    ledger.node_lost(b, 4.0)
    states = {(c.source, c.state, c.error) for c in ledger.claims.values()}
    assert states == {
        (a, ClaimState.FAILED, "exit status -9"),
        (b, ClaimState.FAILED, "its node was lost"),
    }
    assert any(isinstance(r, NodeRecord) and r.state is NodeState.LOST for r in decision.records)
    assert ledger.status("e1") == "failed"
    with pytest.raises(StaleClaimError):
        ledger.start(work.claim, 5.0)


def test_a_lost_node_that_returns_claims_new_work_and_its_old_failure_stands() -> None:
    a, b = PIDS[:2]
    ledger, old = _claimed(a, b)
    ledger.start(old.claim, 4.0)
    ledger.node_lost(a, 5.0, "its node left the namespace")
    with pytest.raises(LedgerError, match="is lost, not live"):  # no new work while lost
        ledger.submit(ExperimentSpec("e2"), [a], [b], submitted_by=b, now=6.0)
    with pytest.raises(LedgerError, match="not registered as live"):
        ledger.next_work(a, 6.0)
    decision = ledger.node_returned(a, 7.0, "it is resolvable at the root again")
    node = ledger.nodes[a]
    assert decision.records == (node,)
    assert (node.state, node.incarnation, node.losses) == (NodeState.LIVE, 1, 1)
    assert (node.lost_at, node.lost_reason) == (5.0, "its node left the namespace")
    assert (node.returned_at, node.returned_reason) == (7.0, "it is resolvable at the root again")
    assert not ledger.node_returned(a, 8.0)  # a duplicate report: nothing written
    # the failure of its pre-loss work is not retracted; that claim's reports are refused
    failed = ledger.claims[("e1", a)]
    assert (failed.state, failed.error) == (ClaimState.FAILED, "its node left the namespace")
    with pytest.raises(StaleClaimError):
        ledger.finish(old.claim, _ok(old.claim, (b,)), 9.0)
    with pytest.raises(StaleClaimError):
        ledger.start(old.claim, 9.0)
    with pytest.raises(StaleClaimError):
        ledger.fail(old.claim, "late", 9.0)
    nothing, decision = ledger.next_work(a, 9.0)  # e1 is not retried
    assert nothing is None
    assert not decision
    assert ledger.claims[("e1", a)] == failed
    assert ledger.status("e1") == "failed"
    # new work addressed to it is claimed as usual, by the same incarnation
    ledger.submit(ExperimentSpec("e2"), [a], [b], submitted_by=b, now=10.0)
    new, _ = ledger.next_work(a, 11.0)
    assert new is not None
    assert (new.experiment.name, new.claim.incarnation, new.claim.attempt) == ("e2", 1, 1)
    ledger.start(new.claim, 12.0)
    ledger.finish(new.claim, _ok(new.claim, (b,)), 13.0)
    assert ledger.status("e2") == "done"
    with pytest.raises(StaleClaimError):  # still refused after the new work ran
        ledger.finish(old.claim, _ok(old.claim, (b,)), 14.0)


def test_a_node_lost_twice_records_each_loss_and_return() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    ledger.node_lost(a, 2.0, "first")
    ledger.node_returned(a, 3.0, "back once")
    ledger.submit(ExperimentSpec("e1"), [a], [b], submitted_by=b, now=4.0)
    work, _ = ledger.next_work(a, 5.0)
    assert work is not None
    ledger.node_lost(a, 6.0, "second")
    assert ledger.node_lost(a, 6.5, "again") == ledger.node_lost(a, 6.5, "again")  # no-op
    node = ledger.nodes[a]
    assert (node.state, node.losses, node.lost_at, node.lost_reason) == (
        NodeState.LOST,
        2,
        6.0,
        "second",
    )
    assert (node.returned_at, node.returned_reason) == (3.0, "back once")
    assert ledger.claims[("e1", a)].error == "second"
    ledger.node_returned(a, 7.0, "back twice")
    node = ledger.nodes[a]
    assert (node.state, node.losses, node.returned_at) == (NodeState.LIVE, 2, 7.0)
    with pytest.raises(StaleClaimError):
        ledger.start(work.claim, 8.0)


def test_a_loss_verdict_wins_over_the_sources_rows_in_any_order() -> None:
    a, b = PIDS[:2]
    ledger, work = _claimed(a, b)
    base: list[Record] = [*ledger.nodes.values(), *ledger.experiments.values()]
    base += ledger.targets.values()
    (verdict,) = [r for r in ledger.node_lost(a, 4.0, "lost").records if isinstance(r, LossVerdict)]
    # what the cut-off source wrote meanwhile: its claim done, with its results
    stale: list[Record] = [*_ok(work.claim, (b,))]
    stale.append(replace(work.claim, state=ClaimState.DONE, updated_at=5.0))
    first = ExperimentLedger.from_records([*base, verdict, *stale])
    second = ExperimentLedger.from_records([*base, *stale, verdict])
    assert first == second
    assert first.claims[("e1", a)] == verdict.claim
    assert (verdict.claim.state, first.results) == (ClaimState.FAILED, {})
    assert first.status("e1") == "failed"


def test_a_lost_node_registering_again_returns_as_a_new_incarnation() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    ledger.node_lost(a, 2.0, "exit status -9")
    # whatever history a caller passes, the ledger keeps its own
    ledger.register(replace(_node(a), losses=9, returned_reason="made up"), 3.0)
    node = ledger.nodes[a]
    assert (node.state, node.incarnation, node.losses) == (NodeState.LIVE, 2, 1)
    assert (node.returned_at, node.returned_reason) == (3.0, "registered again as incarnation 2")
    ledger.register(_node(a), 4.0)  # a restart of a live node is no return
    assert (ledger.nodes[a].incarnation, ledger.nodes[a].returned_at) == (3, 3.0)
    (again,) = ledger.register(replace(_node(b), losses=3), 5.0).records
    assert isinstance(again, NodeRecord)
    assert again.losses == 0  # its own history: never lost


def test_only_a_lost_node_returns() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a)
    with pytest.raises(LedgerError, match="not registered"):
        ledger.node_returned(b, 2.0)
    ledger.node_stopped(a, 2.0)
    with pytest.raises(LedgerError, match="is stopped, not lost"):
        ledger.node_returned(a, 3.0)
    with pytest.raises(LedgerError, match="not a PID"):
        ledger.node_returned("a1", 3.0)


def test_cancel_ends_open_pairs_and_refuses_late_results() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    ledger.submit(ExperimentSpec("e1"), [a, b], [a, b], submitted_by=a, now=2.0)
    work, _ = ledger.next_work(a, 3.0)
    assert work is not None
    ledger.cancel("e1", 4.0)
    assert ledger.status("e1") == "cancelled"
    assert {c.state for c in ledger.claims.values()} == {ClaimState.CANCELLED}
    with pytest.raises(StaleClaimError, match="cancelled"):
        ledger.start(work.claim, 5.0)
    assert not ledger.cancel("e1", 6.0)


def test_a_claim_made_before_a_cancel_arrived_is_cancelled_at_the_next_poll() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    ledger.submit(ExperimentSpec("e1"), [a], [b], submitted_by=a, now=2.0)
    work, _ = ledger.next_work(a, 3.0)
    assert work is not None
    # the admin's replica cancelled before the claim reached it: its cancel row wins the
    # experiment, the node's claim row wins the claim
    ledger.absorb([replace(ledger.experiments["e1"], cancelled_at=3.5)])
    with pytest.raises(StaleClaimError, match="was cancelled"):
        ledger.start(work.claim, 3.8)
    assert ledger.next_work(a, 4.0)[0] is None
    assert ledger.claims[("e1", a)].state is ClaimState.CANCELLED


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "no spaces"}, "experiment name"),
        ({"kind": "bogus"}, "unknown experiment kind"),
        ({"payload": 2**21}, "payload must be"),  # an echo holds at most 1 MiB
        ({"kind": "stream-transfer", "payload": 2**30 + 1}, "payload must be"),
        ({"count": 0}, "count must be"),
        ({"concurrency": 0}, "concurrency must be"),
        ({"timeout": 0.0}, "timeout must be"),
    ],
)
def test_specs_are_checked(change: dict[str, object], message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        ExperimentSpec(**{"name": "ok", **change})  # type: ignore[arg-type]


def test_submit_checks_targets_and_names() -> None:
    a, b, c = PIDS[:3]
    ledger = _ledger(a, b)
    spec = ExperimentSpec("e1")
    with pytest.raises(LedgerError, match="not a registered node"):
        ledger.submit(spec, [a], [c], submitted_by=a, now=2.0)
    with pytest.raises(LedgerError, match="twice"):
        ledger.submit(spec, [a, a], [b], submitted_by=a, now=2.0)
    with pytest.raises(LedgerError, match="nothing to measure"):
        ledger.submit(spec, [a], [a], submitted_by=a, now=2.0)
    with pytest.raises(LedgerError, match="not a PID"):
        ledger.submit(spec, ["A1"], [b], submitted_by=a, now=2.0)
    assert ledger.submit(spec, [a], [b], submitted_by=a, now=2.0)
    assert not ledger.submit(spec, [a], [b], submitted_by=a, now=3.0)  # delivered twice
    with pytest.raises(LedgerError, match="exists already"):
        ledger.submit(spec, [b], [a], submitted_by=a, now=3.0)


def test_the_ledger_is_bounded() -> None:
    a, b = PIDS[:2]
    ledger = _ledger(a, b)
    for i in range(MAX_EXPERIMENTS):
        ledger.submit(ExperimentSpec(f"x{i}"), [a], [b], submitted_by=a, now=2.0)
    with pytest.raises(LedgerError, match="experiments already"):
        ledger.submit(ExperimentSpec("one-more"), [a], [b], submitted_by=a, now=2.0)


def test_every_transition_leaves_an_open_state_or_ends() -> None:
    for (state, event), target in CLAIM_TRANSITIONS.items():
        assert state not in TERMINAL
        if event in (ClaimEvent.LOSE, ClaimEvent.CANCEL, ClaimEvent.FAIL):
            assert target in TERMINAL
    assert all((s, e) not in CLAIM_TRANSITIONS for s in TERMINAL for e in ClaimEvent)


# -- the model ----------------------------------------------------------------------------------


class ClaimModel(RuleBasedStateMachine):
    """Random registrations, restarts, submissions, polls (often twice), starts, finishes
    (often twice, sometimes from a stale holder), losses, returns from a loss (seen again,
    or registered again) and cancels against one ledger.
    Every decision is also delivered, each twice, to a second ledger (a replica), which
    must end identical."""

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = ExperimentLedger()
        self.replica = ExperimentLedger()
        self.now = 1.0
        self.first_claim: dict[tuple[str, str], float] = {}
        self.failed_at_loss: dict[tuple[str, str], ClaimRecord] = {}
        self.losses: dict[str, int] = {}

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def _deliver(self, decision: object) -> None:
        records = getattr(decision, "records", ())
        self.replica.absorb(records)
        self.replica.absorb(records)  # a duplicate delivery changes nothing

    @rule(pid=st.sampled_from(PIDS))
    def register(self, pid: str) -> None:
        before = self.ledger.nodes.get(pid)
        self._deliver(self.ledger.register(_node(pid, PIDS.index(pid)), self._tick()))
        after = self.ledger.nodes[pid]
        assert after.incarnation == (1 if before is None else before.incarnation + 1)

    @rule(
        name=st.sampled_from(NAMES),
        sources=st.lists(st.sampled_from(PIDS), min_size=1, max_size=3, unique=True),
        destinations=st.lists(st.sampled_from(PIDS), min_size=1, max_size=3, unique=True),
        payload=st.integers(0, 4),
    )
    def submit(self, name: str, sources: list[str], destinations: list[str], payload: int) -> None:
        spec = ExperimentSpec(name, payload=payload)
        try:
            decision = self.ledger.submit(
                spec, sources, destinations, submitted_by=PIDS[0], now=self._tick()
            )
        except LedgerError:
            return
        self._deliver(decision)
        # a duplicate delivery of the same submission is a no-op
        assert not self.ledger.submit(
            spec, sources, destinations, submitted_by=PIDS[0], now=self.now
        )

    @rule(target=held, pid=st.sampled_from(PIDS), twice=st.booleans())
    def poll(self, pid: str, twice: bool) -> object:
        node = self.ledger.nodes.get(pid)
        if node is None or node.state is not NodeState.LIVE:
            with pytest.raises(LedgerError):
                self.ledger.next_work(pid, self._tick())
            return multiple()
        work, decision = self.ledger.next_work(pid, self._tick())
        self._deliver(decision)
        if work is None:
            return multiple()
        claim = work.claim
        key = (claim.experiment, claim.source)
        assert claim.source == pid
        assert pid not in work.destinations
        assert claim.incarnation == node.incarnation
        assert self.first_claim.setdefault(key, claim.claimed_at) == claim.claimed_at
        if twice:
            again, nothing = self.ledger.next_work(pid, self._tick())
            assert again is not None
            assert (again.claim, again.destinations) == (claim, work.destinations)
            assert not nothing
        return (claim, work.destinations)

    @rule(pid=st.sampled_from(PIDS))
    def run_to_completion(self, pid: str) -> None:
        node = self.ledger.nodes.get(pid)
        if node is None or node.state is not NodeState.LIVE:
            return
        work, decision = self.ledger.next_work(pid, self._tick())
        self._deliver(decision)
        if work is not None:
            key = (work.claim.experiment, pid)
            assert self.first_claim.setdefault(key, work.claim.claimed_at) == work.claim.claimed_at
            if work.claim.state is ClaimState.CLAIMED:
                self._deliver(self.ledger.start(work.claim, self._tick()))
            results = _ok(work.claim, work.destinations)
            self._deliver(self.ledger.finish(work.claim, results, self._tick()))
            assert self.ledger.claims[(work.claim.experiment, pid)].state is ClaimState.DONE

    @rule(held=held)
    def start(self, held: tuple[ClaimRecord, tuple[str, ...]]) -> None:
        claim, _ = held
        try:
            self._deliver(self.ledger.start(claim, self._tick()))
        except StaleClaimError:
            current = self.ledger.claims[(claim.experiment, claim.source)]
            assert current.state is not ClaimState.CLAIMED or (
                current.incarnation,
                current.attempt,
            ) != (claim.incarnation, claim.attempt)

    @rule(held=consumes(held), twice=st.booleans())
    def finish(self, held: tuple[ClaimRecord, tuple[str, ...]], twice: bool) -> None:
        claim, destinations = held
        results = _ok(claim, destinations)
        try:
            self._deliver(self.ledger.finish(claim, results, self._tick()))
        except StaleClaimError:
            current = self.ledger.claims[(claim.experiment, claim.source)]
            same = (current.incarnation, current.attempt) == (claim.incarnation, claim.attempt)
            assert not same or current.state is not ClaimState.RUNNING
            return
        if twice:
            assert not self.ledger.finish(claim, results, self._tick())

    @rule(pid=st.sampled_from(PIDS), clean=st.booleans())
    def lose(self, pid: str, clean: bool) -> None:
        before = self.ledger.nodes.get(pid)
        down = self.ledger.node_stopped if clean else self.ledger.node_lost
        decision = down(pid, self._tick())
        self._deliver(decision)
        for (_name, source), claim in self.ledger.claims.items():
            if source == pid:
                assert claim.state in TERMINAL
        if not clean:
            for record in decision.records:
                assert not isinstance(record, ClaimRecord)  # a loss writes verdicts
                if isinstance(record, LossVerdict):
                    claim = record.claim
                    self.failed_at_loss[(claim.experiment, claim.source)] = claim
            if before is not None and before.state is NodeState.LIVE:
                self.losses[pid] = self.losses.get(pid, 0) + 1

    @rule(pid=st.sampled_from(PIDS))
    def come_back(self, pid: str) -> None:
        """The supervisor sees the node in view again (the same process: same incarnation)."""
        before = self.ledger.nodes.get(pid)
        if before is None or before.state is NodeState.STOPPED:
            with pytest.raises(LedgerError):
                self.ledger.node_returned(pid, self._tick())
            return
        decision = self.ledger.node_returned(pid, self._tick(), "seen again")
        self._deliver(decision)
        after = self.ledger.nodes[pid]
        assert after.state is NodeState.LIVE
        assert after.incarnation == before.incarnation
        if before.state is NodeState.LIVE:
            assert not decision  # a duplicate report writes nothing
        else:
            assert (after.returned_at, after.returned_reason) == (self.now, "seen again")
            assert (after.lost_at, after.lost_reason) == (before.lost_at, before.lost_reason)

    @precondition(lambda self: bool(self.ledger.experiments))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.ledger.experiments)))
        before = self.ledger.status(name)
        try:
            self._deliver(self.ledger.cancel(name, self._tick()))
        except LedgerError:
            assert before in ("done", "failed")
            return
        assert self.ledger.status(name) == "cancelled"

    @invariant()
    def no_work_is_silently_lost(self) -> None:
        for name, source in self.ledger.open_pairs():
            assert self.ledger.nodes[source].state is NodeState.LIVE, (name, source)
            assert not self.ledger.experiments[name].cancelled

    @invariant()
    def claims_are_made_once(self) -> None:
        for key, claim in self.ledger.claims.items():
            if claim.attempt:  # made by its node (lost/cancelled-before-claim have attempt 0)
                assert self.first_claim[key] == claim.claimed_at

    @invariant()
    def done_pairs_have_every_result(self) -> None:
        for (name, source), claim in self.ledger.claims.items():
            if claim.state is ClaimState.DONE:
                wanted = set(self.ledger.role_pids(name, "destination")) - {source}
                got = {d for (e, s, d) in self.ledger.results if (e, s) == (name, source)}
                assert got == wanted

    @invariant()
    def failures_at_a_loss_are_never_retracted(self) -> None:
        for key, failed in self.failed_at_loss.items():
            assert self.ledger.claims[key] == failed

    @invariant()
    def node_history_is_consistent(self) -> None:
        for pid, node in self.ledger.nodes.items():
            assert node.losses == self.losses.get(pid, 0)
            assert (node.lost_at > 0) == (node.losses > 0)
            assert node.returned_at <= 0 or node.losses > 0  # a return follows a loss
            if node.state is NodeState.LOST:
                assert node.lost_at > node.returned_at

    @invariant()
    def the_replica_matches(self) -> None:
        assert self.replica == self.ledger


TestClaimModel = ClaimModel.TestCase


# -- selectors ------------------------------------------------------------------------------------


def _tree() -> list[NodeRecord]:
    nodes = []
    for rank, pid in enumerate(PIDS):
        role = "root" if rank == 0 else ("head" if rank == 2 else "leaf")
        labels = f"client=chrysalis-scale,role={role},task={rank // 2}"
        nodes.append(replace(_node(pid, rank), task=rank // 2, role=role, labels=labels))
    nodes.append(replace(_node("e5" * 16, 9), state=NodeState.LOST))
    return nodes


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("all", PIDS),
        ("task:1", PIDS[2:]),
        ("role:leaf", [PIDS[1], PIDS[3]]),
        ("label:role=head,rank:0", [PIDS[0], PIDS[2]]),
        ("000000000000000000000000000000c", [PIDS[2]]),
        ("pid:" + PIDS[3], [PIDS[3]]),
    ],
)
def test_selectors_pick_live_nodes_in_rank_order(selector: str, expected: list[str]) -> None:
    assert select_nodes(_tree(), selector) == tuple(expected)


def test_a_sample_is_seeded_and_bounded() -> None:
    first = select_nodes(_tree(), "all,sample:2", seed=7)
    assert len(first) == 2
    assert first == select_nodes(_tree(), "sample:2", seed=7)
    assert set(first) <= set(PIDS)
    picks = {select_nodes(_tree(), "sample:2", seed=s) for s in range(20)}
    assert len(picks) > 1  # not always the same two
    with pytest.raises(LedgerError, match="sample:5 of 4"):
        select_nodes(_tree(), "sample:5")


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("task:9", "matches no live node"),
        ("e5", "matches no live node"),  # lost nodes are never targets
        ("colour:red", "unknown selector term"),
        ("xyz", "not a PID prefix"),
        ("label:role", "label takes K=V"),
        ("rank:one", "rank takes a number"),
        ("sample:0", "positive count"),
        ("", "1 to 4096 characters"),
    ],
)
def test_bad_selectors_say_what_is_wrong(selector: str, message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        select_nodes(_tree(), selector)


def test_without_live_only_a_selector_also_names_nodes_that_are_down() -> None:
    assert select_nodes(_tree(), "e5", live_only=False) == ("e5" * 16,)


# -- liveness -------------------------------------------------------------------------------------


def test_a_node_out_of_view_for_the_grace_is_reported_lost_once() -> None:
    a, b = PIDS[:2]
    watch = Liveness(grace=5.0)
    assert watch.observe([a, b], {a, b}, 0.0) == []
    assert watch.observe([a, b], {a}, 1.0) == []  # b missing since 1.0
    assert watch.observe([a, b], {a}, 5.9) == []
    assert watch.observe([a, b], {a}, 6.0) == [b]
    assert watch.observe([a, b], {a}, 20.0) == []  # once per absence
    assert watch.observe([a], {a}, 21.0) == []  # declared lost: no longer live
    # back (a restart registers it live again), then away again: a new absence
    assert watch.observe([a, b], {a, b}, 22.0) == []
    assert watch.observe([a, b], {a}, 23.0) == []
    assert watch.observe([a, b], {a}, 28.0) == [b]


def test_a_node_seen_again_within_the_grace_is_not_lost() -> None:
    a = PIDS[0]
    watch = Liveness(grace=5.0)
    assert watch.observe([a], set(), 0.0) == []
    assert watch.observe([a], {a}, 4.0) == []  # a reconnect, not a death
    assert watch.observe([a], set(), 6.0) == []  # a fresh absence starts at 6.0
    assert watch.observe([a], set(), 10.9) == []
    assert watch.observe([a], set(), 11.0) == [a]
    with pytest.raises(LedgerError, match="grace"):
        Liveness(grace=0.0)


def test_a_lost_node_back_in_view_is_reported_returned_then_can_be_lost_again() -> None:
    a, b = PIDS[:2]
    watch = Liveness(grace=5.0)
    assert watch.observe([a, b], {a}, 0.0) == []
    assert watch.observe([a, b], {a}, 5.0) == [b]  # the ledger now holds b lost
    assert watch.returned([b], {a}) == []
    assert watch.returned([b], {a, b}) == [b]  # in view again: once per return
    assert watch.returned([b], {a, b}) == []
    # the ledger holds it live again: a later absence is a fresh one, reported again
    assert watch.observe([a, b], {a, b}, 6.0) == []
    assert watch.observe([a, b], {a}, 7.0) == []
    assert watch.observe([a, b], {a}, 11.9) == []
    assert watch.observe([a, b], {a}, 12.0) == [b]
    # seen at once, before the ledger's next call: still a return
    assert watch.returned([b], {a, b}) == [b]


def test_a_stale_entry_of_a_node_lost_for_its_exit_is_no_return() -> None:
    a = PIDS[0]
    watch = Liveness(grace=5.0)
    # lost for its exit status while its parent still resolves it (the link not idled out)
    assert watch.returned([a], {a}) == []
    assert watch.returned([a], {a}) == []
    assert watch.returned([a], set()) == []  # now out of view
    assert watch.returned([a], {a}) == [a]  # joined again: a return
    # a node registered again is no longer passed as lost, and is forgotten
    assert watch.returned([a], set()) == []
    assert watch.returned([], {a}) == []
    assert watch.returned([a], {a}) == []
