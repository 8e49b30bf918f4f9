"""The session-bound client proof: a client authenticates in-band when TLS cannot carry its
certificate.

Why this module exists: Chrysalis authenticates *both* ends of every connection by certificate
(the PID is the hash of the leaf). With aioquic the server asks for the client's certificate in
the TLS handshake (mutual TLS). A qh3 server cannot: its TLS stack never sends a
CertificateRequest. Authentication must not depend on an engine feature only one engine has,
so the client proves its identity *inside* the connection instead, in a way that is exactly as
strong as a TLS client certificate:

* **What is proven.** The client signs, with its leaf key, a value that only this TLS session
  has: the RFC 8446 (section 7.5) TLS exporter ``TLS-Exporter("EXPORTER-chrysalis-client-proof",
  "", 32)``. The exporter is derived from the exporter master secret, which depends on the
  whole handshake transcript (both randoms, both key shares, the transport parameters with
  both initial connection IDs, the server certificate). A signature over it therefore cannot
  be replayed into another session, reflected, or produced by anyone without the leaf key,
  and it already binds the connection IDs (no need to sign them again). The signed message is
  ``64 spaces || "chrysalis client proof v1" || 0x00 || exporter`` (the TLS 1.3
  CertificateVerify layout with its own context string, so no TLS signature can be mistaken
  for a proof or the reverse).
* **Where it travels.** On the client's first unidirectional stream (``PROOF_STREAM_ID`` = 2),
  sent with the client's Finished, so it costs no extra round trip. A server that wants a
  proof advertises ``initial_max_streams_uni`` = 1 (Chrysalis otherwise allows no
  unidirectional stream at all); a server that authenticates by mutual TLS advertises 0 and
  the client sends nothing. The signal rides in a transport parameter every QUIC stack
  exposes, so an aioquic client answers a qh3 server as well as a qh3 client does.
* **What the server does.** It collects the stream (at most ``MAX_PROOF_LENGTH`` bytes, within
  ``proof_timeout`` seconds of its handshake completing), decodes it, checks the signature with
  the public key of the leaf the proof carries, and only then presents that chain to the
  endpoint as "the chain the peer presented". The endpoint verifies the chain against its
  roots and derives the PID exactly as for a TLS client certificate; no application stream is
  delivered before that verdict. Any failure (malformed, oversized, wrong key, unknown
  signature scheme, stream reset, timeout) is a ``ProofFailure`` and ends as an authentication
  failure (application close code 1).

The exporter is computed here from the exporter master secret, which ``ExporterTap`` captures
from the TLS context of either library at the one moment it is defined (the first 1-RTT
traffic secret, when the transcript ends with the server's Finished): neither aioquic nor qh3
offers ``export_keying_material``.

Everything here is pure: bytes, keys and ``now`` in, values out; no I/O, no clock.

Wire format of the proof (big-endian)::

    magic      4 bytes  b"CCP1"
    scheme     u16      TLS SignatureScheme of the signature (0x0403 ecdsa_secp256r1_sha256, ...)
    count      u8       certificates in the chain, 1..MAX_CHAIN_LENGTH (leaf first)
    count x    u24 length (1..MAX_CERTIFICATE_DER_LENGTH) || DER certificate
    siglen     u16      1..MAX_SIGNATURE_LENGTH
    signature  siglen bytes
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa

from chrysalis.quic._identity import MAX_CERTIFICATE_DER_LENGTH, MAX_CHAIN_LENGTH, TlsPrivateKey

__all__ = [
    "DEFAULT_PROOF_TIMEOUT",
    "EXPORTER_LABEL",
    "EXPORTER_LENGTH",
    "MAX_PROOF_LENGTH",
    "MAX_SIGNATURE_LENGTH",
    "PROOF_STREAM_ID",
    "ClientProof",
    "ClientProofError",
    "ExporterTap",
    "ProofBuilder",
    "ProofFailure",
    "ProofVerifier",
    "SignatureScheme",
    "hkdf_expand_label",
    "proof_message",
    "sign_client_proof",
    "tls_exporter",
    "verify_client_proof",
]

PROOF_STREAM_ID: Final = 2
"""The client's first unidirectional stream: the only one a proof-requesting server allows."""
MAX_PROOF_LENGTH: Final = 64 * 1024
"""Largest encoded proof a server accepts (a development chain is about 1 KiB)."""
MAX_SIGNATURE_LENGTH: Final = 1024
"""Largest signature in a proof (RSA-8192 is 1,024 bytes)."""
DEFAULT_PROOF_TIMEOUT: Final = 5.0
"""Seconds a server waits, after its TLS handshake completed, for the complete proof."""
EXPORTER_LABEL: Final = b"EXPORTER-chrysalis-client-proof"
"""The RFC 8446 exporter label of the proof."""
EXPORTER_LENGTH: Final = 32
"""Bytes of exporter output signed."""

