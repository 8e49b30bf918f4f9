"""Device meshes: an activated process mesh, its tensor workers and the client's ordered,
batched stream of commands to them; ``activate()`` (the active-mesh stack itself and
``no_mesh`` are in ``_context``)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from monarch.actor import ProcMesh
from monarch.tensor import _dist
from monarch.tensor import _messages as m
from monarch.tensor._context import issued_at, pushed
from monarch.tensor._stream import get_active_stream, stream_id
from monarch.tensor._table import DEFAULT_CAPACITY
from monarch.tensor._tensor import Tensor, dispatch, meta_empty
from monarch.tensor._worker import MAX_STREAMS, TensorInbox, TensorWorker

__all__ = [
    "Client",
    "DeviceMesh",
    "activate_proc_mesh",
    "coalescing",
    "device_mesh_of",
    "refuse_in_coalescing",
]

_log = logging.getLogger("monarch.tensor")

#: The worker function behind ``DeviceMesh.rank``.
RANK_FUNCTION = "monarch.tensor._worker.coordinate"
#: Commands the client batches at most before sending them.
MAX_BATCH = 512
#: How long the client waits for a worker's answer it needs to go on (process group address).
ANSWER_TIMEOUT_S = 120.0
#: Commands a ``coalescing()`` block holds at most (all sent when it ends).
MAX_COALESCED = 100_000


class _Block:
    """An open ``coalescing()`` block: the one client it holds the work of, and where that
    client's pending commands stood when the block first used it."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.start = 0


#: The open ``coalescing()`` block (one per program, as in the reference), else ``None``.
_block: _Block | None = None


def refuse_in_coalescing(reason: str) -> None:
    """The reference's error for what a ``coalescing()`` block cannot do (fetch results)."""
    if _block is not None:
        raise NotImplementedError(f"NYI: {reason} during a coalescing block")


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """Hold the work issued inside and send it together when the block ends (nested blocks:
    part of the outer one). Fetching inside raises ``NotImplementedError``, using a second
    mesh's client ``ValueError`` (the reference's errors); a block left by an exception drops
    the work issued inside (its tensors fail at fetch), as the reference abandons it."""
    global _block
    if _block is not None:
        yield
        return
    block = _block = _Block()
    finished = False
    try:
        yield
        finished = True
    finally:
        _block = None
        if block.client is not None:
            block.client.end_block(block.start, finished)


