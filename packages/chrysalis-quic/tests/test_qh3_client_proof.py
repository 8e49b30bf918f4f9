"""The session-bound client proof on its own: the codec, signing and verification for every
supported key type, the TLS exporter (checked against aioquic's independent HKDF), the exporter
tap and the server-side ``ProofVerifier`` state machine."""

from __future__ import annotations

import datetime
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from aioquic.tls import hkdf_expand_label as aioquic_hkdf_expand_label
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).parent))

import itertools

from test_endpoint_harness import issue

from chrysalis.quic._engines.client_proof import (
    EXPORTER_LABEL,
    MAX_PROOF_LENGTH,
    MAX_SIGNATURE_LENGTH,
    ClientProof,
    ClientProofError,
    ExporterTap,
    ProofFailure,
    ProofVerifier,
    SignatureScheme,
    hkdf_expand_label,
    proof_message,
    sign_client_proof,
    tls_exporter,
    verify_client_proof,
)
from chrysalis.quic._identity import MAX_CHAIN_LENGTH, TlsPrivateKey

_IDENTITY = issue()
_CHAIN = tuple(c.public_bytes(Encoding.DER) for c in _IDENTITY.chain)
_EXPORTER = bytes(range(32))


def _self_signed(key: TlsPrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "proof test")])
    when = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(when)
        .not_valid_after(when + datetime.timedelta(days=1))
    )
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(Encoding.DER)


_KEYS: dict[str, TlsPrivateKey] = {
    "p256": ec.generate_private_key(ec.SECP256R1()),
    "p384": ec.generate_private_key(ec.SECP384R1()),
    "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ed25519": ed25519.Ed25519PrivateKey.generate(),
}
_SCHEMES = {
    "p256": SignatureScheme.ECDSA_SECP256R1_SHA256,
    "p384": SignatureScheme.ECDSA_SECP384R1_SHA384,
    "rsa": SignatureScheme.RSA_PSS_RSAE_SHA256,
    "ed25519": SignatureScheme.ED25519,
}


# --- codec ---------------------------------------------------------------------------------------

_proofs = st.builds(
    ClientProof,
    chain=st.lists(st.binary(min_size=1, max_size=600), min_size=1, max_size=MAX_CHAIN_LENGTH).map(
        tuple
    ),
    scheme=st.integers(min_value=0, max_value=0xFFFF),
    signature=st.binary(min_size=1, max_size=MAX_SIGNATURE_LENGTH),
)


@settings(max_examples=150, deadline=None)
@given(proof=_proofs)
def test_encode_and_decode_are_inverse(proof: ClientProof) -> None:
    assert ClientProof.decode(proof.encode()) == proof


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000))
def test_decoding_arbitrary_bytes_only_ever_raises_client_proof_error(data: bytes) -> None:
    failure: ProofFailure | None = None
    try:
        proof = ClientProof.decode(data)
    except ClientProofError as exc:
        failure = exc.failure
    else:
        assert proof.encode() == data
    assert failure in (None, ProofFailure.MALFORMED, ProofFailure.OVERSIZED)


def test_every_truncation_and_any_trailing_byte_is_malformed() -> None:
    wire = sign_client_proof(_IDENTITY.private_key, _CHAIN, _EXPORTER).encode()
    for end in range(len(wire)):
        with pytest.raises(ClientProofError) as caught:
            ClientProof.decode(wire[:end])
        assert caught.value.failure is ProofFailure.MALFORMED
    with pytest.raises(ClientProofError, match="trailing") as caught:
        ClientProof.decode(wire + b"\x00")
    assert caught.value.failure is ProofFailure.MALFORMED


def test_bounds_are_enforced_on_both_sides() -> None:
    with pytest.raises(ClientProofError) as caught:
        ClientProof.decode(b"CCP1" + bytes(MAX_PROOF_LENGTH))
    assert caught.value.failure is ProofFailure.OVERSIZED
    too_many = ClientProof(chain=(b"x",) * (MAX_CHAIN_LENGTH + 1), scheme=0x0403, signature=b"s")
    with pytest.raises(ClientProofError) as caught:
        too_many.encode()
    assert caught.value.failure is ProofFailure.OVERSIZED
    wire = b"CCP1\x04\x03" + bytes([MAX_CHAIN_LENGTH + 1])
    with pytest.raises(ClientProofError) as caught:
        ClientProof.decode(wire)
    assert caught.value.failure is ProofFailure.OVERSIZED
    with pytest.raises(ClientProofError) as caught:
        ClientProof(chain=(b"x",), scheme=0x0403, signature=bytes(1025)).encode()
    assert caught.value.failure is ProofFailure.OVERSIZED
    with pytest.raises(ClientProofError) as caught:
        ClientProof(chain=(b"x" * 40_000, b"y" * 40_000), scheme=1, signature=b"s").encode()
    assert caught.value.failure is ProofFailure.OVERSIZED
    with pytest.raises(ClientProofError) as caught:
        ClientProof.decode(b"CCP1\x04\x03\x00")
    assert caught.value.failure is ProofFailure.MALFORMED
    with pytest.raises(ClientProofError, match="magic"):
        ClientProof.decode(b"XXXX" + bytes(20))


