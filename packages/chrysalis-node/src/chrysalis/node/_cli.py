"""The ``chrysalis`` command (upper spec 6): identities, long-running nodes and namespace tools.

Why these commands: a person (or a script) should be able to start a local tree, see what is in
it and talk to any process without writing Python. ``serve`` starts a root and prints its join
token as the first stdout line; ``join TOKEN`` starts a child; ``ls``, ``resolve``, ``pipe`` and
``ping`` start a short-lived client node joined at TOKEN, do one thing and leave (a clean
shutdown withdraws the client from the namespace at once).

Sockets: every node binds the carriers given with ``--listen`` (the first one is in the join
token it prints) plus a helper of the other kind (UDP on 127.0.0.1:0, or a Unix socket in a
private temporary directory), so a node can reach parents and peers over either carrier (spec
6.5). A joined node advertises the one it reaches its parent on (``Node.advertised_addr``).

Liveness: nodes started with ``--idle-timeout S`` use that QUIC idle timeout and keep their
parent link busy with a tiny request every ``S / 4`` seconds, so a killed process is fenced by
its parent about ``S`` seconds after it died while live links never idle out.

Persistent scale experiments: ``admin TOKEN ACTION`` (and ``scale admin ...``) is parsed here
and run by ``chrysalis.node._admin``, imported only for that command (it needs
chrysalis-sqlite, which sits above chrysalis-node).

Output: a readable table by default and ``--json`` for scripts. Errors are one line on stderr
(``chrysalis: error: ...``) with exit code 1; usage errors exit with 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from chrysalis.core import AddressError, DatagramAddr, Pid, PidPrefix, PidPrefixError
from chrysalis.datagram import (
    DatagramSocket,
    DatagramSocketSet,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.nameserver import (
    MAX_LABELS_PER_ENTRY,
    Consistency,
    Found,
    Labels,
    NameserverError,
    ProcEntry,
)
from chrysalis.node._address import (
    AddressSyntaxError,
    JoinToken,
    format_address,
    parse_join_token,
    parse_listen,
    parse_pid_reference,
)
from chrysalis.node._echo import echo_raw, serve_streams
from chrysalis.node._node import JoinSettings, Node, NodeError, bind_carrier
from chrysalis.node._tempdirs import (
    OwnedTempDir,
    reclaim_dead_tempdirs,
)
from chrysalis.quic import (
    ByteStream,
    DevelopmentCA,
    DevelopmentIdentityProvider,
    FileIdentityProvider,
    Identity,
    IdentityError,
    QuicConfig,
    QuicTransportError,
    default_dev_ca_directory,
    write_identity,
)

__all__ = ["CliError", "build_parser", "format_entry", "format_table", "main"]

_log = logging.getLogger("chrysalis.cli")

DEFAULT_TIMEOUT: Final = 30.0
"""Seconds a client command may take to join, look up and finish."""
PING_PAYLOAD: Final = 64
"""Bytes ``ping`` sends and expects back."""
PING_TAG: Final = 0
"""First byte of every ``ping`` payload: never one of the scale workers' request ops (1 echo,
2 transfer), so a scale worker always answers ``ping`` with the raw echo."""
_USAGE_EXIT: Final = 2
_ERROR_EXIT: Final = 1
_PIPE_CHUNK: Final = 64 * 1024


class CliError(Exception):
    """A command failed for a reason the user can act on; printed as one line, exit 1."""


# -- parsing ------------------------------------------------------------------------------------


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"label {text!r} is not KEY=VALUE")
    return key, value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} s is outside 0.1 to 3600 seconds")
    return value


def _token(text: str) -> JoinToken:
    try:
        return parse_join_token(text)
    except AddressSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _reference(text: str) -> PidPrefix:
    try:
        return parse_pid_reference(text)
    except AddressSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen(text: str) -> DatagramAddr | None:
    try:
        return parse_listen(text)
    except AddressSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Flags accepted before and after the subcommand (``suppress``: the copy on each
    subcommand leaves values given before the subcommand alone)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=default("warning"),
        help="logging level on stderr (warning)",
    )
    parser.add_argument(
        "--identity-dir",
        type=Path,
        default=default(None),
        help="use the identity in DIR (chain.pem, key.pem, roots.pem) instead of a fresh one",
    )
    parser.add_argument(
        "--ca-dir",
        type=Path,
        default=default(None),
        help="development CA directory (default: $CHRYSALIS_DEV_CA_DIR or a per-user temp dir)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=default(30.0),
        help="QUIC idle timeout in seconds: how long until a dead peer is fenced (30)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=default(DEFAULT_TIMEOUT),
        help="seconds a client command may take (30)",
    )
    parser.add_argument(
        "--label",
        type=_label,
        action="append",
        default=default([]),
        metavar="KEY=VALUE",
        help="a label to publish (repeatable)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="JSON output (reporting commands; accepted, and without effect, by the others)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``chrysalis`` command."""
    parser = argparse.ArgumentParser(
        prog="chrysalis", description="Chrysalis process mesh: nodes, identities, namespace."
    )
    _global_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    identity = commands.add_parser("identity", parents=[common], help="development identities")
    identity_commands = identity.add_subparsers(dest="identity_command", required=True)
    init = identity_commands.add_parser(
        "init", parents=[common], help="create (or load) the development CA"
    )
    init.add_argument("--dir", type=Path, help="CA directory (default: --ca-dir or per-user)")
    issue = identity_commands.add_parser(
        "issue", parents=[common], help="issue a leaf as chain.pem, key.pem and roots.pem"
    )
    issue.add_argument("--out", type=Path, required=True, help="directory to write into")
    show = identity_commands.add_parser(
        "show", parents=[common], help="the PID of a certificate chain"
    )
    show.add_argument("--chain", type=Path, help="a PEM chain file (default: --identity-dir)")

    listen_help = "carrier to bind: udp://IP:PORT, unix:///PATH or unix://* (repeatable)"
    serve = commands.add_parser("serve", parents=[common], help="run a root node")
    join = commands.add_parser("join", parents=[common], help="run a node joined at TOKEN")
    join.add_argument("token", type=_token, metavar="TOKEN", help="parent join token")
    for node_parser in (serve, join):
        node_parser.add_argument(
            "--listen", type=_listen, action="append", metavar="CARRIER", help=listen_help
        )
        node_parser.add_argument(
            "--echo", action="store_true", help="echo every stream opened to this node"
        )

    ls = commands.add_parser("ls", parents=[common], help="processes in the namespace")
    ls.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
    ls.add_argument("--full", action="store_true", help="print whole PIDs")

    resolve = commands.add_parser("resolve", parents=[common], help="look up one process")
    pipe = commands.add_parser("pipe", parents=[common], help="bridge stdin/stdout to a PID")
    for lookup in (resolve, pipe):
        lookup.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
        lookup.add_argument("pid", type=_reference, metavar="PID", help="a PID or unique prefix")

    ping = commands.add_parser(
        "ping", parents=[common], help="check that echo nodes answer through TOKEN"
    )
    ping.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
    ping.add_argument(
        "pids", type=_reference, nargs="*", metavar="PID", help="targets (default: echo nodes)"
    )

    # `chrysalis scale ...` is handed whole to the scale tool (see main); listed here for --help.
    commands.add_parser(
        "scale", help="launch N local processes and measure them (chrysalis scale --help)"
    )

    _admin_parser(commands, common)

    sqlite = commands.add_parser(
        "sqlite", parents=[common], help="a shell on a node's database (needs chrysalis-sqlite)"
    )
    sqlite.add_argument("database", metavar="DB", help="the node's SQLite database file")
    sqlite_commands = sqlite.add_subparsers(dest="sqlite_command", metavar="ACTION")
    sql_query = sqlite_commands.add_parser(
        "query", parents=[common], help="run SQL and print the result"
    )
    sql_query.add_argument("sql", metavar="SQL")
    sql_query.add_argument("--write", action="store_true", help="open the database writable")
    sqlite_commands.add_parser("tables", parents=[common], help="list the tables")
    sql_schema = sqlite_commands.add_parser(
        "schema", parents=[common], help="print CREATE statements"
    )
    sql_schema.add_argument("table", nargs="?", metavar="TABLE")
    sqlite_commands.add_parser("status", parents=[common], help="replication status per peer")
    sqlite_commands.add_parser(
        "shell", parents=[common], help="interactive shell (the default; --json has no effect)"
    )
    return parser


