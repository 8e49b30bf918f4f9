"""Tests for ``LinkId``, ``LinkSide`` and ``LinkContext`` (spec: chrysalis-transport.md 1.3, 8)."""

from __future__ import annotations

import copy
import dataclasses
import operator
import pickle
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import (
    LINK_ID_LEN,
    InvalidLengthError,
    LinkContext,
    LinkId,
    LinkIdParseError,
    LinkSide,
    Pid,
    PidParseError,
)

_PROPERTY = settings(max_examples=150, deadline=None)
_HEX32 = re.compile(r"[0-9A-Fa-f]{32}")
link_bytes = st.binary(min_size=LINK_ID_LEN, max_size=LINK_ID_LEN)
_COMPARISONS: list[Callable[[Any, Any], Any]] = [
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
]


# -- spec inventory ------------------------------------------------------------------------------


def test_link_context_identifies_incarnation_peer_and_orientation() -> None:
    link = LinkId(bytes(range(16)))
    peer = Pid(bytes(range(16, 32)))
    context = LinkContext(link=link, peer=peer, side=LinkSide.PARENT)
    assert context.link == link
    assert context.peer == peer
    assert context.side is LinkSide.PARENT
    other = LinkContext(link=LinkId(bytes(16)), peer=peer, side=LinkSide.PARENT)
    assert context != other  # a new link incarnation is a different context
    assert context == LinkContext(link, peer, LinkSide.PARENT)
    assert hash(context) == hash(LinkContext(link, peer, LinkSide.PARENT))


# -- LinkContext ---------------------------------------------------------------------------------


def test_link_context_is_frozen_and_slotted() -> None:
    context = LinkContext(LinkId(bytes(16)), Pid(bytes(16)), LinkSide.CHILD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.side = LinkSide.PARENT  # type: ignore[misc]
    assert not hasattr(context, "__dict__")
    assert pickle.loads(pickle.dumps(context)) == context


def test_link_context_checks_field_types() -> None:
    link, peer = LinkId(bytes(16)), Pid(bytes(16))
    with pytest.raises(TypeError, match="link"):
        LinkContext(Pid(bytes(16)), peer, LinkSide.CHILD)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="peer"):
        LinkContext(link, LinkId(bytes(16)), LinkSide.CHILD)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="side"):
        LinkContext(link, peer, "parent")  # type: ignore[arg-type]


# -- LinkSide ------------------------------------------------------------------------------------


def test_link_side_has_parent_and_child_and_flips_between_ends() -> None:
    assert {side.name for side in LinkSide} == {"PARENT", "CHILD"}
    assert LinkSide.PARENT.opposite is LinkSide.CHILD
    assert LinkSide.CHILD.opposite is LinkSide.PARENT
    assert LinkSide("parent") is LinkSide.PARENT
    assert pickle.loads(pickle.dumps(LinkSide.CHILD)) is LinkSide.CHILD


# -- LinkId --------------------------------------------------------------------------------------


def test_link_id_text_forms_and_parse() -> None:
    link = LinkId(bytes.fromhex("0123456789abcdef" * 2))
    assert str(link) == link.hex() == "0123456789abcdef" * 2
    assert repr(link) == "LinkId('" + "0123456789abcdef" * 2 + "')"
    assert LinkId.parse("0123456789ABCDEF" * 2) == link
    assert bytes(link) == link.raw == bytes.fromhex("0123456789abcdef" * 2)


def test_link_id_rejects_wrong_types_and_lengths() -> None:
    with pytest.raises(TypeError):
        LinkId(16)  # type: ignore[arg-type]
    with pytest.raises(InvalidLengthError) as info:
        LinkId(bytes(15))
    assert info.value.type_name == "LinkId"
    with pytest.raises(LinkIdParseError) as parse:
        LinkId.parse("0" * 30)
    assert not isinstance(parse.value, PidParseError)
    assert "link ID" in str(parse.value)


def test_link_id_is_immutable_and_distinct_from_pid() -> None:
    raw = bytes(range(16))
    link = LinkId(raw)
    with pytest.raises(AttributeError):
        link._raw = bytes(16)
    assert link != Pid(raw)
    assert link != raw
    assert copy.copy(link) is link


# -- properties ----------------------------------------------------------------------------------


@_PROPERTY
@given(link_bytes)
def test_link_id_round_trips_bytes_text_and_pickle(raw: bytes) -> None:
    link = LinkId(raw)
    assert LinkId(bytes(link)) == link
    assert LinkId.parse(str(link)) == link
    assert LinkId.parse(str(link).upper()) == link
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(link, protocol))
        assert type(clone) is LinkId
        assert clone == link


@_PROPERTY
@given(link_bytes, link_bytes)
def test_link_id_order_and_equality_are_bytewise(a: bytes, b: bytes) -> None:
    for compare in _COMPARISONS:
        assert compare(LinkId(a), LinkId(b)) == compare(a, b)
    if a == b:
        assert hash(LinkId(a)) == hash(LinkId(b))


@_PROPERTY
@given(st.text(max_size=40))
def test_link_id_parse_rejects_everything_but_32_hex_digits(text: str) -> None:
    if _HEX32.fullmatch(text):
        assert LinkId.parse(text).hex() == text.lower()
    else:
        with pytest.raises(LinkIdParseError):
            LinkId.parse(text)
