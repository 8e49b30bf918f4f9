"""Tests for ``Pid`` and ``PidPrefix`` (spec: chrysalis-transport.md sections 1.1, 1.2, 8)."""

from __future__ import annotations

import copy
import hashlib
import itertools
import operator
import pickle
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import (
    PID_LEN,
    HexParseError,
    InvalidLengthError,
    LinkId,
    Pid,
    PidAmbiguousError,
    PidLookupError,
    PidNotFoundError,
    PidParseError,
    PidPrefix,
    PidPrefixError,
    PidPrefixErrorKind,
    WireFormatError,
)

_PROPERTY = settings(max_examples=150, deadline=None)
_HEX32 = re.compile(r"[0-9A-Fa-f]{32}")
_HEX_PREFIX = re.compile(r"[0-9A-Fa-f]{1,32}")

pid_bytes = st.binary(min_size=PID_LEN, max_size=PID_LEN)
pids = pid_bytes.map(Pid)
hex_digits = st.sampled_from("0123456789abcdefABCDEF")
_COMPARISONS: list[Callable[[Any, Any], Any]] = [
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
]


def pid_of(text: str) -> Pid:
    """A PID from hex text padded with zeros to 32 digits."""
    return Pid(bytes.fromhex(text.ljust(32, "0")))


# -- spec inventory (section 8, chrysalis-core) ------------------------------------------------


def test_pid_prefixes_parse_display_and_match_at_nibble_boundaries() -> None:
    pid = pid_of("42a5")
    even = PidPrefix("42")
    odd = PidPrefix("424")
    upper = PidPrefix("42A")
    assert (str(even), str(odd), str(upper)) == ("42", "424", "42a")
    assert (even.digits, odd.digits, upper.digits) == (2, 3, 3)
    assert PidPrefix(str(upper)) == upper
    assert even.matches(pid)
    assert odd.matches(pid_of("424f"))
    assert odd.matches(pid_of("4240"))
    assert not odd.matches(pid_of("4250"))
    assert upper.matches(pid)
    assert not upper.matches(pid_of("42"))  # 0x42 0x00...: next nibble is 0, not a
    full = PidPrefix(str(pid))
    assert full.digits == 32
    assert full.to_pid() == pid
    assert even.to_pid() is None


def test_pid_prefixes_reject_empty_nonhex_and_oversized_text() -> None:
    cases = [("", PidPrefixErrorKind.EMPTY), ("x", PidPrefixErrorKind.INVALID_HEX)]
    cases.append(("4" * 33, PidPrefixErrorKind.TOO_LONG))
    for text, kind in cases:
        with pytest.raises(PidPrefixError) as info:
            PidPrefix(text)
        assert info.value.kind is kind


def test_reserves_zero_for_link_local_protocols() -> None:
    assert Pid.LINK_LOCAL == Pid(bytes(PID_LEN))
    assert Pid.LINK_LOCAL.is_link_local
    assert Pid(bytes(PID_LEN)).is_link_local
    assert not Pid(bytes(PID_LEN - 1) + b"\x01").is_link_local
    assert not Pid(b"\x80" + bytes(PID_LEN - 1)).is_link_local


# -- Pid construction and text -----------------------------------------------------------------


def test_pid_accepts_bytes_like_and_copies_mutable_input() -> None:
    data = bytearray(range(16))
    pid = Pid(data)
    data[0] = 0xFF
    assert bytes(pid) == bytes(range(16))
    assert pid.raw == bytes(range(16))
    assert type(pid.raw) is bytes
    assert Pid(memoryview(bytes(range(16)))) == pid


@pytest.mark.parametrize("value", [16, "00" * 16, [0] * 16, None, 1.5])
def test_pid_rejects_non_bytes_with_type_error(value: object) -> None:
    with pytest.raises(TypeError):
        Pid(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 15, 17, 20])
def test_pid_rejects_wrong_length_with_invalid_length_error(size: int) -> None:
    with pytest.raises(InvalidLengthError) as info:
        Pid(bytes(size))
    assert isinstance(info.value, ValueError)
    assert (info.value.type_name, info.value.expected, info.value.actual) == ("Pid", 16, size)
    assert str(size) in str(info.value)


def test_pid_text_forms_are_lowercase_hex() -> None:
    pid = Pid(bytes.fromhex("00ff10ab" * 4))
    assert str(pid) == pid.hex() == "00ff10ab" * 4
    assert repr(pid) == "Pid('" + "00ff10ab" * 4 + "')"
    assert f"{pid}" == str(pid)


