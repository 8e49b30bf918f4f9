"""Nameserver protocol: constants, data model and the fourteen wire messages (spec 1).

Why typed values: the nameserver stream carries a handful of message kinds whose fields are
fixed-width integers, PIDs and small records. Each is a frozen, slotted dataclass that checks
its field *types and integer ranges* at construction, so a well-typed value always has an
encoding. The per-entry limits are checked here too (``ProcEntry``: server name, locator
count; ``Labels``: label count), so an entry that could never be encoded cannot exist. The
limits of whole messages (list counts, frame size) are wire limits, enforced by the codec on
encode and decode alike (``_codec``).

Structure only: which side may send which message, and in what order, is the sessions'
business (``_session``). Nothing here performs I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import UnionType
from typing import ClassVar, Final, final

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.nameserver._errors import FieldTooLarge, TooManyItems
from chrysalis.nameserver._labels import MAX_LABELS, Labels

__all__ = [
    "DEFAULT_PAGE_LIMIT",
    "DEFAULT_VERSIONS",
    "FRAME_PREFIX_LEN",
    "MAX_ADDRESS_LEN",
    "MAX_ENTRIES_PER_FRAME",
    "MAX_FRAME_BODY",
    "MAX_LABELS_PER_ENTRY",
    "MAX_LOCATORS_PER_ENTRY",
    "MAX_PAGE_LIMIT",
    "MAX_REMOVALS_PER_FRAME",
    "MAX_SCHEME_LEN",
    "MAX_SERVER_NAME_LEN",
    "MIN_FRAME_BODY",
    "NS_PROTOCOL_SELECTOR",
    "SNAPSHOT_CHUNK_ENTRIES",
    "U16_MAX",
    "U32_MAX",
    "U64_MAX",
    "VERSION_1",
    "VERSION_2",
    "VERSION_3",
    "WIRE_VERSION",
    "CacheUpdate",
    "Consistency",
    "Delta",
    "Enumerate",
    "EnumerateResult",
    "EnumerationCursor",
    "EnumerationPage",
    "EnumerationResult",
    "EnumerationStale",
    "Found",
    "Hello",
    "Locator",
    "NotFound",
    "NsMessage",
    "ProcEntry",
    "PublicationAck",
    "Reject",
    "RejectCode",
    "ResnapshotRequired",
    "Resolution",
    "Resolve",
    "ResolveResult",
    "Revision",
    "SnapshotBegin",
    "SnapshotChunk",
    "SnapshotEnd",
    "VersionRange",
    "Welcome",
]

# --------------------------------------------------------------------------------------------
# Constants

WIRE_VERSION: Final = 3
"""Framing version carried in every frame body (separate from the negotiated version)."""
NS_PROTOCOL_SELECTOR: Final = b"chrysalis.ns.v3\x00"
"""The 16-byte link-local protocol selector that opens a nameserver stream."""
FRAME_PREFIX_LEN: Final = 4
"""Bytes in the big-endian ``u32`` body-length prefix."""
MIN_FRAME_BODY: Final = 2
"""Smallest body: wire version and message tag."""
MAX_FRAME_BODY: Final = 4 * 1024 * 1024
"""Largest frame body (4 MiB), prefix excluded."""
MAX_ENTRIES_PER_FRAME: Final = 4096
"""Most entries in one entries list."""
MAX_REMOVALS_PER_FRAME: Final = 4096
"""Most PIDs in one removals list."""
MAX_LABELS_PER_ENTRY: Final = MAX_LABELS
"""Most labels on one entry (256)."""
MAX_LOCATORS_PER_ENTRY: Final = 64
"""Most locators on one entry."""
MAX_SERVER_NAME_LEN: Final = 255
"""Longest TLS server name, in UTF-8 bytes."""
MAX_SCHEME_LEN: Final = 255
"""Longest address scheme on the wire, in UTF-8 bytes."""
MAX_ADDRESS_LEN: Final = 64 * 1024
"""Longest opaque address on the wire, in bytes."""
DEFAULT_PAGE_LIMIT: Final = 256
"""Enumeration page size used for a requested limit of 0."""
MAX_PAGE_LIMIT: Final = 4096
"""Largest enumeration page; larger requested limits are clamped to it."""
SNAPSHOT_CHUNK_ENTRIES: Final = 1024
"""Entries per snapshot chunk sent by a child."""

U16_MAX: Final = (1 << 16) - 1
U32_MAX: Final = (1 << 32) - 1
U64_MAX: Final = (1 << 64) - 1

VERSION_1: Final = 1
"""Base protocol version."""
VERSION_2: Final = 2
"""Adds the ``AlreadyLinked`` rejection."""
VERSION_3: Final = 3
"""Adds labels to entries."""


def _uint(value: object, maximum: int, what: str, *, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{what} must be in {minimum}..{maximum}, got {value}")
    return value


def _typed(value: object, cls: type | UnionType, what: str) -> None:
    if not isinstance(value, cls):
        name = getattr(cls, "__name__", None) or str(cls)
        raise TypeError(f"{what} must be a {name}, not {type(value).__name__}")


def _tuple_of(owner: object, name: str, value: object, cls: type) -> None:
    """Coerce field ``name`` to a tuple whose items are ``cls`` instances."""
    if not isinstance(value, tuple):
        if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
            raise TypeError(f"{name} must be a tuple of {cls.__name__}")
        value = tuple(value)
        object.__setattr__(owner, name, value)
    assert isinstance(value, tuple)
    for item in value:
        if not isinstance(item, cls):
            raise TypeError(f"{name} items must be {cls.__name__}, not {type(item).__name__}")


# --------------------------------------------------------------------------------------------
# Enumerations


class Consistency(enum.IntEnum):
    """How fresh an answer must be (spec 1.7): ``CACHED`` may come from a link cache,
    ``REFRESH`` bypasses it and asks upstream."""

    CACHED = 1
    REFRESH = 2


class RejectCode(enum.IntEnum):
    """Why a parent refused a child's link (spec 1.4, 1.5)."""

    INCOMPATIBLE_VERSION = 1
    IDENTITY_MISMATCH = 2
    UNAVAILABLE = 3
    ALREADY_LINKED = 4
    """Only sent when the negotiated version is at least ``VERSION_2``."""


