"""The experiment tables (``chrysalis.node._experiment_store``): decisions stored as one
replica transaction each, surviving a reopen (a restarted node resumes its claim), rolled
back on refusal, and replicated between replicas (in memory, ``chrysalis.sqlite.testing``)."""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("chrysalis.sqlite")

from chrysalis.node._claims import (
    ClaimState,
    ExperimentSpec,
    LedgerError,
    NodeRecord,
    ResultRecord,
    Work,
)
from chrysalis.node._experiment_store import (
    SCHEMAS,
    ExperimentStore,
    open_replica,
)
from chrysalis.sqlite import Replica
from chrysalis.sqlite.testing import ReplicaNetwork

A, B = "a1" * 16, "b2" * 16


def _node(pid: str, rank: int, parent: str = "") -> NodeRecord:
    return NodeRecord(
        pid, 0, rank, parent, 1 if parent else 0, 0, "leaf", "unixgram", "unix:///x", "k=v", 5.5
    )


def test_decisions_persist_and_a_reopened_node_resumes_its_claim(tmp_path: Path) -> None:
    path = str(tmp_path / "node.db")
    replica = open_replica(path)
    store = ExperimentStore(replica)
    store.apply(lambda ledger: ledger.register(_node(A, 0), now=1.0))
    store.apply(lambda ledger: ledger.register(_node(B, 1, A), now=1.0))
    spec = ExperimentSpec("e1", payload=3, count=2, timeout=5.0)
    store.apply(lambda ledger: ledger.submit(spec, [B], [A, B], submitted_by=A, now=2.0))
    assert (store.has_open_work(A), store.has_open_work(B)) == (False, True)
    work = store.decide(lambda ledger: ledger.next_work(B, 3.0))
    assert work is not None
    assert work.destinations == (A,)
    store.apply(lambda ledger: ledger.start(work.claim, 4.0))
    replica.close()

    store = ExperimentStore(open_replica(path))  # the node restarts from its file
    before = store.ledger()
    assert before.nodes[B] == replace(_node(B, 1, A), incarnation=1)
    assert before.experiments["e1"].spec == spec
    assert before.claims[("e1", B)].state is ClaimState.RUNNING
    store.apply(lambda ledger: ledger.register(_node(B, 1, A), now=6.0))
    resumed = store.decide(lambda ledger: ledger.next_work(B, 7.0))
    assert resumed is not None
    assert resumed.resumed
    assert (resumed.claim.attempt, resumed.claim.claimed_at) == (2, 3.0)
    result = ResultRecord("e1", B, A, "ok", 2, 2, 0.5, 1.0, 2.0, 2.5, 1.5, 2.5)
    store.apply(lambda ledger: ledger.start(resumed.claim, 8.0))
    store.apply(lambda ledger: ledger.finish(resumed.claim, [result], 9.0))
    after = store.ledger()
    assert after.status("e1") == "done"
    assert not store.has_open_work(B)
    assert after.results[("e1", B, A)] == result


def test_a_nodes_losses_and_returns_persist_in_the_sibling_table(tmp_path: Path) -> None:
    path = str(tmp_path / "node.db")
    store = ExperimentStore(open_replica(path))
    store.apply(lambda ledger: ledger.register(_node(A, 0), now=1.0))
    store.apply(lambda ledger: ledger.register(_node(B, 1, A), now=1.0))
    rows = "SELECT COUNT(*) FROM scale_node_history"
    assert store.replica.connection.execute(rows).fetchone() == (0,)  # never lost: no row
    store.apply(lambda ledger: ledger.node_lost(B, 2.0, "its node left the namespace"))
    assert (store.live_pids(), store.lost_pids()) == ([A], [B])
    store.apply(lambda ledger: ledger.node_returned(B, 3.0, "in view again"))
    store.apply(lambda ledger: ledger.node_lost(B, 4.0, "exit status -9"))
    store.replica.close()

    store = ExperimentStore(open_replica(path))
    node = store.ledger().nodes[B]
    assert (node.state.value, node.incarnation, node.losses) == ("lost", 1, 2)
    assert (node.lost_at, node.lost_reason) == (4.0, "exit status -9")
    assert (node.returned_at, node.returned_reason) == (3.0, "in view again")
    assert store.ledger().nodes[A].losses == 0
    store.apply(lambda ledger: ledger.register(_node(B, 1, A), now=5.0))
    node = store.ledger().nodes[B]
    assert (node.state.value, node.incarnation, node.losses) == ("live", 2, 2)
    assert node.returned_reason == "registered again as incarnation 2"


