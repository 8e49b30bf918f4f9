"""The tensor worker: one actor per process of an activated mesh, running the client's commands
on a table of local tensors.

Each stream is an ordering domain: ``run`` hands every command to its stream's thread (a
bounded queue each; ``run`` waits for room), which runs them in the order issued, while
different streams' commands overlap. Streams meet only where the client says so: ``signal`` on
one stream and ``wait`` on another (a borrow: the borrowing stream waits for the lender's work
issued before it; a drop: the lender's later work waits for the borrower's work issued before
the drop). Collectives and point-to-point transfers (``reduce``, ``send``, ``recv``) run one at a
time in the order issued, whatever their streams (every process of a group must run them in the
same order). Every wait is for work issued earlier, so the order of issue rules out deadlock.
A fetch waits for the streams of what it reads, up to the commands issued before it."""

from __future__ import annotations

import contextvars
import importlib
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_map

from monarch.actor import Actor, current_rank, endpoint
from monarch.tensor import _dist
from monarch.tensor import _messages as m
from monarch.tensor._table import DEFAULT_CAPACITY, Failure, TensorTable

__all__ = [
    "TensorInbox",
    "TensorSpec",
    "TensorWorker",
    "propagate_on_shard",
    "resolve_function",
    "resolve_operator",
]

_log = logging.getLogger("monarch.tensor.worker")

#: Point-to-point sends still in flight a worker keeps at most before waiting on the oldest.
MAX_PENDING_SENDS = 64

#: Failed operations a worker logs (one warning each) before it only counts them.
MAX_LOGGED_FAILURES = 20

#: How long a tensor worker waits for the local actor of an ``rref`` call.
RREF_TIMEOUT_S = 300.0

#: Shards from other process meshes an inbox holds at most before a sender waits.
MAX_INBOX = 256
#: How long a transfer between process meshes waits (for the shard; for room in the inbox).
TRANSFER_TIMEOUT_S = 120.0

#: Streams a worker runs at most (one thread each).
MAX_STREAMS = 64
#: Commands queued on one stream at most before ``run`` waits for room.
MAX_QUEUED = 4096
#: Cross-stream events a worker holds at most (signalled, not yet waited for).
MAX_EVENTS = 65_536
#: How long a stream waits for another stream's ``signal`` before it fails the wait.
EVENT_TIMEOUT_S = 600.0

#: Commands that run one at a time in issued order across all streams (collectives).
_NETWORK = frozenset({m.REDUCE, m.SEND, m.RECV})

_operators: dict[str, Any] = {}
#: Guards the worker's failure count (its streams' threads fail concurrently).
_failures_lock = threading.Lock()


def resolve_operator(name: str) -> Any:
    """``"aten::add.Tensor"`` -> ``torch.ops.aten.add.Tensor`` (cached)."""
    found = _operators.get(name)
    if found is None:
        namespace, _, rest = name.partition("::")
        op, _, overload = rest.partition(".")
        found = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        _operators[name] = found
    return found


def resolve_function(path: str) -> Callable[..., Any]:
    """``"package.module.function"`` (or ``"package.module.Class.method"``) -> the object."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        if not callable(target):
            raise TypeError(f"remote function {path!r} is not callable")
        return target  # type: ignore[no-any-return]
    raise ImportError(f"cannot import remote function {path!r}")


#: This process's coordinates in the activated mesh (set by its tensor worker).
_point: dict[str, int] = {}


def coordinate(dim: str, chosen: tuple[int, ...]) -> torch.Tensor:
    """This process's index along ``dim`` among the coordinates ``chosen`` (``DeviceMesh.rank``)."""
    return torch.tensor(chosen.index(_point[dim]), dtype=torch.long)


