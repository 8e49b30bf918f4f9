"""CLI behaviours a user meets (issue 15, items 3, 6, 8 and 9), with real ``chrysalis``
processes where the behaviour is about processes: ``--json`` on either side of the command,
the label bound, one-line errors that name what did not match, no traceback for any expected
failure, a ``kill -9``-ed node restarted on its Unix socket path, its temporary directory
removed by the next start, ``ping`` reporting each target, and client commands against a node
served on ``udp://[::1]``.

Every process is started through ``node_processes`` (bounded waits) and stopped in
``finally``; the ones killed here are reaped at once."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chrysalis.core import DatagramAddr, Pid
from chrysalis.datagram import AddressInUseError
from chrysalis.nameserver import (
    MAX_LABELS_PER_ENTRY,
    LabelError,
    Labels,
    RejectCode,
    TerminalRejection,
)
from chrysalis.node import Node, _scale, bind_carrier
from chrysalis.node import _cli as cli
from chrysalis.node._cli import main
from chrysalis.node._tempdirs import LOCK_NAME, OwnedTempDir, reclaim_dead_tempdirs

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, start_node, stop_all

COMMAND_TIMEOUT = 60.0
"""Seconds any one CLI run here may take (its own ``--timeout`` is far below)."""


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT
    )


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- in-process ---------------------------------------------------------------------------------


def test_json_is_accepted_before_and_after_the_command(tmp_path: Path) -> None:
    ca = ["--ca-dir", str(tmp_path / "ca")]
    out = io.StringIO()
    assert main(["--json", *ca, "identity", "issue", "--out", str(tmp_path / "a")], out=out) == 0
    issued = json.loads(out.getvalue())["pid"]
    for argv in (
        ["--json", "identity", "show", "--identity-dir", str(tmp_path / "a")],
        ["identity", "show", "--identity-dir", str(tmp_path / "a"), "--json"],
        ["identity", "--json", "show", "--identity-dir", str(tmp_path / "a")],
    ):
        out = io.StringIO()
        assert main(argv, out=out) == 0, argv
        assert json.loads(out.getvalue())["pid"] == issued


def test_sqlite_takes_json(tmp_path: Path) -> None:
    pytest.importorskip("chrysalis.sqlite")
    import sqlite3

    path = tmp_path / "db.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b BLOB)")
        conn.execute("INSERT INTO t VALUES (1, x'ff')")
    conn.close()
    out = io.StringIO()
    assert main(["--json", "sqlite", str(path), "query", "SELECT a, b FROM t"], out=out) == 0
    assert json.loads(out.getvalue()) == [
        {"columns": ["a", "b"], "rows": [[1, {"hex": "ff"}]], "truncated": False}
    ]
    out = io.StringIO()
    assert main(["sqlite", str(path), "tables", "--json"], out=out) == 0
    assert json.loads(out.getvalue()) == ["t"]


def test_a_node_cannot_be_given_more_labels_than_an_entry_holds() -> None:
    """``Node`` takes ``Labels``, which refuse a set the wire cannot carry at construction."""
    with pytest.raises(LabelError, match=f"more than {MAX_LABELS_PER_ENTRY} labels"):
        Labels({f"k{i}": "v" for i in range(MAX_LABELS_PER_ENTRY + 1)})


def test_rejections_and_unexpected_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The terminal ``already_linked`` rejection (and anything unforeseen) is one stderr
    line and exit 1, never a traceback."""
    failures: list[BaseException] = [
        TerminalRejection(Pid.parse("ab" * 16), RejectCode.ALREADY_LINKED),
        RuntimeError("something nobody foresaw\nsecond line"),
    ]

    async def rejected(self: Node) -> None:
        raise failures[0]

    monkeypatch.setattr(Node, "wait_connected", rejected)
    for expected in ("already_linked", "RuntimeError: something nobody foresaw"):
        code = main(["ls", "udp://127.0.0.1:9", "--timeout", "5"], out=io.StringIO())
        err = capsys.readouterr().err
        assert code == 1
        assert "Traceback" not in err
        assert err.count("\n") == 1
        assert err.startswith("chrysalis: error: ")
        assert expected in err
        failures.pop(0)


