"""The worker loop a cluster engine starts on each of its hosts:
``python -m monarch.job._host_worker --port PORT [--host HOST | --slurm-node-addr] [--ca DIR]``.

Why this shape: a client attaches to ``udp://ADDRESS:PORT`` addresses it can compute from what
the engine tells it (Slurm: the allocated nodes' ``NodeAddr``; Kubernetes: the pods' IPs), so
each host's worker loop must listen on exactly that address, with no file or side channel
carrying the address back. The host's address comes from, in order: ``--host``; under Slurm
(``--slurm-node-addr``) the ``NodeAddr`` that ``scontrol`` reports for ``$SLURMD_NODENAME``
(several nodes may share one machine, each with its own address); else ``$MONARCH_HOST_IP``
(Kubernetes sets it from the pod's IP through the downward API); else the address the host
name resolves to. It then runs ``monarch.actor.run_worker_loop_forever``, which ends when the
client kills or shuts down the mesh, or when the engine signals the process. With
``--ready-file`` (or ``$MONARCH_READY_FILE``) it creates that file once the loop listens, for a
readiness probe (Kubernetes: a pod is Ready only when its worker loop can be attached). Under
Slurm, with ``$MONARCH_JOB_REPORT`` set by the submitting client (``_report``), it connects back
to that client once it listens and says where (node rank, name, address), so the client need not
poll the scheduler for it.

Start-up is the critical path of a cluster job's ``apply()``, so the ``scontrol`` query of this
node's address starts before the stack's imports and runs while they do.
"""

from __future__ import annotations

import gc
import sys

# Run as the worker loop (``python -m``), this process's start-up is the critical path of a
# job's ``apply()``: a cluster's hosts all start it at once, and the client waits for the
# slowest. So it imports only what listening and a client's attach need: ``monarch.actor``'s
# facade (and with it the runtime, the meshes and what starting workers needs: about a fifth
# of the imports) is deferred to the first ``Spawn`` (``chrysalis._startup.DeferredPackage``,
# ``attach_daemon.set_spawn_imports``), off the path to a ready mesh. The imports run in an
# import window (``chrysalis._startup.import_window``: the cyclic collector paused, the stack's
# dataclass methods compiled once across hosts, what the imports made frozen after).
# ``monarch.job`` itself imports nothing. Imported as a module (tests), nothing changes.
_STARTING_AS_MAIN = __name__ == "__main__" and gc.isenabled()
if _STARTING_AS_MAIN:
    from chrysalis._startup import DeferredPackage, import_window

    _window = import_window()
    _window.__enter__()
    # (a program's sitecustomize may have imported it: then it is simply there)
    _facade = None if "monarch.actor" in sys.modules else DeferredPackage("monarch.actor")