def _admin_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``admin TOKEN COMMAND ...`` to the ``chrysalis`` parser's subcommands."""
    admin = commands.add_parser(
        "admin",
        parents=[common],
        help="persistent scale experiments: nodes, submit, show, cancel (needs chrysalis-sqlite)",
    )
    admin.add_argument("token", type=_token, metavar="TOKEN", help="any scale node's join token")
    actions = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    nodes = actions.add_parser("nodes", parents=[common], help="the registered scale nodes")
    nodes.add_argument("selector", nargs="?", default=None, metavar="SELECTOR")
    nodes.add_argument(
        "--state", choices=("live", "stopped", "lost", "any"), default="any", help="(any)"
    )
    target = actions.add_parser("target", parents=[common], help="the nodes SELECTOR picks")
    target.add_argument("selector", metavar="SELECTOR")
    target.add_argument("--seed", type=int, help="seed of sample:N")
    for lister in (nodes, target):
        lister.add_argument("--full", action="store_true", help="print whole PIDs")
    submit = actions.add_parser("submit", parents=[common], help="submit an experiment")
    submit.add_argument("name", metavar="NAME")
    submit.add_argument("--sources", required=True, metavar="SELECTOR", help="who runs it")
    submit.add_argument(
        "--destinations", required=True, metavar="SELECTOR", help="whom they measure"
    )
    submit.add_argument(
        "--kind", default="echo", help="experiment kind: echo or stream-transfer (echo)"
    )
    submit.add_argument("--payload", type=int, default=1, help="bytes per operation (1)")
    submit.add_argument("--count", type=int, default=10, help="timed operations per pair (10)")
    submit.add_argument("--warmup", type=int, default=1, help="untimed operations per pair (1)")
    submit.add_argument("--concurrency", type=int, default=1, help="operations in flight (1)")
    submit.add_argument(
        "--run-timeout", type=float, default=60.0, help="seconds one source's run may take (60)"
    )
    submit.add_argument("--seed", type=int, help="seed of sample:N")
    submit.add_argument("--wait", action="store_true", help="return when the experiment ended")
    actions.add_parser("experiments", parents=[common], help="every experiment and its status")
    show = actions.add_parser("show", parents=[common], help="one experiment's results")
    show.add_argument("name", metavar="NAME")
    cancel = actions.add_parser("cancel", parents=[common], help="cancel an experiment")
    cancel.add_argument("name", metavar="NAME")


