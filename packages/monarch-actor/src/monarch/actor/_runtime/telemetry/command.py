"""The ``monarch`` command (console script): ``monarch trace -o trace.json -- python prog.py``,
``monarch top --token TOKEN`` (``top``: a running program's actors, live).

``trace`` runs an unchanged program with tracing on and writes its trace: it starts the
program with ``MONARCH_TRACE_FILE`` set, which the program's client (the first process that
imports ``monarch.actor``) reads at import (``telemetry._trace_file_from_environment``): it
turns tracing on (workers inherit ``MONARCH_TELEMETRY``), collects the spans its worker
processes push to it when they are stopped (``report``), and at exit, after its shutdown
stopped every mesh, writes one Chrome trace-event JSON file (a ``pid`` per process, a track per
actor, flow arrows from each call's send span to its receive spans) that Perfetto
(ui.perfetto.dev) and ``chrome://tracing`` open. The command exits with the program's status.

Only the standard library is used here (and ``top``, which uses only it): the program runs in
its own interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from monarch.actor._runtime.telemetry import top as _top_view

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="monarch", description="Monarch actor tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    trace = commands.add_parser(
        "trace",
        help="run a program with tracing on and write its trace (Chrome trace-event JSON)",
        description="Run PROGRAM (after --) with tracing on; write one Perfetto-readable trace "
        "of every process's spans to -o.",
    )
    trace.add_argument("-o", "--output", default="trace.json", help="trace file (trace.json)")
    trace.add_argument("--metrics", action="store_true", help="turn metrics on as well")
    trace.add_argument("program", nargs=argparse.REMAINDER, help="-- command [args...]")
    top = commands.add_parser(
        "top",
        help="watch a running program's hosts, processes and actors",
        description="Attach to a running program's admin endpoint (it printed 'monarch top "
        "--token TOKEN' when started with admin_port / MONARCH_ADMIN_PORT, or call "
        "monarch.actor._mesh.admin.start_admin()) and show its actors live; q quits.",
    )
    top.add_argument("--token", help="HOST:PORT:SECRET (or MONARCH_TOP_TOKEN)")
    top.add_argument("--token-file", help="read the token from this file")
    top.add_argument("--once", action="store_true", help="print one table and exit")
    top.add_argument("--json", action="store_true", help="with --once: JSON instead of a table")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between polls (1.0)")
    return parser


def _top(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("MONARCH_TOP_TOKEN", "")
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            sys.stderr.write(f"monarch top: cannot read {args.token_file}: {exc}\n")
            return 2
    if not token:
        sys.stderr.write("monarch top: no token (--token HOST:PORT:SECRET)\n")
        return 2
    try:
        return _top_view.run(token, once=args.once, as_json=args.json, interval=args.interval)
    except ValueError as exc:
        sys.stderr.write(f"monarch top: {exc}\n")
        return 2
    except PermissionError as exc:
        sys.stderr.write(f"monarch top: {exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"monarch top: cannot reach the program: {exc}\n")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``monarch`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "top":
        return _top(args)
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        sys.stderr.write("monarch trace: no program given (monarch trace -o out.json -- cmd)\n")
        return 2
    output = Path(args.output).resolve()
    output.unlink(missing_ok=True)
    env = dict(os.environ)
    env["MONARCH_TRACE_FILE"] = str(output)
    env["MONARCH_TELEMETRY"] = "metrics,tracing" if args.metrics else "tracing"
    try:
        code = subprocess.call(program, env=env)
    except OSError as exc:
        sys.stderr.write(f"monarch trace: cannot run {program[0]!r}: {exc}\n")
        return 127
    if not output.exists():
        sys.stderr.write(
            "monarch trace: the program wrote no trace (did it import monarch.actor?); "
            f"wrote an empty one to {output}\n"
        )
        output.write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms"}))
    else:
        events = json.loads(output.read_text()).get("traceEvents", [])
        spans = sum(1 for e in events if e.get("ph") == "X")
        procs = len({e.get("pid") for e in events if e.get("ph") == "X"})
        sys.stderr.write(f"monarch trace: {spans} spans from {procs} processes in {output}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
