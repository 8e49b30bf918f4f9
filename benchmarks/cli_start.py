"""Start-up of the ``chrysalis`` command: wall time of ``chrysalis --help`` and of
``chrysalis ls TOKEN`` against ``python -c pass``.

Usage::

    python benchmarks/cli_start.py [--quick | --smoke] [--json OUT] [--write-readme]

The script starts one root node (``chrysalis serve`` on a UDP loopback carrier, with a
development CA in a temporary directory) and then runs rounds of four commands back to back,
so that the four see about the same machine load:

1. **bare** (baseline): ``python -c pass``, interpreter start-up alone.
2. **help**: ``python -m chrysalis.node._cli --help`` (what the ``chrysalis`` console script
   runs: it imports ``chrysalis.node._cli`` and calls ``main``).
3. **imports** (informational): a process that imports the modules one ``ls`` imported
   (listed by ``-X importtime`` before the rounds) and nothing else, inside
   ``chrysalis._startup.import_window()`` as the command line's own process does: what ``ls``
   costs beyond this is protocol work, not imports.
4. **ls**: ``python -m chrysalis.node._cli --ca-dir CA ls TOKEN``: a client node that joins
   the root, enumerates the namespace, prints the table and leaves.
5. **ls_agent_fork** (informational): ``chrysalis --log-level info ls TOKEN`` with the agent
   running: a command a session does not take (its log belongs on the caller's stderr), so
   the agent forks it as before sessions existed: the child still does identity, QUIC
   handshake, join, enumeration and leave.
6. **ls_agent**: the same command while an agent runs (``chrysalis agent serve`` on a socket
   of the run's temporary directory, started before the rounds): the command (its thin path,
   ``chrysalis.node._agent_client``) hands itself to the agent, whose warm session (a client
   node joined once, at the warm-up) answers it with one enumeration at the root; the caller
   prints the table. The run checks, through ``agent status``, that every round's command was
   answered by a session (not forked). The other cases run with ``CHRYSALIS_NO_AGENT=1``, so
   an agent of the user's never takes them.
7. **ls_autostart** (cold, the default since agents start themselves): ``chrysalis ls TOKEN``
   with no agent running and nothing disabling the automatic start, on a socket of its own
   for the round: the command runs alone (as **ls**) and then forks an agent from its warm
   process (``chrysalis.node._agent.autostart``) before it exits, and the agent starts a
   session for the token at once: what that fork adds to a lone command.
8. **ls_second**: the next ``chrysalis ls TOKEN`` on that socket, once the agent's socket
   exists (bounded wait, not timed; a person typing the next command takes longer): answered
   by the session the agent started for the first command's token (which may still be
   joining: then this command waits for it). The agent is stopped after the round (so every
   round starts cold).
9. **ls_agent_script**: the same through the ``chrysalis`` console script installed next to
   this interpreter (when there is one): what a user runs. It imports ``sys`` and
   ``chrysalis.node._cli``; ``python -m`` also imports ``runpy`` (and with it ``importlib.util``,
   ``contextlib``, ``collections``, ``functools``), about as much again as the thin path.

The load average (``/proc/loadavg``, 1 minute) is read before and after the rounds and printed
with the table: the machine is shared.

Every child runs with bytecode caches (in a private ``PYTHONPYCACHEPREFIX``, written by a
warm-up run of each command), as an installed command does. Each time is the wall time from
``subprocess.run`` to the child's exit. The ratios are
command / bare in the same round, and the headline figure is the median of the per-round
ratios (full run: 15 rounds; ``--quick``: 5; ``--smoke``: 1). The machine is shared and noisy:
trust ratios more than times. Every wait is bounded, and the root is stopped (SIGTERM, then
SIGKILL) however the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks._common`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    BenchmarkError,
    add_run_arguments,
    machine_facts,
    machine_line,
    median,
    run_mode,
    write_json,
    write_readme_section,
)

README: Final = ROOT / "packages" / "chrysalis-node" / "README.md"
HEADING: Final = "## CLI start-up"
CLI: Final = (sys.executable, "-m", "chrysalis.node._cli")
BARE: Final = (sys.executable, "-c", "pass")
COMMAND_TIMEOUT: Final = 60.0
"""Seconds one measured command may take."""
SERVE_TIMEOUT: Final = 60.0
"""Seconds the root may take to print its join token."""
ROUNDS: Final = {"full": 15, "quick": 5, "smoke": 1}
LS_GOAL: Final = 3.0
"""Issue 22: ``chrysalis ls`` at most 3x ``python -c pass``."""


SCRIPT: Final = Path(sys.executable).with_name("chrysalis")
"""The installed ``chrysalis`` console script of this interpreter's environment (if any)."""
CASES: Final = (
    "bare",
    "help",
    "imports",
    "ls",
    "ls_agent_fork",
    "ls_agent",
    "ls_autostart",
    "ls_second",
) + (("ls_agent_script",) if SCRIPT.exists() else ())
"""The commands of one round, in the order they run (``bare`` is the baseline)."""
LABELS: Final = {
    "bare": "`python -c pass`",
    "help": "`chrysalis --help`",
    "imports": "the modules `ls` imports, nothing else (informational)",
    "ls": "`chrysalis ls TOKEN` alone (`CHRYSALIS_NO_AGENT=1`: no agent used or started)",
    "ls_agent_fork": "`chrysalis --log-level info ls TOKEN` with an agent: forked per command "
    "(informational)",
    "ls_agent": "`chrysalis ls TOKEN` with an agent running (`chrysalis agent start`)",
    "ls_agent_script": "the same through the installed `chrysalis` script (no `runpy`)",
    "ls_autostart": "**cold**: `chrysalis ls TOKEN`, no agent running, so it runs alone and "
    "starts one",
    "ls_second": "**the next** `chrysalis ls TOKEN`, answered by the agent the cold one started",
}
GOAL_CASES: Final = ("ls", "ls_agent", "ls_agent_script", "ls_autostart", "ls_second")
"""The rows issue 22's 3x goal applies to."""


