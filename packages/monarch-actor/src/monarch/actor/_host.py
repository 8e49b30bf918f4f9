"""The process layer on the client: its Chrysalis node, worker processes and ``HostMesh``.

Why it looks like this (design "Monarch on Chrysalis"): every Monarch process is one Chrysalis
Node and the namespace tree is the supervision tree.

- The client's identity is a leaf of a development CA created in memory when the client
  bootstraps (a few milliseconds), so the client runtime's PID *is* its node's PID from the
  start and meshes, ports and actor addresses made before any worker exists stay valid. The
  node itself (a root on ``udp://127.0.0.1:0``, on the client's runtime loop) starts lazily,
  on the first ``spawn_procs``; the CA is then written to a private temporary directory
  (mode 0700, removed at client shutdown) from which every worker issues its own leaf.
- ``spawn_procs`` starts one ``python -m monarch.actor._worker`` per rank, each a Node joined
  under the client's node, and waits (bounded) until each printed its PID, i.e. joined. The
  workers get the client's ``sys.path`` as ``PYTHONPATH``: actor classes travel by reference.
- The client's ``InProcessFabric`` gets the node's ``NodeProcessTransport`` as its uplink:
  envelopes for worker PIDs leave through the node; envelopes arriving from workers are
  handed to the fabric member they name.
- A reaper thread per worker turns its exit into ``mark_unreachable``: queued and outstanding
  calls to it, and every later call, fail with ``SupervisionError`` naming the exit status.
- ``ProcMesh.stop()`` on workers sends ``STOP_PROC`` to the live ones (bounded wait), then
  waits for every worker to exit and kills stragglers; it succeeds after workers crashed.
- A worker whose parent link is gone exits (see ``_worker``): killing the client leaves no
  orphans after about twice ``mesh_orphan_timeout`` seconds.

Only the QUIC path through the Node exists (no direct Unix-socket lanes yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from monarch.actor._future import Future, _Cell
from monarch.actor._ids import ProcId
from monarch.actor._main_module import main_reference
from monarch.actor._shape import Extent, MeshTrait, Shape, Slice
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from chrysalis.core import Pid
    from monarch.actor._mesh import ProcMesh
    from monarch.actor._node_transport import NodeProcessTransport
    from monarch.actor._runtime import _Client

__all__ = ["ClientNodeLayer", "HostMesh", "WorkerGroup", "this_host"]

#: Seconds ``spawn_procs`` waits for a worker to join and report its PID.
SPAWN_TIMEOUT: Final = 30.0
#: Seconds a stopping worker may take to exit before it is killed.
EXIT_TIMEOUT: Final = 5.0
_MAX_PROCS: Final = 1024


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


class ClientNodeLayer:
    """The client's identity, and (lazily) its root node, transport and CA directory."""

    def __init__(self) -> None:
        from chrysalis.quic import DevelopmentCA

        self._ca = DevelopmentCA.create("monarch client CA")
        self.identity = self._ca.issue()
        self._lock = threading.Lock()
        self._node: Any = None
        self.transport: NodeProcessTransport | None = None
        self.ca_dir: Path | None = None
        self.groups: list[WorkerGroup] = []
        self.closed = False

    @property
    def pid(self) -> Pid:
        """The client's PID (its node's, once started)."""
        return self.identity.pid

    def ensure_started(self, client: _Client) -> tuple[str, str, Path]:
        """Start the node once; return (parent address, authority hex, CA directory)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the client runtime was shut down")
            if self._node is None:
                self.ca_dir = self._write_ca()
                self._node, self.transport = asyncio.run_coroutine_threadsafe(
                    self._start(client), client.loop.loop
                ).result(SPAWN_TIMEOUT)
                client.fabric.uplink = self.transport
            assert self.ca_dir is not None
            return str(self._node.local_addr), self.pid.hex(), self.ca_dir

    def _write_ca(self) -> Path:
        from cryptography.hazmat.primitives import serialization

        directory = Path(tempfile.mkdtemp(prefix="monarch-ca-"))  # mode 0700
        key = self._ca.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for name, data in (
            ("ca.key", key),
            ("ca.pem", self._ca.certificate.public_bytes(serialization.Encoding.PEM)),
        ):
            fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        return directory

    async def _start(self, client: _Client) -> tuple[Any, NodeProcessTransport]:
        from chrysalis.node import Node
        from chrysalis.quic import QuicConfig
        from monarch.actor._node_transport import NodeProcessTransport
        from monarch.actor._runtime import _frame_limits

        idle = float(_config.get("mesh_orphan_timeout"))
        node = Node.serve(
            self.identity, "udp://127.0.0.1:0", quic_config=QuicConfig(idle_timeout=idle)
        )
        await node.__aenter__()
        transport = NodeProcessTransport(
            node,
            client.loop,
            deliver=client.fabric.deliver_inbound,
            undeliverable=client.fabric.bounce_inbound,
            limits=_frame_limits,
            hosts=client.fabric.hosts,
        )
        transport.start()
        return node, transport

    def shutdown(self, client: _Client, timeout: float) -> None:
        """Kill leftover workers, close the transport and node, remove the CA directory."""
        with self._lock:
            self.closed = True
            node, self._node = self._node, None
            transport, self.transport = self.transport, None
            groups, self.groups = self.groups, []
        for group in groups:
            group.kill()
        if node is not None and not client.loop.closed:

            async def close() -> None:
                if transport is not None:
                    await transport.aclose()
                await node.aclose()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), client.loop.loop).result(timeout)
        client.fabric.uplink = None
        if self.ca_dir is not None:
            shutil.rmtree(self.ca_dir, ignore_errors=True)


class WorkerGroup:
    """The worker processes of one ``spawn_procs`` call and their reapers."""

    def __init__(self, layer: ClientNodeLayer, labels: Sequence[str]) -> None:
        self._layer = layer
        self.labels = list(labels)
        self.popens: list[subprocess.Popen[bytes]] = []
        self.pids: list[Pid] = []
        self.exited: list[threading.Event] = []

    def start(self, parent: str, authority: str, ca_dir: Path) -> None:
        """Start every worker and wait (bounded) for each to report its PID."""
        from chrysalis.core import Pid

        idle = str(float(_config.get("mesh_orphan_timeout")))
        # Workers import what the client can import (actor classes are pickled by reference).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        main_args: list[str] = []
        reference = main_reference()
        if reference is not None:
            main_args = ["--main", f"{reference[0]}:{reference[1]}"]
        for label in self.labels:
            self.popens.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "monarch.actor._worker",
                        "--parent",
                        parent,
                        "--authority",
                        authority,
                        "--ca-dir",
                        str(ca_dir),
                        "--label",
                        label,
                        "--idle-timeout",
                        idle,
                        *main_args,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    env=env,
                )
            )
        deadline = time.monotonic() + SPAWN_TIMEOUT
        for label, popen in zip(self.labels, self.popens, strict=True):
            assert popen.stdout is not None
            ready, _, _ = select.select(
                [popen.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            line = popen.stdout.readline().decode("ascii", "replace").strip() if ready else ""
            try:
                self.pids.append(Pid(bytes.fromhex(line)))
            except ValueError:
                self.kill()
                status = popen.poll()
                why = "did not start in time" if status is None else _describe_exit(status)
                raise RuntimeError(f"worker process {label} {why}") from None
        for label, popen, pid in zip(self.labels, self.popens, self.pids, strict=True):
            event = threading.Event()
            self.exited.append(event)
            threading.Thread(
                target=self._reap, args=(label, popen, pid, event), name="monarch-reaper",
                daemon=True,
            ).start()  # fmt: skip

    def _reap(
        self, label: str, popen: subprocess.Popen[bytes], pid: Pid, event: threading.Event
    ) -> None:
        code = popen.wait()
        if popen.stdout is not None:
            popen.stdout.close()
        event.set()
        transport = self._layer.transport
        if transport is not None:
            transport.mark_unreachable(
                pid, f"process {label} (os pid {popen.pid}) {_describe_exit(code)}"
            )

    def stop(self, ranks: Sequence[int], stop_procs: Future[None] | None) -> Future[None]:
        """Wait for the ``STOP_PROC`` acknowledgements (bounded), then for the workers at
        ``ranks`` to exit; kill those that do not. Resolves to ``None`` in every case."""
        cell: _Cell[None] = _Cell()

        def run() -> None:
            bound = float(_config.get("stop_actor_timeout")) + 2.0
            if stop_procs is not None:
                stop_procs._cell.wait(bound)
            deadline = time.monotonic() + EXIT_TIMEOUT
            for rank in ranks:
                self.exited[rank].wait(max(0.0, deadline - time.monotonic()))
                if not self.exited[rank].is_set():
                    self.popens[rank].kill()
                    self.exited[rank].wait(EXIT_TIMEOUT)
            cell.set_result(None)

        threading.Thread(target=run, name="monarch-proc-stop", daemon=True).start()
        return Future._create(cell)

    def alive(self, rank: int) -> bool:
        """True while the worker at ``rank`` runs."""
        return not self.exited[rank].is_set()

    def kill(self) -> None:
        """SIGKILL every worker still running and reap them (bounded)."""
        for popen in self.popens:
            if popen.poll() is None:
                popen.kill()
        for popen in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(EXIT_TIMEOUT)


class HostMesh(MeshTrait):
    """A mesh of hosts; ``this_host()`` is the client's own host (extent ``{}``).

    ``spawn_procs(per_host)`` starts one worker process per point of ``per_host`` on this
    host and returns the owned ``ProcMesh``; ``shutdown()`` stops every proc mesh spawned from
    this handle and makes it unusable; ``stop()`` stops them and keeps the handle usable.
    """

    def __init__(self, shape: Shape, *, owned: bool, name: str = "host") -> None:
        self._shape = shape
        self._owned = owned
        self._name = name
        self._spawned: list[ProcMesh] = []
        self._shut_down = False
        self._lock = threading.Lock()

    # -- MeshTrait ---------------------------------------------------------------------------
    @property
    def _ndslice(self) -> Slice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, owned=False, name=self._name)

    # -- API -----------------------------------------------------------------------------------
    @property
    def initialized(self) -> Future[bool]:
        """Resolves to ``True`` (the local host is always ready)."""
        return Future._completed(True)

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Any = None,
        name: str | None = None,
        proc_bind: list[dict[str, Any]] | None = None,
        bootstrap_command: Any = None,
    ) -> ProcMesh:
        """Start one worker process per point of ``per_host`` and return their ``ProcMesh``.

        Blocks until every worker joined (bounded by ``SPAWN_TIMEOUT``). ``RuntimeError``
        after ``shutdown``; ``ValueError`` for a label of the host mesh or a bad size;
        ``NotImplementedError`` for ``bootstrap``, ``proc_bind`` and ``bootstrap_command``.
        """
        from monarch.actor._context import _current
        from monarch.actor._mesh import ProcMesh, _adopt, _ProcMeshState
        from monarch.actor._runtime import client

        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        for option, value in (
            ("bootstrap", bootstrap),
            ("proc_bind", proc_bind),
            ("bootstrap_command", bootstrap_command),
        ):
            if value is not None:
                raise NotImplementedError(f"spawn_procs({option}=...) is not supported yet")
        sizes = dict(per_host or {})
        for label, size in sizes.items():
            if not isinstance(label, str) or isinstance(size, bool) or not isinstance(size, int):
                raise TypeError("per_host maps dimension names to int sizes")
            if label in self._shape.labels:
                raise ValueError(f"per_host label {label!r} is already a host mesh label")
            if size < 1:
                raise ValueError(f"per_host size for {label!r} must be at least 1, got {size}")
        extent = Extent(list(sizes), list(sizes.values()))
        if extent.nelements > _MAX_PROCS:
            raise ValueError(f"at most {_MAX_PROCS} processes per spawn_procs call")
        mesh_name = name or "procs"
        c = client()
        layer = c.node_layer
        parent, authority, ca_dir = layer.ensure_started(c)
        group = WorkerGroup(layer, [f"{mesh_name}{point}" for point in extent.points()])
        with layer._lock:
            layer.groups.append(group)
        group.start(parent, authority, ca_dir)
        procs = [ProcId(pid, label) for pid, label in zip(group.pids, group.labels, strict=True)]
        state = _ProcMeshState(group)
        mesh = ProcMesh(procs, Shape.from_extent(extent), owned=True, state=state, name=mesh_name)
        ctx = _current()
        _adopt(ctx._cell if ctx is not None else c.root, mesh)
        with self._lock:
            self._spawned.append(mesh)
        return mesh

    def stop(self) -> Future[None]:
        """Stop every proc mesh spawned from this handle (the handle stays usable)."""
        with self._lock:
            meshes, self._spawned = self._spawned, []
        futures = [m.stop() for m in meshes if m._owned and not m._state.stopped]  # type: ignore[union-attr]
        cell: _Cell[None] = _Cell()

        def run() -> None:
            for future in futures:
                future._cell.wait(float(_config.get("stop_actor_timeout")) + EXIT_TIMEOUT + 2)
            cell.set_result(None)

        threading.Thread(target=run, name="monarch-host-stop", daemon=True).start()
        return Future._create(cell)

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh spawned from this handle; later ``spawn_procs`` raise."""
        if not self._owned:
            raise RuntimeError(
                "HostMesh cannot be shut down: this is a reference instead of owned "
                "(a slice or an unpickled copy)"
            )
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        self._shut_down = True
        return self.stop()

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owned and not self._shut_down:
            await self.shutdown()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_host_mesh, (self._shape, self._name))

    def __repr__(self) -> str:
        owned = "owned" if self._owned else "ref"
        return f"<HostMesh {self._name} {self.extent} ({owned})>"


def _rebuild_host_mesh(shape: Shape, name: str) -> HostMesh:
    return HostMesh(shape, owned=False, name=name)


def this_host() -> HostMesh:
    """The client's host as a host mesh with an empty extent (one per client runtime)."""
    from monarch.actor._runtime import client

    c = client()
    with c.host_lock:
        if c.host_mesh is None or c.host_mesh._shut_down:
            c.host_mesh = HostMesh(Shape.unity(), owned=True)
        return c.host_mesh
