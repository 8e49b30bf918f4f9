"""Read-side views of a nameserver: local resolution, paginated enumeration, locator rewriting
(the pure parts of spec 1.6, 1.7, 3.3 and 3.5).

Why here: the service answers a child from the directory plus its own entry, and every answer
that travels one hop up or down has its locators rewritten (a locator is the next hop *as seen
by the receiver*). These rules are small but easy to get subtly wrong, so they live in pure
functions that the I/O layer calls and the tests pin down.

Enumeration pages are stable within one revision: a page lists entries in ascending PID
order and, when more remain, a cursor ``(revision, last PID)``; a cursor from another revision
gets ``EnumerationStale(current)`` and the caller restarts. A requested limit of 0 means
``DEFAULT_PAGE_LIMIT`` and limits above ``MAX_PAGE_LIMIT`` are clamped.
"""

from __future__ import annotations

import bisect
from typing import Final

from chrysalis.core import Pid
from chrysalis.nameserver._protocol import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    U64_MAX,
    EnumerationCursor,
    EnumerationPage,
    EnumerationResult,
    EnumerationStale,
    Found,
    Locator,
    NotFound,
    ProcEntry,
    Resolution,
)
from chrysalis.nameserver._state import Nameserver

__all__ = [
    "DEFAULT_NEGATIVE_TTL_MS",
    "clamp_page_limit",
    "enumerate_local",
    "lookup_local",
    "resolve_local",
    "rewrite_enumeration",
    "rewrite_resolution",
]

DEFAULT_NEGATIVE_TTL_MS: Final = 1000
"""How long a root's ``NotFound`` may be cached by default, in milliseconds."""


def clamp_page_limit(limit: int) -> int:
    """The page size for a requested ``limit``: 0 -> ``DEFAULT_PAGE_LIMIT``, at most
    ``MAX_PAGE_LIMIT``."""
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a non-negative int, got {limit!r}")
    if limit == 0:
        return DEFAULT_PAGE_LIMIT
    return min(limit, MAX_PAGE_LIMIT)


def _check_local(directory: Nameserver, local_entry: ProcEntry | None) -> None:
    if local_entry is not None and local_entry.pid != directory.authority:
        raise ValueError("local_entry must be the authority's own entry")


def lookup_local(
    directory: Nameserver, pid: Pid, local_entry: ProcEntry | None = None
) -> Found | None:
    """``Found`` from the node itself (its own entry) or its directory, else ``None``.

    A local hit is authoritative whatever the requested consistency.
    """
    _check_local(directory, local_entry)
    if local_entry is not None and pid == local_entry.pid:
        return Found(local_entry, directory.revision)
    return directory.resolve(pid)


def resolve_local(
    directory: Nameserver,
    pid: Pid,
    *,
    local_entry: ProcEntry | None = None,
    negative_ttl_ms: int = DEFAULT_NEGATIVE_TTL_MS,
) -> Resolution:
    """Resolve as a node without upstream (a root) does: a local hit, else ``NotFound`` at
    the current revision, valid for ``negative_ttl_ms``."""
    if not isinstance(negative_ttl_ms, int) or not 0 <= negative_ttl_ms <= U64_MAX:
        raise ValueError(f"negative_ttl_ms must be a u64, got {negative_ttl_ms!r}")
    found = lookup_local(directory, pid, local_entry)
    if found is not None:
        return found
    return NotFound(pid, directory.revision, negative_ttl_ms)


def enumerate_local(
    directory: Nameserver,
    *,
    local_entry: ProcEntry | None = None,
    cursor: EnumerationCursor | None = None,
    limit: int = 0,
) -> EnumerationResult:
    """One page of the local view (the node's own entry merged with its directory)."""
    _check_local(directory, local_entry)
    revision = directory.revision
    if cursor is not None and cursor.revision != revision:
        return EnumerationStale(revision)
    size = clamp_page_limit(limit)
    after = None if cursor is None else cursor.after
    entries = directory.entries_after(after, size + 1)
    if local_entry is not None and (after is None or local_entry.pid > after):
        pids = [entry.pid for entry in entries]
        entries.insert(bisect.bisect_left(pids, local_entry.pid), local_entry)
        del entries[size + 1 :]
    page = tuple(entries[:size])
    following = EnumerationCursor(revision, page[-1].pid) if len(entries) > size else None
    return EnumerationPage(page, revision, following)


def rewrite_resolution(resolution: Resolution, locators: tuple[Locator, ...]) -> Resolution:
    """``resolution`` as seen one hop further: a ``Found`` entry reached through
    ``locators``; ``NotFound`` unchanged."""
    if isinstance(resolution, Found):
        entry = resolution.entry.with_locators(locators)
        return resolution if entry is resolution.entry else Found(entry, resolution.revision)
    return resolution


def rewrite_enumeration(
    result: EnumerationResult, locators: tuple[Locator, ...]
) -> EnumerationResult:
    """``result`` as seen one hop further: every page entry reached through ``locators``."""
    if isinstance(result, EnumerationPage):
        entries = tuple(entry.with_locators(locators) for entry in result.entries)
        return EnumerationPage(entries, result.revision, result.next)
    return result