def test_a_refused_operation_writes_nothing() -> None:
    store = ExperimentStore(open_replica(":memory:"))
    store.apply(lambda ledger: ledger.register(_node(A, 0), now=1.0))
    version = store.replica.db_version
    with pytest.raises(LedgerError, match="not a registered node"):
        store.apply(
            lambda ledger: ledger.submit(ExperimentSpec("e1"), [A], [B], submitted_by=A, now=2.0)
        )
    assert store.replica.db_version == version
    assert store.ledger().experiments == {}


def test_a_replica_without_the_tables_is_refused() -> None:
    with pytest.raises(ValueError, match="does not declare scale_node"):
        ExperimentStore(Replica(":memory:", [SCHEMAS[1]]))


def _linked(seed: int, parent: str, child: str) -> tuple[ReplicaNetwork, list[ExperimentStore]]:
    """Two replicas linked ``parent`` to ``child`` (their stores, in that order), node ``A``
    registered at the parent and ``B`` at the child, replicated."""
    network = ReplicaNetwork(seed=seed)
    for name in (parent, child):
        network.add(name, open_replica(":memory:"))
    network.connect(parent, child)
    stores = [ExperimentStore(network.replica(name)) for name in (parent, child)]
    stores[0].apply(lambda ledger: ledger.register(_node(A, 0), now=1.0))
    stores[1].apply(lambda ledger: ledger.register(_node(B, 1, A), now=1.0))
    network.settle()
    return network, stores


def _claimed(
    network: ReplicaNetwork, at: ExperimentStore, by: ExperimentStore, source: str, to: str
) -> Work:
    """Experiment e1 from ``source`` to ``to`` submitted ``at`` one store, replicated, and
    claimed ``by`` another (the claim not replicated yet)."""
    spec = ExperimentSpec("e1")
    at.apply(lambda ledger: ledger.submit(spec, [source], [to], submitted_by=to, now=2.0))
    network.settle()
    work = by.decide(lambda ledger: ledger.next_work(source, 3.0))
    assert work is not None
    return work


def test_records_replicate_between_an_admin_and_a_node() -> None:
    network, (node, admin) = _linked(3, "node", "admin")
    work = _claimed(network, admin, node, A, B)
    network.settle()
    assert admin.ledger().claims[("e1", A)] == work.claim
    admin.apply(lambda ledger: ledger.cancel("e1", 4.0))
    network.settle()
    assert node.ledger().status("e1") == "cancelled"
    assert node.decide(lambda ledger: ledger.next_work(A, 5.0)) is None


