"""Stateless Retry tokens (spec 5.4): prove a client's return address before any state exists.

Why: a server that allocated a connection for every Initial could be exhausted by spoofed
sources. Instead, the first Initial of an unknown client is answered with a Retry carrying a
token; only an Initial that echoes a valid token gets state. The token proves *reachability*
of the source address (and carries the client's original destination CID, which the server
needs for transport-parameter validation); it proves nothing about identity, which the TLS
handshake establishes.

Wire format (all integers big-endian), exactly as the reference::

    body  = version (1 byte, 0x01)
          | issued_at (u64, POSIX seconds)
          | family (1 byte: 4 or 6) | IP (4 or 16 bytes)
          | port (u16)
          | odcid_len (1 byte) | original DCID (odcid_len bytes, at most 20)
    token = body | HMAC-SHA256(secret, body)        (32-byte tag)

Validation: the tag must verify under the current secret or the one previous generation;
version 1; ``0 <= now - issued_at <= token_lifetime``; family, IP and port equal the packet's
source; the length byte matches the remaining bytes exactly. Secrets are 32 random bytes; one
mints for ``secret_lifetime`` seconds and then becomes the previous generation.

Carrier addresses: a UDP source binds its real IP and port. Any other carrier address
(in-process, Unix datagram, switch) binds family 6 with a 16-byte digest of the address as
"IP" and port 0: a stateless, collision-resistant stand-in for the reference's synthetic IPv6
address (which needed a per-peer table that spoofed sources could grow without bound).

This module is pure: time is passed in (POSIX seconds), randomness comes from an injectable
function, nothing here touches the network.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Final, final

from chrysalis.core import UDP_SCHEME, DatagramAddr

__all__ = [
    "MAX_ODCID_LEN",
    "RETRY_SECRET_LEN",
    "RETRY_TAG_LEN",
    "RETRY_TOKEN_VERSION",
    "InvalidRetryToken",
    "RetryTokenFault",
    "RetryTokens",
    "token_address",
]

RETRY_TOKEN_VERSION: Final = 1
"""The token format version byte."""
RETRY_TAG_LEN: Final = 32
"""HMAC-SHA256 tag length."""
RETRY_SECRET_LEN: Final = 32
"""Secret length in bytes."""
MAX_ODCID_LEN: Final = 20
"""Longest original destination CID a token carries (the QUIC v1 maximum)."""

_U64: Final = 1 << 64
_MIN_BODY: Final = 1 + 8 + 1 + 4 + 2 + 1
_MAX_TOKEN: Final = 1 + 8 + 1 + 16 + 2 + 1 + MAX_ODCID_LEN + RETRY_TAG_LEN
_ADDRESS_DIGEST_LABEL: Final = b"chrysalis retry address\x00"


class RetryTokenFault(enum.Enum):
    """Why a Retry token was rejected."""

    MALFORMED = "malformed"
    """Too short, too long, an unknown family or a length byte that does not match."""
    BAD_TAG = "bad_tag"
    """The HMAC verifies under neither the current nor the previous secret (tampered or
    minted by someone else)."""
    VERSION = "version"
    """The version byte is not 1."""
    EXPIRED = "expired"
    """Issued more than ``token_lifetime`` seconds ago."""
    FUTURE = "future"
    """Issued after ``now``."""
    ADDRESS = "address"
    """Bound to another source address."""


class InvalidRetryToken(ValueError):
    """A Retry token failed validation; ``fault`` (a ``RetryTokenFault``) says why."""

    def __init__(self, fault: RetryTokenFault, detail: str = "") -> None:
        self.fault = fault
        message = f"invalid retry token: {fault.value}"
        super().__init__(f"{message} ({detail})" if detail else message)


def token_address(address: DatagramAddr) -> tuple[int, bytes, int]:
    """The ``(family, ip_bytes, port)`` a token binds for ``address``.

    UDP: the real family (4 or 6), packed IP and port (IPv6 flow info and scope are not
    bound). Other carriers: family 6, the first 16 bytes of SHA-256 over a label, the scheme
    and the opaque bytes, and port 0.
    """
    if address.scheme == UDP_SCHEME:
        ip = address.ip
        return ip.version, ip.packed, address.port
    digest = hashlib.sha256(
        _ADDRESS_DIGEST_LABEL + address.scheme.encode() + b"\x00" + address.opaque
    ).digest()
    return 6, digest[:16], 0


def _check_time(now: float) -> float:
    if isinstance(now, bool) or not isinstance(now, int | float):
        raise TypeError(f"now must be a number, not {type(now).__name__}")
    if not 0.0 <= now < float(_U64):
        raise ValueError(f"now must be non-negative POSIX seconds, got {now}")
    return float(now)


@final
class RetryTokens:
    """Mints and validates Retry tokens and rotates their secrets.

    Args:
        now: POSIX seconds at creation (the first secret starts minting then).
        token_lifetime: seconds a token stays valid (default 120).
        secret_lifetime: seconds a secret mints before it becomes the previous generation
            (default 3,600).
        random_bytes: the source of secrets (default ``secrets.token_bytes``).
        secret: an explicit first secret of 32 bytes (tests); random when omitted.
    """

    __slots__ = (
        "_current",
        "_minted_since",
        "_previous",
        "_random_bytes",
        "_secret_lifetime",
        "_token_lifetime",
    )

    def __init__(
        self,
        *,
        now: float,
        token_lifetime: float = 120.0,
        secret_lifetime: float = 3600.0,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
        secret: bytes | None = None,
    ) -> None:
        start = _check_time(now)
        if not token_lifetime > 0 or not secret_lifetime > 0:
            raise ValueError("token_lifetime and secret_lifetime must be positive")
        self._token_lifetime = float(token_lifetime)
        self._secret_lifetime = float(secret_lifetime)
        self._random_bytes = random_bytes
        self._current = self._new_secret() if secret is None else self._check_secret(secret)
        self._previous: bytes | None = None
        self._minted_since = start

    @staticmethod
    def _check_secret(secret: bytes) -> bytes:
        if not isinstance(secret, bytes) or len(secret) != RETRY_SECRET_LEN:
            raise ValueError(f"a retry secret must be {RETRY_SECRET_LEN} bytes")
        return secret

    def _new_secret(self) -> bytes:
        return self._check_secret(bytes(self._random_bytes(RETRY_SECRET_LEN)))

    @property
    def token_lifetime(self) -> float:
        """Seconds a token stays valid."""
        return self._token_lifetime

    @property
    def has_previous(self) -> bool:
        """True once a rotation happened (a previous generation still verifies)."""
        return self._previous is not None

    def rotate_if_due(self, now: float) -> bool:
        """Rotate when the current secret has minted for ``secret_lifetime``; True if rotated.

        The current secret becomes the (only) previous one; the older previous is forgotten.
        """
        when = _check_time(now)
        if when - self._minted_since < self._secret_lifetime:
            return False
        self._previous = self._current
        self._current = self._new_secret()
        self._minted_since = when
        return True

    def mint(self, address: DatagramAddr, original_dcid: bytes, now: float) -> bytes:
        """Return a token binding ``address`` and ``original_dcid`` issued at ``now``.

        ``ValueError`` when ``original_dcid`` is longer than 20 bytes.
        """
        when = _check_time(now)
        if len(original_dcid) > MAX_ODCID_LEN:
            raise ValueError(f"original DCID longer than {MAX_ODCID_LEN} bytes")
        self.rotate_if_due(when)
        family, ip, port = token_address(address)
        body = b"".join(
            (
                bytes((RETRY_TOKEN_VERSION,)),
                int(when).to_bytes(8, "big"),
                bytes((family,)),
                ip,
                port.to_bytes(2, "big"),
                bytes((len(original_dcid),)),
                bytes(original_dcid),
            )
        )
        return body + hmac.digest(self._current, body, "sha256")

    def validate(self, token: bytes, address: DatagramAddr, now: float) -> bytes:
        """Check ``token`` for a packet from ``address`` at ``now``; return the original DCID.

        Raises ``InvalidRetryToken`` (with a ``RetryTokenFault``) for any failure; never
        anything else for bytes input, whatever its content or length.
        """
        when = _check_time(now)
        self.rotate_if_due(when)
        n = len(token)
        if not _MIN_BODY + RETRY_TAG_LEN <= n <= _MAX_TOKEN:
            raise InvalidRetryToken(RetryTokenFault.MALFORMED, f"{n} bytes")
        body = bytes(token[: n - RETRY_TAG_LEN])
        tag = bytes(token[n - RETRY_TAG_LEN :])
        if not hmac.compare_digest(hmac.digest(self._current, body, "sha256"), tag) and (
            self._previous is None
            or not hmac.compare_digest(hmac.digest(self._previous, body, "sha256"), tag)
        ):
            raise InvalidRetryToken(RetryTokenFault.BAD_TAG)
        if body[0] != RETRY_TOKEN_VERSION:
            raise InvalidRetryToken(RetryTokenFault.VERSION, f"version {body[0]}")
        issued = int.from_bytes(body[1:9], "big")
        family = body[9]
        if family == 4:
            ip_len = 4
        elif family == 6:
            ip_len = 16
        else:
            raise InvalidRetryToken(RetryTokenFault.MALFORMED, f"family {family}")
        offset = 10 + ip_len
        if len(body) < offset + 3:
            raise InvalidRetryToken(RetryTokenFault.MALFORMED, "truncated address")
        ip = body[10:offset]
        port = int.from_bytes(body[offset : offset + 2], "big")
        odcid_len = body[offset + 2]
        odcid = body[offset + 3 :]
        if odcid_len != len(odcid) or odcid_len > MAX_ODCID_LEN:
            raise InvalidRetryToken(RetryTokenFault.MALFORMED, "original DCID length")
        if issued > when:
            raise InvalidRetryToken(RetryTokenFault.FUTURE)
        if when - issued > self._token_lifetime:
            raise InvalidRetryToken(RetryTokenFault.EXPIRED)
        if (family, ip, port) != token_address(address):
            raise InvalidRetryToken(RetryTokenFault.ADDRESS)
        return odcid
