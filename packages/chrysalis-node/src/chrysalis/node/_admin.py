"""``chrysalis admin TOKEN ...`` (also ``chrysalis scale admin ...``): administer persistent
scale experiments from any process (issue 22).

How: the command joins the tree at TOKEN as a short-lived client node (like ``chrysalis
ls``) with an in-memory replica of the five experiment tables
(``chrysalis.node._experiment_store``) replicated over its parent link
(``ReplicationTopology``). It waits until the parent reported having sent everything
(``peer_synchronized``), so it reads what the node at TOKEN knows, and after a write it waits
until the parent acknowledged the batch holding it, so the write is on its way through the
tree before the client leaves. Every decision goes through the claim ledger
(``chrysalis.node._claims``), the same code the nodes run.

Commands (the parser is ``chrysalis.node._cli``'s, so ``chrysalis --help`` imports no
SQLite): ``nodes [SELECTOR] [--state S]``, ``target SELECTOR [--seed N]`` (which nodes a
selector picks), ``submit NAME --sources SEL --destinations SEL [--kind
echo|stream-transfer] [--payload B] [--count N] [--warmup N] [--concurrency N]
[--run-timeout S] [--seed N] [--wait]``, ``experiments``, ``show NAME``, ``cancel NAME``;
``--json`` on each. ``submit`` returns once every source claimed the experiment
(``--wait``: once it ended), showing its progress on stderr (a bar on a terminal). Errors
are ``AdminError`` (one line, exit 1); a node that keeps no experiment tables is reported
as such at once.

Imports chrysalis-sqlite: ``chrysalis.node._cli_admin`` imports it, and ``chrysalis.node._cli``
imports that module only for ``admin``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TextIO

from chrysalis.core import LinkSide
from chrysalis.node._address import format_address
from chrysalis.node._baselines import (
    BASELINE_METHODS,
    MethodResult,
    decode_baselines,
    pair_ratios,
)
from chrysalis.node._claims import (
    TERMINAL,
    ExperimentLedger,
    ExperimentSpec,
    LedgerError,
    NodeRecord,
    NodeState,
    select_nodes,
)
from chrysalis.node._experiment_store import ExperimentStore, open_replica
from chrysalis.node._node import Node
from chrysalis.node._plot import PlotError, write_plot
from chrysalis.sqlite.topology import LinkReplicationStatus, ReplicationTopology

__all__ = [
    "AdminError",
    "experiment_report",
    "format_rows",
    "node_row",
    "run_admin",
]

_POLL: Final = 0.05
_PROGRESS_EVERY: Final = 1.0


class AdminError(Exception):
    """An admin command failed for a reason the user can act on (one line, exit 1)."""


# -- reports (pure) -----------------------------------------------------------------------------


def node_row(node: NodeRecord) -> dict[str, Any]:
    """The JSON shape of one node."""
    return {
        "pid": node.pid,
        "rank": node.rank,
        "task": node.task,
        "role": node.role,
        "level": node.level,
        "parent": node.parent,
        "carrier": node.carrier,
        "address": node.address,
        "labels": node.labels,
        "state": node.state.value,
        "incarnation": node.incarnation,
        "started_at": node.started_at,
        "losses": node.losses,
        "lost_at": node.lost_at,
        "lost_reason": node.lost_reason,
        "returned_at": node.returned_at,
        "returned_reason": node.returned_reason,
    }


def _experiment_row(ledger: ExperimentLedger, name: str) -> dict[str, Any]:
    record = ledger.experiments[name]
    spec = record.spec
    return {
        "name": name,
        "status": ledger.status(name),
        "kind": spec.kind,
        "payload": spec.payload,
        "count": spec.count,
        "warmup": spec.warmup,
        "concurrency": spec.concurrency,
        "timeout": spec.timeout,
        "baselines": spec.baselines,
        "sources": list(ledger.role_pids(name, "source")),
        "destinations": list(ledger.role_pids(name, "destination")),
        "submitted_by": record.submitted_by,
        "submitted_at": record.submitted_at,
        "cancelled_at": record.cancelled_at or None,
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def experiment_report(ledger: ExperimentLedger, name: str) -> dict[str, Any]:
    """``show``: the experiment, each source's claim, each pair's result, and a summary
    (pairs ok/failed, operations completed of planned, aggregate payload MiB/s: every
    pair's bytes over the longest pair's time, and the median, lowest and
    highest per-pair p50/p99: the pairs' own percentiles, since raw samples are not
    stored)."""
    if name not in ledger.experiments:
        raise AdminError(f"no experiment named {name!r}")
    report = _experiment_row(ledger, name)
    claims = []
    for source in report["sources"]:
        claim = ledger.claims.get((name, source))
        claims.append(
            {"source": source, "state": "pending", "attempt": 0, "error": ""}
            if claim is None
            else {
                "source": source,
                "state": claim.state.value,
                "attempt": claim.attempt,
                "incarnation": claim.incarnation,
                "claimed_at": claim.claimed_at,
                "updated_at": claim.updated_at,
                "error": claim.error,
            }
        )
    results: list[dict[str, Any]] = [
        {
            "source": r.source,
            "destination": r.destination,
            "status": r.status,
            "count": r.count,
            "completed": r.completed,
            "seconds": r.seconds,
            "p50_ms": r.p50_ms,
            "p90_ms": r.p90_ms,
            "p99_ms": r.p99_ms,
            "mean_ms": r.mean_ms,
            "max_ms": r.max_ms,
            "mib_per_second": r.mib_per_second,
            "error": r.error,
            **_baselines_of(r.p50_ms, r.p99_ms, r.mib_per_second, r.baselines),
        }
        for (e, _s, _d), r in sorted(ledger.results.items())
        if e == name
    ]
    planned = (
        sum(len(set(report["destinations"]) - {source}) for source in report["sources"])
        * report["count"]
    )
    ok: list[dict[str, Any]] = [r for r in results if r["status"] == "ok" and r["completed"]]
    summary: dict[str, Any] = {
        "pairs_ok": sum(r["status"] == "ok" for r in results),
        "pairs_failed": sum(r["status"] == "failed" for r in results),
        "sources_failed": sum(c["state"] == "failed" for c in claims),
        "completed": sum(r["completed"] for r in results),
        "planned": planned,
    }
    for key in ("p50_ms", "p99_ms"):
        values = [float(r[key]) for r in ok]
        summary[key] = (
            {"median": _median(values), "min": min(values), "max": max(values)} if values else None
        )
    summary["baseline_ratios"] = _ratio_summary(ok)
    summary["pooled_ratios"] = _pooled_ratio_summary(ok)
    pairs = [r for r in ledger.results.values() if r.experiment == name]
    longest = max((r.seconds for r in pairs), default=0.0)
    # every completed operation's payload (both ways for an echo) over the longest wall-clock
    # span; a pair's own MiB/s is over its busy time, so it cannot give its bytes back
    each = report["payload"] * (2 if report["kind"] == "echo" else 1) / (1024 * 1024)
    moved = sum(r.completed for r in pairs) * each
    summary["aggregate_mib_per_second"] = moved / longest if longest > 0 else 0.0
    report["claims"] = claims
    report["results"] = results
    report["summary"] = summary
    return report


def show(
    ledger: ExperimentLedger,
    names: str | Sequence[str],
    plot: str | None,
    emit: Callable[[object, str], None],
    err: TextIO,
) -> None:
    """``show NAME... [--plot FILE.png]``: each experiment's report (one report as itself,
    several as a list, for ``--json``), and the picture of them all when ``plot`` names a
    file (``chrysalis.node._plot``; a note on ``err`` says what it drew)."""
    wanted = [names] if isinstance(names, str) else list(names)
    reports = [experiment_report(ledger, name) for name in wanted]
    if len(reports) == 1:
        emit(reports[0], _show_text(reports[0]))
    else:
        emit(reports, "\n\n".join(_show_text(report) for report in reports))
    if plot:
        try:
            series = write_plot(reports, plot)
        except PlotError as exc:
            raise AdminError(str(exc)) from exc
        err.write(f"plot of {len(series)} series from {len(reports)} experiment(s): {plot}\n")
        err.flush()


def _baselines_of(p50: float, p99: float, rate: float, text: str) -> dict[str, Any]:
    """A result's ``baselines`` (per method, as stored) and ``ratios`` (Chrysalis over each
    baseline: ``chrysalis.node._baselines.pair_ratios``); an unreadable document is reported
    as ``baselines_error``, never raised."""
    try:
        found = decode_baselines(text)
    except ValueError as exc:
        return {"baselines": {}, "ratios": {}, "baselines_error": str(exc)}
    return {
        "baselines": {
            method: {
                "completed": b.completed,
                "seconds": b.seconds,
                "p50_ms": b.p50_ms,
                "p90_ms": b.p90_ms,
                "p99_ms": b.p99_ms,
                "mean_ms": b.mean_ms,
                "max_ms": b.max_ms,
                "mib_per_second": b.mib_per_second,
                "error": b.error,
            }
            for method, b in found.items()
        },
        "ratios": pair_ratios(p50, p99, rate, found),
    }


_POOLED: Final = "chrysalis-pooled"
"""The baseline method that is Chrysalis itself on one pooled stream (every echo on it)."""


def _ratio_summary(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per method, the median over the ok pairs of each ratio (``None`` where no pair has
    it)."""
    return _median_ratios([r.get("ratios", {}) for r in results])