# --------------------------------------------------------------------------------------------
# Data model


@final
@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of protocol versions; ``1 <= min <= max <= 65535``
    (``ValueError`` otherwise)."""

    min: int
    max: int

    def __post_init__(self) -> None:
        _uint(self.min, U16_MAX, "version range min", minimum=1)
        _uint(self.max, U16_MAX, "version range max", minimum=1)
        if self.min > self.max:
            raise ValueError(f"version range min {self.min} is above max {self.max}")

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min <= version <= self.max

    def intersect(self, other: VersionRange) -> VersionRange | None:
        """The versions in both ranges, or ``None`` when they do not overlap."""
        low, high = max(self.min, other.min), min(self.max, other.max)
        return VersionRange(low, high) if low <= high else None


DEFAULT_VERSIONS: Final = VersionRange(VERSION_1, VERSION_3)
"""The range a node offers and accepts by default."""


@final
@dataclass(frozen=True, slots=True)
class Revision:
    """A directory revision: the authority that produced it and a counter value.

    Values are only comparable within one nameserver incarnation (same ``authority``); a
    revision is never a global clock.
    """

    authority: Pid
    value: int

    def __post_init__(self) -> None:
        _typed(self.authority, Pid, "Revision.authority")
        _uint(self.value, U64_MAX, "Revision.value")


@final
@dataclass(frozen=True, slots=True)
class Locator:
    """A next hop toward an entry's process, as seen by the observer; lower ``priority`` is
    preferred (``priority`` is a u32)."""

    address: DatagramAddr
    priority: int = 0

    def __post_init__(self) -> None:
        _typed(self.address, DatagramAddr, "Locator.address")
        _uint(self.priority, U32_MAX, "Locator.priority")


@final
@dataclass(frozen=True, slots=True)
class ProcEntry:
    """One process in the directory (spec 1.6).

    ``tls_server_name`` and ``labels`` describe the process itself and are never rewritten;
    ``locators`` are next hops from the observer's point of view and are rewritten at each
    hop. A list passed as ``locators`` is converted to a tuple.

    Every entry can be encoded: a server name over ``MAX_SERVER_NAME_LEN`` (255) UTF-8 bytes
    raises ``FieldTooLarge`` and more than ``MAX_LOCATORS_PER_ENTRY`` (64) locators raise
    ``TooManyItems`` (both ``ValueError``); ``Labels`` itself holds at most 256 labels.
    """

    pid: Pid
    tls_server_name: str
    labels: Labels = Labels.EMPTY
    locators: tuple[Locator, ...] = ()

    def __post_init__(self) -> None:
        _typed(self.pid, Pid, "ProcEntry.pid")
        _typed(self.tls_server_name, str, "ProcEntry.tls_server_name")
        _typed(self.labels, Labels, "ProcEntry.labels")
        _tuple_of(self, "locators", self.locators, Locator)
        name = self.tls_server_name
        if len(name) > MAX_SERVER_NAME_LEN or (
            not name.isascii() and len(name.encode("utf-8", "surrogatepass")) > MAX_SERVER_NAME_LEN
        ):
            raise FieldTooLarge(f"tls server name is longer than {MAX_SERVER_NAME_LEN} bytes")
        if len(self.locators) > MAX_LOCATORS_PER_ENTRY:
            raise TooManyItems(
                f"{len(self.locators)} locators, at most {MAX_LOCATORS_PER_ENTRY} allowed"
            )

    def with_locators(self, locators: tuple[Locator, ...]) -> ProcEntry:
        """The same process reached through other next hops."""
        if locators == self.locators:
            return self
        return ProcEntry(self.pid, self.tls_server_name, self.labels, locators)

    def preferred_locator(self) -> Locator | None:
        """The first locator with the lowest priority, or ``None`` without locators."""
        best: Locator | None = None
        for locator in self.locators:
            if best is None or locator.priority < best.priority:
                best = locator
        return best


@final
@dataclass(frozen=True, slots=True)
class Found:
    """A positive resolution: ``entry`` as of ``revision``. Positive answers never expire."""

    entry: ProcEntry
    revision: Revision

    def __post_init__(self) -> None:
        _typed(self.entry, ProcEntry, "Found.entry")
        _typed(self.revision, Revision, "Found.revision")

    @property
    def pid(self) -> Pid:
        """The resolved PID."""
        return self.entry.pid


@final
@dataclass(frozen=True, slots=True)
class NotFound:
    """A negative resolution: ``pid`` was unknown at ``revision``; a receiver may cache that
    for ``valid_for_millis`` (u64) from when it received the answer."""

    pid: Pid
    revision: Revision
    valid_for_millis: int

    def __post_init__(self) -> None:
        _typed(self.pid, Pid, "NotFound.pid")
        _typed(self.revision, Revision, "NotFound.revision")
        _uint(self.valid_for_millis, U64_MAX, "NotFound.valid_for_millis")


Resolution = Found | NotFound
"""The answer to a resolve: ``Found`` or ``NotFound``."""


@final
@dataclass(frozen=True, slots=True)
class EnumerationCursor:
    """Where the next enumeration page starts: after PID ``after``, valid only while the
    directory is still at ``revision``."""

    revision: Revision
    after: Pid

    def __post_init__(self) -> None:
        _typed(self.revision, Revision, "EnumerationCursor.revision")
        _typed(self.after, Pid, "EnumerationCursor.after")


@final
@dataclass(frozen=True, slots=True)
class EnumerationPage:
    """One enumeration page: ``entries`` in ascending PID order as of ``revision``, and the
    cursor of the next page (``None`` on the last page)."""

    entries: tuple[ProcEntry, ...]
    revision: Revision
    next: EnumerationCursor | None = None

    def __post_init__(self) -> None:
        _tuple_of(self, "entries", self.entries, ProcEntry)
        _typed(self.revision, Revision, "EnumerationPage.revision")
        if self.next is not None:
            _typed(self.next, EnumerationCursor, "EnumerationPage.next")


@final
@dataclass(frozen=True, slots=True)
class EnumerationStale:
    """The cursor's revision is gone; restart from the first page (the directory is now at
    ``current``)."""

    current: Revision

    def __post_init__(self) -> None:
        _typed(self.current, Revision, "EnumerationStale.current")


EnumerationResult = EnumerationPage | EnumerationStale
"""The answer to an enumeration: a page or a stale-cursor notice."""


# --------------------------------------------------------------------------------------------
# Messages


def _version(value: object, what: str) -> None:
    _uint(value, U16_MAX, what, minimum=1)


@final
@dataclass(frozen=True, slots=True)
class Hello:
    """Tag 1, child to parent: the versions the child speaks and its own PID."""

    TAG: ClassVar[int] = 1
    versions: VersionRange
    child: Pid

    def __post_init__(self) -> None:
        _typed(self.versions, VersionRange, "Hello.versions")
        _typed(self.child, Pid, "Hello.child")


@final
@dataclass(frozen=True, slots=True)
class Welcome:
    """Tag 2, parent to child: the admission, with the negotiated version, the parent's PID
    and the link id of this incarnation."""

    TAG: ClassVar[int] = 2
    version: int
    parent: Pid
    link: LinkId

    def __post_init__(self) -> None:
        _version(self.version, "Welcome.version")
        _typed(self.parent, Pid, "Welcome.parent")
        _typed(self.link, LinkId, "Welcome.link")


@final
@dataclass(frozen=True, slots=True)
class Reject:
    """Tag 3, parent to child: the link is refused; the parent closes the stream."""

    TAG: ClassVar[int] = 3
    code: RejectCode

    def __post_init__(self) -> None:
        _typed(self.code, RejectCode, "Reject.code")


@final
@dataclass(frozen=True, slots=True)
class SnapshotBegin:
    """Tag 4, child to parent: start staging snapshot ``snapshot`` replacing the child's
    publication at ``base_sequence``."""

    TAG: ClassVar[int] = 4
    snapshot: int
    base_sequence: int

    def __post_init__(self) -> None:
        _uint(self.snapshot, U64_MAX, "SnapshotBegin.snapshot")
        _uint(self.base_sequence, U64_MAX, "SnapshotBegin.base_sequence")


@final
@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Tag 5, child to parent: chunk ``chunk`` (0-based) of snapshot ``snapshot``."""

    TAG: ClassVar[int] = 5
    snapshot: int
    chunk: int
    entries: tuple[ProcEntry, ...]

    def __post_init__(self) -> None:
        _uint(self.snapshot, U64_MAX, "SnapshotChunk.snapshot")
        _uint(self.chunk, U32_MAX, "SnapshotChunk.chunk")
        _tuple_of(self, "entries", self.entries, ProcEntry)


