"""Tests for ``ConnectionId`` and ``target_pid`` (spec: chrysalis-transport.md 1.4, 1.5, 8)."""

from __future__ import annotations

import copy
import operator
import pickle
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import (
    CID_LEN,
    INITIAL_SUFFIX_FLAG,
    PID_LEN,
    ConnectionId,
    ConnectionIdError,
    ConnectionIdParseError,
    InvalidLengthError,
    Pid,
    target_pid,
)

_PROPERTY = settings(max_examples=150, deadline=None)
_HEX40 = re.compile(r"[0-9A-Fa-f]{40}")
pids = st.binary(min_size=PID_LEN, max_size=PID_LEN).map(Pid)
cid_bytes = st.binary(min_size=CID_LEN, max_size=CID_LEN)
keys = st.integers(1, 2**31 - 1)
_COMPARISONS: list[Callable[[Any, Any], Any]] = [
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
]
PID = Pid(bytes(range(0x10, 0x20)))


def long_header(dcid: bytes, dcid_len: int | None = None, first: int = 0xC0) -> bytes:
    """A QUIC v1 long header: flags, version 1, DCID length, DCID, then some payload."""
    length = len(dcid) if dcid_len is None else dcid_len
    return bytes([first, 0, 0, 0, 1, length]) + dcid + b"\x00" * 8


# -- spec inventory ------------------------------------------------------------------------------


def test_issued_cid_contains_pid_and_key() -> None:
    cid = ConnectionId.issued(PID, 0x12345678)
    assert bytes(cid) == PID.raw + b"\x12\x34\x56\x78"
    assert len(bytes(cid)) == CID_LEN
    assert cid.pid == PID
    assert cid.suffix == 0x12345678
    assert not cid.is_initial
    assert target_pid(b"\x40" + bytes(cid)) == PID


def test_extracts_pid_from_long_header() -> None:
    cid = ConnectionId.issued(PID, 7)
    assert target_pid(long_header(bytes(cid))) == PID


def test_extracts_pid_from_short_header() -> None:
    cid = ConnectionId.issued(PID, 7)
    assert target_pid(b"\x40" + bytes(cid)) == PID


def test_rejects_wrong_long_header_cid_length() -> None:
    assert target_pid(long_header(bytes(8), dcid_len=8)) is None
    # Even when 20 bytes follow, a declared length other than 20 is not routable.
    assert target_pid(long_header(bytes(ConnectionId.issued(PID, 7)), dcid_len=8)) is None


# -- target_pid edge cases ---------------------------------------------------------------------


def test_target_pid_returns_none_for_empty_and_short_datagrams() -> None:
    assert target_pid(b"") is None
    assert target_pid(b"\x40" + PID.raw[:15]) is None  # short header, 15 PID bytes
    assert target_pid(b"\x40" + PID.raw) == PID  # 16 PID bytes suffice (suffix not read)
    truncated = long_header(PID.raw, dcid_len=20)[:21]
    assert target_pid(truncated) is None
    assert target_pid(bytes([0xC0, 0, 0, 0, 1])) is None
    assert target_pid(bytes([0xC0, 0, 0, 0, 1, 20]) + PID.raw) == PID


def test_target_pid_accepts_bytearray_and_memoryview() -> None:
    datagram = b"\x40" + bytes(ConnectionId.initial(PID, 3)) + b"payload"
    assert target_pid(bytearray(datagram)) == PID
    assert target_pid(memoryview(datagram)) == PID
    assert target_pid(memoryview(b"junk" + datagram)[4:]) == PID


def test_target_pid_reads_bytes_of_memoryviews_of_any_format_or_shape() -> None:
    import array
    import ctypes

    datagram = b"\x40" + bytes(ConnectionId.issued(PID, 9)) + b"pad"  # 24 bytes
    assert target_pid(memoryview(array.array("I", datagram))) == PID  # 6 items of 4 bytes
    spread = array.array("I", list(datagram))  # 24 items of 4 bytes: 96 bytes
    got = target_pid(memoryview(spread))
    assert got is not None
    assert got == target_pid(spread.tobytes())  # the bytes, not 16 items of 4 bytes
    assert target_pid(memoryview(datagram).cast("I")) == PID  # 6 items, read as 24 bytes
    assert target_pid(memoryview(datagram).cast("B", (4, 6))) == PID  # two dimensions
    strided = memoryview(bytearray(datagram)).cast("B", (2, 12))[::1]
    assert target_pid(strided) == PID
    rows = datagram[:12] + bytes(12) + datagram[12:] + bytes(12)
    skipping = memoryview(bytearray(rows)).cast("B", (4, 12))[::2]  # not contiguous
    assert not skipping.c_contiguous
    assert target_pid(skipping) == PID
    assert target_pid(memoryview(ctypes.c_uint8(0x40))) is None  # zero dimensions, 1 byte
    assert target_pid(memoryview((ctypes.c_uint8 * 24).from_buffer_copy(datagram))) == PID


def test_target_pid_of_link_local_cid_is_link_local() -> None:
    pid = target_pid(b"\x40" + bytes(ConnectionId.issued(Pid.LINK_LOCAL, 1)))
    assert pid is not None
    assert pid.is_link_local


# -- ConnectionId --------------------------------------------------------------------------------


def test_initial_cid_sets_the_top_suffix_bit() -> None:
    cid = ConnectionId.initial(PID, 5)
    assert cid.suffix == 5 | INITIAL_SUFFIX_FLAG
    assert cid.is_initial
    assert bytes(cid)[16:] == b"\x80\x00\x00\x05"
    assert ConnectionId.initial(PID, 5) != ConnectionId.issued(PID, 5)


