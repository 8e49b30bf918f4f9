"""A Monarch worker process: ``python -m monarch.actor._worker --parent ADDR --authority PID``.

Why a separate entry point: every process of a proc mesh is one Chrysalis Node joined under
the client's node (the namespace tree is the supervision tree). The worker issues its own leaf
from the client's development CA directory (``--ca-dir``), joins the client's node (pinned to
``--authority``), runs one ``ProcRuntime`` over a ``NodeProcessTransport`` and prints its PID
(hex) on stdout once its parent link is active: that line is the readiness handshake the
client waits for. With lanes on, the client's envelope stream to the worker and the worker's
to the client open on that parent link's connection (no handshake of their own: see
``_transport.node``).

Start-up lines: the handshake line, and before it a line per stage (``STAGE_LINE``: what the
worker is doing, so that a client whose worker did not start in time can say where it was) or
one failure line (``FAILED_LINE``: why it could not start). Each begins with ``STARTUP_MARKER``
(it starts with a NUL byte, which no program's text output contains): whatever else reaches
stdout first, such as what the client's main module printed while the worker imported it, is
the program's output, and the client forwards it. A main module that starts Monarch on import
(no ``if __name__ == "__main__":`` guard) fails the start with a message saying so
(``_runtime.main_module.UnguardedMainError``), as does one that exits on import.

Options for workers started by a host's worker loop (``attach_daemon``): ``--listen`` binds the node
to an address the client can reach (the default is ``udp://127.0.0.1:0``), and
``--exit-with-stdin`` makes the worker exit (status 3) when its stdin ends, i.e. when the worker
loop that started it is gone.

It ends in one of four ways (the third only with ``--exit-with-stdin``):

- its runtime receives ``STOP_PROC`` (``ProcMesh.stop()``): actors stop, the acknowledgement
  is flushed, the transport and the node close, and the process exits with status 0 after a
  normal interpreter shutdown;
- its parent link is gone (the client died or was killed): QUIC sends a PING whenever the
  connection has been silent for ``idle_timeout / 4`` seconds, so a dead parent makes the link fail
  within about ``idle_timeout`` seconds; when the link has not been connected for
  ``idle_timeout`` seconds more, the worker exits with status 3 at once (``os._exit``: no
  orphan survives, even with actor threads stuck in user code);
- its stdin ends (``--exit-with-stdin``): the host's worker loop died; it exits with status 3;
- it was fenced: the client's heartbeats (``_runtime.liveness``) stopped for longer than their
  timeout, so the client may have declared this process dead (it was stopped, or hung). As soon as
  it runs again it sends nothing more and exits with status 4 at once (``os._exit``), never
  rejoining the program.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import gc
import json
import logging
import os
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from typing import Any, Final, NoReturn

from chrysalis.core import Pid
from chrysalis.nameserver import ParentStatusKind
from chrysalis.node import Node
from chrysalis.quic import DevelopmentIdentityProvider, QuicConfig
from monarch.actor._base.loop import RuntimeLoop
from monarch.actor._hosts.commands import (
    FAILED_LINE,
    READY_LINE,
    STAGE_LINE,
    STARTUP_MARKER,
    WORKER_ARGV_ENV,
    bind_cpus,
)
from monarch.actor._hosts.groups import mark_worker_process, register_worker
from monarch.actor._hosts.worker_exits import (
    EXIT_FENCED,
    EXIT_ORPHANED,
    exit_when_orphaned,
    exit_when_stdin_ends,
    say_last_words,
)
from monarch.actor._hosts.zygote import handed_identity
from monarch.actor._runtime import logging as _logging
from monarch.actor._runtime import telemetry as _telemetry
from monarch.actor._runtime.client import (
    _frame_limits,
)
from monarch.actor._runtime.context import (
    set_process_sender,
)
from monarch.actor._runtime.main_module import (
    UnguardedMainError,
    import_main,
    refused_while_importing,
    unguarded_message,
)
from monarch.actor._runtime.proc import (
    ProcRuntime,
)
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._transport.node import NodeProcessTransport
from monarch.config import _registry

__all__ = [
    "EXIT_FENCED",
    "EXIT_ORPHANED",
    "FAILED_LINE",
    "READY_LINE",
    "STAGE_LINE",
    "STARTUP_MARKER",
    "WORKER_ARGV_ENV",
    "bind_cpus",
    "forked_main",
    "main",
]

_STARTUP_TIMEOUT: Final = 30.0
_MAX_ARGV_ENV: Final = 64 * 1024
_log = logging.getLogger("monarch.actor.worker")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m monarch.actor._worker")
    parser.add_argument("--parent", required=True, help="carrier address of the parent node")
    parser.add_argument("--authority", required=True, help="the parent's PID (32 hex digits)")
    parser.add_argument("--ca-dir", required=True, help="the client's development CA directory")
    parser.add_argument("--label", default="worker", help="a human label for this process")
    parser.add_argument(
        "--idle-timeout", type=float, default=3.0, help="QUIC idle timeout and orphan bound (s)"
    )
    parser.add_argument(
        "--listen", default=None, help="carrier address of this node (default udp://127.0.0.1:0)"
    )
    parser.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="exit when stdin ends (the host daemon that started this worker is gone)",
    )
    parser.add_argument(
        "--main",
        default=None,
        help="the client's main module, 'name:MODULE' or 'path:FILE' (see _runtime.main_module)",
    )
    return parser.parse_args(list(argv))


async def _watch_parent(node: Any, bound: float, orphaned: threading.Event) -> None:
    """Set ``orphaned`` once the parent link has not been connected for ``bound`` seconds."""
    manager = node.parent_manager
    loop = asyncio.get_running_loop()
    down_since: float | None = None
    while True:
        await asyncio.sleep(min(0.25, bound / 4))
        if manager.status.kind is ParentStatusKind.CONNECTED:
            down_since = None
            continue
        now = loop.time()
        if down_since is None:
            down_since = now
        elif now - down_since >= bound:
            orphaned.set()
            return


def _argv_from_environment() -> list[str]:
    """The options in ``WORKER_ARGV_ENV`` (removed from the environment, so that processes
    this worker starts do not inherit them); a clear error if malformed."""
    raw = os.environ.pop(WORKER_ARGV_ENV, "")
    if not raw:
        return []
    if len(raw) > _MAX_ARGV_ENV:
        raise SystemExit(f"{WORKER_ARGV_ENV} is longer than {_MAX_ARGV_ENV} characters")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(f"{WORKER_ARGV_ENV} is not JSON: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SystemExit(f"{WORKER_ARGV_ENV} must be a JSON list of strings")
    return value


def _startup_line(prefix: str, value: str) -> None:
    sys.stdout.write(f"{prefix}{' '.join(value.split())}\n")  # one line, whatever ``value``
    sys.stdout.flush()


def _fail_start(label: str, why: str) -> NoReturn:
    """Tell the client why this worker cannot start (and the terminal), then exit (status 1;
    ``os._exit``: threads the main module may have started must not hold the exit)."""
    with contextlib.suppress(Exception):
        _startup_line(FAILED_LINE, why)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"monarch worker {label}: {why}\n")
        sys.stderr.flush()
    os._exit(1)


def _load_main(kind: str, value: str) -> str | None:
    """Import the client's main module; why this worker cannot start, or None."""
    try:
        import_main(kind, value)
    except UnguardedMainError as exc:
        return str(exc)
    except Exception as exc:  # the program may still use importable classes only
        refused = refused_while_importing()
        if refused is not None:  # it caught the refusal and failed otherwise
            return refused
        _log.warning("could not load the client's main module %s: %r", value, exc)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: its program ran and ended
        return unguarded_message(value, f"code that exited ({exc!r})")
    return refused_while_importing()  # None, unless it swallowed the refusal


