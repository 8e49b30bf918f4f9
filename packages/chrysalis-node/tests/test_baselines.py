"""Direct network baselines for scale experiments (``chrysalis.node._baselines``, issue 22
item 3): the pure parts in memory (frames, the stored JSON, ratios), the result rows that
carry them (stored in a sibling table, an older database opened without migration work), the
runner measuring them after the Chrysalis figures, ``show``'s ratios, and the real servers
and clients on loopback (UDP, TCP, plain aioquic) with sane values, never timings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("chrysalis.sqlite")

from chrysalis.core import Pid
from chrysalis.node._baselines import (
    FrameReader,
    MethodResult,
    baseline_servers,
    decode_baselines,
    encode_baselines,
    frame,
    measure_baselines,
    pair_ratios,
)
from chrysalis.node._claims import (
    ExperimentRecord,
    ExperimentSpec,
    LedgerError,
    NodeRecord,
    ResultRecord,
)
from chrysalis.node._experiment_store import SCHEMAS, ExperimentStore, _row, open_replica
from chrysalis.sqlite import Replica

A, B, C = "a1" * 16, "b2" * 16, "c3" * 16


def _node(pid: str, rank: int) -> NodeRecord:
    return NodeRecord(pid, 0, rank, "", 0, 0, "leaf", "unixgram", "unix:///x", "k=v", 5.5)


def _store(replica: Replica | None = None) -> ExperimentStore:
    store = ExperimentStore(replica or open_replica(":memory:"))
    for rank, pid in enumerate((A, B, C)):
        node = _node(pid, rank)
        store.apply(lambda ledger: ledger.register(node, now=1.0))  # noqa: B023 (called at once)
    return store


# -- pure ---------------------------------------------------------------------------------------


def test_frames_are_reassembled_from_any_split_and_an_oversized_one_is_refused() -> None:
    stream = frame(b"abc") + frame(b"") + frame(b"x" * 300)
    for cut in (1, 2, 5, 7, 100):
        reader = FrameReader()
        got: list[bytes] = []
        for start in range(0, len(stream), cut):
            got += reader.feed(stream[start : start + cut])
        assert got == [b"abc", b"", b"x" * 300]
        assert reader.pending == 0
    with pytest.raises(ValueError, match="exceeds 10"):
        FrameReader(limit=10).feed(frame(b"y" * 11))


def test_method_results_percentiles_and_the_stored_json_round_trip() -> None:
    measured = MethodResult.measured([0.003, 0.001, 0.002, 0.010], seconds=2.0, moved=4 << 20)
    assert (measured.completed, measured.p50_ms, measured.max_ms) == (4, 2.0, 10.0)
    assert measured.p99_ms == 10.0
    assert measured.mib_per_second == 2.0
    assert MethodResult.measured([], 1.0, 0, "refused").error == "refused"
    methods = {"udp": measured, "tcp": MethodResult(error="not applicable")}
    text = encode_baselines(methods)
    assert list(json.loads(text)) == ["udp", "tcp"]  # report order
    assert decode_baselines(text) == methods
    assert decode_baselines("") == {}
    with pytest.raises(ValueError, match="unknown"):
        encode_baselines({"carrier-pigeon": measured})
    for bad in ('["udp"]', '{"sctp": {}}', '{"udp": {"completed": 1}}'):
        with pytest.raises(ValueError):
            decode_baselines(bad)
    wrong_type = json.loads(text)
    wrong_type["udp"]["completed"] = "4"
    with pytest.raises(ValueError, match="completed"):
        decode_baselines(json.dumps(wrong_type))


def test_ratios_are_chrysalis_over_the_baseline_and_none_without_a_figure() -> None:
    udp = MethodResult(3, 1.0, p50_ms=0.5, p99_ms=2.0, mib_per_second=4.0)
    failed = MethodResult(error="timed out")
    ratios = pair_ratios(2.0, 4.0, 1.0, {"udp": udp, "quic": failed})
    assert ratios["udp"] == {"p50": 4.0, "p99": 2.0, "throughput": 0.25}
    assert ratios["quic"] == {"p50": None, "p99": None, "throughput": None}


# -- stored with the result rows ----------------------------------------------------------------


def _finished(store: ExperimentStore, baselines: str) -> None:
    spec = ExperimentSpec("e1", count=3)
    store.apply(lambda ledger: ledger.submit(spec, [A], [B, C], submitted_by=C, now=2.0))
    work = store.decide(lambda ledger: ledger.next_work(A, 3.0))
    assert work is not None
    store.apply(lambda ledger: ledger.start(work.claim, 4.0))
    results = [
        ResultRecord("e1", A, B, "ok", 3, 3, 1.0, 2.0, 3.0, 4.0, 2.5, 4.0, 1.0, "", baselines),
        ResultRecord("e1", A, C, "ok", 3, 3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    ]
    store.apply(lambda ledger: ledger.finish(work.claim, results, 5.0))


def test_baselines_persist_with_their_result_and_an_older_database_opens_unchanged(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old.db"
    replica = Replica(str(old), list(SCHEMAS[:5]))  # the layout before baselines existed
    for rank, pid in enumerate((A, B)):
        with replica.transaction("IMMEDIATE") as tx:
            tx.upsert(*_row(_node(pid, rank)))
    replica.close()
    reopened = ExperimentStore(open_replica(str(old)))  # CREATE TABLE IF NOT EXISTS: no ALTER
    assert sorted(reopened.ledger().nodes) == [A, B]
    reopened.replica.close()

    path = tmp_path / "node.db"
    text = encode_baselines({"udp": MethodResult(3, 1.0, p50_ms=0.5, p99_ms=1.0)})
    _finished(_store(open_replica(str(path))), text)
    results = ExperimentStore(open_replica(str(path))).ledger().results
    assert results[("e1", A, B)].baselines == text
    assert results[("e1", A, C)].baselines == ""  # none measured: no sibling row


def test_show_prints_each_baseline_and_its_ratio() -> None:
    from chrysalis.node._admin import _show_text, experiment_report

    store = _store()
    udp = MethodResult(3, 1.0, p50_ms=0.5, p99_ms=2.0, mib_per_second=4.0)
    quic = MethodResult(3, 1.0, p50_ms=1.0, p99_ms=1.0, mib_per_second=0.5)
    _finished(store, encode_baselines({"udp": udp, "quic": quic}))
    report = experiment_report(store.ledger(), "e1")
    with_baselines, without = report["results"]
    assert with_baselines["baselines"]["udp"]["p50_ms"] == 0.5
    assert with_baselines["ratios"]["udp"] == {"p50": 4.0, "p99": 2.0, "throughput": 0.25}
    assert with_baselines["ratios"]["quic"] == {"p50": 2.0, "p99": 4.0, "throughput": 2.0}
    assert without["baselines"] == without["ratios"] == {}
    assert report["summary"]["baseline_ratios"]["udp"] == {
        "p50": 4.0,
        "p99": 2.0,
        "throughput": 0.25,
    }
    assert report["summary"]["pooled_ratios"] == {}  # no pooled stream measured
    json.dumps(report)  # `show --json`
    text = _show_text(report)
    assert "median ratio to udp: p50 4.00x, p99 2.00x, throughput 0.25x" in text
    assert "pooled stream" not in text
    assert any(line.split()[2:3] == ["quic"] and "2.00x" in line for line in text.splitlines())


def test_show_reports_the_pooled_stream_against_the_direct_baselines() -> None:
    """Fresh versus pooled streams, each against the same direct baselines: the pooled
    stream's own figures over each direct method's (``summary.pooled_ratios``)."""
    from chrysalis.node._admin import _show_text, experiment_report

    store = _store()
    pooled = MethodResult(3, 1.0, p50_ms=1.0, p99_ms=3.0, mib_per_second=2.0)
    udp = MethodResult(3, 1.0, p50_ms=0.5, p99_ms=2.0, mib_per_second=4.0)
    tcp = MethodResult(error="connection refused")  # no figures: no ratio
    methods = {"chrysalis-pooled": pooled, "udp": udp, "tcp": tcp}
    _finished(store, encode_baselines(methods))
    report = experiment_report(store.ledger(), "e1")
    summary = report["summary"]
    assert summary["pooled_ratios"] == {
        "udp": {"p50": 2.0, "p99": 1.5, "throughput": 0.5},
        "tcp": {"p50": None, "p99": None, "throughput": None},
    }
    # the fresh stream (p50 2 ms, p99 4 ms, 1 MiB/s) against the same baselines
    assert summary["baseline_ratios"]["udp"] == {"p50": 4.0, "p99": 2.0, "throughput": 0.25}
    assert summary["baseline_ratios"]["chrysalis-pooled"]["p50"] == 2.0  # fresh over pooled
    text = _show_text(report)
    assert "pooled stream, median ratio to udp: p50 2.00x, p99 1.50x, throughput 0.50x" in text
    assert "pooled stream, median ratio to tcp: p50 -, p99 -, throughput -" in text
    assert "pooled stream, median ratio to chrysalis-pooled" not in text


def test_the_runner_measures_baselines_after_its_pairs_and_keeps_a_failing_one_out() -> None:
    from chrysalis.node._experiments import ExperimentRunner

    store = _store()
    order: list[str] = []

    async def echo(pid: Pid, size: int) -> None:
        order.append("echo")

    async def baselines(pid: Pid, spec: ExperimentSpec) -> str:
        order.append("baseline " + pid.hex()[:2])
        if pid.hex() == C:
            raise ConnectionError("no baseline servers")
        return encode_baselines({"tcp": MethodResult(spec.count, 1.0, p50_ms=1.0)})

    spec = ExperimentSpec("e1", payload=4, count=2, warmup=0, timeout=5.0)
    store.apply(lambda ledger: ledger.submit(spec, [A], [B, C], submitted_by=B, now=2.0))
    runner = ExperimentRunner(store, A, {"echo": echo}, poll_interval=0.01, baselines=baselines)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run())
        while runner.runs == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
    assert order == ["echo"] * 4 + ["baseline b2", "baseline c3"]
    results = store.ledger().results
    assert decode_baselines(results[("e1", A, B)].baselines)["tcp"].completed == 2
    assert (results[("e1", A, C)].status, results[("e1", A, C)].baselines) == ("ok", "")


def test_an_experiment_without_baselines_runs_none_and_says_so(tmp_path: Path) -> None:
    """``submit --no-baselines``: stored with the experiment (its option row survives a
    reopen and replicates like the rest), the runner measures no baseline for its pairs,
    ``show`` says so; an experiment written before the option existed has baselines."""
    from chrysalis.node._admin import _show_text, experiment_report
    from chrysalis.node._experiments import ExperimentRunner

    path = tmp_path / "node.db"
    store = _store(open_replica(str(path)))
    measured: list[str] = []

    async def echo(pid: Pid, size: int) -> None:
        pass

    async def baselines(pid: Pid, spec: ExperimentSpec) -> str:
        measured.append(spec.name)
        return encode_baselines({"tcp": MethodResult(spec.count, 1.0, p50_ms=1.0)})

    plain = ExperimentSpec("plain", payload=4, count=2, warmup=0, timeout=5.0, baselines=False)
    full = ExperimentSpec("full", payload=4, count=2, warmup=0, timeout=5.0)
    store.apply(lambda ledger: ledger.submit(plain, [A], [B], submitted_by=B, now=2.0))
    store.apply(lambda ledger: ledger.submit(full, [A], [B], submitted_by=B, now=2.0))
    runner = ExperimentRunner(store, A, {"echo": echo}, poll_interval=0.01, baselines=baselines)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run())
        while runner.runs < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
    assert measured == ["full"]
    results = store.ledger().results
    assert results[("plain", A, B)].status == "ok"
    assert results[("plain", A, B)].baselines == ""
    assert results[("full", A, B)].baselines != ""
    store.replica.close()
    reopened = ExperimentStore(open_replica(str(path))).ledger()
    assert reopened.experiments["plain"].spec == plain
    assert reopened.experiments["full"].spec.baselines is True
    report = experiment_report(reopened, "plain")
    assert report["baselines"] is False
    assert experiment_report(reopened, "full")["baselines"] is True
    assert "concurrency 1, no baselines)" in _show_text(report).splitlines()[0]
    assert "no baselines" not in _show_text(experiment_report(reopened, "full"))
    with pytest.raises(LedgerError, match="baselines must be"):
        ExperimentSpec("x", baselines=1)  # type: ignore[arg-type]

    old = tmp_path / "old.db"  # the layout before the option existed: the default
    replica = Replica(str(old), list(SCHEMAS[:6]))
    with replica.transaction("IMMEDIATE") as tx:
        tx.upsert(*_row(ExperimentRecord(ExperimentSpec("old"), B, 2.0)))
    replica.close()
    assert ExperimentStore(open_replica(str(old))).ledger().experiments["old"].spec.baselines


def test_submit_takes_no_baselines() -> None:
    from chrysalis.node._cli import build_parser

    token = "udp://127.0.0.1:9?authority=" + "ab" * 16
    base = ["admin", token, "submit", "e", "--sources", "all", "--destinations", "all"]
    assert build_parser().parse_args(base).no_baselines is False
    assert build_parser().parse_args([*base, "--no-baselines"]).no_baselines is True


# -- real sockets on loopback -------------------------------------------------------------------


def test_udp_tcp_unix_and_plain_quic_baselines_run_on_loopback(tmp_path: Path) -> None:
    from chrysalis.quic import DevelopmentIdentityProvider

    identity = DevelopmentIdentityProvider(tmp_path / "ca").issue_identity()

    async def main() -> tuple[dict[str, MethodResult], dict[str, MethodResult], dict[str, str]]:
        async with baseline_servers("127.0.0.1", identity) as addresses:
            echo = await measure_baselines(addresses, "echo", 100, 5, timeout=20)
            transfer = await measure_baselines(
                addresses, "stream-transfer", 1 << 18, 2, timeout=20, datagram_size=16384
            )
        return echo, transfer, addresses

    echo, transfer, addresses = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(addresses) == ["quic", "tcp", "udp", "unix"]
    assert addresses["unix"].startswith("@chrysalis-baseline-")  # abstract: no file to remove
    assert sorted(echo) == ["quic", "tcp", "udp", "unix"]  # no Chrysalis pooled echo was given
    for method, result in echo.items():
        assert (method, result.completed, result.error) == (method, 5, "")
        assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
        assert result.mib_per_second > 0
    assert transfer["udp"].error.startswith("not applicable")
    for method in ("tcp", "unix", "quic"):
        assert (transfer[method].completed, transfer[method].error) == (2, "")
        assert transfer[method].mib_per_second > 0


def test_a_destination_without_servers_is_reported_per_method() -> None:
    async def main() -> dict[str, MethodResult]:
        return await measure_baselines({"tcp": "127.0.0.1:1"}, "echo", 8, 2, timeout=5)

    found = asyncio.run(main())
    assert "serves no udp" in found["udp"].error
    assert "serves no unix" in found["unix"].error
    assert found["tcp"].completed == 0
    assert found["tcp"].error


def test_a_unix_baseline_of_another_namespace_or_a_bad_address_fails_that_method_only() -> None:
    async def main() -> dict[str, MethodResult]:
        addresses = {"unix": "@chrysalis-baseline-nobody-listens", "tcp": "127.0.0.1:1"}
        return await measure_baselines(addresses, "stream-transfer", 8, 2, timeout=5)

    found = asyncio.run(main())
    assert found["unix"].completed == 0
    assert "ConnectionRefusedError" in found["unix"].error
    bad = asyncio.run(measure_baselines({"unix": "/tmp/not-abstract"}, "echo", 8, 1, timeout=5))
    assert "bad unix baseline address" in bad["unix"].error
