"""The client's side of attached hosts: one ``HostSession`` per host's worker daemon, and the
``RemoteWorkerGroup`` of the workers a ``spawn_procs`` starts through them.

Why this shape (design "Monarch on Chrysalis": a worker host is a node that the attaching
client adopts): the daemon starts worker processes that join under the client's node, exactly
like the client's local workers, so the namespace tree stays the supervision tree. The session
(``attach_protocol``) carries the requests; a heartbeat every ``idle/4`` seconds both ways lets
only a dead peer reach the QUIC idle timeout (``mesh_orphan_timeout``).

- Process death on a remote host: the daemon reaps its workers and sends ``Exited``; the
  session turns it into the group's ``on_exit`` (with the wait status, for the group's
  ``proc_exited`` record), the same process-death handling as for local workers. A lost
  session (the daemon or its host died, or the network is cut) counts as the death of every
  worker of that host.
- ``spawn_on_hosts`` sends one ``Spawn`` per host in parallel (bounded) with each worker's
  ``bootstrap_command`` and numactl options; a failure on any host kills what the others
  started.
- ``detach()`` (client shutdown) lets the daemon wait for the next client; ``end()`` ends its
  loop (``HostMesh.shutdown()``/``kill()``).

``attach_to_workers`` (``host_mesh``) makes the sessions; the daemon is ``attach_daemon``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chrysalis.core import DatagramAddr, Pid
from monarch.actor._base.shape import Extent
from monarch.actor._hosts.attach_protocol import (
    _MAX_LABELS,
    ATTACH_PROTOCOL,
    PROTOCOL_VERSION,
    Detach,
    Exited,
    Hello,
    Kill,
    KillProcs,
    Message,
    Refused,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    Welcome,
    WorkerCommand,
    _Channel,
    _heartbeats,
)
from monarch.actor._hosts.commands import (
    SPAWN_TIMEOUT,
    BootstrapCommand,
    _describe_exit,
    spawn_timeout,
)
from monarch.actor._hosts.groups import ExitCallback, WorkerGroup
from monarch.actor._runtime.client import (
    client,
)
from monarch.actor._runtime.main_module import main_reference
from monarch.actor._runtime.watchdog import (
    HeartbeatDriver,
)
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._hosts.client_node import ClientNodeLayer

__all__ = ["HostSession", "RemoteWorkerGroup", "spawn_on_hosts"]


class HostSession:
    """The client's session with one host's worker daemon (state lives on the client loop)."""

    def __init__(self, layer: ClientNodeLayer, address: str) -> None:
        self.layer = layer
        self.address = address
        self.hostname = ""
        self.host_pid = ""
        self.lost: str | None = None
        self._loop: Any = None
        self._channel: _Channel | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._requests: dict[int, asyncio.Future[Message]] = {}
        self._numbers = itertools.count(1)
        self._procs: dict[str, tuple[WorkerGroup, int]] = {}
        self._early_exits: dict[str, tuple[str, int | None]] = {}
        self._closing = False

    def __repr__(self) -> str:
        return f"<HostSession {self.address} {self.hostname or '?'}>"

    async def connect(self, node: Any, idle: float) -> None:
        self._loop = asyncio.get_running_loop()
        addr = DatagramAddr.parse(self.address)
        peer, stream = await node.transport.dial_link_local_unpinned(addr, ATTACH_PROTOCOL)
        channel = _Channel(stream)
        hello = Hello(
            PROTOCOL_VERSION,
            self.layer.parent_address(str(addr.ip)),
            idle,
            main_reference(),
            socket.gethostname(),
            bool(_config.get("force_quic")),
        )
        await channel.send(hello)
        reply = await channel.recv()
        if isinstance(reply, Refused):
            channel.close()
            raise RuntimeError(f"worker {self.address} refused the attach: {reply.reason}")
        if not isinstance(reply, Welcome):
            channel.abort()
            raise RuntimeError(f"worker {self.address} answered {type(reply).__name__}")
        self.host_pid = peer.hex()
        self.hostname = reply.hostname
        self._channel = channel
        self._tasks = [
            asyncio.create_task(self._read_loop(channel)),
            asyncio.create_task(_heartbeats(channel, idle / 4)),
        ]

    async def _read_loop(self, channel: _Channel) -> None:
        why = "the session stream ended"
        try:
            while True:
                message = await channel.recv()
                if isinstance(message, Spawned | SpawnFailed):
                    waiter = self._requests.pop(message.request, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(message)
                elif isinstance(message, Exited):
                    reason = (
                        f"process {message.label} (os pid {message.os_pid} on host "
                        f"{self.hostname}) {_describe_exit(message.status)}"
                    )
                    self._exited(message.pid, reason, status=message.status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self._on_lost(f"host {self.address} ({self.hostname}) was lost: {why}")

    def _exited(
        self, pid: str, reason: str, expected: bool = False, status: int | None = None
    ) -> None:
        """Worker ``pid`` is gone: ``status`` (its wait status) where its daemon reaped it,
        None where the session was lost."""
        entry = self._procs.pop(pid, None)
        if entry is None:
            self._early_exits[pid] = (reason, status)
            while len(self._early_exits) > _MAX_LABELS:
                del self._early_exits[next(iter(self._early_exits))]
            return
        group, rank = entry
        group.on_exit(rank, reason, expected=expected, status=status)

    def _on_lost(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        for waiter in self._requests.values():
            if not waiter.done():
                waiter.set_exception(RuntimeError(reason))
        self._requests.clear()
        for pid in list(self._procs):
            self._exited(pid, reason, expected=self._closing)

    def register(self, pid: str, group: WorkerGroup, rank: int) -> None:
        """Route ``Exited`` for ``pid`` to ``group`` (call on the client loop)."""
        self._procs[pid] = (group, rank)
        early = self._early_exits.pop(pid, None)
        if early is None and self.lost is not None:
            early = (self.lost, None)
        if early is not None:
            self._exited(pid, early[0], status=early[1])

    async def spawn(
        self,
        labels: list[str],
        commands: list[WorkerCommand | None] | None = None,
        numactl: list[list[str]] | None = None,
    ) -> Spawned:
        if self.lost is not None:
            raise RuntimeError(self.lost)
        if self._closing or self._channel is None:
            raise RuntimeError(f"the session with host {self.address} is closed")
        number = next(self._numbers)
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._requests[number] = waiter
        try:
            await self._channel.send(Spawn(number, labels, commands, numactl))
            reply = await asyncio.wait_for(waiter, max(SPAWN_TIMEOUT, spawn_timeout()) + 5)
        finally:
            self._requests.pop(number, None)
        if isinstance(reply, SpawnFailed):
            raise RuntimeError(f"host {self.address} ({self.hostname}): {reply.reason}")
        assert isinstance(reply, Spawned)
        if len(reply.pids) != len(labels) or len(reply.os_pids) != len(labels):
            raise RuntimeError(f"host {self.address} answered a spawn with the wrong count")
        return reply

    def send_soon(self, message: Message) -> None:
        """Send ``message`` from any thread (dropped once the session is gone)."""

        async def send() -> None:
            if self._channel is not None and self.lost is None:
                with contextlib.suppress(Exception):
                    await self._channel.send(message)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(send(), self._loop)

    async def _close(self, last: Message) -> None:
        self._closing = True
        channel, self._channel = self._channel, None
        if channel is not None and self.lost is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.send(last), 2.0)
            channel.close()
        for task in self._tasks:
            task.cancel()
        self._on_lost(f"the client left host {self.address}")

    async def detach(self) -> None:
        """Leave the host (client shutdown): its daemon waits for the next client."""
        await self._close(Detach())

    def end(self, *, kill: bool) -> None:
        """End the host's worker loop (any thread, bounded): ``Shutdown`` or ``Kill``."""
        if self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(
            self._close(Kill() if kill else Shutdown()), self._loop
        )
        with contextlib.suppress(Exception):
            future.result(5.0)


