"""Process identity: a TLS certificate chain and key, and the PID that the leaf defines.

Why this module exists: a Chrysalis PID is self-certifying. ``pid = SHA-256(leaf DER)[:16]``
(:meth:`chrysalis.core.Pid.from_certificate`), so whoever holds a leaf and its private key *is*
that process, and a peer's PID is recomputed from the leaf it presented in the TLS handshake,
never taken from anything the peer merely claims. Two things follow, and both live here:

* :class:`Identity` is the parsed, validated form of this process's identity (chain, key,
  trust roots). It refuses, at construction, a key that does not belong to the leaf or an
  empty set of roots, so a broken identity fails where it is loaded instead of in a handshake.
  It converts to and from :class:`chrysalis.core.IdentityMaterial`, the PEM record identity
  provider plugins return.
* :func:`verify_peer_chain` is the one place a peer's certificate chain is judged. aioquic
  does not verify a client's certificate at all (see the platform notes), so the endpoint
  calls this for both directions: the chain is verified up to the cluster roots with
  ``cryptography.x509.verification`` (the WebPKI-style path builder), and only then is the PID
  derived from the leaf. The current time is an argument: nothing here reads a clock, opens a
  file or touches the network, so the function is deterministic and testable with any time.

Every input is bounded (number of certificates, size of each certificate, size of each PEM
blob) and every rejection is an :class:`IdentityError` (a ``ValueError``) with a message that
says what was wrong.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509 import verification

from chrysalis.core import IdentityMaterial, Pid

__all__ = [
    "MAX_CERTIFICATE_DER_LENGTH",
    "MAX_CHAIN_LENGTH",
    "MAX_PEM_LENGTH",
    "MAX_ROOT_CERTIFICATES",
    "Identity",
    "IdentityError",
    "PeerVerificationError",
    "TlsPrivateKey",
    "describe_certificate",
    "verify_peer_chain",
]

#: Largest PEM blob parsed, in bytes: the bound ``chrysalis.core.IdentityMaterial`` enforces.
MAX_PEM_LENGTH: Final = 1 << 20
#: Most certificates in a chain (the leaf plus intermediates), ours or a peer's.
MAX_CHAIN_LENGTH: Final = 8
#: Most trust roots one identity may carry.
MAX_ROOT_CERTIFICATES: Final = 1024
#: Largest DER certificate accepted from a peer, in bytes.
MAX_CERTIFICATE_DER_LENGTH: Final = 64 * 1024

#: Private key types usable for a TLS 1.3 leaf. Chrysalis issues ECDSA P-256 keys; the others
#: are accepted for externally provided identities (note that qh3 and the ``cryptography``
#: verifier reject Ed25519 leaves, so those only work where the peers accept them).
TlsPrivateKey: TypeAlias = (
    ec.EllipticCurvePrivateKey
    | rsa.RSAPrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)
_TLS_KEY_TYPES: Final = (
    ec.EllipticCurvePrivateKey,
    rsa.RSAPrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
)
_SPKI: Final = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class IdentityError(ValueError):
    """An identity (certificates, key or roots) is missing, malformed or inconsistent.

    Raised by :class:`Identity` construction and parsing, by the development CA and by the
    identity providers. The message says which part is wrong and why.
    """


class PeerVerificationError(IdentityError):
    """A peer's certificate chain did not verify; ``reason`` says why.

    The endpoint must treat the connection as unauthenticated and close it.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"peer certificate rejected: {reason}")


def _spki(public_key: object) -> bytes:
    public_bytes = getattr(public_key, "public_bytes", None)
    if public_bytes is None:  # pragma: no cover - every cryptography public key has it
        raise IdentityError(f"unsupported public key type {type(public_key).__name__}")
    result: bytes = public_bytes(*_SPKI)
    return result


