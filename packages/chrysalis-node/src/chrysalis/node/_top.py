"""``chrysalis top TOKEN``: a live view of a Chrysalis tree's nodes and their QUIC links.

Why: ``ls`` shows who is in the namespace and ``ping`` whether they answer; to see how the tree
carries traffic (which links are busy, their RTT, whether QUIC is probing for lost packets)
``top`` asks every node for its links' statistics and shows the rates between two polls.

How: nodes started with ``--echo`` (``serve``/``join``) answer a stream whose only bytes are
``STATS_REQUEST`` with one JSON document (``node_report``): the node's PID, namespace size,
routes, parent status, endpoint error counters, and one record per live QUIC connection from the
endpoint's statistics (``chrysalis.quic.ConnectionStatistics``: datagrams and bytes each way,
smoothed RTT, congestion window, bytes in flight, PTO count); any other stream is echoed as
before (``stats_or_echo``; ``ping``'s payloads start with a zero byte, never this request's).
``top`` joins at TOKEN as a short-lived client (like ``ping``), lists the echo nodes, asks each,
and draws one row per link: packets and bytes per second each way (differences between two
polls), RTT, PTO count (QUIC's probe timeouts: the loss signal its engines expose; lost-packet
counts are not exposed by the engines), congestion window and bytes in flight. ``--once``
prints one table from two polls ``--interval`` apart (``--json``: the rows and the reports);
without it the view is redrawn every ``--interval`` seconds until ``q`` or Ctrl-C. Nodes
without ``--echo`` and scale workers do not answer (listed as unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from chrysalis.core import Pid
from chrysalis.nameserver import Consistency
from chrysalis.node._cli import CliError, _emit
from chrysalis.node._cli_commands import build_node, wait_connected
from chrysalis.node._echo import ECHO_CHUNK
from chrysalis.node._node import Node
from chrysalis.node._stats import MAX_REPORT, STATS_REQUEST

__all__ = ["LinkRow", "link_rows", "render", "top_command"]


@dataclass(frozen=True, slots=True)
class LinkRow:
    """One line of the view: a link of ``node`` to ``peer``."""

    node: str
    peer: str
    established: bool
    rtt_ms: float
    #: Per second since the previous poll (``None`` on the first).
    packets_out: float | None
    packets_in: float | None
    bytes_out: float | None
    bytes_in: float | None
    pto_count: int
    congestion_window: int
    bytes_in_flight: int
    datagrams_sent: int
    datagrams_received: int


def _rate(now: int, before: int | None, elapsed: float) -> float | None:
    if before is None or elapsed <= 0:
        return None
    return max(0.0, (now - before) / elapsed)


def link_rows(
    reports: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]] = ()
) -> list[LinkRow]:
    """The links of ``reports``, node by node; rates against ``previous`` (the poll before)."""
    before = {
        (str(r["pid"]), str(link["peer"])): (float(r["time"]), link)
        for r in previous
        for link in r.get("links", [])
    }
    rows: list[LinkRow] = []
    for r in sorted(reports, key=lambda r: str(r["pid"])):
        for link in sorted(r.get("links", []), key=lambda link: str(link["peer"])):
            prior = before.get((str(r["pid"]), str(link["peer"])))
            elapsed = float(r["time"]) - prior[0] if prior else 0.0
            old: Mapping[str, Any] = prior[1] if prior else {}
            rate = {
                name: _rate(int(link[name]), old.get(name), elapsed)
                for name in ("datagrams_sent", "datagrams_received", "bytes_sent", "bytes_received")
            }
            rows.append(
                LinkRow(
                    node=str(r["pid"]),
                    peer=str(link["peer"]),
                    established=bool(link["established"]),
                    rtt_ms=float(link["rtt_ms"]),
                    packets_out=rate["datagrams_sent"],
                    packets_in=rate["datagrams_received"],
                    bytes_out=rate["bytes_sent"],
                    bytes_in=rate["bytes_received"],
                    pto_count=int(link["pto_count"]),
                    congestion_window=int(link["congestion_window"]),
                    bytes_in_flight=int(link["bytes_in_flight"]),
                    datagrams_sent=int(link["datagrams_sent"]),
                    datagrams_received=int(link["datagrams_received"]),
                )
            )
    return rows


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def render(
    reports: Sequence[Mapping[str, Any]],
    rows: Sequence[LinkRow],
    unreachable: Sequence[str] = (),
    width: int = 120,
    height: int = 40,
) -> list[str]:
    """The view's lines (each at most ``width`` characters, at most ``height`` lines)."""
    lines = [
        f"chrysalis top  {time.strftime('%H:%M:%S')}  nodes {len(reports)}  links {len(rows)}"
        + (f"  unreachable {len(unreachable)}" if unreachable else ""),
        "",
        f"{'NODE':<12} {'PEER':<12} {'RTT ms':>7} {'PKT/s out':>9} {'PKT/s in':>9} "
        f"{'B/s out':>8} {'B/s in':>8} {'PTO':>4} {'CWND':>7} {'INFLIGHT':>8}",
    ]
    room = max(0, height - len(lines) - 1)
    for row in rows[:room]:
        lines.append(
            f"{row.node[:12]:<12} {row.peer[:12]:<12} {row.rtt_ms:>7.2f} "
            f"{_num(row.packets_out):>9} {_num(row.packets_in):>9} {_num(row.bytes_out):>8} "
            f"{_num(row.bytes_in):>8} {row.pto_count:>4} {row.congestion_window:>7} "
            f"{row.bytes_in_flight:>8}" + ("" if row.established else " (handshake)")
        )
    if len(rows) > room:
        lines.append(f"... {len(rows) - room} more links")
    for pid in unreachable[: max(0, height - len(lines))]:
        lines.append(f"{pid[:12]:<12} (no report)")
    return [line if len(line) <= width else line[: width - 1] + "~" for line in lines[:height]]