_MAGIC: Final = b"CCP1"
_CONTEXT: Final = b" " * 64 + b"chrysalis client proof v1" + b"\x00"
_ONE_RTT_EPOCH: Final = 3  # the value of tls.Epoch.ONE_RTT in both aioquic and qh3
_HASHES: Final = {32: "sha256", 48: "sha384", 64: "sha512"}


class ProofFailure(enum.Enum):
    """Why a client proof was rejected (the reason a server logs and tests assert)."""

    MALFORMED = "malformed"
    """The bytes are not a well-formed proof (bad magic, truncated, trailing bytes, bad DER)."""
    OVERSIZED = "oversized"
    """The proof, a certificate, the chain or the signature exceeds its bound."""
    UNSUPPORTED_SCHEME = "unsupported scheme"
    """The signature scheme is unknown, or does not match the leaf's key type."""
    BAD_SIGNATURE = "bad signature"
    """The signature does not verify with the leaf's key over this session's exporter: a
    wrong key, or a proof made for (replayed from) another session."""
    TIMEOUT = "timeout"
    """No complete proof arrived within the proof timeout."""
    ABORTED = "aborted"
    """The client reset the proof stream."""
    NO_EXPORTER = "no exporter"
    """The TLS session's exporter secret was never captured (an engine fault)."""


class ClientProofError(ValueError):
    """A client proof could not be built, decoded or verified; ``failure`` says why."""

    def __init__(self, failure: ProofFailure, detail: str) -> None:
        self.failure = failure
        self.detail = detail
        super().__init__(f"client proof rejected ({failure.value}): {detail}")


class SignatureScheme(enum.IntEnum):
    """The TLS 1.3 SignatureScheme code points a proof may use (RFC 8446 section 4.2.3)."""

    ECDSA_SECP256R1_SHA256 = 0x0403
    ECDSA_SECP384R1_SHA384 = 0x0503
    ECDSA_SECP521R1_SHA512 = 0x0603
    RSA_PSS_RSAE_SHA256 = 0x0804
    ED25519 = 0x0807
    ED448 = 0x0808


_CURVE_SCHEMES: Final[dict[str, SignatureScheme]] = {
    "secp256r1": SignatureScheme.ECDSA_SECP256R1_SHA256,
    "secp384r1": SignatureScheme.ECDSA_SECP384R1_SHA384,
    "secp521r1": SignatureScheme.ECDSA_SECP521R1_SHA512,
}
_ECDSA_HASHES: Final[dict[SignatureScheme, type[hashes.HashAlgorithm]]] = {
    SignatureScheme.ECDSA_SECP256R1_SHA256: hashes.SHA256,
    SignatureScheme.ECDSA_SECP384R1_SHA384: hashes.SHA384,
    SignatureScheme.ECDSA_SECP521R1_SHA512: hashes.SHA512,
}


# --- the TLS exporter ----------------------------------------------------------------------------


