"""Replication throughput of ``chrysalis.sqlite`` across five processes, against a plain pipeline.

Usage::

    python benchmarks/sqlite_replication.py [--quick] [--smoke] [--case NAME] [--rows N]
                                            [--json OUT] [--write-readme] [--profile DIR]

Five forked processes form the tree of ``packages/chrysalis-sqlite/tests/
test_topology_processes.py`` (``root``; ``a`` and ``b`` under it; ``a1`` under ``a``, ``b1``
under ``b``), each with its own database file. Every case runs the same rows two ways,
alternately (``A B A B ...``, see ``benchmarks/_common.py``), each trial on fresh files and
fresh processes:

- **baseline** (plain): the plainest pipeline that copies rows along the same tree. Each
  process holds a plain ``sqlite3`` connection and Unix stream sockets to its tree
  neighbours. A writer inserts a transaction of rows (``executemany``), then ships those rows
  as one msgspec (msgpack) frame to every neighbour; a process inserts each batch of frames it
  received in one transaction (``executemany``) and forwards the frames unchanged to its other
  neighbours. No change log, no acknowledgements, no conflict resolution, no recovery: it only
  works because nothing fails.
- **candidate** (chrysalis): each process runs a ``chrysalis.node.Node`` (QUIC over UDP on
  loopback) with a ``ReplicationTopology`` on a ``Replica``; writers write through
  ``replica.transaction()`` with ``tx.upsert`` per row, and the ``chrysalis.sql.v5`` sessions
  carry the changes (captured, batched, acknowledged, applied under last-writer-wins).

Both sides are set up completely before the clock starts (processes, links, replication
sessions synchronized). The clock starts when the writers are told to go and stops when the
last of the five databases holds every row (each process notes the time, on the shared
monotonic clock, right after the commit that completed its copy). **Rows per second
replicated** = rows / that time to converge. The headline number is the slowdown, the ratio
of the median rates (plain median / chrysalis median): what the replication protocol costs
over just moving the same rows. After each trial every database is checked against the
expected rows (count and a digest of the ordered contents).

Cases:

``leaf-writer``
    every row written at the leaf ``a1`` (it travels a1 -> a -> root -> b -> b1: four hops
    to the farthest copy).
``spread-writers``
    every process writes a fifth of the rows, all at once.

Rows are ``(id TEXT PRIMARY KEY, author TEXT, n INTEGER, message TEXT)`` with a 43-character
message, written 100 per transaction. Full run: 100 000 rows; ``--quick``: 10 000;
``--smoke``: 200 (one round, only proves the machinery works).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import selectors
import socket
import sqlite3
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks._common`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    BenchmarkError,
    CaseResult,
    Child,
    ChildLink,
    Trial,
    add_run_arguments,
    alternate,
    check_cases,
    filesystem_of,
    machine_facts,
    machine_line,
    run_mode,
    write_json,
    write_readme_subsection,
)
from chrysalis.sqlite import Replica, TableSchema  # noqa: E402

README: Final = ROOT / "packages" / "chrysalis-sqlite" / "README.md"
SUBSECTION: Final = "### Replication across five processes"
MESSAGE: Final = "the quick brown fox jumps over the lazy dog"
ROWS_PER_TRANSACTION: Final = 100
TABLE: Final = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, n INTEGER, message TEXT)",
    ["id", "author", "n", "message"],
    ["id"],
)
INSERT: Final = "INSERT INTO notes (id, author, n, message) VALUES (?, ?, ?, ?)"
TREE: Final = (("root", None), ("a", "root"), ("b", "root"), ("a1", "a"), ("b1", "b"))
LEVELS: Final = (("root",), ("a", "b"), ("a1", "b1"))
SETUP_TIMEOUT: Final = 30.0
"""Seconds allowed for one process to start, connect or synchronize (each step)."""
MIN_RUN_TIMEOUT: Final = 30.0
ROWS_PER_SECOND_FLOOR: Final = 500.0
"""A trial fails (``BenchmarkError``) if it replicates slower than this: it has hung."""
MAX_FRAME: Final = 8 * 1024 * 1024
"""Largest frame the plain pipeline accepts (a frame carries one transaction's rows)."""
MAX_INSERT_ROWS: Final = 4096
"""Most received rows the plain pipeline inserts in one transaction."""
_LEN: Final = struct.Struct(">I")


@dataclass(frozen=True)
class Config:
    """How many rows and rounds."""

    rows: int
    rounds: int
    budget_s: float


FULL: Final = Config(rows=100_000, rounds=3, budget_s=300.0)
QUICK: Final = Config(rows=10_000, rounds=3, budget_s=90.0)
SMOKE: Final = Config(rows=200, rounds=1, budget_s=1.0)


@dataclass(frozen=True)
class Case:
    """One row of the table: who writes."""

    name: str
    writers: tuple[str, ...]
    label: str


CASES: Final = (
    Case("leaf-writer", ("a1",), "all rows at leaf a1"),
    Case("spread-writers", tuple(name for name, _ in TREE), "a fifth at each process"),
)


# --------------------------------------------------------------------------------------------
# Rows, shares and checks (shared by both sides)


def neighbours(name: str) -> tuple[str, ...]:
    """The tree neighbours of process ``name`` (parent first)."""
    parent = dict(TREE)[name]
    children = tuple(child for child, up in TREE if up == name)
    return ((parent,) if parent else ()) + children


def shares(case: Case, rows: int) -> dict[str, int]:
    """Rows each process writes: ``rows`` split as evenly as possible over the writers."""
    base, extra = divmod(rows, len(case.writers))
    counts = {name: 0 for name, _ in TREE}
    for i, writer in enumerate(case.writers):
        counts[writer] = base + (1 if i < extra else 0)
    return counts


def make_rows(writer: str, start: int, stop: int) -> list[tuple[str, str, int, str]]:
    """Rows ``start .. stop - 1`` of ``writer`` (deterministic, so every side writes the same)."""
    return [(f"{writer}-{i:07d}", writer, i, MESSAGE) for i in range(start, stop)]


def last_ids(counts: dict[str, int]) -> tuple[str, ...]:
    """The id of each writer's last row (present everywhere = that writer is replicated)."""
    return tuple(f"{w}-{n - 1:07d}" for w, n in counts.items() if n > 0)


def expected_digest(counts: dict[str, int]) -> str:
    """The digest every database must have at the end (see ``table_digest``)."""
    rows = sorted(r for w, n in counts.items() for r in make_rows(w, 0, n))
    digest = hashlib.sha256()
    for start in range(0, len(rows), 10_000):
        digest.update(msgspec.msgpack.encode(rows[start : start + 10_000]))
    return digest.hexdigest()


def table_digest(conn: sqlite3.Connection) -> tuple[int, str]:
    """The row count and a SHA-256 of every row in ``id`` order, 10 000 rows per update."""
    digest = hashlib.sha256()
    count = 0
    cursor = conn.execute("SELECT id, author, n, message FROM notes ORDER BY id")
    while batch := cursor.fetchmany(10_000):
        digest.update(msgspec.msgpack.encode(batch))
        count += len(batch)
    return count, digest.hexdigest()


class Convergence:
    """Notes the moment a database first holds every expected row.

    ``check()`` (call it after every commit) looks up each writer's last row; once all are
    there it confirms with a full count (a writer's rows travel in order, so the count
    normally matches at once) and records ``time.monotonic()`` in ``at``.
    """

    def __init__(self, conn: sqlite3.Connection, ids: Sequence[str], total: int) -> None:
        self._conn = conn
        self._pending = list(ids)
        self._total = total
        self.at: float | None = None

    def check(self) -> None:
        """Update ``at`` if the database has just become complete."""
        if self.at is not None:
            return
        conn = self._conn
        self._pending = [
            i
            for i in self._pending
            if conn.execute("SELECT 1 FROM notes WHERE id = ?", (i,)).fetchone() is None
        ]
        if self._pending:
            return
        (count,) = conn.execute("SELECT COUNT(*) FROM notes").fetchone()
        if count >= self._total:
            self.at = time.monotonic()


@dataclass(frozen=True)
class NodeSpec:
    """What one process of a trial does."""

    name: str
    db: str
    writes: int
    last_ids: tuple[str, ...]
    total: int
    run_timeout: float
    ca_dir: str = ""


@dataclass(frozen=True)
class NodeReport:
    """What one process reports after its database converged (monotonic clock times)."""

    started: float
    written: float
    converged: float


@dataclass
class TrialDetail:
    """Per-trial numbers beyond the rate (kept for the table and the JSON)."""

    converge_s: float
    write_s: float
    per_node_s: dict[str, float] = field(default_factory=dict)


def _run_timeout(rows: int) -> float:
    return max(MIN_RUN_TIMEOUT, rows / ROWS_PER_SECOND_FLOOR)


def _specs(case: Case, rows: int, folder: Path, side: str, ca_dir: str = "") -> list[NodeSpec]:
    counts = shares(case, rows)
    ids = last_ids(counts)
    stamp = f"{side}-{time.monotonic_ns()}"
    return [
        NodeSpec(
            name=name,
            db=str(folder / f"{case.name}-{stamp}-{name}.sqlite"),
            writes=counts[name],
            last_ids=ids,
            total=rows,
            run_timeout=_run_timeout(rows),
            ca_dir=ca_dir,
        )
        for name, _ in TREE
    ]


def _report(message: object, name: str) -> NodeReport:
    if not isinstance(message, NodeReport):
        raise BenchmarkError(f"{name}: expected a report, got {message!r:.200}")
    return message


def _collect(
    children: dict[str, Child], specs: list[NodeSpec], rows: int, counts: dict[str, int]
) -> tuple[Trial, TrialDetail]:
    """Start the writers, wait for every report, verify every database, build the trial."""
    for child in children.values():
        child.send("go")
    timeout = _run_timeout(rows)
    reports = {name: _report(child.receive(timeout), name) for name, child in children.items()}
    for child in children.values():
        child.send("verify")
    want = (rows, expected_digest(counts))
    for name, child in children.items():
        got = child.receive(SETUP_TIMEOUT + rows / 20_000)
        if got != want:
            raise BenchmarkError(f"{name}: database holds {got!r}, expected {want!r}")
    writers = [s.name for s in specs if s.writes]
    start = min(reports[w].started for w in writers)
    end = max(r.converged for r in reports.values())
    write_end = max(reports[w].written for w in writers)
    detail = TrialDetail(
        converge_s=end - start,
        write_s=write_end - start,
        per_node_s={name: r.converged - start for name, r in reports.items()},
    )
    return Trial(counted=rows, seconds=end - start, received=rows, sent=rows), detail


# --------------------------------------------------------------------------------------------
# Baseline: plain sqlite3 files and a Unix-socket pipeline along the tree


def _frame(rows: Sequence[Sequence[object]]) -> bytes:
    payload = msgspec.msgpack.encode(rows)
    return _LEN.pack(len(payload)) + payload


def _take_frames(buffer: bytearray, out: list[bytes]) -> None:
    """Move every complete frame (length prefix included) from ``buffer`` to ``out``."""
    offset = 0
    while len(buffer) - offset >= 4:
        (length,) = _LEN.unpack_from(buffer, offset)
        if length > MAX_FRAME:
            raise BenchmarkError(f"frame of {length} bytes exceeds {MAX_FRAME}")
        end = offset + 4 + length
        if end > len(buffer):
            break
        out.append(bytes(buffer[offset:end]))
        offset = end
    del buffer[:offset]


def plain_node(
    link: ChildLink, spec: NodeSpec, mine: dict[str, socket.socket], others: list[socket.socket]
) -> None:
    """One process of the plain pipeline (runs in a forked child)."""
    for sock in others:
        sock.close()
    conn = sqlite3.connect(spec.db, isolation_level=None)
    try:
        conn.execute(TABLE.create_sql)
        watcher = Convergence(conn, spec.last_ids, spec.total)
        selector = selectors.DefaultSelector()
        inbox = {peer: bytearray() for peer in mine}
        outbox = {peer: bytearray() for peer in mine}
        for peer, sock in mine.items():
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, peer)
        link.send("ready")
        if link.receive(SETUP_TIMEOUT) != "go":
            raise BenchmarkError("expected go")
        started = time.monotonic()
        deadline = started + spec.run_timeout
        next_row = 0
        written = started if not spec.writes else None

        def insert(rows: Sequence[Sequence[object]]) -> None:
            conn.execute("BEGIN")
            conn.executemany(INSERT, rows)
            conn.execute("COMMIT")

        while watcher.at is None or written is None or any(outbox.values()):
            if time.monotonic() > deadline:
                raise BenchmarkError(f"{spec.name}: no convergence within {spec.run_timeout} s")
            wait = 0.05
            # a writer writes one transaction per turn while its outgoing buffers are short
            if next_row < spec.writes and all(len(b) < MAX_FRAME for b in outbox.values()):
                rows = make_rows(spec.name, next_row, min(spec.writes, next_row + 100))
                insert(rows)
                frame = _frame(rows)
                for buffer in outbox.values():
                    buffer += frame
                next_row += len(rows)
                if next_row == spec.writes:
                    written = time.monotonic()
                watcher.check()
                wait = 0.0
            frames: list[tuple[str, bytes]] = []
            for key, events in selector.select(wait):
                peer = key.data
                sock = mine[peer]
                if events & selectors.EVENT_READ:
                    data = sock.recv(1 << 20)
                    if not data:
                        raise BenchmarkError(f"{spec.name}: {peer} closed its socket")
                    inbox[peer] += data
                if events & selectors.EVENT_WRITE and outbox[peer]:
                    sent = sock.send(outbox[peer])
                    del outbox[peer][:sent]
            for peer, buffer in inbox.items():
                complete: list[bytes] = []
                _take_frames(buffer, complete)
                frames.extend((peer, f) for f in complete)
            if frames:
                received = [row for _, f in frames for row in msgspec.msgpack.decode(f[4:])]
                for start in range(0, len(received), MAX_INSERT_ROWS):
                    insert(received[start : start + MAX_INSERT_ROWS])
                for source, f in frames:
                    for peer, buffer in outbox.items():
                        if peer != source:
                            buffer += f
                watcher.check()
            for peer, sock in mine.items():
                if outbox[peer]:
                    try:
                        sent = sock.send(outbox[peer])
                    except BlockingIOError:
                        sent = 0
                    del outbox[peer][:sent]
                mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if outbox[peer] else 0)
                selector.modify(sock, mask, peer)
        if watcher.at is None or written is None:  # the loop ends only when both are set
            raise BenchmarkError(f"{spec.name}: ended without converging")
        link.send(NodeReport(started, written, watcher.at))
        if link.receive(spec.run_timeout) != "verify":
            raise BenchmarkError("expected verify")
        link.send(table_digest(conn))
    finally:
        conn.close()
        for sock in mine.values():
            sock.close()