def main(argv: Sequence[str] | None = None) -> int:
    """Run one worker process until it is stopped or orphaned (see the module docstring)."""
    if argv is None:
        argv = sys.argv[1:] or _argv_from_environment()
    args = _parse(argv)
    mark_worker_process()
    logging.basicConfig(level=logging.WARNING, format=f"[{args.label}] %(name)s: %(message)s")

    if args.main:
        kind, _, value = args.main.partition(":")
        _startup_line(STAGE_LINE, f"importing the client's main module {value}")
        why = _load_main(kind, value)
        if why is not None:
            _fail_start(args.label, why)
        _startup_line(STAGE_LINE, "joining the client")

    # Forked by the zygote: the identity it issued ahead for this worker (``zygote``).
    identity = (
        handed_identity(args.ca_dir) or DevelopmentIdentityProvider(args.ca_dir).issue_identity()
    )
    register_worker(identity.pid.raw, bytes.fromhex(args.authority))
    loop = RuntimeLoop("monarch-worker")
    loop.start()
    orphaned = threading.Event()
    node = Node.join(
        identity,
        args.parent,
        Pid(bytes.fromhex(args.authority)),
        quic_config=QuicConfig(
            idle_timeout=args.idle_timeout, keepalive_interval=args.idle_timeout / 4
        ),
        **({"listen": args.listen} if args.listen else {}),
    )
    background: list[asyncio.Task[None]] = []

    async def start() -> NodeProcessTransport:
        await node.__aenter__()
        await asyncio.wait_for(node.wait_connected(), _STARTUP_TIMEOUT)
        transport = NodeProcessTransport(node, loop, limits=_frame_limits, identity=identity)
        transport.start()
        background.append(asyncio.create_task(_watch_parent(node, args.idle_timeout, orphaned)))
        return transport

    try:
        transport = asyncio.run_coroutine_threadsafe(start(), loop.loop).result(
            _STARTUP_TIMEOUT + 5
        )
    except BaseException as exc:
        _fail_start(args.label, f"could not join the client: {exc!r}")
    runtime = ProcRuntime(transport, loop, args.label)
    set_process_sender(runtime)
    _tracing.set_process_label(args.label)  # spans made outside actors name this worker
    # Finished spans stream to the client (the authority), so a kill loses only the last
    # interval's (``_runtime.telemetry.tracing``).
    runtime.stream_spans_to(bytes.fromhex(args.authority))

    def fenced(reason: str) -> None:
        say_last_words(
            f"monarch worker {args.label}: fenced ({reason}): the client may have declared "
            "this process dead; exiting\n"
        )
        os._exit(EXIT_FENCED)

    runtime.on_fenced = fenced
    del runtime  # referenced by the transport's callbacks for the life of the process
    # Everything allocated so far (modules, node, TLS state) lives as long as the process:
    # keep the cyclic collector, which message traffic triggers often, from walking it again.
    gc.collect()
    gc.freeze()
    _startup_line(READY_LINE, identity.pid.hex())

    # Their functions live in ``worker_exits`` (see there: they outlive this module's
    # clearing at interpreter exit).
    threading.Thread(
        target=exit_when_orphaned, args=(orphaned, args.label), name="orphan-watch", daemon=True
    ).start()
    if args.exit_with_stdin:
        threading.Thread(
            target=exit_when_stdin_ends, args=(args.label,), name="host-watch", daemon=True
        ).start()
    while not transport.wait_closed(0.5):
        pass

    async def finish() -> None:
        for task in background:
            task.cancel()
        await node.aclose()

    deadline = time.monotonic() + 5.0
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(finish(), loop.loop).result(
            max(0.1, deadline - time.monotonic())
        )
    loop.stop(timeout=1.0)
    # A normal interpreter exit follows: module globals are released then (their ``__del__``
    # runs), which the cyclic collector must be free to do for what was frozen above.
    gc.unfreeze()
    return 0