def test_scale_failures_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def broken(settings: object, **options: object) -> None:  # run_scale's shape
        raise RuntimeError("the launcher broke")

    monkeypatch.setattr(_scale, "run_scale", broken)
    assert main(["scale", "--nodes", "2"], out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err == "chrysalis-scale: error: RuntimeError: the launcher broke\n"


def test_a_stale_unix_socket_is_reclaimed_and_a_live_one_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(stale))
    dead.close()  # the file stays, nobody is bound: what a kill -9 leaves
    carriers = cli._Carriers([DatagramAddr.unixgram(str(stale))])
    try:
        assert carriers.token_addr == DatagramAddr.unixgram(str(stale))
        with pytest.raises(AddressInUseError):  # now it is live: refused
            cli._Carriers([DatagramAddr.unixgram(str(stale))])
    finally:
        carriers.socket.shutdown()
        carriers.cleanup()
    not_a_socket = tmp_path / "file.sock"
    not_a_socket.write_text("keep me")
    with pytest.raises(OSError):
        cli._Carriers([DatagramAddr.unixgram(str(not_a_socket))])
    assert not_a_socket.read_text() == "keep me"


def test_bind_carrier_reclaims_a_stale_unix_socket_for_every_node(tmp_path: Path) -> None:
    """Not only the CLI: ``Node(listen="unix://...")`` binds through ``bind_carrier``, which
    removes a socket file nobody is bound to and refuses a live one."""
    stale = tmp_path / "node.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(stale))
    dead.close()
    carrier = bind_carrier(f"unix://{stale}")
    try:
        assert carrier.local_addr == DatagramAddr.unixgram(str(stale))
        with pytest.raises(AddressInUseError):
            bind_carrier(f"unix://{stale}")
    finally:
        carrier.shutdown()


def test_only_dead_owners_temporary_directories_are_removed(tmp_path: Path) -> None:
    held = OwnedTempDir.create(str(tmp_path))
    try:
        dead = tmp_path / "chrysalis-dead"
        dead.mkdir()
        (dead / LOCK_NAME).write_text("12345\n")  # nobody holds its lock
        foreign = tmp_path / "chrysalis-dev-ca-0"  # no lock file: not a node's directory
        foreign.mkdir()
        assert reclaim_dead_tempdirs(str(tmp_path)) == [str(dead)]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [Path(held.path).name, foreign.name]
        )
    finally:
        held.remove()
    assert not Path(held.path).exists()


# -- processes ----------------------------------------------------------------------------------


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def ipv6_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A root on ``udp://[::1]`` with ``--echo`` and a child without it."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    tmp = tmp_path_factory.mktemp("ipv6")
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"))
    procs = []
    try:
        root_argv = [*CLI, "serve", "--listen", "udp://[::1]:0", "--echo"]
        root, token = start_node(root_argv, env, tmp / "root.log")
        procs.append(root)
        child, child_token = start_node([*CLI, "join", token], env, tmp / "child.log")
        procs.append(child)
        yield {
            "token": token,
            "root": token.rsplit("=", 1)[1],
            "child": child_token.rsplit("=", 1)[1],
            "tmp": str(tmp),
            **env,
        }
    finally:
        stop_all(procs)


def _env(tree: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tree.items() if k not in ("token", "root", "child", "tmp")}


@pytest.mark.slow
def test_client_commands_reach_a_node_served_on_ipv6(ipv6_tree: dict[str, str]) -> None:
    done = _run(["ls", ipv6_tree["token"], "--json", "--timeout", "15"], _env(ipv6_tree))
    assert done.returncode == 0, done.stderr
    pids = {entry["pid"] for entry in json.loads(done.stdout)}
    assert {ipv6_tree["root"], ipv6_tree["child"]} <= pids


@pytest.mark.slow
def test_ping_reports_each_target_as_it_finishes(ipv6_tree: dict[str, str]) -> None:
    argv = ["ping", ipv6_tree["token"], ipv6_tree["root"], ipv6_tree["child"], "--timeout", "4"]
    done = _run(argv, _env(ipv6_tree))
    assert done.returncode == 1
    lines = dict(line.split("  ", 1) for line in done.stdout.splitlines())
    assert lines[ipv6_tree["root"]].startswith("ok ")
    assert lines[ipv6_tree["child"]] == "timeout no echo within 4 s"
    done = _run([*argv, "--json"], _env(ipv6_tree))
    records = json.loads(done.stdout)
    assert records[ipv6_tree["root"]]["state"] == "ok"
    assert records[ipv6_tree["child"]]["state"] == "timeout"


