"""A job's host: ``python -m monarch.job._host --listen udp://IP:PORT [--ready-fd N]
[--address-file PATH] [--advertise IP] [--ca DIR]``.

It runs this host's Monarch worker loop (the worker daemon of ``run_worker_loop_forever``) and
reports the address clients attach to once it listens: as one line on the inherited file
descriptor ``--ready-fd`` (then closed: a launcher on the same machine waits on that pipe, no
polling) and/or atomically written to ``--address-file`` (a scheduler's shared directory). A
wildcard ``--listen`` (``udp://0.0.0.0:0``) reports a routable address of this host (the
worker loop's advertised address, ``--advertise`` to choose it). Its stdout/stderr carry the
worker loop's log and the output of the worker processes it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from monarch.actor._hosts.attach_daemon import WorkerDaemon
from monarch.actor._hosts.attach_protocol import _ca_directory, _udp_address

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
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="[job-host] %(name)s: %(message)s")
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

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(daemon.serve(ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
