"""``monarch top`` (issue 21, item 5): attach by token to a running program and list its actors.

One known program (``top_program.py``: two worker processes of ``Ticker`` actors, called in a
loop) runs for the module, started with ``MONARCH_ADMIN_PORT=0``; its token comes from the line
it writes on stderr. ``monarch top --once --json`` lists its actors with message rates, and the
live view, driven in a pseudo-terminal, shows them and quits on ``q``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor._runtime.telemetry import top

HERE = Path(__file__).parent
T = 60.0
_COMMAND = (sys.executable, "-m", "monarch.actor._runtime.telemetry.command")
_TOKEN = re.compile(r"monarch top --token (\S+)")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("top") / "token"


@pytest.fixture(scope="module")
def program(token_file: Path) -> Iterator[str]:
    env = _env()
    env["MONARCH_ADMIN_PORT"] = "0"
    env["MONARCH_ADMIN_TOKEN_FILE"] = str(token_file)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "top_program.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    token, ready, seen = None, False, b""
    deadline = time.monotonic() + T
    try:
        while not (token and ready):
            left = deadline - time.monotonic()
            assert left > 0, f"the program did not start: {seen!r}"
            readable, _, _ = select.select([proc.stdout, proc.stderr], [], [], left)
            for stream in readable:
                chunk = os.read(stream.fileno(), 65536)
                assert chunk, f"the program ended early: {seen!r}"
                seen += chunk
            ready = b"\nready\n" in b"\n" + seen
            found = _TOKEN.search(seen.decode(errors="replace"))
            token = found.group(1) if found else None
        yield token
        out, err = proc.communicate(timeout=T)  # closes its stdin: the program ends
        assert proc.returncode == 0, (out, err)
        assert b"program done" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=T)


def _top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_COMMAND, "top", *args],
        capture_output=True,
        text=True,
        timeout=T,
        env=_env(),
    )


def test_once_json_lists_the_programs_actors_with_rates(program: str) -> None:
    # two polls 2 s apart: each worker must receive a tick between them for a rate above 0,
    # and the program ticks at its own pace (0.3 s apart, a starved program missed the window)
    done = _top("--token", program, "--once", "--json", "--interval", "2")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    tickers = [r for r in doc["rows"] if r["cls"] == "admin_actors.Ticker"]
    assert sorted(r["rank"] for r in tickers) == [0, 1]
    assert {r["state"] for r in tickers} == {"running"}
    assert all(r["rate"] is not None and r["rate"] > 0 for r in tickers), tickers
    assert len({r["os_pid"] for r in tickers}) == 2  # one worker process each
    assert doc["status"]["hosts"]  # where they run
    assert "top_program.py" in doc["status"]["program"]


def test_once_prints_a_table_reading_the_token_file(program: str, token_file: Path) -> None:
    assert token_file.read_text().strip() == program
    assert token_file.stat().st_mode & 0o777 == 0o600
    done = _top("--token-file", str(token_file), "--once", "--interval", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("HOST") and "MBOX" in line for line in lines), done.stdout
    rows = [line for line in lines if "admin_actors.Ticker tickers" in line]
    assert len(rows) == 2, done.stdout
    assert all(" running " in row for row in rows)


def test_a_wrong_or_malformed_token_is_refused(program: str) -> None:
    host, port, _ = top.parse_token(program)
    wrong = _top("--token", f"{host}:{port}:nottheone", "--once")
    assert wrong.returncode == 1
    assert "refused the token" in wrong.stderr
    malformed = _top("--token", "nonsense", "--once")
    assert malformed.returncode == 2
    assert "malformed token" in malformed.stderr


def test_the_live_view_in_a_terminal_shows_the_actors_and_quits_on_q(program: str) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*_COMMAND, "top", "--token", program, "--interval", "0.2"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=dict(_env(), COLUMNS="160", LINES="40"),
        close_fds=True,
    )
    os.close(follower)
    screen = b""
    try:
        deadline = time.monotonic() + T
        # Two polls: the second has the message rates.
        while screen.count(b"admin_actors.Ticker tickers") < 4:
            left = deadline - time.monotonic()
            assert left > 0, screen.decode(errors="replace")
            if select.select([leader], [], [], left)[0]:
                screen += os.read(leader, 65536)
        last = screen.decode(errors="replace").split("\x1b[2J")[-1]
        assert "monarch top - " in last
        assert "processes 3" in last  # the client and two workers
        rows = [line for line in last.splitlines() if "admin_actors.Ticker tickers" in line]
        assert len(rows) == 2, last
        os.write(leader, b"q")
        assert proc.wait(timeout=T) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=T)
        os.close(leader)


# -- the pure parts -----------------------------------------------------------------------------
def _status(t: float, received: int, state: str = "running") -> dict[str, Any]:
    actor = {"name": "<root>.<m.A a{}>", "actor_id": "a@01", "cls": "m.A", "rank": 0}
    actor |= {"state": state, "mailbox": 3, "received": received}
    proc = {"proc": "p", "os_pid": 7, "mesh": "procs", "actors": [actor]}
    return {"time": t, "hosts": [{"host": "h", "procs": [proc]}], "failures": []}


def test_rates_are_differences_over_time() -> None:
    (first,) = top.actor_rows(_status(10.0, 5))
    assert first.rate is None
    (row,) = top.actor_rows(_status(12.0, 25), _status(10.0, 5))
    assert row.rate == 10.0
    assert (row.mailbox, row.received, row.os_pid) == (3, 25, 7)


def test_render_fits_the_terminal_and_lists_failures() -> None:
    status = _status(1.0, 1)
    status["failures"] = [
        {"timestamp": 1.0, "event": "actor_failed", "actor": "x", "category": "user", "reason": "r"}
    ]
    lines = top.render(status, top.actor_rows(status), width=40, height=12)
    assert len(lines) <= 12
    assert all(len(line) <= 40 for line in lines)
    assert any("actor_failed" in line for line in lines)
    with pytest.raises(ValueError, match="malformed token"):
        top.parse_token("h:notaport:s")
