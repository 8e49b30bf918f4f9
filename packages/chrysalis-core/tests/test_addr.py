"""Tests for ``DatagramAddr`` (spec: chrysalis-transport.md 2.1, chrysalis-upper.md 6.4)."""

from __future__ import annotations

import copy
import ipaddress
import operator
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import (
    INPROC_SCHEME,
    PID_LEN,
    SWITCH_SCHEME,
    UDP_SCHEME,
    UNIXGRAM_SCHEME,
    AddressError,
    DatagramAddr,
    Pid,
    WireFormatError,
)

_PROPERTY = settings(max_examples=150, deadline=None)
PID = Pid(bytes(range(0xA0, 0xB0)))
_COMPARISONS: list[Callable[[Any, Any], Any]] = [
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
]


def roundtrip_text(addr: DatagramAddr) -> DatagramAddr:
    return DatagramAddr.parse(str(addr))


# -- udp -------------------------------------------------------------------------------------


def test_udp_ipv4_encoding_is_tag_address_and_port() -> None:
    addr = DatagramAddr.udp("127.0.0.1", 4433)
    assert addr.scheme == UDP_SCHEME == "udp"
    assert addr.opaque == b"\x04\x7f\x00\x00\x01\x11\x51"
    assert (addr.ip, addr.port, addr.flowinfo, addr.scope_id) == (
        ipaddress.IPv4Address("127.0.0.1"),
        4433,
        0,
        0,
    )
    assert str(addr) == "udp://127.0.0.1:4433"
    assert roundtrip_text(addr) == addr


def test_udp_ipv6_encoding_is_tag_address_port_flowinfo_and_scope() -> None:
    addr = DatagramAddr.udp("fe80::1", 443, flowinfo=0x12345, scope_id=3)
    expected = (
        b"\x06"
        + ipaddress.IPv6Address("fe80::1").packed
        + b"\x01\xbb"
        + b"\x00\x01\x23\x45"
        + b"\x00\x00\x00\x03"
    )
    assert addr.opaque == expected
    assert len(addr.opaque) == 27
    assert (addr.port, addr.flowinfo, addr.scope_id) == (443, 0x12345, 3)
    assert str(addr) == "udp://[fe80::1%3]:443?flowinfo=74565"
    assert roundtrip_text(addr) == addr


def test_udp_ipv6_text_form_is_bracketed() -> None:
    addr = DatagramAddr.udp("::1", 4433)
    assert str(addr) == "udp://[::1]:4433"
    assert DatagramAddr.parse("udp://[0:0:0:0:0:0:0:1]:4433") == addr
    assert DatagramAddr.parse("udp://[::1]:4433") == addr


def test_udp_zone_in_host_text_sets_scope_id() -> None:
    assert DatagramAddr.udp("fe80::1%7", 1) == DatagramAddr.udp("fe80::1", 1, scope_id=7)
    assert DatagramAddr.udp("fe80::1%7", 1, scope_id=7).scope_id == 7
    with pytest.raises(AddressError, match="conflicts"):
        DatagramAddr.udp("fe80::1%7", 1, scope_id=8)
    with pytest.raises(AddressError, match="numeric"):
        DatagramAddr.udp("fe80::1%eth0", 1)
    with pytest.raises(AddressError, match="IPv6"):
        DatagramAddr.udp("10.0.0.1%7", 1)


def test_udp_accepts_ipaddress_objects() -> None:
    assert DatagramAddr.udp(ipaddress.IPv4Address("10.1.2.3"), 9) == DatagramAddr.udp("10.1.2.3", 9)
    assert DatagramAddr.udp(ipaddress.IPv6Address("fe80::1%4"), 9).scope_id == 4


@pytest.mark.parametrize(
    ("host", "port", "flowinfo", "scope_id"),
    [
        ("localhost", 1, 0, 0),
        ("example.com", 1, 0, 0),
        ("[::1]", 1, 0, 0),
        ("", 1, 0, 0),
        ("1.2.3.4", -1, 0, 0),
        ("1.2.3.4", 65536, 0, 0),
        ("1.2.3.4", 1, 1, 0),
        ("1.2.3.4", 1, 0, 1),
        ("::1", 1, 2**32, 0),
        ("::1", 1, 0, -1),
    ],
)
def test_udp_rejects_names_and_out_of_range_numbers(
    host: str, port: int, flowinfo: int, scope_id: int
) -> None:
    with pytest.raises(AddressError):
        DatagramAddr.udp(host, port, flowinfo, scope_id)