class Client:
    """The client's side of one activated process mesh: tensor refs, the pending batch (sent in
    order to every worker, each command tagged with the ranks it is for) and the frees."""

    def __init__(
        self, workers: Any, labels: Sequence[str], sizes: Sequence[int], procs: Any = None
    ) -> None:
        self.workers = workers
        self.procs = procs
        self.labels = tuple(labels)
        self.sizes = tuple(sizes)
        self.world = math.prod(self.sizes)
        self._refs = itertools.count(1)
        self._events = itertools.count(1)
        self._pending: list[tuple[frozenset[int] | None, int, tuple[Any, ...]]] = []
        #: (ref, stream id) freed by the garbage collector (any thread), sent with the next batch.
        self._freed: collections.deque[tuple[int, int]] = collections.deque()
        self._lock = threading.Lock()
        self._streams: set[int] = set()
        self._pg_ready = False
        #: The ``monarch.spmd.MeshProcessGroup`` made for this mesh (``None``: not made here).
        self.process_group: Any = None
        self.closed = False
        self.sent_batches = 0
        self._inbox: Any = None

    def ensure_inbox(self) -> Any:
        """The ``TensorInbox`` actors of this mesh's processes (spawned on first use: tensors
        sent here from another process mesh arrive there)."""
        with self._lock:
            if self._inbox is None:
                if self.procs is None:
                    raise RuntimeError("this mesh has no process mesh to spawn inboxes on")
                self._inbox = self.procs.spawn("tensor_engine_inbox", TensorInbox)
            return self._inbox

    def new_ref(self) -> int:
        return next(self._refs)

    def free(self, ref: int, stream: int = 0) -> None:
        """A client tensor was dropped: free its value on the workers (next batch, on the
        stream it belongs to, after the work issued there before)."""
        self._freed.append((ref, stream))

    def send(
        self, ranks: frozenset[int] | None, command: tuple[Any, ...], stream: Any = None
    ) -> None:
        """Queue ``command`` for the workers of ``ranks`` (``None``: all) on ``stream``
        (``None``: the active stream)."""
        sid = stream_id(get_active_stream() if stream is None else stream)
        block = _block
        with self._lock:
            if block is not None:
                if block.client is None:
                    block.client, block.start = self, len(self._pending)
                elif block.client is not self:
                    raise ValueError(
                        "using multiple controllers in the same coalescing block is not supported"
                    )
                if len(self._pending) >= MAX_COALESCED:
                    raise RuntimeError(f"a coalescing block holds at most {MAX_COALESCED} commands")
            if sid not in self._streams:
                if len(self._streams) >= MAX_STREAMS:
                    raise RuntimeError(
                        f"a mesh runs at most {MAX_STREAMS} streams (workers keep a thread each)"
                    )
                self._streams.add(sid)
            self._take_freed()
            self._pending.append((ranks, sid, command))
            full = len(self._pending) >= MAX_BATCH and block is None
        if full:
            self.flush()

    def sync(self, ranks: frozenset[int] | None, before: Any, after: Any) -> None:
        """Work issued on stream ``after`` from now on runs, on ``ranks``, only once stream
        ``before`` ran the work issued on it so far."""
        if stream_id(before) == stream_id(after):
            return
        event = next(self._events)
        self.send(ranks, (m.SIGNAL, event), before)
        self.send(ranks, (m.WAIT, event), after)

    def _take_freed(self) -> None:
        if self._freed:
            by_stream: dict[int, list[int]] = {}
            while self._freed:
                ref, sid = self._freed.popleft()
                by_stream.setdefault(sid, []).append(ref)
            for sid, refs in by_stream.items():
                self._pending.append((None, sid, (m.DEL, tuple(refs))))

    def flush(self) -> None:
        """Send what is pending (one message to every worker per ``MAX_BATCH`` commands);
        nothing while a ``coalescing()`` block holds this client's work."""
        block = _block
        if block is not None and block.client is self:
            return
        with self._lock:
            self._take_freed()
            batch, self._pending = self._pending, []
        if batch and not self.closed:
            for at in range(0, len(batch), MAX_BATCH):
                self.workers.run.broadcast(batch[at : at + MAX_BATCH])
                self.sent_batches += 1

    def end_block(self, start: int, finished: bool) -> None:
        """A ``coalescing()`` block that held this client's work (from ``start`` of the
        pending commands) ended: send it, or, ``finished`` false, drop it (but its frees)."""
        if not finished:
            with self._lock:
                kept = self._pending[:start]
                kept.extend(c for c in self._pending[start:] if c[2][0] == m.DEL)
                self._pending = kept
        self.flush()

    def ensure_process_group(self) -> None:
        """Give the mesh's processes a gloo process group (once; ``monarch.spmd`` makes it,
        unless the program already did)."""
        if self._pg_ready:
            return
        self.process_group = _dist.ensure_world(self.procs, self.workers, ANSWER_TIMEOUT_S)
        self._pg_ready = True