class RemoteWorkerGroup(WorkerGroup):
    """The workers of one ``spawn_procs`` on attached hosts (rank order: host-major)."""

    def __init__(
        self,
        labels: Sequence[str],
        on_exit: ExitCallback,
        watchdog: Callable[[], HeartbeatDriver | None] = lambda: None,
    ) -> None:
        super().__init__(labels, on_exit, watchdog)
        self.hosts: list[HostSession] = []
        self.os_pids: list[int] = []

    def _where(self, rank: int) -> str:
        return f" (os pid {self.os_pids[rank]} on host {self.hosts[rank].hostname})"

    def _kill_ranks(self, ranks: Sequence[int]) -> None:
        by_host: dict[int, tuple[HostSession, list[str]]] = {}
        for rank in ranks:
            session = self.hosts[rank]
            by_host.setdefault(id(session), (session, []))[1].append(self.pids[rank].hex())
        for session, pids in by_host.values():
            session.send_soon(KillProcs(pids))


def spawn_on_hosts(
    layer: ClientNodeLayer,
    hosts: Sequence[HostSession],
    extent: Extent,
    local: Extent,
    mesh_name: str,
    *,
    commands: Sequence[BootstrapCommand | None] | None = None,
    numactl: Sequence[Sequence[str]] | None = None,
) -> RemoteWorkerGroup:
    """Start ``local.nelements`` workers on every host of ``hosts`` (in parallel, bounded).
    ``commands`` and ``numactl`` (per rank, host-major; numactl as ``commands.ProcBinding``
    makes it: the program, then its options) travel in ``Spawn``; each daemon finds numactl
    on its own host."""
    labels = [f"{mesh_name}{point}" for point in extent.points()]
    per = local.nelements
    loop = client().loop.loop
    wire = (
        None if commands is None else [None if c is None else WorkerCommand.of(c) for c in commands]
    )
    options = None if numactl is None else [list(prefix[1:]) for prefix in numactl]

    def part(values: list[Any] | None, index: int) -> list[Any] | None:
        return None if values is None else values[index * per : (index + 1) * per]

    futures = [
        asyncio.run_coroutine_threadsafe(
            host.spawn(labels[i * per : (i + 1) * per], part(wire, i), part(options, i)), loop
        )
        for i, host in enumerate(hosts)
    ]
    group = RemoteWorkerGroup(labels, layer.process_died, layer.current_watchdog)
    for rank in range(len(labels)):  # asked of its host's daemon
        group.record("proc_starting", rank, f"on host {hosts[rank // per].address}")
    replies: list[Spawned] = []
    errors: list[str] = []
    for host, future in zip(hosts, futures, strict=True):
        try:
            replies.append(future.result(max(SPAWN_TIMEOUT, spawn_timeout()) + 10))
        except Exception as exc:
            errors.append(f"{exc}" or f"host {host.address}: {type(exc).__name__}")
    if errors:
        for host, reply in zip(hosts, replies, strict=False):
            host.send_soon(KillProcs(list(reply.pids)))
        for rank in range(len(labels)):
            group.record_exit(rank, "spawn_procs failed")
        raise RuntimeError(f"spawn_procs failed: {'; '.join(errors)}")
    for host, reply in zip(hosts, replies, strict=True):
        for pid, os_pid in zip(reply.pids, reply.os_pids, strict=True):
            group.pids.append(Pid(bytes.fromhex(pid)))
            group.hosts.append(host)
            group.os_pids.append(os_pid)
            group.exited.append(threading.Event())
    for rank in range(len(labels)):  # its daemon saw its PID line
        group.record("proc_ready", rank)
    with layer._lock:
        layer.groups.append(group)

    def register() -> None:
        for rank, (host, pid) in enumerate(zip(group.hosts, group.pids, strict=True)):
            host.register(pid.hex(), group, rank)

    asyncio.run_coroutine_threadsafe(_call(register), loop).result(SPAWN_TIMEOUT)
    group.watch_liveness()
    return group


async def _call(fn: Callable[[], None]) -> None:
    fn()