@pytest.mark.slow
def test_authentication_failures_name_the_certificate_and_pid(
    ipv6_tree: dict[str, str],
) -> None:
    address = ipv6_tree["token"].split("?", 1)[0]
    other_ca = ["--ca-dir", str(Path(ipv6_tree["tmp"]) / "other-ca")]
    line = _one_line_error(_run(["ls", address, *other_ca, "--timeout", "4"], _env(ipv6_tree)))
    assert "no parent answered" in line
    assert f"PID {ipv6_tree['root']}" in line
    assert "is not trusted" in line
    assert "None" not in line
    wrong = "0123456789abcdef0123456789abcdef"
    token = f"{address}?authority={wrong}"
    line = _one_line_error(_run(["ls", token, "--timeout", "4"], _env(ipv6_tree)))
    assert f"expected PID {wrong}" in line
    assert f"PID {ipv6_tree['root']}" in line


@pytest.mark.slow
def test_expected_failures_never_print_a_traceback(
    ipv6_tree: dict[str, str], tmp_path: Path
) -> None:
    env = _env(ipv6_tree)
    missing = tmp_path / "none.sock"
    junk = tmp_path / "junk"
    junk.mkdir()
    for name in ("chain.pem", "key.pem", "roots.pem"):
        (junk / name).write_text("junk")
    cases = [
        ["ls", "127.0.0.1:4433"],  # bad argument (usage, exit 2)
        ["ls", f"unix://{missing}", "--timeout", "2"],  # nobody there
        ["ls", "udp://127.0.0.1:9?authority=" + "1" * 32, "--timeout", "2"],  # refused
        ["serve", "--listen", "unix:///nonexistent/dir/x.sock"],  # cannot bind
        ["serve", "--identity-dir", str(junk)],  # certificate error
        ["resolve", ipv6_tree["token"], "ffff", "--timeout", "10"],  # not found
        ["ping", ipv6_tree["token"], ipv6_tree["child"], "--timeout", "3"],  # no echo
    ]
    for argv in cases:
        done = _run(argv, env)
        assert done.returncode != 0, argv
        assert "Traceback" not in done.stderr, (argv, done.stderr)


@pytest.mark.slow
def test_serve_refuses_more_labels_than_an_entry_holds(tmp_path: Path) -> None:
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca"))
    labels = [arg for i in range(MAX_LABELS_PER_ENTRY) for arg in ("--label", f"k{i}=v")]
    line = _one_line_error(_run(["serve", *labels], env))
    assert f"at most {MAX_LABELS_PER_ENTRY}" in line


@pytest.mark.slow
def test_a_node_killed_with_9_restarts_on_its_unix_path_and_its_temp_dir_goes(
    tmp_path: Path,
) -> None:
    # A short private TMPDIR: socket paths inside it must fit sun_path (108 bytes).
    temp = Path(tempfile.mkdtemp(prefix="cli-"))
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca"), TMPDIR=str(temp))
    path = temp / "root.sock"
    log = tmp_path / "nodes.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # A Unix --listen path, and (for the helper Unix carrier of a UDP node) a temp dir.
        first, token = start_node([*CLI, "serve", "--listen", f"unix://{path}"], env, log)
        procs.append(first)
        udp, _ = start_node([*CLI, "serve"], env, log)
        procs.append(udp)
        left = [p.name for p in temp.iterdir() if p.name.startswith("chrysalis-") and p.is_dir()]
        assert len(left) == 1
        for proc in (first, udp):
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert path.exists()
        assert (temp / left[0]).exists()

        argv = [*CLI, "serve", "--listen", f"unix://{path}"]
        again, token_again = start_node(argv, env, log)
        procs.append(again)
        assert token_again.split("?")[0] == token.split("?")[0]
        assert not (temp / left[0]).exists()  # removed by the next start
        # A live socket is refused, with one line.
        line = _one_line_error(_run(["serve", "--listen", f"unix://{path}"], env))
        assert "in use" in line
    finally:
        stop_all(procs)
        shutil.rmtree(temp, ignore_errors=True)