class DeviceMesh:
    """A view of an activated process mesh: the dimensions kept (``names``, ``sizes``) and, for
    each dimension of the root mesh, the indices selected."""

    def __init__(
        self,
        client: Client,
        workers: Any,
        selection: tuple[int | tuple[int, ...], ...],
    ) -> None:
        self.client = client
        self.workers = workers
        self.selection = selection
        self.names = tuple(
            label
            for label, chosen in zip(client.labels, selection, strict=True)
            if isinstance(chosen, tuple)
        )
        self.sizes = {
            label: len(chosen)
            for label, chosen in zip(client.labels, selection, strict=True)
            if isinstance(chosen, tuple)
        }
        self._ranks = tuple(self._root_ranks())
        #: ``None`` for the whole root mesh (every worker runs its commands).
        self.rank_set: frozenset[int] | None = (
            None if len(self._ranks) == client.world else frozenset(self._ranks)
        )

    # -- identity ------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DeviceMesh)
            and other.client is self.client
            and other.selection == self.selection
        )

    def __hash__(self) -> int:
        return hash((id(self.client), self.selection))

    def __repr__(self) -> str:
        return f"<DeviceMesh(names={self.names}, ranks={list(self._ranks)})>"

    def __len__(self) -> int:
        return len(self._ranks)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The root ranks of this view, row-major over ``names``."""
        return self._ranks

    # -- geometry ------------------------------------------------------------------------------
    def _axes(self) -> list[tuple[int, ...]]:
        return [(c,) if isinstance(c, int) else c for c in self.selection]

    def _root_ranks(self) -> Iterator[int]:
        sizes = self.client.sizes
        for point in itertools.product(*self._axes()):
            rank = 0
            for index, size in zip(point, sizes, strict=True):
                rank = rank * size + index
            yield rank

    def rank_of(self, coords: dict[str, int]) -> int:
        """The root rank at ``coords`` (every kept dimension named)."""
        missing = [n for n in self.names if n not in coords]
        unknown = [n for n in coords if n not in self.names]
        if missing or unknown:
            raise ValueError(
                f"coordinates {coords} do not name one process of mesh dims {self.names}"
                + (f" (missing {missing})" if missing else "")
                + (f" (unknown {unknown})" if unknown else "")
            )
        rank = 0
        for label, chosen, size in zip(
            self.client.labels, self.selection, self.client.sizes, strict=True
        ):
            if isinstance(chosen, int):
                index = chosen
            else:
                at = coords[label]
                if not 0 <= at < len(chosen):
                    raise IndexError(f"{label}={at} is outside 0..{len(chosen) - 1}")
                index = chosen[at]
            rank = rank * size + index
        return rank

    def groups(self, dims: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """The root ranks grouped by the coordinates of the dimensions not in ``dims``."""
        unknown = [d for d in dims if d not in self.names]
        if unknown or not dims:
            raise ValueError(f"reduce over dims {tuple(dims)}: this mesh has dims {self.names}")
        kept = [i for i, n in enumerate(self.names) if n not in dims]
        found: dict[tuple[int, ...], list[int]] = {}
        axes = [range(self.sizes[n]) for n in self.names]
        for point, rank in zip(itertools.product(*axes), self._ranks, strict=True):
            found.setdefault(tuple(point[i] for i in kept), []).append(rank)
        return tuple(tuple(group) for group in found.values())

    def slice(self, **coords: int | slice) -> DeviceMesh:
        """The sub-mesh at ``coords`` (an int drops the dimension, a slice keeps it)."""
        selection = list(self.selection)
        for label, value in coords.items():
            if label not in self.names:
                raise ValueError(f"mesh has no dimension {label!r} (dims {self.names})")
            position = self.client.labels.index(label)
            chosen = selection[position]
            assert isinstance(chosen, tuple)
            if isinstance(value, int):
                if not -len(chosen) <= value < len(chosen):
                    raise IndexError(f"{label}={value} is outside 0..{len(chosen) - 1}")
                selection[position] = chosen[value]
            else:
                selection[position] = chosen[value]
        return DeviceMesh(self.client, self.workers.slice(**coords), tuple(selection))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """The number of processes along ``dim`` (several: their product; ``None``: all)."""
        dims = self.names if dim is None else (dim,) if isinstance(dim, str) else tuple(dim)
        unknown = [d for d in dims if d not in self.sizes]
        if unknown:
            raise KeyError(f"{self!r} has no dimensions {unknown}")
        return math.prod(self.sizes[d] for d in dims)

    def rank(self, dims: str | Sequence[str]) -> Any:
        """A distributed scalar (int64): each process's coordinate along ``dims`` (several:
        row-major over them)."""
        if isinstance(dims, str):
            if dims not in self.names:
                raise KeyError(f"{self!r} does not have dimension {dims!r}")
            position = self.client.labels.index(dims)
            chosen = self.selection[position]
            ref = self.client.new_ref()
            self.client.send(
                self.rank_set,
                (m.CALL, (ref,), (), RANK_FUNCTION, (dims, chosen), {}, issued_at()),
            )
            fake = meta_empty((), torch.long)
            return Tensor(fake, self, ref, get_active_stream())
        combined: Any = None
        for dim in dims:
            rank = self.rank(dim)
            combined = rank if combined is None else combined * self.sizes[dim] + rank
        return combined

    # -- activation ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def activate(self) -> Iterator[DeviceMesh]:
        """Torch operations issued inside run on this mesh (nests; ``no_mesh`` suspends)."""
        with _activated(self):
            yield self


class _MeshMode(TorchDispatchMode):  # type: ignore[misc]
    """Routes every torch operation to the tensor engine while a mesh is active."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return dispatch(func, args, kwargs or {})


@contextlib.contextmanager
def _activated(mesh: DeviceMesh) -> Iterator[None]:
    try:
        with pushed(mesh), _MeshMode():
            yield
    finally:
        mesh.client.flush()


#: id(proc mesh) -> (proc mesh, its device mesh): one set of tensor workers per process mesh.
_device_meshes: dict[int, tuple[ProcMesh, DeviceMesh]] = {}
_device_meshes_lock = threading.Lock()


def device_mesh_of(procs: ProcMesh, capacity: int = DEFAULT_CAPACITY) -> DeviceMesh:
    """The device mesh of ``procs``, spawning its tensor workers on first use."""
    with _device_meshes_lock:
        known = _device_meshes.get(id(procs))
        if known is not None:
            return known[1]
        labels = list(procs.extent.labels)
        sizes = list(procs.extent.sizes)
        workers = procs.spawn("tensor_engine_workers", TensorWorker, capacity)
        client = Client(workers, labels, sizes, procs)
        mesh = DeviceMesh(client, workers, tuple(tuple(range(s)) for s in sizes))
        _device_meshes[id(procs)] = (procs, mesh)
        _log.info("tensor engine on %s: %d workers, dims %s", procs, client.world, labels)
        return mesh


def activate_proc_mesh(procs: ProcMesh) -> contextlib.AbstractContextManager[DeviceMesh]:
    """``ProcMesh.activate()``."""
    return device_mesh_of(procs).activate()
