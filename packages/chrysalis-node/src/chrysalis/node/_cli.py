"""The ``chrysalis`` command (upper spec 6): identities, long-running nodes and namespace tools.

Why these commands: a person (or a script) should be able to start a local tree, see what is in
it and talk to any process without writing Python. ``serve`` starts a root and prints its join
token as the first stdout line; ``join TOKEN`` starts a child; ``ls``, ``resolve``, ``pipe`` and
``ping`` start a short-lived client node joined at TOKEN, do one thing and leave (a clean
shutdown withdraws the client from the namespace at once).

This module holds what every run needs: the argument parser and the entry point. It imports
no QUIC, TLS, nameserver or SQLite code, and chrysalis.core (through
``chrysalis.node._address``) only when an argument needs converting, so ``chrysalis --help``
and usage errors start fast (issue 22, item 5). ``main`` looks the parsed command up in one
dispatch table (``COMMANDS``: command -> module and function) and imports that module only
then:

- ``chrysalis.node._cli_commands``: ``identity``, ``serve``, ``join``, ``ls``, ``resolve``,
  ``pipe`` and ``ping`` (the node machinery: carriers, QUIC, nameserver), and their output
  formats (``entry_record``, ``format_table``, ``format_entry``: still importable from here);
- ``chrysalis.node._top``: ``top TOKEN`` (the tree's nodes and QUIC links, live);
- ``chrysalis.node._cli_admin``: ``admin TOKEN ACTION`` (and ``scale admin ...``), run by
  ``chrysalis.node._admin``; it needs chrysalis-sqlite, which sits above chrysalis-node;
- ``chrysalis.node._cli_sqlite``: ``sqlite DB ACTION`` (chrysalis-sqlite's shell);
- ``chrysalis.node._scale``: ``scale ...``, handed its arguments unparsed;
- ``chrysalis.node._agent``: ``agent start|stop|status|serve`` (a warm process that answers
  ``ls``, ``resolve`` and ``ping`` from a node it keeps joined and forks ``pipe``);
- ``chrysalis.node._agent_client``: the hand-over of ``ls``, ``resolve``, ``ping`` and
  ``pipe`` to a running agent, before any parser is built. This module and that one import
  only ``os``, ``sys``, ``_socket`` and ``_struct`` at first (no ``typing``, ``argparse``,
  ``logging``, ``pathlib``, ``dataclasses`` or ``importlib``: ``TYPE_CHECKING`` is a local
  ``False``), so a command the agent answers costs little more than the interpreter.

Each command module names the failures it reports as one line (``EXPECTED_ERRORS``).

Output: a readable table by default and ``--json`` for scripts. Errors are one line on stderr
(``chrysalis: error: ...``) with exit code 1; usage errors exit with 2.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the thin path imports neither typing nor argparse
    import argparse
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType
    from typing import Any, Final, TextIO

    from chrysalis.core import DatagramAddr, PidPrefix
    from chrysalis.node._address import JoinToken
    from chrysalis.node._cli_commands import entry_record, format_entry, format_table

__all__ = [
    "COMMANDS",
    "CliError",
    "Command",
    "build_parser",
    "entry_record",
    "format_entry",
    "format_table",
    "error_line",
    "main",
    "ping_payload",
]

DEFAULT_TIMEOUT: Final = 30.0
"""Seconds a client command may take to join, look up and finish."""
PING_PAYLOAD: Final = 64
"""Bytes ``ping`` sends and expects back."""
PING_TAG: Final = 0
"""First byte of every ``ping`` payload: never one of the scale workers' request ops (1 echo,
2 transfer), so a scale worker always answers ``ping`` with the raw echo."""
_ADDRESS: Final = "chrysalis.node._address"
"""Parses join tokens, PID references and carriers (imports chrysalis.core)."""
_USAGE_EXIT: Final = 2
_ERROR_EXIT: Final = 1


class CliError(Exception):
    """A command failed for a reason the user can act on; printed as one line, exit 1."""


def _import(name: str) -> ModuleType:
    """``importlib.import_module(name)`` without importing ``importlib`` (which imports
    ``warnings``): the thin path of an agent command imports as little as it can."""
    __import__(name)
    return sys.modules[name]


# -- parsing ------------------------------------------------------------------------------------


def _label(text: str) -> tuple[str, str]:
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"label {text!r} is not KEY=VALUE")
    return key, value


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} s is outside 0.1 to 3600 seconds")
    return value


def _convert(parse: str, text: str) -> Any:
    """``chrysalis.node._address.<parse>(text)``, a syntax error as argparse's
    ``ArgumentTypeError``. That module (and chrysalis.core beneath it) is imported with the
    first argument converted: ``--help`` and most usage errors convert none."""
    import argparse

    address = _import(_ADDRESS)
    try:
        return getattr(address, parse)(text)
    except address.AddressSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _token(text: str) -> JoinToken:
    token: JoinToken = _convert("resolve_join_token", text)
    return token


def _reference(text: str) -> PidPrefix:
    reference: PidPrefix = _convert("parse_pid_reference", text)
    return reference


def _listen(text: str) -> DatagramAddr | None:
    listen: DatagramAddr | None = _convert("parse_listen", text)
    return listen


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Flags accepted before and after the subcommand (``suppress``: the copy on each
    subcommand leaves values given before the subcommand alone)."""
    import argparse
    from pathlib import Path

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=default("warning"),
        help="logging level on stderr (warning)",
    )
    parser.add_argument(
        "--identity-dir",
        type=Path,
        default=default(None),
        help="use the identity in DIR (chain.pem, key.pem, roots.pem) instead of a fresh one",
    )
    parser.add_argument(
        "--ca-dir",
        type=Path,
        default=default(None),
        help="development CA directory (default: $CHRYSALIS_DEV_CA_DIR or a per-user temp dir)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=default(30.0),
        help="QUIC idle timeout in seconds: how long until a dead peer is fenced (30)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=default(DEFAULT_TIMEOUT),
        help="seconds a client command may take (30)",
    )
    parser.add_argument(
        "--label",
        type=_label,
        action="append",
        default=default([]),
        metavar="KEY=VALUE",
        help="a label to publish (repeatable)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="JSON output (reporting commands; accepted, and without effect, by the others)",
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``chrysalis`` command. ``command``: the command word of the
    arguments it is about to parse (``_command_name``), or ``None`` for the whole parser. A
    command of this parser gets a parser with that one subcommand: the others are only read
    by ``--help`` before the command and by the invalid-choice error, which a known command
    word meets in neither; any other word gets the whole parser. Building every subcommand
    cost a lone ``chrysalis ls`` 10 to 15 ms of CPU (argparse looks up translations and the
    terminal size for each parser and option; issue 22, item 5)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="chrysalis", description="Chrysalis process mesh: nodes, identities, namespace."
    )
    _global_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    only = command if command in COMMANDS or command == "scale" else None

    def add(name: str, text: str) -> argparse.ArgumentParser | None:
        """The subcommand ``name`` (with the global options), ``None`` when another one is
        the only one parsed."""
        if only is not None and only != name:
            return None
        built: argparse.ArgumentParser = commands.add_parser(name, parents=[common], help=text)
        return built

    identity = add("identity", "development identities")
    if identity is not None:
        identity_commands = identity.add_subparsers(dest="identity_command", required=True)
        init = identity_commands.add_parser(
            "init", parents=[common], help="create (or load) the development CA"
        )
        init.add_argument("--dir", type=Path, help="CA directory (default: --ca-dir or per-user)")
        issue = identity_commands.add_parser(
            "issue", parents=[common], help="issue a leaf as chain.pem, key.pem and roots.pem"
        )
        issue.add_argument("--out", type=Path, required=True, help="directory to write into")
        show = identity_commands.add_parser(
            "show", parents=[common], help="the PID of a certificate chain"
        )
        show.add_argument("--chain", type=Path, help="a PEM chain file (default: --identity-dir)")

    listen_help = "carrier to bind: udp://IP:PORT, unix:///PATH or unix://* (repeatable)"
    serve = add("serve", "run a root node")
    join = add("join", "run a node joined at TOKEN")
    if join is not None:
        join.add_argument("token", type=_token, metavar="TOKEN", help="parent join token")
    for node_parser in (serve, join):
        if node_parser is None:
            continue
        node_parser.add_argument(
            "--listen", type=_listen, action="append", metavar="CARRIER", help=listen_help
        )
        node_parser.add_argument(
            "--echo", action="store_true", help="echo every stream opened to this node"
        )
        node_parser.add_argument(
            "--advertise",
            metavar="IP",
            help="the IP others reach this node at (default: with a wildcard --listen, the "
            "interface toward the parent or of the default route)",
        )

    ls = add("ls", "processes in the namespace")
    if ls is not None:
        ls.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
        ls.add_argument("--full", action="store_true", help="print whole PIDs")

    resolve = add("resolve", "look up one process")
    pipe = add("pipe", "bridge stdin/stdout to a PID")
    for lookup in (resolve, pipe):
        if lookup is None:
            continue
        lookup.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
        lookup.add_argument("pid", type=_reference, metavar="PID", help="a PID or unique prefix")

    ping = add("ping", "check that echo nodes answer through TOKEN")
    if ping is not None:
        ping.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
        ping.add_argument(
            "pids", type=_reference, nargs="*", metavar="PID", help="targets (default: echo nodes)"
        )

    top = add("top", "watch the tree's nodes and links (echo nodes answer)")
    if top is not None:
        top.add_argument("token", type=_token, metavar="TOKEN", help="a node's join token")
        top.add_argument("--once", action="store_true", help="print one table and exit")
        top.add_argument(
            "--interval", type=float, default=1.0, help="seconds between polls (default 1)"
        )

    # `chrysalis scale ...` is handed whole to the scale tool (see main); listed here for --help.
    if only in (None, "scale"):
        commands.add_parser(
            "scale", help="launch N local processes and measure them (chrysalis scale --help)"
        )

    admin = add(
        "admin",
        "persistent scale experiments: nodes, submit, show, cancel (needs chrysalis-sqlite)",
    )
    if admin is not None:
        _admin_parser(admin, common)
    agent = add(
        "agent", "a warm process that runs ls, resolve, ping and pipe without start-up cost"
    )
    if agent is not None:
        _agent_parser(agent, common)

    sqlite = add("sqlite", "a shell on a node's database (needs chrysalis-sqlite)")
    if sqlite is not None:
        _sqlite_parser(sqlite, common)
    return parser