def plain_trial(case: Case, rows: int, folder: Path) -> tuple[Trial, TrialDetail]:
    """One baseline trial: five plain processes, fresh files and sockets."""
    specs = _specs(case, rows, folder, "plain")
    pairs: dict[tuple[str, str], tuple[socket.socket, socket.socket]] = {}
    for name, parent in TREE:
        if parent is not None:
            pairs[(parent, name)] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    every = [s for pair in pairs.values() for s in pair]
    children: dict[str, Child] = {}
    try:
        for spec in specs:
            mine: dict[str, socket.socket] = {}
            for (up, down), (up_end, down_end) in pairs.items():
                if up == spec.name:
                    mine[down] = up_end
                elif down == spec.name:
                    mine[up] = down_end
            others = [s for s in every if all(s is not m for m in mine.values())]
            child = Child(plain_node, spec, mine, others, name=f"plain-{spec.name}")
            children[spec.name] = child.start()
        for sock in every:
            sock.close()  # the children hold their own ends
        for name, child in children.items():
            if child.receive(SETUP_TIMEOUT) != "ready":
                raise BenchmarkError(f"{name}: expected ready")
        return _collect(children, specs, rows, shares(case, rows))
    finally:
        for child in children.values():
            child.stop(5.0)
        for sock in every:
            sock.close()