def hkdf_expand_label(secret: bytes, label: bytes, context: bytes, length: int) -> bytes:
    """RFC 8446 section 7.1 ``HKDF-Expand-Label``; the hash follows ``len(secret)`` (32:
    SHA-256, 48: SHA-384, 64: SHA-512, the TLS 1.3 cipher-suite hashes).

    Raises ``ValueError`` for an unsupported secret length, a label or context longer than
    255 bytes, or ``length`` outside 1..255 * hash length.
    """
    name = _HASHES.get(len(secret))
    if name is None:
        raise ValueError(f"secret must be 32, 48 or 64 bytes, not {len(secret)}")
    full_label = b"tls13 " + label
    if len(full_label) > 255 or len(context) > 255:
        raise ValueError("label and context must each be at most 255 bytes")
    digest = len(secret)
    if not 1 <= length <= 255 * digest:
        raise ValueError(f"length must be in 1..{255 * digest}, got {length}")
    info = (
        length.to_bytes(2, "big")
        + bytes([len(full_label)])
        + full_label
        + bytes([len(context)])
        + context
    )
    out = b""
    block = b""
    counter = 1
    while len(out) < length:
        block = hmac.digest(secret, block + info + bytes([counter]), name)
        out += block
        counter += 1
    return out[:length]


def tls_exporter(
    exporter_master_secret: bytes,
    label: bytes = EXPORTER_LABEL,
    context: bytes = b"",
    length: int = EXPORTER_LENGTH,
) -> bytes:
    """RFC 8446 section 7.5 ``TLS-Exporter(label, context, length)`` from the session's
    exporter master secret::

        HKDF-Expand-Label(Derive-Secret(exporter_master_secret, label, ""),
                          "exporter", Hash(context), length)
    """
    name = _HASHES.get(len(exporter_master_secret))
    if name is None:
        raise ValueError(
            f"exporter secret must be 32, 48 or 64 bytes, not {len(exporter_master_secret)}"
        )
    empty_hash = hashlib.new(name, b"").digest()
    derived = hkdf_expand_label(exporter_master_secret, label, empty_hash, len(empty_hash))
    return hkdf_expand_label(derived, b"exporter", hashlib.new(name, context).digest(), length)


class ExporterTap:
    """Captures a TLS 1.3 session's exporter master secret from an aioquic or qh3 TLS context.

    Both libraries implement TLS 1.3 in Python with the same key-schedule shape: the context
    has ``update_traffic_key_cb(direction, epoch, cipher_suite, secret)`` and a
    ``key_schedule`` with ``derive_secret(label)``. The first 1-RTT traffic secret is
    installed right after the master secret was extracted, while the transcript hash still
    ends with the server's Finished, on the client and on the server alike: exactly the state
    in which RFC 8446 defines ``exporter_master_secret = Derive-Secret(Master Secret, "exp
    master", ClientHello...server Finished)``. ``install`` wraps the callback to take the
    secret then (and passes every call through unchanged).

    Install it before the handshake reaches the server's Finished (right after the TLS
    context is created). ``exporter()`` is None until the secret was captured.
    """

    __slots__ = ("_secret",)

    def __init__(self) -> None:
        self._secret: bytes | None = None

    def install(self, tls: object) -> None:
        """Wrap ``tls.update_traffic_key_cb``; raises ``TypeError`` for an object that is not
        an aioquic or qh3 TLS context."""
        original = getattr(tls, "update_traffic_key_cb", None)
        if not callable(original) or not hasattr(tls, "key_schedule"):
            raise TypeError(f"{type(tls).__name__} is not a TLS 1.3 context this tap supports")

        def hook(direction: object, epoch: object, cipher_suite: object, secret: bytes) -> None:
            if self._secret is None and getattr(epoch, "value", epoch) == _ONE_RTT_EPOCH:
                schedule = getattr(tls, "key_schedule", None)
                derive = getattr(schedule, "derive_secret", None)
                if callable(derive):
                    value = derive(b"exp master")
                    if isinstance(value, bytes):
                        self._secret = value
            original(direction, epoch, cipher_suite, secret)

        tls.update_traffic_key_cb = hook  # type: ignore[attr-defined]

    @property
    def captured(self) -> bool:
        """True once the exporter master secret was taken."""
        return self._secret is not None

    def exporter(
        self, label: bytes = EXPORTER_LABEL, context: bytes = b"", length: int = EXPORTER_LENGTH
    ) -> bytes | None:
        """``TLS-Exporter(label, context, length)`` of the session, or None before capture."""
        if self._secret is None:
            return None
        return tls_exporter(self._secret, label, context, length)


