"""The ``shm`` provider's registration bookkeeping (sans-IO): share or copy, and where.

Why here, before the provider exists: the decisions of the ``shm`` provider are pure and can be
tested now. On one host the owner's memory can be read and written by another process with a
plain memcpy, without the owner, when that memory lies in a *shared file mapping* another
process can map too: a memfd (``/memfd:NAME``) or a file in ``/dev/shm``. The provider will hand
the file descriptor over the authenticated direct lane with SCM_RIGHTS.

* ``parse_maps(text)`` reads ``/proc/<pid>/maps`` text into ``MapEntry`` records;
  ``locate(entries, address, length)`` says whether ``[address, address + length)`` lies inside
  one shared, shareable file mapping (``Shared``: which file, at which offset) or not
  (``MustCopy``): then the registration is copied into a slot of the provider's own memfd
  segment on register, and that copy is what other processes see (documented as such: the
  owner's later writes to its original memory are not visible through a copied registration).
* ``SlotAllocator`` hands out and takes back the byte ranges of such a segment (first fit,
  neighbours merged on release), bounded by the segment's capacity.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Final

__all__ = [
    "SHAREABLE_PREFIXES",
    "MapEntry",
    "MustCopy",
    "Shared",
    "SlotAllocator",
    "locate",
    "parse_maps",
]

#: Mapped files another process of the host can open and map as well.
SHAREABLE_PREFIXES: Final = ("/memfd:", "/dev/shm/")


@dataclass(frozen=True, slots=True)
class MapEntry:
    """One line of ``/proc/<pid>/maps``: ``[start, end)``, permissions (``rw-s``), the file
    offset of ``start``, the inode and the path (``""`` for anonymous memory)."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str

    @property
    def shared(self) -> bool:
        return len(self.perms) == 4 and self.perms[3] == "s"


@dataclass(frozen=True, slots=True)
class Shared:
    """The region is inside a shareable mapping: ``path`` (as maps shows it), ``inode`` and the
    region's ``offset`` in that file."""

    path: str
    inode: int
    offset: int


@dataclass(frozen=True, slots=True)
class MustCopy:
    """The region cannot be shared as it is (anonymous or private memory, or it spans
    mappings): it is copied into the provider's segment on register."""

    reason: str


def parse_maps(text: str) -> list[MapEntry]:
    """The entries of a ``/proc/<pid>/maps`` text, in its order; malformed lines are skipped
    (the kernel writes the file; a line is never trusted to have every field)."""
    entries = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        bounds, perms, offset, _device, inode = fields[:5]
        start_text, sep, end_text = bounds.partition("-")
        try:
            start, end = int(start_text, 16), int(end_text, 16)
            entry = MapEntry(
                start,
                end,
                perms,
                int(offset, 16),
                int(inode),
                fields[5].strip() if len(fields) > 5 else "",
            )
        except ValueError:
            continue
        if sep and start < end:
            entries.append(entry)
    return entries


def locate(entries: list[MapEntry], address: int, length: int) -> Shared | MustCopy:
    """Where ``[address, address + length)`` can be shared from (see the module docstring)."""
    if length <= 0:
        return MustCopy("an empty region")
    for entry in entries:
        if entry.start <= address < entry.end:
            if address + length > entry.end:
                return MustCopy("the region spans more than one mapping")
            if not entry.shared:
                return MustCopy(f"private memory ({entry.path or 'anonymous'})")
            if not entry.path.startswith(SHAREABLE_PREFIXES):
                return MustCopy(f"a shared mapping of {entry.path or 'anonymous memory'}")
            return Shared(entry.path, entry.inode, entry.offset + address - entry.start)
    return MustCopy("the address is not mapped")


class SlotAllocator:
    """Byte ranges of one segment of ``capacity`` bytes, each aligned to ``align`` bytes."""

    def __init__(self, capacity: int, align: int = 64) -> None:
        if capacity < 0 or align < 1 or align & (align - 1):
            raise ValueError(f"bad segment ({capacity=}, {align=}: a power of two)")
        self.capacity = capacity
        self.align = align
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity else []  # sorted
        self._used: dict[int, int] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free ``(offset, size)`` ranges, sorted and never adjacent."""
        return list(self._free)

    def allocate(self, size: int) -> int | None:
        """The offset of a new range of ``size`` bytes (rounded up to the alignment), or
        ``None`` when no free range is large enough."""
        if size < 1:
            raise ValueError(f"a slot holds at least one byte, not {size}")
        need = -(-size // self.align) * self.align
        for index, (offset, free) in enumerate(self._free):
            if free >= need:
                if free == need:
                    del self._free[index]
                else:
                    self._free[index] = (offset + need, free - need)
                self._used[offset] = need
                return offset
        return None

    def release(self, offset: int) -> None:
        """Give back the range at ``offset``; ``KeyError`` if none was handed out there."""
        size = self._used.pop(offset)
        index = bisect.bisect_left(self._free, (offset, 0))
        start, end = offset, offset + size
        if index < len(self._free) and self._free[index][0] == end:
            end += self._free.pop(index)[1]
        if index > 0 and sum(self._free[index - 1]) == start:
            index -= 1
            start = self._free.pop(index)[0]
        self._free.insert(index, (start, end - start))