# --------------------------------------------------------------------------------------------
# Candidate: Node + ReplicationTopology per process


PROFILE_ENV: Final = "CHRYSALIS_SQLITE_BENCH_PROFILE"
"""Set by ``--profile DIR``: each chrysalis process writes its ``cProfile`` statistics there."""


def chrysalis_node(link: ChildLink, spec: NodeSpec) -> None:
    """One process of the chrysalis tree (runs in a forked child)."""
    folder = os.environ.get(PROFILE_ENV)
    if not folder:
        asyncio.run(_chrysalis_main(link, spec))
        return
    import cProfile

    profiler = cProfile.Profile()
    try:
        profiler.runcall(asyncio.run, _chrysalis_main(link, spec))
    finally:
        profiler.dump_stats(os.path.join(folder, f"{spec.name}.{os.getpid()}.pstats"))


async def _receive(link: ChildLink, timeout: float) -> object:
    return await asyncio.to_thread(link.receive, timeout)


async def _chrysalis_main(link: ChildLink, spec: NodeSpec) -> None:
    from chrysalis.core import DatagramAddr, Pid
    from chrysalis.node import JoinSettings, Node
    from chrysalis.quic import DevelopmentCA
    from chrysalis.sqlite.topology import ReplicationTopology

    parent = await _receive(link, SETUP_TIMEOUT)
    join = None
    if parent is not None:
        assert isinstance(parent, tuple)
        address, pid = parent
        join = JoinSettings(DatagramAddr.parse(address), Pid.parse(pid), retry_delay=0.1)
    identity = DevelopmentCA.load_or_create(Path(spec.ca_dir)).issue()
    node = Node(identity, listen="udp://127.0.0.1:0", parent=join)
    replica = Replica(spec.db, [TABLE])
    try:
        watcher = Convergence(replica.connection, spec.last_ids, spec.total)
        replica.add_change_listener(watcher.check)
        topology = ReplicationTopology(node, replica, retry_delay=0.1, poll_interval=0.1)
        degree = len(neighbours(spec.name))
        async with node, topology:
            link.send((str(node.local_addr), node.pid.hex()))
            async with asyncio.timeout(SETUP_TIMEOUT):
                await node.wait_connected()
                while not _synchronized(topology, degree, spec.name == "root"):
                    await asyncio.sleep(0.01)
            link.send("ready")
            if await _receive(link, SETUP_TIMEOUT) != "go":
                raise BenchmarkError("expected go")
            started = time.monotonic()
            async with asyncio.timeout(spec.run_timeout):
                for start in range(0, spec.writes, ROWS_PER_TRANSACTION):
                    stop = min(spec.writes, start + ROWS_PER_TRANSACTION)
                    with replica.transaction() as tx:
                        for row in make_rows(spec.name, start, stop):
                            tx.upsert("notes", row)
                    await asyncio.sleep(0)  # let the sessions run between transactions
                written = time.monotonic()
                while watcher.at is None:
                    watcher.check()
                    await asyncio.sleep(0.005)
            link.send(NodeReport(started, written, watcher.at))
            if await _receive(link, spec.run_timeout) != "verify":
                raise BenchmarkError("expected verify")
            # the processes now stop one by one, and each stop resets its peers' sessions:
            # expected here, so those warnings are not printed
            logging.getLogger("chrysalis").setLevel(logging.ERROR)
        link.send(table_digest(replica.connection))
    finally:
        replica.close()


