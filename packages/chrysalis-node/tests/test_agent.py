"""``chrysalis agent`` (issue 22 item 5): a warm process runs ``ls``/``resolve``/``ping``/``pipe``
in a fork with the caller's streams, directory and environment; the command falls back to its
own process without an agent, with a stale socket, and for what the agent refuses; an
interrupted caller interrupts its command; ``stop`` and the idle exit end the agent.

Real processes: a root (``serve --echo``), an agent (``agent serve`` in the foreground, on a
socket of the test's own directory), and ``chrysalis`` commands, each bounded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chrysalis.node import _agent

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


def test_the_agent_refuses_other_commands_and_other_requests(
    tree: dict[str, str], agent: subprocess.Popen[bytes]
) -> None:
    path = tree["CHRYSALIS_AGENT_SOCKET"]
    served = _status(_env(tree))["served"]
    for request, fds in (
        ({"argv": ["serve"], "cwd": "/", "env": {}}, (0, 1, 2)),  # not a client command
        ({"argv": ["ls", "x"], "cwd": "/", "env": {}}, ()),  # no streams
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(T)
            sock.connect(path)
            _agent._send_frame(sock, request, fds)
            try:
                reply, _ = _agent._recv_frame(sock)
            except ConnectionError:
                reply = None  # closed without a word: refused too
        assert reply is None or "refused" in reply, reply
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # over the size bound
        sock.settimeout(T)
        sock.connect(path)
        sock.sendall((_agent.MAX_REQUEST + 1).to_bytes(4, "big"))
        assert sock.recv(1) == b""  # closed
    assert _status(_env(tree))["served"] == served
    assert agent.poll() is None  # still serving


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
    again = _run(["agent", "start"], env)
    assert again.returncode == 1
    assert "already runs" in again.stderr
    stopped = _run(["agent", "stop"], env)
    assert stopped.returncode == 0, stopped.stderr
    assert not path.exists()
    eventually(lambda: not Path(f"/proc/{pid}").exists(), 10, "the agent process gone")
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
