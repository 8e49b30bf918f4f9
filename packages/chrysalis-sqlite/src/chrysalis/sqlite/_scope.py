"""Site scopes: which origins a link carries in each direction (topology scope filtering).

Why scopes: replicas form a tree (the Chrysalis namespace tree), and every change must reach
every replica exactly along the tree without echoing back toward where it came from. Each side
of a link advertises a *scope*:

- a child advertises to its parent an ``Explicit`` set: its own site plus every site of its
  subtree (``SubtreeScopeAggregator`` builds it from the children's scopes, with a generation
  that grows on every change);
- a parent advertises to a child the ``ComplementOfPeer`` scope: "every origin except yours".

The outbound rule on a link follows from the local scope (``outbound_eligibility``): a local
explicit scope means **Allow** mode over those sites (upward, send only origins of our own
subtree); a local complement means **Block** mode over the peer's explicit sites (downward, send
everything except the child subtree's own origins). Changes therefore never flow back toward
their origin subtree (split horizon).

A scope pair is *anchored* when each side's scope contains its own site; for a complement,
"contains" means "is not in the other side's explicit set", so two complements anchor nothing.
Peer scope updates are monotonic: the mode never changes, an explicit generation never goes
down, and one generation never names two different site sets (``update_peer_scope``).

This module is pure: no I/O, no clocks.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from chrysalis.sqlite._errors import SiteScopeError, SiteScopeErrorKind, quote

__all__ = [
    "MAX_GENERATION",
    "MAX_SCOPE_SITES",
    "SITE_ID_LEN",
    "EligibilityMode",
    "SitePublisher",
    "SiteScope",
    "SiteSet",
    "SubtreeScopeAggregator",
    "outbound_eligibility",
    "update_peer_scope",
    "validate_scope_pair",
]

SITE_ID_LEN: Final = 16
"""Bytes in a replica site id."""

MAX_SCOPE_SITES: Final = 65_536
"""Most site ids in one explicit scope (the wire limit of a scope's count)."""

MAX_GENERATION: Final = 2**64 - 1
"""Largest scope generation (a u64 on the wire)."""


def _site(site_id: object) -> bytes:
    if not isinstance(site_id, bytes | bytearray | memoryview):
        raise SiteScopeError(
            SiteScopeErrorKind.INVALID_SITE_ID, f"not bytes: {type(site_id).__name__}"
        )
    raw = bytes(site_id)
    if len(raw) != SITE_ID_LEN:
        raise SiteScopeError(SiteScopeErrorKind.INVALID_SITE_ID, f"{quote(raw)}")
    return raw


@dataclass(frozen=True, slots=True)
class SiteSet:
    """An immutable, generation-stamped set of site ids.

    ``site_ids`` is sorted and deduplicated by the constructor; each id must be exactly 16 bytes
    and there may be at most ``MAX_SCOPE_SITES``; ``generation`` is a u64. Violations raise
    ``SiteScopeError``.
    """

    generation: int
    site_ids: tuple[bytes, ...]

    def __init__(self, generation: int, site_ids: Iterable[bytes]) -> None:
        if not isinstance(generation, int) or not 0 <= generation <= MAX_GENERATION:
            raise SiteScopeError(
                SiteScopeErrorKind.GENERATION_EXHAUSTED, f"generation {quote(generation)}"
            )
        ids = sorted({_site(s) for s in site_ids})
        if len(ids) > MAX_SCOPE_SITES:
            raise SiteScopeError(SiteScopeErrorKind.TOO_MANY_SITES, f"{len(ids)} sites")
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "site_ids", tuple(ids))

    def __contains__(self, site_id: object) -> bool:
        return site_id in self.site_ids


