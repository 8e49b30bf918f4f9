"""The ``chrysalis`` command starts fast (issue 22, item 5): ``--help`` and usage errors import
no QUIC, TLS, nameserver or SQLite code, and each command imports only its own module of the
dispatch table (``chrysalis.node._cli.COMMANDS``).

Each check runs a fresh interpreter: what a process imported is only visible in a process that
imported nothing before."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from chrysalis.node._cli import COMMANDS, _command_name, build_parser, main

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, start_node, stop_all

HEAVY = (
    "aioquic",
    "qh3",
    "cryptography",
    "sqlite3",
    "chrysalis.quic",
    "chrysalis.nameserver",
    "chrysalis.node._node",
)
"""Modules (and their submodules) a run that only parses must not import."""
TIMEOUT = 60.0

# What the ``chrysalis`` console script does (``from chrysalis.node._cli import main``), then
# the names in ``sys.modules`` as JSON to the file given as the first argument.
WRAPPER = """
import json, sys
from chrysalis.node._cli import main
out, argv = sys.argv[1], sys.argv[2:]
code = main(argv)
with open(out, "w") as handle:
    json.dump({"code": code, "modules": sorted(sys.modules)}, handle)
"""
# ``python -m chrysalis.node._cli ARGS`` (what ``-m`` does is ``runpy``), then the same JSON.
RUN_AS_MAIN = """
import json, runpy, sys
out = sys.argv[1]
sys.argv = ["chrysalis", *sys.argv[2:]]
try:
    runpy.run_module("chrysalis.node._cli", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
with open(out, "w") as handle:
    json.dump({"code": code, "modules": sorted(sys.modules)}, handle)
"""


def _heavy(modules: list[str]) -> list[str]:
    return sorted(
        name for name in modules if any(name == h or name.startswith(h + ".") for h in HEAVY)
    )


def _script_run(
    script: str, out: Path, argv: list[str], env: dict[str, str] | None = None
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``python -c script OUT ARGV...`` (bounded): the JSON record it wrote to ``out``, and the
    finished process (which must have exited with 0)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out), *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    record: dict[str, Any] = json.loads(out.read_text())
    return record, proc


def _console_run(tmp_path: Path, *argv: str) -> tuple[int, list[str], str]:
    record, proc = _script_run(WRAPPER, tmp_path / "modules.json", list(argv))
    return record["code"], record["modules"], proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["ls", "--help"],
        ["admin", "--help"],
        ["ls"],  # usage error: TOKEN missing
        ["resolve", "udp://127.0.0.1:9", "not-a-pid"],  # usage error in a PID
    ],
)
def test_parsing_alone_imports_no_node_machinery(tmp_path: Path, argv: list[str]) -> None:
    code, modules, output = _console_run(tmp_path, *argv)
    assert code in (0, 2), output
    assert "usage: chrysalis" in output
    assert _heavy(modules) == []
    if argv[-1] == "--help":  # nothing to convert: not even chrysalis.core (addresses, PIDs)
        assert "chrysalis.core" not in modules


def test_python_m_help_imports_no_node_machinery(tmp_path: Path) -> None:
    """``python -m chrysalis.node._cli --help``, as the tests and examples start it (``runpy``
    is what ``-m`` runs)."""
    out = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AS_MAIN, str(out), "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: chrysalis")
    record = json.loads(out.read_text())
    assert record["code"] == 0
    assert _heavy(record["modules"]) == []
    assert "chrysalis.core" not in record["modules"]
    assert "chrysalis.node._cli" in record["modules"]  # ``__main__`` runs the module's main


def test_identity_imports_its_module_and_not_sqlite(tmp_path: Path) -> None:
    """A command that needs the node machinery imports it (and only its own module: no
    SQLite for ``identity``)."""
    code, modules, output = _console_run(
        tmp_path, "--ca-dir", str(tmp_path / "ca"), "identity", "issue", "--out", str(tmp_path)
    )
    assert code == 0, output
    assert "chrysalis.node._cli_commands" in modules
    assert "chrysalis.quic" in modules
    assert "sqlite3" not in modules
    assert "chrysalis.node._cli_sqlite" not in modules
    assert "chrysalis.node._scale" not in modules


def test_every_parsed_command_is_in_the_dispatch_table() -> None:
    parser = build_parser()
    (commands,) = [
        action
        for action in parser._actions  # argparse offers no public accessor
        if action.dest == "command"
    ]
    choices = getattr(commands, "choices", None)
    assert choices is not None
    assert set(choices) - {"scale"} == set(COMMANDS)
    for name, command in COMMANDS.items():
        assert importlib.util.find_spec(command.module) is not None, name
        if importlib.util.find_spec("chrysalis.sqlite") is None and name in ("sqlite", "admin"):
            # They need chrysalis-sqlite, which chrysalis-node does not depend on (each says so
            # in one line when it is missing).
            continue
        module = importlib.import_module(command.module)
        assert callable(getattr(module, command.function)), name


# The thin path: what the interpreter had before ``main`` (the set ``python -c`` starts with)
# against what it has after a command the agent answered.
THIN_RUN = """
import json, sys
before = sorted(sys.modules)
from chrysalis.node._cli import main
out, argv = sys.argv[1], sys.argv[2:]
code = main(argv)
with open(out, "w") as handle:
    json.dump({"code": code, "before": before, "modules": sorted(sys.modules)}, handle)
"""
THIN_IMPORTS = frozenset(
    {
        "__future__",
        "_socket",
        "_struct",
        "chrysalis",
        "chrysalis.node",
        "chrysalis.node._agent_client",
        "chrysalis.node._cli",
    }
)
"""Everything a command answered by an agent may import (``chrysalis.node._agent_client``)."""


def test_a_command_answered_by_the_agent_imports_only_the_thin_client(tmp_path: Path) -> None:
    """An agent stand-in (one connection, answered with a canned reply) shows what the caller
    sends, prints and imports: the arguments, directory and environment with its three
    standard streams; the reply's output on stdout and stderr, and its status; and nothing
    beyond ``THIN_IMPORTS`` (no socket, json, typing, argparse, logging, pathlib)."""
    from chrysalis.node import _agent, _agent_client

    path = tmp_path / "agent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(TIMEOUT)
    got: dict[str, object] = {}

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            payload, fds = _agent._recv_raw(conn, max_fds=3)
            got["request"] = _agent_client.decode_request(payload)
            got["fds"] = len(fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(_agent_client.encode_reply(_agent_client.DONE, 3, b"table\n", b"note\n"))

    server = threading.Thread(target=answer)
    server.start()
    try:
        out = tmp_path / "modules.json"
        env = {**os.environ, "CHRYSALIS_AGENT_SOCKET": str(path)}
        env.pop("CHRYSALIS_NO_AGENT", None)
        token = "udp://127.0.0.1:9?authority=" + "ab" * 16
        proc = subprocess.run(
            [sys.executable, "-c", THIN_RUN, str(out), "ls", token, "--json"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            env=env,
            cwd=tmp_path,
        )
    finally:
        server.join(TIMEOUT)
        listener.close()
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("table\n", "note\n")
    record = json.loads(out.read_text())
    assert record["code"] == 3
    request = got["request"]
    assert isinstance(request, tuple)
    argv, cwd, sent_env = request
    assert argv == ["ls", token, "--json"]
    assert Path(cwd) == tmp_path
    assert sent_env["CHRYSALIS_AGENT_SOCKET"] == str(path)
    assert got["fds"] == 3
    extra = set(record["modules"]) - set(record["before"])
    assert extra <= THIN_IMPORTS, sorted(extra - THIN_IMPORTS)


# ``chrysalis ls TOKEN`` run alone, as the console script runs it (``main()`` reads
# ``sys.argv``, so a lone command would start an agent: here ``CHRYSALIS_NO_AGENT=1`` says no).
LONE_RUN = """
import json, sys
from chrysalis.node._cli import main
out = sys.argv[1]
sys.argv = ["chrysalis", *sys.argv[2:]]
code = main()
with open(out, "w") as handle:
    json.dump({"code": code, "modules": sorted(sys.modules)}, handle)
"""
NOT_FOR_LS = (
    "chrysalis.core._plugins",  # the plugin registry (a token of udp:// or unix:// needs none)
    "chrysalis.datagram._inproc",  # the in-process carrier
    "chrysalis.node._agent",  # the agent: CHRYSALIS_NO_AGENT=1 is decided without it
    "chrysalis.node._echo",  # what ``serve --echo`` runs
    "chrysalis.node._stats",
    "chrysalis.node._scale",
    "chrysalis.node._cli_sqlite",
    "sqlite3",
    "qh3",
)
"""Modules a lone ``ls`` must not import (issue 22, item 5: what it imports is most of its
time): each is imported on first use by the code that needs it."""


def test_a_lone_ls_imports_what_it_uses_only(tmp_path: Path) -> None:
    """A real ``ls`` against a root, run alone: it lists the root and imported the node
    machinery, and none of ``NOT_FOR_LS``."""
    env = {**os.environ, "CHRYSALIS_NO_AGENT": "1"}
    ca = ["--ca-dir", str(tmp_path / "ca")]
    root, token = start_node([*CLI, *ca, "serve", "--listen", "udp://127.0.0.1:0"], env)
    try:
        record, proc = _script_run(LONE_RUN, tmp_path / "modules.json", [*ca, "ls", token], env)
    finally:
        stop_all([root])
    assert "role=root" in proc.stdout, proc.stdout
    assert record["code"] == 0
    modules = set(record["modules"])
    assert {"chrysalis.node._cli_commands", "chrysalis.quic", "chrysalis.nameserver"} <= modules
    assert sorted(m for m in NOT_FOR_LS if m in modules) == []


TOKEN = "udp://127.0.0.1:5?authority=" + "ab" * 16


def _parsed(command: str | None, argv: list[str]) -> tuple[object, str | None, str, str]:
    """``build_parser(command).parse_args(argv)``: exit code, namespace, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    code: object = None
    namespace = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            namespace = repr(sorted(vars(build_parser(command).parse_args(argv)).items()))
        except SystemExit as exc:
            code = exc.code
    return code, namespace, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        [],
        ["ls", "--help"],
        ["ls"],
        ["ls", TOKEN, "extra"],
        ["--ca-dir", "/x", "ls", TOKEN, "--full", "--json"],
        ["--log-level=info", "--label", "ls", "ls", TOKEN, "--timeout", "3"],
        ["--log-level", "bogus", "ls", TOKEN],
        ["--ca", "/x", "ls", TOKEN],  # an abbreviation: the whole parser decides
        ["lss", TOKEN],
        ["resolve", TOKEN, "zz"],
        ["ping", TOKEN, "ab", "cd"],
        ["serve", "--listen", "udp://127.0.0.1:0", "--echo"],
        ["join", "--help"],
        ["identity", "issue", "--out", "/tmp/x"],
        ["identity", "init", "--help"],
        ["admin", TOKEN, "submit", "e", "--sources", "all", "--destinations", "all"],
        ["agent", "start", "--idle-exit", "5"],
        ["sqlite", "db", "query", "select 1", "--write"],
        ["top", TOKEN, "--once"],
    ],
)
def test_the_parser_of_one_command_parses_as_the_whole_parser(argv: list[str]) -> None:
    """``main`` builds only the subcommand it is about to parse (``build_parser(command)``):
    the result, the help and the usage errors are those of the whole parser."""
    assert _parsed(_command_name(argv), argv) == _parsed(None, argv)