def _synchronized(topology: Any, degree: int, is_root: bool) -> bool:
    """Every link has a live session that finished its first exchange, and (at the root) the
    subtree scope covers all five sites."""
    from chrysalis.sqlite import SessionState

    links = topology.links()
    if len(links) != degree:
        return False
    if not all(s.state is SessionState.READY and s.peer_synchronized for s in links):
        return False
    sites = topology.upstream_scope.sites
    return not is_root or (sites is not None and len(sites.site_ids) == len(TREE))


def chrysalis_trial(case: Case, rows: int, folder: Path, ca_dir: str) -> tuple[Trial, TrialDetail]:
    """One candidate trial: five Node processes, fresh files and identities."""
    specs = {s.name: s for s in _specs(case, rows, folder, "chrysalis", ca_dir)}
    children: dict[str, Child] = {}
    addresses: dict[str, tuple[str, str]] = {}
    try:
        for level in LEVELS:
            for name in level:
                child = Child(chrysalis_node, specs[name], name=f"chrysalis-{name}").start()
                children[name] = child
                parent = dict(TREE)[name]
                child.send(addresses[parent] if parent else None)
            for name in level:
                reply = children[name].receive(SETUP_TIMEOUT)
                if not (isinstance(reply, tuple) and len(reply) == 2):
                    raise BenchmarkError(f"{name}: expected its address, got {reply!r:.200}")
                addresses[name] = (str(reply[0]), str(reply[1]))
        for name, child in children.items():
            if child.receive(SETUP_TIMEOUT) != "ready":
                raise BenchmarkError(f"{name}: expected ready")
        return _collect(children, list(specs.values()), rows, shares(case, rows))
    finally:
        for child in children.values():
            child.stop(5.0)