def test_pid_parse_accepts_either_case() -> None:
    expected = Pid(bytes.fromhex("abcdef0123456789" * 2))
    assert Pid.parse("ABCDEF0123456789" * 2) == expected
    assert Pid.parse("aBcDeF0123456789" * 2) == expected
    assert Pid.parse("0" * 32) is not Pid.LINK_LOCAL
    assert Pid.parse("0" * 32) == Pid.LINK_LOCAL


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0" * 31,
        "0" * 33,
        " " + "0" * 31,
        "0" * 31 + "\n",
        "00 " * 10 + "00",
        "0x" + "0" * 30,
        "g" + "0" * 31,
        "\u0660" * 32,  # ARABIC-INDIC DIGIT ZERO: a digit, but not ASCII hex
        "\uff10" * 32,  # FULLWIDTH DIGIT ZERO
        "-" + "0" * 31,
    ],
)
def test_pid_parse_rejects_anything_but_32_ascii_hex_digits(text: str) -> None:
    with pytest.raises(PidParseError):
        Pid.parse(text)


def test_pid_parse_error_says_what_was_wrong_and_quotes_bounded_input() -> None:
    with pytest.raises(PidParseError, match=r"32 hex digits, got 3 characters") as short:
        Pid.parse("abc")
    assert "'abc'" in str(short.value)
    with pytest.raises(PidParseError, match=r"'z' at position 5") as bad:
        Pid.parse("00000z" + "0" * 26)
    assert bad.value.reason.startswith("character 'z'")
    huge = "q" * 100_000
    with pytest.raises(PidParseError) as big:
        Pid.parse(huge)
    assert len(str(big.value)) < 200
    assert "100000" in str(big.value)
    assert len(big.value.text) < 200


def test_pid_parse_rejects_non_str_with_type_error() -> None:
    with pytest.raises(TypeError):
        Pid.parse(b"00" * 16)  # type: ignore[arg-type]


def test_pid_from_certificate_is_first_16_bytes_of_sha256() -> None:
    # SHA-256 of the empty string is e3b0c442 98fc1c14 9afbf4c8 996fb924 27ae41e4 ...
    assert Pid.from_certificate(b"") == Pid.parse("e3b0c44298fc1c149afbf4c8996fb924")
    der = b"\x30\x82\x01\x0a" + bytes(range(200))
    assert Pid.from_certificate(der).raw == hashlib.sha256(der).digest()[:16]
    assert Pid.from_certificate(der) != Pid.from_certificate(der + b"\x00")


def test_pid_is_immutable() -> None:
    pid = Pid(bytes(range(16)))
    with pytest.raises(AttributeError):
        pid.raw = bytes(16)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pid._raw = bytes(16)
    with pytest.raises(AttributeError):
        pid.extra = 1
    with pytest.raises(AttributeError):
        del pid._raw
    assert pid.raw == bytes(range(16))
    assert not hasattr(pid, "__dict__")


def test_pid_never_equals_bytes_or_link_id_with_same_bytes() -> None:
    raw = bytes(range(16))
    pid = Pid(raw)
    assert pid != raw
    assert pid != LinkId(raw)
    assert LinkId(raw) != pid
    with pytest.raises(TypeError):
        _ = pid < raw  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = pid < LinkId(raw)  # type: ignore[operator]


def test_pid_copy_and_deepcopy_return_the_same_value() -> None:
    pid = Pid(bytes(range(16)))
    assert copy.copy(pid) is pid
    assert copy.deepcopy(pid) is pid


# -- PidPrefix examples --------------------------------------------------------------------------


def test_pid_prefix_from_pid_takes_leading_digits() -> None:
    pid = Pid.parse("0123456789abcdef" * 2)
    assert str(PidPrefix.from_pid(pid, 3)) == "012"
    assert str(PidPrefix.from_pid(pid, 4)) == "0123"
    assert PidPrefix.from_pid(pid) == PidPrefix(str(pid))
    assert PidPrefix.from_pid(pid, 3) == PidPrefix("012")
    for bad in (0, 33):
        with pytest.raises(ValueError, match="digits"):
            PidPrefix.from_pid(pid, bad)


