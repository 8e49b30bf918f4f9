"""Cluster URLs in join tokens: the ``members.N`` join options that list a job's nodes
(``member_options``/``join_members``), and ``resolve_join_token`` handing other schemes to the
plugin registry's resolvers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chrysalis.core import (
    AddressResolverSpec,
    DatagramAddr,
    JoinSettings,
    default_registry,
    hookimpl,
)
from chrysalis.node import join_members, member_options
from chrysalis.node._address import AddressSyntaxError, JoinToken, resolve_join_token

names = st.from_regex(r"[A-Za-z0-9._:\-]{1,40}", fullmatch=True)
addresses = st.builds(
    lambda a, b, port: DatagramAddr.parse(f"udp://10.{a}.{b}.1:{port}"),
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(1, 65535),
)


@given(st.lists(st.tuples(names, addresses), min_size=1, max_size=300))
def test_members_round_trip_through_join_options(
    members: list[tuple[str, DatagramAddr]],
) -> None:
    options = member_options(members)
    settings = JoinSettings(members[0][1], None, options)  # validates the option bounds
    assert join_members(settings) == tuple(members)


def test_settings_without_members_are_their_one_address() -> None:
    address = DatagramAddr.parse("udp://10.0.0.1:5")
    assert join_members(JoinSettings(address)) == (("", address),)


def test_bad_member_names_and_too_many_members_are_refused() -> None:
    address = DatagramAddr.parse("udp://10.0.0.1:5")
    with pytest.raises(ValueError, match="member name"):
        member_options([("a,b", address)])
    with pytest.raises(ValueError, match="do not fit"):
        member_options([(f"{'n' * 200}{i}", address) for i in range(400)])


def _resolve(url: str) -> JoinSettings:
    if url.endswith("/none"):
        raise RuntimeError("job 7 is not running")
    members: Sequence[tuple[str, DatagramAddr]] = [
        ("n1", DatagramAddr.parse("udp://127.0.0.2:7")),
        ("n2", DatagramAddr.parse("udp://127.0.0.3:7")),
    ]
    return JoinSettings(members[0][1], None, member_options(members))


@pytest.fixture
def plugin() -> Iterator[object]:
    @hookimpl
    def chrysalis_address_resolvers() -> Sequence[AddressResolverSpec]:
        return (AddressResolverSpec("testjob", _resolve),)

    registered = SimpleNamespace(chrysalis_address_resolvers=chrysalis_address_resolvers)
    default_registry().register(registered, "test-cluster-resolver")
    try:
        yield registered
    finally:
        default_registry().unregister(registered)


def test_other_schemes_resolve_through_the_registry(plugin: object) -> None:
    token = resolve_join_token("testjob://7")
    assert token.address == DatagramAddr.parse("udp://127.0.0.2:7")
    assert [name for name, _ in token.members] == ["n1", "n2"]
    assert resolve_join_token("udp://127.0.0.1:9") == JoinToken(
        DatagramAddr.parse("udp://127.0.0.1:9")
    )
    with pytest.raises(AddressSyntaxError, match="job 7 is not running"):
        resolve_join_token("testjob://7/none")
    with pytest.raises(AddressSyntaxError, match="no plugin provides address resolver"):
        resolve_join_token("nosuch://7")