@pytest.mark.parametrize("value", [0, -1, 2**31, 2**32])
def test_issued_and_initial_reject_out_of_range_values(value: int) -> None:
    with pytest.raises(ConnectionIdError, match="key"):
        ConnectionId.issued(PID, value)
    with pytest.raises(ConnectionIdError, match="nonce"):
        ConnectionId.initial(PID, value)


def test_issued_and_initial_accept_the_range_ends() -> None:
    assert ConnectionId.issued(PID, 1).suffix == 1
    assert ConnectionId.issued(PID, 2**31 - 1).suffix == 2**31 - 1
    assert ConnectionId.initial(PID, 2**31 - 1).suffix == 2**32 - 1


def test_constructor_accepts_any_u32_suffix_only() -> None:
    assert ConnectionId(PID, 0).suffix == 0
    assert ConnectionId(PID, 2**32 - 1).is_initial
    for bad in (-1, 2**32):
        with pytest.raises(ConnectionIdError, match="u32"):
            ConnectionId(PID, bad)
    with pytest.raises(TypeError):
        ConnectionId(PID, True)
    with pytest.raises(TypeError):
        ConnectionId(PID, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ConnectionId(PID.raw, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ConnectionId.issued(PID, "1")  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 16, 19, 21])
def test_from_bytes_requires_exactly_20_bytes(size: int) -> None:
    with pytest.raises(InvalidLengthError) as info:
        ConnectionId.from_bytes(bytes(size))
    assert (info.value.expected, info.value.actual) == (CID_LEN, size)
    assert isinstance(info.value, ValueError)


def test_cid_text_forms() -> None:
    cid = ConnectionId.issued(PID, 0x12345678)
    assert str(cid) == cid.hex() == PID.hex() + "12345678"
    assert repr(cid) == f"ConnectionId(Pid({PID.hex()!r}), 0x12345678)"
    assert ConnectionId.parse(str(cid).upper()) == cid
    with pytest.raises(ConnectionIdParseError, match="40 hex digits"):
        ConnectionId.parse(PID.hex())


def test_cid_is_immutable_and_not_equal_to_its_bytes() -> None:
    cid = ConnectionId.issued(PID, 1)
    with pytest.raises(AttributeError):
        cid._raw = bytes(20)
    with pytest.raises(AttributeError):
        cid.suffix = 2  # type: ignore[misc]
    assert cid != bytes(cid)
    assert copy.deepcopy(cid) is cid


# -- properties ----------------------------------------------------------------------------------


@_PROPERTY
@given(cid_bytes)
def test_cid_round_trips_bytes_text_and_pickle(raw: bytes) -> None:
    cid = ConnectionId.from_bytes(raw)
    assert bytes(cid) == raw
    assert ConnectionId(cid.pid, cid.suffix) == cid
    assert cid.pid.raw == raw[:16]
    assert cid.suffix == int.from_bytes(raw[16:], "big")
    assert cid.is_initial == bool(cid.suffix & INITIAL_SUFFIX_FLAG)
    assert ConnectionId.parse(str(cid)) == cid
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(cid, protocol))
        assert type(clone) is ConnectionId
        assert clone == cid


@_PROPERTY
@given(pids, keys)
def test_issued_and_initial_never_collide_and_keep_the_pid(pid: Pid, key: int) -> None:
    issued = ConnectionId.issued(pid, key)
    initial = ConnectionId.initial(pid, key)
    assert issued != initial
    assert (issued.pid, initial.pid) == (pid, pid)
    assert (issued.suffix, initial.suffix) == (key, key | INITIAL_SUFFIX_FLAG)
    assert not issued.is_initial
    assert initial.is_initial


@_PROPERTY
@given(cid_bytes, cid_bytes)
def test_cid_order_and_equality_are_bytewise(a: bytes, b: bytes) -> None:
    x, y = ConnectionId.from_bytes(a), ConnectionId.from_bytes(b)
    for compare in _COMPARISONS:
        assert compare(x, y) == compare(a, b)
    if a == b:
        assert hash(x) == hash(y)


@_PROPERTY
@given(st.text(max_size=44))
def test_cid_parse_rejects_everything_but_40_hex_digits(text: str) -> None:
    if _HEX40.fullmatch(text):
        assert ConnectionId.parse(text).hex() == text.lower()
    else:
        with pytest.raises(ConnectionIdParseError):
            ConnectionId.parse(text)


def model_target_pid(datagram: bytes) -> bytes | None:
    """Straight transcription of spec 1.5."""
    if not datagram:
        return None
    if datagram[0] & 0x80 == 0:
        start = 1
    else:
        if len(datagram) < 6 or datagram[5] != 20:
            return None
        start = 6
    if len(datagram) < start + 16:
        return None
    return datagram[start : start + 16]


headers = st.one_of(
    st.builds(
        lambda first, version, length, rest: (
            bytes([first | 0x80]) + version + bytes([length]) + rest
        ),
        st.integers(0, 255),
        st.binary(min_size=4, max_size=4),
        st.sampled_from([0, 8, 19, 20, 20, 20, 21, 255]),
        st.binary(max_size=40),
    ),
    st.builds(
        lambda first, rest: bytes([first & 0x7F]) + rest,
        st.integers(0, 255),
        st.binary(max_size=40),
    ),
    st.binary(max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(headers)
def test_target_pid_agrees_with_model_and_never_raises(datagram: bytes) -> None:
    expected = model_target_pid(datagram)
    padded = datagram + bytes(-len(datagram) % 4)
    wide = memoryview(padded).cast("I") if datagram == padded else memoryview(datagram)
    for view in (datagram, bytearray(datagram), memoryview(datagram), wide):
        got = target_pid(view)
        if expected is None:
            assert got is None
        else:
            assert got is not None
            assert type(got) is Pid
            assert got.raw == expected