# --- the proof -----------------------------------------------------------------------------------


def proof_message(exporter: bytes) -> bytes:
    """The bytes a proof signs: the padded context string followed by the exporter value."""
    return _CONTEXT + exporter


@dataclass(frozen=True, slots=True)
class ClientProof:
    """A decoded client proof: the chain (DER, leaf first), the scheme and the signature.

    Immutable; ``encode`` and ``decode`` are exact inverses for every valid proof.
    """

    chain: tuple[bytes, ...]
    scheme: int
    signature: bytes

    def encode(self) -> bytes:
        """The wire form. Raises ``ClientProofError`` (``OVERSIZED`` or ``MALFORMED``) when a
        bound is exceeded or the chain is empty, so an unsendable proof fails at the client."""
        if not 1 <= len(self.chain) <= MAX_CHAIN_LENGTH:
            raise ClientProofError(
                ProofFailure.OVERSIZED if self.chain else ProofFailure.MALFORMED,
                f"a chain of {len(self.chain)} certificates (1..{MAX_CHAIN_LENGTH})",
            )
        if not 1 <= len(self.signature) <= MAX_SIGNATURE_LENGTH:
            raise ClientProofError(
                ProofFailure.OVERSIZED, f"a {len(self.signature)}-byte signature"
            )
        if not 0 <= self.scheme <= 0xFFFF:
            raise ClientProofError(ProofFailure.UNSUPPORTED_SCHEME, f"scheme {self.scheme}")
        parts = [_MAGIC, self.scheme.to_bytes(2, "big"), bytes([len(self.chain)])]
        for der in self.chain:
            if not 1 <= len(der) <= MAX_CERTIFICATE_DER_LENGTH:
                raise ClientProofError(ProofFailure.OVERSIZED, f"a {len(der)}-byte certificate")
            parts += [len(der).to_bytes(3, "big"), der]
        parts += [len(self.signature).to_bytes(2, "big"), self.signature]
        data = b"".join(parts)
        if len(data) > MAX_PROOF_LENGTH:
            raise ClientProofError(
                ProofFailure.OVERSIZED, f"{len(data)} bytes, more than {MAX_PROOF_LENGTH}"
            )
        return data

    @classmethod
    def decode(cls, data: bytes) -> ClientProof:
        """Parse the wire form; raises ``ClientProofError`` (``MALFORMED`` or ``OVERSIZED``)
        for anything else. Never reads beyond ``data`` and never allocates more than it."""
        if len(data) > MAX_PROOF_LENGTH:
            raise ClientProofError(
                ProofFailure.OVERSIZED, f"{len(data)} bytes, more than {MAX_PROOF_LENGTH}"
            )
        view = memoryview(data)
        if bytes(view[:4]) != _MAGIC:
            raise ClientProofError(ProofFailure.MALFORMED, "bad magic")
        pos = 4

        def take(n: int, what: str) -> bytes:
            nonlocal pos
            if pos + n > len(view):
                raise ClientProofError(ProofFailure.MALFORMED, f"truncated {what}")
            chunk = bytes(view[pos : pos + n])
            pos += n
            return chunk

        scheme = int.from_bytes(take(2, "scheme"), "big")
        count = take(1, "chain length")[0]
        if count == 0:
            raise ClientProofError(ProofFailure.MALFORMED, "empty chain")
        if count > MAX_CHAIN_LENGTH:
            raise ClientProofError(
                ProofFailure.OVERSIZED, f"{count} certificates, more than {MAX_CHAIN_LENGTH}"
            )
        chain: list[bytes] = []
        for index in range(count):
            size = int.from_bytes(take(3, f"certificate {index} length"), "big")
            if size == 0:
                raise ClientProofError(ProofFailure.MALFORMED, f"certificate {index} is empty")
            if size > MAX_CERTIFICATE_DER_LENGTH:
                raise ClientProofError(
                    ProofFailure.OVERSIZED, f"certificate {index} is {size} bytes"
                )
            chain.append(take(size, f"certificate {index}"))
        size = int.from_bytes(take(2, "signature length"), "big")
        if size == 0:
            raise ClientProofError(ProofFailure.MALFORMED, "empty signature")
        if size > MAX_SIGNATURE_LENGTH:
            raise ClientProofError(ProofFailure.OVERSIZED, f"a {size}-byte signature")
        signature = take(size, "signature")
        if pos != len(view):
            raise ClientProofError(ProofFailure.MALFORMED, f"{len(view) - pos} trailing bytes")
        return cls(chain=tuple(chain), scheme=scheme, signature=signature)


