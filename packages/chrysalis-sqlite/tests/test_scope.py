"""Site sets, site scopes, scope pairs, scope updates, publishers and subtree aggregation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import (
    EligibilityMode,
    SitePublisher,
    SiteScope,
    SiteScopeError,
    SiteScopeErrorKind,
    SiteSet,
    SubtreeScopeAggregator,
    outbound_eligibility,
    update_peer_scope,
    validate_scope_pair,
)

A, B, C, D = (bytes([i]) * 16 for i in (1, 2, 3, 4))


def _explicit(generation: int, *sites: bytes) -> SiteScope:
    return SiteScope.explicit(SiteSet(generation, sites))


def _kind(exc: pytest.ExceptionInfo[SiteScopeError]) -> SiteScopeErrorKind:
    return exc.value.kind


def test_site_sets_are_sorted_deduplicated_and_validated() -> None:
    sites = SiteSet(3, [C, A, C, B])
    assert sites.site_ids == (A, B, C)
    assert sites.generation == 3
    assert B in sites
    with pytest.raises(SiteScopeError) as short:
        SiteSet(0, [b"short"])
    assert _kind(short) is SiteScopeErrorKind.INVALID_SITE_ID
    with pytest.raises(SiteScopeError):
        SiteSet(-1, [A])
    with pytest.raises(SiteScopeError):
        SiteSet(2**64, [A])


def test_site_scope_distinguishes_finite_and_complement_views() -> None:
    explicit = _explicit(0, A, B)
    complement = SiteScope.complement()
    assert not explicit.is_complement
    assert complement.is_complement
    assert explicit.contains(A, complement)
    assert not explicit.contains(C, complement)
    # a complement contains what the opposite explicit scope does not
    assert complement.contains(C, explicit)
    assert not complement.contains(A, explicit)
    with pytest.raises(SiteScopeError) as both:
        complement.contains(A, complement)
    assert _kind(both) is SiteScopeErrorKind.UNANCHORED_COMPLEMENT


def test_complement_scope_is_anchored_by_the_opposite_explicit_scope() -> None:
    # parent P (complement) talks to child C whose subtree is {C, D}
    validate_scope_pair(A, SiteScope.complement(), C, _explicit(0, C, D))
    validate_scope_pair(C, _explicit(0, C, D), A, SiteScope.complement())
    with pytest.raises(SiteScopeError) as own:
        # our own site inside the child's explicit set: the complement does not contain us
        validate_scope_pair(C, SiteScope.complement(), A, _explicit(0, A, C))
    assert _kind(own) is SiteScopeErrorKind.OWN_SITE_MISSING
    with pytest.raises(SiteScopeError) as peer:
        validate_scope_pair(A, _explicit(0, A), B, _explicit(0, C))
    assert _kind(peer) is SiteScopeErrorKind.PEER_SITE_MISSING
    with pytest.raises(SiteScopeError) as unanchored:
        validate_scope_pair(A, SiteScope.complement(), B, SiteScope.complement())
    assert _kind(unanchored) is SiteScopeErrorKind.UNANCHORED_COMPLEMENT
    with pytest.raises(SiteScopeError) as bad_site:
        validate_scope_pair(b"x", _explicit(0, A), B, _explicit(0, B))
    assert _kind(bad_site) is SiteScopeErrorKind.INVALID_SITE_ID


def test_explicit_scope_updates_are_monotonic_and_replayable() -> None:
    first = _explicit(1, A)
    assert update_peer_scope(None, first) is first
    replay = _explicit(1, A)
    assert update_peer_scope(first, replay) is first  # an identical replay is a no-op
    newer = _explicit(2, A, B)
    assert update_peer_scope(first, newer) is newer
    with pytest.raises(SiteScopeError) as regressed:
        update_peer_scope(newer, first)
    assert _kind(regressed) is SiteScopeErrorKind.SITE_GENERATION_REGRESSED
    with pytest.raises(SiteScopeError) as conflict:
        update_peer_scope(newer, _explicit(2, A, C))
    assert _kind(conflict) is SiteScopeErrorKind.CONFLICTING_SITE_GENERATION
    with pytest.raises(SiteScopeError) as changed:
        update_peer_scope(newer, SiteScope.complement())
    assert _kind(changed) is SiteScopeErrorKind.SITE_SCOPE_CHANGED
    complement = SiteScope.complement()
    assert update_peer_scope(complement, SiteScope.complement()) is complement
    with pytest.raises(SiteScopeError):
        update_peer_scope(complement, newer)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.frozensets(st.sampled_from([A, B, C, D]), min_size=1)),
        min_size=1,
        max_size=12,
    )
)
def test_accepted_scope_updates_never_go_back(updates: list[tuple[int, frozenset[bytes]]]) -> None:
    current: SiteScope | None = None
    seen: dict[int, tuple[bytes, ...]] = {}
    for generation, sites in updates:
        scope = _explicit(generation, *sites)
        assert scope.sites is not None
        try:
            current = update_peer_scope(current, scope)
        except SiteScopeError:
            assert current is not None
            assert current.sites is not None
            assert generation < current.sites.generation or (
                generation == current.sites.generation
                and current.sites.site_ids != scope.sites.site_ids
            )
            continue
        assert current.sites is not None
        # one generation never names two different site sets
        assert seen.setdefault(current.sites.generation, current.sites.site_ids) == (
            current.sites.site_ids
        )


def test_outbound_eligibility_is_split_horizon() -> None:
    # upward: a local explicit scope allows exactly our subtree
    assert outbound_eligibility(_explicit(0, C, D), SiteScope.complement()) == (
        EligibilityMode.ALLOW,
        frozenset({C, D}),
    )
    # downward: a local complement blocks the child subtree's own origins
    assert outbound_eligibility(SiteScope.complement(), _explicit(4, C, D)) == (
        EligibilityMode.BLOCK,
        frozenset({C, D}),
    )
    with pytest.raises(SiteScopeError):
        outbound_eligibility(SiteScope.complement(), SiteScope.complement())


def test_publishers_enforce_their_rules() -> None:
    local = SitePublisher.local(A)
    assert local.scope == _explicit(0, A)
    assert local.set([A, B]) == _explicit(1, A, B)
    assert local.scope.sites is not None
    assert local.scope.sites.generation == 1
    with pytest.raises(SiteScopeError) as missing:
        local.set([B])
    assert _kind(missing) is SiteScopeErrorKind.OWN_SITE_MISSING
    assert local.scope == _explicit(1, A, B)  # a refused update changes nothing
    with pytest.raises(SiteScopeError) as derived:
        SitePublisher.complement(A).set([A])
    assert _kind(derived) is SiteScopeErrorKind.COMPLEMENT_IS_DERIVED
    with pytest.raises(SiteScopeError) as not_own:
        SitePublisher.explicit(A, [B])
    assert _kind(not_own) is SiteScopeErrorKind.OWN_SITE_MISSING


def test_subtree_aggregator_republishes_the_union_of_child_scopes() -> None:
    agg = SubtreeScopeAggregator(A)
    assert agg.upstream.scope == _explicit(0, A)
    assert agg.update_child("link-b", _explicit(0, B))
    assert agg.upstream.scope == _explicit(1, A, B)
    assert not agg.update_child("link-b", _explicit(0, B))  # unchanged: no new generation
    assert agg.update_child("link-c", _explicit(3, C, D))
    assert agg.upstream.scope == _explicit(2, A, B, C, D)
    assert not agg.update_child("link-d", None)  # a child without a scope yet adds nothing
    assert agg.remove_child("link-c")
    assert agg.upstream.scope == _explicit(3, A, B)
    assert not agg.remove_child("link-c")
    capped = SubtreeScopeAggregator(A, max_children=1)
    capped.update_child(1, _explicit(0, B))
    with pytest.raises(SiteScopeError):
        capped.update_child(2, _explicit(0, C))
