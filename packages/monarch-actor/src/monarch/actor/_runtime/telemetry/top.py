"""``monarch top``: a live terminal view of a running program's hosts, processes and actors.

Why: a program's actors run in many processes; to see which are alive, which are backed up and
which failed, ``monarch top --token TOKEN`` attaches from another terminal to the program's
admin endpoint (``_mesh.admin``: the program started it with ``start_admin()`` or the
``admin_port`` setting, and printed or wrote its token ``HOST:PORT:SECRET``) and polls its
``GET /status`` every ``--interval`` seconds. Each row is one actor: host, process (label and
OS pid), actor (readable chain), state, mailbox depth, messages per second (the difference of
its received count between two polls) and messages received; then the program's recent
failures. Keys: ``q`` quits (so does Ctrl-C). ``--once`` takes two polls ``--interval`` apart
and prints one table (``--json``: the rows and the last status as JSON) for scripts.

The view is plain ANSI (cursor home, clear, one line per row, cut to the terminal's size): no
curses, nothing beyond the standard library; the functions that turn statuses into rows and
lines (``actor_rows``, ``render``) are pure.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

__all__ = ["ActorRow", "actor_rows", "fetch_status", "parse_token", "render", "run"]

#: Longest ``/status`` body read (bytes).
MAX_STATUS_BYTES = 64 * 1024 * 1024


def parse_token(token: str) -> tuple[str, int, str]:
    """``HOST:PORT:SECRET`` -> its parts (``ValueError`` if malformed)."""
    host, sep, rest = token.strip().partition(":")
    port, sep2, secret = rest.partition(":")
    if not (sep and sep2 and host and port.isdigit() and secret):
        raise ValueError(f"malformed token {token!r} (expected HOST:PORT:SECRET)")
    if not 0 < int(port) < 65536:
        raise ValueError(f"bad port in token {token!r}")
    return host, int(port), secret


def fetch_status(token: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /status`` of the program the token names (``OSError`` if it cannot be reached,
    ``PermissionError`` for a wrong token)."""
    host, port, secret = parse_token(token)
    request = urllib.request.Request(f"http://{host}:{port}/status")
    request.add_header("Authorization", f"Bearer {secret}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(MAX_STATUS_BYTES + 1)
    except urllib.error.HTTPError as error:
        if error.code == 403:
            raise PermissionError("the program refused the token") from None
        raise OSError(f"the program answered {error.code}") from None
    if len(body) > MAX_STATUS_BYTES:
        raise OSError("status too large")
    status: dict[str, Any] = json.loads(body)
    return status


@dataclass(frozen=True, slots=True)
class ActorRow:
    """One line of the view."""

    host: str
    proc: str
    os_pid: int
    mesh: str
    actor: str
    actor_id: str
    cls: str
    rank: int
    state: str
    mailbox: int
    received: int
    #: Messages per second since the previous poll (``None`` on the first).
    rate: float | None


def actor_rows(
    status: Mapping[str, Any], previous: Mapping[str, Any] | None = None
) -> list[ActorRow]:
    """The actors of ``status``, host by host, process by process; rates against
    ``previous`` (the poll before)."""
    before: dict[str, int] = {}
    elapsed = 0.0
    if previous is not None:
        elapsed = float(status.get("time", 0.0)) - float(previous.get("time", 0.0))
        for host in previous.get("hosts", []):
            for proc in host.get("procs", []):
                for actor in proc.get("actors", []):
                    before[str(actor["actor_id"])] = int(actor.get("received", 0))
    rows: list[ActorRow] = []
    for host in status.get("hosts", []):
        for proc in host.get("procs", []):
            for actor in proc.get("actors", []):
                received = int(actor.get("received", 0))
                prior = before.get(str(actor["actor_id"]))
                rate = None
                if prior is not None and elapsed > 0:
                    rate = max(0.0, (received - prior) / elapsed)
                rows.append(
                    ActorRow(
                        host=str(host.get("host", "")),
                        proc=str(proc.get("proc", "")),
                        os_pid=int(proc.get("os_pid", 0)),
                        mesh=str(proc.get("mesh", "")),
                        actor=str(actor.get("name", "")),
                        actor_id=str(actor["actor_id"]),
                        cls=str(actor.get("cls", "")),
                        rank=int(actor.get("rank", 0)),
                        state=str(actor.get("state", "")),
                        mailbox=int(actor.get("mailbox", 0)),
                        received=received,
                        rate=rate,
                    )
                )
    return rows


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def render(
    status: Mapping[str, Any],
    rows: Sequence[ActorRow],
    width: int = 120,
    height: int = 40,
    error: str = "",
) -> list[str]:
    """The view's lines, each at most ``width`` characters, at most ``height`` lines."""
    hosts = status.get("hosts", [])
    nprocs = sum(len(h.get("procs", [])) for h in hosts)
    telemetry = status.get("telemetry", {})
    on = ",".join(k for k, v in sorted(telemetry.items()) if v) or "off"
    lines = [
        f"monarch top - {status.get('program', '?')} (client os pid "
        f"{status.get('client_os_pid', '?')})  {time.strftime('%H:%M:%S')}",
        f"hosts {len(hosts)}  processes {nprocs}  actors {len(rows)}  telemetry {on}"
        + (
            f"  unreachable: {', '.join(status['unreachable'])}"
            if status.get("unreachable")
            else ""
        ),
    ]
    if error:
        lines.append(f"! {error}")
    lines.append("")
    lines.append(
        f"{'HOST':<12} {'PROC':<24} {'PID':>7} {'STATE':<9} {'MBOX':>5} {'MSG/S':>8} "
        f"{'RECV':>8}  ACTOR"
    )
    failures = list(status.get("failures", []))
    room = height - len(lines) - (min(len(failures), 5) + 2 if failures else 0)
    for row in rows[: max(0, room)]:
        rate = "-" if row.rate is None else f"{row.rate:.1f}"
        lines.append(
            f"{_cut(row.host, 12):<12} {_cut(row.proc, 24):<24} {row.os_pid:>7} "
            f"{row.state:<9} {row.mailbox:>5} {rate:>8} {row.received:>8}  {row.actor}"
        )
    if len(rows) > max(0, room):
        lines.append(f"... {len(rows) - max(0, room)} more actors")
    if failures:
        lines.append("")
        lines.append("recent failures:")
        for failure in failures[-5:]:
            stamp = time.strftime("%H:%M:%S", time.localtime(float(failure.get("timestamp", 0))))
            lines.append(
                f"  {stamp} {failure.get('event', '')} {failure.get('actor', '')} "
                f"[{failure.get('category', '')}] {failure.get('reason', '')}"
            )
    return [_cut(line, width) for line in lines[:height]]


def _once(token: str, interval: float, as_json: bool, out: TextIO) -> int:
    first = fetch_status(token)
    if interval > 0:
        time.sleep(interval)  # the second poll gives the rates
        second = fetch_status(token)
        rows = actor_rows(second, first)
    else:
        second, rows = first, actor_rows(first)
    if as_json:
        out.write(json.dumps({"rows": [asdict(r) for r in rows], "status": second}, indent=1))
        out.write("\n")
    else:
        size = shutil.get_terminal_size((160, 1000))
        out.write("\n".join(render(second, rows, size.columns, 1_000_000)) + "\n")
    return 0


def _live(token: str, interval: float, out: TextIO) -> int:
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved: Any = None
    if fd is not None:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    previous: dict[str, Any] | None = None
    status: dict[str, Any] = {}
    try:
        out.write("\x1b[?25l")  # hide the cursor
        while True:
            error = ""
            try:
                current = fetch_status(token)
                rows = actor_rows(current, previous)
                previous = status = current
            except PermissionError as exc:
                out.write(f"\x1b[?25h\nmonarch top: {exc}\n")
                return 1
            except OSError as exc:
                error = f"cannot reach the program: {exc}"
                rows = actor_rows(status) if status else []
            size = shutil.get_terminal_size((120, 40))
            lines = render(status, rows, size.columns, size.lines - 1, error)
            out.write("\x1b[H\x1b[2J" + "\r\n".join(lines) + "\r\n(q to quit)")
            out.flush()
            ready = select.select([fd], [], [], interval)[0] if fd is not None else []
            if fd is None:
                time.sleep(interval)
            elif ready and os.read(fd, 64).lower().startswith(b"q"):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        out.write("\x1b[?25h\r\n")
        out.flush()
        if saved is not None and fd is not None:
            import termios

            with contextlib.suppress(Exception):
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run(token: str, *, once: bool = False, as_json: bool = False, interval: float = 1.0) -> int:
    """Run ``monarch top`` against the program ``token`` names; the exit status."""
    if interval < 0 or interval > 3600:
        raise ValueError("interval must be between 0 and 3600 seconds")
    parse_token(token)
    out = sys.stdout
    if once:
        return _once(token, interval, as_json, out)
    return _live(token, max(interval, 0.05), out)
