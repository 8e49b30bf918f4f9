"""A host's worker daemon: ``run_worker_loop_forever`` (and its variants) and
``python -m monarch.actor._attach --address udp://IP:PORT``.

Why this shape (design "Monarch on Chrysalis": a worker host is a node that the attaching
client adopts):

- A worker daemon is a Chrysalis root node listening on the UDP address it was given. It
  serves one link-local protocol, ``monarch.host.v1`` (``attach_protocol``): a *session* with
  one client at a time. It runs no actors itself; on the client's request it starts worker
  processes (``python -m monarch.actor._worker``) that join **under the client's node**,
  exactly like the client's local workers, so the client is every worker's parent, and a
  worker whose parent link is gone exits.
- Trust: both ends authenticate with TLS leaves of the same *cluster CA*, the development CA
  directory (``ca="trust_all_connections"``, the default: ``$CHRYSALIS_DEV_CA_DIR`` else the
  per-user ``<tmp>/chrysalis-dev-ca-<uid>``), or an explicit CA directory (``ca=PATH``, holding
  ``ca.pem`` and ``ca.key``). The daemon issues its own leaf and its workers' leaves from it.
  A peer that does not chain to those roots cannot complete the QUIC handshake.
- Workers fork from the daemon's zygote (``zygote``: every module imported, as a client's local
  workers are), unless a custom ``bootstrap_command`` or numactl needs an exec; their stdin is
  still a pipe the daemon holds. Starting them is ``attach_procs``, which registers itself here
  (``set_proc_starter``): this module imports nothing of it, so a worker loop entry point can
  listen and be attached before it imports that and the facade (``set_spawn_imports``: on the
  first ``Spawn``), which is the critical path of a cluster job's ``apply()``.
- Process death: the daemon reaps its workers and sends ``Exited``. It SIGKILLs the workers of
  a lost client at once, and the workers watch the daemon through a stdin pipe
  (``--exit-with-stdin``): no worker outlives its host daemon or its client.
- ``spawn_procs`` options: ``Spawn`` may carry each worker's ``bootstrap_command`` and numactl
  options; the daemon starts the worker with them exactly as the client starts local ones
  (``commands.exec_spec``), resolving ``numactl`` on its own host, after checking their bounds
  and shape (``spawn_problem``; ``SpawnFailed`` otherwise). Running a client's command grants
  the client nothing new: it is authenticated and can already run any code in the workers.
- Addresses: ``udp://IP:PORT``, or Monarch's ``tcp://HOST:PORT``, which means the same host and
  port number over UDP (every process here speaks QUIC over UDP), so a Monarch program passing
  one ``tcp://`` string to ``run_worker_loop_forever`` and ``attach_to_workers`` runs unchanged.
  A wildcard bind (``udp://0.0.0.0:PORT``) reports and advertises a routable address of the
  host (the default route's interface, see ``chrysalis.node._advertise``; ``--advertise IP``).
- Lifecycle: ``HostMesh.stop()`` keeps the session; ``shutdown()`` ends the loop once the
  procs stopped; ``kill()`` SIGKILLs the workers and ends the loop at once. A client that exits
  *detaches*: the daemon kills leftovers and waits for the next client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from chrysalis.node import Node
from chrysalis.quic import DevelopmentIdentityProvider, QuicConfig
from monarch.actor._base.future import Future, _Cell
from monarch.actor._hosts.attach_protocol import (
    _TRUST_ALL,
    ATTACH_PROTOCOL,
    ATTACH_TIMEOUT,
    MAX_HOST_PROCS,
    PROTOCOL_VERSION,
    Detach,
    Exited,
    Hello,
    Kill,
    KillProcs,
    Refused,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    Welcome,
    _ca_directory,
    _Channel,
    _heartbeats,
    _udp_address,
    spawn_problem,
)
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from chrysalis.core import Pid

__all__ = [
    "START_TIMEOUT",
    "WorkerDaemon",
    "main",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "start_worker_loop_forever",
]

_log = logging.getLogger("monarch.actor.attach.daemon")

#: Starts the workers of a checked ``Spawn`` on a thread: ``attach_procs.start_procs``, set by
#: that module when it is imported (``set_proc_starter``). Not imported from here: what starting
#: workers needs (the zygote, worker groups, most of the stack above the node) is not needed
#: to listen and be attached, which is the critical path of a cluster job's ``apply()``.
ProcStarter = Callable[[Path, "Pid", Hello, Spawn], list["_DaemonProc"]]
_proc_starter: ProcStarter | None = None
#: Imports what registers the starter, called on a thread before the first ``Spawn`` when none
#: is registered (``set_spawn_imports``; the facade's import registers it, so only a worker
#: loop entry point that listened before importing the facade sets this).
_spawn_imports: Callable[[], object] | None = None


def set_proc_starter(starter: ProcStarter) -> None:
    """Register how this process's worker daemons start workers (``attach_procs``)."""
    global _proc_starter
    _proc_starter = starter


