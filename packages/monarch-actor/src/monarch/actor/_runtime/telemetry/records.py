"""Structured event records: supervision events and lifecycle events.

Always on (they are rare: one per failure, stop or actor state change, never per message).

*Supervision*: the runtime calls ``record_supervision`` for every failure, stop, undeliverable
message and unhandled fault; it makes a ``SupervisionRecord`` (``SCHEMA_VERSION``), keeps it in
a bounded ring (``supervision_events()``), passes it to listeners
(``add_supervision_listener``), counts it in ``metrics`` (while metrics are on) and logs it as
one JSON line on the ``monarch.supervision`` logger at INFO.

*Lifecycle*: the runtime calls ``record_lifecycle`` as an actor is spawned, runs, is stopping,
stopped or failed, and as a mesh is spawned, stopping or stopped; a ``LifecycleRecord``
(``LIFECYCLE_SCHEMA_VERSION``) goes to its own bounded ring (``lifecycle_events()``), to
listeners (``add_lifecycle_listener``) and, as one JSON line, to the ``monarch.lifecycle``
logger at INFO. Both kinds draw their ``seq`` from one counter, so the two rings merge in the
order the events were recorded. Process lifecycle (starting, ready, exited with its code or
signal) belongs to the hosts layer, which records it through ``record_lifecycle`` with
``subject="proc"`` (events ``proc_starting``, ``proc_ready``, ``proc_exited``).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from monarch.actor._base.errors import FailureEvent
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry.listeners import DEFAULT_RING_CAPACITY, add_listener

__all__ = [
    "LIFECYCLE_EVENTS",
    "LIFECYCLE_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "ChainLink",
    "LifecycleRecord",
    "SupervisionRecord",
    "add_lifecycle_listener",
    "add_supervision_listener",
    "iter_supervision_events",
    "lifecycle_events",
    "record_lifecycle",
    "record_supervision",
    "resize",
    "supervision_events",
]

_log = logging.getLogger("monarch.actor.telemetry")
_event_log = logging.getLogger("monarch.supervision")
_lifecycle_log = logging.getLogger("monarch.lifecycle")

#: Version of the ``SupervisionRecord`` schema; bumped on any incompatible change.
SCHEMA_VERSION: Final = 1


class ChainLink(msgspec.Struct, frozen=True, kw_only=True):
    """One link of a failure's causal chain (newest first in ``SupervisionRecord.chain``)."""

    actor: str
    actor_id: str
    category: str
    kind: str
    reason: str


class SupervisionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A supervision event as a structured record (schema version ``SCHEMA_VERSION``).

    Fields: ``version``; ``seq`` (per-process sequence number, for incremental reads);
    ``event`` (``actor_failed``, ``actor_stopped``, ``supervision_received``,
    ``unhandled_fault``, ``undeliverable``); ``timestamp`` (Unix seconds when recorded);
    ``proc`` (label of the recording process); ``actor`` (readable creation chain),
    ``actor_id`` (PID hex / actor path), ``mesh_name``, ``rank``; ``category`` (``user``,
    ``system``, ``infrastructure``) and ``kind`` (``failed``, ``stopped``, ``unhealthy``,
    ``undeliverable``) of the event; ``reason``; ``chain`` (the causal chain, newest first,
    the event itself included); ``root_cause`` (headline of the first triggering event).
    """

    version: int = SCHEMA_VERSION
    seq: int
    event: str
    timestamp: float
    proc: str
    actor: str
    actor_id: str
    mesh_name: str
    rank: int
    category: str
    kind: str
    reason: str
    chain: tuple[ChainLink, ...]
    root_cause: str

    @classmethod
    def from_event(
        cls, event: str, failure: FailureEvent, proc: str, seq: int, timestamp: float
    ) -> SupervisionRecord:
        """The record of ``failure`` observed as ``event`` in process ``proc``."""
        chain = failure.chain()
        return cls(
            seq=seq,
            event=event,
            timestamp=timestamp,
            proc=proc,
            actor=failure.actor,
            actor_id=failure.actor_id,
            mesh_name=failure.mesh_name,
            rank=failure.rank,
            category=failure.category,
            kind=failure.kind,
            reason=failure.reason,
            chain=tuple(
                ChainLink(
                    actor=e.actor,
                    actor_id=e.actor_id,
                    category=e.category,
                    kind=e.kind,
                    reason=e.reason,
                )
                for e in chain
            ),
            root_cause=chain[-1].headline(),
        )

    def to_json(self) -> str:
        """The record as one line of JSON (what the ``monarch.supervision`` logger emits)."""
        return msgspec.json.encode(self).decode()


_records: collections.deque[SupervisionRecord] = collections.deque(maxlen=DEFAULT_RING_CAPACITY)
_records_lock = threading.Lock()
_record_seq = itertools.count(1)
_record_listeners: list[Callable[[SupervisionRecord], None]] = []


def record_supervision(
    event: str, failure: FailureEvent, proc: str, now: float | None = None
) -> SupervisionRecord:
    """Record ``failure`` as a supervision ``event`` seen in process ``proc`` (runtime hook):
    ring, listeners, metrics, and one JSON line on the ``monarch.supervision`` logger."""
    with _records_lock:
        record = SupervisionRecord.from_event(
            event, failure, proc, next(_record_seq), time.time() if now is None else now
        )
        _records.append(record)
    _metrics.on_supervision(event, failure.category)
    if _event_log.isEnabledFor(logging.INFO):
        _event_log.info(record.to_json())
    for listener in tuple(_record_listeners):
        try:
            listener(record)
        except Exception:
            _log.exception("supervision listener %r raised", listener)
    return record


def supervision_events(after: int = 0) -> list[SupervisionRecord]:
    """Recorded supervision events of this process with ``seq > after``, oldest first (a
    bounded ring: the oldest are dropped first). Poll with the last ``seq`` seen."""
    with _records_lock:
        return [r for r in _records if r.seq > after]


def iter_supervision_events(after: int = 0) -> Iterator[SupervisionRecord]:
    """Iterate over ``supervision_events(after)`` (a snapshot)."""
    return iter(supervision_events(after))


def add_supervision_listener(
    listener: Callable[[SupervisionRecord], None],
) -> Callable[[], None]:
    """Call ``listener(record)`` for every supervision record as it is made (on the thread
    that records it, a runtime thread: keep it short, never block). Returns a remover."""
    return add_listener(_record_listeners, listener)


def resize(capacity: int) -> None:
    """Resize the record rings (keeps the newest records; ``set_ring_capacity``)."""
    global _records, _lifecycle
    with _records_lock:
        _records = collections.deque(_records, maxlen=capacity)
        _lifecycle = collections.deque(_lifecycle, maxlen=capacity)


#: Version of the ``LifecycleRecord`` schema; bumped on any incompatible change.
LIFECYCLE_SCHEMA_VERSION: Final = 1

#: Every lifecycle ``event``, by ``subject``.
LIFECYCLE_EVENTS: Final = {
    "actor": (
        "actor_spawned",
        "actor_running",
        "actor_stopping",
        "actor_stopped",
        "actor_failed",
    ),
    "actor_mesh": ("mesh_spawned", "mesh_stopping", "mesh_stopped"),
    "proc_mesh": ("mesh_spawned", "mesh_stopping", "mesh_stopped"),
    "proc": ("proc_starting", "proc_ready", "proc_exited"),
}


class LifecycleRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A lifecycle event as a structured record (schema version ``LIFECYCLE_SCHEMA_VERSION``).

    Fields: ``version``; ``seq`` (per-process, shared with ``SupervisionRecord``);
    ``event`` (``LIFECYCLE_EVENTS``); ``timestamp`` (Unix seconds); ``proc`` (label of the
    recording process); ``subject`` (``actor``, ``actor_mesh``, ``proc_mesh``, ``proc``);
    ``name`` (an actor's readable creation chain; a mesh's name; a process's label);
    ``actor_id`` (an actor's ``path@pid``; a mesh's path; a process's PID); ``mesh_name`` (an
    actor's mesh path), ``rank`` (an actor's rank, else -1), ``size`` (ranks of a mesh, else
    1); ``owner`` (who spawned it: readable chain); ``reason`` (why it stopped or failed;
    ``proc_exited``: the exit code or signal); ``category`` (``actor_failed``: ``user``,
    ``system``, ``infrastructure``); ``root_cause`` (``actor_failed``: the headline of the
    first triggering event of the cascade, the failure itself if it has no cause).
    """

    version: int = LIFECYCLE_SCHEMA_VERSION
    seq: int
    event: str
    timestamp: float
    proc: str
    subject: str
    name: str
    actor_id: str = ""
    mesh_name: str = ""
    rank: int = -1
    size: int = 1
    owner: str = ""
    reason: str = ""
    category: str = ""
    root_cause: str = ""

    def to_json(self) -> str:
        """The record as one line of JSON (what the ``monarch.lifecycle`` logger emits)."""
        return msgspec.json.encode(self).decode()


