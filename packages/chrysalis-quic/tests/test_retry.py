"""Retry tokens (spec 5.4): the exact wire format, source binding, expiry, tampering and the
one previous secret generation, plus property tests of the codec."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr
from chrysalis.quic._retry import (
    RETRY_TAG_LEN,
    InvalidRetryToken,
    RetryTokenFault,
    RetryTokens,
    token_address,
)

T0 = 1_800_000_000.0
SECRET = bytes(range(32))
ODCID = bytes(range(100, 120))
SOURCE = DatagramAddr.udp("::1", 1234)


def _tokens(**kwargs: object) -> RetryTokens:
    return RetryTokens(now=T0, secret=SECRET, **kwargs)  # type: ignore[arg-type]


def _fault(tokens: RetryTokens, token: bytes, source: DatagramAddr, now: float) -> RetryTokenFault:
    with pytest.raises(InvalidRetryToken) as caught:
        tokens.validate(token, source, now)
    return caught.value.fault


def test_token_layout_matches_the_reference_format() -> None:
    token = _tokens().mint(DatagramAddr.udp("10.1.2.3", 4433), ODCID, T0 + 0.7)
    body, tag = token[:-RETRY_TAG_LEN], token[-RETRY_TAG_LEN:]
    assert body == (
        b"\x01"
        + int(T0).to_bytes(8, "big")
        + b"\x04"
        + bytes([10, 1, 2, 3])
        + (4433).to_bytes(2, "big")
        + bytes([len(ODCID)])
        + ODCID
    )
    assert tag == hmac.digest(SECRET, body, "sha256")


def test_retry_token_authenticates_source_and_original_dcid() -> None:
    tokens = _tokens()
    token = tokens.mint(SOURCE, ODCID, T0)
    assert tokens.validate(token, SOURCE, T0 + 1) == ODCID
    assert _fault(tokens, token, DatagramAddr.udp("::1", 1235), T0 + 1) is RetryTokenFault.ADDRESS
    assert _fault(tokens, token, DatagramAddr.udp("::2", 1234), T0 + 1) is RetryTokenFault.ADDRESS
    flipped = bytearray(token)
    flipped[3] ^= 0x01
    assert _fault(tokens, bytes(flipped), SOURCE, T0 + 1) is RetryTokenFault.BAD_TAG


def test_every_tampered_byte_is_rejected() -> None:
    tokens = _tokens()
    token = tokens.mint(SOURCE, ODCID, T0)
    for index in range(len(token)):
        tampered = bytearray(token)
        tampered[index] ^= 0x80
        with pytest.raises(InvalidRetryToken):
            tokens.validate(bytes(tampered), SOURCE, T0)


def test_token_expires_after_its_lifetime_and_is_never_from_the_future() -> None:
    tokens = _tokens()
    token = tokens.mint(SOURCE, ODCID, T0)
    assert tokens.validate(token, SOURCE, T0 + 120) == ODCID
    assert _fault(tokens, token, SOURCE, T0 + 121) is RetryTokenFault.EXPIRED
    assert _fault(tokens, token, SOURCE, T0 - 5) is RetryTokenFault.FUTURE


def test_previous_secret_still_verifies_but_not_two_generations_back() -> None:
    tokens = _tokens(token_lifetime=1000.0, secret_lifetime=100.0)
    token = tokens.mint(SOURCE, ODCID, T0)
    assert tokens.validate(token, SOURCE, T0 + 150) == ODCID
    assert tokens.has_previous
    fresh = tokens.mint(SOURCE, ODCID, T0 + 160)
    assert tokens.validate(fresh, SOURCE, T0 + 170) == ODCID
    # A second rotation forgets the secret the first token was minted with.
    assert tokens.rotate_if_due(T0 + 300)
    assert _fault(tokens, token, SOURCE, T0 + 300) is RetryTokenFault.BAD_TAG
    assert tokens.validate(fresh, SOURCE, T0 + 300) == ODCID


def test_token_from_another_endpoint_secret_is_rejected() -> None:
    token = RetryTokens(now=T0, secret=b"\xaa" * 32).mint(SOURCE, ODCID, T0)
    assert _fault(_tokens(), token, SOURCE, T0) is RetryTokenFault.BAD_TAG


def test_wrong_version_and_malformed_lengths_are_reported() -> None:
    tokens = _tokens()
    body = bytearray(tokens.mint(SOURCE, ODCID, T0)[:-RETRY_TAG_LEN])
    body[0] = 2
    resigned = bytes(body) + hmac.digest(SECRET, bytes(body), "sha256")
    assert _fault(tokens, resigned, SOURCE, T0) is RetryTokenFault.VERSION
    body[0] = 1
    body[-len(ODCID) - 1] = len(ODCID) - 1  # the length byte no longer matches
    resigned = bytes(body) + hmac.digest(SECRET, bytes(body), "sha256")
    assert _fault(tokens, resigned, SOURCE, T0) is RetryTokenFault.MALFORMED
    assert _fault(tokens, b"", SOURCE, T0) is RetryTokenFault.MALFORMED
    assert _fault(tokens, b"\x01" * 500, SOURCE, T0) is RetryTokenFault.MALFORMED


def test_non_udp_sources_bind_a_digest_of_the_whole_address() -> None:
    tokens = _tokens()
    source = DatagramAddr.inproc(7, 3)
    family, ip, port = token_address(source)
    assert (family, port) == (6, 0)
    scheme_and_opaque = b"inproc\x00" + source.opaque
    assert ip == hashlib.sha256(b"chrysalis retry address\x00" + scheme_and_opaque).digest()[:16]
    token = tokens.mint(source, ODCID, T0)
    assert tokens.validate(token, source, T0) == ODCID
    assert _fault(tokens, token, DatagramAddr.inproc(7, 4), T0) is RetryTokenFault.ADDRESS


def test_original_dcid_longer_than_twenty_bytes_is_refused_at_mint() -> None:
    with pytest.raises(ValueError, match="longer than 20"):
        _tokens().mint(SOURCE, bytes(21), T0)


def test_secrets_come_from_the_injected_source() -> None:
    calls: list[int] = []

    def fake_random(n: int) -> bytes:
        calls.append(n)
        return bytes([len(calls)]) * n

    tokens = RetryTokens(now=T0, random_bytes=fake_random, secret_lifetime=10.0)
    token = tokens.mint(SOURCE, ODCID, T0)
    assert token[-RETRY_TAG_LEN:] == hmac.digest(b"\x01" * 32, token[:-RETRY_TAG_LEN], "sha256")
    tokens.rotate_if_due(T0 + 10)
    assert calls == [32, 32]


_addresses = st.one_of(
    st.builds(
        DatagramAddr.udp,
        st.ip_addresses(v=4).map(str),
        st.integers(min_value=0, max_value=65535),
    ),
    st.builds(
        DatagramAddr.udp,
        st.ip_addresses(v=6).map(str),
        st.integers(min_value=0, max_value=65535),
    ),
    st.builds(
        DatagramAddr.inproc,
        st.integers(min_value=0, max_value=2**64 - 1),
        st.integers(min_value=0, max_value=2**64 - 1),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    address=_addresses,
    odcid=st.binary(max_size=20),
    issued=st.floats(min_value=0, max_value=2**40, allow_nan=False),
    age=st.floats(min_value=0, max_value=119.0),
)
def test_minted_tokens_round_trip(
    address: DatagramAddr, odcid: bytes, issued: float, age: float
) -> None:
    tokens = RetryTokens(now=issued, secret=SECRET)
    token = tokens.mint(address, odcid, issued)
    assert tokens.validate(token, address, issued + age) == odcid


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=120), address=_addresses)
def test_arbitrary_bytes_only_ever_raise_invalid_retry_token(
    data: bytes, address: DatagramAddr
) -> None:
    tokens = _tokens()
    with pytest.raises(InvalidRetryToken):
        tokens.validate(data, address, T0)


@settings(max_examples=150, deadline=None)
@given(address=_addresses, odcid=st.binary(max_size=20), position=st.integers(min_value=0))
def test_any_single_byte_change_is_rejected(
    address: DatagramAddr, odcid: bytes, position: int
) -> None:
    tokens = _tokens()
    token = bytearray(tokens.mint(address, odcid, T0))
    token[position % len(token)] ^= 0x01
    with pytest.raises(InvalidRetryToken):
        tokens.validate(bytes(token), address, T0)
