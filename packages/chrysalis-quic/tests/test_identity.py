"""Tests of ``Identity`` and ``verify_peer_chain``: PID derivation, validation, PEM round trips
and peer chain verification against cluster roots, with the time passed in."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import IdentityMaterial, Pid
from chrysalis.quic._devca import DevelopmentCA
from chrysalis.quic._identity import (
    MAX_CERTIFICATE_DER_LENGTH,
    MAX_CHAIN_LENGTH,
    MAX_PEM_LENGTH,
    Identity,
    IdentityError,
    PeerVerificationError,
    verify_peer_chain,
)

NOW = datetime.datetime(2030, 6, 1, 12, 0, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=1)
_FUZZ_CA = DevelopmentCA.create("fuzz CA", now=NOW)


@pytest.fixture(scope="module")
def ca() -> DevelopmentCA:
    return DevelopmentCA.create(now=NOW)


@pytest.fixture(scope="module")
def other_ca() -> DevelopmentCA:
    return DevelopmentCA.create("another CA", now=NOW)


@pytest.fixture(scope="module")
def identity(ca: DevelopmentCA) -> Identity:
    return ca.issue(now=NOW)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _self_signed_leaf() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf shaped like ours (SAN, EKU) but signed by its own key."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    start = NOW - datetime.timedelta(hours=1)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("self-signed"))
        .issuer_name(_name("self-signed"))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def _ca_certificate(
    subject: str,
    public: ec.EllipticCurvePublicKey,
    issuer: x509.Certificate | None,
    signer: ec.EllipticCurvePrivateKey,
    path_length: int,
) -> x509.Certificate:
    issuer_name = _name(subject) if issuer is None else issuer.subject
    start = NOW - datetime.timedelta(hours=1)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )


# -- Identity -----------------------------------------------------------------------------


def test_pid_is_sha256_of_leaf_der_truncated_to_16_bytes(identity: Identity) -> None:
    der = identity.leaf.public_bytes(serialization.Encoding.DER)
    assert identity.leaf_der == der
    assert identity.pid == Pid(hashlib.sha256(der).digest()[:16])
    assert identity.pid == Pid.from_certificate(der)


def test_each_issued_identity_has_a_fresh_pid_and_key(ca: DevelopmentCA) -> None:
    identities = [ca.issue(now=NOW) for _ in range(8)]
    assert len({i.pid for i in identities}) == 8
    spki = {
        i.private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for i in identities
    }
    assert len(spki) == 8


def test_leaf_and_server_name_come_from_the_chain(identity: Identity) -> None:
    assert identity.leaf is identity.chain[0]
    assert identity.server_name == "localhost"
    assert identity.not_valid_after == identity.leaf.not_valid_after_utc


def test_server_name_falls_back_to_first_ip_san(ca: DevelopmentCA) -> None:
    ip_only = ca.issue(dns_names=(), ip_addresses=("10.1.2.3",), now=NOW)
    assert ip_only.server_name == "10.1.2.3"


def test_identity_rejects_a_key_that_does_not_match_the_leaf(
    identity: Identity, ca: DevelopmentCA
) -> None:
    other = ca.issue(now=NOW)
    with pytest.raises(IdentityError, match="does not match the leaf"):
        Identity(chain=identity.chain, private_key=other.private_key, roots=identity.roots)


def test_identity_rejects_empty_roots_and_chain(identity: Identity) -> None:
    with pytest.raises(IdentityError, match="roots is empty"):
        Identity(chain=identity.chain, private_key=identity.private_key, roots=())
    with pytest.raises(IdentityError, match="chain is empty"):
        Identity(chain=(), private_key=identity.private_key, roots=identity.roots)


def test_identity_rejects_non_certificates_and_overlong_chains(identity: Identity) -> None:
    with pytest.raises(IdentityError, match=r"roots\[0\] is a bytes"):
        Identity(
            chain=identity.chain,
            private_key=identity.private_key,
            roots=(b"not a certificate",),  # type: ignore[arg-type]
        )
    too_long = identity.chain * (MAX_CHAIN_LENGTH + 1)
    with pytest.raises(IdentityError, match="more than"):
        Identity(chain=too_long, private_key=identity.private_key, roots=identity.roots)


def test_identity_rejects_key_types_unusable_for_tls(identity: Identity) -> None:
    key = dsa.generate_private_key(1024)
    with pytest.raises(IdentityError, match="not usable for TLS"):
        Identity(chain=identity.chain, private_key=key, roots=identity.roots)  # type: ignore[arg-type]


def test_identity_stores_lists_as_tuples_and_hides_the_key(identity: Identity) -> None:
    copy = Identity(
        chain=list(identity.chain),  # type: ignore[arg-type]
        private_key=identity.private_key,
        roots=list(identity.roots),  # type: ignore[arg-type]
    )
    assert isinstance(copy.chain, tuple)
    assert isinstance(copy.roots, tuple)
    assert copy == identity
    assert copy.pid == identity.pid
    assert "private" not in repr(copy).lower()
    with pytest.raises(AttributeError):
        copy.chain = ()  # type: ignore[misc]


def test_material_round_trip_keeps_the_pid(identity: Identity) -> None:
    material = identity.to_material()
    assert isinstance(material, IdentityMaterial)
    again = Identity.from_material(material)
    assert again == identity
    assert again.pid == identity.pid
    assert again.key_pem() == identity.key_pem()


def test_from_pem_accepts_a_sec1_key(identity: Identity) -> None:
    assert isinstance(identity.private_key, ec.EllipticCurvePrivateKey)
    sec1 = identity.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    again = Identity.from_pem(identity.chain_pem(), sec1, identity.roots_pem())
    assert again.pid == identity.pid


def test_from_pem_reports_malformed_chain(identity: Identity) -> None:
    with pytest.raises(IdentityError, match="certificate chain PEM is not valid"):
        Identity.from_pem(b"garbage", identity.key_pem(), identity.roots_pem())


def test_from_pem_reports_encrypted_key(identity: Identity) -> None:
    encrypted = identity.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(IdentityError, match="encrypted"):
        Identity.from_pem(identity.chain_pem(), encrypted, identity.roots_pem())


def test_from_pem_reports_malformed_key_and_oversized_input(identity: Identity) -> None:
    with pytest.raises(IdentityError, match="not a valid private key"):
        Identity.from_pem(identity.chain_pem(), b"-----BEGIN PRIVATE KEY-----\nAAAA\n", b"")
    huge = identity.chain_pem() + b"\n" * MAX_PEM_LENGTH
    with pytest.raises(IdentityError, match="longer than"):
        Identity.from_pem(huge, identity.key_pem(), identity.roots_pem())


def test_from_material_rejects_other_types() -> None:
    with pytest.raises(IdentityError, match="IdentityMaterial"):
        Identity.from_material(object())  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600), st.binary(max_size=300))
def test_from_pem_raises_only_identity_error_for_arbitrary_bytes(chain: bytes, key: bytes) -> None:
    with pytest.raises(IdentityError):
        Identity.from_pem(b"-----BEGIN CERTIFICATE-----\n" + chain, key, chain)


# -- verify_peer_chain ---------------------------------------------------------------------


def test_peer_chain_verifies_against_its_ca_as_client_and_server(
    identity: Identity, ca: DevelopmentCA
) -> None:
    roots = [ca.certificate]
    assert verify_peer_chain([identity.leaf_der], roots, now=LATER) == identity.pid
    assert (
        verify_peer_chain([identity.leaf_der], roots, now=LATER, server_name="localhost")
        == identity.pid
    )


def test_peer_chain_fails_against_another_ca(identity: Identity, other_ca: DevelopmentCA) -> None:
    with pytest.raises(PeerVerificationError, match="trusted root") as info:
        verify_peer_chain([identity.leaf_der], [other_ca.certificate], now=LATER)
    assert info.value.reason


def test_peer_chain_fails_for_an_expired_leaf(ca: DevelopmentCA) -> None:
    short = ca.issue(validity=datetime.timedelta(hours=1), now=NOW)
    assert verify_peer_chain([short.leaf_der], short.roots, now=LATER) == short.pid
    with pytest.raises(PeerVerificationError, match="expired"):
        verify_peer_chain([short.leaf_der], short.roots, now=NOW + datetime.timedelta(hours=2))


def test_peer_chain_fails_before_the_leaf_is_valid(identity: Identity) -> None:
    with pytest.raises(PeerVerificationError, match="not valid before"):
        verify_peer_chain([identity.leaf_der], identity.roots, now=NOW - datetime.timedelta(days=1))


def test_peer_chain_fails_for_a_wrong_server_name(identity: Identity) -> None:
    with pytest.raises(PeerVerificationError, match=r"not valid for server name 'example\.com'"):
        verify_peer_chain([identity.leaf_der], identity.roots, now=LATER, server_name="example.com")


def test_peer_chain_fails_for_a_self_signed_leaf(identity: Identity) -> None:
    leaf, _ = _self_signed_leaf()
    der = leaf.public_bytes(serialization.Encoding.DER)
    with pytest.raises(PeerVerificationError):
        verify_peer_chain([der], identity.roots, now=LATER)
    with pytest.raises(PeerVerificationError):
        verify_peer_chain([der], identity.roots, now=LATER, server_name="localhost")


@pytest.mark.parametrize("server_name", ["127.0.0.1", "::1", "[::1]"])
def test_ip_literal_server_name_is_checked_against_ip_san(
    identity: Identity, server_name: str
) -> None:
    pid = verify_peer_chain([identity.leaf_der], identity.roots, now=LATER, server_name=server_name)
    assert pid == identity.pid


def test_ip_literal_does_not_match_a_dns_san_of_the_same_text(ca: DevelopmentCA) -> None:
    dns_only = ca.issue(dns_names=("10.9.9.9", "node.test"), ip_addresses=(), now=NOW)
    with pytest.raises(PeerVerificationError, match=r"server name '10\.9\.9\.9'"):
        verify_peer_chain([dns_only.leaf_der], dns_only.roots, now=LATER, server_name="10.9.9.9")
    ip_only = ca.issue(dns_names=(), ip_addresses=("10.9.9.9",), now=NOW)
    assert (
        verify_peer_chain([ip_only.leaf_der], ip_only.roots, now=LATER, server_name="10.9.9.9")
        == ip_only.pid
    )
    with pytest.raises(PeerVerificationError):
        verify_peer_chain([ip_only.leaf_der], ip_only.roots, now=LATER, server_name="10.9.9.8")


def test_invalid_server_name_is_a_verification_error(identity: Identity) -> None:
    with pytest.raises(PeerVerificationError, match="neither an IP address"):
        verify_peer_chain([identity.leaf_der], identity.roots, now=LATER, server_name="bad name!")


def test_naive_now_is_taken_as_utc(ca: DevelopmentCA) -> None:
    short = ca.issue(validity=datetime.timedelta(hours=1), now=NOW)
    naive = (NOW + datetime.timedelta(hours=2)).replace(tzinfo=None)
    with pytest.raises(PeerVerificationError, match="expired"):
        verify_peer_chain([short.leaf_der], short.roots, now=naive)
    shifted = (NOW + datetime.timedelta(minutes=30)).astimezone(
        datetime.timezone(datetime.timedelta(hours=-8))
    )
    assert verify_peer_chain([short.leaf_der], short.roots, now=shifted) == short.pid


def test_intermediates_after_the_leaf_complete_the_path() -> None:
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _ca_certificate("root", root_key.public_key(), None, root_key, path_length=1)
    inter_key = ec.generate_private_key(ec.SECP256R1())
    inter = _ca_certificate("intermediate", inter_key.public_key(), root, root_key, 0)
    leaf = DevelopmentCA(certificate=inter, private_key=inter_key).issue(now=NOW)
    chain = [leaf.leaf_der, inter.public_bytes(serialization.Encoding.DER)]
    assert verify_peer_chain(chain, [root], now=LATER, server_name="localhost") == leaf.pid
    with pytest.raises(PeerVerificationError):
        verify_peer_chain(chain[:1], [root], now=LATER, server_name="localhost")


def test_peer_chain_bounds_and_malformed_input(identity: Identity) -> None:
    roots = identity.roots
    with pytest.raises(PeerVerificationError, match="no certificate"):
        verify_peer_chain([], roots, now=LATER)
    with pytest.raises(PeerVerificationError, match="more than"):
        verify_peer_chain([identity.leaf_der] * (MAX_CHAIN_LENGTH + 1), roots, now=LATER)
    with pytest.raises(PeerVerificationError, match="bytes, more than"):
        verify_peer_chain([bytes(MAX_CERTIFICATE_DER_LENGTH + 1)], roots, now=LATER)
    with pytest.raises(PeerVerificationError, match="not valid DER"):
        verify_peer_chain([b"\x30\x03abc"], roots, now=LATER)
    with pytest.raises(PeerVerificationError, match="no usable trust roots"):
        verify_peer_chain([identity.leaf_der], [], now=LATER)


def test_peer_chain_rejects_wrong_argument_types(identity: Identity) -> None:
    with pytest.raises(TypeError):
        verify_peer_chain(identity.leaf_der, identity.roots, now=LATER)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        verify_peer_chain([identity.leaf_der], identity.roots, now=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        verify_peer_chain(["text"], identity.roots, now=LATER)  # type: ignore[list-item]


def test_identity_accepts_an_ed25519_leaf_key_and_round_trips_it(ca: DevelopmentCA) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    template = ca.issue(now=NOW).leaf
    leaf = (
        x509.CertificateBuilder()
        .subject_name(template.subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(template.not_valid_before_utc)
        .not_valid_after(template.not_valid_after_utc)
    )
    for extension in template.extensions:
        if not isinstance(extension.value, x509.SubjectKeyIdentifier):
            leaf = leaf.add_extension(extension.value, extension.critical)
    certificate = leaf.sign(ca.private_key, hashes.SHA256())
    identity = Identity(chain=(certificate,), private_key=key, roots=(ca.certificate,))
    again = Identity.from_material(identity.to_material())
    assert isinstance(again.private_key, ed25519.Ed25519PrivateKey)
    assert again.pid == identity.pid == Pid.from_certificate(identity.leaf_der)


def test_identity_verify_peer_uses_its_roots(identity: Identity, ca: DevelopmentCA) -> None:
    peer = ca.issue(now=NOW)
    assert identity.verify_peer([peer.leaf_der], now=LATER, server_name="::1") == peer.pid


@settings(max_examples=60, deadline=None)
@given(
    dns=st.lists(
        st.from_regex(r"[a-z][a-z0-9]{0,10}(\.[a-z][a-z0-9]{0,10}){0,3}", fullmatch=True),
        max_size=3,
        unique=True,
    ),
    ips=st.lists(st.ip_addresses().map(str), max_size=3, unique=True),
)
def test_issued_leaf_verifies_for_every_san_and_round_trips(
    ca: DevelopmentCA, dns: list[str], ips: list[str]
) -> None:
    if not dns and not ips:
        with pytest.raises(IdentityError):
            ca.issue(dns_names=dns, ip_addresses=ips, now=NOW)
        return
    identity = ca.issue(dns_names=dns, ip_addresses=ips, now=NOW)
    assert identity.pid == Pid(hashlib.sha256(identity.leaf_der).digest()[:16])
    assert Identity.from_material(identity.to_material()).pid == identity.pid
    for name in [*dns, *ips]:
        assert verify_peer_chain([identity.leaf_der], [ca.certificate], now=LATER, server_name=name)
    names = set(dns) | {str(ipaddress.ip_address(ip)) for ip in ips}
    if "unmatched.invalid" not in names:
        with pytest.raises(PeerVerificationError):
            verify_peer_chain(
                [identity.leaf_der], [ca.certificate], now=LATER, server_name="unmatched.invalid"
            )


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
def test_arbitrary_der_raises_only_peer_verification_error(chain: list[bytes]) -> None:
    roots = [_FUZZ_CA.certificate]
    with pytest.raises(PeerVerificationError):
        verify_peer_chain(chain, roots, now=LATER)