def set_spawn_imports(load: Callable[[], object] | None) -> None:
    """Register the import that makes this process able to start workers (its first ``Spawn``
    runs it, on a thread, unless a starter is registered by then); None: none."""
    global _spawn_imports
    _spawn_imports = load


# ---------------------------------------------------------------------------------------------
# The worker daemon (one per host)
# ---------------------------------------------------------------------------------------------
class _DaemonProc:
    __slots__ = ("label", "os_pid", "pid", "popen")

    def __init__(self, label: str, popen: Any, pid: str) -> None:  # Popen or ZygoteProcess
        self.label = label
        self.popen = popen
        self.pid = pid
        self.os_pid = popen.pid


class WorkerDaemon:
    """The worker loop of one host (see the module docstring): ``await serve()`` runs it
    until a client asks it to end; ``ready(address)`` is called once it listens."""

    def __init__(
        self,
        address: str,
        ca_dir: Path,
        *,
        idle_timeout: float | None = None,
        advertise: str | None = None,
    ) -> None:
        self.address = address
        self.advertise = advertise
        self.ca_dir = ca_dir
        self.idle = float(
            idle_timeout if idle_timeout is not None else _config.get("mesh_orphan_timeout")
        )
        self._done: asyncio.Event | None = None
        self._session: asyncio.Task[None] | None = None
        self._session_client: Pid | None = None
        self._procs: dict[str, _DaemonProc] = {}
        self._killed = False

    async def serve(self, ready: Callable[[str], None] | None = None) -> None:
        identity = DevelopmentIdentityProvider(self.ca_dir).issue_identity()
        self._done = asyncio.Event()
        node = Node.serve(
            identity,
            self.address,
            quic_config=QuicConfig(idle_timeout=self.idle, keepalive_interval=self.idle / 4),
            advertise=self.advertise,
        )
        node.register_link_protocol(ATTACH_PROTOCOL, self._on_stream)
        async with node:
            # A wildcard bind (udp://0.0.0.0:PORT) reports a routable address of this host.
            self.address = str(node.advertised_addr)
            _log.info("monarch worker loop %s listening on %s", identity.pid.hex(), self.address)
            if ready is not None:
                ready(self.address)
            try:
                await self._done.wait()
            finally:
                self._kill_all()
                if self._session is not None and not self._killed:
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(asyncio.shield(self._session), 2.0)

    def _finish(self) -> None:
        if self._done is not None:
            self._done.set()

    async def _on_stream(self, peer: Pid, stream: Any) -> None:
        channel = _Channel(stream)
        try:
            hello = await asyncio.wait_for(channel.recv(), ATTACH_TIMEOUT)
        except Exception as exc:
            _log.warning("an attach from %s failed before its hello: %s", peer.hex(), exc)
            return
        refusal = None
        if not isinstance(hello, Hello):
            refusal = f"expected a Hello, got {type(hello).__name__}"
        elif hello.version != PROTOCOL_VERSION:
            refusal = f"protocol version {hello.version} is not {PROTOCOL_VERSION}"
        elif self._session is not None and not self._session.done():
            if self._session_client == peer:  # the same client attaches again: replace
                self._session.cancel()
                with contextlib.suppress(BaseException):
                    await self._session
            else:
                assert self._session_client is not None
                refusal = f"this host is attached to client {self._session_client.hex()}"
        if refusal is not None or not isinstance(hello, Hello):
            with contextlib.suppress(Exception):
                await channel.send(Refused(refusal or "bad hello"))
            return
        self._session_client = peer
        self._session = asyncio.current_task()
        try:
            await self._run_session(peer, channel, hello)
        finally:
            if not self._killed:
                self._kill_all()

    async def _run_session(self, peer: Pid, channel: _Channel, hello: Hello) -> None:
        await channel.send(Welcome(socket.gethostname(), os.getpid(), self.address))
        _log.info("attached to client %s at %s", peer.hex(), hello.address)
        beat = asyncio.create_task(_heartbeats(channel, min(self.idle, hello.idle_timeout) / 4))
        spawns: set[asyncio.Task[None]] = set()
        try:
            while True:
                message = await channel.recv()
                if isinstance(message, Spawn):
                    task = asyncio.create_task(self._spawn(channel, peer, hello, message))
                    spawns.add(task)
                    task.add_done_callback(spawns.discard)
                elif isinstance(message, KillProcs):
                    for pid in message.pids:
                        proc = self._procs.get(pid)
                        if proc is not None:
                            _kill(proc.popen)
                elif isinstance(message, Detach):
                    break
                elif isinstance(message, Shutdown):
                    self._finish()
                    break
                elif isinstance(message, Kill):
                    self._killed = True
                    self._kill_all()
                    self._finish()
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.warning("the session with client %s ended: %s", peer.hex(), exc)
        finally:
            beat.cancel()
            for task in spawns:
                task.cancel()
            channel.close()

    async def _spawn(self, channel: _Channel, peer: Pid, hello: Hello, request: Spawn) -> None:
        loop = asyncio.get_running_loop()
        if len(self._procs) + len(request.labels) > MAX_HOST_PROCS:
            reason = (
                f"this host already runs {len(self._procs)} of at most {MAX_HOST_PROCS} workers"
            )
            await channel.send(SpawnFailed(request.request, reason))
            return
        problem = spawn_problem(request)
        if problem is not None:
            await channel.send(SpawnFailed(request.request, f"refused spawn: {problem}"))
            return
        starting = loop.run_in_executor(None, self._start_procs, peer, hello, request)
        try:
            procs = await asyncio.shield(starting)
        except asyncio.CancelledError:  # the session ended while they started: none survives
            starting.add_done_callback(_kill_started)
            raise
        except Exception as exc:
            await channel.send(SpawnFailed(request.request, str(exc)))
            return
        for proc in procs:
            self._procs[proc.pid] = proc
            threading.Thread(
                target=self._reap, args=(loop, channel, proc), name="monarch-reaper", daemon=True
            ).start()
        await channel.send(
            Spawned(request.request, [p.pid for p in procs], [p.os_pid for p in procs])
        )

    def _start_procs(self, peer: Pid, hello: Hello, request: Spawn) -> list[_DaemonProc]:
        """Start the workers of a checked ``request`` (on a thread): by the registered starter,
        after the imports that register it when that has not happened yet."""
        if _proc_starter is None and _spawn_imports is not None:
            _spawn_imports()
        if _proc_starter is None:
            raise RuntimeError(
                "this worker loop cannot start processes: monarch.actor._hosts.attach_procs "
                "is not imported"
            )
        return _proc_starter(self.ca_dir, peer, hello, request)

    def _reap(self, loop: asyncio.AbstractEventLoop, channel: _Channel, proc: _DaemonProc) -> None:
        status = proc.popen.wait()  # forward_output closes stdout at its end of file
        if proc.popen.stdin is not None:
            with contextlib.suppress(Exception):
                proc.popen.stdin.close()

        def report() -> None:
            if self._procs.pop(proc.pid, None) is None:
                return
            task = loop.create_task(channel.send(Exited(proc.pid, proc.label, proc.os_pid, status)))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody to tell
            loop.call_soon_threadsafe(report)

    def _kill_all(self) -> None:
        procs, self._procs = list(self._procs.values()), {}
        for proc in procs:
            _kill(proc.popen)