def test_pid_prefix_equality_ignores_input_case_but_not_length() -> None:
    assert PidPrefix("aB") == PidPrefix("Ab")
    assert hash(PidPrefix("aB")) == hash(PidPrefix("ab"))
    assert PidPrefix("ab") != PidPrefix("ab0")
    assert PidPrefix("a") != PidPrefix("a0")
    assert repr(PidPrefix("AB")) == "PidPrefix('ab')"
    assert PidPrefix.parse("AB") == PidPrefix("ab")


def test_pid_prefix_is_immutable_and_picklable() -> None:
    prefix = PidPrefix("abc")
    with pytest.raises(AttributeError):
        prefix._digits = 1
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(prefix, protocol)) == prefix
    assert copy.deepcopy(prefix) is prefix


def test_pid_prefix_matches_rejects_non_pid() -> None:
    with pytest.raises(TypeError):
        PidPrefix("00").matches(LinkId(bytes(16)))  # type: ignore[arg-type]


def test_pid_prefix_error_is_a_parse_error_with_reason() -> None:
    with pytest.raises(PidPrefixError, match=r"'x' at position 1") as info:
        PidPrefix("ax")
    assert isinstance(info.value, HexParseError)
    assert isinstance(info.value, WireFormatError)
    assert isinstance(info.value, ValueError)
    with pytest.raises(TypeError):
        PidPrefix(42)  # type: ignore[arg-type]


def test_expand_returns_the_single_match() -> None:
    a, b, c = pid_of("aa"), pid_of("ab"), pid_of("b0")
    assert PidPrefix("aa").expand([a, b, c]) == a
    assert PidPrefix("b").expand([a, b, c]) == c
    assert PidPrefix("aa").expand([a, a, b]) == a  # duplicates of one PID are not ambiguous


def test_expand_reports_not_found() -> None:
    with pytest.raises(PidNotFoundError, match="'c'") as info:
        PidPrefix("c").expand([pid_of("aa")])
    assert isinstance(info.value, PidLookupError)
    assert isinstance(info.value, LookupError)
    assert info.value.prefix == "c"
    with pytest.raises(PidNotFoundError):
        PidPrefix("c").expand([])


def test_expand_reports_ambiguous_with_matching_pids() -> None:
    a, b, c = pid_of("aa"), pid_of("ab"), pid_of("b0")
    with pytest.raises(PidAmbiguousError) as info:
        PidPrefix("a").expand([a, c, b, a])
    assert info.value.matches == (a, b)
    assert not info.value.truncated
    assert str(a) in str(info.value)
    assert str(b) in str(info.value)


def test_expand_stops_after_a_bounded_number_of_ambiguous_matches() -> None:
    consumed = 0

    def endless() -> Iterator[Pid]:
        nonlocal consumed
        for n in itertools.count():
            consumed += 1
            yield Pid(b"\xaa" + n.to_bytes(15, "big"))

    with pytest.raises(PidAmbiguousError) as info:
        PidPrefix("aa").expand(endless())
    limit = PidAmbiguousError.MATCH_LIMIT
    assert len(info.value.matches) == limit
    assert info.value.truncated
    assert consumed == limit + 1
    assert len(str(info.value)) < 400  # only a few PIDs are spelled out


def test_lookup_and_parse_errors_pickle() -> None:
    errors: list[Exception] = []
    for thunk in (
        lambda: Pid.parse("nope"),
        lambda: Pid(b"x"),
        lambda: PidPrefix(""),
        lambda: PidPrefix("a").expand([]),
        lambda: PidPrefix("a").expand([pid_of("a1"), pid_of("a2")]),
    ):
        with pytest.raises(Exception) as info:  # collected, checked below
            thunk()
        errors.append(info.value)
    for error in errors:
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error)
        assert str(clone) == str(error)
    assert pickle.loads(pickle.dumps(errors[2])).kind is PidPrefixErrorKind.EMPTY
    assert pickle.loads(pickle.dumps(errors[4])).matches == errors[4].matches  # type: ignore[attr-defined]


# -- properties ----------------------------------------------------------------------------------


@_PROPERTY
@given(pid_bytes)
def test_pid_round_trips_bytes_text_and_pickle(raw: bytes) -> None:
    pid = Pid(raw)
    assert bytes(pid) == raw
    assert Pid(bytes(pid)) == pid
    assert str(pid) == raw.hex()
    assert Pid.parse(str(pid)) == pid
    assert Pid.parse(str(pid).upper()) == pid
    assert repr(pid) == f"Pid({raw.hex()!r})"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(pid, protocol)) == pid