def test_a_loss_verdict_outlasts_what_a_cut_off_source_wrote_meanwhile() -> None:
    """The root declares a source lost while the source, cut off (hung, partitioned), still
    finishes its run in its own replica; once the link heals, the replicas merge by last
    writer and the source's later claim row wins the ``scale_claim`` row, yet every ledger
    reads the pair failed by the loss, without the source's results."""
    network, (root, node) = _linked(5, "root", "node")
    work = _claimed(network, root, node, B, A)
    node.apply(lambda ledger: ledger.start(work.claim, 4.0))
    network.settle()

    network.cut("root", "node")
    root.apply(lambda ledger: ledger.node_lost(B, 5.0, "its node left the namespace"))
    for done in range(50):  # the source's clock runs ahead of the root's meanwhile
        node.publish_progress("e1", B, done, 100, 5.5)
    result = ResultRecord("e1", B, A, "ok", 10, 10, 0.5, 1.0, 2.0, 2.5, 1.5, 2.5)
    node.apply(lambda ledger: ledger.finish(work.claim, [result], 6.0))
    network.heal("root", "node")
    network.settle()
    node.apply(lambda ledger: ledger.node_returned(B, 7.0))  # nothing to refuse or retract
    network.settle()

    raw = "SELECT state FROM scale_claim"
    assert root.replica.connection.execute(raw).fetchall() == [("done",)]  # the source won
    for store in (root, node):
        ledger = store.ledger()
        claim = ledger.claims[("e1", B)]
        assert (claim.state, claim.error) == (ClaimState.FAILED, "its node left the namespace")
        assert ledger.results == {}
        assert ledger.status("e1") == "failed"
        assert ledger.nodes[B].state.value == "live"
        assert not store.has_open_work(B)
        with pytest.raises(LedgerError):  # its late report is still refused
            store.apply(lambda ledger: ledger.finish(work.claim, [result], 8.0))


# -- the runner (fake echoes, no network) --------------------------------------------------------

C = "c3" * 16


def _store_with_nodes() -> ExperimentStore:
    store = ExperimentStore(open_replica(":memory:"))
    for rank, pid in enumerate((A, B, C)):
        node = _node(pid, rank)
        store.apply(lambda ledger: ledger.register(node, now=1.0))  # noqa: B023 (called at once)
    return store


def test_the_runner_measures_each_destination_and_reports_failures() -> None:
    from chrysalis.core import Pid
    from chrysalis.node._experiments import ExperimentRunner

    store = _store_with_nodes()
    calls: list[str] = []

    async def echo(pid: Pid, size: int) -> None:
        calls.append(pid.hex())
        assert size == 4
        if pid.hex() == C and len([c for c in calls if c == C]) > 2:  # warm-up + 1 pass
            raise ConnectionError("refused by the peer")

    spec = ExperimentSpec("e1", payload=4, count=3, warmup=1, concurrency=2, timeout=5.0)
    store.apply(lambda ledger: ledger.submit(spec, [A], [B, C], submitted_by=B, now=2.0))
    runner = ExperimentRunner(store, A, {"echo": echo}, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run())
        while runner.runs == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
    ledger = store.ledger()
    assert ledger.status("e1") == "done"
    ok, failed = ledger.results[("e1", A, B)], ledger.results[("e1", A, C)]
    assert (ok.status, ok.completed, ok.error) == ("ok", 3, "")
    assert 0 <= ok.p50_ms <= ok.p90_ms <= ok.p99_ms <= ok.max_ms
    assert (failed.status, failed.completed, failed.error) == ("failed", 1, "refused by the peer")
    assert ok.mib_per_second > 0  # 3 echoes of 4 bytes each way over the pair's time


def test_a_cancel_stops_a_running_experiment_and_the_runner_moves_on() -> None:
    from chrysalis.core import Pid
    from chrysalis.node._experiments import ExperimentRunner

    store = _store_with_nodes()

    async def main() -> None:
        entered = asyncio.Event()

        async def echo(pid: Pid, size: int) -> None:
            if pid.hex() == B:  # e1's destination never answers
                entered.set()
                await asyncio.Event().wait()

        store.apply(
            lambda ledger: ledger.submit(
                ExperimentSpec("e1", warmup=0, timeout=60.0), [A], [B], submitted_by=B, now=2.0
            )
        )
        store.apply(
            lambda ledger: ledger.submit(ExperimentSpec("e2"), [A], [C], submitted_by=B, now=2.5)
        )
        runner = ExperimentRunner(store, A, {"echo": echo}, poll_interval=0.01)
        task = asyncio.ensure_future(runner.run())
        await entered.wait()
        assert store.ledger().claims[("e1", A)].state is ClaimState.RUNNING
        store.apply(lambda ledger: ledger.cancel("e1", 3.0))
        while runner.runs == 0:  # only a runner that dropped e1 gets to e2
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
    ledger = store.ledger()
    assert (ledger.status("e1"), ledger.status("e2")) == ("cancelled", "done")
    assert [key[0] for key in ledger.results] == ["e2"]


