"""``chrysalis admin ... show NAME... --plot FILE.png`` (issue 22): the series drawn from stored
experiments, the PNG itself, and the errors."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest

pytest.importorskip("chrysalis.sqlite")

from chrysalis.node._admin import AdminError, experiment_report, show
from chrysalis.node._baselines import MethodResult, encode_baselines
from chrysalis.node._claims import ExperimentSpec, NodeRecord, ResultRecord
from chrysalis.node._cli import build_parser
from chrysalis.node._experiment_store import ExperimentStore, open_replica
from chrysalis.node._plot import MAX_EXPERIMENTS, PlotError, plot_series

A, B, C = "a1" * 16, "b2" * 16, "c3" * 16


def _store() -> ExperimentStore:
    store = ExperimentStore(open_replica(":memory:"))
    for rank, pid in enumerate((A, B, C)):
        node = NodeRecord(pid, 0, rank, "", 0, 0, "leaf", "unixgram", "unix:///x", "", 1.0)
        store.apply(lambda ledger: ledger.register(node, now=1.0))  # noqa: B023 (called at once)
    return store


def _run(store: ExperimentStore, spec: ExperimentSpec, results: list[ResultRecord]) -> None:
    store.apply(lambda ledger: ledger.submit(spec, [A], [B, C], submitted_by=C, now=2.0))
    work = store.decide(lambda ledger: ledger.next_work(A, 3.0))
    assert work is not None
    store.apply(lambda ledger: ledger.start(work.claim, 4.0))
    store.apply(lambda ledger: ledger.finish(work.claim, results, 5.0))


def _echo(store: ExperimentStore, name: str, payload: int, p50: float) -> None:
    """An echo of ``payload`` bytes: pair A->B at ``p50`` ms, A->C at ``3 * p50`` (so the
    median over the pairs is ``2 * p50``), and a udp baseline at a tenth of each."""
    udp = encode_baselines({"udp": MethodResult(3, 1.0, p50_ms=p50 / 10, mib_per_second=50.0)})
    _run(
        store,
        ExperimentSpec(name, payload=payload, count=3),
        [
            ResultRecord(name, A, B, "ok", 3, 3, 1.0, p50, 0, 2 * p50, 0, 0, 1.0, "", udp),
            ResultRecord(name, A, C, "ok", 3, 3, 1.0, 3 * p50, 0, 6 * p50, 0, 0, 3.0, "", udp),
        ],
    )


def _reports(store: ExperimentStore, *names: str) -> list[dict[str, object]]:
    return [experiment_report(store.ledger(), name) for name in names]


def test_series_are_medians_over_the_ok_pairs_sorted_by_payload() -> None:
    store = _store()
    _echo(store, "big", 4096, 2.0)
    _echo(store, "small", 16, 1.0)
    _run(
        store,
        ExperimentSpec("t1", kind="stream-transfer", payload=1 << 20, count=3),
        [
            ResultRecord("t1", A, B, "ok", 3, 3, 1.0, mib_per_second=8.0),
            ResultRecord("t1", A, C, "failed", 3, 0, 1.0, error="gone"),  # not drawn
        ],
    )
    series = {s.label: s for s in plot_series(_reports(store, "big", "small", "t1"))}
    assert series["chrysalis p50"].points == ((16, 2.0), (4096, 4.0))
    assert series["chrysalis p99"].points == ((16, 4.0), (4096, 8.0))
    assert series["udp p50"].points == ((16, 0.1), (4096, 0.2))
    assert series["chrysalis echo"].points == ((16, 2.0), (4096, 2.0))
    assert series["udp echo"].points == ((16, 50.0), (4096, 50.0))
    assert series["chrysalis stream-transfer"].points == ((1 << 20, 8.0),)
    assert series["chrysalis stream-transfer"].panel == "throughput"
    assert series["udp p50"].panel == "latency"


def test_nothing_to_plot_and_too_many_experiments_are_errors() -> None:
    store = _store()
    _run(
        store,
        ExperimentSpec("dead", count=3),
        [
            ResultRecord("dead", A, B, "failed", 3, 0, 1.0, error="gone"),
            ResultRecord("dead", A, C, "failed", 3, 0, 1.0, error="gone"),
        ],
    )
    with pytest.raises(PlotError, match="nothing to plot"):
        plot_series(_reports(store, "dead"))
    with pytest.raises(PlotError, match=f"at most {MAX_EXPERIMENTS}"):
        plot_series(_reports(store, "dead") * (MAX_EXPERIMENTS + 1))


def test_show_of_several_experiments_writes_their_reports_and_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    store = _store()
    _echo(store, "e16", 16, 1.0)
    _echo(store, "e1k", 1024, 1.5)
    emitted: list[tuple[object, str]] = []
    err = io.StringIO()
    picture = tmp_path / "latency.png"
    show(store.ledger(), ["e16", "e1k"], str(picture), lambda r, t: emitted.append((r, t)), err)
    [(records, text)] = emitted
    assert isinstance(records, list)
    assert [r["name"] for r in records] == ["e16", "e1k"]
    json.dumps(records)  # `show --json` of several: a list
    assert "e16" in text
    assert "e1k" in text
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1200, 450)
    assert "plot of 5 series from 2 experiment(s)" in err.getvalue()


def test_show_of_one_experiment_is_the_report_itself_and_a_bad_plot_path_is_an_error(
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    store = _store()
    _echo(store, "e16", 16, 1.0)
    emitted: list[object] = []
    show(store.ledger(), ["e16"], None, lambda r, t: emitted.append(r), io.StringIO())
    assert isinstance(emitted[0], dict)
    with pytest.raises(AdminError, match="cannot write"):
        show(
            store.ledger(),
            ["e16"],
            str(tmp_path / "missing" / "x.png"),
            lambda r, t: None,
            io.StringIO(),
        )
    with pytest.raises(AdminError, match="no experiment named"):
        show(store.ledger(), ["e16", "nope"], None, lambda r, t: None, io.StringIO())


def test_the_cli_takes_several_names_and_a_plot_file() -> None:
    args = build_parser().parse_args(
        ["admin", "udp://127.0.0.1:1", "show", "e1", "e2", "--plot", "out.png"]
    )
    assert args.name == ["e1", "e2"]
    assert args.plot == "out.png"