@dataclass(frozen=True, slots=True)
class SiteScope:
    """What one side of a link advertises: an explicit ``SiteSet`` or ``ComplementOfPeer``.

    ``sites`` is the explicit set, or ``None`` for the complement of the peer's explicit set.
    Build with ``SiteScope.explicit(...)`` or ``SiteScope.complement()``.
    """

    sites: SiteSet | None

    @classmethod
    def explicit(cls, sites: SiteSet) -> SiteScope:
        """An explicit scope over ``sites``."""
        return cls(sites)

    @classmethod
    def complement(cls) -> SiteScope:
        """The scope "every origin except the peer's explicit sites"."""
        return _COMPLEMENT

    @property
    def is_complement(self) -> bool:
        """Whether this is the ``ComplementOfPeer`` scope."""
        return self.sites is None

    def contains(self, site_id: bytes, other: SiteScope) -> bool:
        """Whether this scope covers ``site_id``, where ``other`` is the opposite side's scope.

        Explicit: membership. Complement: ``site_id`` is not in ``other``'s explicit set.
        Two complements cover nothing (``UNANCHORED_COMPLEMENT``).
        """
        if self.sites is not None:
            return site_id in self.sites.site_ids
        if other.sites is None:
            raise SiteScopeError(SiteScopeErrorKind.UNANCHORED_COMPLEMENT)
        return site_id not in other.sites.site_ids


_COMPLEMENT: Final = SiteScope(None)


class EligibilityMode(enum.IntEnum):
    """How a link's outbound origin set is expressed (stored in ``eligibility_mode``).

    ``ALLOW``: only the listed sites are sent. ``BLOCK``: every origin except the listed sites.
    """

    ALLOW = 0
    BLOCK = 1


def validate_scope_pair(
    local_site: bytes, local_scope: SiteScope, peer_site: bytes, peer_scope: SiteScope
) -> None:
    """Check that a (local, peer) scope pair is anchored.

    Both site ids must be 16 bytes; the local scope must contain the local site and the peer
    scope the peer site (complements judged against the other side). Raises ``SiteScopeError``.
    """
    local_site = _site(local_site)
    peer_site = _site(peer_site)
    if not local_scope.contains(local_site, peer_scope):
        raise SiteScopeError(SiteScopeErrorKind.OWN_SITE_MISSING, local_site.hex())
    if not peer_scope.contains(peer_site, local_scope):
        raise SiteScopeError(SiteScopeErrorKind.PEER_SITE_MISSING, peer_site.hex())


def update_peer_scope(old: SiteScope | None, new: SiteScope) -> SiteScope:
    """The peer scope after the peer advertised ``new`` while ``old`` was recorded.

    The mode may not change (``SITE_SCOPE_CHANGED``); an explicit generation may not go down
    (``SITE_GENERATION_REGRESSED``); the same generation with other sites is
    ``CONFLICTING_SITE_GENERATION``. An identical replay returns ``old`` unchanged.
    """
    if old is None:
        return new
    if old.sites is None or new.sites is None:
        if (old.sites is None) != (new.sites is None):
            raise SiteScopeError(SiteScopeErrorKind.SITE_SCOPE_CHANGED)
        return old
    if new.sites.generation < old.sites.generation:
        raise SiteScopeError(
            SiteScopeErrorKind.SITE_GENERATION_REGRESSED,
            f"{new.sites.generation} after {old.sites.generation}",
        )
    if new.sites.generation == old.sites.generation:
        if new.sites.site_ids != old.sites.site_ids:
            raise SiteScopeError(
                SiteScopeErrorKind.CONFLICTING_SITE_GENERATION, f"generation {new.sites.generation}"
            )
        return old
    return new


def outbound_eligibility(
    local_scope: SiteScope, peer_scope: SiteScope
) -> tuple[EligibilityMode, frozenset[bytes]]:
    """The outbound origin filter of a link: ``(mode, sites)``.

    A local explicit scope gives ``ALLOW`` over the local explicit sites; a local complement
    gives ``BLOCK`` over the peer's explicit sites (``UNANCHORED_COMPLEMENT`` if both sides are
    complements).
    """
    if local_scope.sites is not None:
        return EligibilityMode.ALLOW, frozenset(local_scope.sites.site_ids)
    if peer_scope.sites is None:
        raise SiteScopeError(SiteScopeErrorKind.UNANCHORED_COMPLEMENT)
    return EligibilityMode.BLOCK, frozenset(peer_scope.sites.site_ids)


