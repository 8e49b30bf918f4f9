"""The node commands of ``chrysalis`` (``identity``, ``serve``, ``join``, ``ls``, ``resolve``,
``pipe`` and ``ping``): imported by ``chrysalis.node._cli`` only when one of them runs, because
they need the whole node (carriers, QUIC and TLS, nameserver). Also the output formats of
``ls`` and ``resolve`` (a table or a YAML-like record, and their JSON shape).

Sockets: every node binds the carriers given with ``--listen`` (the first one is in the join
token it prints) plus a helper of the other kind (UDP on 127.0.0.1:0, or a Unix socket in a
private temporary directory), so a node can reach parents and peers over either carrier (spec
6.5). A joined node advertises the one it reaches its parent on (``Node.advertised_addr``).
A wildcard ``--listen udp://0.0.0.0:PORT`` is printed in the token and advertised as a
routable address of this host (toward the parent, else the default route's interface, see
``chrysalis.node._advertise``), or as the address given with ``--advertise IP``.

Liveness: nodes started with ``--idle-timeout S`` use that QUIC idle timeout and keep their
parent link busy with a tiny request every ``S / 4`` seconds, so a killed process is fenced by
its parent about ``S`` seconds after it died while live links never idle out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from chrysalis.core import AddressError, DatagramAddr, Pid, PidPrefixError
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
from chrysalis.node._address import AddressSyntaxError, JoinToken, format_address
from chrysalis.node._advertise import advertised_address, route_source
from chrysalis.node._cli import _ERROR_EXIT, CliError, _emit, ping_payload
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

__all__ = [
    "EXPECTED_ERRORS",
    "build_node",
    "client",
    "entry_record",
    "format_entry",
    "format_table",
    "identity_command",
    "ping_report",
    "ping_targets",
    "run_node",
    "wait_connected",
]

EXPECTED_ERRORS: Final[tuple[type[BaseException], ...]] = (
    AddressError,
    AddressSyntaxError,
    PidPrefixError,
    NodeError,
    NameserverError,
    QuicTransportError,
    IdentityError,
)
"""Failures of these commands that ``chrysalis.node._cli.main`` prints as one line."""
_PIPE_CHUNK: Final = 64 * 1024


# -- entry points (``chrysalis.node._cli.COMMANDS``) --------------------------------------------


def run_node(args: argparse.Namespace, out: TextIO) -> int:
    """``serve`` and ``join TOKEN``: run until SIGINT or SIGTERM."""
    return asyncio.run(_run_node(args, out))


def client(args: argparse.Namespace, out: TextIO) -> int:
    """``ls``, ``resolve``, ``pipe`` and ``ping``: a client node joined at TOKEN."""
    return asyncio.run(_client(args, out))


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


# -- identities ---------------------------------------------------------------------------------


def _ca_dir(args: argparse.Namespace) -> Path:
    ca_dir: Path | None = args.ca_dir
    return default_dev_ca_directory() if ca_dir is None else ca_dir


def _identity(args: argparse.Namespace) -> Identity:
    identity_dir: Path | None = args.identity_dir
    if identity_dir is not None:
        return FileIdentityProvider.from_directory(identity_dir).issue_identity()
    return DevelopmentIdentityProvider(_ca_dir(args)).issue_identity()


def identity_command(args: argparse.Namespace, out: TextIO) -> int:
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
    """Where a node binds its helper UDP carrier: the local address the kernel uses toward a
    UDP parent (so a parent on a wildcard bind, which answers from that route's address,
    answers from the address it was sent to), else loopback of the parent's address family
    (``[::1]`` for an IPv6 parent, so client commands reach nodes served on IPv6)."""
    if parent is not None and parent.scheme == "udp":
        source = None if parent.ip.is_unspecified else route_source(str(parent.ip))
        if source is not None:
            return DatagramAddr.udp(str(source), 0)
        if parent.ip.version == 6:
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


def build_node(
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
            identity,
            carrier=carriers.socket,
            parent=parent,
            labels=labels,
            quic_config=config,
            advertise=getattr(args, "advertise", None),
        )
    except ValueError as exc:  # a bad --advertise
        carriers.socket.shutdown()
        carriers.cleanup()
        raise CliError(str(exc)) from None
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
    node, carriers = build_node(args, args.command, token, listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with node:
            background: list[asyncio.Task[None]] = []
            if token is not None:
                await wait_connected(node, args.timeout, token.address)
            if args.echo:
                # Echo, and the report ``chrysalis top`` asks for (``_stats``).
                from chrysalis.node._echo import serve_streams
                from chrysalis.node._stats import stats_or_echo

                background.append(asyncio.create_task(serve_streams(node, stats_or_echo(node))))
            token_addr = advertised_address(
                carriers.token_addr,
                override=getattr(args, "advertise", None),
                parent=None if token is None else token.address,
            )  # a wildcard --listen: a routable address of this host, not 0.0.0.0
            _emit(out, f"{format_address(token_addr)}?authority={node.pid.hex()}")
            await stop.wait()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        carriers.cleanup()
    return 0


async def wait_connected(node: Node, timeout: float, parent: DatagramAddr | None = None) -> None:
    try:
        await asyncio.wait_for(node.wait_connected(), timeout)
    except TimeoutError:
        why = node.last_parent_error
        detail = f" ({why})" if why else ""
        where = "" if parent is None else f" at {format_address(parent)}"
        raise CliError(f"no parent answered{where} within {timeout:g} s{detail}") from None


async def _client(args: argparse.Namespace, out: TextIO) -> int:
    token: JoinToken = args.token
    if args.command == "ls" and len(token.members) > 1:
        return await _ls_members(args, out, token)
    node, carriers = build_node(args, args.command, token, [None])
    try:
        async with node:
            await wait_connected(node, args.timeout, token.address)
            if args.command == "ping":  # bounds each target itself, reporting as they finish
                return await _ping(node, args, out)
            return await asyncio.wait_for(_client_command(node, args, out), args.timeout)
    except TimeoutError:
        raise CliError(f"{args.command} did not finish within {args.timeout:g} s") from None
    finally:
        carriers.cleanup()


async def _ls_members(args: argparse.Namespace, out: TextIO, token: JoinToken) -> int:
    """``ls`` of a cluster URL naming several roots (the worker loops of a job): a client
    node joins each in turn and the table lists every entry found (but those clients), one
    table."""
    found: dict[Pid, ProcEntry] = {}
    for _name, address in token.members:
        node, carriers = build_node(args, args.command, JoinToken(address), [None])
        try:
            async with node:
                await wait_connected(node, args.timeout, address)
                entries = await asyncio.wait_for(node.enumerate(Consistency.REFRESH), args.timeout)
                found.update((e.pid, e) for e in entries if e.pid != node.pid)
        except TimeoutError:
            raise CliError(
                f"ls did not finish within {args.timeout:g} s at {format_address(address)}"
            ) from None
        finally:
            carriers.cleanup()
    ordered = sorted(found.values(), key=lambda item: item.pid)
    if args.json:
        _emit(out, json.dumps([entry_record(entry) for entry in ordered]))
    else:
        _emit(out, format_table(ordered, full=args.full))
    return 0


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
    deadline = asyncio.get_running_loop().time() + args.timeout
    async with asyncio.timeout_at(deadline):
        targets = await ping_targets(node, args)
    return await ping_report(node, args, out, targets, deadline)


async def ping_targets(node: Node, args: argparse.Namespace) -> list[Pid]:
    """``ping``'s targets: the PIDs given (each prefix expanded by the root), else every
    ``echo=true`` node of the root's namespace."""
    if args.pids:
        return [await node.expand_pid(prefix, Consistency.REFRESH) for prefix in args.pids]
    entries = await node.enumerate(Consistency.REFRESH)
    return sorted(e.pid for e in entries if e.labels.get("echo") == "true")


async def ping_report(
    node: Node, args: argparse.Namespace, out: TextIO, targets: list[Pid], deadline: float
) -> int:
    """Ping ``targets`` at once, each bounded by ``deadline`` (loop time), reporting as
    ``_ping`` says; exit status 1 when any failed."""
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
