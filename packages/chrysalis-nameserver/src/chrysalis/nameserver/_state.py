"""The authoritative directory of one nameserver incarnation, ``Nameserver`` (spec 2.1).

Theory of operation
-------------------
A nameserver is the authority for its subtree. Each directly linked child publishes the
entries of *its* subtree over one link; the directory holds, for every published PID, the
entry and the link that owns it. The node's own entry is not in the directory (the service
holds it separately).

A child publishes in two ways, both idempotent under exact replay:

* a *snapshot*: ``BeginSnapshot`` opens a staging area, ``AppendSnapshotChunk`` adds chunks in
  order (nothing is visible yet), ``CommitSnapshot`` atomically *replaces* everything the link
  published with the staged entries;
* a *delta*: ``ApplyDelta`` with sequence ``current + 1`` upserts and removes entries. A delta
  that does not follow on is not an error: the directory answers ``ResnapshotRequired`` and
  applies nothing. A delta before any snapshot gets ``ResnapshotRequired(0)``.

Every command is atomic: it is fully validated before the first mutation, so it either applies
completely or raises ``ApplyError`` and changes nothing. Each *visible* change (a commit that
changes at least one entry, a link removal that revokes entries) bumps the revision by exactly
one; staging never does. ``apply`` returns ``ApplyEffects``: the visible ``DirectoryChange``
(for route projection and watchers) and the response owed to the child (``PublicationAck`` or
``ResnapshotRequired``), which the session sends only after the commit.

Who may publish what (issue 15, item 5). A child publishes its own entry and the entries of
its subtree (*relayed* entries). The owner of a PID, proven by its certificate on its own link
(the link admitted for that PID), always wins over an entry relayed by another link: when the
owner publishes its entry, that entry replaces a relayed one and the relaying link's claim is
dropped; while the owner is linked, entries for its PID relayed by any other link are dropped
(not stored, not an error, so a stale or hostile relay cannot end the relaying link either),
and a later removal of a dropped claim is a no-op. Two *relayed* claims for one PID still
conflict (``PID_OWNED_BY_ANOTHER_LINK``): the parent cannot tell which relay is right.

Superseding (issue 15, item 3). ``AdmitLink`` for a child that already has a link (a node
restarted with the same identity before its parent noticed the old connection died) removes
the old link, revoking its entries exactly as ``RemoveLink`` would, and admits the new one;
``ApplyEffects.superseded`` names the old link so the driver can fence it (its routes, its
stream). Any later command on the old link fails with ``UNKNOWN_LINK``.

Bounds: at most ``max_links`` links, ``max_entries`` directory entries and ``max_bytes``
accounted bytes of directory entries (``entry_cost``); staged snapshots are bounded per link by
``max_staged_entries`` entries and chunks, and all together by another ``max_bytes``.
Exceeding one is ``CAPACITY_EXCEEDED``.
The class is pure and single-threaded: callers serialise ``apply`` (the service's commit
point); reads are cheap and never mutate visible state.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, final

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver._errors import ApplyError, ApplyErrorKind
from chrysalis.nameserver._protocol import (
    U64_MAX,
    Found,
    ProcEntry,
    PublicationAck,
    ResnapshotRequired,
    Revision,
    _tuple_of,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_LINKS",
    "AdmitLink",
    "AppendSnapshotChunk",
    "ApplyDelta",
    "ApplyEffects",
    "BeginSnapshot",
    "CommitSnapshot",
    "DirectoryChange",
    "DirectoryCommand",
    "LinkIdAllocator",
    "LinkResponse",
    "Nameserver",
    "RemoveLink",
    "entry_cost",
]

DEFAULT_MAX_LINKS: Final = 65_536
"""Default bound on admitted links of one nameserver."""
DEFAULT_MAX_ENTRIES: Final = 1_000_000
"""Default bound on directory entries (and on staged entries per link)."""
DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
"""Default bound on the accounted bytes of the directory (256 MiB), and separately on the
accounted bytes of all snapshots being staged."""

# Accounted memory of one entry held by a root (directory, route, staging), calibrated with
# tracemalloc on CPython 3.11 (README, "Bounds"): a fixed part, then per label, per locator and
# per byte of text. It errs on the high side so that the bound is a real bound.
_COST_ENTRY: Final = 672
_COST_LABEL: Final = 176
_COST_LOCATOR: Final = 320
_COST_ROUTE: Final = 256


def entry_cost(entry: ProcEntry) -> int:
    """The bytes ``entry`` is accounted for in a directory's ``max_bytes`` budget: an
    estimate of what holding it costs (the object graph, its slot in the directory and its
    route), measured with tracemalloc and rounded up."""
    cost = _COST_ENTRY + 2 * len(entry.tls_server_name)
    for key, value in entry.labels.sorted_items():
        cost += _COST_LABEL + 2 * (len(key) + len(value))
    locators = entry.locators
    if locators:
        cost += _COST_ROUTE
        for locator in locators:
            address = locator.address
            cost += _COST_LOCATOR + len(address.scheme) + len(address.opaque)
    return cost


_K = ApplyErrorKind


# --------------------------------------------------------------------------------------------
# Commands and effects


@final
@dataclass(frozen=True, slots=True)
class AdmitLink:
    """Admit ``link`` for ``child``; idempotent for the same pair. No visible effect."""

    link: LinkId
    child: Pid


@final
@dataclass(frozen=True, slots=True)
class BeginSnapshot:
    """Open (or replay) staging of snapshot ``snapshot`` at ``base_sequence``."""

    link: LinkId
    snapshot: int
    base_sequence: int


@final
@dataclass(frozen=True, slots=True)
class AppendSnapshotChunk:
    """Stage chunk ``chunk`` of snapshot ``snapshot``; nothing becomes visible."""

    link: LinkId
    snapshot: int
    chunk: int
    entries: tuple[ProcEntry, ...]

    def __post_init__(self) -> None:
        _tuple_of(self, "entries", self.entries, ProcEntry)


@final
@dataclass(frozen=True, slots=True)
class CommitSnapshot:
    """Atomically replace the link's publication with the ``chunks`` staged chunks."""

    link: LinkId
    snapshot: int
    chunks: int


