"""What a wake-up costs on this machine: thread to thread, process to process, and a ``call_one``.

Why (issue 23): a ``call_one`` round trip wakes four sleeping threads in turn (the worker's
runtime loop, the actor's thread, the client's runtime loop, the caller), and on a virtual
machine whose idle vCPUs halt at once (``haltpoll.guest_halt_poll_ns=0`` on the kernel command
line here) waking a thread whose CPU has gone idle costs the hypervisor's wake-up, tens of
microseconds, however little Python runs. This script measures that cost against a baseline
that does not pay it: the same exchange with every thread and process pinned to one CPU, where
a wake-up is a context switch on a CPU that is busy anyway. Each case alternates the two sides
(``A B A B ...``, pinned first) and reports each side's median round trip and their ratio:

- ``threads``: two threads of one process hand a token back and forth through two locks
  (``_thread.allocate_lock``, what the runtime's mailbox and future cells sleep on): two
  wake-ups a round trip.
- ``processes``: two processes send one byte back and forth over a Unix socket pair (blocking
  ``recv``, what a lane's reader sleeps on): two wake-ups a round trip.
- ``actor`` (where ``monarch.actor`` is importable): a tiny ``call_one`` to a sync actor in
  one worker process (four wake-ups), the client and its worker on one CPU (``same``, the
  baseline), each on its own CPU (``split``: the in-process hand-offs stay on one CPU, the
  two wires cross), and free (``free``, as programs run).

The ``(free - pinned) / wake-ups`` column estimates what one wake-up of an idle CPU adds. The
report's header gives the idle driver and the halt-polling window read from ``/sys`` (read
only: the script changes nothing). Needs at least two CPUs in this process's affinity mask.

    .venv/bin/python benchmarks/wakeup_cost.py           # ~40 s
    .venv/bin/python benchmarks/wakeup_cost.py --quick   # ~12 s
    .venv/bin/python benchmarks/wakeup_cost.py --smoke   # ~5 s (CI)
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (
    add_run_arguments,
    alternate_sides,
    check_cases,
    machine_facts,
    machine_line,
    partial_run_warning,
    run_mode,
    write_json,
)

CASES = ("threads", "processes", "actor")
HEADING = "## Wake-up cost (`benchmarks/wakeup_cost.py`)"
#: Round trips a trial (after ``WARMUP``), and trials a side, by mode.
SIZES = {"full": (4000, 7), "quick": (2000, 3), "smoke": (200, 1)}
WARMUP = 100
#: Wake-ups per round trip, by case.
WAKEUPS = {"threads": 2, "processes": 2, "actor": 4}
_SYS = Path("/sys")


def idle_facts() -> dict[str, str]:
    """The idle driver and governor, and the guest halt-polling window, where ``/sys`` has them."""
    facts = {}
    for key, path in (
        ("cpuidle_driver", "devices/system/cpu/cpuidle/current_driver"),
        ("cpuidle_governor", "devices/system/cpu/cpuidle/current_governor_ro"),
        ("guest_halt_poll_ns", "module/haltpoll/parameters/guest_halt_poll_ns"),
    ):
        try:
            facts[key] = (_SYS / path).read_text().strip()
        except OSError:
            facts[key] = "unknown"
    return facts


def _pin(cpu: int | None) -> None:
    """Bind the calling thread to ``cpu`` (None: leave it as it is)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


@contextlib.contextmanager
def _pinned(cpu: int | None) -> Iterator[None]:
    """The calling thread bound to ``cpu`` meanwhile (None: as it is), its mask restored after."""
    mask = os.sched_getaffinity(0)
    _pin(cpu)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mask)


def threads_trial(n: int, cpu: int | None) -> list[float]:
    """Round trips (seconds) of a token passed between two threads through two locks."""
    ping, pong = _thread.allocate_lock(), _thread.allocate_lock()
    ping.acquire()
    pong.acquire()
    total = WARMUP + n

    def echo() -> None:
        _pin(cpu)
        for _ in range(total):
            ping.acquire()
            pong.release()

    thread = threading.Thread(target=echo, daemon=True)
    with _pinned(cpu):
        thread.start()
        times = []
        for i in range(total):
            start = time.perf_counter()
            ping.release()
            if not pong.acquire(timeout=10.0):
                raise RuntimeError("the echo thread stopped answering")
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        thread.join(10.0)
    return times


def processes_trial(n: int, cpu: int | None) -> list[float]:
    """Round trips (seconds) of one byte between two processes over a Unix socket pair."""
    total = WARMUP + n
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with _pinned(cpu):
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:  # the echo: no Python objects made per byte, exits without cleanup
            try:
                ours.close()
                for _ in range(total):
                    theirs.sendall(theirs.recv(1))
            finally:
                os._exit(0)
        theirs.close()
        times = []
        try:
            ours.settimeout(10.0)
            for i in range(total):
                start = time.perf_counter()
                ours.sendall(b"x")
                if not ours.recv(1):
                    raise RuntimeError("the echo process ended early")
                if i >= WARMUP:
                    times.append(time.perf_counter() - start)
        finally:
            ours.close()
            os.waitpid(pid, 0)
    return times