def _scheme_for(key: object) -> SignatureScheme:
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        scheme = _CURVE_SCHEMES.get(key.curve.name)
        if scheme is None:
            raise ClientProofError(
                ProofFailure.UNSUPPORTED_SCHEME, f"curve {key.curve.name} has no TLS scheme"
            )
        return scheme
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return SignatureScheme.RSA_PSS_RSAE_SHA256
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return SignatureScheme.ED25519
    if isinstance(key, ed448.Ed448PrivateKey | ed448.Ed448PublicKey):
        return SignatureScheme.ED448
    raise ClientProofError(
        ProofFailure.UNSUPPORTED_SCHEME, f"key type {type(key).__name__} cannot sign a proof"
    )


def _pss() -> padding.PSS:
    return padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)


def sign_client_proof(
    private_key: TlsPrivateKey, chain_der: Sequence[bytes], exporter: bytes
) -> ClientProof:
    """Sign ``exporter`` (this session's ``tls_exporter`` value) with the leaf's private key.

    ``chain_der`` is the client's chain, leaf first, in DER. The scheme follows the key
    (ECDSA with the curve's hash, RSA-PSS-SHA256, Ed25519, Ed448). Raises
    ``ClientProofError`` for an unsupported key or an unencodable chain.
    """
    message = proof_message(exporter)
    scheme = _scheme_for(private_key)
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        signature = private_key.sign(message, ec.ECDSA(_ECDSA_HASHES[scheme]()))
    elif isinstance(private_key, rsa.RSAPrivateKey):
        signature = private_key.sign(message, _pss(), hashes.SHA256())
    else:
        signature = private_key.sign(message)
    proof = ClientProof(
        chain=tuple(bytes(der) for der in chain_der), scheme=scheme, signature=signature
    )
    proof.encode()  # fail here, at the client, rather than at the server
    return proof