def _pooled_ratio_summary(
    results: Sequence[dict[str, Any]],
) -> dict[str, dict[str, float | None]]:
    """The pooled Chrysalis stream against the direct baselines: per direct method (``udp``,
    ``tcp``, ``unix``, ``quic``), the median over the ok pairs of the ``chrysalis-pooled``
    figures over that method's (as ``baseline_ratios`` does for the fresh stream per echo);
    empty where no pair measured a pooled stream (stream transfers, ``--no-baselines``)."""
    per_pair: list[dict[str, dict[str, float | None]]] = []
    for result in results:
        baselines: dict[str, dict[str, Any]] = result.get("baselines") or {}
        pooled = baselines.get(_POOLED)
        if pooled is None:
            continue
        direct = {m: MethodResult(**b) for m, b in baselines.items() if m != _POOLED}
        per_pair.append(
            pair_ratios(pooled["p50_ms"], pooled["p99_ms"], pooled["mib_per_second"], direct)
        )
    return _median_ratios(per_pair)


def _median_ratios(
    per_pair: Sequence[Mapping[str, Mapping[str, float | None]]],
) -> dict[str, dict[str, float | None]]:
    """Per method (in ``BASELINE_METHODS`` order), the median of each ratio over the pairs
    that have it (``None`` where none has)."""
    summary: dict[str, dict[str, float | None]] = {}
    for method in BASELINE_METHODS:
        ratios = [pair[method] for pair in per_pair if method in pair]
        if not ratios:
            continue
        summary[method] = {}
        for key in ("p50", "p99", "throughput"):
            values = [value for x in ratios if (value := x[key]) is not None]
            summary[method][key] = _median(values) if values else None
    return summary