def _user_module(name: str, module: object, system: tuple[str, ...]) -> bool:
    """True for a module of the program (not the standard library, an installed
    distribution, or the Monarch/Chrysalis runtime, which must keep working to the end)."""
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in ("monarch", "chrysalis"):
        return False
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return False
    path = os.path.abspath(path)
    return not any(path.startswith(prefix) for prefix in system)


def _finish_like_an_interpreter() -> None:
    """What a normal interpreter exit does and a forked worker's ``os._exit`` would skip
    (Monarch: on ``ProcMesh.stop()`` the worker's interpreter finalizes normally): run the
    ``atexit`` handlers registered in this worker, then release the program's module globals,
    newest module first, so their ``__del__`` runs. The runtime's own modules, the standard
    library and installed distributions are left alone: daemon threads (an actor stuck in user
    code) may still run their code, which a real finalization would have frozen first."""
    gc.unfreeze()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    paths = sysconfig.get_paths()
    system = tuple(
        os.path.abspath(p) + os.sep
        for p in {
            *(paths.get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")),
            *site.getsitepackages(),
            site.getusersitepackages(),
        }
        if p
    )
    gc.collect()
    for name, module in reversed(list(sys.modules.items())):
        if module is None or not _user_module(name, module, system):
            continue
        namespace = vars(module)
        for key in [k for k in namespace if k != "__builtins__"]:
            namespace[key] = None
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def forked_main(argv: Sequence[str]) -> int:
    """``main`` in a process forked by the client's zygote (see ``zygote``).

    The fork carries the client's in-memory state as of the zygote's start; a worker must
    begin as an exec'd one would: runtime configuration only from the environment, no
    metrics or spans recorded by the client, system log lines labelled as its own.
    """
    _registry.clear_runtime_config()
    _logging.uninstall_system_logging()  # the client's label and handlers
    _telemetry.reset_metrics()
    wanted = os.environ.get("MONARCH_TELEMETRY")
    _telemetry.disable_telemetry()  # also clears the variable: put it back, then apply it
    if wanted is not None:
        os.environ["MONARCH_TELEMETRY"] = wanted
    _telemetry._from_environment()
    # The client's exit handlers are its own (it may have registered them, or its modules
    # did, before the zygote was forked): a worker runs those it registers itself.
    atexit._clear()
    code = main(argv)
    _finish_like_an_interpreter()  # the zygote's child ends with os._exit
    return code


if __name__ == "__main__":
    sys.exit(main())