@_PROPERTY
@given(pid_bytes, pid_bytes)
def test_pid_order_and_equality_are_bytewise(a: bytes, b: bytes) -> None:
    for compare in _COMPARISONS:
        assert compare(Pid(a), Pid(b)) == compare(a, b)
    assert (Pid(a) == Pid(b)) == (hash(Pid(a)) == hash(Pid(b)) and a == b)
    if a == b:
        assert hash(Pid(a)) == hash(Pid(b))
    assert sorted([Pid(a), Pid(b)]) == [Pid(x) for x in sorted([a, b])]


@_PROPERTY
@given(st.text(max_size=40))
def test_pid_parse_accepts_exactly_32_hex_digits_else_raises_parse_error(text: str) -> None:
    if _HEX32.fullmatch(text):
        assert Pid.parse(text).hex() == text.lower()
    else:
        with pytest.raises(PidParseError):
            Pid.parse(text)


@_PROPERTY
@given(st.text(hex_digits, min_size=32, max_size=32), st.integers(0, 31), st.characters())
def test_pid_parse_rejects_one_bad_character(text: str, index: int, char: str) -> None:
    mutated = text[:index] + char + text[index + 1 :]
    if char in "0123456789abcdefABCDEF":
        assert Pid.parse(mutated).hex() == mutated.lower()
    else:
        with pytest.raises(PidParseError, match=f"position {index}"):
            Pid.parse(mutated)


@_PROPERTY
@given(st.binary(max_size=40))
def test_pid_construction_accepts_exactly_16_bytes(raw: bytes) -> None:
    if len(raw) == PID_LEN:
        assert Pid(raw).raw == raw
    else:
        with pytest.raises(InvalidLengthError):
            Pid(raw)


@_PROPERTY
@given(st.text(max_size=40))
def test_pid_prefix_parse_agrees_with_model(text: str) -> None:
    if _HEX_PREFIX.fullmatch(text):
        prefix = PidPrefix(text)
        assert str(prefix) == text.lower()
        assert prefix.digits == len(text)
        assert pickle.loads(pickle.dumps(prefix)) == prefix
        return
    with pytest.raises(PidPrefixError) as info:
        PidPrefix(text)
    if not text:
        assert info.value.kind is PidPrefixErrorKind.EMPTY
    elif len(text) > 32:
        assert info.value.kind is PidPrefixErrorKind.TOO_LONG
    else:
        assert info.value.kind is PidPrefixErrorKind.INVALID_HEX


@_PROPERTY
@given(pids, st.integers(1, 32), st.text(hex_digits, min_size=1, max_size=32), st.booleans())
def test_pid_prefix_matches_agrees_with_string_prefix_model(
    pid: Pid, digits: int, random_text: str, derived: bool
) -> None:
    text = str(pid)[:digits] if derived else random_text
    prefix = PidPrefix(text)
    assert prefix.matches(pid) == str(pid).startswith(text.lower())
    if derived:
        assert prefix.matches(pid)
        assert PidPrefix.from_pid(pid, digits) == prefix
    if prefix.digits == 32:
        assert prefix.to_pid() == Pid.parse(text)
    else:
        assert prefix.to_pid() is None


@_PROPERTY
@given(
    st.lists(st.binary(min_size=2, max_size=2), max_size=30),
    st.text("0123456789abcdef", min_size=1, max_size=3),
)
def test_expand_agrees_with_naive_model(heads: list[bytes], text: str) -> None:
    # Two-byte heads make collisions on short prefixes likely.
    candidates = [Pid(head + bytes(14)) for head in heads]
    model = {pid for pid in candidates if str(pid).startswith(text)}
    prefix = PidPrefix(text)
    if not model:
        with pytest.raises(PidNotFoundError):
            prefix.expand(candidates)
    elif len(model) == 1:
        assert prefix.expand(candidates) == next(iter(model))
    else:
        with pytest.raises(PidAmbiguousError) as info:
            prefix.expand(candidates)
        error = info.value
        assert len(set(error.matches)) == len(error.matches)
        assert set(error.matches) <= model
        assert len(error.matches) == min(len(model), PidAmbiguousError.MATCH_LIMIT)
        assert error.truncated == (len(model) > PidAmbiguousError.MATCH_LIMIT)
        order = list(dict.fromkeys(pid for pid in candidates if pid in model))
        assert list(error.matches) == order[: len(error.matches)]