def _sqlite_command(args: argparse.Namespace, out: TextIO) -> int:
    """``chrysalis sqlite DB ACTION``: the shell core lives in ``chrysalis.sqlite.shell``.

    chrysalis-sqlite sits above chrysalis-node in the package graph, so it is imported only
    here, and its absence is reported as one clear line.
    """
    try:
        from chrysalis.sqlite import shell
    except ImportError as exc:
        raise CliError(
            "'chrysalis sqlite' needs the chrysalis-sqlite package (pip install chrysalis-sqlite)"
        ) from exc
    path = str(args.database)
    if not Path(path).exists():
        raise CliError(f"no database at {path}")
    action = args.sqlite_command or "shell"
    writable = action == "shell" or bool(getattr(args, "write", False))
    try:
        conn = shell.connect(path, read_only=not writable)
        try:
            if action == "query":
                results = shell.query(conn, args.sql)
                if args.json:
                    _emit(out, json.dumps([_result_record(result) for result in results]))
                else:
                    _emit(out, shell.format_result_sets(results))
            elif action == "tables":
                names = shell.tables(conn)
                if args.json:
                    _emit(out, json.dumps(names))
                else:
                    _emit_lines(out, names)
            elif action == "schema":
                statements = shell.schema(conn, args.table)
                if args.json:
                    _emit(out, json.dumps(statements))
                else:
                    _emit_lines(out, statements)
            elif action == "status":
                statuses = shell.replication_status(conn)
                if args.json:
                    _emit(out, json.dumps([_status_record(status) for status in statuses]))
                else:
                    _emit(out, shell.format_status(statuses))
            else:
                session = shell.ShellSession(conn)
                while True:
                    try:
                        line = input(session.prompt)
                    except EOFError:
                        return 0
                    outcome, text = session.feed(line)
                    if text:
                        _emit(out, text)
                    if outcome is shell.ShellOutcome.EXIT:
                        return 0
        finally:
            conn.close()
    except shell.ShellError as exc:
        raise CliError(str(exc)) from exc
    except sqlite3.Error as exc:
        raise CliError(f"sqlite: {exc}") from exc
    return 0