def test_udp_rejects_non_int_ports_with_type_error() -> None:
    with pytest.raises(TypeError):
        DatagramAddr.udp("1.2.3.4", True)
    with pytest.raises(TypeError):
        DatagramAddr.udp("1.2.3.4", 80.0)  # type: ignore[arg-type]
    # A cached int result must not leak to an equal float/bool argument.
    DatagramAddr.udp("1.2.3.4", 1)
    with pytest.raises(TypeError):
        DatagramAddr.udp("1.2.3.4", 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DatagramAddr.udp(b"1.2.3.4", 1)  # type: ignore[arg-type]


def test_from_sockaddr_and_to_sockaddr_are_inverse() -> None:
    v4 = DatagramAddr.from_sockaddr(("192.0.2.1", 5000))
    assert v4 == DatagramAddr.udp("192.0.2.1", 5000)
    assert v4.to_sockaddr() == ("192.0.2.1", 5000)
    v6 = DatagramAddr.from_sockaddr(("2001:db8::1", 5000, 7, 2))
    assert v6.to_sockaddr() == ("2001:db8::1", 5000, 7, 2)
    assert DatagramAddr.from_sockaddr(v6.to_sockaddr()) == v6
    # Python reports link-local peers with a textual zone; the numeric scope id wins.
    zoned = DatagramAddr.from_sockaddr(("fe80::1%eth0", 5000, 0, 2))
    assert zoned.to_sockaddr() == ("fe80::1", 5000, 0, 2)


@pytest.mark.parametrize("value", [("1.2.3.4",), ("1.2.3.4", 1, 2), "1.2.3.4:5", None])
def test_from_sockaddr_rejects_other_shapes(value: object) -> None:
    with pytest.raises(AddressError):
        DatagramAddr.from_sockaddr(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "opaque",
    [b"", b"\x04", b"\x04" + bytes(7), b"\x06" + bytes(25), b"\x05" + bytes(6), b"\x06" + bytes(6)],
)
def test_invalid_udp_encoding_is_rejected_at_construction(opaque: bytes) -> None:
    with pytest.raises(AddressError, match="udp"):
        DatagramAddr(UDP_SCHEME, opaque)


def test_udp_addresses_built_from_raw_encoding_equal_constructed_ones() -> None:
    addr = DatagramAddr.udp("::ffff:1.2.3.4", 80)
    assert DatagramAddr(UDP_SCHEME, addr.opaque) == addr
    assert addr.ip.version == 6  # v4-mapped stays IPv6
    assert roundtrip_text(addr) == addr


# -- unixgram ------------------------------------------------------------------------------------


def test_unixgram_filesystem_path() -> None:
    addr = DatagramAddr.unixgram("/run/chrysalis/node.sock")
    assert addr.scheme == UNIXGRAM_SCHEME == "unixgram"
    assert addr.opaque == b"/run/chrysalis/node.sock"
    assert str(addr) == "unixgram:///run/chrysalis/node.sock"
    assert addr.to_unix_path() == "/run/chrysalis/node.sock"
    assert not addr.is_abstract
    assert DatagramAddr.unixgram(b"/run/chrysalis/node.sock") == addr
    assert roundtrip_text(addr) == addr


def test_unixgram_abstract_name_shows_as_at_sign() -> None:
    addr = DatagramAddr.unixgram(b"\0chrysalis-7")
    assert addr.opaque == b"\0chrysalis-7"
    assert addr.is_abstract
    assert str(addr) == "unixgram://@chrysalis-7"
    assert addr.to_unix_path() == b"\0chrysalis-7"
    assert DatagramAddr.unixgram("\0chrysalis-7") == addr
    assert roundtrip_text(addr) == addr


def test_unixgram_text_escapes_special_bytes() -> None:
    relative = DatagramAddr.unixgram("@not-abstract")
    assert not relative.is_abstract
    assert str(relative) == "unixgram://%40not-abstract"
    spaced = DatagramAddr.unixgram("/tmp/a b%c")
    assert str(spaced) == "unixgram:///tmp/a%20b%25c"
    binary = DatagramAddr.unixgram(b"/tmp/\xff\x00x")
    assert str(binary) == "unixgram:///tmp/%FF%00x"
    for addr in (
        relative,
        spaced,
        binary,
        DatagramAddr.unixgram(b""),
        DatagramAddr.unixgram(b"\0"),
    ):
        assert roundtrip_text(addr) == addr


def test_unixgram_str_paths_round_trip_undecodable_bytes() -> None:
    addr = DatagramAddr.unixgram(b"/tmp/\xff.sock")
    path = addr.to_unix_path()
    assert isinstance(path, str)
    assert DatagramAddr.unixgram(path) == addr


def test_unix_is_accepted_as_text_alias_only() -> None:
    assert DatagramAddr.parse("unix:///tmp/x") == DatagramAddr.unixgram("/tmp/x")
    assert DatagramAddr.parse("unix://@x") == DatagramAddr.unixgram(b"\0x")
    with pytest.raises(AddressError, match="reserved"):
        DatagramAddr("unix", b"/tmp/x")


def test_unixgram_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        DatagramAddr.unixgram(3)  # type: ignore[arg-type]


# -- inproc and switch ---------------------------------------------------------------------------


def test_inproc_encoding_and_text() -> None:
    addr = DatagramAddr.inproc(1, 2**64 - 1)
    assert addr.scheme == INPROC_SCHEME == "inproc"
    assert addr.opaque == (1).to_bytes(8, "big") + b"\xff" * 8
    assert (addr.network_id, addr.endpoint_id) == (1, 2**64 - 1)
    assert str(addr) == f"inproc://1/{2**64 - 1}"
    assert roundtrip_text(addr) == addr
    assert DatagramAddr.parse("inproc://007/8") == DatagramAddr.inproc(7, 8)


@pytest.mark.parametrize(("network", "endpoint"), [(-1, 0), (0, 2**64), (2**64, 0)])
def test_inproc_rejects_ids_outside_u64(network: int, endpoint: int) -> None:
    with pytest.raises(AddressError):
        DatagramAddr.inproc(network, endpoint)


def test_switch_encoding_and_text() -> None:
    addr = DatagramAddr.switch(9, PID)
    assert addr.scheme == SWITCH_SCHEME == "switch"
    assert addr.opaque == (9).to_bytes(8, "big") + PID.raw
    assert len(addr.opaque) == 8 + PID_LEN
    assert (addr.switch_id, addr.switch_pid) == (9, PID)
    assert str(addr) == f"switch://9/{PID}"
    assert roundtrip_text(addr) == addr
    with pytest.raises(TypeError):
        DatagramAddr.switch(9, PID.raw)  # type: ignore[arg-type]
    with pytest.raises(AddressError):
        DatagramAddr.switch(2**64, PID)


@pytest.mark.parametrize(
    ("scheme", "size"), [(INPROC_SCHEME, 15), (INPROC_SCHEME, 17), (SWITCH_SCHEME, 16)]
)
def test_known_scheme_encodings_are_checked(scheme: str, size: int) -> None:
    with pytest.raises(AddressError, match=scheme):
        DatagramAddr(scheme, bytes(size))


# -- generic and unknown schemes ----------------------------------------------------------------


def test_unknown_scheme_is_carried_verbatim_as_hex() -> None:
    addr = DatagramAddr("rdma+ib", b"\x01\xab")
    assert str(addr) == "rdma+ib://01ab"
    assert DatagramAddr.parse("rdma+ib://01AB") == addr
    assert roundtrip_text(DatagramAddr("x", b"")) == DatagramAddr("x", b"")


@pytest.mark.parametrize("scheme", ["", "UDP", "Udp", "1udp", "+x", "u p", "u_p", "é", "a" * 33])
def test_scheme_must_be_lowercase_token_of_at_most_32_chars(scheme: str) -> None:
    with pytest.raises(AddressError, match="scheme"):
        DatagramAddr(scheme, b"")


def test_scheme_and_opaque_bounds() -> None:
    assert DatagramAddr("a" * 32, b"").scheme == "a" * 32
    assert len(DatagramAddr("blob", bytes(4096)).opaque) == 4096
    assert len(DatagramAddr.unixgram(bytes(4096)).opaque) == 4096
    with pytest.raises(AddressError, match="4096"):
        DatagramAddr("blob", bytes(4097))
    with pytest.raises(AddressError, match="4096"):
        DatagramAddr.unixgram(b"/" * 4097)
    with pytest.raises(TypeError):
        DatagramAddr(b"udp", b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DatagramAddr("blob", "text")  # type: ignore[arg-type]


def test_largest_addresses_round_trip_through_text() -> None:
    for addr in (DatagramAddr("a" * 32, b"\xff" * 4096), DatagramAddr.unixgram(b"\x01" * 4096)):
        assert roundtrip_text(addr) == addr


@pytest.mark.parametrize(
    "text",
    [
        "",
        "udp",
        "127.0.0.1:80",
        "UDP://1.2.3.4:5",
        "udp://",
        "udp://1.2.3.4",
        "udp://1.2.3.4:",
        "udp://1.2.3.4:65536",
        "udp://1.2.3.4:123456",
        "udp://01.2.3.4:5",
        "udp://1.2.3:5",
        "udp://localhost:80",
        "udp://::1:80",
        "udp://[::1]",
        "udp://[::1]:80?flowinfo=",
        "udp://[::1]:80?flow=1",
        "udp://[::1%eth0]:80",
        "udp://[1.2.3.4]:80",
        "udp://[::1]:80?flowinfo=4294967296",
        "udp://1.2.3.4:5 ",
        "inproc://1",
        "inproc://a/b",
        "inproc://-1/2",
        f"inproc://{2**64}/0",
        "switch://1/xyz",
        f"switch://1/{'0' * 31}",
        "unixgram:///a%zz",
        "unixgram:///a%4",
        "unixgram:///a b",
        "unixgram:///caf\u00e9",
        "blob://abc",
        "blob://zz",
        "unix//tmp/x",
    ],
)
def test_parse_rejects_malformed_text_with_address_error(text: str) -> None:
    with pytest.raises(AddressError):
        DatagramAddr.parse(text)


def test_parse_bounds_input_and_quotes_it_briefly() -> None:
    with pytest.raises(AddressError, match="at most") as info:
        DatagramAddr.parse("blob://" + "00" * 100_000)
    assert len(str(info.value)) < 200
    with pytest.raises(AddressError) as bad:
        DatagramAddr.parse("udp://" + "9" * 5000)
    assert len(str(bad.value)) < 300
    with pytest.raises(TypeError):
        DatagramAddr.parse(b"udp://1.2.3.4:5")  # type: ignore[arg-type]


def test_scheme_specific_accessors_reject_other_schemes() -> None:
    inproc = DatagramAddr.inproc(1, 2)
    udp = DatagramAddr.udp("1.2.3.4", 5)
    for get in (
        lambda: udp.to_unix_path(),
        lambda: udp.network_id,
        lambda: udp.endpoint_id,
        lambda: udp.switch_id,
        lambda: udp.switch_pid,
        lambda: inproc.to_sockaddr(),
        lambda: inproc.ip,
        lambda: inproc.port,
        lambda: inproc.flowinfo,
        lambda: inproc.scope_id,
    ):
        with pytest.raises(AddressError, match="is not a"):
            get()
    assert not inproc.is_abstract
    assert issubclass(AddressError, WireFormatError)
    assert issubclass(AddressError, ValueError)


def test_value_semantics() -> None:
    a = DatagramAddr.inproc(1, 2)
    assert a == DatagramAddr(INPROC_SCHEME, a.opaque)
    assert hash(a) == hash(DatagramAddr(INPROC_SCHEME, a.opaque))
    assert a != DatagramAddr("other", a.opaque)  # same bytes, other scheme
    assert a != (INPROC_SCHEME, a.opaque)
    assert DatagramAddr("a", b"\xff") < DatagramAddr("b", b"")  # scheme first
    with pytest.raises(TypeError):
        _ = a < (INPROC_SCHEME, a.opaque)  # type: ignore[operator]
    with pytest.raises(AttributeError):
        a._opaque = b""
    with pytest.raises(AttributeError):
        a.scheme = "udp"  # type: ignore[misc]
    assert not hasattr(a, "__dict__")
    assert copy.copy(a) is a
    assert repr(a) == "DatagramAddr.parse('inproc://1/2')"
    assert eval(repr(a), {"DatagramAddr": DatagramAddr}) == a
    assert DatagramAddr(INPROC_SCHEME, bytearray(a.opaque)) == a


def test_address_error_pickles() -> None:
    with pytest.raises(AddressError) as info:
        DatagramAddr.parse("nope")
    clone = pickle.loads(pickle.dumps(info.value))
    assert type(clone) is AddressError
    assert str(clone) == str(info.value)


# -- properties ----------------------------------------------------------------------------------

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
ports = st.integers(0, 65535)
known = {UDP_SCHEME, UNIXGRAM_SCHEME, INPROC_SCHEME, SWITCH_SCHEME, "unix"}
other_schemes = st.from_regex(r"[a-z][a-z0-9+.\-]{0,31}", fullmatch=True).filter(
    lambda s: s not in known
)
addresses = st.one_of(
    st.builds(DatagramAddr.udp, st.ip_addresses(v=4).map(str), ports),
    st.builds(DatagramAddr.udp, st.ip_addresses(v=6).map(str), ports, u32, u32),
    st.builds(DatagramAddr.unixgram, st.binary(max_size=120)),
    st.builds(DatagramAddr.unixgram, st.text(max_size=60).filter(lambda s: "\0" not in s)),
    st.builds(DatagramAddr.inproc, u64, u64),
    st.builds(DatagramAddr.switch, u64, st.binary(min_size=PID_LEN, max_size=PID_LEN).map(Pid)),
    st.builds(DatagramAddr, other_schemes, st.binary(max_size=64)),
)


@_PROPERTY
@given(addresses)
def test_every_address_round_trips_text_pickle_and_raw_fields(addr: DatagramAddr) -> None:
    text = str(addr)
    assert text.isascii()
    assert DatagramAddr.parse(text) == addr
    assert str(DatagramAddr.parse(text)) == text
    assert DatagramAddr(addr.scheme, addr.opaque) == addr
    assert eval(repr(addr), {"DatagramAddr": DatagramAddr}) == addr
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(addr, protocol)) == addr


@_PROPERTY
@given(addresses, addresses)
def test_address_order_and_equality_follow_scheme_then_opaque(
    a: DatagramAddr, b: DatagramAddr
) -> None:
    for compare in _COMPARISONS:
        assert compare(a, b) == compare((a.scheme, a.opaque), (b.scheme, b.opaque))
    if a == b:
        assert hash(a) == hash(b)


@_PROPERTY
@given(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), ports, u32, u32)
def test_sockaddr_round_trip(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, flowinfo: int, scope: int
) -> None:
    if ip.version == 4:
        addr = DatagramAddr.from_sockaddr((str(ip), port))
        assert addr.to_sockaddr() == (str(ip), port)
        assert len(addr.opaque) == 7
    else:
        addr = DatagramAddr.from_sockaddr((str(ip), port, flowinfo, scope))
        assert addr.to_sockaddr() == (str(ip), port, flowinfo, scope)
        assert len(addr.opaque) == 27
    assert addr.ip == ip
    assert DatagramAddr.from_sockaddr(addr.to_sockaddr()) == addr


@_PROPERTY
@given(st.binary(max_size=200))
def test_unix_paths_round_trip(raw: bytes) -> None:
    addr = DatagramAddr.unixgram(raw)
    assert addr.opaque == raw
    path = addr.to_unix_path()
    assert DatagramAddr.unixgram(path) == addr
    assert addr.is_abstract == raw.startswith(b"\0")
    assert isinstance(path, bytes) == addr.is_abstract


texts = st.one_of(
    st.text(max_size=60),
    st.builds(
        operator.add,
        st.sampled_from(["udp://", "unix://", "unixgram://", "inproc://", "switch://", "x://"]),
        st.text(st.characters(codec="ascii"), max_size=60),
    ),
    st.builds(
        operator.add,
        st.sampled_from(["udp://[", "udp://1.", "inproc://1/", "switch://1/"]),
        st.text("0123456789abcdef:.[]%?=/", max_size=45),
    ),
)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_parse_either_returns_an_address_or_raises_address_error(text: str) -> None:
    try:
        addr = DatagramAddr.parse(text)
    except AddressError:
        return
    assert DatagramAddr.parse(str(addr)) == addr