# --------------------------------------------------------------------------------------------
# Running and reporting


def run_case(case: Case, config: Config, folder: Path, ca_dir: str) -> CaseResult:
    """Alternate plain and chrysalis trials of ``case``."""
    details: dict[str, list[TrialDetail]] = {"plain": [], "chrysalis": []}

    def keep(side: str, run: Callable[[], tuple[Trial, TrialDetail]]) -> Callable[[], Trial]:
        def trial() -> Trial:
            result, detail = run()
            details[side].append(detail)
            return result

        return trial

    base, cand = alternate(
        keep("plain", lambda: plain_trial(case, config.rows, folder)),
        keep("chrysalis", lambda: chrysalis_trial(case, config.rows, folder, ca_dir)),
        config.rounds,
        budget_s=config.budget_s,
    )
    return CaseResult(
        case.name,
        "plain sqlite3 + Unix-socket pipeline",
        "chrysalis Node + ReplicationTopology",
        None,
        baseline=base,
        candidate=cand,
        extra={
            "rows": config.rows,
            "writers": list(case.writers),
            "label": case.label,
            "plain": [vars(d) for d in details["plain"]],
            "chrysalis": [vars(d) for d in details["chrysalis"]],
        },
    )


def slowdown(result: CaseResult) -> float:
    """Plain median rate over chrysalis median rate (the headline number)."""
    return result.baseline_median / result.candidate_median


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _rate(rate: float) -> str:
    return f"{rate / 1000:.1f} k" if rate >= 1000 else f"{rate:.0f}"