@final
@dataclass(frozen=True, slots=True)
class ApplyDelta:
    """Apply publication ``sequence`` of the link: upsert and remove entries."""

    link: LinkId
    sequence: int
    upserts: tuple[ProcEntry, ...] = ()
    removals: tuple[Pid, ...] = ()

    def __post_init__(self) -> None:
        _tuple_of(self, "upserts", self.upserts, ProcEntry)
        _tuple_of(self, "removals", self.removals, Pid)


@final
@dataclass(frozen=True, slots=True)
class RemoveLink:
    """Remove the link and revoke every entry it owns; idempotent."""

    link: LinkId


DirectoryCommand = (
    AdmitLink | BeginSnapshot | AppendSnapshotChunk | CommitSnapshot | ApplyDelta | RemoveLink
)
"""Any command ``Nameserver.apply`` accepts."""

LinkResponse = PublicationAck | ResnapshotRequired
"""What a command owes the publishing child."""


@final
@dataclass(frozen=True, slots=True)
class DirectoryChange:
    """A visible change made by ``link``'s command, now at ``revision``.

    ``upserts`` are the entries that are new or differ (PID order); ``removals`` the PIDs
    revoked (PID order).
    """

    link: LinkId
    revision: Revision
    upserts: tuple[ProcEntry, ...] = ()
    removals: tuple[Pid, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class ApplyEffects:
    """What a successful command did: the visible change (if any) and the response owed to
    the child (if any)."""

    directory_change: DirectoryChange | None = None
    link_response: LinkResponse | None = None
    superseded: LinkId | None = None
    """Set by an ``AdmitLink`` that replaced the child's previous link (which is now gone,
    its entries revoked by ``directory_change``): the driver fences that link."""

    @property
    def is_empty(self) -> bool:
        """True when the command had no visible effect, owes no response and superseded
        nothing."""
        return (
            self.directory_change is None and self.link_response is None and self.superseded is None
        )


_NO_EFFECTS: Final = ApplyEffects()


class _Claim(enum.Enum):
    """What happens to one PID a link publishes."""

    KEEP = "keep"  # store it (the link's own or an unclaimed relayed PID)
    TAKE_OVER = "take over"  # the owner's own link replaces a relayed entry
    DROP = "drop"  # relayed while the owner is linked elsewhere: ignored


# --------------------------------------------------------------------------------------------
# Internal link state


@final
@dataclass(frozen=True, slots=True)
class _SnapshotCommit:
    snapshot: int
    chunks: int


@final
@dataclass(frozen=True, slots=True)
class _DeltaCommit:
    upserts: tuple[ProcEntry, ...]
    removals: tuple[Pid, ...]


@final
@dataclass(slots=True)
class _Active:
    sequence: int
    pids: set[Pid]  # mutated in place by deltas: O(change), not O(publication)
    last_commit: _SnapshotCommit | _DeltaCommit


@final
@dataclass(slots=True)
class _Staged:
    snapshot: int
    base_sequence: int
    chunks: list[tuple[ProcEntry, ...]]
    pids: set[Pid]
    entries: int = 0
    cost: int = 0
    costs: list[list[int]] = field(default_factory=list)  # entry_cost, per chunk and entry


@final
@dataclass(slots=True)
class _LinkState:
    child: Pid
    active: _Active | None = None
    staging: _Staged | None = None
    # Relayed claims dropped because the PID's owner is linked on its own link: removing one
    # later is a no-op rather than PID_NOT_OWNED_BY_LINK.
    dropped: set[Pid] = field(default_factory=set)


# --------------------------------------------------------------------------------------------
# Link ids


@final
class LinkIdAllocator:
    """Allocates the link ids of one parent incarnation (spec 3.6): the first 8 bytes of the
    authority PID followed by a big-endian u64 counter starting at 1.

    Ids are parent-scoped (two parents never collide) and monotonic (a reconnecting child
    always gets a fresh id). ``allocate()`` raises ``ApplyError`` (``COUNTER_EXHAUSTED``)
    after 2**64 - 1 ids.
    """

    __slots__ = ("_next", "_prefix")

    def __init__(self, authority: Pid) -> None:
        if not isinstance(authority, Pid):
            raise TypeError(f"authority must be a Pid, not {type(authority).__name__}")
        self._prefix = authority.raw[:8]
        self._next = 1

    def allocate(self) -> LinkId:
        """The next link id."""
        value = self._next
        if value > U64_MAX:
            raise ApplyError(_K.COUNTER_EXHAUSTED, "link ids")
        self._next = value + 1
        return LinkId(self._prefix + value.to_bytes(8, "big"))


# --------------------------------------------------------------------------------------------
# The directory


@final
class Nameserver:
    """The authoritative directory of one nameserver incarnation (see the module docstring).

    ``Nameserver(authority)`` rejects the link-local PID (``ApplyError`` kind
    ``RESERVED_PID``). ``apply(command)`` is the only mutator.
    """

    __slots__ = (
        "_authority",
        "_bytes",
        "_children",
        "_directory",
        "_index",
        "_links",
        "_max_bytes",
        "_max_entries",
        "_max_links",
        "_max_staged",
        "_revision",
        "_staged_bytes",
    )

    def __init__(
        self,
        authority: Pid,
        *,
        max_links: int = DEFAULT_MAX_LINKS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_staged_entries: int | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not isinstance(authority, Pid):
            raise TypeError(f"authority must be a Pid, not {type(authority).__name__}")
        if authority.is_link_local:
            raise ApplyError(_K.RESERVED_PID, "the authority cannot be the link-local PID")
        for name, bound in (
            ("max_links", max_links),
            ("max_entries", max_entries),
            ("max_bytes", max_bytes),
        ):
            if not isinstance(bound, int) or bound < 1:
                raise ValueError(f"{name} must be a positive int, got {bound!r}")
        staged = max_entries if max_staged_entries is None else max_staged_entries
        if not isinstance(staged, int) or staged < 1:
            raise ValueError(f"max_staged_entries must be a positive int, got {staged!r}")
        self._authority = authority
        self._revision = 0
        self._links: dict[LinkId, _LinkState] = {}
        self._children: dict[Pid, LinkId] = {}
        # PID -> (owning link, entry, accounted cost of the entry)
        self._directory: dict[Pid, tuple[LinkId, ProcEntry, int]] = {}
        self._index: list[Pid] | None = None
        self._max_links = max_links
        self._max_entries = max_entries
        self._max_staged = staged
        self._max_bytes = max_bytes
        self._bytes = 0
        self._staged_bytes = 0

    # -- reads ------------------------------------------------------------------------------

    @property
    def authority(self) -> Pid:
        """The PID of this nameserver."""
        return self._authority

    @property
    def revision(self) -> Revision:
        """The current revision (``authority``, counter)."""
        return Revision(self._authority, self._revision)

    def __len__(self) -> int:
        return len(self._directory)

    @property
    def bytes_used(self) -> int:
        """Accounted bytes (``entry_cost``) of the visible entries."""
        return self._bytes

    @property
    def staged_bytes(self) -> int:
        """Accounted bytes of the entries staged in open snapshots (all links)."""
        return self._staged_bytes

    @property
    def max_bytes(self) -> int:
        """The bound on ``bytes_used`` (and, separately, on ``staged_bytes``)."""
        return self._max_bytes

    def __contains__(self, pid: object) -> bool:
        return pid in self._directory

    def get(self, pid: Pid) -> ProcEntry | None:
        """The visible entry of ``pid``, if any."""
        owned = self._directory.get(pid)
        return None if owned is None else owned[1]

    def owner(self, pid: Pid) -> LinkId | None:
        """The link that published ``pid``, if any."""
        owned = self._directory.get(pid)
        return None if owned is None else owned[0]

    def resolve(self, pid: Pid) -> Found | None:
        """``Found`` at the current revision when ``pid`` is in the directory."""
        owned = self._directory.get(pid)
        return None if owned is None else Found(owned[1], self.revision)

    def snapshot(self) -> tuple[ProcEntry, ...]:
        """Every visible entry in PID order (the authority's own entry is not included)."""
        return tuple(self._directory[pid][1] for pid in self._sorted_pids())

    def entries_after(self, after: Pid | None, count: int) -> list[ProcEntry]:
        """Up to ``count`` visible entries with PIDs above ``after`` (all when ``None``), in
        PID order. The sorted index is rebuilt once per revision, so paging through one
        revision costs O(log n + count) per page."""
        pids = self._sorted_pids()
        start = 0 if after is None else bisect.bisect_right(pids, after)
        directory = self._directory
        return [directory[pid][1] for pid in pids[start : start + max(count, 0)]]

    def child_links(self) -> Mapping[Pid, LinkId]:
        """Directly admitted children: a read-only copy of child PID -> link."""
        return MappingProxyType(dict(self._children))

    def link_child(self, link: LinkId) -> Pid | None:
        """The child PID admitted on ``link``, if the link exists."""
        state = self._links.get(link)
        return None if state is None else state.child

    def link_pids(self, link: LinkId) -> frozenset[Pid]:
        """The PIDs ``link`` currently publishes (empty for an unknown link)."""
        state = self._links.get(link)
        if state is None or state.active is None:
            return frozenset()
        return frozenset(state.active.pids)

    def link_sequence(self, link: LinkId) -> int | None:
        """The last committed publication sequence of ``link``, if any."""
        state = self._links.get(link)
        if state is None or state.active is None:
            return None
        return state.active.sequence

    # -- the commit point -------------------------------------------------------------------

    def apply(self, command: DirectoryCommand) -> ApplyEffects:
        """Apply one command atomically; ``ApplyError`` leaves the directory unchanged."""
        if isinstance(command, AdmitLink):
            return self._admit(command)
        if isinstance(command, BeginSnapshot):
            return self._begin(command)
        if isinstance(command, AppendSnapshotChunk):
            return self._append(command)
        if isinstance(command, CommitSnapshot):
            return self._commit(command)
        if isinstance(command, ApplyDelta):
            return self._delta(command)
        if isinstance(command, RemoveLink):
            return self._remove(command)
        raise TypeError(f"not a directory command: {type(command).__name__}")

    # -- commands ---------------------------------------------------------------------------

    def _admit(self, cmd: AdmitLink) -> ApplyEffects:
        if cmd.child.is_link_local:
            raise ApplyError(_K.RESERVED_PID, "a child cannot be the link-local PID")
        existing = self._links.get(cmd.link)
        if existing is not None:
            if existing.child == cmd.child:
                return _NO_EFFECTS
            raise ApplyError(_K.LINK_ALREADY_EXISTS, f"link {cmd.link} belongs to another child")
        old = self._children.get(cmd.child)
        if old is None and len(self._links) >= self._max_links:
            raise ApplyError(_K.CAPACITY_EXCEEDED, f"at most {self._max_links} links")
        change: DirectoryChange | None = None
        if old is not None:
            # The same authenticated PID on a new connection: the new link supersedes the old
            # one (a restarted node whose old connection has not timed out yet).
            change = self._remove(RemoveLink(old)).directory_change
        self._links[cmd.link] = _LinkState(cmd.child)
        self._children[cmd.child] = cmd.link
        if old is None:
            return _NO_EFFECTS
        return ApplyEffects(change, None, old)

    def _begin(self, cmd: BeginSnapshot) -> ApplyEffects:
        state = self._link(cmd.link)
        staging = state.staging
        if staging is not None and staging.snapshot == cmd.snapshot:
            if staging.base_sequence == cmd.base_sequence:
                return _NO_EFFECTS
            raise ApplyError(
                _K.CONFLICTING_REPLAY,
                f"snapshot {cmd.snapshot} began at base {staging.base_sequence}, "
                f"replayed with base {cmd.base_sequence}",
            )
        active = state.active
        if active is not None:
            last = active.last_commit
            if (
                active.sequence == cmd.base_sequence
                and isinstance(last, _SnapshotCommit)
                and last.snapshot == cmd.snapshot
            ):
                return _NO_EFFECTS
            if cmd.base_sequence < active.sequence:
                raise ApplyError(
                    _K.STALE_PUBLICATION_SEQUENCE,
                    f"current {active.sequence}, proposed {cmd.base_sequence}",
                    expected=active.sequence,
                    actual=cmd.base_sequence,
                )
        self._drop_staging(state)
        state.staging = _Staged(cmd.snapshot, cmd.base_sequence, [], set())
        return _NO_EFFECTS

    def _append(self, cmd: AppendSnapshotChunk) -> ApplyEffects:
        self._check_entries(cmd.entries)
        state = self._link(cmd.link)
        staging = state.staging
        if staging is None or staging.snapshot != cmd.snapshot:
            raise ApplyError(_K.WRONG_SNAPSHOT, f"snapshot {cmd.snapshot} is not staging")
        expected = len(staging.chunks)
        if cmd.chunk < expected:
            if staging.chunks[cmd.chunk] == cmd.entries:
                return _NO_EFFECTS
            raise ApplyError(
                _K.CONFLICTING_REPLAY, f"chunk {cmd.chunk} replayed with different entries"
            )
        if cmd.chunk > expected:
            raise ApplyError(
                _K.UNEXPECTED_SNAPSHOT_CHUNK,
                f"expected chunk {expected}, got {cmd.chunk}",
                expected=expected,
                actual=cmd.chunk,
            )
        for entry in cmd.entries:
            if entry.pid in staging.pids:
                raise ApplyError(_K.DUPLICATE_PID, "already staged", pid=entry.pid)
        if (
            staging.entries + len(cmd.entries) > self._max_staged
            or len(staging.chunks) >= self._max_staged
        ):
            raise ApplyError(
                _K.CAPACITY_EXCEEDED, f"at most {self._max_staged} staged entries/chunks"
            )
        costs = [entry_cost(entry) for entry in cmd.entries]
        cost = sum(costs)
        if self._staged_bytes + cost > self._max_bytes:
            raise ApplyError(
                _K.CAPACITY_EXCEEDED,
                f"snapshots being staged may hold at most {self._max_bytes} bytes",
            )
        staging.chunks.append(cmd.entries)
        staging.costs.append(costs)
        staging.pids.update(entry.pid for entry in cmd.entries)
        staging.entries += len(cmd.entries)
        staging.cost += cost
        self._staged_bytes += cost
        return _NO_EFFECTS

    def _commit(self, cmd: CommitSnapshot) -> ApplyEffects:
        state = self._link(cmd.link)
        staging = state.staging
        active = state.active
        if staging is None:
            if active is not None and active.last_commit == _SnapshotCommit(
                cmd.snapshot, cmd.chunks
            ):
                return ApplyEffects(None, PublicationAck(active.sequence))
            raise ApplyError(_K.WRONG_SNAPSHOT, f"snapshot {cmd.snapshot} is not staging")
        if staging.snapshot != cmd.snapshot:
            raise ApplyError(_K.WRONG_SNAPSHOT, f"snapshot {cmd.snapshot} is not staging")
        if cmd.chunks != len(staging.chunks):
            raise ApplyError(
                _K.INCOMPLETE_SNAPSHOT,
                f"{cmd.chunks} chunks declared, {len(staging.chunks)} staged",
                expected=cmd.chunks,
                actual=len(staging.chunks),
            )
        link = cmd.link
        new: dict[Pid, ProcEntry] = {}
        new_costs: dict[Pid, int] = {}
        dropped: set[Pid] = set()
        takeover: dict[Pid, LinkId] = {}
        for chunk, chunk_costs in zip(staging.chunks, staging.costs, strict=True):
            for entry, cost in zip(chunk, chunk_costs, strict=True):
                claim = self._claim(link, state, entry.pid)
                if claim is _Claim.DROP:
                    dropped.add(entry.pid)
                    continue
                if claim is _Claim.TAKE_OVER:
                    takeover[entry.pid] = self._directory[entry.pid][0]
                new[entry.pid] = entry
                new_costs[entry.pid] = cost
        directory = self._directory
        old: set[Pid] = active.pids if active is not None else set()
        removals = tuple(sorted(old - new.keys()))
        upserts = tuple(
            new[pid]
            for pid in sorted(new)
            if (o := directory.get(pid)) is None or o[0] != link or o[1] != new[pid]
        )
        added = sum(1 for pid in new if pid not in old and pid not in takeover)
        costs = self._check_capacity(
            added - len(removals), upserts, removals, [new_costs[e.pid] for e in upserts]
        )
        change = self._publish(link, upserts, removals, costs)
        self._take_over(takeover)
        self._drop_staging(state)
        state.staging = None
        state.dropped = dropped
        state.active = _Active(
            staging.base_sequence,
            set(new),
            _SnapshotCommit(cmd.snapshot, cmd.chunks),
        )
        return ApplyEffects(change, PublicationAck(staging.base_sequence))

    def _delta(self, cmd: ApplyDelta) -> ApplyEffects:
        self._check_entries(cmd.upserts)
        state = self._link(cmd.link)
        if state.staging is not None:
            raise ApplyError(_K.SNAPSHOT_IN_PROGRESS, f"snapshot {state.staging.snapshot}")
        active = state.active
        if active is None:
            return ApplyEffects(None, ResnapshotRequired(0))
        current = active.sequence
        if cmd.sequence <= current:
            last = active.last_commit
            if (
                cmd.sequence == current
                and isinstance(last, _DeltaCommit)
                and last != _DeltaCommit(cmd.upserts, cmd.removals)
            ):
                raise ApplyError(
                    _K.CONFLICTING_REPLAY, f"delta {current} replayed with different content"
                )
            return ApplyEffects(None, PublicationAck(current))
        if current == U64_MAX:
            raise ApplyError(_K.COUNTER_EXHAUSTED, "publication sequence")
        if cmd.sequence != current + 1:
            return ApplyEffects(None, ResnapshotRequired(current + 1))
        upserted = {entry.pid for entry in cmd.upserts}
        removed: set[Pid] = set()
        for pid in cmd.removals:
            if pid in removed:
                raise ApplyError(_K.DUPLICATE_PID, "removed twice", pid=pid)
            removed.add(pid)
        for pid in cmd.removals:
            if pid in upserted:
                raise ApplyError(_K.PID_BOTH_UPSERTED_AND_REMOVED, pid=pid)
        directory = self._directory
        link = cmd.link
        dropped: set[Pid] = set()
        takeover: dict[Pid, LinkId] = {}
        for pid in upserted:
            claim = self._claim(link, state, pid)
            if claim is _Claim.DROP:
                dropped.add(pid)
            elif claim is _Claim.TAKE_OVER:
                takeover[pid] = directory[pid][0]
        for pid in cmd.removals:
            if pid not in active.pids and pid not in state.dropped:
                raise ApplyError(_K.PID_NOT_OWNED_BY_LINK, pid=pid)
        changed = tuple(
            sorted(
                (
                    e
                    for e in cmd.upserts
                    if e.pid not in dropped
                    and ((o := directory.get(e.pid)) is None or o[0] != link or o[1] != e)
                ),
                key=lambda e: e.pid,
            )
        )
        forgotten = removed & state.dropped  # removals of dropped claims: no-ops
        removed -= forgotten
        removals = tuple(sorted(removed))
        upserted -= dropped
        added = sum(1 for pid in upserted if pid not in active.pids and pid not in takeover)
        costs = self._check_capacity(added - len(removals), changed, removals)
        change = self._publish(link, changed, removals, costs)
        self._take_over(takeover)
        state.dropped -= forgotten
        state.dropped -= upserted
        state.dropped |= dropped
        active.pids.difference_update(removed)
        active.pids.update(upserted)
        active.sequence = cmd.sequence
        active.last_commit = _DeltaCommit(cmd.upserts, cmd.removals)
        return ApplyEffects(change, PublicationAck(cmd.sequence))

    def _remove(self, cmd: RemoveLink) -> ApplyEffects:
        state = self._links.get(cmd.link)
        if state is None:
            return _NO_EFFECTS
        pids = state.active.pids if state.active is not None else set()
        change = self._publish(cmd.link, (), tuple(sorted(pids))) if pids else None
        self._drop_staging(state)
        del self._links[cmd.link]
        if self._children.get(state.child) == cmd.link:
            del self._children[state.child]
        return ApplyEffects(change, None)

    # -- helpers ----------------------------------------------------------------------------

    def _link(self, link: LinkId) -> _LinkState:
        state = self._links.get(link)
        if state is None:
            raise ApplyError(_K.UNKNOWN_LINK, f"link {link}")
        return state

    def _check_entries(self, entries: Iterable[ProcEntry]) -> None:
        seen: set[Pid] = set()
        for entry in entries:
            if entry.pid.is_link_local:
                raise ApplyError(_K.RESERVED_PID, "an entry cannot be the link-local PID")
            if entry.pid in seen:
                raise ApplyError(_K.DUPLICATE_PID, "repeated in one list", pid=entry.pid)
            seen.add(entry.pid)
        if self._authority in seen:
            raise ApplyError(
                _K.AUTHORITY_PID, "a child cannot publish its parent", pid=self._authority
            )

    def _claim(self, link: LinkId, state: _LinkState, pid: Pid) -> _Claim:
        """May ``link`` (admitted for ``state.child``) publish ``pid``? See the module
        docstring: the owner on its own link takes over a relayed entry; a relayed entry for
        a PID whose owner is linked elsewhere is dropped; two relayed claims conflict."""
        owned = self._directory.get(pid)
        if pid == state.child:
            return _Claim.TAKE_OVER if owned is not None and owned[0] != link else _Claim.KEEP
        owner_link = self._children.get(pid)
        if owner_link is not None and owner_link != link:
            return _Claim.DROP
        if owned is not None and owned[0] != link:
            raise ApplyError(_K.PID_OWNED_BY_ANOTHER_LINK, pid=pid)
        return _Claim.KEEP

    def _take_over(self, previous: dict[Pid, LinkId]) -> None:
        """After ``_publish`` gave each PID of ``previous`` to its owner's own link: the
        relaying link's claim is dropped (its later removal is a no-op)."""
        for pid, relay in previous.items():
            state = self._links.get(relay)
            if state is not None and state.active is not None:
                state.active.pids.discard(pid)
                state.dropped.add(pid)

    def _drop_staging(self, state: _LinkState) -> None:
        if state.staging is not None:
            self._staged_bytes -= state.staging.cost
            state.staging.cost = 0

    def _check_capacity(
        self,
        growth: int,
        upserts: tuple[ProcEntry, ...],
        removals: Iterable[Pid],
        costs: list[int] | None = None,
    ) -> list[int]:
        """Check the entry and byte bounds for a change; return the upserts' costs."""
        if growth > 0 and len(self._directory) + growth > self._max_entries:
            raise ApplyError(_K.CAPACITY_EXCEEDED, f"at most {self._max_entries} entries")
        directory = self._directory
        if costs is None:
            costs = [entry_cost(entry) for entry in upserts]
        delta = sum(costs)
        for entry in upserts:
            owned = directory.get(entry.pid)
            if owned is not None:
                delta -= owned[2]
        for pid in removals:
            delta -= directory[pid][2]
        if delta > 0 and self._bytes + delta > self._max_bytes:
            raise ApplyError(
                _K.CAPACITY_EXCEEDED,
                f"the namespace holds at most {self._max_bytes} bytes "
                f"({self._bytes} used, {delta} more asked)",
            )
        return costs

    def _publish(
        self,
        link: LinkId,
        upserts: tuple[ProcEntry, ...],
        removals: tuple[Pid, ...],
        costs: list[int] | None = None,
    ) -> DirectoryChange | None:
        """Make a validated change visible; bumps the revision once if anything changes.

        Must not fail after the first mutation: the only failure (counter exhaustion) is
        checked first.
        """
        if not upserts and not removals:
            return None
        if self._revision == U64_MAX:
            raise ApplyError(_K.COUNTER_EXHAUSTED, "directory revision")
        directory = self._directory
        used = self._bytes
        if costs is None:
            costs = [entry_cost(entry) for entry in upserts]
        for pid in removals:
            used -= directory.pop(pid)[2]
        for entry, cost in zip(upserts, costs, strict=True):
            old = directory.get(entry.pid)
            if old is not None:
                used -= old[2]
            used += cost
            directory[entry.pid] = (link, entry, cost)
        self._bytes = used
        self._revision += 1
        self._index = None
        return DirectoryChange(link, self.revision, upserts, removals)

    def _sorted_pids(self) -> list[Pid]:
        index = self._index
        if index is None:
            index = sorted(self._directory)
            self._index = index
        return index
