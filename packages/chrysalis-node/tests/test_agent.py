"""``chrysalis agent`` (issue 22 item 5): a warm process answers ``ls``/``resolve``/``ping`` from
a warm joined node (a session) and runs ``pipe`` (and what a session does not take) in a fork
with the caller's streams, directory and environment; answers are fresh; a session that lost
its root hands the command back and a new one joins when the root is back; the command falls
back to its own process without an agent, with a stale socket, and for what the agent
refuses; an interrupted caller interrupts its command; ``stop`` and the idle exit end the
agent.

Real processes: a root (``serve --echo``), an agent (``agent serve`` in the foreground, on a
socket of the test's own directory), and ``chrysalis`` commands, each bounded."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chrysalis.node import _agent, _agent_client, _agent_session
from chrysalis.node._cli import build_parser

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, eventually, start_node, stop_all

T = 60.0


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A root serving echo, and the environment of the commands (their own CA and socket)."""
    tmp = tmp_path_factory.mktemp("agent")
    env = dict(
        os.environ,
        CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"),
        CHRYSALIS_AGENT_SOCKET=str(tmp / "run" / "agent.sock"),
    )
    env.pop("CHRYSALIS_NO_AGENT", None)
    root, token = start_node([*CLI, "serve", "--echo"], env, tmp / "root.log")
    try:
        yield {"token": token, "root": token.rsplit("=", 1)[1], "tmp": str(tmp), **env}
    finally:
        stop_all([root])


def _env(tree: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tree.items() if k not in ("token", "root", "tmp")}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, env=env, timeout=T)


def _status(env: dict[str, str]) -> dict[str, object]:
    return _agent._control(Path(env["CHRYSALIS_AGENT_SOCKET"]), "status")


@pytest.fixture(scope="module")
def agent(tree: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    env = _env(tree)
    log = open(Path(tree["tmp"]) / "agent.log", "ab")  # noqa: SIM115 (owned by the process)
    proc = subprocess.Popen([*CLI, "agent", "serve"], env=env, stdout=log, stderr=log)
    log.close()
    try:
        eventually(lambda: Path(env["CHRYSALIS_AGENT_SOCKET"]).exists(), T, "the agent's socket")
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=T)