class SitePublisher:
    """The scope advertised on one link, changeable while sessions run.

    A session reads ``scope`` on every event and sends a ``Scope`` message when it changed.
    Build with ``SitePublisher.explicit(own_site, ids)`` (generation 0; must contain the own
    site), ``SitePublisher.local(own_site)`` (just ``{own_site}``) or
    ``SitePublisher.complement(own_site)``. ``set(ids)`` replaces the explicit sites with the
    next generation; it is refused for a complement publisher (``COMPLEMENT_IS_DERIVED``) and
    when ``ids`` lacks the own site (``OWN_SITE_MISSING``).
    """

    __slots__ = ("_own_site", "_scope")

    def __init__(self, own_site: bytes, scope: SiteScope) -> None:
        self._own_site = _site(own_site)
        if scope.sites is not None and self._own_site not in scope.sites.site_ids:
            raise SiteScopeError(SiteScopeErrorKind.OWN_SITE_MISSING, self._own_site.hex())
        self._scope = scope

    @classmethod
    def explicit(cls, own_site: bytes, site_ids: Iterable[bytes]) -> SitePublisher:
        """A publisher of the explicit scope ``site_ids`` at generation 0."""
        return cls(own_site, SiteScope.explicit(SiteSet(0, site_ids)))

    @classmethod
    def local(cls, own_site: bytes) -> SitePublisher:
        """A publisher of the explicit scope ``{own_site}`` (a leaf, or a full mesh)."""
        return cls.explicit(own_site, [own_site])

    @classmethod
    def complement(cls, own_site: bytes) -> SitePublisher:
        """A publisher of ``ComplementOfPeer`` (a parent toward one child)."""
        return cls(own_site, SiteScope.complement())

    @property
    def own_site(self) -> bytes:
        """The site id this publisher speaks for."""
        return self._own_site

    @property
    def scope(self) -> SiteScope:
        """The current scope."""
        return self._scope

    def set(self, site_ids: Iterable[bytes]) -> SiteScope:
        """Publish ``site_ids`` as the next generation of the explicit scope; returns it."""
        sites = self._scope.sites
        if sites is None:
            raise SiteScopeError(SiteScopeErrorKind.COMPLEMENT_IS_DERIVED)
        if sites.generation >= MAX_GENERATION:
            raise SiteScopeError(SiteScopeErrorKind.GENERATION_EXHAUSTED)
        new = SiteSet(sites.generation + 1, site_ids)
        if self._own_site not in new.site_ids:
            raise SiteScopeError(SiteScopeErrorKind.OWN_SITE_MISSING, self._own_site.hex())
        self._scope = SiteScope.explicit(new)
        return self._scope

    def __repr__(self) -> str:
        return f"SitePublisher(own_site={self._own_site.hex()}, scope={self._scope!r})"


class SubtreeScopeAggregator:
    """Builds the upward scope of one replica from the scopes its children advertise.

    ``upstream`` is the ``SitePublisher`` for the link to the parent. It starts as
    ``{own_site}``; whenever a child's latest explicit scope changes (``update_child``) or a
    child link ends (``remove_child``), it republishes the sorted, deduplicated union of the
    own site and every child's explicit sites, with the next generation, so subtree membership
    propagates up the tree. ``link`` keys are opaque and hashable (a link id). At most
    ``max_children`` children are tracked.
    """

    __slots__ = ("_children", "_max_children", "upstream")

    def __init__(self, own_site: bytes, *, max_children: int = 4096) -> None:
        self.upstream = SitePublisher.local(own_site)
        self._children: dict[object, frozenset[bytes]] = {}
        self._max_children = max_children

    def update_child(self, link: object, scope: SiteScope | None) -> bool:
        """Record the latest scope of the child on ``link``; returns whether upstream changed.

        ``None`` or a complement scope records no sites for the child.
        """
        sites: frozenset[bytes] = frozenset()
        if scope is not None and scope.sites is not None:
            sites = frozenset(scope.sites.site_ids)
        if link in self._children:
            if self._children[link] == sites:
                return False
        elif len(self._children) >= self._max_children:
            raise SiteScopeError(SiteScopeErrorKind.TOO_MANY_SITES, "too many child links")
        self._children[link] = sites
        return self._republish()

    def remove_child(self, link: object) -> bool:
        """Forget the child on ``link``; returns whether upstream changed."""
        if self._children.pop(link, None) is None:
            return False
        return self._republish()

    def _republish(self) -> bool:
        wanted = {self.upstream.own_site}.union(*self._children.values())
        current = self.upstream.scope.sites
        if current is not None and set(current.site_ids) == wanted:
            return False
        self.upstream.set(wanted)
        return True