# --- signing and verifying -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(_KEYS))
def test_a_proof_verifies_for_its_own_key_and_session_only(kind: str) -> None:
    key = _KEYS[kind]
    chain = (_self_signed(key),)
    proof = sign_client_proof(key, chain, _EXPORTER)
    assert proof.scheme == _SCHEMES[kind]
    assert verify_client_proof(ClientProof.decode(proof.encode()), _EXPORTER) == chain
    other_session = hashlib.sha256(b"another session").digest()
    with pytest.raises(ClientProofError) as caught:
        verify_client_proof(proof, other_session)
    assert caught.value.failure is ProofFailure.BAD_SIGNATURE


def test_a_signature_by_another_key_over_the_right_session_is_rejected() -> None:
    impostor = issue()
    forged = sign_client_proof(impostor.private_key, _CHAIN, _EXPORTER)  # victim's chain
    with pytest.raises(ClientProofError) as caught:
        verify_client_proof(forged, _EXPORTER)
    assert caught.value.failure is ProofFailure.BAD_SIGNATURE


def test_a_flipped_bit_anywhere_in_the_signature_is_rejected() -> None:
    proof = sign_client_proof(_IDENTITY.private_key, _CHAIN, _EXPORTER)
    for index in range(0, len(proof.signature), 7):
        damaged = bytearray(proof.signature)
        damaged[index] ^= 0x01
        altered = ClientProof(proof.chain, proof.scheme, bytes(damaged))
        with pytest.raises(ClientProofError):
            verify_client_proof(altered, _EXPORTER)


def test_scheme_must_match_the_leaf_key_and_leaf_must_be_der() -> None:
    proof = sign_client_proof(_IDENTITY.private_key, _CHAIN, _EXPORTER)
    mislabelled = ClientProof(proof.chain, SignatureScheme.ED25519, proof.signature)
    with pytest.raises(ClientProofError) as caught:
        verify_client_proof(mislabelled, _EXPORTER)
    assert caught.value.failure is ProofFailure.UNSUPPORTED_SCHEME
    garbage = ClientProof((b"not a certificate",), proof.scheme, proof.signature)
    with pytest.raises(ClientProofError) as caught:
        verify_client_proof(garbage, _EXPORTER)
    assert caught.value.failure is ProofFailure.MALFORMED


def test_the_signed_message_is_domain_separated_from_tls_certificate_verify() -> None:
    message = proof_message(_EXPORTER)
    assert message.startswith(b" " * 64 + b"chrysalis client proof v1\x00")
    assert message.endswith(_EXPORTER)
    assert b"TLS 1.3" not in message


# --- the exporter --------------------------------------------------------------------------------

_ALGORITHMS = {32: hashes.SHA256(), 48: hashes.SHA384()}


@settings(max_examples=150, deadline=None)
@given(
    size=st.sampled_from([32, 48]),
    data=st.data(),
    label=st.binary(max_size=40),
    context=st.binary(max_size=64),
    length=st.integers(min_value=1, max_value=200),
)
def test_hkdf_expand_label_matches_aioquic(
    size: int, data: st.DataObject, label: bytes, context: bytes, length: int
) -> None:
    secret = data.draw(st.binary(min_size=size, max_size=size))
    expected = aioquic_hkdf_expand_label(_ALGORITHMS[size], secret, label, context, length)
    assert hkdf_expand_label(secret, label, context, length) == expected


@pytest.mark.parametrize("size", [32, 48])
def test_tls_exporter_follows_rfc_8446_section_7_5(size: int) -> None:
    secret = bytes(range(size))
    algorithm = _ALGORITHMS[size]
    name = "sha256" if size == 32 else "sha384"
    derived = aioquic_hkdf_expand_label(
        algorithm, secret, EXPORTER_LABEL, hashlib.new(name).digest(), size
    )
    expected = aioquic_hkdf_expand_label(
        algorithm, derived, b"exporter", hashlib.new(name, b"ctx").digest(), 32
    )
    assert tls_exporter(secret, EXPORTER_LABEL, b"ctx", 32) == expected
    assert tls_exporter(secret) != tls_exporter(secret, b"EXPORTER-other")