def imports_program(modules: Sequence[str]) -> str:
    """The imports row's program: ``modules`` (those an ``ls`` imported, in its order) imported
    inside ``chrysalis._startup.import_window()``, the window ``chrysalis.node._cli.main`` opens
    in the command line's own process, so that ``ls`` minus this row is the protocol work."""
    lines = ["import importlib", "from chrysalis._startup import import_window"]
    lines.append("with import_window():")
    lines.append(f"    for name in {list(modules)!r}:")
    lines.append("        try:")
    lines.append("            importlib.import_module(name)")
    lines.append("        except ImportError:")  # tried and refused in ``ls`` too (``nt``, ...)
    lines.append("            pass")
    return "\n".join(lines)


def ls_modules(ls: Sequence[str], env: dict[str, str]) -> list[str]:
    """The modules one run of ``ls`` imports (``-X importtime``), in the order they finished."""
    proc = subprocess.run(
        [ls[0], "-X", "importtime", *ls[1:]],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise BenchmarkError(
            f"ls -X importtime exited with {proc.returncode}: {proc.stderr[-2000:]}"
        )
    modules: list[str] = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package" and not name.startswith("__main__"):
                modules.append(name)
    if not any(name.startswith("chrysalis.node") for name in modules):
        raise BenchmarkError("ls -X importtime listed no chrysalis.node module")
    return modules


@dataclass(frozen=True, slots=True)
class Round:
    """Wall seconds of each case of one round (``CASES``)."""

    seconds: dict[str, float]

    def ratio(self, case: str) -> float:
        """``case`` over ``bare`` in this round."""
        return self.seconds[case] / self.seconds["bare"]

    def to_json(self) -> dict[str, float]:
        record = {f"{case}_seconds": self.seconds[case] for case in CASES}
        record.update({f"{case}_over_bare": self.ratio(case) for case in CASES[1:]})
        return record


def _child_env(folder: Path) -> dict[str, str]:
    """The environment of every child: bytecode caches on, in ``folder`` (an installed command
    runs from ``.pyc`` files; a checkout run with ``PYTHONDONTWRITEBYTECODE`` would compile
    every module on every start and measure the compiler instead)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder)
    env["CHRYSALIS_NO_AGENT"] = "1"
    env.pop("CHRYSALIS_AGENT_SOCKET", None)
    env.pop("CHRYSALIS_AGENT_AUTOSTART", None)
    return env


def _terminate(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 10 s; waits for the exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _load() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


class _Agent:
    """``chrysalis agent serve`` on ``socket`` (in the foreground of its own process)."""

    def __init__(self, socket: Path, env: dict[str, str]) -> None:
        self.socket = socket
        self._proc = subprocess.Popen(
            [*CLI, "agent", "serve", "--socket", str(socket)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + SERVE_TIMEOUT
        while not socket.exists():
            if time.monotonic() >= deadline or self._proc.poll() is not None:
                self.stop()
                raise BenchmarkError("the agent did not start")
            time.sleep(0.02)

    def warm(self) -> int:
        """Commands the agent's sessions answered (``agent status``)."""
        from chrysalis.node._agent import _control

        return int(_control(self.socket, "status")["warm"])

    def stop(self) -> None:
        _terminate(self._proc)


def _autostarted(
    ls: Sequence[str], env: dict[str, str], socket: Path
) -> tuple[float, str, float, str]:
    """``ls`` with no agent on ``socket`` (it starts one), then ``ls`` again once the started
    agent's socket exists; both wall times and outputs. The agent is stopped (bounded) after."""
    from chrysalis.node._agent import AgentError, _control

    own = {**env, "CHRYSALIS_AGENT_SOCKET": str(socket), "CHRYSALIS_AGENT_AUTOSTART": "1"}
    # autostart creates only the default per-user directory: a socket named explicitly needs
    # its directory made first (this user's, closed to others)
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    first, first_table = _timed(ls, own)
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT
        while not socket.exists():
            if time.monotonic() >= deadline:
                raise BenchmarkError("the lone ls started no agent")
            time.sleep(0.01)
        second, second_table = _timed(ls, own)
        if _control(socket, "status")["warm"] != 1:
            raise BenchmarkError("the second ls was not answered by the started agent")
    finally:
        with contextlib.suppress(AgentError):
            _control(socket, "stop")
        deadline = time.monotonic() + SERVE_TIMEOUT
        while socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return first, first_table, second, second_table


def _timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, str]:
    """Run ``argv``; its wall seconds and stdout. :class:`BenchmarkError` when it fails."""
    started = time.perf_counter()
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False, env=env
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise BenchmarkError(f"{argv[1:]} exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


class _Root:
    """``chrysalis serve`` on a loopback UDP carrier; ``token`` is its first stdout line."""

    def __init__(self, ca_dir: Path, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [*CLI, "--ca-dir", str(ca_dir), "serve", "--listen", "udp://127.0.0.1:0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.token = self._first_line()

    def _first_line(self) -> str:
        assert self._proc.stdout is not None
        deadline = time.monotonic() + SERVE_TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline or self._proc.poll() is not None:
                    self.stop()
                    raise BenchmarkError("the root printed no join token")
        line = self._proc.stdout.readline().strip()
        if not line:
            self.stop()
            raise BenchmarkError("the root exited before printing its join token")
        return line

    def stop(self) -> None:
        _terminate(self._proc)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def measure(rounds: int, loads: list[float]) -> list[Round]:
    """Start a root, then ``rounds`` rounds of the ``CASES`` (the load average before and
    after them appended to ``loads``)."""
    results: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="cli-start-") as folder:
        ca_dir = Path(folder) / "ca"
        env = _child_env(Path(folder) / "pycache")
        root = _Root(ca_dir, env)
        socket = Path(folder) / "agent" / "agent.sock"
        agent_env = {**env, "CHRYSALIS_AGENT_SOCKET": str(socket)}
        agent_env.pop("CHRYSALIS_NO_AGENT")
        agent: _Agent | None = None
        try:
            ls = [*CLI, "--ca-dir", str(ca_dir), "ls", root.token]
            forked = [*CLI, "--log-level", "info", "--ca-dir", str(ca_dir), "ls", root.token]
            imports = [sys.executable, "-c", imports_program(ls_modules(ls, env))]
            for warm_up in (BARE, [*CLI, "--help"], imports, ls):
                _timed(warm_up, env)  # bytecode caches, the file cache, the root's first client
            agent = _Agent(socket, agent_env)
            _timed(ls, agent_env)  # the session joins here
            warm = agent.warm()
            loads.append(_load())
            for index in range(rounds):
                seconds: dict[str, float] = {}
                seconds["bare"], _ = _timed(BARE, env)
                seconds["help"], help_text = _timed([*CLI, "--help"], env)
                seconds["imports"], _ = _timed(imports, env)
                seconds["ls"], table = _timed(ls, env)
                seconds["ls_agent_fork"], fork_table = _timed(forked, agent_env)
                seconds["ls_agent"], agent_table = _timed(ls, agent_env)
                seconds["ls_autostart"], auto_table, seconds["ls_second"], second_table = (
                    _autostarted(ls, agent_env, Path(folder) / f"auto-{index}" / "a.sock")
                )
                for other in (auto_table, second_table):
                    if other.splitlines()[:1] != table.splitlines()[:1]:
                        raise BenchmarkError(f"the autostart case printed {other[:80]!r}")
                if "ls_agent_script" in CASES:
                    seconds["ls_agent_script"], script_table = _timed(
                        [str(SCRIPT), *ls[len(CLI) :]], agent_env
                    )
                    if script_table.splitlines()[:1] != table.splitlines()[:1]:
                        raise BenchmarkError(f"the script's ls printed {script_table[:80]!r}")
                if not help_text.startswith("usage: chrysalis") or "PID" not in table:
                    raise BenchmarkError(f"unexpected output: {help_text[:80]!r} {table[:80]!r}")
                if fork_table.splitlines()[:1] != table.splitlines()[:1]:
                    raise BenchmarkError(f"the forked ls printed {fork_table[:80]!r}")
                if agent_table.splitlines()[:1] != table.splitlines()[:1]:
                    raise BenchmarkError(f"the agent's ls printed {agent_table[:80]!r}")
                results.append(Round(seconds))
                times = ", ".join(f"{case} {seconds[case] * 1000:.0f} ms" for case in CASES)
                print(f"round {index + 1}/{rounds}: {times}", file=sys.stderr)
            loads.append(_load())
            expected = rounds * (2 if "ls_agent_script" in CASES else 1)
            if agent.warm() - warm != expected:
                raise BenchmarkError(f"{agent.warm() - warm} of {expected} ls answered warm")
        finally:
            if agent is not None:
                agent.stop()
            root.stop()
    return results


def summary(rounds: Sequence[Round]) -> dict[str, Any]:
    """Medians of the times and of the per-round ratios (with their min and max)."""
    figures: dict[str, Any] = {
        f"{case}_seconds": median([r.seconds[case] for r in rounds]) for case in CASES
    }
    for case in CASES[1:]:
        ratios = [r.ratio(case) for r in rounds]
        figures[f"{case}_over_bare"] = median(ratios)
        figures[f"{case}_ratio_range"] = [min(ratios), max(ratios)]
    return figures


def report(
    meta: dict[str, Any], mode: str, rounds: Sequence[Round], loads: Sequence[float] = ()
) -> str:
    """The Markdown section (``## CLI start-up``) of the chrysalis-node README."""
    figures = summary(rounds)
    rows = []
    for case in CASES:
        time_ms = f"{figures[f'{case}_seconds'] * 1000:.0f} ms"
        if case == "bare":
            rows.append(f"| {LABELS[case]} | {time_ms} | 1x | |")
            continue
        low, high = figures[f"{case}_ratio_range"]
        ratio = f"{figures[f'{case}_over_bare']:.1f}x ({low:.1f}-{high:.1f})"
        goal = ""
        if case in GOAL_CASES:
            met = "met" if figures[f"{case}_over_bare"] <= LS_GOAL else "not met"
            goal = f"at most {LS_GOAL:g}x: {met}"
        rows.append(f"| {LABELS[case]} | {time_ms} | {ratio} | {goal} |".replace("|  |", "| |"))
    lines = [
        HEADING,
        "",
        f"`benchmarks/cli_start.py` ({mode} run, {len(rounds)} rounds; {machine_line(meta)}"
        + (f"; load average {loads[0]:.1f} before, {loads[-1]:.1f} after" if loads else "")
        + ").",
        "Wall time of each command against `python -c pass` in the same round; the ratio is",
        "the median of the per-round ratios (min-max in brackets). The import row is a",
        "process that only imports what `ls` imports: `ls` minus that row is the protocol",
        "work (identity, QUIC handshake, join, enumeration, leave).",
        "",
        "| command | median time | ratio to `python -c pass` | goal |",
        "|---|---|---|---|",
        *rows,
    ]
    imports_ms = figures["imports_seconds"] * 1000
    bare_ms = figures["bare_seconds"] * 1000
    work_ms = (figures["ls_seconds"] - figures["imports_seconds"]) * 1000
    lines += [
        "",
        f"Where the `ls` time goes: the interpreter ({bare_ms:.0f} ms), the imports of the node",
        f"machinery it uses ({imports_ms - bare_ms:.0f} ms: QUIC and TLS with aioquic and",
        "cryptography, the nameserver, the carriers) and the protocol work",
        f"({work_ms:.0f} ms). `--help` and usage errors import none of that (not even",
        "chrysalis.core); the 3x goal for `ls` cannot be met by importing less, only by a",
        "warm process. With an agent running (`chrysalis agent start`), `ls` took",
        f"{figures['ls_agent_seconds'] * 1000:.0f} ms"
        + (
            f" ({figures['ls_agent_script_seconds'] * 1000:.0f} ms through the installed script)"
            if "ls_agent_script" in CASES
            else ""
        )
        + ": the caller is the interpreter, the thin client",
        "(`chrysalis.node._agent_client`: `_socket` and `_struct`, no parser) and one request;",
        "the agent's warm session (a node joined once) asks the root for the namespace and",
        "sends the table back.",
        "",
        "Cold: a lone `ls` now starts that agent itself (it forks one from its warm process",
        "as it exits; `CHRYSALIS_AGENT_AUTOSTART=0` opts out), so the first command of a",
        f"session took {figures['ls_autostart_seconds'] * 1000:.0f} ms "
        f"({figures['ls_autostart_over_bare']:.1f}x, against {figures['ls_over_bare']:.1f}x "
        "for a lone `ls` that starts none), the second",
        f"{figures['ls_second_seconds'] * 1000:.0f} ms ({figures['ls_second_over_bare']:.1f}x: "
        "the agent started the token's session as it started)",
        "and every later one is the warm row above.",
    ]
    if mode != "full":
        lines += ["", f"A {mode} run: too few rounds to trust; run without options for the table."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="5 rounds",
        smoke="1 round (proves that the script works)",
        readme=f"replace the '{HEADING}' section of packages/chrysalis-node/README.md",
    )
    args = parser.parse_args(argv)
    mode = run_mode(args)
    meta = machine_facts("cli_start.py", argv)
    loads: list[float] = []
    rounds = measure(ROUNDS[mode], loads)
    text = report(meta, mode, rounds, loads)
    print(text, end="")
    if args.json is not None:
        write_json(
            args.json,
            {
                "meta": meta,
                "mode": mode,
                "summary": summary(rounds),
                "rounds": [r.to_json() for r in rounds],
                "load_average": loads,
            },
        )
    if args.write_readme:
        write_readme_section(README, text, heading=HEADING)
    return 0


if __name__ == "__main__":
    sys.exit(main())