def _as_certificates(value: object, what: str, limit: int) -> tuple[x509.Certificate, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise IdentityError(f"{what} must be a sequence of x509.Certificate")
    items = tuple(value)
    if not items:
        raise IdentityError(f"{what} is empty")
    if len(items) > limit:
        raise IdentityError(f"{what} has {len(items)} certificates, more than {limit}")
    for index, item in enumerate(items):
        if not isinstance(item, x509.Certificate):
            raise IdentityError(
                f"{what}[{index}] is a {type(item).__name__}, not an x509.Certificate"
            )
    return items


def _load_pem_certificates(data: bytes, what: str, limit: int) -> tuple[x509.Certificate, ...]:
    if not isinstance(data, bytes):
        raise IdentityError(f"{what} must be bytes, not {type(data).__name__}")
    if len(data) > MAX_PEM_LENGTH:
        raise IdentityError(f"{what} is longer than {MAX_PEM_LENGTH} bytes")
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise IdentityError(f"{what} is not valid PEM certificate data: {exc}") from exc
    if len(certificates) > limit:
        raise IdentityError(f"{what} has {len(certificates)} certificates, more than {limit}")
    return tuple(certificates)


def _load_pem_key(data: bytes) -> TlsPrivateKey:
    if not isinstance(data, bytes):
        raise IdentityError(f"private key PEM must be bytes, not {type(data).__name__}")
    if len(data) > MAX_PEM_LENGTH:
        raise IdentityError(f"private key PEM is longer than {MAX_PEM_LENGTH} bytes")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # encrypted key and no password
        raise IdentityError(
            f"private key PEM is encrypted; give an unencrypted key ({exc})"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise IdentityError(f"private key PEM is not a valid private key: {exc}") from exc
    if not isinstance(key, _TLS_KEY_TYPES):
        raise IdentityError(f"private key type {type(key).__name__} is not usable for TLS")
    return key


def _pem(certificates: Sequence[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certificates)


@dataclass(frozen=True, slots=True)
class Identity:
    """The TLS identity of this process: ``chain`` (leaf first, then intermediates),
    ``private_key`` (the leaf's key) and ``roots`` (the trust anchors used to verify peers).

    Immutable. Construction validates: the chain and roots are non-empty sequences of
    ``x509.Certificate`` (at most :data:`MAX_CHAIN_LENGTH` and :data:`MAX_ROOT_CERTIFICATES`;
    lists are stored as tuples), the key is a TLS-capable private key (:data:`TlsPrivateKey`)
    and its public half is the leaf's public key. Any violation raises :class:`IdentityError`.

    ``pid`` is ``Pid.from_certificate(leaf_der)``, computed once at construction. The private
    key is left out of ``repr`` and of equality (two identities are equal when their chains and
    roots are).
    """

    chain: tuple[x509.Certificate, ...]
    private_key: TlsPrivateKey = field(repr=False, compare=False)
    roots: tuple[x509.Certificate, ...]
    _leaf_der: bytes = field(init=False, repr=False, compare=False)
    _pid: Pid = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chain = _as_certificates(self.chain, "chain", MAX_CHAIN_LENGTH)
        roots = _as_certificates(self.roots, "roots", MAX_ROOT_CERTIFICATES)
        if not isinstance(self.private_key, _TLS_KEY_TYPES):
            raise IdentityError(
                f"private key type {type(self.private_key).__name__} is not usable for TLS"
            )
        if _spki(self.private_key.public_key()) != _spki(chain[0].public_key()):
            raise IdentityError("the private key does not match the leaf certificate's public key")
        leaf_der = chain[0].public_bytes(serialization.Encoding.DER)
        object.__setattr__(self, "chain", chain)
        object.__setattr__(self, "roots", roots)
        object.__setattr__(self, "_leaf_der", leaf_der)
        object.__setattr__(self, "_pid", Pid.from_certificate(leaf_der))

    # -- derived values -----------------------------------------------------------------------

    @property
    def pid(self) -> Pid:
        """This process's PID: ``SHA-256(leaf DER)[:16]``."""
        return self._pid

    @property
    def leaf(self) -> x509.Certificate:
        """The leaf certificate (``chain[0]``)."""
        return self.chain[0]

    @property
    def leaf_der(self) -> bytes:
        """The leaf certificate in DER, the bytes the PID is computed from."""
        return self._leaf_der

    @property
    def server_name(self) -> str | None:
        """The name peers should verify this identity against: the leaf's first DNS SAN,
        else its first IP SAN (as text), else ``None`` (no SAN extension)."""
        try:
            san = self.leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except x509.ExtensionNotFound:
            return None
        dns = san.value.get_values_for_type(x509.DNSName)
        if dns:
            return dns[0]
        ips = san.value.get_values_for_type(x509.IPAddress)
        return str(ips[0]) if ips else None

    @property
    def not_valid_after(self) -> datetime.datetime:
        """When the leaf expires (timezone-aware, UTC)."""
        return self.leaf.not_valid_after_utc

    # -- conversions ----------------------------------------------------------------------------

    @classmethod
    def from_pem(cls, chain_pem: bytes, key_pem: bytes, roots_pem: bytes) -> Identity:
        """Parse PEM: ``chain_pem`` holds the leaf first, then any intermediates;
        ``key_pem`` an unencrypted PKCS#8, PKCS#1 or SEC1 private key; ``roots_pem`` one or
        more trust-root certificates. Each blob is at most 1 MiB. Raises
        :class:`IdentityError` for malformed, encrypted, empty or mismatched input.
        """
        chain = _load_pem_certificates(chain_pem, "certificate chain PEM", MAX_CHAIN_LENGTH)
        key = _load_pem_key(key_pem)
        roots = _load_pem_certificates(roots_pem, "trust roots PEM", MAX_ROOT_CERTIFICATES)
        return cls(chain=chain, private_key=key, roots=roots)

    @classmethod
    def from_material(cls, material: IdentityMaterial) -> Identity:
        """Parse the PEM record an identity provider returned (see :meth:`from_pem`)."""
        if not isinstance(material, IdentityMaterial):
            raise IdentityError(f"expected an IdentityMaterial, not {type(material).__name__}")
        return cls.from_pem(material.chain_pem, material.key_pem, material.roots_pem)

    def chain_pem(self) -> bytes:
        """The certificate chain as concatenated PEM, leaf first."""
        return _pem(self.chain)

    def key_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM. Handle with care: it is the identity."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def roots_pem(self) -> bytes:
        """The trust roots as concatenated PEM."""
        return _pem(self.roots)

    def to_material(self) -> IdentityMaterial:
        """This identity as the PEM record identity providers return."""
        return IdentityMaterial(
            chain_pem=self.chain_pem(), key_pem=self.key_pem(), roots_pem=self.roots_pem()
        )

    def verify_peer(
        self,
        chain_der: Sequence[bytes],
        *,
        now: datetime.datetime,
        server_name: str | None = None,
    ) -> Pid:
        """:func:`verify_peer_chain` against this identity's roots."""
        return verify_peer_chain(chain_der, self.roots, now=now, server_name=server_name)


def _utc(now: datetime.datetime) -> datetime.datetime:
    if not isinstance(now, datetime.datetime):
        raise TypeError(f"now must be a datetime.datetime, not {type(now).__name__}")
    if now.tzinfo is None:
        return now.replace(tzinfo=datetime.UTC)
    return now.astimezone(datetime.UTC)


def _subject_for(server_name: str) -> verification.Subject:
    """An IP literal (IPv6 optionally in brackets) becomes an IP subject, anything else DNS."""
    if not isinstance(server_name, str):
        raise TypeError(f"server_name must be a str or None, not {type(server_name).__name__}")
    text = server_name
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        return x509.DNSName(server_name)


def verify_peer_chain(
    chain_der: Sequence[bytes],
    roots: Sequence[x509.Certificate],
    *,
    now: datetime.datetime,
    server_name: str | None = None,
) -> Pid:
    """Verify a peer's certificate chain up to ``roots`` at time ``now``; return its PID.

    ``chain_der`` is the chain the peer presented in the handshake, leaf first, each
    certificate in DER (at most :data:`MAX_CHAIN_LENGTH` certificates of at most
    :data:`MAX_CERTIFICATE_DER_LENGTH` bytes). The leaf is verified with
    ``cryptography.x509.verification`` against a store holding exactly ``roots``, with the
    remaining certificates offered as intermediates:

    * ``server_name is None``: the leaf is checked as a TLS *client* certificate (extended key
      usage ``clientAuth``, no name check). This is the check a server makes on its client.
    * ``server_name`` given: the leaf is checked as a TLS *server* certificate (``serverAuth``)
      for that name: an IP literal (``"127.0.0.1"``, ``"::1"``, ``"[::1]"``) must match an IP
      SAN, anything else a DNS SAN.

    ``now`` is the wall-clock time to check validity periods against (naive values are taken
    as UTC); nothing here reads a clock. Returns ``Pid.from_certificate(chain_der[0])``.
    Raises :class:`PeerVerificationError` with a reason for an empty, oversized or malformed
    chain, an untrusted issuer, an expired or not yet valid certificate, a wrong key usage or
    a name mismatch; ``TypeError`` for arguments of the wrong type.
    """
    when = _utc(now)
    if isinstance(chain_der, (bytes, bytearray, memoryview, str)) or not isinstance(
        chain_der, Sequence
    ):
        raise TypeError("chain_der must be a sequence of DER certificates (bytes)")
    if not chain_der:
        raise PeerVerificationError("the peer presented no certificate")
    if len(chain_der) > MAX_CHAIN_LENGTH:
        raise PeerVerificationError(
            f"the peer presented {len(chain_der)} certificates, more than {MAX_CHAIN_LENGTH}"
        )
    certificates: list[x509.Certificate] = []
    for index, der in enumerate(chain_der):
        if not isinstance(der, (bytes, bytearray, memoryview)):
            raise TypeError(f"chain_der[{index}] must be bytes, not {type(der).__name__}")
        if len(der) > MAX_CERTIFICATE_DER_LENGTH:
            raise PeerVerificationError(
                f"certificate {index} is {len(der)} bytes, more than {MAX_CERTIFICATE_DER_LENGTH}"
            )
        try:
            certificates.append(x509.load_der_x509_certificate(bytes(der)))
        except ValueError as exc:
            raise PeerVerificationError(f"certificate {index} is not valid DER: {exc}") from exc
    try:
        trusted = _as_certificates(roots, "roots", MAX_ROOT_CERTIFICATES)
    except IdentityError as exc:
        raise PeerVerificationError(f"no usable trust roots: {exc}") from exc
    builder = (
        verification.PolicyBuilder()
        .store(verification.Store(list(trusted)))
        .time(when)
        .max_chain_depth(MAX_CHAIN_LENGTH)
    )
    leaf, intermediates = certificates[0], certificates[1:]
    try:
        if server_name is None:
            builder.build_client_verifier().verify(leaf, intermediates)
        else:
            subject = _subject_for(server_name)
            try:
                verifier = builder.build_server_verifier(subject)
            except ValueError as exc:
                raise PeerVerificationError(
                    f"server name {server_name!r} is neither an IP address nor a valid DNS name"
                ) from exc
            verifier.verify(leaf, intermediates)
    except verification.VerificationError as exc:
        raise PeerVerificationError(_explain(str(exc), leaf, when, server_name)) from exc
    return Pid.from_certificate(chain_der[0])


def describe_certificate(der: bytes) -> str:
    """``subject <RFC 4514 subject>, issuer <issuer>, PID <hex>`` of a DER certificate, for
    error messages that must name the certificate that did not match (``PID <hex>`` alone
    when it does not parse). Never raises for bad input."""
    try:
        pid = Pid.from_certificate(bytes(der)).hex()
    except Exception:  # a malformed certificate still gets a message, never an exception
        return "an unreadable certificate"
    try:
        certificate = x509.load_der_x509_certificate(bytes(der))
        subject = certificate.subject.rfc4514_string() or "(empty)"
        issuer = certificate.issuer.rfc4514_string() or "(empty)"
    except Exception:
        return f"PID {pid}"
    return f"subject {subject}, issuer {issuer}, PID {pid}"


def _explain(
    message: str, leaf: x509.Certificate, when: datetime.datetime, server_name: str | None
) -> str:
    """Prefix the verifier's message with the most likely cause a person can act on."""
    if when > leaf.not_valid_after_utc:
        return f"leaf certificate expired at {leaf.not_valid_after_utc.isoformat()} ({message})"
    if when < leaf.not_valid_before_utc:
        return (
            f"leaf certificate is not valid before {leaf.not_valid_before_utc.isoformat()} "
            f"({message})"
        )
    if "subjectAltName" in message and server_name is not None:
        return f"leaf certificate is not valid for server name {server_name!r} ({message})"
    if "candidates exhausted" in message:
        return f"the chain does not lead to a trusted root ({message})"
    return message