class _Inbox:
    """Shards sent to this process from another process mesh (``to_mesh``), by key; bounded."""

    def __init__(self, capacity: int) -> None:
        self._values: dict[str, Any] = {}
        self._capacity = capacity
        self._cond = threading.Condition()

    def put(self, key: str, value: Any, timeout_s: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._values) < self._capacity, timeout_s):
                raise RuntimeError(
                    f"the tensor inbox stayed full ({self._capacity} shards nobody took) for "
                    f"{timeout_s:.0f} s"
                )
            self._values[key] = value
            self._cond.notify_all()

    def take(self, key: str, timeout_s: float) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._values, timeout_s):
                raise TimeoutError(
                    f"no shard arrived from the source mesh within {timeout_s:.0f} s "
                    f"(transfer {key})"
                )
            value = self._values.pop(key)
            self._cond.notify_all()
            return value


_inbox = _Inbox(MAX_INBOX)


class TensorInbox(Actor):
    """Receives shards sent from another process mesh's workers (its own actor, so a delivery
    is taken while this process's ``TensorWorker`` waits for it)."""

    @endpoint
    def deliver(self, key: str, value: Any) -> None:
        _inbox.put(key, value, TRANSFER_TIMEOUT_S)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's shape and dtype (what ``propagate="cached"`` brings back to the client)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def propagate_on_shard(target: Callable[..., Any] | str, args: Any, kwargs: Any) -> Any:
    """Run ``target`` on this process's shards and return its result with every tensor
    replaced by its :class:`TensorSpec` (``remote(..., propagate="cached")``)."""
    function = resolve_function(target) if isinstance(target, str) else target
    result = function(*args, **kwargs)
    return tree_map(
        lambda v: TensorSpec(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v,
        result,
    )


def _refs_in(tree: Any) -> list[int]:
    return [int(leaf) for leaf in tree_flatten(tree)[0] if isinstance(leaf, m.Ref)]


class TensorWorker(Actor):
    """Holds this process's shards; ``run`` executes a batch of commands."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.table = TensorTable(capacity)
        self.point = dict(current_rank())
        _point.clear()
        _point.update(self.point)
        self.rank = current_rank().rank
        torch.seed()  # workers forked from one image would otherwise draw the same numbers
        self._sends: list[tuple[Any, Any]] = []
        self._sends_lock = threading.Lock()
        self.failures = 0
        self._queues: dict[int, queue.Queue[tuple[tuple[Any, ...], int | None]]] = {}
        #: Guards the counts below: commands handed to each stream, finished by each, network
        #: tickets handed out and finished; waited on by fetches and by the ticket turnstile.
        self._progress = threading.Condition()
        self._issued: dict[int, int] = {}
        self._done: dict[int, int] = {}
        self._tickets = 0
        self._turn = 0
        self._events: dict[int, threading.Event] = {}
        self._events_lock = threading.Lock()

    # -- endpoints -----------------------------------------------------------------------------
    @endpoint
    def run(self, batch: list[tuple[frozenset[int] | None, int, tuple[Any, ...]]]) -> None:
        """Hand ``batch`` to the streams in order: each command with the ranks it is for
        (``None``: all) and its stream."""
        for ranks, stream, command in batch:
            if ranks is not None and self.rank not in ranks:
                continue
            try:
                commands = self._queue(stream)
            except RuntimeError:
                _log.exception("tensor worker rank %d: command %s failed", self.rank, command[0])
                self._fail_outputs(command, traceback.format_exc())
                continue
            ticket = None
            with self._progress:
                if command[0] in _NETWORK:
                    ticket = self._tickets
                    self._tickets += 1
                self._issued[stream] = self._issued.get(stream, 0) + 1
            commands.put((command, ticket))  # waits while the stream's queue is full

    def _queue(self, stream: int) -> queue.Queue[tuple[tuple[Any, ...], int | None]]:
        found = self._queues.get(stream)
        if found is None:
            if len(self._queues) >= MAX_STREAMS:
                raise RuntimeError(f"a tensor worker runs at most {MAX_STREAMS} streams")
            found = queue.Queue(maxsize=MAX_QUEUED)
            self._queues[stream] = found
            # The actor's context (current_rank(), the sender of rref calls) for its thread.
            context = contextvars.copy_context()
            threading.Thread(
                target=context.run,
                args=(self._stream_loop, stream, found),
                name=f"tensor-stream-{stream}",
                daemon=True,
            ).start()
        return found

    def _stream_loop(
        self, stream: int, commands: queue.Queue[tuple[tuple[Any, ...], int | None]]
    ) -> None:
        while True:
            command, ticket = commands.get()
            try:
                if ticket is not None:
                    with self._progress:
                        self._progress.wait_for(lambda t=ticket: self._turn == t)  # type: ignore[misc]
                self._execute(command)
            except Exception:  # a bug or a full table: fail what the command would produce
                _log.exception("tensor worker rank %d: command %s failed", self.rank, command[0])
                self._fail_outputs(command, traceback.format_exc())
            finally:
                with self._progress:
                    if ticket is not None:
                        self._turn += 1
                    self._done[stream] = self._done.get(stream, 0) + 1
                    self._progress.notify_all()

    def _caught_up(self, streams: tuple[int, ...] | None) -> None:
        """Wait until ``streams`` (``None``: all) ran every command handed to them so far."""
        with self._progress:
            names = list(self._issued) if streams is None else streams
            goal = {s: self._issued.get(s, 0) for s in names}
            self._progress.wait_for(lambda: all(self._done.get(s, 0) >= n for s, n in goal.items()))

    def _event(self, event: int) -> threading.Event:
        with self._events_lock:
            found = self._events.get(event)
            if found is None:
                if len(self._events) >= MAX_EVENTS:
                    raise RuntimeError(f"more than {MAX_EVENTS} stream events pending")
                found = self._events[event] = threading.Event()
            return found

    def _wait_event(self, event: int) -> None:
        if not self._event(event).wait(EVENT_TIMEOUT_S):
            raise TimeoutError(f"stream event {event} was not signalled in {EVENT_TIMEOUT_S} s")
        with self._events_lock:
            self._events.pop(event, None)

    @endpoint
    def fetch(self, tree: Any, streams: tuple[int, ...] | None = None) -> tuple[str, Any]:
        """``("ok", values)`` with the refs of ``tree`` replaced by their tensors, or
        ``("err", Failure)`` for the first that has none (after ``streams`` caught up)."""
        self._caught_up(streams)
        self._finish_sends()
        refs = _refs_in(tree)
        failure = self.table.first_failure(refs)
        if failure is not None:
            return ("err", failure)
        try:
            values = tree_map(self._value_for_fetch, tree)
        except KeyError as exc:
            return ("err", Failure("fetch", "", str(exc.args[0]), self.rank))
        return ("ok", values)

    @endpoint
    def call_and_fetch(
        self,
        target: Callable[..., Any] | str,
        args: Any,
        kwargs: Any,
        issued_at: str,
        streams: tuple[int, ...] | None = None,
    ) -> tuple[str, Any]:
        """Run a remote function on this process's shards and return its result (as ``fetch``:
        ``("ok", value)`` or ``("err", Failure)``)."""
        self._caught_up(streams)
        self._finish_sends()
        name = _command_name(m.CALL, target)
        failure = self.table.first_failure(_refs_in((args, kwargs)))
        if failure is not None:
            return ("err", failure)
        try:
            function = resolve_function(target) if isinstance(target, str) else target
            real_args, real_kwargs = tree_map(self._resolve, (args, kwargs))
            result = function(*real_args, **real_kwargs)
        except Exception:
            return ("err", Failure(name, issued_at, traceback.format_exc(), self.rank))
        return ("ok", result)

    @endpoint
    def dist_initialized(self) -> bool:
        return _dist.initialized()

    @endpoint
    def failed(self) -> int:
        """How many operations failed here (not counting those that only read a failed value)."""
        self._caught_up(None)
        return self.failures

    @endpoint
    def live(self) -> int:
        """How many tensors this worker holds (tests, diagnostics)."""
        self._caught_up(None)
        return len(self.table)

    # -- commands ------------------------------------------------------------------------------
    def _value_for_fetch(self, leaf: Any) -> Any:
        if isinstance(leaf, m.Ref):
            value = self.table.get(int(leaf))
            return value.detach().clone() if isinstance(value, torch.Tensor) else value
        return leaf

    def _resolve(self, leaf: Any) -> Any:
        return self.table.get(int(leaf)) if isinstance(leaf, m.Ref) else leaf

    def _execute(self, command: tuple[Any, ...]) -> None:
        kind = command[0]
        if kind in (m.OP, m.CALL, m.RREF):
            self._run_op(command)
        elif kind == m.DEL:
            for ref in command[1]:
                self.table.drop(ref)
        elif kind == m.REDUCE:
            self._reduce(command)
        elif kind == m.SEND:
            self._send(command)
        elif kind == m.RECV:
            self._recv(command)
        elif kind == m.PUSH:
            self._push(command)
        elif kind == m.TAKE:
            self._take(command)
        elif kind == m.SIGNAL:
            self._event(command[1]).set()
        elif kind == m.WAIT:
            self._wait_event(command[1])
        else:
            raise ValueError(f"unknown tensor engine command {kind!r}")

    def _fail(self, refs: list[int], failure: Failure) -> None:
        for ref in refs:
            self.table.put(ref, failure)

    def _fail_outputs(self, command: tuple[Any, ...], text: str) -> None:
        kind = command[0]
        refs: list[int] = []
        name = kind
        issued_at = ""
        if kind in (m.OP, m.CALL, m.RREF):
            refs = [r for r in command[1] or () if r is not None] + list(command[2])
            name = _command_name(kind, command[3])
            issued_at = command[6]
        elif kind in (m.REDUCE, m.RECV, m.TAKE):
            issued_at = command[-1]
            if command[1] is not None:
                refs = [command[1]]
        failure = Failure(name, issued_at, text, self.rank)
        for ref in refs:
            try:
                self.table.put(ref, failure)
            except Exception:
                self.table.drop(ref)

    def _run_op(self, command: tuple[Any, ...]) -> None:
        kind, outs, mutated, target, args, kwargs, issued_at = command
        name = _command_name(kind, target)
        failure = self.table.first_failure(_refs_in((args, kwargs)))
        if failure is not None:
            self._fail([r for r in outs or () if r is not None] + list(mutated), failure)
            return
        try:
            if kind == m.OP:
                function = resolve_operator(target)
            elif kind == m.RREF:
                function = self._local_endpoint(*target)
            else:
                function = resolve_function(target) if isinstance(target, str) else target
            real_args, real_kwargs = tree_map(self._resolve, (args, kwargs))
            result = function(*real_args, **real_kwargs)
        except Exception:
            failure = Failure(name, issued_at, traceback.format_exc(), self.rank)
            self._note_failure(failure)
            self._fail([r for r in outs or () if r is not None] + list(mutated), failure)
            return
        if outs is None:  # propagate="inspect": the client keeps nothing of the result
            return
        leaves = tree_flatten(result)[0]
        if len(leaves) != len(outs):
            failure = Failure(
                name,
                issued_at,
                f"returned {len(leaves)} values where the client expected {len(outs)} "
                "(a wrong propagate?)",
                self.rank,
            )
            self._fail([r for r in outs if r is not None], failure)
            return
        for ref, leaf in zip(outs, leaves, strict=True):
            if ref is not None:
                self.table.put(ref, leaf)

    def _note_failure(self, failure: Failure) -> None:
        """Log an operation that failed here (not those that only read its result): the client
        learns of it at the next fetch of what depends on it, perhaps never."""
        with _failures_lock:  # streams fail concurrently
            self.failures += 1
            count = self.failures
        if count <= MAX_LOGGED_FAILURES:
            last = failure.traceback.strip().splitlines()[-1] if failure.traceback else ""
            _log.warning(
                "tensor worker rank %d: %s issued at %s failed: %s%s",
                self.rank,
                failure.op,
                failure.issued_at or "?",
                last,
                " (later failures are not logged)" if count == MAX_LOGGED_FAILURES else "",
            )

    def _local_endpoint(self, actors: Any, name: str) -> Callable[..., Any]:
        """A function calling endpoint ``name`` of the actor of ``actors`` on this process."""
        labels = set(actors.extent.labels)
        coords = {k: v for k, v in self.point.items() if k in labels}
        endpoint = getattr(actors.slice(**coords) if coords else actors, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return endpoint.call_one(*args, **kwargs).get(timeout=RREF_TIMEOUT_S)

        return call

    def _reduce(self, command: tuple[Any, ...]) -> None:
        _, out, src, groups, reduction, scatter, shape, dtype, _issued_at = command
        ranks = next((g for g in groups if self.rank in g), None)
        if ranks is None:
            raise RuntimeError(f"rank {self.rank} is in none of the reduction groups {groups}")
        value = self.table.get(src)
        failure = value if isinstance(value, Failure) else None
        if failure is not None:
            # Still take part (with zeros) so the other members do not wait for this one.
            value = torch.zeros(shape, dtype=dtype)
        size = len(ranks)
        index = ranks.index(self.rank)
        group = _dist.group_for(ranks) if size > 1 else None
        x = value.contiguous()
        if reduction == "stack":
            gathered = [torch.empty_like(x) for _ in range(size)]
            if group is None:
                gathered = [x.clone()]
            else:
                dist.all_gather(gathered, x, group=group)
            if scatter:
                result = torch.cat([g.chunk(size)[index] for g in gathered])
            else:
                result = torch.stack(gathered)
        else:
            result = x.clone()
            if group is not None:
                op = {
                    "sum": dist.ReduceOp.SUM,
                    "avg": dist.ReduceOp.SUM,
                    "max": dist.ReduceOp.MAX,
                    "min": dist.ReduceOp.MIN,
                }[reduction]
                dist.all_reduce(result, op=op, group=group)
            if reduction == "avg":
                result = result / size
            if scatter:
                result = result.chunk(size)[index].clone()
        if failure is not None:
            if out is not None:
                self.table.put(out, failure)
        elif out is None:  # in place
            value.copy_(result)
        else:
            self.table.put(out, result)

    def _send(self, command: tuple[Any, ...]) -> None:
        _, src, dst_rank, _issued_at = command
        value = self.table.get(src)
        if isinstance(value, Failure):
            value = torch.empty(0)
        tensor = value.contiguous()
        oldest = None
        with self._sends_lock:
            if len(self._sends) >= MAX_PENDING_SENDS:
                oldest = self._sends.pop(0)
            self._sends.append((dist.isend(tensor, dst_rank), tensor))
        if oldest is not None:
            oldest[0].wait()

    def _recv(self, command: tuple[Any, ...]) -> None:
        _, out, src_rank, shape, dtype, _issued_at = command
        tensor = torch.empty(shape, dtype=dtype)
        dist.recv(tensor, src_rank)
        self.table.put(out, tensor)

    def _push(self, command: tuple[Any, ...]) -> None:
        _, src, inbox, coords, key, _issued_at = command
        value = self.table.get(src)
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
        inbox.slice(**coords).deliver.broadcast(key, value)  # a Failure travels as itself

    def _take(self, command: tuple[Any, ...]) -> None:
        _, out, key, shape, dtype, _issued_at = command
        started = time.monotonic()
        value = _inbox.take(key, TRANSFER_TIMEOUT_S)
        if isinstance(value, torch.Tensor) and (
            tuple(value.shape) != shape or value.dtype != dtype
        ):
            raise RuntimeError(
                f"to_mesh: the shard arrived as {tuple(value.shape)} {value.dtype}, expected "
                f"{shape} {dtype}"
            )
        _log.debug("rank %d took %s after %.3f s", self.rank, key, time.monotonic() - started)
        self.table.put(out, value)

    def _finish_sends(self) -> None:
        while True:
            with self._sends_lock:
                if not self._sends:
                    return
                oldest = self._sends.pop(0)
            oldest[0].wait()


def _command_name(kind: str, target: Any) -> str:
    if kind == m.RREF:
        return f"{target[1]}.rref"
    return target if isinstance(target, str) else _name_of(target)


def _name_of(target: Any) -> str:
    return str(getattr(target, "__qualname__", None) or getattr(target, "__name__", target))
