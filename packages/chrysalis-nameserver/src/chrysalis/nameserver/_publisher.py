"""The child's publication state machine, ``ChildPublisher`` (the pure part of spec 3.5).

Why a separate machine: ``ChildSession`` only builds and checks messages; *what* to publish
and *when* is this module's job. A child publishes its **export view**: its own entry plus
every entry of its local directory with the locators replaced by its own (ancestors reach every
descendant through this node). ``export_view`` builds it.

Protocol, as in the reference ``ParentLink``:

* once the link is established, ``start()`` sends a complete snapshot (new snapshot id, base
  sequence = the current sequence, entries in PID order in chunks of at most ``chunk_entries``
  entries and at most one frame each); the link counts as *synchronized* when the parent
  acknowledges it;
* afterwards each ``poll()`` (call it after ``set_export``) sends at most one ``Delta`` with the
  next sequence number: the entries that are new or changed and the PIDs that disappeared,
  relative to what the parent will hold once everything already sent is committed. Nothing is
  sent when nothing changed. A delta that would not fit in one frame is replaced by a snapshot;
* acknowledgements are cumulative: ``PublicationAck(s)`` settles every publication up to ``s``;
* ``ResnapshotRequired`` (the parent saw a gap) makes the publisher send a complete new
  snapshot (new id, same base sequence) at once.

Flow control: at most ``max_in_flight`` publications are unacknowledged (a snapshot counts as
one). The default, 1, is the reference behaviour (one update in flight). A larger window
pipelines deltas; then a lost delta makes the parent answer the following deltas with
``ResnapshotRequired(e)``. Every such request with ``e`` at or below the base of the snapshot
already sent is stale (that snapshot answers it) and is ignored, so one gap costs one snapshot.
``resync()`` forces a snapshot (a driver may call it when an acknowledgement is overdue).
Acknowledgements at or below an already settled sequence are ignored; one for a sequence never
sent is ``RemoteProtocolError`` (``UNEXPECTED_ACK``). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Final, final

from chrysalis.core import PID_LEN, Pid
from chrysalis.nameserver._codec import entry_wire_size
from chrysalis.nameserver._errors import LocalProtocolError, RemoteProtocolError, SessionErrorKind
from chrysalis.nameserver._protocol import (
    MAX_ENTRIES_PER_FRAME,
    MAX_FRAME_BODY,
    MAX_REMOVALS_PER_FRAME,
    SNAPSHOT_CHUNK_ENTRIES,
    U64_MAX,
    NsMessage,
    ProcEntry,
)
from chrysalis.nameserver._session import ChildSession, PublicationAcked, ResnapshotRequested
from chrysalis.nameserver._state import DEFAULT_MAX_ENTRIES

__all__ = ["MAX_IN_FLIGHT", "ChildPublisher", "export_view"]

MAX_IN_FLIGHT: Final = 64
"""Largest accepted ``max_in_flight`` window."""

# Frame body bytes besides the entries: version, tag, u64, u32 chunk, u32 count (snapshot
# chunk) or u64, u32 count, u32 count (delta); 24 covers both.
_FRAME_OVERHEAD: Final = 24
_S = SessionErrorKind


def export_view(local_entry: ProcEntry, entries: Iterable[ProcEntry]) -> dict[Pid, ProcEntry]:
    """What a node publishes to its parent: ``local_entry`` plus every entry of its directory
    with locators replaced by ``local_entry.locators`` (server names and labels unchanged).

    ``ValueError`` if an entry repeats a PID or is the local PID.
    """
    view = {local_entry.pid: local_entry}
    locators = local_entry.locators
    for entry in entries:
        if entry.pid in view:
            raise ValueError(f"export view repeats PID {entry.pid}")
        view[entry.pid] = entry.with_locators(locators)
    return view


@final
class ChildPublisher:
    """Publishes a child's export view over a ``ChildSession`` (see the module docstring).

    Every method returns the messages to send, in order. ``set_export`` raises
    ``LocalProtocolError`` (``EXPORT_TOO_LARGE``) above ``max_entries`` entries and
    ``ValueError`` for a repeated PID.
    """

    __slots__ = (
        "_chunk_entries",
        "_desired",
        "_dirty",
        "_last_snapshot_base",
        "_max_entries",
        "_max_in_flight",
        "_next_snapshot",
        "_records",
        "_sent",
        "_sequence",
        "_session",
        "_started",
        "_synchronized",
    )

    def __init__(
        self,
        session: ChildSession,
        *,
        max_in_flight: int = 1,
        chunk_entries: int = SNAPSHOT_CHUNK_ENTRIES,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        if not isinstance(session, ChildSession):
            raise TypeError(f"session must be a ChildSession, not {type(session).__name__}")
        if not isinstance(max_in_flight, int) or not 1 <= max_in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"max_in_flight must be in 1..{MAX_IN_FLIGHT}, got {max_in_flight!r}")
        if not isinstance(chunk_entries, int) or not 1 <= chunk_entries <= MAX_ENTRIES_PER_FRAME:
            raise ValueError(
                f"chunk_entries must be in 1..{MAX_ENTRIES_PER_FRAME}, got {chunk_entries!r}"
            )
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self._session = session
        self._max_in_flight = max_in_flight
        self._chunk_entries = chunk_entries
        self._max_entries = max_entries
        self._desired: dict[Pid, ProcEntry] = {}
        self._sent: dict[Pid, ProcEntry] = {}
        self._sequence = 0
        self._next_snapshot = 1
        self._records: deque[tuple[int, bool]] = deque()
        self._last_snapshot_base: int | None = None
        self._dirty = True
        self._started = False
        self._synchronized = False

    # -- observers --------------------------------------------------------------------------

    @property
    def synchronized(self) -> bool:
        """True once the parent acknowledged the latest snapshot (the link is "active")."""
        return self._synchronized

    @property
    def sequence(self) -> int:
        """The last publication sequence used."""
        return self._sequence

    @property
    def in_flight(self) -> int:
        """Unacknowledged publications."""
        return len(self._records)

    @property
    def dirty(self) -> bool:
        """True when the export changed since it was last published."""
        return self._dirty

    @property
    def idle(self) -> bool:
        """True when everything is published and acknowledged."""
        return self._started and not self._dirty and not self._records

    # -- inputs -----------------------------------------------------------------------------

    def set_export(self, entries: Mapping[Pid, ProcEntry] | Iterable[ProcEntry]) -> None:
        """Replace the view to publish (``export_view`` builds it); call ``poll()`` next."""
        values = entries.values() if isinstance(entries, Mapping) else entries
        desired: dict[Pid, ProcEntry] = {}
        for entry in values:
            if not isinstance(entry, ProcEntry):
                raise TypeError(f"export entries must be ProcEntry, not {type(entry).__name__}")
            if entry.pid in desired:
                raise ValueError(f"export repeats PID {entry.pid}")
            desired[entry.pid] = entry
            if len(desired) > self._max_entries:
                raise LocalProtocolError(_S.EXPORT_TOO_LARGE, f"at most {self._max_entries}")
        self._desired = desired
        self._dirty = True

    def start(self) -> list[NsMessage]:
        """The initial snapshot; call once, after the session is established."""
        if self._started:
            raise LocalProtocolError(_S.UNEXPECTED_MESSAGE, "publisher already started")
        if not self._session.is_active:
            raise LocalProtocolError(_S.NOT_ACTIVE, "start after the link is established")
        self._started = True
        return self._snapshot()

    def poll(self) -> list[NsMessage]:
        """A delta for the changes since the last publication, when the window allows."""
        if not self._started or not self._dirty or len(self._records) >= self._max_in_flight:
            return []
        self._dirty = False
        desired, sent = self._desired, self._sent
        upserts = tuple(desired[pid] for pid in sorted(desired) if sent.get(pid) != desired[pid])
        removals = tuple(sorted(pid for pid in sent if pid not in desired))
        if not upserts and not removals:
            return []
        if not self._fits(upserts, removals):
            return self._snapshot()
        if self._sequence == U64_MAX:
            raise LocalProtocolError(_S.EXPORT_TOO_LARGE, "publication sequence exhausted")
        sequence = self._sequence + 1
        message = self._session.delta(sequence, upserts, removals)
        self._sequence = sequence
        for entry in upserts:
            sent[entry.pid] = entry
        for pid in removals:
            del sent[pid]
        self._records.append((sequence, False))
        return [message]

    def handle(self, event: PublicationAcked | ResnapshotRequested) -> list[NsMessage]:
        """Apply a publication event from the session; returns what to send now (a snapshot
        after ``ResnapshotRequested``, a pending delta once the window opens)."""
        if not self._started:
            raise RemoteProtocolError(_S.UNEXPECTED_ACK, "publication event before any snapshot")
        if isinstance(event, ResnapshotRequested):
            base = self._last_snapshot_base
            if base is not None and event.expected_sequence <= base:
                return []  # stale: the snapshot already sent answers it
            return self._snapshot()
        if not isinstance(event, PublicationAcked):
            raise TypeError(f"not a publication event: {type(event).__name__}")
        self._ack(event.sequence)
        return self.poll()

    def resync(self) -> list[NsMessage]:
        """Send a complete new snapshot now (recovery when an acknowledgement is overdue)."""
        if not self._started:
            raise LocalProtocolError(_S.NOT_ACTIVE, "resync before start")
        return self._snapshot()

    # -- internals --------------------------------------------------------------------------

    def _ack(self, sequence: int) -> None:
        records = self._records
        if records and sequence >= records[0][0]:
            if all(seq != sequence for seq, _ in records):
                raise RemoteProtocolError(_S.UNEXPECTED_ACK, f"sequence {sequence} was never sent")
            while records and records[0][0] <= sequence:
                _, snapshot = records.popleft()
                if snapshot:
                    self._synchronized = True
        elif sequence > self._sequence:
            raise RemoteProtocolError(_S.UNEXPECTED_ACK, f"sequence {sequence} was never sent")
        # else: at or below a settled publication -- a stale cumulative ack, ignored.

    def _fits(self, upserts: tuple[ProcEntry, ...], removals: tuple[Pid, ...]) -> bool:
        if len(upserts) > MAX_ENTRIES_PER_FRAME or len(removals) > MAX_REMOVALS_PER_FRAME:
            return False
        size = _FRAME_OVERHEAD + PID_LEN * len(removals)
        for entry in upserts:
            size += entry_wire_size(entry)
            if size > MAX_FRAME_BODY:
                return False
        return True

    def _snapshot(self) -> list[NsMessage]:
        session = self._session
        snapshot = self._next_snapshot
        base = self._sequence
        messages: list[NsMessage] = [session.snapshot_begin(snapshot, base)]
        chunk: list[ProcEntry] = []
        size = _FRAME_OVERHEAD
        index = 0
        desired = self._desired
        for pid in sorted(desired):
            entry = desired[pid]
            entry_size = entry_wire_size(entry)
            if chunk and (len(chunk) >= self._chunk_entries or size + entry_size > MAX_FRAME_BODY):
                messages.append(session.snapshot_chunk(snapshot, index, tuple(chunk)))
                index += 1
                chunk = []
                size = _FRAME_OVERHEAD
            chunk.append(entry)
            size += entry_size
        if chunk:
            messages.append(session.snapshot_chunk(snapshot, index, tuple(chunk)))
            index += 1
        messages.append(session.snapshot_end(snapshot, index))
        self._next_snapshot = snapshot + 1
        self._sent = dict(desired)
        self._records.clear()
        self._records.append((base, True))
        self._last_snapshot_base = base
        self._dirty = False
        self._synchronized = False
        return messages