try:
    import argparse
    import contextlib
    import logging
    import os
    import socket
    import subprocess
    from collections.abc import Sequence
    from pathlib import Path

    def _start_node_query(argv: Sequence[str]) -> tuple[str, subprocess.Popen[str]] | None:
        """``scontrol show node -o $SLURMD_NODENAME``, started now (it runs while this process
        imports the stack) when this run will need it (``--slurm-node-addr`` without
        ``--host``); None otherwise or when it cannot start."""
        node = os.environ.get("SLURMD_NODENAME")
        host_given = any(a == "--host" or a.startswith("--host=") for a in argv)
        if not node or "--slurm-node-addr" not in argv or host_given:
            return None
        try:
            return node, _node_query_process(node)
        except OSError:
            return None

    def _node_query_process(node: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["scontrol", "show", "node", "-o", node],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    _node_query = _start_node_query(sys.argv[1:]) if _STARTING_AS_MAIN else None

    from monarch.actor._hosts.attach_daemon import (
        run_worker_loop_forever,
        set_spawn_imports,
        start_worker_loop_forever,
    )
    from monarch.job._report import send_report
    from monarch.job._slurm_text import REPORT_ENV, WorkerReport, node_addrs
finally:
    if _STARTING_AS_MAIN:
        _window.__exit__(None, None, None)

_log = logging.getLogger("monarch.job.worker")

#: Seconds a ``scontrol`` query of this node may take.
SCONTROL_TIMEOUT = 30.0


def slurm_node_addr() -> str:
    """This Slurm node's ``NodeAddr`` (from ``$SLURMD_NODENAME`` and ``scontrol``)."""
    global _node_query
    node = os.environ.get("SLURMD_NODENAME")
    if not node:
        raise RuntimeError("--slurm-node-addr outside a Slurm step: $SLURMD_NODENAME is not set")
    started, _node_query = _node_query, None  # at import time, or now
    if started is not None and started[0] == node:
        query = started[1]
    else:
        if started is not None:
            started[1].kill()
            started[1].wait()
        query = _node_query_process(node)
    try:
        stdout, stderr = query.communicate(timeout=SCONTROL_TIMEOUT)
    except subprocess.TimeoutExpired:
        query.kill()
        query.wait()
        raise
    if query.returncode != 0:
        raise RuntimeError(f"scontrol show node {node} failed: {stderr.strip()}")
    return node_addrs(stdout, [node])[0]


def host_address(host: str | None, slurm: bool) -> str:
    """The IPv4 address this host's worker loop listens on (see the module docstring)."""
    if host is None and slurm:
        try:
            host = slurm_node_addr()
        except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
            if not os.environ.get("SLURMD_NODENAME"):
                raise
            _log.warning("cannot read this node's NodeAddr (%s): using its host name", exc)
    if host is None:
        host = os.environ.get("MONARCH_HOST_IP") or socket.getfqdn()
    # an ASCII name as bytes: a str loads the IDNA codec first (several ms of the start-up)
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0])
    except OSError as exc:
        raise RuntimeError(f"cannot resolve this host's address {host!r}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monarch.job._host_worker")
    parser.add_argument("--port", type=int, required=True, help="the UDP port to listen on")
    parser.add_argument("--host", default=None, help="the address to listen on")
    parser.add_argument(
        "--slurm-node-addr", action="store_true", help="listen on this Slurm node's NodeAddr"
    )
    parser.add_argument("--ca", default="trust_all_connections", help="the cluster CA directory")
    parser.add_argument(
        "--ready-file",
        default=os.environ.get("MONARCH_READY_FILE"),
        help="a file to create once the loop listens (a readiness probe tests it); "
        "default $MONARCH_READY_FILE",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, format="[monarch-host] %(asctime)s %(name)s: %(message)s"
    )
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port} is not a port")
    if _STARTING_AS_MAIN and _facade is not None:
        set_spawn_imports(_facade.run)  # monarch.actor's facade on the first Spawn
    address = f"udp://{host_address(args.host, args.slurm_node_addr)}:{args.port}"
    _log.info("host %s: worker loop on %s", socket.gethostname(), address)
    report_to = os.environ.get(REPORT_ENV)
    job_id = os.environ.get("SLURM_JOB_ID")
    with contextlib.suppress(KeyboardInterrupt):
        if args.ready_file is None and not (report_to and job_id):
            run_worker_loop_forever(address=address, ca=args.ca)
            return 0
        lifetime = start_worker_loop_forever(address=address, ca=args.ca)
        if args.ready_file is not None:
            Path(args.ready_file).write_text(f"{address}\n")
            _log.info("listening; readiness file %s written", args.ready_file)
        node_id = os.environ.get("SLURM_NODEID") or "0"
        if report_to and job_id and not node_id.isdigit():
            _log.warning("$SLURM_NODEID %r is not a number: not reporting", node_id[:20])
        elif report_to and job_id:
            report = WorkerReport(
                node_id=int(node_id),
                node_name=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                address=address,
            )
            if send_report(report_to, job_id, report):
                _log.info("listening; reported to the client")
        lifetime.get()
    return 0


if __name__ == "__main__":
    sys.exit(main())