@final
@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """Tag 6, child to parent: commit snapshot ``snapshot`` made of ``chunks`` chunks."""

    TAG: ClassVar[int] = 6
    snapshot: int
    chunks: int

    def __post_init__(self) -> None:
        _uint(self.snapshot, U64_MAX, "SnapshotEnd.snapshot")
        _uint(self.chunks, U32_MAX, "SnapshotEnd.chunks")


@final
@dataclass(frozen=True, slots=True)
class Delta:
    """Tag 7, child to parent: publication ``sequence``, the successor of the previous one."""

    TAG: ClassVar[int] = 7
    sequence: int
    upserts: tuple[ProcEntry, ...] = ()
    removals: tuple[Pid, ...] = ()

    def __post_init__(self) -> None:
        _uint(self.sequence, U64_MAX, "Delta.sequence")
        _tuple_of(self, "upserts", self.upserts, ProcEntry)
        _tuple_of(self, "removals", self.removals, Pid)


@final
@dataclass(frozen=True, slots=True)
class ResnapshotRequired:
    """Tag 8, parent to child: a delta did not follow on; send a complete snapshot. The
    parent expected ``expected_sequence``."""

    TAG: ClassVar[int] = 8
    expected_sequence: int

    def __post_init__(self) -> None:
        _uint(self.expected_sequence, U64_MAX, "ResnapshotRequired.expected_sequence")