def test_a_pair_rate_is_over_its_own_operations_not_the_slots_it_waited_for() -> None:
    from chrysalis.core import Pid
    from chrysalis.node._admin import experiment_report
    from chrysalis.node._experiments import ExperimentRunner, pair_rate

    assert pair_rate([0.5, 0.5], 1 << 20, "stream-transfer") == 2.0
    assert pair_rate([0.5, 0.5], 1 << 20, "echo") == 4.0  # both directions
    assert pair_rate([], 1 << 20, "echo") == 0.0
    store = _store_with_nodes()
    delays = {B: 0.05, C: 0.15}

    async def transfer(pid: Pid, size: int) -> None:
        await asyncio.sleep(delays[pid.hex()])

    # one slot for two destinations: each pair waits for the other's transfers
    spec = ExperimentSpec(
        "t1", kind="stream-transfer", payload=1 << 20, count=3, warmup=0, concurrency=1
    )
    store.apply(lambda ledger: ledger.submit(spec, [A], [B, C], submitted_by=B, now=2.0))
    runner = ExperimentRunner(store, A, {"stream-transfer": transfer}, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run())
        while runner.runs == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
    ledger = store.ledger()
    for pid, delay in delays.items():
        result = ledger.results[("t1", A, pid)]
        assert result.completed == 3
        # 1 MiB per transfer of `delay` seconds (sleeps never undershoot; on a loaded machine
        # they overshoot, by up to 1.5 x delay here): above 0.4 / delay is still well clear of
        # a rate over the slots it waited for (3 MiB over >= 3 x delay + 2 x other: B's would
        # be below 0.34 / delay)
        assert 0.4 / delay < result.mib_per_second <= 1 / delay
        # its wall-clock span also held (at least two of) the other pair's transfers
        other = sum(delays.values()) - delay
        assert result.seconds >= 3 * delay + 2 * other
    report = experiment_report(ledger, "t1")
    assert report["summary"]["aggregate_mib_per_second"] <= 6 / 0.6


def test_the_runner_runs_each_kind_with_its_operation_and_fails_an_unknown_one() -> None:
    from chrysalis.core import Pid
    from chrysalis.node._experiments import ExperimentRunner

    store = _store_with_nodes()
    sent: list[int] = []

    async def transfer(pid: Pid, size: int) -> None:
        sent.append(size)

    spec = ExperimentSpec("t1", kind="stream-transfer", payload=5 << 20, count=2, warmup=1)
    store.apply(lambda ledger: ledger.submit(spec, [A], [B], submitted_by=B, now=2.0))
    store.apply(
        lambda ledger: ledger.submit(ExperimentSpec("e2"), [A], [B], submitted_by=B, now=3.0)
    )
    runner = ExperimentRunner(store, A, {"stream-transfer": transfer}, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run())
        while store.ledger().status("e2") == "pending" or runner.runs == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
    ledger = store.ledger()
    assert sent == [5 << 20] * 3  # warm-up + 2 timed, whole payloads
    result = ledger.results[("t1", A, B)]
    assert (result.status, result.completed) == ("ok", 2)
    assert result.mib_per_second > 0
    assert ledger.status("e2") == "failed"  # this runner has no echo operation
    assert "does not run 'echo'" in ledger.claims[("e2", A)].error


# -- admin reports ---------------------------------------------------------------------------------