def _write_rate(result: CaseResult) -> str:
    runs = result.extra["chrysalis"]
    rates = [result.extra["rows"] / d["write_s"] for d in runs if d["write_s"] > 0]
    return _rate(_median(rates)) if rates else "-"


def markdown(results: Sequence[CaseResult], meta: dict[str, Any]) -> str:
    """The replication subsection of the README's benchmark section."""
    lines = [
        SUBSECTION,
        "",
        "Measured by `benchmarks/sqlite_replication.py` "
        f"({meta['mode']} run, {machine_line(meta)}, "
        f"SQLite {meta['sqlite']}, database files on {meta['filesystem']}): five processes "
        "in a tree (root; a, b; a1 under a, b1 under b), each with its own database file, "
        f"{ROWS_PER_TRANSACTION} rows per transaction. Plain: `sqlite3` files and the rows "
        "shipped as msgpack frames over Unix sockets along the same tree, inserted with "
        "`executemany` at each hop. Chrysalis: a `Node` (QUIC over UDP on loopback) and a "
        "`ReplicationTopology` per process, rows written with `tx.upsert`. Time to converge: "
        "from the writers' start until the last database holds every row (plain and "
        "chrysalis trials alternate; rates are medians).",
        "",
        "| case | rows | plain rows/s | chrysalis rows/s | slowdown (ratio of medians) "
        "| plain converge s | chrysalis converge s | chrysalis write rows/s | rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        plain_s = _median([d["converge_s"] for d in r.extra["plain"]])
        cand_s = _median([d["converge_s"] for d in r.extra["chrysalis"]])
        lines.append(
            f"| {r.name} ({r.extra['label']}) | {r.extra['rows']} "
            f"| {_rate(r.baseline_median)} | {_rate(r.candidate_median)} | {slowdown(r):.2f}x "
            f"| {plain_s:.2f} | {cand_s:.2f} | {_write_rate(r)} | {len(r.candidate)} |"
        )
    lines.append("")
    return "\n".join(lines)


def _iter_cases(names: Sequence[str]) -> Iterator[Case]:
    return (c for c in CASES if not names or c.name in names)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="10 000 rows",
        smoke="200 rows, one round",
        cases=[c.name for c in CASES],
        readme="replace the replication subsection of the package README's benchmark section",
    )
    parser.add_argument("--rows", type=int, help="override the number of rows")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write each chrysalis process's cProfile statistics into this folder",
    )
    args = parser.parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ[PROFILE_ENV] = str(args.profile.resolve())
    check_cases(parser, args.case, [c.name for c in CASES])
    config = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.rows is not None:
        if args.rows < len(TREE):
            parser.error(f"--rows must be at least {len(TREE)}")
        config = Config(args.rows, config.rounds, config.budget_s)
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        config = Config(config.rows, args.rounds, config.budget_s)
    started = time.monotonic()
    from chrysalis.quic import DevelopmentCA

    with tempfile.TemporaryDirectory(prefix="sqlite-replication-") as folder:
        ca_dir = os.path.join(folder, "ca")
        DevelopmentCA.load_or_create(Path(ca_dir))
        meta: dict[str, Any] = {
            "mode": run_mode(args),
            **machine_facts(),
            "sqlite": sqlite3.sqlite_version,
            "filesystem": filesystem_of(folder),
            "config": {"rows": config.rows, "rounds": config.rounds},
        }
        results: list[CaseResult] = []
        for case in _iter_cases(args.case):
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            results.append(run_case(case, config, Path(folder), ca_dir))
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    section = markdown(results, meta)
    print(section)
    if args.json is not None:
        document = {
            **meta,
            "cases": [{**r.to_json(), "slowdown": slowdown(r)} for r in results],
        }
        write_json(args.json, document)
    if args.write_readme:
        write_readme_subsection(README, SUBSECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
