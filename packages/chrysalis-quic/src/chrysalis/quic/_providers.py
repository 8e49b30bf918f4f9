"""Identity providers: where a process gets its certificate chain, key and trust roots.

Why two providers: a developer wants processes that just work together on one machine, each
with its own PID and no setup, which the development provider gives (a per-user CA created on
first use, a fresh leaf per ``issue()``). A deployment has its certificates issued by its own
PKI and mounted as files, which the file provider reads (PEM chain, key and roots from three
paths). Both implement ``chrysalis.core.IdentityProvider``: ``issue()`` returns an
``IdentityMaterial`` that has already been parsed and checked as an :class:`Identity`, so a
broken identity fails when the process starts, with a message naming the file at fault.

:func:`write_identity` is the inverse of the file provider: it stores an identity as the
three PEM files the file provider reads (the CLI uses it to export development identities).
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from chrysalis.core import IdentityMaterial
from chrysalis.quic._devca import DevelopmentCA, _write_atomically
from chrysalis.quic._identity import (
    MAX_CHAIN_LENGTH,
    MAX_PEM_LENGTH,
    MAX_ROOT_CERTIFICATES,
    Identity,
    IdentityError,
    _load_pem_certificates,
    _load_pem_key,
)

__all__ = [
    "CHAIN_FILE",
    "DEV_CA_DIR_ENV",
    "KEY_FILE",
    "ROOTS_FILE",
    "DevelopmentIdentityProvider",
    "FileIdentityProvider",
    "IdentityFiles",
    "default_dev_ca_directory",
    "write_identity",
]

#: Environment variable naming the development CA directory.
DEV_CA_DIR_ENV: Final = "CHRYSALIS_DEV_CA_DIR"
#: File names :func:`write_identity` uses and :meth:`FileIdentityProvider.from_directory` reads.
CHAIN_FILE: Final = "chain.pem"
KEY_FILE: Final = "key.pem"
ROOTS_FILE: Final = "roots.pem"


def default_dev_ca_directory() -> Path:
    """The development CA directory: ``$CHRYSALIS_DEV_CA_DIR`` when set and non-empty, else
    ``chrysalis-dev-ca-<uid>`` under the temporary directory (one CA per user)."""
    configured = os.environ.get(DEV_CA_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"chrysalis-dev-ca-{os.geteuid()}"


class DevelopmentIdentityProvider:
    """Issues a fresh leaf per :meth:`issue` from the development CA in ``directory``.

    ``directory`` defaults to :func:`default_dev_ca_directory`, resolved at construction. The
    CA is loaded (or created, race-safely) on the first :meth:`issue` and kept. Every call
    returns a new leaf and key, hence a new PID; all leaves of one CA trust each other.
    """

    __slots__ = ("_ca", "_directory")

    def __init__(self, directory: Path | str | None = None) -> None:
        self._directory = default_dev_ca_directory() if directory is None else Path(directory)
        self._ca: DevelopmentCA | None = None

    @property
    def directory(self) -> Path:
        """Where the development CA lives."""
        return self._directory

    def issue_identity(self) -> Identity:
        """Like :meth:`issue`, returning the parsed :class:`Identity`."""
        if self._ca is None:
            self._ca = DevelopmentCA.load_or_create(self._directory)
        return self._ca.issue()

    def issue(self) -> IdentityMaterial:
        """A fresh leaf, its key and the development CA as root, as PEM.

        Raises :class:`IdentityError` for an insecure or corrupt CA directory, ``OSError``
        when it cannot be created or read.
        """
        return self.issue_identity().to_material()

    def __repr__(self) -> str:
        return f"DevelopmentIdentityProvider(directory={str(self._directory)!r})"


@dataclass(frozen=True, slots=True)
class IdentityFiles:
    """The three PEM files of an identity: certificate ``chain``, private ``key``, ``roots``."""

    chain: Path
    key: Path
    roots: Path


def _read_pem_file(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_PEM_LENGTH + 1)
    except FileNotFoundError as exc:
        raise IdentityError(f"{what} {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise IdentityError(f"{what} {path} is a directory, not a file") from exc
    except PermissionError as exc:
        raise IdentityError(f"cannot read {what} {path}: permission denied") from exc
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.ENOTDIR:
            reason = "a parent is not a directory"
        raise IdentityError(f"cannot read {what} {path}: {reason}") from exc
    if len(data) > MAX_PEM_LENGTH:
        raise IdentityError(f"{what} {path} is larger than {MAX_PEM_LENGTH} bytes")
    if not data.strip():
        raise IdentityError(f"{what} {path} is empty")
    return data


class FileIdentityProvider:
    """Reads an identity from three PEM files: the certificate ``chain`` (leaf first), the
    unencrypted private ``key`` of the leaf and the trust ``roots``.

    The files are read on every :meth:`issue` (so a rotated identity is picked up) and
    checked: each must exist, be readable, be at most 1 MiB of valid PEM, and the key must
    belong to the leaf. Any failure raises :class:`IdentityError` naming the file and the
    problem.
    """

    __slots__ = ("_files",)

    def __init__(self, chain: Path | str, key: Path | str, roots: Path | str) -> None:
        self._files = IdentityFiles(chain=Path(chain), key=Path(key), roots=Path(roots))

    @classmethod
    def from_directory(cls, directory: Path | str) -> FileIdentityProvider:
        """The provider for the files :func:`write_identity` writes into ``directory``."""
        base = Path(directory)
        return cls(base / CHAIN_FILE, base / KEY_FILE, base / ROOTS_FILE)

    @property
    def files(self) -> IdentityFiles:
        """The paths this provider reads."""
        return self._files

    def issue_identity(self) -> Identity:
        """Like :meth:`issue`, returning the parsed :class:`Identity`."""
        files = self._files
        chain_pem = _read_pem_file(files.chain, "certificate chain file")
        key_pem = _read_pem_file(files.key, "private key file")
        roots_pem = _read_pem_file(files.roots, "trust roots file")
        try:
            chain = _load_pem_certificates(chain_pem, "PEM", MAX_CHAIN_LENGTH)
        except IdentityError as exc:
            raise IdentityError(f"certificate chain file {files.chain}: {exc}") from exc
        try:
            key = _load_pem_key(key_pem)
        except IdentityError as exc:
            raise IdentityError(f"private key file {files.key}: {exc}") from exc
        try:
            roots = _load_pem_certificates(roots_pem, "PEM", MAX_ROOT_CERTIFICATES)
        except IdentityError as exc:
            raise IdentityError(f"trust roots file {files.roots}: {exc}") from exc
        try:
            return Identity(chain=chain, private_key=key, roots=roots)
        except IdentityError as exc:
            raise IdentityError(
                f"private key file {files.key} and certificate chain file {files.chain} "
                f"do not form an identity: {exc}"
            ) from exc

    def issue(self) -> IdentityMaterial:
        """The identity in the files, validated and re-encoded as PEM (the key as PKCS#8)."""
        return self.issue_identity().to_material()

    def __repr__(self) -> str:
        files = self._files
        return (
            f"FileIdentityProvider(chain={str(files.chain)!r}, key={str(files.key)!r}, "
            f"roots={str(files.roots)!r})"
        )


def write_identity(identity: Identity, directory: Path | str) -> IdentityFiles:
    """Store ``identity`` as ``chain.pem``, ``key.pem`` (mode 0600) and ``roots.pem`` in
    ``directory`` (created with mode 0700 if missing), each through a temporary file and an
    atomic rename, replacing earlier files. Returns the paths;
    ``FileIdentityProvider.from_directory(directory)`` reads them back.
    """
    if not isinstance(identity, Identity):
        raise TypeError(f"identity must be an Identity, not {type(identity).__name__}")
    base = Path(directory)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = IdentityFiles(chain=base / CHAIN_FILE, key=base / KEY_FILE, roots=base / ROOTS_FILE)
    _write_atomically(files.key, identity.key_pem(), 0o600)
    _write_atomically(files.chain, identity.chain_pem(), 0o644)
    _write_atomically(files.roots, identity.roots_pem(), 0o644)
    return files
