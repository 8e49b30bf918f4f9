"""A host's worker daemon, its second half: starting the worker processes a client's ``Spawn``
asks for (``start_procs``), forked from this host's zygote or started with exec.

Why a module of its own: a worker loop is on the critical path of a cluster job's ``apply()``
until it listens and a client is attached (``attach_daemon``), and what starting workers
needs (the zygote, worker groups, the runtime's log prefixes, and through them most of the
stack above the node) costs about a fifth of its start-up. So ``attach_daemon`` imports none of
it: this module registers ``start_procs`` with it when imported (``set_proc_starter``), which
the facade does; a worker loop entry point that listens first (``monarch.job._host_worker``,
``monarch.job._host``) imports it, with the rest of the facade, on the first ``Spawn``
(``attach_daemon.set_spawn_imports``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monarch.actor._hosts import attach_daemon
from monarch.actor._hosts.attach_daemon import _DaemonProc, _kill_all_of
from monarch.actor._hosts.attach_protocol import Hello, Spawn
from monarch.actor._hosts.commands import (
    exec_worker,
    source_ip_toward,
    spawn_timeout,
    worker_command,
)
from monarch.actor._hosts.groups import (
    FORKED_WORKER,
    OutputForwarder,
    _zygote,
    check_spawn_method,
    copy_to_stderr,
    forward_output,
    read_worker_pids,
)
from monarch.actor._hosts.zygote import Zygote, ZygoteUnavailableError
from monarch.actor._runtime.logging import rank_prefix
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from chrysalis.core import Pid

__all__ = ["start_procs"]

_log = attach_daemon._log


def start_procs(ca_dir: Path, peer: Pid, hello: Hello, request: Spawn) -> list[_DaemonProc]:
    """Start the workers of a checked ``request`` (``spawn_problem``) as the client starts
    local ones: a custom command runs with the worker's options in
    ``MONARCH_WORKER_ARGV``, numactl (found on this host) prefixes it."""
    labels = list(request.labels)
    client_ip = hello.address.removeprefix("udp://").rpartition(":")[0]
    listen = f"udp://{source_ip_toward(client_ip)}:0"
    popens: list[Any] = []  # subprocess.Popen, or ZygoteProcess
    env = dict(os.environ)
    if hello.force_quic:  # every process of the program takes the same path
        env["MONARCH_FORCE_QUIC"] = "1"
    prefixes: list[list[str]] = [[] for _ in labels]
    if request.numactl is not None and any(request.numactl):
        numactl = shutil.which("numactl")
        if numactl is None:
            keys = sorted({o.split("=")[0][2:] for opts in request.numactl for o in opts})
            raise RuntimeError(
                f"proc_bind {', '.join(keys)} needs numactl, which is not installed on "
                f"host {socket.gethostname()} (a 'cpus' binding needs no tool)"
            )
        prefixes = [[numactl, *options] if options else [] for options in request.numactl]
    # Workers fork from this host's zygote (every module imported), as a client's local
    # workers do, unless a custom command or numactl needs an exec.
    zygote = _zygote() if check_spawn_method() == "zygote" else None
    for rank, label in enumerate(labels):
        command = worker_command(
            parent=hello.address, authority=peer.hex(), ca_dir=ca_dir, label=label,
            idle=hello.idle_timeout, main=hello.main, listen=listen, exit_with_stdin=True,
        )  # fmt: skip
        wire = request.commands[rank] if request.commands is not None else None
        custom = wire.bootstrap_command() if wire is not None else None
        if zygote is not None and custom is None and not prefixes[rank]:
            forked = _fork_worker(zygote, command, env)
            if forked is not None:
                popens.append(forked)
                continue
            zygote = None  # the zygote is gone: exec the rest
        try:
            popen = exec_worker(command, custom, prefixes[rank], env, stdin=subprocess.PIPE)
        except (OSError, ValueError) as exc:
            _kill_all_of(popens)
            for started in popens:  # no forwarder owns their stderr yet
                if started.stderr is not None:
                    with contextlib.suppress(OSError):
                        started.stderr.close()
            raise RuntimeError(
                f"worker process {label} could not be started on host {socket.gethostname()}: {exc}"
            ) from None
        popens.append(popen)
    prefix = bool(_config.get("prefix_with_rank"))
    # Their stderr to this daemon's, each line with its rank on this host, copied from the
    # start (no handshake on it; a chatty start never blocks on a full pipe).
    OutputForwarder(
        [popen.stderr for popen in popens],
        [rank_prefix(rank) if prefix else b"" for rank in range(len(popens))],
        copy_to_stderr,
    ).start()
    pids = read_worker_pids(popens, labels, spawn_timeout())
    if isinstance(pids, str):
        _kill_all_of(popens)
        raise RuntimeError(pids)
    for rank, popen in enumerate(popens):  # its rank on this host, as Monarch's local rank
        forward_output(popen.stdout, rank_prefix(rank) if prefix else b"")
    return [
        _DaemonProc(label, popen, pid.hex())
        for label, popen, pid in zip(labels, popens, pids, strict=True)
    ]


def _fork_worker(zygote: Zygote, command: list[str], env: dict[str, str]) -> Any:
    """A worker forked by this host's zygote (``command`` as for exec): its stderr a pipe
    (forwarded with its rank, as an exec'd worker's), its stdin a pipe this daemon holds
    (``--exit-with-stdin``: it exits when the daemon dies); None when the zygote has gone."""
    read_fd, write_fd = os.pipe()
    try:
        process = zygote.spawn(
            command[3:], target=FORKED_WORKER, env=env, stdin=read_fd, stderr=True
        )
    except ZygoteUnavailableError as exc:
        os.close(write_fd)
        _log.warning("forking workers failed (%s); starting them with exec", exc)
        return None
    finally:
        os.close(read_fd)
    process.stdin = os.fdopen(write_fd, "wb", buffering=0)
    return process


attach_daemon.set_proc_starter(start_procs)  # the daemon's hook: see its doc
