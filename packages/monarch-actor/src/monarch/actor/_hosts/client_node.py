"""The client's node layer: its identity, and (lazily) its root node, transport and worker groups.

Why it looks like this (design "Monarch on Chrysalis"): every Monarch process is one Chrysalis
Node and the namespace tree is the supervision tree.

- Identity: the client's leaf is issued at bootstrap from the *cluster CA*, the development CA
  directory every Chrysalis tool uses (``$CHRYSALIS_DEV_CA_DIR``, else
  ``<tmp>/chrysalis-dev-ca-<uid>``, created mode 0700 on first use). Local workers issue their
  leaves from the same directory and worker daemons on other hosts
  (``run_worker_loop_forever``) from a copy of it, so every process of a program trusts every
  other one and nothing else. The client's PID is its node's PID from the start, so meshes,
  ports and actor addresses made before any worker exists stay valid. If that directory cannot
  be used (insecure, unreadable) the client falls back to a private in-memory CA written to a
  temporary directory for its local workers (attaching remote hosts then fails with the reason).
- The node (a root, or a child of the node given to ``attach(addr)``) starts lazily, on the
  first ``spawn_procs`` or ``attach_to_workers``. It listens on ``$MONARCH_CLIENT_LISTEN``
  (default ``udp://0.0.0.0:0``: every interface, so hosts started separately can join it);
  local workers are given ``127.0.0.1`` and remote hosts the local address that routes to them.
- The client's ``InProcessFabric`` gets the node's ``NodeProcessTransport`` as its uplink.
- ``process_died``: a worker is gone (its group's ``on_exit``): calls to it fail at once
  (``mark_unreachable``); for a failure every owner of an actor on it and every other process
  of the program is told (``broadcast_proc_death``); and every observer (``observe``) learns
  it: ``nested.NestedProcs`` kills what that process spawned.
- Liveness: the client pings every worker it started (``_runtime.watchdog``); see ``groups``.

The runtime builds one per client through the hook ``set_node_layer`` (set by ``host_mesh``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from cryptography.hazmat.primitives import serialization

from chrysalis.core import DatagramAddr, Pid
from chrysalis.node import JoinSettings, Node
from chrysalis.quic import DevelopmentCA, QuicConfig, default_dev_ca_directory
from monarch.actor._hosts import client_attach as _client_attach
from monarch.actor._hosts.commands import SPAWN_TIMEOUT, source_ip_toward
from monarch.actor._hosts.groups import WorkerGroup
from monarch.actor._runtime.client import (
    _frame_limits,
    broadcast_proc_death,
)
from monarch.actor._runtime.watchdog import (
    HeartbeatDriver,
)
from monarch.actor._transport.node import NodeProcessTransport
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._hosts.attach_session import HostSession
    from monarch.actor._runtime.client import (
        _Client,
    )

__all__ = ["CLIENT_LISTEN_ENV", "ClientNodeLayer", "ProcessObserver"]

#: Environment variable: the carrier address the client's node listens on.
CLIENT_LISTEN_ENV: Final = "MONARCH_CLIENT_LISTEN"
_DEFAULT_LISTEN: Final = "udp://0.0.0.0:0"
#: Observers one node layer may have.
MAX_OBSERVERS: Final = 64
_log = logging.getLogger("monarch.actor.host.client_node")

_O = TypeVar("_O")


class ProcessObserver(Protocol):
    """What ``ClientNodeLayer.observe`` takes: told of every process gone, and of the end."""

    def process_gone(self, pid: Pid) -> None:
        """A process of the program is gone (any thread, once per process)."""

    def clear(self) -> None:
        """The client runtime shuts down (every process is killed anyway)."""


class ClientNodeLayer:
    """The client's identity, and (lazily) its root node, transport and worker groups."""

    def __init__(self) -> None:
        directory = default_dev_ca_directory()
        self.cluster_ca_dir: Path | None = directory
        self.ca_problem = ""
        try:
            self._ca = DevelopmentCA.load_or_create(directory)
        except (OSError, ValueError) as exc:  # IdentityError is a ValueError
            self.ca_problem = f"the cluster CA directory {directory} cannot be used: {exc}"
            _log.warning("%s; using a private in-memory CA", self.ca_problem)
            self.cluster_ca_dir = None
            self._ca = DevelopmentCA.create("monarch client CA")
        self.identity = self._ca.issue()
        self._lock = threading.Lock()
        self._node: Any = None
        self._client: _Client | None = None
        self.transport: NodeProcessTransport | None = None
        self.ca_dir: Path | None = self.cluster_ca_dir
        self._temporary_ca = False
        self.groups: list[WorkerGroup] = []
        self.watchdog: HeartbeatDriver | None = None
        """Heartbeats to the workers (started with the node)."""
        self.sessions: list[HostSession] = []
        self.closed = False
        self._observers: list[ProcessObserver] = []

    def observe(self, observer: ProcessObserver) -> None:
        """Tell ``observer`` of every process gone from now on, and of the shutdown."""
        with self._lock:
            if len(self._observers) >= MAX_OBSERVERS:
                raise RuntimeError(f"at most {MAX_OBSERVERS} observers per node layer")
            self._observers.append(observer)

    def observer(self, kind: type[_O]) -> _O:
        """The observer of type ``kind`` (``LookupError`` if none subscribed)."""
        with self._lock:
            for each in self._observers:
                if isinstance(each, kind):
                    return each
        raise LookupError(f"no {kind.__name__} observes this node layer")

    def current_watchdog(self) -> HeartbeatDriver | None:
        """The heartbeat driver of the moment (``None`` before the node started)."""
        return self.watchdog

    @property
    def pid(self) -> Pid:
        """The client's PID (its node's, once started)."""
        return self.identity.pid

    @property
    def ca_certificate_pem(self) -> bytes:
        """The client's CA certificate (what every process of the program must trust)."""
        return self._ca.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def node(self) -> Any:
        """The started node (``RuntimeError`` before ``ensure_started``)."""
        if self._node is None:
            raise RuntimeError("the client's node is not started")
        return self._node

    def ensure_started(self, client: _Client) -> tuple[str, str, Path]:
        """Start the node once; return (local parent address, authority hex, CA directory)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the client runtime was shut down")
            if self._node is None:
                if self.ca_dir is None:
                    self.ca_dir = self._write_ca()
                    self._temporary_ca = True
                self._client = client
                self._node, self.transport = asyncio.run_coroutine_threadsafe(
                    self._start(client), client.loop.loop
                ).result(SPAWN_TIMEOUT)
                client.fabric.uplink = self.transport
                self.watchdog = HeartbeatDriver(client.runtime, client.loop)
            assert self.ca_dir is not None
            return self.parent_address(None), self.pid.hex(), self.ca_dir

    def parent_address(self, toward: str | None) -> str:
        """The node's address as a process at ``toward`` (an IP; ``None``: this host) dials
        it: a wildcard bind is replaced by the loopback or by the route's source address."""
        addr = self.node.local_addr
        if addr.scheme != "udp" or not addr.ip.is_unspecified:
            return str(addr)
        ip = "127.0.0.1" if toward is None else source_ip_toward(toward)
        return f"udp://{ip}:{addr.port}"

    def _write_ca(self) -> Path:
        directory = Path(tempfile.mkdtemp(prefix="monarch-ca-"))  # mode 0700
        key = self._ca.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for name, data in (("ca.key", key), ("ca.pem", self.ca_certificate_pem)):
            fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        return directory

    async def _start(self, client: _Client) -> tuple[Any, NodeProcessTransport]:
        idle = float(_config.get("mesh_orphan_timeout"))
        listen = os.environ.get(CLIENT_LISTEN_ENV) or _DEFAULT_LISTEN
        quic = QuicConfig(idle_timeout=idle, keepalive_interval=idle / 4)
        parent = _client_attach.attached_to()
        if parent is None:
            node = Node.serve(self.identity, listen, quic_config=quic)
            await node.__aenter__()
        else:  # ``attach(addr)``: join under that node instead of being a root
            node = Node(
                self.identity,
                listen=listen,
                parent=JoinSettings(DatagramAddr.parse(parent), None),
                quic_config=quic,
            )
            await node.__aenter__()
            try:
                await asyncio.wait_for(node.wait_connected(), _client_attach.ATTACH_TIMEOUT)
            except BaseException as exc:
                await node.aclose()
                raise RuntimeError(
                    f"attach({parent!r}): the client's node could not join there within "
                    f"{_client_attach.ATTACH_TIMEOUT:g} s: {exc or type(exc).__name__}"
                ) from None
        transport = NodeProcessTransport(
            node,
            client.loop,
            deliver=client.fabric.deliver_inbound,
            undeliverable=client.fabric.bounce_inbound,
            limits=_frame_limits,
            hosts=client.fabric.hosts,
            identity=self.identity,
        )
        transport.start()
        return node, transport

    def process_died(self, pid: Pid, reason: str, *, failure: bool, fenced: bool = False) -> None:
        """A worker process is gone (any thread): fail calls to it now and, for a failure,
        tell the owners of its actors and every other process of the program. ``fenced``: it
        was declared dead for not answering heartbeats and may still run (its messages are
        refused from now on, here and in every process told)."""
        watchdog = self.watchdog
        if watchdog is not None:
            watchdog.forget(pid)
        transport = self.transport
        if transport is not None:
            transport.mark_unreachable(pid, reason, fence=fenced)
        for observer in list(self._observers):  # what it spawned from inside dies with it
            observer.process_gone(pid)
        client = self._client
        if not failure or client is None or client.loop.closed:
            return

        with self._lock:
            others = [p for group in self.groups for p in group.live_pids() if p != pid]
        broadcast_proc_death(client, pid, reason, others, fenced=fenced)

    def shutdown(self, client: _Client, timeout: float) -> None:
        """Kill leftover workers, detach from remote hosts, close the transport and node,
        remove a temporary CA directory."""
        with self._lock:
            self.closed = True
            node, self._node = self._node, None
            transport, self.transport = self.transport, None
            groups, self.groups = self.groups, []
            sessions, self.sessions = self.sessions, []
            watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.close()
        for observer in list(self._observers):
            observer.clear()
        for group in groups:
            group.kill()
        if node is not None and not client.loop.closed:

            async def close() -> None:
                for session in sessions:
                    await session.detach()
                if transport is not None:
                    await transport.aclose()
                await node.aclose()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), client.loop.loop).result(timeout)
        client.fabric.uplink = None
        if self._temporary_ca and self.ca_dir is not None:
            shutil.rmtree(self.ca_dir, ignore_errors=True)