def _sqlite_parser(sqlite: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """The arguments and actions of ``sqlite DB ACTION``."""
    sqlite.add_argument("database", metavar="DB", help="the node's SQLite database file")
    sqlite_commands = sqlite.add_subparsers(dest="sqlite_command", metavar="ACTION")
    sql_query = sqlite_commands.add_parser(
        "query", parents=[common], help="run SQL and print the result"
    )
    sql_query.add_argument("sql", metavar="SQL")
    sql_query.add_argument("--write", action="store_true", help="open the database writable")
    sqlite_commands.add_parser("tables", parents=[common], help="list the tables")
    sql_schema = sqlite_commands.add_parser(
        "schema", parents=[common], help="print CREATE statements"
    )
    sql_schema.add_argument("table", nargs="?", metavar="TABLE")
    sqlite_commands.add_parser("status", parents=[common], help="replication status per peer")
    sqlite_commands.add_parser(
        "shell", parents=[common], help="interactive shell (the default; --json has no effect)"
    )


def _agent_parser(agent: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """The actions of ``agent ACTION``."""
    actions = agent.add_subparsers(dest="agent_command", required=True, metavar="ACTION")
    for name, text in (
        ("start", "start an agent in the background"),
        ("stop", "stop the running agent"),
        ("status", "whether an agent runs, and what it did"),
        ("serve", "run an agent in the foreground"),
    ):
        action = actions.add_parser(name, parents=[common], help=text)
        action.add_argument(
            "--socket",
            help="the agent's socket (default: $CHRYSALIS_AGENT_SOCKET, else per user)",
        )
        if name in ("start", "serve"):
            action.add_argument(
                "--idle-exit",
                type=_seconds,
                default=600.0,
                help="seconds without a command after which the agent exits (600)",
            )


def _admin_parser(admin: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """The arguments and actions of ``admin TOKEN ACTION ...``."""
    admin.add_argument("token", type=_token, metavar="TOKEN", help="any scale node's join token")
    actions = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    nodes = actions.add_parser("nodes", parents=[common], help="the registered scale nodes")
    nodes.add_argument("selector", nargs="?", default=None, metavar="SELECTOR")
    nodes.add_argument(
        "--state", choices=("live", "stopped", "lost", "any"), default="any", help="(any)"
    )
    target = actions.add_parser("target", parents=[common], help="the nodes SELECTOR picks")
    target.add_argument("selector", metavar="SELECTOR")
    target.add_argument("--seed", type=int, help="seed of sample:N")
    for lister in (nodes, target):
        lister.add_argument("--full", action="store_true", help="print whole PIDs")
    submit = actions.add_parser("submit", parents=[common], help="submit an experiment")
    submit.add_argument("name", metavar="NAME")
    submit.add_argument("--sources", required=True, metavar="SELECTOR", help="who runs it")
    submit.add_argument(
        "--destinations", required=True, metavar="SELECTOR", help="whom they measure"
    )
    submit.add_argument(
        "--kind", default="echo", help="experiment kind: echo or stream-transfer (echo)"
    )
    submit.add_argument("--payload", type=int, default=1, help="bytes per operation (1)")
    submit.add_argument("--count", type=int, default=10, help="timed operations per pair (10)")
    submit.add_argument("--warmup", type=int, default=1, help="untimed operations per pair (1)")
    submit.add_argument("--concurrency", type=int, default=1, help="operations in flight (1)")
    submit.add_argument(
        "--run-timeout", type=float, default=60.0, help="seconds one source's run may take (60)"
    )
    submit.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the direct network baselines after each pair (they take about as long "
        "again per method as the Chrysalis figures)",
    )
    submit.add_argument("--seed", type=int, help="seed of sample:N")
    submit.add_argument("--wait", action="store_true", help="return when the experiment ended")
    actions.add_parser("experiments", parents=[common], help="every experiment and its status")
    show = actions.add_parser("show", parents=[common], help="experiments' results")
    show.add_argument("name", metavar="NAME", nargs="+", help="one or more experiments")
    show.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw latency percentiles and throughput against payload size of the "
        "experiments (needs chrysalis-node[plot]: matplotlib)",
    )
    cancel = actions.add_parser("cancel", parents=[common], help="cancel an experiment")
    cancel.add_argument("name", metavar="NAME")


# -- output -------------------------------------------------------------------------------------


def _emit(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def _emit_lines(out: TextIO, lines: Sequence[str]) -> None:
    for line in lines:
        _emit(out, line)


def ping_payload() -> bytes:
    """What ``ping`` sends: ``PING_TAG`` then random bytes (``PING_PAYLOAD`` in all)."""
    return bytes([PING_TAG]) + os.urandom(PING_PAYLOAD - 1)


# -- dispatch -----------------------------------------------------------------------------------


class Command:
    """Where a command is implemented: ``function(args, out) -> exit code`` in ``module``,
    imported on dispatch. ``needs``: the distribution the module needs beyond chrysalis-node
    (its absence is reported as one line naming it). (A plain class: ``dataclasses`` costs the
    thin path tens of milliseconds.)"""

    __slots__ = ("function", "module", "needs")

    def __init__(self, module: str, function: str, needs: str | None = None) -> None:
        self.module = module
        self.function = function
        self.needs = needs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Command):
            return NotImplemented
        return (self.module, self.function, self.needs) == (
            other.module,
            other.function,
            other.needs,
        )

    def __hash__(self) -> int:
        return hash((self.module, self.function, self.needs))

    def __repr__(self) -> str:
        return f"Command({self.module!r}, {self.function!r}, needs={self.needs!r})"


_COMMANDS_MODULE: Final = "chrysalis.node._cli_commands"

COMMANDS: Final[Mapping[str, Command]] = {
    "identity": Command(_COMMANDS_MODULE, "identity_command"),
    "serve": Command(_COMMANDS_MODULE, "run_node"),
    "join": Command(_COMMANDS_MODULE, "run_node"),
    "ls": Command(_COMMANDS_MODULE, "client"),
    "resolve": Command(_COMMANDS_MODULE, "client"),
    "pipe": Command(_COMMANDS_MODULE, "client"),
    "ping": Command(_COMMANDS_MODULE, "client"),
    "top": Command("chrysalis.node._top", "top_command"),
    "admin": Command("chrysalis.node._cli_admin", "admin", needs="chrysalis-sqlite"),
    "sqlite": Command("chrysalis.node._cli_sqlite", "sqlite_command", needs="chrysalis-sqlite"),
    "agent": Command("chrysalis.node._agent", "agent_command"),
}
"""Every parsed command (all but ``scale``, which ``main`` hands over unparsed)."""

_SCALE: Final = Command("chrysalis.node._scale", "main")

_AGENT_COMMANDS: Final = frozenset({"ls", "resolve", "ping", "pipe"})
"""Commands a running agent may run (``chrysalis.node._agent.AGENT_COMMANDS``, repeated here
so that deciding needs no import)."""
_VALUED_OPTIONS: Final = frozenset(
    {"--log-level", "--identity-dir", "--ca-dir", "--idle-timeout", "--timeout", "--label"}
)
"""Global options that take a value (``_global_options``); ``--json`` takes none."""


def _command_name(raw: Sequence[str]) -> str | None:
    """The command word of ``raw`` without building the parser: the first word after the
    global options; ``None`` where anything else comes first (the parser then decides)."""
    index = 0
    while index < len(raw):
        word = raw[index]
        if not word.startswith("-"):
            return word
        name = word.split("=", 1)[0]
        if name == "--json":
            index += 1
        elif name in _VALUED_OPTIONS:
            index += 1 if "=" in word else 2
        else:
            return None
    return None


_MOVED: Final[Mapping[str, str]] = dict.fromkeys(
    ("_Carriers", "entry_record", "format_entry", "format_table"), _COMMANDS_MODULE
)
"""Names this module held before the commands moved out (still reachable here, imported on
first use)."""


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_import(module), name)


def _load(name: str, command: Command) -> ModuleType:
    """Import ``command``'s module; a missing ``needs`` distribution is a ``CliError``."""
    try:
        return _import(command.module)
    except ImportError as exc:
        if command.needs is None:
            raise
        raise CliError(
            f"'chrysalis {name}' needs the {command.needs} package (pip install {command.needs})"
        ) from exc


def _implementation(name: str) -> tuple[Callable[..., int], tuple[type[BaseException], ...]]:
    """The function running command ``name`` and the failures it reports as one line."""
    command = COMMANDS[name]
    module = _load(name, command)
    function: Callable[..., int] = getattr(module, command.function)
    return function, tuple(getattr(module, "EXPECTED_ERRORS", ()))


# -- entry point --------------------------------------------------------------------------------

_EXPECTED: Final[tuple[type[BaseException], ...]] = (CliError, OSError, TimeoutError)
"""Failures of any command printed as one line (each command module adds its own)."""


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the ``chrysalis`` command; returns the exit code (0, 1 for an error, 2 for usage).

    ``out`` receives the normal output (default: stdout); errors go to stderr as one line.
    With neither ``argv`` nor ``out`` this is the command line (``sys.argv``; what the
    ``chrysalis`` script calls): ``ls``, ``resolve``, ``ping`` and ``pipe`` go to a running
    agent, and one run alone starts an agent as it exits (``chrysalis.node._agent``). A call
    with ``argv`` never starts an agent (it uses one that runs, unless ``out`` is given).
    """
    stdout = sys.stdout if out is None else out
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:2] == ["scale", "admin"]:  # `chrysalis scale admin ...` is `chrysalis admin ...`
        raw = raw[1:]
    if raw[:1] == ["scale"]:
        scale_main: Callable[..., int] = getattr(_import(_SCALE.module), _SCALE.function)
        return scale_main(["run", *raw[1:]], out=stdout)
    autostart = False
    if out is None and _command_name(raw) in _AGENT_COMMANDS:
        # A running agent (``chrysalis agent start``) runs the command in a warm fork with
        # this process's streams, and parses it there (usage errors reach this stderr too):
        # no parser is built here. ``None``: no agent took it, run it here.
        from chrysalis.node._agent_client import run_via_agent

        via_agent = run_via_agent(raw)
        if via_agent is not None:
            return int(via_agent)
        autostart = argv is None  # the command line itself, not a call from Python
    # The command line's own process parses (a join token imports chrysalis.core) and imports
    # the command's modules (for ``ls``, the node stack) in an import window (``_Window``),
    # closed before the command runs. A call of ``main(argv)`` or ``main(out=...)`` from Python
    # opens none.
    with _Window(argv is None and out is None and _command_name(raw) in COMMANDS) as window:
        parser = build_parser(_command_name(raw))
        try:
            args = parser.parse_args(raw)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else _USAGE_EXIT
        if args.command == "scale":  # global options before it: the scale tool parses its own
            print(
                "chrysalis: error: `scale` takes its options after the word: chrysalis scale "
                "[OPTIONS] (see chrysalis scale --help)",
                file=sys.stderr,
            )
            return _USAGE_EXIT
        import logging

        logging.basicConfig(
            level=str(args.log_level).upper(), format="%(name)s %(levelname)s %(message)s"
        )
        expected = _EXPECTED
        try:
            try:
                function, errors = _implementation(args.command)
            finally:
                window.close()
            expected = (*_EXPECTED, *errors)
            status = function(args, stdout)
        except KeyboardInterrupt:
            return 130
        except Exception as exc:
            print(error_line(exc, expected), file=sys.stderr)
            status = _ERROR_EXIT
    if autostart:
        _autostart_agent(raw)
    return status


class _Window:
    """``chrysalis._startup.import_window()`` held open from construction until ``close``
    (idempotent; also on leaving a ``with`` block), when ``opened``; else nothing, and nothing
    imported (not even ``contextlib``, for ``--help``). The worker entry points' window: the
    stack's dataclasses and regular expressions compiled through caches kept beside the byte
    code, the collector paused, and what the imports made frozen at the end (chrysalis-core's
    README, "Start-up of worker processes"; issue 22, item 5)."""

    def __init__(self, opened: bool) -> None:
        self._window: Any = None
        if opened:
            from chrysalis._startup import import_window

            self._window = import_window()
            self._window.__enter__()

    def close(self) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.__exit__(None, None, None)

    def __enter__(self) -> _Window:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _autostart_agent(raw: list[str]) -> None:
    """After a client command (``raw``) that found no agent: start one from this warm process
    (``chrysalis.node._agent.autostart``) with a session for ``raw``'s token already joining,
    so the next command is answered warm; never fails
    the command (``CHRYSALIS_AGENT_AUTOSTART=0`` or ``CHRYSALIS_NO_AGENT=1``: nothing)."""
    import logging

    from chrysalis.node import _agent_client

    log = logging.getLogger("chrysalis.cli")
    try:
        if not _agent_client.autostart_enabled(os.environ):
            return  # decided before importing the agent, which this command would not use
        agent = _import("chrysalis.node._agent")
        started = agent.autostart(first=(raw, os.getcwd(), dict(os.environ)))
    except KeyboardInterrupt:
        return  # Ctrl-C while the agent was starting: the command itself is done, quietly
    except Exception as exc:
        log.info("could not start an agent: %s", exc)
        return
    if started is not None:
        log.info("started an agent (pid %s) for the next commands", started or "spawned")


def error_line(exc: BaseException, expected: tuple[type[BaseException], ...]) -> str:
    """The one line a failure is reported as: ``chrysalis: error: MESSAGE`` for the
    ``expected`` failures, else the exception's type and first line (its traceback is logged
    at debug level)."""
    if isinstance(exc, expected):
        message = str(exc) or type(exc).__name__
        return f"chrysalis: error: {message.splitlines()[0]}"
    # Not one of the failures above: still one line (the traceback with --log-level debug).
    import logging

    logging.getLogger("chrysalis.cli").debug("unexpected failure", exc_info=exc)
    first = (str(exc) or "").splitlines()[:1]
    message = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
    return f"chrysalis: error: {message} (--log-level debug shows where)"


if __name__ == "__main__":
    # ``python -m chrysalis.node._cli`` runs this file as ``__main__``; the command modules
    # import ``chrysalis.node._cli`` (``CliError``), so run that one module's ``main``.
    sys.exit(_import("chrysalis.node._cli").main())