def _json_value(value: object) -> object:
    """A SQL value as JSON: BLOBs as ``{"hex": "..."}``, everything else as is."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    return value


def _result_record(result: Any) -> dict[str, Any]:
    """The JSON shape of one ``chrysalis.sqlite.shell.ResultSet``."""
    return {
        "columns": list(result.columns),
        "rows": [[_json_value(value) for value in row] for row in result.rows],
        "truncated": bool(result.truncated),
    }


def _status_record(status: Any) -> dict[str, Any]:
    """The JSON shape of one ``chrysalis.sqlite.shell.PeerReplicationStatus``."""
    return {
        "peer": status.peer.hex(),
        "peer_site_id": status.peer_site_id.hex(),
        "mode": status.mode.name.lower(),
        "pending": status.pending,
        "origins": [
            {
                "origin_site_id": origin.origin_site_id.hex(),
                "eligible": origin.eligible,
                "synced_at": origin.synced_at,
                "latest": origin.latest,
                "pending": origin.pending,
            }
            for origin in status.origins
        ],
    }


# -- output -------------------------------------------------------------------------------------


def entry_record(entry: ProcEntry) -> dict[str, Any]:
    """The JSON shape of one namespace entry."""
    return {
        "pid": entry.pid.hex(),
        "tls_server_name": entry.tls_server_name,
        "labels": dict(entry.labels.items()),
        "locators": [
            {"address": format_address(loc.address), "priority": loc.priority}
            for loc in sorted(entry.locators, key=lambda item: item.priority)
        ],
    }


def format_table(entries: Sequence[ProcEntry], *, full: bool = False) -> str:
    """The ``ls`` table: ``PID`` (8 hex digits unless ``full``), ``PRIORITY`` (right-aligned),
    ``LABELS`` (``k=v,...`` or ``-``) and ``ADDRESS``; one row per locator, sorted by PID and
    priority; columns two spaces apart, padded to the widest value."""
    rows = [("PID", "PRIORITY", "LABELS", "ADDRESS")]
    for entry in sorted(entries, key=lambda item: item.pid):
        pid = entry.pid.hex() if full else entry.pid.hex()[:8]
        labels = ",".join(f"{k}={v}" for k, v in entry.labels.items()) or "-"
        locators = sorted(entry.locators, key=lambda item: item.priority)
        if not locators:
            rows.append((pid, "-", labels, "-"))
        for loc in locators:
            rows.append((pid, str(loc.priority), labels, format_address(loc.address)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [
            row[0].ljust(widths[0]),
            row[1].rjust(widths[1]),
            row[2].ljust(widths[2]),
            row[3],
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_entry(entry: ProcEntry) -> str:
    """The readable ``resolve`` record (YAML-like)."""
    lines = [f"pid: {entry.pid.hex()}", f"tls_server_name: {entry.tls_server_name}"]
    if entry.labels:
        lines.append("labels:")
        lines.extend(f"  {k}={v}" for k, v in entry.labels.items())
    else:
        lines.append("labels: []")
    if entry.locators:
        lines.append("locators:")
        for loc in sorted(entry.locators, key=lambda item: item.priority):
            lines.append(f"  - priority: {loc.priority}")
            lines.append(f"    address: {format_address(loc.address)}")
    else:
        lines.append("locators: []")
    return "\n".join(lines)


def _emit(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def _emit_lines(out: TextIO, lines: Sequence[str]) -> None:
    for line in lines:
        _emit(out, line)


# -- identities ---------------------------------------------------------------------------------


def _ca_dir(args: argparse.Namespace) -> Path:
    ca_dir: Path | None = args.ca_dir
    return default_dev_ca_directory() if ca_dir is None else ca_dir


def _identity(args: argparse.Namespace) -> Identity:
    identity_dir: Path | None = args.identity_dir
    if identity_dir is not None:
        return FileIdentityProvider.from_directory(identity_dir).issue_identity()
    return DevelopmentIdentityProvider(_ca_dir(args)).issue_identity()


def _identity_command(args: argparse.Namespace, out: TextIO) -> int:
    if args.identity_command == "init":
        directory: Path = args.dir if args.dir is not None else _ca_dir(args)
        ca = DevelopmentCA.load_or_create(directory)
        record = {
            "directory": str(directory),
            "subject": ca.certificate.subject.rfc4514_string(),
            "not_valid_after": ca.certificate.not_valid_after_utc.isoformat(),
        }
        text = f"development CA {record['subject']} in {directory}"
    elif args.identity_command == "issue":
        identity = DevelopmentIdentityProvider(_ca_dir(args)).issue_identity()
        files = write_identity(identity, args.out)
        record = {"pid": identity.pid.hex(), "chain": str(files.chain), "key": str(files.key)}
        text = f"{identity.pid.hex()}  {args.out}"
    else:
        record = _show_identity(args)
        text = "\n".join(f"{key}: {value}" for key, value in record.items())
    _emit(out, json.dumps(record) if args.json else text)
    return 0


def _show_identity(args: argparse.Namespace) -> dict[str, Any]:
    chain: Path | None = args.chain
    if chain is None:
        if args.identity_dir is None:
            raise CliError("identity show needs --chain FILE or --identity-dir DIR")
        identity = FileIdentityProvider.from_directory(args.identity_dir).issue_identity()
        leaf = identity.leaf
    else:
        from cryptography import x509

        try:
            data = chain.read_bytes()[: 1024 * 1024 + 1]
        except OSError as exc:
            raise CliError(f"cannot read {chain}: {exc.strerror or exc}") from exc
        try:
            leaf = x509.load_pem_x509_certificates(data)[0]
        except (ValueError, IndexError) as exc:
            raise CliError(f"{chain} holds no PEM certificate") from exc
    from cryptography.hazmat.primitives.serialization import Encoding

    pid = Pid.from_certificate(leaf.public_bytes(Encoding.DER))
    return {
        "pid": pid.hex(),
        "subject": leaf.subject.rfc4514_string(),
        "not_valid_after": leaf.not_valid_after_utc.isoformat(),
    }


# -- nodes --------------------------------------------------------------------------------------


class _Carriers:
    """The sockets of one CLI node: the requested carriers plus a helper of the missing kind;
    owns any private temporary directory it made (removed on ``cleanup``)."""

    def __init__(
        self, listen: Sequence[DatagramAddr | None], parent: DatagramAddr | None = None
    ) -> None:
        self._tempdir: OwnedTempDir | None = None
        reclaim_dead_tempdirs()  # what nodes killed with -9 left behind
        members: list[DatagramSocket] = []
        try:
            for address in listen:
                members.append(self._bind(address))
            schemes = [member.local_addr.scheme for member in members]
            if len(set(schemes)) != len(schemes):
                raise CliError("--listen takes at most one udp and one unix carrier")
            self.token_addr = members[0].local_addr
            if "udp" not in schemes:
                members.append(UdpSocket.bind(_udp_helper(parent)))
            if "unixgram" not in schemes:
                members.append(self._bind(None))
            # The node itself advertises the member it reaches its parent on
            # (``Node.advertised_addr``); the primary is the first ``--listen`` carrier.
            self.socket: DatagramSocket = DatagramSocketSet(members[0], *members[1:])
        except BaseException:
            for member in members:
                member.shutdown()
            self.cleanup()
            raise

    def _bind(self, address: DatagramAddr | None) -> DatagramSocket:
        if address is None:
            if self._tempdir is None:
                self._tempdir = OwnedTempDir.create()
            return UnixDatagramSocket.bind_unique(self._tempdir.path, prefix="carrier-")
        # A node killed with -9 leaves its socket file: ``bind_carrier`` reclaims it when
        # nobody answers there (a live socket is refused with the original error).
        return bind_carrier(address)

    def cleanup(self) -> None:
        if self._tempdir is not None:
            self._tempdir.remove()
            self._tempdir = None


def _udp_helper(parent: DatagramAddr | None) -> DatagramAddr:
    """Where a node binds its helper UDP carrier: loopback of the parent's address family
    (``[::1]`` for an IPv6 parent, so client commands reach nodes served on IPv6)."""
    if parent is not None and parent.scheme == "udp" and parent.ip.version == 6:
        return DatagramAddr.udp("::1", 0)
    return DatagramAddr.udp("127.0.0.1", 0)


def _labels(args: argparse.Namespace, command: str, *, joined: bool) -> Labels:
    automatic = {"client": "chrysalis", "command": command, "role": "leaf" if joined else "root"}
    if getattr(args, "echo", False):
        automatic["echo"] = "true"
    user: list[tuple[str, str]] = args.label
    total = len(automatic) + len(user)
    if total > MAX_LABELS_PER_ENTRY:
        raise CliError(
            f"{len(user)} --label options and {len(automatic)} labels set by the command make "
            f"{total}; a nameserver entry holds at most {MAX_LABELS_PER_ENTRY}"
        )
    for key, _value in user:
        if key in automatic:
            raise CliError(f"label {key!r} is set by the command itself (DuplicateKey)")
    try:
        labels = Labels([*automatic.items(), *user])
    except ValueError as exc:
        raise CliError(f"invalid label: {exc}") from exc
    return labels


def _build_node(
    args: argparse.Namespace,
    command: str,
    token: JoinToken | None,
    listen: Sequence[DatagramAddr | None],
) -> tuple[Node, _Carriers]:
    labels = _labels(args, command, joined=token is not None)
    identity = _identity(args)
    carriers = _Carriers(listen, None if token is None else token.address)
    parent = None if token is None else JoinSettings(token.address, token.authority)
    # A PING every quarter of the idle timeout keeps a quiet link up: only a dead peer
    # reaches the idle timeout (QUIC-level keepalive, see chrysalis-quic).
    config = QuicConfig(idle_timeout=args.idle_timeout, keepalive_interval=args.idle_timeout / 4)
    try:
        node = Node(
            identity, carrier=carriers.socket, parent=parent, labels=labels, quic_config=config
        )
    except BaseException:
        carriers.socket.shutdown()
        carriers.cleanup()
        raise
    return node, carriers


async def _run_node(args: argparse.Namespace, out: TextIO) -> int:
    token: JoinToken | None = getattr(args, "token", None)
    listen: list[DatagramAddr | None] = args.listen or [
        _udp_helper(None if token is None else token.address)
    ]
    node, carriers = _build_node(args, args.command, token, listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with node:
            background: list[asyncio.Task[None]] = []
            if token is not None:
                await _wait_connected(node, args.timeout, token.address)
            if args.echo:
                background.append(asyncio.create_task(serve_streams(node, echo_raw)))
            _emit(out, f"{format_address(carriers.token_addr)}?authority={node.pid.hex()}")
            await stop.wait()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        carriers.cleanup()
    return 0


async def _admin(args: argparse.Namespace, out: TextIO) -> int:
    """``chrysalis admin TOKEN ACTION``: the commands live in ``chrysalis.node._admin``,
    which needs chrysalis-sqlite (imported only here, like ``sqlite``)."""
    try:
        from chrysalis.node._admin import AdminError, run_admin
    except ImportError as exc:
        raise CliError(
            "'chrysalis admin' needs the chrysalis-sqlite package (pip install chrysalis-sqlite)"
        ) from exc

    token: JoinToken = args.token
    node, carriers = _build_node(args, "admin", token, [None])
    try:
        return await run_admin(
            args,
            out,
            sys.stderr,
            node,
            lambda: _wait_connected(node, args.timeout, token.address),
        )
    except AdminError as exc:
        raise CliError(str(exc)) from exc
    finally:
        carriers.cleanup()


async def _wait_connected(node: Node, timeout: float, parent: DatagramAddr | None = None) -> None:
    try:
        await asyncio.wait_for(node.wait_connected(), timeout)
    except TimeoutError:
        why = node.last_parent_error
        detail = f" ({why})" if why else ""
        where = "" if parent is None else f" at {format_address(parent)}"
        raise CliError(f"no parent answered{where} within {timeout:g} s{detail}") from None


async def _client(args: argparse.Namespace, out: TextIO) -> int:
    token: JoinToken = args.token
    node, carriers = _build_node(args, args.command, token, [None])
    try:
        async with node:
            await _wait_connected(node, args.timeout, token.address)
            if args.command == "ping":  # bounds each target itself, reporting as they finish
                return await _ping(node, args, out)
            return await asyncio.wait_for(_client_command(node, args, out), args.timeout)
    except TimeoutError:
        raise CliError(f"{args.command} did not finish within {args.timeout:g} s") from None
    finally:
        carriers.cleanup()


async def _client_command(node: Node, args: argparse.Namespace, out: TextIO) -> int:
    if args.command == "ls":
        entries = await node.enumerate(Consistency.REFRESH)
        ordered = sorted(entries, key=lambda item: item.pid)
        if args.json:
            _emit(out, json.dumps([entry_record(entry) for entry in ordered]))
        else:
            _emit(out, format_table(ordered, full=args.full))
        return 0
    if args.command == "resolve":
        pid = await node.expand_pid(args.pid, Consistency.REFRESH)
        resolution = await node.resolve(pid, Consistency.REFRESH)
        if not isinstance(resolution, Found):
            raise CliError(f"PID {pid.hex()} is not found")
        entry = resolution.entry
        _emit(out, json.dumps(entry_record(entry)) if args.json else format_entry(entry))
        return 0
    if args.command == "pipe":
        pid = await node.expand_pid(args.pid, Consistency.REFRESH)
        stream = await node.dial(pid, Consistency.REFRESH)
        await _pipe(stream)
        return 0
    return await _ping(node, args, out)


async def _pipe(stream: ByteStream) -> None:
    loop = asyncio.get_running_loop()
    stdin: Any = sys.stdin.buffer  # a BufferedReader: read1 returns what is available
    stdout = sys.stdout.buffer

    async def upstream() -> None:
        while True:
            data = await loop.run_in_executor(None, stdin.read1, _PIPE_CHUNK)
            if not data:
                break
            stream.write(data)
            await stream.drain()
        stream.write_eof()

    async def downstream() -> None:
        while True:
            data = await stream.read(_PIPE_CHUNK)
            if not data:
                break
            stdout.write(data)
            stdout.flush()

    sender = asyncio.create_task(upstream())
    try:
        await downstream()
    finally:
        if not sender.done():
            sender.cancel()  # the executor read finishes with the next stdin line or EOF
        else:
            sender.result()


async def _ping(node: Node, args: argparse.Namespace, out: TextIO) -> int:
    """Dial every target at once; each is reported as it finishes: ``ok`` (echoed),
    ``timeout`` (no echo within ``--timeout``), ``refused`` (not found, no route, the dial or
    the stream refused) or ``mismatch``. ``--json`` prints one object at the end."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    targets: list[Pid]
    async with asyncio.timeout_at(deadline):
        if args.pids:
            targets = [await node.expand_pid(prefix, Consistency.REFRESH) for prefix in args.pids]
        else:
            entries = await node.enumerate(Consistency.REFRESH)
            targets = sorted(e.pid for e in entries if e.labels.get("echo") == "true")
    results: dict[str, dict[str, Any]] = {}

    async def one(pid: Pid) -> None:
        record = await _ping_one(node, pid, deadline, args.timeout)
        results[pid.hex()] = record
        if not args.json:
            _emit(out, f"{pid.hex()}  {_ping_text(record)}")

    await asyncio.gather(*(one(pid) for pid in dict.fromkeys(targets)))
    if args.json:
        _emit(out, json.dumps({pid.hex(): results[pid.hex()] for pid in targets}))
    return 0 if all(record["ok"] for record in results.values()) else _ERROR_EXIT