def _kill_started(future: asyncio.Future[list[_DaemonProc]]) -> None:
    if not future.cancelled() and future.exception() is None:
        for proc in future.result():
            _kill(proc.popen)


def _kill_all_of(popens: Sequence[Any]) -> None:
    for popen in popens:
        _kill(popen)
    for popen in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(5.0)
        for pipe in (popen.stdin, popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _kill(popen: Any) -> None:
    if popen.poll() is None:
        with contextlib.suppress(OSError):
            popen.kill()


def run_worker_loop_forever(
    *, address: str, ca: str | os.PathLike[str] = _TRUST_ALL, private_key: Any = None
) -> None:
    """Run this host's worker loop on ``address`` (``udp://IP:PORT``, or Monarch's
    ``tcp://HOST:PORT``: the same host and port over UDP) until a client ends it
    with ``HostMesh.shutdown()`` or ``kill()`` (or the process is interrupted).

    ``ca`` is where the cluster CA lives (``"trust_all_connections"``: the development CA
    directory, ``$CHRYSALIS_DEV_CA_DIR`` or the per-user default; else a CA directory); the
    client must have been started with the same CA. ``private_key`` (TLS material of the
    reference's TLS transports) is not supported: ``NotImplementedError``.
    """
    if private_key is not None:
        raise NotImplementedError("run_worker_loop_forever(private_key=...) is not supported")
    daemon = WorkerDaemon(_udp_address(address, any_port=True), _ca_directory(ca))
    asyncio.run(daemon.serve())


def run_worker_loop_until_shutdown(
    *, address: str, ca: str | os.PathLike[str] = _TRUST_ALL, private_key: Any = None
) -> None:
    """Run this host's worker loop on ``address`` and return once the client that owns it
    ends it with ``HostMesh.shutdown()`` (or ``kill()``): the process goes on afterwards.

    Arguments as ``run_worker_loop_forever``.
    """
    if private_key is not None:
        raise NotImplementedError(
            "run_worker_loop_until_shutdown(private_key=...) is not supported"
        )
    daemon = WorkerDaemon(_udp_address(address, any_port=True), _ca_directory(ca))
    asyncio.run(daemon.serve())


#: Seconds ``start_worker_loop_forever`` waits for its worker loop to listen.
START_TIMEOUT: Final = 30.0


def start_worker_loop_forever(
    *, address: str, ca: str | os.PathLike[str] = _TRUST_ALL, private_key: Any = None
) -> Future[None]:
    """Start this host's worker loop on ``address`` in the background and return a future of
    its lifetime: it resolves when a client ends the loop (``HostMesh.shutdown()``/``kill()``)
    and fails if the loop fails.

    The loop listens before this returns (``RuntimeError`` if it cannot start within
    ``START_TIMEOUT``, naming why); it keeps running if the future is dropped. Arguments as
    ``run_worker_loop_forever``. The loop runs on its own thread and event loop, so the
    calling program goes on (and may itself be a Monarch client of other hosts).
    """
    if private_key is not None:
        raise NotImplementedError("start_worker_loop_forever(private_key=...) is not supported")
    daemon = WorkerDaemon(_udp_address(address, any_port=True), _ca_directory(ca))
    cell: _Cell[None] = _Cell()
    listening = threading.Event()

    def run() -> None:
        try:
            asyncio.run(daemon.serve(lambda _: listening.set()))
        except BaseException as exc:
            cell.set_exception(exc)
        else:
            cell.set_result(None)
        finally:
            listening.set()

    threading.Thread(target=run, name="monarch-worker-loop", daemon=True).start()
    if not listening.wait(START_TIMEOUT):
        raise RuntimeError(f"the worker loop on {address} did not listen within {START_TIMEOUT} s")
    if cell.done():
        ok, outcome = cell.outcome()
        if not ok:
            raise RuntimeError(f"the worker loop on {address} could not start: {outcome}")
    return Future._create(cell)


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# ``python -m monarch.actor._attach --address udp://IP:PORT``
# ---------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run a worker loop; print its bound address as the first stdout line."""
    parser = argparse.ArgumentParser(prog="python -m monarch.actor._attach")
    parser.add_argument(
        "--address", required=True, help="udp://IP:PORT (or tcp://) to listen on (port 0: any)"
    )
    parser.add_argument("--advertise", help="the IP clients reach this host at (wildcard binds)")
    parser.add_argument("--ca", default=_TRUST_ALL, help="the cluster CA directory")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="[worker-loop] %(name)s: %(message)s")
    daemon = WorkerDaemon(
        _udp_address(args.address, any_port=True),
        _ca_directory(args.ca),
        advertise=args.advertise,
    )

    def ready(address: str) -> None:
        sys.stdout.write(f"{address}\n")
        sys.stdout.flush()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(daemon.serve(ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
