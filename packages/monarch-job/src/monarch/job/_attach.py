"""Attaching a client to an engine's worker loops, retrying while they start.

An engine knows its hosts' addresses before the worker loops on them listen (a Slurm job runs
before its ``srun`` step has started Python; a pod is Ready as soon as its container started),
so the first attach may find nobody there. ``attach_retrying`` first waits (bounded) until no
worker's UDP port is *refused* (a one-byte datagram, which a QUIC endpoint drops, draws an ICMP
port-unreachable while nothing listens): attaching earlier works too but costs the QUIC
handshake's retransmission back-off, seconds. Then it attaches, retrying, bounded, for as long
as the engine says the allocation lives, and names the engine's logs when it gives up.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Callable, Sequence

from monarch.actor import HostMesh, attach_to_workers
from monarch.actor._runtime.client import client

__all__ = ["attach_retrying", "prepare_client", "refused", "wait_listening"]

_log = logging.getLogger("monarch.job")

#: Seconds between attempts.
RETRY_INTERVAL = 0.5
#: Seconds a probe waits for refusals (an ICMP port-unreachable comes back within a round trip:
#: microseconds on one machine, well under a millisecond on a cluster's network; a refusal that
#: comes later only costs a retried attach).
PROBE_WAIT = 0.05
#: Seconds between probes of a refused port (a closed UDP port sends no event when it opens, so
#: this bounds the delay between a worker loop listening and the attach: with ``PROBE_WAIT``
#: under 0.1 s).
PROBE_GAP = 0.025


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("udp://").rpartition(":")
    return host.strip("[]"), int(port)


def refused(addresses: Sequence[str], probe_wait: float = PROBE_WAIT) -> list[str]:
    """The addresses whose UDP port is refused now (nothing listens there), as far as their
    refusals arrive within ``probe_wait`` seconds (on a loaded machine the kernel may deliver
    one later: the port then counts as listening, which costs the attach a retry). An address
    that cannot be probed counts as not refused: the attach will say what is wrong with it."""
    probes: dict[socket.socket, str] = {}
    try:
        for address in addresses:
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            except OSError:
                continue
            probes[sock] = address
            try:
                sock.setblocking(False)
                sock.connect(_host_port(address))
                sock.send(b"\0")
            except (OSError, ValueError):
                del probes[sock]
                sock.close()
        found: list[str] = []
        deadline = time.monotonic() + probe_wait
        waiting = list(probes)
        while waiting and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select(waiting, [], [], left)
            for sock in readable:
                waiting.remove(sock)
                try:
                    sock.recv(64)
                except ConnectionRefusedError:
                    found.append(probes[sock])
                except OSError:
                    pass
        return found
    finally:
        for sock in probes:
            sock.close()


def wait_listening(
    addresses: Sequence[str], timeout: float, probe_wait: float = PROBE_WAIT
) -> list[str]:
    """Wait until no address in ``addresses`` is refused (see ``refused``), at most
    ``timeout`` seconds; the ones still refused."""
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending:
        pending = refused(pending, probe_wait)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(PROBE_GAP)  # a closed UDP port sends no event when it opens
    return pending


def prepare_client() -> None:
    """Start this client's runtime and node now (what the first attach starts otherwise), for
    an engine that waits for its worker loops to start: the work moves off the path from the
    last worker listening to a ready mesh. A failure here is left for the attach to report."""
    try:
        runtime = client()
        runtime.node_layer.ensure_started(runtime)
    except Exception as exc:  # the attach reports it, with the job's context
        _log.debug("the client's node did not start ahead of the attach: %s", exc)


def attach_retrying(
    name: str,
    workers: Sequence[str],
    *,
    ca: str,
    alive: Callable[[], bool],
    timeout: float,
    where: str,
    listening: bool = False,
) -> HostMesh:
    """``attach_to_workers(workers)`` as mesh ``name``, retried until ``timeout`` seconds passed
    or ``alive()`` says the allocation ended; ``RuntimeError`` naming ``where`` (the job and its
    logs) and the last failure then. ``listening``: the workers are known to listen (they said
    so), so the first attempt skips the probe of their ports."""
    deadline = time.monotonic() + timeout
    while True:
        if not listening:
            closed = wait_listening(workers, max(0.0, deadline - time.monotonic()))
            if closed:
                _log.info("mesh %s: nothing listens yet on %s", name, closed)
        listening = False
        try:
            return attach_to_workers(workers=list(workers), ca=ca, name=name)
        except RuntimeError as exc:
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(
                    f"mesh {name!r} of {where} could not attach to its worker loops "
                    f"{list(workers)}: {exc}"
                ) from exc
            _log.info("mesh %s: the worker loops are not ready yet (%s); retrying", name, exc)
            time.sleep(RETRY_INTERVAL)
