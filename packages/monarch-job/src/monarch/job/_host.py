"""A job's host: ``python -m monarch.job._host --listen udp://IP:PORT [--ready-fd N]
[--address-file PATH] [--advertise IP] [--ca DIR] [--forked] [--netns NAME] [--ready-stdout]
[--log PATH]`` (also run as ``main(argv)`` in a process forked by a zygote: ``ProcessJob``).

It runs this host's Monarch worker loop (the worker daemon of ``run_worker_loop_forever``) and
reports the address clients attach to once it listens: as one line on the inherited file
descriptor ``--ready-fd`` (then closed: a launcher on the same machine waits on that pipe, no
polling) and/or atomically written to ``--address-file`` (a scheduler's shared directory). A
wildcard ``--listen`` (``udp://0.0.0.0:0``) reports a routable address of this host (the
worker loop's advertised address, ``--advertise`` to choose it). Its stdout/stderr carry the
worker loop's log and the output of the worker processes it starts.
"""

from __future__ import annotations

import gc
import sys

# Run with exec (``python -m``: where the client cannot fork its hosts), this process's
# start-up is on the path of the job's ``apply()``, and importing the stack is most of it: as
# in ``_host_worker``, it imports what listening needs in an import window
# (``chrysalis._startup.import_window``) and ``monarch.actor``'s facade only on the first
# ``Spawn``. Imported (a forked host, tests), nothing changes.
_STARTING_AS_MAIN = __name__ == "__main__" and gc.isenabled()
if _STARTING_AS_MAIN:
    from chrysalis._startup import DeferredPackage, import_window

    _window = import_window()
    _window.__enter__()
    # (a program's sitecustomize may have imported it: then it is simply there)
    _facade = None if "monarch.actor" in sys.modules else DeferredPackage("monarch.actor")
try:
    import argparse
    import asyncio
    import atexit
    import contextlib
    import logging
    import os
    import stat
    from collections.abc import Sequence

    from monarch.actor._hosts.attach_daemon import WorkerDaemon, set_spawn_imports
    from monarch.actor._hosts.attach_protocol import _ca_directory, _udp_address
    from monarch.config import _registry as _config
finally:
    if _STARTING_AS_MAIN:
        _window.__exit__(None, None, None)

__all__ = ["main"]

_log = logging.getLogger("monarch.job.host")


def _write_file(path: str, address: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{address}\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monarch.job._host")
    parser.add_argument("--listen", required=True, help="udp://IP:PORT (or tcp://) to listen on")
    parser.add_argument("--ready-fd", type=int, help="write the address there, then close it")
    parser.add_argument("--address-file", help="write the address to this file (atomically)")
    parser.add_argument("--advertise", help="the IP clients reach this host at (default: found)")
    parser.add_argument("--ca", default="trust_all_connections", help="the cluster CA directory")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--forked",
        action="store_true",
        help="forked from a client (ProcessJob's zygote): a session of its own, none of the "
        "client's runtime configuration, log handlers or exit handlers",
    )
    parser.add_argument("--netns", help="enter this network namespace (ip netns) first")
    parser.add_argument("--ready-stdout", action="store_true", help="the address on stdout")
    parser.add_argument("--log", help="stderr (and stdout once ready) go to this file")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.forked:
        _forget_the_client()
    if _STARTING_AS_MAIN and _facade is not None:
        set_spawn_imports(_facade.run)  # monarch.actor's facade on the first Spawn
    if args.netns:
        from chrysalis.node.netns import enter_netns  # only here: shutil, secrets, ipaddress...

        enter_netns(args.netns)
    if args.log:
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        if not args.ready_stdout:
            os.dup2(fd, 1)
        os.close(fd)
    logging.basicConfig(level=args.log_level, format="[job-host] %(name)s: %(message)s", force=True)
    daemon = WorkerDaemon(
        _udp_address(args.listen, any_port=True), _ca_directory(args.ca), advertise=args.advertise
    )

    def ready(address: str) -> None:
        _log.info("worker loop ready at %s", address)
        if args.address_file:
            _write_file(args.address_file, address)
        if args.ready_fd is not None:
            with os.fdopen(args.ready_fd, "w") as out:
                out.write(f"{address}\n")
        if args.ready_stdout:
            sys.stdout.write(f"{address}\n")
            sys.stdout.flush()
            if args.log:  # the launcher's pipe is done: worker output goes to the log
                os.dup2(2, 1)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(daemon.serve(ready))
    return 0


def _forget_the_client() -> None:
    """Begin as an exec'd host would, in a process forked from a client: its own session
    (``ProcessJob.kill`` ends it whole), configuration only from the environment, and none of
    the client's exit handlers (its atexit would end *this* process's job)."""
    # forked from a client: its runtime is imported already (a host started with exec
    # imports none of it before listening)
    from monarch.actor._runtime import logging as runtime_logging

    os.setsid()
    _config.clear_runtime_config()
    runtime_logging.uninstall_system_logging()
    atexit._clear()
    _drop_inherited_sockets()


def _drop_inherited_sockets() -> None:
    """Replace every socket inherited from the client (its node's carrier, lane listeners,
    event-loop wakers) by ``/dev/null`` at the same descriptor: a host outlives its client, and
    must not keep the client's ports bound. Replaced, not closed: the client's socket objects
    copied into this process may still close their descriptor number some day."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            if fd <= 2 or fd == devnull:
                continue
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.dup2(devnull, fd, inheritable=False)
            except OSError:
                continue
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