def verify_client_proof(proof: ClientProof, exporter: bytes) -> tuple[bytes, ...]:
    """Check ``proof`` against this session's ``exporter``; return its chain (leaf first).

    Verifies only possession of the leaf key: the signature, by the leaf's public key, over
    ``proof_message(exporter)`` with the scheme the leaf's key type requires. The chain's
    trust (roots, validity, key usage) and the PID are the caller's to check, exactly as for a
    chain presented in TLS. Raises ``ClientProofError``: ``MALFORMED`` (leaf is not DER),
    ``UNSUPPORTED_SCHEME`` (scheme unknown or not the leaf key's), ``BAD_SIGNATURE``.
    """
    try:
        leaf = x509.load_der_x509_certificate(proof.chain[0])
        public_key = leaf.public_key()
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ClientProofError(ProofFailure.MALFORMED, f"leaf certificate: {exc}") from exc
    expected = _scheme_for(public_key)
    if proof.scheme != expected:
        raise ClientProofError(
            ProofFailure.UNSUPPORTED_SCHEME,
            f"scheme 0x{proof.scheme:04x} does not match the leaf key (0x{expected:04x})",
        )
    message = proof_message(exporter)
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(proof.signature, message, ec.ECDSA(_ECDSA_HASHES[expected]()))
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(proof.signature, message, _pss(), hashes.SHA256())
        elif isinstance(public_key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            public_key.verify(proof.signature, message)
        else:  # pragma: no cover - _scheme_for rejected every other type
            raise ClientProofError(ProofFailure.UNSUPPORTED_SCHEME, "unsupported key")
    except InvalidSignature as exc:
        raise ClientProofError(
            ProofFailure.BAD_SIGNATURE,
            "the signature does not verify with the leaf key over this session's exporter",
        ) from exc
    return proof.chain


# --- the server side -----------------------------------------------------------------------------


class ProofVerifier:
    """The server's side of one connection's proof, as a small state machine.

    States: *waiting* (``outcome`` None) until the proof is judged, then *done*: ``outcome``
    is the verified chain (a tuple of DER certificates) or a ``ProofFailure``. The engine
    calls ``start(now)`` when its TLS handshake completed (arming ``deadline``), ``feed`` with
    the proof stream's bytes, ``abort`` when the client reset the stream, ``judge`` whenever
    the exporter may have become available, and ``expire(now)`` from its timer. Bytes beyond
    ``max_length`` fail at once (``OVERSIZED``) without being stored.
    """

    __slots__ = ("_buffer", "_deadline", "_fin", "_max_length", "_outcome", "_timeout")

    def __init__(
        self, *, timeout: float = DEFAULT_PROOF_TIMEOUT, max_length: int = MAX_PROOF_LENGTH
    ) -> None:
        if not timeout > 0.0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if not 1 <= max_length <= MAX_PROOF_LENGTH:
            raise ValueError(f"max_length must be in 1..{MAX_PROOF_LENGTH}, got {max_length}")
        self._timeout = float(timeout)
        self._max_length = max_length
        self._buffer = bytearray()
        self._fin = False
        self._deadline: float | None = None
        self._outcome: tuple[bytes, ...] | ProofFailure | None = None

    @property
    def outcome(self) -> tuple[bytes, ...] | ProofFailure | None:
        """None while waiting; then the verified chain or the failure."""
        return self._outcome

    @property
    def started(self) -> bool:
        """True once ``start`` was called (the TLS handshake completed)."""
        return self._deadline is not None

    @property
    def deadline(self) -> float | None:
        """When ``expire`` fails a missing proof (None before ``start`` and once judged)."""
        return None if self._outcome is not None else self._deadline

    def start(self, now: float) -> None:
        """The TLS handshake completed at ``now``: the proof must be complete by
        ``now + timeout`` (the first call arms the deadline, later calls do nothing)."""
        if self._deadline is None:
            self._deadline = now + self._timeout

    def feed(self, data: bytes, fin: bool) -> None:
        """Append in-order proof-stream bytes (``fin`` when they end the stream)."""
        if self._outcome is not None or self._fin:
            return
        if len(self._buffer) + len(data) > self._max_length:
            self._buffer = bytearray()
            self._outcome = ProofFailure.OVERSIZED
            return
        self._buffer += data
        self._fin = fin

    def abort(self) -> None:
        """The client reset the proof stream."""
        if self._outcome is None:
            self._buffer = bytearray()
            self._outcome = ProofFailure.ABORTED

    def judge(self, exporter: bytes | None) -> None:
        """Decide once the whole proof arrived: verify it against ``exporter`` (None: the
        session's exporter is unknown, a ``NO_EXPORTER`` failure)."""
        if self._outcome is not None or not self._fin:
            return
        data, self._buffer = bytes(self._buffer), bytearray()
        if exporter is None:
            self._outcome = ProofFailure.NO_EXPORTER
            return
        try:
            self._outcome = verify_client_proof(ClientProof.decode(data), exporter)
        except ClientProofError as exc:
            self._outcome = exc.failure

    def expire(self, now: float) -> bool:
        """Fail a proof still missing at its deadline; True when this call failed it."""
        if self._outcome is None and self._deadline is not None and now >= self._deadline:
            self._buffer = bytearray()
            self._outcome = ProofFailure.TIMEOUT
            return True
        return False


ProofBuilder = Callable[[bytes], bytes | None]
"""Builds the encoded proof for a session's exporter value (None: send no proof)."""