async def _ask(node: Node, pid: Pid, timeout: float) -> dict[str, Any] | None:
    try:
        async with asyncio.timeout(timeout):
            stream = await node.dial(pid, Consistency.REFRESH)
            stream.write(STATS_REQUEST)
            stream.write_eof()
            data = b""
            while len(data) <= MAX_REPORT:
                chunk = await stream.read(ECHO_CHUNK)
                if not chunk:
                    break
                data += chunk
        report: dict[str, Any] = json.loads(data)
        return report if isinstance(report, dict) and "links" in report else None
    except Exception:
        return None


async def _poll(node: Node, timeout: float) -> tuple[list[dict[str, Any]], list[str]]:
    entries = await node.enumerate(Consistency.REFRESH)
    targets = sorted(e.pid for e in entries if e.labels.get("echo") == "true")
    answers = await asyncio.gather(*(_ask(node, pid, timeout) for pid in targets))
    reports = [a for a in answers if a is not None]
    unreachable = [pid.hex() for pid, a in zip(targets, answers, strict=True) if a is None]
    return reports, unreachable


async def _top(args: argparse.Namespace, out: TextIO) -> int:
    token = args.token
    node, carriers = build_node(args, "top", token, [None])
    try:
        async with node:
            await wait_connected(node, args.timeout, token.address)
            if args.once:
                first, _ = await _poll(node, args.timeout)
                if args.interval > 0:
                    await asyncio.sleep(args.interval)  # the second poll gives the rates
                reports, unreachable = await _poll(node, args.timeout)
                rows = link_rows(reports, first if args.interval > 0 else ())
                if args.json:
                    doc = {
                        "rows": [asdict(r) for r in rows],
                        "reports": reports,
                        "unreachable": unreachable,
                    }
                    _emit(out, json.dumps(doc))
                else:
                    size = shutil.get_terminal_size((160, 1000))
                    _emit(out, "\n".join(render(reports, rows, unreachable, size.columns, 10**6)))
                return 0
            return await _live(node, args, out)
    finally:
        carriers.cleanup()


async def _live(node: Node, args: argparse.Namespace, out: TextIO) -> int:
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved: Any = None
    if fd is not None:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    previous: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    try:
        while True:
            reports, unreachable = await _poll(node, args.timeout)
            rows = link_rows(reports, previous)
            previous = reports
            size = shutil.get_terminal_size((120, 40))
            lines = render(reports, rows, unreachable, size.columns, size.lines - 1)
            out.write("\x1b[H\x1b[2J" + "\r\n".join(lines) + "\r\n(q to quit)")
            out.flush()
            if fd is None:
                await asyncio.sleep(args.interval)
                continue
            ready = await loop.run_in_executor(
                None, lambda: select.select([fd], [], [], args.interval)[0]
            )
            if ready and os.read(fd, 64).lower().startswith(b"q"):
                return 0
    finally:
        out.write("\r\n")
        out.flush()
        if saved is not None and fd is not None:
            import termios

            with contextlib.suppress(Exception):
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def top_command(args: argparse.Namespace, out: TextIO) -> int:
    """``chrysalis top TOKEN [--once [--json]] [--interval S]``."""
    if not 0 <= args.interval <= 3600:
        raise CliError("--interval must be between 0 and 3600 seconds")
    try:
        return asyncio.run(_top(args, out))
    except KeyboardInterrupt:
        return 0