# The command line (``main()`` reading ``sys.argv``) of a command that imports its module, then
# the collector's state and the caches' files as JSON to the file given as the first argument.
WINDOW_RUN = """
import gc, json, os, sys
from chrysalis.node._cli import main
out = sys.argv[1]
sys.argv = ["chrysalis", *sys.argv[2:]]
code = main()
with open(out, "w") as handle:
    json.dump({"code": code, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}, handle)
"""


def test_the_command_line_imports_its_command_in_an_import_window(tmp_path: Path) -> None:
    """``chrysalis identity show`` (a command whose module imports the node stack) run as the
    command line: its imports ran in ``chrysalis._startup.import_window`` (the collector on
    again afterwards, what the imports made frozen, the dataclass and regex caches written
    beside the byte code); ``main(argv)`` from Python freezes nothing of its caller."""
    import gc

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    argv = ["identity", "show", "--chain", str(tmp_path / "missing.pem")]
    record, _ = _script_run(WINDOW_RUN, tmp_path / "state.json", argv, env)
    assert record["code"] == 1  # no such chain: one error line
    assert record["enabled"] is True
    assert record["frozen"] > 0
    caches = sorted(
        p.name.split(".")[0] for p in (tmp_path / "pycache" / "chrysalis").glob("*.bin")
    )
    assert caches == ["dataclass-code", "regex-code"]
    frozen = gc.get_freeze_count()
    main(argv)
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    # ``main(out=...)`` with ``sys.argv`` as the arguments is a call from Python too
    saved = sys.argv
    sys.argv = ["chrysalis", *argv]
    try:
        main(out=io.StringIO())
    finally:
        sys.argv = saved
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_global_options_before_scale_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """``chrysalis --json scale``: the scale tool parses its own options, so options of the
    command line before the word are refused with a usage error (not a ``KeyError``)."""
    assert main(["--json", "scale"]) == 2
    assert "takes its options after the word" in capsys.readouterr().err
