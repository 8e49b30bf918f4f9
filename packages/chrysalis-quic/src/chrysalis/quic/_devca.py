"""A development certificate authority: one cluster CA per user, one fresh leaf per process.

Why: a PID is the hash of a leaf certificate, so "every process gets a fresh PID" means "every
process gets a fresh leaf". For development and tests the leaves are signed by a small CA
that all of one user's processes share, so they trust each other without any setup. The CA
is created once, on first use, in a directory (``ca.pem`` and ``ca.key``); every later
process loads it and mints its own leaf with a fresh ECDSA P-256 key.

Creation must survive races: several processes started at once all find the directory empty.
They serialise on an advisory lock (``flock`` on ``ca.lock``, released by the kernel if the
holder dies, so a crash never leaves a stale lock) taken with a bounded wait. Inside the lock
each file is written to a fresh temporary file (``O_CREAT | O_EXCL``, mode 0600) and renamed
into place, key first and certificate last, so ``ca.pem`` existing means the pair is
complete; a reader that finds both files loads them without locking. The key file is opened
with ``O_NOFOLLOW`` and must be a regular file owned by this user with no group or other
permissions and one link; the directory must not be a symbolic link, must be owned by this
user and must not be writable by others. Anything else is an :class:`IdentityError`.

This is development tooling, not a production PKI: the CA key sits unencrypted on disk.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import ipaddress
import os
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from chrysalis.quic._identity import MAX_PEM_LENGTH, Identity, IdentityError

__all__ = [
    "CA_CERTIFICATE_FILE",
    "CA_KEY_FILE",
    "CA_LOCK_FILE",
    "DEFAULT_CA_VALIDITY",
    "DEFAULT_LEAF_VALIDITY",
    "MAX_SUBJECT_ALT_NAMES",
    "DevelopmentCA",
]

#: Name of the CA certificate inside a development CA directory.
CA_CERTIFICATE_FILE: Final = "ca.pem"
#: Name of the CA private key inside a development CA directory (mode 0600).
CA_KEY_FILE: Final = "ca.key"
#: Name of the advisory lock file serialising CA creation.
CA_LOCK_FILE: Final = "ca.lock"
#: How long a new development CA is valid.
DEFAULT_CA_VALIDITY: Final = datetime.timedelta(days=3650)
#: How long an issued leaf is valid by default.
DEFAULT_LEAF_VALIDITY: Final = datetime.timedelta(days=30)
#: How far in the past validity periods start, to tolerate clock skew between hosts.
CLOCK_SKEW_ALLOWANCE: Final = datetime.timedelta(minutes=5)
#: Most DNS names plus IP addresses in one leaf's SAN.
MAX_SUBJECT_ALT_NAMES: Final = 64
#: Longest common name, in characters (the X.509 upper bound).
MAX_COMMON_NAME_LENGTH: Final = 64
#: Longest wait for another process that is creating the CA, in seconds.
LOCK_TIMEOUT_S: Final = 30.0

_LOCK_POLL_S: Final = 0.01
_SIGNATURE_HASH: Final = hashes.SHA256()


def _now(now: datetime.datetime | None) -> datetime.datetime:
    if now is None:
        return datetime.datetime.now(datetime.UTC)
    if now.tzinfo is None:
        return now.replace(tzinfo=datetime.UTC)
    return now.astimezone(datetime.UTC)


def _check_common_name(common_name: str) -> str:
    if not isinstance(common_name, str):
        raise TypeError(f"common_name must be a str, not {type(common_name).__name__}")
    if not 1 <= len(common_name) <= MAX_COMMON_NAME_LENGTH:
        raise IdentityError(f"common_name must have 1 to {MAX_COMMON_NAME_LENGTH} characters")
    return common_name


def _subject_alt_names(
    dns_names: Sequence[str], ip_addresses: Sequence[str]
) -> list[x509.GeneralName]:
    if isinstance(dns_names, str) or isinstance(ip_addresses, str):
        raise TypeError("dns_names and ip_addresses must be sequences of str, not a str")
    if len(dns_names) + len(ip_addresses) > MAX_SUBJECT_ALT_NAMES:
        raise IdentityError(f"more than {MAX_SUBJECT_ALT_NAMES} subject alternative names")
    names: list[x509.GeneralName] = []
    for name in dns_names:
        if not isinstance(name, str) or not name or len(name) > 253 or not name.isascii():
            raise IdentityError(f"DNS name {name!r} must be 1 to 253 ASCII characters")
        names.append(x509.DNSName(name))
    for text in ip_addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError as exc:
            raise IdentityError(f"{text!r} is not an IP address") from exc
    if not names:
        raise IdentityError("a leaf needs at least one DNS name or IP address")
    return names


@dataclass(frozen=True, slots=True)
class DevelopmentCA:
    """A development CA: its self-signed ``certificate`` and ECDSA P-256 ``private_key``.

    Build one with :meth:`create` (in memory) or :meth:`load_or_create` (shared on disk), then
    call :meth:`issue` once per process. Immutable; the key is left out of ``repr``.
    """

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.certificate, x509.Certificate):
            raise IdentityError("certificate must be an x509.Certificate")
        if not isinstance(self.private_key, ec.EllipticCurvePrivateKey):
            raise IdentityError("a development CA key must be an elliptic-curve private key")
        spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if self.private_key.public_key().public_bytes(
            *spki
        ) != self.certificate.public_key().public_bytes(*spki):
            raise IdentityError("the CA private key does not match the CA certificate")

    @classmethod
    def create(
        cls,
        common_name: str = "chrysalis dev CA",
        *,
        validity: datetime.timedelta = DEFAULT_CA_VALIDITY,
        now: datetime.datetime | None = None,
    ) -> DevelopmentCA:
        """Generate a new CA in memory: a P-256 key and a self-signed certificate valid from
        ``now`` (default: the current time) minus a few minutes for ``validity``.

        The subject carries ``common_name`` and a random serial-like suffix in the
        organizational unit, so two CAs never share a subject (a verifier would otherwise try
        the wrong one's key).
        """
        _check_common_name(common_name)
        start = _now(now) - CLOCK_SKEW_ALLOWANCE
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, secrets.token_hex(8)),
            ]
        )
        public = key.public_key()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False
            )
            .sign(key, _SIGNATURE_HASH)
        )
        return cls(certificate=certificate, private_key=key)

    @classmethod
    def load_or_create(
        cls, directory: Path, *, common_name: str = "chrysalis dev CA"
    ) -> DevelopmentCA:
        """Load the CA stored in ``directory``, creating it (and the directory, mode 0700)
        the first time.

        Safe against concurrent callers in other processes: exactly one CA ends up on disk
        and every caller returns it. Raises :class:`IdentityError` when the directory or the
        key file is insecure (a symbolic link, owned by someone else, accessible to others)
        or the stored files are malformed or do not match, and when another process holds
        the creation lock for longer than 30 seconds; ``OSError`` when the file system
        refuses.
        """
        directory = Path(directory)
        _secure_directory(directory)
        certificate_path = directory / CA_CERTIFICATE_FILE
        if certificate_path.exists():
            return cls._load(directory)
        with _exclusive_lock(directory / CA_LOCK_FILE):
            if certificate_path.exists():
                return cls._load(directory)
            ca = cls.create(common_name)
            key_pem = ca.private_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            _write_atomically(directory / CA_KEY_FILE, key_pem)
            _write_atomically(
                certificate_path, ca.certificate.public_bytes(serialization.Encoding.PEM)
            )
            return ca

    @classmethod
    def _load(cls, directory: Path) -> DevelopmentCA:
        certificate_pem = _read_bounded(directory / CA_CERTIFICATE_FILE, private=False)
        key_pem = _read_bounded(directory / CA_KEY_FILE, private=True)
        try:
            certificate = x509.load_pem_x509_certificate(certificate_pem)
        except ValueError as exc:
            raise IdentityError(
                f"{directory / CA_CERTIFICATE_FILE} is not a PEM certificate: {exc}"
            ) from exc
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (TypeError, ValueError) as exc:
            raise IdentityError(
                f"{directory / CA_KEY_FILE} is not an unencrypted PEM private key: {exc}"
            ) from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise IdentityError(f"{directory / CA_KEY_FILE} is not an elliptic-curve key")
        return cls(certificate=certificate, private_key=key)

    def issue(
        self,
        common_name: str | None = None,
        *,
        dns_names: Sequence[str] = ("localhost",),
        ip_addresses: Sequence[str] = ("127.0.0.1", "::1"),
        validity: datetime.timedelta = DEFAULT_LEAF_VALIDITY,
        now: datetime.datetime | None = None,
    ) -> Identity:
        """Mint a fresh leaf: a new P-256 key and a certificate signed by this CA.

        Every call makes a new key and serial number, so every call yields a distinct leaf
        and therefore a distinct PID. The leaf works for both ends of mutual TLS: basic
        constraints CA false, key usage digitalSignature, extended key usage serverAuth and
        clientAuth, a SAN with ``dns_names`` and ``ip_addresses`` (at most
        :data:`MAX_SUBJECT_ALT_NAMES` together, at least one), subject and authority key
        identifiers. It is valid from ``now`` (default: the current time) minus five minutes
        (clock skew) for ``validity``, cut at the CA's own expiry. The returned identity
        trusts this CA as its only root. ``common_name`` defaults to
        ``"chrysalis process <os pid>"``.
        """
        cn = _check_common_name(
            f"chrysalis process {os.getpid()}" if common_name is None else common_name
        )
        if validity <= datetime.timedelta(0):
            raise IdentityError("validity must be positive")
        names = _subject_alt_names(dns_names, ip_addresses)
        start = _now(now) - CLOCK_SKEW_ALLOWANCE
        end = min(start + CLOCK_SKEW_ALLOWANCE + validity, self.certificate.not_valid_after_utc)
        if end <= start:
            raise IdentityError("the development CA has expired; delete it to create a new one")
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.certificate.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.private_key.public_key()),
                critical=False,
            )
            .sign(self.private_key, _SIGNATURE_HASH)
        )
        return Identity(chain=(certificate,), private_key=key, roots=(self.certificate,))


# -- file handling -------------------------------------------------------------------------


def _secure_directory(directory: Path) -> None:
    """Create ``directory`` (mode 0700) if missing, then check it is safe to keep keys in."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700, parents=True)
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise IdentityError(f"{directory} is a symbolic link; refusing to keep keys there")
    if not stat.S_ISDIR(info.st_mode):
        raise IdentityError(f"{directory} is not a directory")
    if info.st_uid != os.geteuid():
        raise IdentityError(f"{directory} is owned by uid {info.st_uid}, not by this user")
    if info.st_mode & 0o022:
        raise IdentityError(
            f"{directory} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
        )


@contextlib.contextmanager
def _exclusive_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise IdentityError(
                        f"timed out after {timeout_s:g} s waiting for the lock {path}"
                    ) from exc
                time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` through a fresh temporary file and an atomic rename."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode
    )
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _read_bounded(path: Path, *, private: bool) -> bytes:
    """Read at most ``MAX_PEM_LENGTH`` bytes of a regular file, refusing symbolic links; for
    a ``private`` file also insist on this user's ownership, mode 0600 or stricter and a
    single link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IdentityError(f"{path} is a symbolic link; refusing to read it") from exc
        raise
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise IdentityError(f"{path} is not a regular file")
        if private:
            if info.st_uid != os.geteuid():
                raise IdentityError(f"{path} is owned by uid {info.st_uid}, not by this user")
            if info.st_mode & 0o077:
                raise IdentityError(
                    f"{path} is accessible to group or others "
                    f"(mode {stat.S_IMODE(info.st_mode):o}); it must be 0600"
                )
            if info.st_nlink != 1:
                raise IdentityError(f"{path} has {info.st_nlink} hard links; it must have one")
        data = stream.read(MAX_PEM_LENGTH + 1)
    if len(data) > MAX_PEM_LENGTH:
        raise IdentityError(f"{path} is larger than {MAX_PEM_LENGTH} bytes")
    return data
