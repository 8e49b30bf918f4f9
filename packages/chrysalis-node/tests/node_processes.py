"""Running real ``chrysalis`` processes from tests: start one and wait for its join token, run a
``--json`` command, poll the tree until it looks as expected, stop them all.

Why a helper: the process tests (a 7-process tree, three network namespaces, trio against
asyncio processes) all start nodes the same way; one copy keeps their bounds (30 s for a token,
10 s for an exit) and their clean-up alike. Every wait is bounded, and every process started
here is stopped by :func:`stop_all` (SIGTERM, then SIGKILL after 10 s).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CLI", "eventually", "read_ready", "run_json", "start_node", "stop_all"]

CLI = [sys.executable, "-m", "chrysalis.node._cli"]
"""The ``chrysalis`` command, run by this interpreter."""
TOKEN_TIMEOUT = 30.0
"""Seconds a starting node has to print its join token."""


def start_node(
    argv: Sequence[str], env: dict[str, str], log: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` (a ``serve`` or ``join`` command line, possibly wrapped, e.g. in
    ``ip netns exec``) with its stderr appended to ``log`` (discarded without one), and
    wait for the join token it prints first. A process that prints none within
    :data:`TOKEN_TIMEOUT` is stopped and fails the test, with its log's tail."""
    handle = open(log, "ab") if log is not None else None  # noqa: SIM115 (owned by the process)
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=handle if handle is not None else subprocess.DEVNULL,
            env=env,
        )
    finally:
        if handle is not None:
            handle.close()
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], TOKEN_TIMEOUT)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if "?authority=" not in line:
        stop_all([proc])
        tail = log.read_text()[-2000:] if log is not None else ""
        raise AssertionError(f"{argv[-1]!r}... printed no join token ({line!r}): {tail}")
    return proc, line


def read_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> dict[str, Any]:
    """The record of the ``[root] READY {json}`` line a ``chrysalis scale --persist`` launcher
    prints first (bounded by ``timeout`` seconds; failing with the tail of its ``log``)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("[root] READY "):
        raise AssertionError(f"no READY line ({line!r}): {log.read_text()[-2000:]}")
    record: dict[str, Any] = json.loads(line.removeprefix("[root] READY "))
    return record


def run_json(argv: Sequence[str], env: dict[str, str], timeout: float) -> tuple[int, Any, str]:
    """Run a ``--json`` command (bounded by ``timeout`` seconds): its exit status, its decoded
    stdout (``None`` when it printed nothing) and its stderr."""
    done = subprocess.run(argv, capture_output=True, env=env, timeout=timeout, check=False)
    return done.returncode, json.loads(done.stdout or b"null"), done.stderr.decode()


def eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Re-run ``check`` every 0.3 s until it holds, failing after ``timeout`` seconds with
    ``what``: the state polled here (another process's namespace, seen through ``chrysalis
    ls``) offers no event to wait on."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s: {what}"
        time.sleep(0.3)


def stop_all(procs: Iterable[subprocess.Popen[bytes]], grace: float = 10) -> None:
    """Stop every process (SIGTERM; SIGKILL for one still running ``grace`` seconds later),
    reap it and close its stdout."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