def test_hkdf_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="32, 48 or 64"):
        hkdf_expand_label(bytes(31), b"l", b"", 32)
    with pytest.raises(ValueError, match="length"):
        hkdf_expand_label(bytes(32), b"l", b"", 0)
    with pytest.raises(ValueError, match="255"):
        hkdf_expand_label(bytes(32), b"l" * 300, b"", 32)


class _FakeSchedule:
    def __init__(self) -> None:
        self.derived: list[bytes] = []

    def derive_secret(self, label: bytes) -> bytes:
        self.derived.append(label)
        return hashlib.sha256(label + bytes([len(self.derived)])).digest()


class _FakeTls:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.key_schedule = _FakeSchedule()
        self.update_traffic_key_cb: Callable[..., None] = self._record

    def _record(self, *args: object) -> None:
        self.calls.append(args)


def test_tap_captures_the_first_one_rtt_secret_and_passes_every_call_through() -> None:
    tls = _FakeTls()
    tap = ExporterTap()
    tap.install(tls)
    assert tap.exporter() is None
    tls.update_traffic_key_cb("enc", 2, "suite", b"handshake")  # a handshake secret: ignored
    assert not tap.captured
    tls.update_traffic_key_cb("dec", 3, "suite", b"server 1-rtt")
    first = tap.exporter()
    tls.update_traffic_key_cb("enc", 3, "suite", b"client 1-rtt")  # later: no recapture
    assert tap.exporter() == first is not None
    assert tls.key_schedule.derived == [b"exp master"]
    assert [call[3] for call in tls.calls] == [b"handshake", b"server 1-rtt", b"client 1-rtt"]
    with pytest.raises(TypeError):
        ExporterTap().install(object())


# --- the server-side state machine ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_verifier_accepts_a_proof_in_any_fragmentation(cuts: list[int]) -> None:
    wire = sign_client_proof(_IDENTITY.private_key, _CHAIN, _EXPORTER).encode()
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    verifier = ProofVerifier(timeout=1.0)
    verifier.start(10.0)
    pieces = [wire[a:b] for a, b in itertools.pairwise(points)]
    for index, piece in enumerate(pieces):
        assert verifier.outcome is None
        verifier.feed(piece, index == len(pieces) - 1)
        verifier.judge(_EXPORTER)
    assert verifier.outcome == _CHAIN
    assert verifier.deadline is None
    assert not verifier.expire(100.0)


def test_verifier_times_out_only_after_start_and_its_deadline() -> None:
    verifier = ProofVerifier(timeout=2.0)
    assert (verifier.deadline, verifier.started) == (None, False)
    assert not verifier.expire(1e9)  # not started: the handshake has not completed
    verifier.start(10.0)
    verifier.start(11.0)  # the first start wins
    assert (verifier.deadline, verifier.started) == (12.0, True)
    assert not verifier.expire(11.999)
    assert verifier.expire(12.0)
    assert verifier.outcome is ProofFailure.TIMEOUT
    assert not verifier.expire(13.0)  # fails once


def test_verifier_fails_oversized_aborted_unjudgeable_and_forged_proofs() -> None:
    oversized = ProofVerifier(max_length=100)
    oversized.start(0.0)
    oversized.feed(bytes(60), False)
    first = oversized.outcome
    oversized.feed(bytes(60), False)
    assert (first, oversized.outcome) == (None, ProofFailure.OVERSIZED)
    aborted = ProofVerifier()
    aborted.feed(b"CCP1", False)
    aborted.abort()
    assert aborted.outcome is ProofFailure.ABORTED
    wire = sign_client_proof(_IDENTITY.private_key, _CHAIN, _EXPORTER).encode()
    blind = ProofVerifier()
    blind.feed(wire, True)
    blind.judge(None)
    assert blind.outcome is ProofFailure.NO_EXPORTER
    replayed = ProofVerifier()
    replayed.feed(wire, True)
    replayed.judge(hashlib.sha256(b"this session").digest())
    assert replayed.outcome is ProofFailure.BAD_SIGNATURE
    waiting = ProofVerifier()
    waiting.feed(wire[:10], False)
    waiting.judge(_EXPORTER)  # not complete yet: no verdict
    assert waiting.outcome is None
    with pytest.raises(ValueError, match="timeout"):
        ProofVerifier(timeout=0.0)