def ping_payload() -> bytes:
    """What ``ping`` sends: ``PING_TAG`` then random bytes (``PING_PAYLOAD`` in all)."""
    return bytes([PING_TAG]) + os.urandom(PING_PAYLOAD - 1)


async def _ping_one(node: Node, pid: Pid, deadline: float, timeout: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    payload = ping_payload()
    started = loop.time()
    try:
        async with asyncio.timeout_at(deadline):
            stream = await node.dial(pid, Consistency.REFRESH)
            stream.write(payload)
            stream.write_eof()
            echoed = await stream.read(-1)
    except TimeoutError:
        return {"ok": False, "state": "timeout", "error": f"no echo within {timeout:g} s"}
    except Exception as exc:
        return {"ok": False, "state": "refused", "error": str(exc) or type(exc).__name__}
    elapsed = round((loop.time() - started) * 1000, 3)
    if echoed != payload:
        error = f"echo mismatch ({len(echoed)} bytes back)"
        return {"ok": False, "state": "mismatch", "rtt_ms": elapsed, "error": error}
    return {"ok": True, "state": "ok", "rtt_ms": elapsed}


def _ping_text(record: dict[str, Any]) -> str:
    if record["ok"]:
        return f"ok {record['rtt_ms']} ms"
    return f"{record['state']} {record['error']}"


# -- entry point --------------------------------------------------------------------------------

_EXPECTED: Final = (
    CliError,
    NodeError,
    NameserverError,
    QuicTransportError,
    AddressError,
    AddressSyntaxError,
    PidPrefixError,
    IdentityError,
    OSError,
    TimeoutError,
)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the ``chrysalis`` command; returns the exit code (0, 1 for an error, 2 for usage).

    ``out`` receives the normal output (default: stdout); errors go to stderr as one line.
    """
    stdout = sys.stdout if out is None else out
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:2] == ["scale", "admin"]:  # `chrysalis scale admin ...` is `chrysalis admin ...`
        raw = raw[1:]
    if raw[:1] == ["scale"]:
        from chrysalis.node._scale import main as scale_main

        return scale_main(["run", *raw[1:]], out=stdout)
    parser = build_parser()
    try:
        args = parser.parse_args(raw)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else _USAGE_EXIT
    logging.basicConfig(
        level=str(args.log_level).upper(), format="%(name)s %(levelname)s %(message)s"
    )
    try:
        if args.command == "identity":
            return _identity_command(args, stdout)
        if args.command == "sqlite":
            return _sqlite_command(args, stdout)
        if args.command in ("serve", "join"):
            return asyncio.run(_run_node(args, stdout))
        if args.command == "admin":
            return asyncio.run(_admin(args, stdout))
        return asyncio.run(_client(args, stdout))
    except _EXPECTED as exc:
        message = str(exc) or type(exc).__name__
        print(f"chrysalis: error: {message.splitlines()[0]}", file=sys.stderr)
        return _ERROR_EXIT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # Not one of the failures above: still one line (the traceback with --log-level debug).
        _log.debug("unexpected failure", exc_info=True)
        first = (str(exc) or "").splitlines()[:1]
        message = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
        print(
            f"chrysalis: error: {message} (--log-level debug shows where)",
            file=sys.stderr,
        )
        return _ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