_lifecycle: collections.deque[LifecycleRecord] = collections.deque(maxlen=DEFAULT_RING_CAPACITY)
_lifecycle_listeners: list[Callable[[LifecycleRecord], None]] = []


def record_lifecycle(
    event: str,
    subject: str,
    name: str,
    proc: str,
    *,
    actor_id: str = "",
    mesh_name: str = "",
    rank: int = -1,
    size: int = 1,
    owner: str = "",
    reason: str = "",
    failure: FailureEvent | None = None,
) -> LifecycleRecord:
    """Record a lifecycle ``event`` of ``subject`` ``name`` seen in process ``proc`` (runtime
    hook): ring, listeners, one JSON line on ``monarch.lifecycle``. ``failure``: the failure
    of an ``actor_failed`` (its reason, category and root cause)."""
    category = root_cause = ""
    if failure is not None:
        reason = reason or failure.reason
        category = failure.category
        root_cause = failure.root_cause().headline()
    with _records_lock:
        record = LifecycleRecord(
            seq=next(_record_seq),
            event=event,
            timestamp=time.time(),
            proc=proc,
            subject=subject,
            name=name,
            actor_id=actor_id,
            mesh_name=mesh_name,
            rank=rank,
            size=size,
            owner=owner,
            reason=reason,
            category=category,
            root_cause=root_cause,
        )
        _lifecycle.append(record)
    if _lifecycle_log.isEnabledFor(logging.INFO):
        _lifecycle_log.info(record.to_json())
    for listener in tuple(_lifecycle_listeners):
        try:
            listener(record)
        except Exception:
            _log.exception("lifecycle listener %r raised", listener)
    return record


def lifecycle_events(after: int = 0) -> list[LifecycleRecord]:
    """Recorded lifecycle events of this process with ``seq > after``, oldest first (a
    bounded ring: the oldest are dropped first)."""
    with _records_lock:
        return [r for r in _lifecycle if r.seq > after]


def add_lifecycle_listener(listener: Callable[[LifecycleRecord], None]) -> Callable[[], None]:
    """Call ``listener(record)`` for every lifecycle record as it is made (on the thread that
    records it: an actor's or a runtime thread; keep it short). Returns a remover."""
    return add_listener(_lifecycle_listeners, listener)


def _after_fork() -> None:
    """A forked child starts with no records: those in the rings were its parent's."""
    global _records_lock
    _records_lock = threading.Lock()  # it may have been held by a thread that is not here
    _records.clear()
    _lifecycle.clear()


os.register_at_fork(after_in_child=_after_fork)