def test_commands_run_in_the_agent_with_the_callers_streams_and_environment(
    tree: dict[str, str], agent: subprocess.Popen[bytes]
) -> None:
    env = _env(tree)
    served = int(str(_status(env)["served"]))
    through = _run(["--timeout", "30", "ls", tree["token"], "--json"], env)  # options first
    assert through.returncode == 0, through.stderr
    assert tree["root"] in {entry["pid"] for entry in json.loads(through.stdout)}
    assert _status(env)["served"] == served + 1
    done = _run(["agent", "status", "--json"], env)  # the command's view of the same
    assert json.loads(done.stdout)["served"] == served + 1
    alone = _run(["ls", tree["token"], "--json"], {**env, "CHRYSALIS_NO_AGENT": "1"})
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)[0].keys() == json.loads(through.stdout)[0].keys()
    assert _status(env)["served"] == served + 1  # that one ran in its own process
    # Errors come back on the caller's stderr, with the exit status.
    missing = _run(["resolve", tree["token"], "ffffffff"], env)
    assert missing.returncode == 1
    assert missing.stderr.startswith("chrysalis: error: no PID matches"), missing.stderr
    # The agent parses: a usage error is reported there, on the caller's stderr, status 2.
    usage = _run(["ls"], env)
    assert usage.returncode == 2
    assert "usage: chrysalis ls" in usage.stderr, usage.stderr
    # Standard input is the caller's too: pipe to the echoing root.
    piped = subprocess.run(
        [*CLI, "pipe", tree["token"], tree["root"]],
        input=b"\x00through the agent",
        capture_output=True,
        env=env,
        timeout=T,
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == b"\x00through the agent"
    assert _status(env)["served"] == served + 4


def _agent_entries(env: dict[str, str], token: str) -> list[str]:
    """PIDs of the ``command=agent`` entries at ``token``'s root."""
    return [pid for pid, command in _commands(_ls(env, token)).items() if command == "agent"]


def _sessions(env: dict[str, str]) -> int:
    sessions = _status(env)["sessions"]
    assert isinstance(sessions, list)
    return len(sessions)


def _ls(env: dict[str, str], token: str) -> list[dict[str, Any]]:
    done = _run(["ls", token, "--json"], env)
    assert done.returncode == 0, done.stderr
    entries: list[dict[str, Any]] = json.loads(done.stdout)
    return entries


def _commands(entries: list[dict[str, Any]]) -> dict[str, str]:
    """PID -> its ``command`` label."""
    return {str(e["pid"]): str(e["labels"].get("command")) for e in entries}


def test_ls_is_answered_by_a_warm_session_and_is_fresh(
    tree: dict[str, str], agent: subprocess.Popen[bytes]
) -> None:
    env = _env(tree)
    first = _commands(_ls(env, tree["token"]))
    warm = int(str(_status(env)["warm"]))
    second = _commands(_ls(env, tree["token"]))
    assert int(str(_status(env)["warm"])) == warm + 1  # answered without a fork
    # The agent's session node is listed (command=agent), the same one both times, and no
    # per-command client (command=ls).
    agents = [pid for pid, command in second.items() if command == "agent"]
    assert len(agents) == 1, second
    assert agents[0] in first
    assert "ls" not in second.values()
    # Fresh: a node that joined after the session did is in the very next answer, and gone
    # from the one after it left (the root's namespace, not the session's cache).
    joined, token = start_node([*CLI, "join", tree["token"]], env)
    try:
        child = token.rsplit("=", 1)[1]
        assert child in _commands(_ls(env, tree["token"]))
        resolved = _run(["resolve", tree["token"], child[:12], "--json"], env)
        assert json.loads(resolved.stdout)["pid"] == child, resolved.stderr
    finally:
        stop_all([joined])
    # A clean leave withdraws the node at the root (within the leave's own round trip; well
    # before the 30 s idle timeout that would fence a silent one).
    eventually(lambda: child not in _commands(_ls(env, tree["token"])), 10, "the child gone")
    pinged = _run(["ping", tree["token"], "--json"], env)
    assert pinged.returncode == 0, pinged.stderr
    assert json.loads(pinged.stdout)[tree["root"]]["ok"] is True
    assert int(str(_status(env)["warm"])) == warm + 5
    assert _sessions(env) == 1


def test_a_session_that_lost_its_root_hands_the_command_back_and_rejoins(
    tree: dict[str, str], agent: subprocess.Popen[bytes]
) -> None:
    """A root of its own (fixed identity and port, so it can come back): while it is away
    the command reports it as it would alone; once it is back, the agent answers again."""
    env = _env(tree)
    tmp = Path(tree["tmp"])
    identity = tmp / "lost-root"
    assert _run(["identity", "issue", "--out", str(identity)], env).returncode == 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = [*CLI, "--identity-dir", str(identity), "serve", "--listen", f"udp://127.0.0.1:{port}"]
    root, token = start_node(serve, env)
    try:
        assert token.rsplit("=", 1)[1] in _commands(_ls(env, token))
        sessions = _sessions(env)
    finally:
        stop_all([root])
    started = time.monotonic()
    away = _run(["ls", token, "--timeout", "3"], env)
    assert away.returncode == 1
    assert away.stderr.startswith("chrysalis: error: no parent answered at"), away.stderr
    assert time.monotonic() - started < 3 + _agent_session.WARM_ATTEMPT + 10
    eventually(
        lambda: _sessions(env) < sessions,
        T,
        "the lost session gone",
    )
    root, again = start_node(serve, env)
    try:
        assert again == token
        warm = int(str(_status(env)["warm"]))
        assert token.rsplit("=", 1)[1] in _commands(_ls(env, token))
        assert int(str(_status(env)["warm"])) == warm + 1
    finally:
        stop_all([root])


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_session_key_separates_what_a_node_depends_on() -> None:
    token = "udp://127.0.0.1:9?authority=" + "ab" * 16
    key = _agent_session.session_key
    base = key(_args("ls", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca", "PATH": "/bin"})
    assert base is not None
    same = [
        key(_args("resolve", token, "ab"), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca"}),
        key(_args("--json", "ping", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca", "X": "1"}),
        key(_args("--ca-dir", "../w/ca", "ls", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca"}),
    ]
    assert same[:2] == [base, base]
    assert same[2] == key(
        _args("--ca-dir", "/w/ca", "ls", token), "/", {"CHRYSALIS_DEV_CA_DIR": "/ca"}
    )
    other = [
        key(_args("ls", token.replace(":9", ":10")), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca"}),
        key(_args("ls", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/other"}),
        key(_args("--label", "a=b", "ls", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca"}),
        key(_args("--idle-timeout", "5", "ls", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca"}),
        key(_args("--identity-dir", "i", "ls", token), "/w", {"CHRYSALIS_DEV_CA_DIR": "/ca"}),
    ]
    assert len({base, *other}) == 6
    # Forked, not warm: pipe, and a command whose debug log belongs on the caller's stderr.
    assert key(_args("pipe", token, "ab"), "/w", {}) is None
    assert key(_args("--log-level", "debug", "ls", token), "/w", {}) is None


def test_an_interrupted_caller_interrupts_its_command(
    tree: dict[str, str], agent: subprocess.Popen[bytes]
) -> None:
    env = _env(tree)
    # A ping of a PID nobody echoes for: it waits out its timeout unless interrupted.
    caller = subprocess.Popen(
        [*CLI, "pipe", tree["token"], tree["root"], "--timeout", "50"],
        stdin=subprocess.PIPE,  # left open: the pipe waits for more input
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        eventually(lambda: _status(env)["running"] == 1, T, "the command running in the agent")
        started = time.monotonic()
        caller.send_signal(signal.SIGINT)
        assert caller.wait(timeout=T) == 130
        eventually(lambda: _status(env)["running"] == 0, 10, "the command interrupted")
        assert time.monotonic() - started < 10
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(timeout=T)
        assert caller.stdin is not None
        caller.stdin.close()


def _ask(path: str, payload: bytes, fds: tuple[int, ...]) -> tuple[int, int, bytes, bytes] | None:
    """Send one raw request; the decoded reply, ``None`` when closed without a word."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(T)
        sock.connect(path)
        frame = len(payload).to_bytes(4, "big") + payload
        rights = struct.pack(f"{len(fds)}i", *fds)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)] if fds else []
        sock.sendmsg([frame], ancillary)
        try:
            reply, _ = _agent._recv_raw(sock)
        except ConnectionError:
            return None
        return _agent_client.decode_reply(reply)


def test_the_agent_refuses_other_commands_and_other_requests(
    tree: dict[str, str], agent: subprocess.Popen[bytes]
) -> None:
    path = tree["CHRYSALIS_AGENT_SOCKET"]
    served = _status(_env(tree))["served"]
    encode = _agent_client.encode_request
    for payload, fds in (
        (encode(["serve"], "/", {}), (0, 1, 2)),  # not a client command
        (encode(["ls", tree["token"]], "/", {}), ()),  # no streams
        (b"chrysalis-agent-1\0x\0", (0, 1, 2)),  # malformed
        (json.dumps({"argv": ["ls", "x"], "cwd": "/", "env": {}}).encode(), (0, 1, 2)),  # old
        (json.dumps({"op": "explode"}).encode(), ()),  # not an operation
    ):
        reply = _ask(path, payload, fds)
        assert reply is None or reply[0] == _agent_client.REFUSED, (payload[:40], reply)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # over the size bound
        sock.settimeout(T)
        sock.connect(path)
        sock.sendall((_agent.MAX_REQUEST + 1).to_bytes(4, "big"))
        assert sock.recv(1) == b""  # closed
    assert _status(_env(tree))["served"] == served
    assert agent.poll() is None  # still serving


def test_the_wire_round_trips_and_refuses_malformed_frames() -> None:
    env = {"A": "1", "B": "x=y", "C": ""}
    argv = ["ls", "unix:///tmp/a b?authority=" + "cd" * 16, "--json", ""]
    payload = _agent_client.encode_request(argv, "/some where", env)
    assert _agent_client.decode_request(payload) == (argv, "/some where", env)
    with pytest.raises(ValueError, match="NUL"):
        _agent_client.encode_request(["a\0b"], "/", {})
    for bad in (
        b"{}",
        b"chrysalis-agent-1\0" + b"9\0ls",
        b"chrysalis-agent-1\0" + b"0\0/\0NOEQUALS",
    ):
        with pytest.raises(ValueError):
            _agent_client.decode_request(bad)
    frame = _agent_client.encode_reply(_agent_client.DONE, 3, b"out", "é".encode())
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert _agent_client.decode_reply(frame[4:]) == (0, 3, b"out", "é".encode())
    with pytest.raises(ValueError):
        _agent_client.decode_reply(frame[4:9])
    with pytest.raises(ValueError):
        _agent_client.decode_reply(b"\x07" + frame[5:])  # an unknown kind


def test_without_an_agent_or_with_a_stale_socket_commands_run_alone(
    tree: dict[str, str],
) -> None:
    env = {**_env(tree), "CHRYSALIS_AGENT_SOCKET": str(Path(tree["tmp"]) / "stale" / "a.sock")}
    path = Path(env["CHRYSALIS_AGENT_SOCKET"])
    path.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    try:
        done = _run(["ls", tree["token"]], env)
        assert done.returncode == 0, done.stderr
        assert tree["root"][:8] in done.stdout
        status = _run(["agent", "status"], env)
        assert status.returncode == 1
        assert status.stderr.startswith("chrysalis: error: no agent answers"), status.stderr
    finally:
        path.unlink()


def test_start_stop_and_the_idle_exit(tree: dict[str, str]) -> None:
    env = {**_env(tree), "CHRYSALIS_AGENT_SOCKET": str(Path(tree["tmp"]) / "own" / "a.sock")}
    path = Path(env["CHRYSALIS_AGENT_SOCKET"])
    started = _run(["agent", "start"], env)
    assert started.returncode == 0, started.stderr
    pid = int(str(_status(env)["pid"]))
    assert _run(["ls", tree["token"]], env).returncode == 0  # starts a session
    sessions = _status(env)["sessions"]
    assert isinstance(sessions, list)
    (session,) = sessions
    lone = {**env, "CHRYSALIS_NO_AGENT": "1"}
    before = _agent_entries(lone, tree["token"])  # this agent's session, and the module's agent's
    assert before
    again = _run(["agent", "start"], env)
    assert again.returncode == 1
    assert "already runs" in again.stderr
    stopped = _run(["agent", "stop"], env)
    assert stopped.returncode == 0, stopped.stderr
    assert not path.exists()
    # `stop` returns once the agent let go of its lock (its session left), so that an agent
    # can start at once (it used to return at the socket's removal: `start` then failed).
    assert _agent._lock_is_free(path)
    eventually(lambda: not Path(f"/proc/{pid}").exists(), 10, "the agent process gone")
    # Its session left the tree with it (a clean leave: gone from the root's namespace).
    assert not Path(f"/proc/{session['pid']}").exists()
    assert len(_agent_entries(lone, tree["token"])) == len(before) - 1
    restarted = _run(["agent", "start"], env)
    assert restarted.returncode == 0, restarted.stderr
    again_pid = int(str(_status(env)["pid"]))
    assert again_pid != pid
    assert _run(["agent", "stop"], env).returncode == 0
    eventually(lambda: not Path(f"/proc/{again_pid}").exists(), 10, "the new agent gone")
    idle = subprocess.run(
        [*CLI, "agent", "serve", "--idle-exit", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=T,
    )
    assert idle.returncode == 0
    assert "idle for 0.5 s: exiting" in idle.stderr
    assert not path.exists()


def test_the_default_socket_is_per_user_and_per_installation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two installations (checkouts, virtual environments) of one user get two agents: a
    command is only answered by an agent that runs its own code."""
    monkeypatch.delenv("CHRYSALIS_AGENT_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    tag = _agent_client.installation_tag()
    assert len(tag) == 8
    int(tag, 16)
    assert tag == _agent_client.installation_tag()  # stable
    assert _agent_client.default_socket() == str(tmp_path / "chrysalis-agent" / f"agent-{tag}.sock")
    monkeypatch.setattr(_agent_client, "__file__", "/elsewhere/chrysalis/node/_agent_client.py")
    other = _agent_client.installation_tag()
    assert other != tag
    assert _agent_client.default_socket().endswith(f"agent-{other}.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert (
        _agent_client.default_socket() == f"/tmp/chrysalis-agent-{os.getuid()}/agent-{other}.sock"
    )
    monkeypatch.setenv("CHRYSALIS_AGENT_SOCKET", "/x/a.sock")
    assert _agent_client.default_socket() == "/x/a.sock"


def _stop_started_agent(env: dict[str, str], pid: int | None) -> None:
    """Stop the agent a test's command started (if it did: ``pid``, else whatever may run)."""
    stopped = _run(["agent", "stop"], env)
    if pid is not None:
        assert stopped.returncode == 0, stopped.stderr
        eventually(lambda: not Path(f"/proc/{pid}").exists(), 15, "the started agent gone")


def test_a_lone_command_starts_an_agent_that_answers_the_next(tree: dict[str, str]) -> None:
    """``chrysalis ls`` with no agent runs alone, then forks an agent from its warm process
    (detached: the caller's captured pipes close at its exit, so ``capture_output`` returns);
    the next ``ls`` is answered by that agent's warm session. ``CHRYSALIS_AGENT_AUTOSTART=0``
    starts none; a second agent on the same socket is refused by its lock."""
    own = Path(tree["tmp"]) / "auto"
    own.mkdir(mode=0o700)  # a directory named explicitly: autostart never creates it
    env = {**_env(tree), "CHRYSALIS_AGENT_SOCKET": str(own / "a.sock")}
    off = _run(["ls", tree["token"]], {**env, "CHRYSALIS_AGENT_AUTOSTART": "0"})
    assert off.returncode == 0, off.stderr
    assert not (own / "a.sock").exists()
    env["CHRYSALIS_AGENT_AUTOSTART"] = "1"
    first = _run(["ls", tree["token"]], env)
    pid: int | None = None
    try:  # from the command that may have started an agent on: it never lingers
        assert first.returncode == 0, first.stderr
        assert tree["root"][:8] in first.stdout
        assert first.stderr == ""  # started silently
        eventually(lambda: (own / "a.sock").exists(), T, "the started agent's socket")
        status = _status(env)
        pid = int(str(status["pid"]))
        sessions = status["sessions"]  # started for the token at once: joining already
        assert isinstance(sessions, list)
        assert len(sessions) == 1, status
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "chrysalis-agent"
        # In a session of its own (a terminal's Ctrl-C or hang-up does not reach it).
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[3]) != os.getsid(0)  # field 6, the session ID
        second = _run(["ls", tree["token"]], env)
        assert second.returncode == 0, second.stderr
        assert second.stdout.splitlines()[0] == first.stdout.splitlines()[0]
        status = _status(env)
        assert status["warm"] == 1, status  # answered by the started agent's session
        assert status["sessions"] == [{**sessions[0], "served": 1}]  # the same session
        with pytest.raises(_agent.AgentError, match="already runs"):
            _agent.serve(own / "a.sock", 1.0)  # the lock: one agent per socket
        assert _agent.autostart(own / "a.sock") is None  # one runs: nothing started
    finally:
        _stop_started_agent(env, pid)


def test_an_agent_started_at_debug_level_runs_commands_at_their_own(
    tree: dict[str, str],
) -> None:
    """The agent a ``--log-level debug`` command started does not pass that level on: the
    next plain command (forked) logs at its own level on the caller's stderr, a session at
    its own level in the agent's log, and a ``--log-level debug`` command still gets its
    debug lines."""
    own = Path(tree["tmp"]) / "auto-debug"
    own.mkdir(mode=0o700)
    env = {**_env(tree), "CHRYSALIS_AGENT_SOCKET": str(own / "a.sock")}
    env["CHRYSALIS_AGENT_AUTOSTART"] = "1"

    def pipe(*options: str) -> subprocess.CompletedProcess[bytes]:
        argv = [*CLI, *options, "pipe", tree["token"], tree["root"]]
        return subprocess.run(argv, input=b"\x00x", capture_output=True, env=env, timeout=T)

    first = pipe("--log-level", "debug")
    pid: int | None = None
    try:
        assert first.returncode == 0, first.stderr
        assert b" DEBUG " in first.stderr  # run alone, at its own level
        eventually(lambda: (own / "a.sock").exists(), T, "the started agent's socket")
        pid = int(str(_status(env)["pid"]))
        plain = pipe()
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout == b"\x00x"
        assert plain.stderr == b"", plain.stderr[-2000:]  # was: asyncio/quic DEBUG lines
        assert _status(env)["served"] == 1  # forked by the agent
        listed = _run(["ls", tree["token"]], env)  # a session (forked from the agent)
        assert listed.returncode == 0, listed.stderr
        assert listed.stderr == ""
        assert _status(env)["sessions"], _status(env)
        debug = pipe("--log-level", "debug")
        assert debug.returncode == 0, debug.stderr
        assert b" DEBUG " in debug.stderr  # its own level, through the agent
        assert _status(env)["served"] == 3
    finally:
        _stop_started_agent(env, pid)
    log = (own / "a.log").read_text()
    assert " DEBUG " not in log, log[-2000:]  # neither the agent nor its session


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["ls", "TOKEN"], "ls"),
        (["--json", "ping", "T"], "ping"),
        (["--ca-dir", "/x", "--timeout=3", "resolve", "T", "ab"], "resolve"),
        (["--label", "a=b", "pipe", "T", "P"], "pipe"),
        (["--ca-dir"], None),
        (["-h"], None),
        (["--unknown", "ls"], None),
        ([], None),
    ],
)
def test_the_command_word_is_found_without_the_parser(argv: list[str], name: str | None) -> None:
    from chrysalis.node._cli import _command_name

    assert _command_name(argv) == name


def test_serve_waits_for_the_lock_of_an_agent_that_is_ending(tmp_path: Path) -> None:
    """``agent serve`` finding the lock held while no agent answers (one stopping: its
    sessions leaving) waits for it (``LOCK_WAIT``) instead of giving up at once."""
    path = tmp_path / "run" / "a.sock"
    path.parent.mkdir(mode=0o700)
    env = {**os.environ, "CHRYSALIS_AGENT_SOCKET": str(path)}
    held = _agent._lock(path)
    released = False
    proc = subprocess.Popen(
        [*CLI, "agent", "serve", "--idle-exit", "30"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline().decode()  # it used to fail at once: "... is locked"
        assert said.startswith("chrysalis agent: waiting up to"), said
        assert proc.poll() is None
        assert not path.exists()
        os.close(held)
        released = True
        eventually(lambda: path.exists(), T, "the agent's socket once the lock was free")
        assert int(str(_status(env)["pid"])) == proc.pid
        assert _run(["agent", "stop"], env).returncode == 0
        assert proc.wait(timeout=T) == 0
    finally:
        if not released:
            os.close(held)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=T)


def _listen_and_record(path: Path) -> tuple[socket.socket, threading.Thread, list[bytes]]:
    """A listener of this process's on ``path`` that records what one caller sends."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(T)
    got: list[bytes] = []

    def serve_one() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(2.0)
            try:
                got.append(conn.recv(1 << 16))
            except TimeoutError:
                got.append(b"")

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    return listener, thread, got


def test_the_caller_sends_nothing_to_a_socket_of_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A socket at the agent's path served by another user (``SO_PEERCRED``; here: this
    process, seen by a caller told it runs as another user) gets neither the command's
    environment nor its streams: a warning, and the command runs alone."""
    monkeypatch.delenv("CHRYSALIS_NO_AGENT", raising=False)
    monkeypatch.setattr(_agent_client, "_in_child", False)
    real = os.getuid()
    path = tmp_path / "a.sock"
    listener, thread, got = _listen_and_record(path)
    with listener:
        monkeypatch.setattr(os, "getuid", lambda: real + 1)
        assert _agent_client.run_via_agent(["ls", "TOKEN"], str(path)) is None
        thread.join(T)
    assert got == [b""]  # connected, and not a byte sent
    assert f"served by another user (uid {real})" in capsys.readouterr().err
    path.unlink()
    listener, thread, got = _listen_and_record(path)
    with listener:
        with pytest.raises(_agent.AgentError, match="served by another user"):
            _agent._control(path, "stop")  # `agent stop|status` do not talk to it either
        thread.join(T)
    assert got == [b""]


def test_the_agents_directory_must_be_the_users_and_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``_prepare_directory`` (lstat): this user's, no symbolic link, the default directory
    mode 0700, an explicit one writable by no one else; only the default one is created on
    the autostart path, and no directory is ever chmodded."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("CHRYSALIS_AGENT_SOCKET", raising=False)
    default = Path(_agent_client.default_directory())
    assert default == tmp_path / "chrysalis-agent"
    prepare = _agent._prepare_directory
    prepare(default / "a.sock", create=True)
    assert default.is_dir()
    assert (default.stat().st_mode & 0o777) == 0o700
    default.chmod(0o750)
    with pytest.raises(_agent.AgentError, match="mode 0750"):
        prepare(default / "a.sock")
    assert (default.stat().st_mode & 0o777) == 0o750  # not chmodded
    default.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    default.symlink_to(elsewhere)
    with pytest.raises(_agent.AgentError, match="symbolic link"):
        prepare(default / "a.sock")
    real = os.getuid()
    with monkeypatch.context() as other:
        other.setattr(os, "getuid", lambda: real + 1)
        with pytest.raises(_agent.AgentError, match=f"belongs to another user \\(uid {real}\\)"):
            prepare(elsewhere / "a.sock")
    # A directory named explicitly (CHRYSALIS_AGENT_SOCKET=$HOME/x.sock): used as it is.
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    prepare(home / "x.sock", create=False)
    assert (home.stat().st_mode & 0o777) == 0o755
    home.chmod(0o775)
    with pytest.raises(_agent.AgentError, match="mode 0775"):
        prepare(home / "x.sock", create=False)
    with pytest.raises(_agent.AgentError, match="does not exist"):
        prepare(tmp_path / "missing" / "x.sock", create=False)
    # The autostart path neither creates nor chmods an explicit directory, and says why.
    assert _agent.autostart(home / "x.sock", idle_exit=0.5) is None
    assert (home.stat().st_mode & 0o777) == 0o775
    assert _agent.autostart(tmp_path / "missing" / "x.sock", idle_exit=0.5) is None
    assert not (tmp_path / "missing").exists()
    err = capsys.readouterr().err
    assert err.count("chrysalis: warning: not starting an agent:") == 2, err


def test_ctrl_c_while_an_agent_starts_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    from chrysalis.node import _cli

    def interrupted(**_kwargs: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(_agent_client, "autostart_enabled", lambda environ: True)
    monkeypatch.setattr(_agent, "autostart", interrupted)
    try:
        _cli._autostart_agent(["ls", "TOKEN"])
    except KeyboardInterrupt:  # (caught here, or it would end the test run)
        pytest.fail("Ctrl-C while an agent started escaped: the command printed a traceback")