@final
@dataclass(frozen=True, slots=True)
class Resolve:
    """Tag 9, child to parent: resolve ``pid``; ``request`` correlates the answer."""

    TAG: ClassVar[int] = 9
    request: int
    pid: Pid
    consistency: Consistency = Consistency.CACHED

    def __post_init__(self) -> None:
        _uint(self.request, U64_MAX, "Resolve.request")
        _typed(self.pid, Pid, "Resolve.pid")
        _typed(self.consistency, Consistency, "Resolve.consistency")


@final
@dataclass(frozen=True, slots=True)
class ResolveResult:
    """Tag 10, parent to child: the answer to request ``request``."""

    TAG: ClassVar[int] = 10
    request: int
    resolution: Resolution

    def __post_init__(self) -> None:
        _uint(self.request, U64_MAX, "ResolveResult.request")
        _typed(self.resolution, Found | NotFound, "ResolveResult.resolution")


@final
@dataclass(frozen=True, slots=True)
class CacheUpdate:
    """Tag 11, parent to child: an unsolicited resolution for the child's cache."""

    TAG: ClassVar[int] = 11
    resolution: Resolution

    def __post_init__(self) -> None:
        _typed(self.resolution, Found | NotFound, "CacheUpdate.resolution")


@final
@dataclass(frozen=True, slots=True)
class PublicationAck:
    """Tag 12, parent to child: every publication up to ``sequence`` is committed
    (cumulative)."""

    TAG: ClassVar[int] = 12
    sequence: int

    def __post_init__(self) -> None:
        _uint(self.sequence, U64_MAX, "PublicationAck.sequence")