def format_rows(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table: columns two spaces apart, padded to the widest value, ``-`` for empty."""
    text = [[str(h) for h in header]] + [
        ["-" if v in ("", None) else str(v) for v in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in text) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in text
    )


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _show_text(report: dict[str, Any]) -> str:
    lines = [
        f"experiment {report['name']}: {report['status']} ({report['kind']}, payload "
        f"{report['payload']} B, {report['count']} timed + {report['warmup']} warm-up operations "
        f"per pair, concurrency {report['concurrency']}"
        f"{'' if report.get('baselines', True) else ', no baselines'})",
        format_rows(
            ("SOURCE", "STATE", "ATTEMPT", "ERROR"),
            [(c["source"][:8], c["state"], c["attempt"], c["error"]) for c in report["claims"]],
        ),
    ]
    if report["results"]:
        lines.append(
            format_rows(
                (
                    "SOURCE",
                    "DESTINATION",
                    "STATUS",
                    "DONE",
                    "P50_MS",
                    "P90_MS",
                    "P99_MS",
                    "MAX_MS",
                    "MIB_S",
                    "ERROR",
                ),
                [
                    (
                        r["source"][:8],
                        r["destination"][:8],
                        r["status"],
                        f"{r['completed']}/{r['count']}",
                        _ms(r["p50_ms"]),
                        _ms(r["p90_ms"]),
                        _ms(r["p99_ms"]),
                        _ms(r["max_ms"]),
                        f"{r['mib_per_second']:.2f}",
                        r["error"],
                    )
                    for r in report["results"]
                ],
            )
        )
    baseline_rows = [
        (
            r["source"][:8],
            r["destination"][:8],
            method,
            b["completed"],
            _ms(b["p50_ms"]),
            _ms(b["p99_ms"]),
            f"{b['mib_per_second']:.2f}",
            _ratio(r["ratios"][method]["p50"]),
            _ratio(r["ratios"][method]["p99"]),
            _ratio(r["ratios"][method]["throughput"]),
            b["error"],
        )
        for r in report["results"]
        for method, b in r.get("baselines", {}).items()
    ]
    if baseline_rows:
        lines.append(
            "baselines (RATIO = Chrysalis / baseline: latency above 1 and throughput below 1 "
            "mean Chrysalis is slower)"
        )
        lines.append(
            format_rows(
                (
                    "SOURCE",
                    "DESTINATION",
                    "METHOD",
                    "DONE",
                    "P50_MS",
                    "P99_MS",
                    "MIB_S",
                    "P50_RATIO",
                    "P99_RATIO",
                    "MIB_S_RATIO",
                    "ERROR",
                ),
                baseline_rows,
            )
        )
    s = report["summary"]
    for method, ratios in s.get("baseline_ratios", {}).items():
        lines.append(
            f"median ratio to {method}: p50 {_ratio(ratios['p50'])}, p99 {_ratio(ratios['p99'])}, "
            f"throughput {_ratio(ratios['throughput'])}"
        )
    for method, ratios in s.get("pooled_ratios", {}).items():
        lines.append(
            f"pooled stream, median ratio to {method}: p50 {_ratio(ratios['p50'])}, "
            f"p99 {_ratio(ratios['p99'])}, throughput {_ratio(ratios['throughput'])}"
        )
    line = (
        f"pairs ok {s['pairs_ok']}, failed {s['pairs_failed']}; sources failed "
        f"{s['sources_failed']}; operations {s['completed']}/{s['planned']}; "
        f"aggregate {s['aggregate_mib_per_second']:.2f} MiB/s"
    )
    if s["p50_ms"] is not None:
        p50, p99 = s["p50_ms"], s["p99_ms"]
        line += (
            f"; p50 median {_ms(p50['median'])} ms ({_ms(p50['min'])}..{_ms(p50['max'])}), "
            f"p99 median {_ms(p99['median'])} ms ({_ms(p99['min'])}..{_ms(p99['max'])})"
        )
    lines.append(line)
    return "\n".join(lines)


class _Progress:
    """Submit's progress on stderr: a bar of timed operations (completed of planned, as the
    sources publish them: ``scale_progress``, about once a second each; ended sources by
    their results) redrawn in place on a terminal, otherwise a line when the counts change
    (at most one a second)."""

    def __init__(self, err: TextIO, name: str, sources: int) -> None:
        self._err = err
        self._name = name
        self._sources = sources
        self._tty = bool(getattr(err, "isatty", lambda: False)())
        self._last: tuple[int, int, int, int] | None = None
        self._at = -math.inf
        self._drawn = False

    def show(self, claimed: int, finished: int, done: int = 0, planned: int = 0) -> None:
        now = time.monotonic()
        state = (claimed, finished, done, planned)
        if state == self._last or (not self._tty and now - self._at < _PROGRESS_EVERY):
            return
        self._last, self._at = state, now
        counts = f"{claimed}/{self._sources} claimed, {finished}/{self._sources} ended"
        if planned:
            counts = f"{done}/{planned} operations, {counts}"
        if self._tty:
            width = 30
            if planned:
                filled = width * min(done, planned) // planned
            else:
                filled = width * finished // max(1, self._sources)
            bar = "#" * filled + "-" * (width - filled)
            self._err.write(f"\r[admin] {self._name} [{bar}] {counts}")
            self._drawn = True
        else:
            self._err.write(f"[admin] {self._name}: {counts}\n")
        self._err.flush()

    def close(self) -> None:
        if self._drawn:
            self._err.write("\n")
            self._err.flush()


def operations(
    ledger: ExperimentLedger, published: Mapping[str, tuple[int, int]], name: str
) -> tuple[int, int]:
    """``(done, planned)`` timed operations of experiment ``name``: every source plans
    ``count`` per destination but itself; an ended source counts its results' completed
    operations, a running one what it last published (``ExperimentStore.progress``)."""
    count = ledger.experiments[name].spec.count
    destinations = ledger.role_pids(name, "destination")
    done = planned = 0
    for source in ledger.role_pids(name, "source"):
        planned += count * sum(pid != source for pid in destinations)
        claim = ledger.claims.get((name, source))
        if claim is not None and claim.state in TERMINAL:
            done += sum(
                r.completed
                for (experiment, src, _dst), r in ledger.results.items()
                if experiment == name and src == source
            )
        else:
            done += published.get(source, (0, 0))[0]
    return done, planned


# -- running ------------------------------------------------------------------------------------


def _parent_link(topology: ReplicationTopology) -> LinkReplicationStatus | None:
    for link in topology.links():
        if link.side is LinkSide.PARENT:
            return link
    return None


async def _until(predicate: Callable[[], bool], deadline: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    while not predicate():
        if loop.time() > deadline:
            raise AdminError(f"timed out waiting for {what}")
        await asyncio.sleep(_POLL)


async def run_admin(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    node: Node,
    wait_connected: Callable[[], Awaitable[None]],
) -> int:
    """Run one admin command on ``node`` (a client node, not started yet) joined at
    ``args.token``; ``wait_connected`` waits for its parent (raising on timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    replica = open_replica(":memory:")
    topology = ReplicationTopology(node, replica, poll_interval=0.1)
    store = ExperimentStore(replica)
    try:
        async with node, topology:
            await wait_connected()

            def synchronized() -> bool:
                sessions = topology.link_sessions
                if sessions.refused_links or sessions.failure is not None:
                    where = format_address(args.token.address)
                    raise AdminError(
                        f"the node at {where} keeps no experiment tables (it refused the "
                        "replication session: not a `chrysalis scale --persist` process?)"
                    )
                link = _parent_link(topology)
                return link is not None and link.peer_synchronized

            await _until(synchronized, deadline, "the parent's experiment tables")
            return await _command(args, out, err, node, topology, store, deadline)
    finally:
        replica.close()


async def _upstream(
    topology: ReplicationTopology, sent_before: int, changes: int, deadline: float
) -> None:
    """Until the parent acknowledged ``changes`` more changes than ``sent_before``."""

    def acked() -> bool:
        link = _parent_link(topology)
        return (
            link is not None
            and link.statistics.changes_sent >= sent_before + changes
            and link.batch_in_flight is None
        )

    await _until(acked, deadline, "the parent to acknowledge the write")


def _sent(topology: ReplicationTopology) -> int:
    link = _parent_link(topology)
    return 0 if link is None else link.statistics.changes_sent


async def _command(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    node: Node,
    topology: ReplicationTopology,
    store: ExperimentStore,
    deadline: float,
) -> int:
    action = args.admin_command
    ledger = store.ledger()

    def emit(record: object, text: str) -> None:
        out.write((json.dumps(record) if args.json else text) + "\n")
        out.flush()

    def nodes_table(nodes: Sequence[NodeRecord]) -> str:
        return format_rows(
            ("PID", "RANK", "TASK", "ROLE", "LEVEL", "PARENT", "STATE", "INC", "LOSSES", "ADDRESS"),
            [
                (
                    n.pid if args.full else n.pid[:8],
                    n.rank,
                    n.task,
                    n.role,
                    n.level,
                    n.parent[:8],
                    n.state.value,
                    n.incarnation,
                    n.losses,
                    n.address,
                )
                for n in nodes
            ],
        )

    try:
        if action in ("nodes", "target"):
            every = sorted(ledger.nodes.values(), key=lambda n: (n.rank, n.pid))
            if action == "nodes":
                if args.selector is not None:
                    picked = set(select_nodes(every, args.selector, live_only=False))
                    every = [n for n in every if n.pid in picked]
                if args.state != "any":
                    every = [n for n in every if n.state is NodeState(args.state)]
            else:
                picked = set(select_nodes(every, args.selector, seed=args.seed))
                every = [n for n in every if n.pid in picked]
            emit([node_row(n) for n in every], nodes_table(every))
            return 0
        if action == "experiments":
            order = sorted(ledger.experiments.values(), key=lambda e: (e.submitted_at, e.name))
            rows = [_experiment_row(ledger, e.name) for e in order]
            emit(
                rows,
                format_rows(
                    ("NAME", "STATUS", "KIND", "PAYLOAD", "COUNT", "SOURCES", "DESTINATIONS"),
                    [
                        (
                            r["name"],
                            r["status"],
                            r["kind"],
                            r["payload"],
                            r["count"],
                            len(r["sources"]),
                            len(r["destinations"]),
                        )
                        for r in rows
                    ],
                ),
            )
            return 0
        if action == "show":
            show(ledger, args.name, getattr(args, "plot", None), emit, err)
            return 0
        if action == "cancel":
            before = _sent(topology)
            decision = store.apply(lambda ledger: ledger.cancel(args.name, time.time()))
            await _upstream(topology, before, len(decision.records), deadline)
            row = _experiment_row(store.ledger(), args.name)
            emit(row, f"{args.name}  {row['status']}")
            return 0
        return await _submit(args, err, topology, store, deadline, emit, node)
    except LedgerError as exc:
        raise AdminError(str(exc)) from exc


async def _submit(
    args: argparse.Namespace,
    err: TextIO,
    topology: ReplicationTopology,
    store: ExperimentStore,
    deadline: float,
    emit: Callable[[object, str], None],
    node: Node,
) -> int:
    spec = ExperimentSpec(
        args.name,
        kind=args.kind,
        payload=args.payload,
        count=args.count,
        warmup=args.warmup,
        concurrency=args.concurrency,
        timeout=args.run_timeout,
        baselines=not args.no_baselines,
    )
    nodes = list(store.ledger().nodes.values())
    sources = select_nodes(nodes, args.sources, seed=args.seed)
    destinations = select_nodes(nodes, args.destinations, seed=args.seed)
    before = _sent(topology)
    decision = store.apply(
        lambda ledger: ledger.submit(
            spec, sources, destinations, submitted_by=node.pid.hex(), now=time.time()
        )
    )
    await _upstream(topology, before, len(decision.records), deadline)
    progress = _Progress(err, args.name, len(sources))

    def ended() -> bool:
        ledger = store.ledger()
        claims = [ledger.claims.get((args.name, s)) for s in sources]
        claimed = sum(c is not None for c in claims)
        finished = sum(c is not None and c.state in TERMINAL for c in claims)
        progress.show(claimed, finished, *operations(ledger, store.progress(args.name), args.name))
        return finished == len(sources) if args.wait else claimed == len(sources)

    try:
        await _until(ended, deadline, "the sources to " + ("finish" if args.wait else "claim"))
    finally:
        progress.close()
    row = _experiment_row(store.ledger(), args.name)
    emit(
        row,
        f"{args.name}  {row['status']}  sources={len(sources)} destinations={len(destinations)}",
    )
    return 0