def test_show_reports_pairs_failures_and_an_aggregate() -> None:
    from chrysalis.node._admin import experiment_report, format_rows

    store = _store_with_nodes()
    spec = ExperimentSpec("e1", count=4, payload=1 << 19)
    store.apply(lambda ledger: ledger.submit(spec, [A, B], [A, B, C], submitted_by=C, now=2.0))
    work = store.decide(lambda ledger: ledger.next_work(A, 3.0))
    assert work is not None
    store.apply(lambda ledger: ledger.start(work.claim, 4.0))
    results = [
        ResultRecord("e1", A, B, "ok", 4, 4, 2.0, 1.0, 2.0, 3.0, 1.5, 3.0, mib_per_second=1.0),
        ResultRecord("e1", A, C, "failed", 4, 1, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 0.5, "refused"),
    ]
    store.apply(lambda ledger: ledger.finish(work.claim, results, 5.0))
    report = experiment_report(store.ledger(), "e1")
    assert report["status"] == "running"  # B has not claimed yet
    assert [c["state"] for c in report["claims"]] == ["done", "pending"]
    summary = report["summary"]
    assert (summary["pairs_ok"], summary["pairs_failed"]) == (1, 1)
    assert (summary["completed"], summary["planned"]) == (5, 16)  # 2 sources x 2 others x 4
    # every completed echo's payload both ways (5 x 2 x 0.5 MiB) over the longest span (2 s),
    # whatever the pairs' own rates say
    assert summary["aggregate_mib_per_second"] == 5 * 2 * 0.5 / 2.0
    assert summary["p50_ms"] == {"median": 1.0, "min": 1.0, "max": 1.0}  # ok pairs only
    assert format_rows(("A", "BB"), [("xyz", ""), (1, None)]) == "A    BB\nxyz  -\n1    -"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_submit_progress_is_a_bar_on_a_terminal_and_lines_elsewhere() -> None:
    from chrysalis.node._admin import _Progress

    terminal = _Terminal()
    bar = _Progress(terminal, "e1", 4)
    bar.show(2, 0)
    bar.show(2, 0)  # unchanged: not redrawn
    bar.show(4, 2)
    bar.close()
    assert terminal.getvalue().count("\r") == 2
    assert "[###############---------------] 4/4 claimed, 2/4 ended\n" in terminal.getvalue()
    log = io.StringIO()
    lines = _Progress(log, "e1", 4)
    lines.show(2, 0)
    lines.show(4, 2)  # within a second of the last line: held back
    lines.close()
    assert log.getvalue() == "[admin] e1: 2/4 claimed, 0/4 ended\n"


def test_a_running_source_publishes_its_operations_and_submit_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``submit``'s progress counts timed operations: a running source publishes how many it
    completed (``scale_progress``), an ended one is counted by its results."""
    from chrysalis.core import Pid
    from chrysalis.node import _experiments
    from chrysalis.node._admin import _Progress, operations

    monkeypatch.setattr(_experiments, "PROGRESS_EVERY", 0.0)
    store = _store_with_nodes()
    seen: list[tuple[int, int]] = []

    async def echo(pid: Pid, size: int) -> None:
        await asyncio.sleep(0.005)
        seen.extend(store.progress("e1").values())

    spec = ExperimentSpec("e1", payload=4, count=20, warmup=2, timeout=10.0)
    store.apply(lambda ledger: ledger.submit(spec, [A, B], [A, B, C], submitted_by=B, now=2.0))
    runner = _experiments.ExperimentRunner(store, A, {"echo": echo}, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run())
        while runner.runs == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 20))
    # Published while running: never warm-up operations, planned = count x (B, C).
    assert seen
    assert {planned for _done, planned in seen} == {40}
    assert any(0 < done < 40 for done, _planned in seen), seen
    assert [done for done, _planned in seen] == sorted(done for done, _planned in seen)
    # A ended (its 40 by its results), B has not started: 40 of 2 x 40.
    ledger = store.ledger()
    assert operations(ledger, store.progress("e1"), "e1") == (40, 80)
    assert operations(ledger, {B: (7, 40)}, "e1") == (47, 80)  # B's published count
    log = io.StringIO()
    lines = _Progress(log, "e1", 2)
    lines.show(1, 1, 47, 80)
    assert log.getvalue() == "[admin] e1: 47/80 operations, 1/2 claimed, 1/2 ended\n"
    terminal = _Terminal()
    bar = _Progress(terminal, "e1", 2)
    bar.show(1, 1, 40, 80)
    assert "[###############---------------] 40/80 operations" in terminal.getvalue()