ACTOR_PROGRAM = r"""
import json, os, sys, time
from monarch.actor import Actor, endpoint, this_host

class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

if __name__ == "__main__":
    mode, n, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cpus = sorted(os.sched_getaffinity(0))
    bind = {}
    if mode != "free":
        os.sched_setaffinity(0, {cpus[0]})
        worker_cpu = cpus[0] if mode == "same" else cpus[1]
        bind = {"proc_bind": [{"cpus": str(worker_cpu)}]}
    procs = this_host().spawn_procs(per_host={"procs": 1}, **bind)
    echo = procs.spawn("echo", Echo)
    for i in range(warmup):
        echo.ping.call_one(i).get()
    times = []
    for i in range(n):
        start = time.perf_counter()
        echo.ping.call_one(i).get()
        times.append(time.perf_counter() - start)
    procs.stop().get()
    print(json.dumps(times))
"""


def actor_trial(n: int, mode: str) -> list[float]:
    """Round trips (seconds) of ``call_one`` in a fresh client (``mode``: same, split, free)."""
    with tempfile.TemporaryDirectory() as folder:  # workers import the main module: a file
        program = Path(folder) / "wakeup_actor.py"
        program.write_text(ACTOR_PROGRAM)
        # Its own session: on a timeout the client and the workers it started go together.
        proc = subprocess.Popen(
            [sys.executable, str(program), mode, str(n), str(WARMUP)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"the actor trial ({mode}) took over 120 s") from None
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the actor trial ({mode}) failed:\n{err[-3000:]}")
    times: list[float] = json.loads(lines[-1])
    return times


def have_actor() -> bool:
    try:
        import monarch.actor  # noqa: F401
    except ImportError:
        return False
    return True


def run_case(case: str, n: int, trials: int) -> dict[str, Any]:
    """Alternate the sides of ``case`` (one CPU first) ``trials`` times; each side's median."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    sides = {"same CPU": "same", "split": "split", "free": "free"}
    if case != "actor":
        del sides["split"]

    def side(how: str) -> Callable[[], float]:
        def run() -> float:
            if case == "threads":
                times = threads_trial(n, cpu if how == "same" else None)
            elif case == "processes":
                times = processes_trial(n, cpu if how == "same" else None)
            else:
                times = actor_trial(n, how)
            return statistics.median(times) * 1e6

        return run

    runs = alternate_sides([side(how) for how in sides.values()], trials, budget_s=math.inf)
    medians = {name: list(values) for name, values in zip(sides, runs, strict=True)}
    result = {name: statistics.median(values) for name, values in medians.items()}
    return {"case": case, "wakeups": WAKEUPS[case], "p50_us": result, "trials": medians}


def report(results: list[dict[str, Any]], meta: dict[str, str], mode: str) -> str:
    lines = [HEADING, "", *partial_run_warning(mode)]
    lines.append(
        f"{machine_line(meta)}; idle driver {meta['cpuidle_driver']}, governor "
        f"{meta['cpuidle_governor']}, guest halt polling {meta['guest_halt_poll_ns']} ns."
    )
    lines += [
        "",
        "| case | wake-ups a round trip | same CPU p50 us | other side(s) p50 us | free / same CPU "
        "| (free - same CPU) / wake-ups, us |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for row in results:
        p50 = row["p50_us"]
        same, free = p50["same CPU"], p50["free"]
        others = ", ".join(
            f"{side} {value:,.1f}" for side, value in p50.items() if side != "same CPU"
        )
        lines.append(
            f"| {row['case']} | {row['wakeups']} | {same:,.1f} | {others} | {free / same:.2f}x "
            f"| {(free - same) / row['wakeups']:,.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(
        parser,
        quick="fewer, shorter trials (~12 s)",
        smoke="one short trial of each side (~5 s, CI)",
        cases=CASES,
    )
    args = parser.parse_args(argv)
    check_cases(parser, args.case, CASES)
    if len(os.sched_getaffinity(0)) < 2:
        print(
            "wakeup_cost: needs at least two CPUs in this process's affinity mask", file=sys.stderr
        )
        return 2
    mode = run_mode(args)
    n, trials = SIZES[mode]
    cases = [c for c in CASES if not args.case or c in args.case]
    if "actor" in cases and not have_actor():
        print("wakeup_cost: monarch.actor is not importable: no actor case", file=sys.stderr)
        cases.remove("actor")
    meta = {**machine_facts("benchmarks/wakeup_cost.py", argv), **idle_facts()}
    results = []
    for case in cases:
        print(f"wakeup_cost: {case} ...", file=sys.stderr, flush=True)
        # The actor case's calls are slower and each trial starts a client: fewer of them.
        results.append(run_case(case, n // 2 if case == "actor" else n, trials))
    sys.stdout.write(report(results, meta, mode))
    if args.json is not None:
        write_json(args.json, {"mode": mode, "meta": meta, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