@final
@dataclass(frozen=True, slots=True)
class Enumerate:
    """Tag 13, child to parent: request a page of entries after ``cursor`` (``None``: from
    the start); ``limit`` 0 means the default page size."""

    TAG: ClassVar[int] = 13
    request: int
    consistency: Consistency = Consistency.CACHED
    cursor: EnumerationCursor | None = None
    limit: int = 0

    def __post_init__(self) -> None:
        _uint(self.request, U64_MAX, "Enumerate.request")
        _typed(self.consistency, Consistency, "Enumerate.consistency")
        if self.cursor is not None:
            _typed(self.cursor, EnumerationCursor, "Enumerate.cursor")
        _uint(self.limit, U32_MAX, "Enumerate.limit")


@final
@dataclass(frozen=True, slots=True)
class EnumerateResult:
    """Tag 14, parent to child: the answer to enumeration request ``request``."""

    TAG: ClassVar[int] = 14
    request: int
    result: EnumerationResult

    def __post_init__(self) -> None:
        _uint(self.request, U64_MAX, "EnumerateResult.request")
        _typed(self.result, EnumerationPage | EnumerationStale, "EnumerateResult.result")


NsMessage = (
    Hello
    | Welcome
    | Reject
    | SnapshotBegin
    | SnapshotChunk
    | SnapshotEnd
    | Delta
    | ResnapshotRequired
    | Resolve
    | ResolveResult
    | CacheUpdate
    | PublicationAck
    | Enumerate
    | EnumerateResult
)
"""Any nameserver message."""
