"""Tests of the development CA: issued leaves, and the race-safe, permission-checked storage."""

from __future__ import annotations

import datetime
import fcntl
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from chrysalis.quic._devca import (
    CA_CERTIFICATE_FILE,
    CA_KEY_FILE,
    CA_LOCK_FILE,
    MAX_SUBJECT_ALT_NAMES,
    DevelopmentCA,
    _exclusive_lock,
)
from chrysalis.quic._identity import IdentityError, verify_peer_chain

NOW = datetime.datetime(2030, 6, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def ca() -> DevelopmentCA:
    return DevelopmentCA.create(now=NOW)


def _fingerprint(ca: DevelopmentCA) -> bytes:
    return ca.certificate.public_bytes(serialization.Encoding.DER)


# -- issued certificates ------------------------------------------------------------------


def test_ca_certificate_is_a_self_signed_p256_ca(ca: DevelopmentCA) -> None:
    certificate = ca.certificate
    assert certificate.subject == certificate.issuer
    assert isinstance(ca.private_key.curve, ec.SECP256R1)
    basic = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert basic.value.ca
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    certificate.verify_directly_issued_by(certificate)


def test_leaf_has_extensions_for_tls_client_and_server(ca: DevelopmentCA) -> None:
    leaf = ca.issue(now=NOW).leaf
    extensions = leaf.extensions
    basic = extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert not basic.value.ca
    usage = extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature
    assert not usage.key_cert_sign
    eku = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    ski = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(leaf.public_key())
    aki = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    leaf.verify_directly_issued_by(ca.certificate)


def test_leaf_validity_starts_in_the_past_and_is_capped_by_the_ca(ca: DevelopmentCA) -> None:
    leaf = ca.issue(validity=datetime.timedelta(days=2), now=NOW).leaf
    assert leaf.not_valid_before_utc < NOW
    assert NOW - leaf.not_valid_before_utc <= datetime.timedelta(minutes=10)
    assert leaf.not_valid_after_utc == NOW + datetime.timedelta(days=2)
    forever = ca.issue(validity=datetime.timedelta(days=100_000), now=NOW).leaf
    assert forever.not_valid_after_utc == ca.certificate.not_valid_after_utc


def test_issue_uses_the_given_common_name_and_defaults_to_the_os_pid(ca: DevelopmentCA) -> None:
    named = ca.issue("worker-7", now=NOW).leaf
    assert named.subject.rfc4514_string() == "CN=worker-7"
    default = ca.issue(now=NOW).leaf
    assert default.subject.rfc4514_string() == f"CN=chrysalis process {os.getpid()}"


def test_issue_rejects_bad_names_and_validity(ca: DevelopmentCA) -> None:
    with pytest.raises(IdentityError, match="not an IP address"):
        ca.issue(ip_addresses=("300.1.1.1",), now=NOW)
    with pytest.raises(IdentityError, match="ASCII"):
        ca.issue(dns_names=("bücher.example",), now=NOW)
    with pytest.raises(IdentityError, match="at least one"):
        ca.issue(dns_names=(), ip_addresses=(), now=NOW)
    with pytest.raises(IdentityError, match="more than"):
        ca.issue(dns_names=[f"n{i}.test" for i in range(MAX_SUBJECT_ALT_NAMES + 1)], now=NOW)
    with pytest.raises(IdentityError, match="positive"):
        ca.issue(validity=datetime.timedelta(0), now=NOW)
    with pytest.raises(IdentityError, match="1 to 64"):
        ca.issue("x" * 65, now=NOW)
    with pytest.raises(TypeError):
        ca.issue(dns_names="localhost", now=NOW)


def test_an_expired_ca_refuses_to_issue() -> None:
    old = DevelopmentCA.create(validity=datetime.timedelta(days=1), now=NOW)
    with pytest.raises(IdentityError, match="expired"):
        old.issue(now=NOW + datetime.timedelta(days=2))


def test_two_created_cas_have_distinct_subjects_and_do_not_trust_each_other() -> None:
    first = DevelopmentCA.create(now=NOW)
    second = DevelopmentCA.create(now=NOW)
    assert first.certificate.subject != second.certificate.subject
    leaf = first.issue(now=NOW)
    with pytest.raises(IdentityError):
        verify_peer_chain([leaf.leaf_der], [second.certificate], now=NOW)


def test_ca_rejects_mismatched_key(ca: DevelopmentCA) -> None:
    with pytest.raises(IdentityError, match="does not match"):
        DevelopmentCA(
            certificate=ca.certificate, private_key=ec.generate_private_key(ec.SECP256R1())
        )


# -- storage -------------------------------------------------------------------------------


def test_load_or_create_is_idempotent_with_private_files(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    first = DevelopmentCA.load_or_create(directory)
    second = DevelopmentCA.load_or_create(directory)
    assert _fingerprint(first) == _fingerprint(second)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / CA_KEY_FILE).stat().st_mode) == 0o600
    assert (directory / CA_CERTIFICATE_FILE).exists()
    leftovers = [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    leaf = second.issue()
    assert verify_peer_chain(
        [leaf.leaf_der], [first.certificate], now=datetime.datetime.now(datetime.UTC)
    )


def test_load_or_create_is_race_safe_across_threads(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    results: list[bytes] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(_fingerprint(DevelopmentCA.load_or_create(directory)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len(results) == 6
    assert len(set(results)) == 1
    assert set(results) == {_fingerprint(DevelopmentCA.load_or_create(directory))}


_RACE_SCRIPT = """
import sys, time
from pathlib import Path
from cryptography.hazmat.primitives import hashes
from chrysalis.quic._devca import DevelopmentCA
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
ca = DevelopmentCA.load_or_create(Path(sys.argv[1]))
print(ca.certificate.fingerprint(hashes.SHA256()).hex())
"""


def test_load_or_create_is_race_safe_across_processes(tmp_path: Path) -> None:
    import time

    directory = tmp_path / "ca"
    start = str(time.time() + 1.0)  # all children start creating at the same instant
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE_SCRIPT, str(directory), start],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = []
    try:
        for child in children:
            out, err = child.communicate(timeout=30)
            assert child.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=5)
    assert len(set(outputs)) == 1
    mine = DevelopmentCA.load_or_create(directory)
    assert outputs[0] == mine.certificate.fingerprint(hashes.SHA256()).hex()


def test_lock_wait_is_bounded(tmp_path: Path) -> None:
    lock = tmp_path / CA_LOCK_FILE
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(IdentityError, match="timed out"), _exclusive_lock(lock, 0.05):
            pass  # pragma: no cover - the lock is held above
    finally:
        os.close(fd)
    with _exclusive_lock(lock, 0.05):
        pass


def test_a_missing_certificate_means_an_interrupted_creation_and_is_redone(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ca"
    first = DevelopmentCA.load_or_create(directory)
    (directory / CA_CERTIFICATE_FILE).unlink()
    second = DevelopmentCA.load_or_create(directory)
    assert _fingerprint(second) != _fingerprint(first)
    assert _fingerprint(DevelopmentCA.load_or_create(directory)) == _fingerprint(second)


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    DevelopmentCA.load_or_create(directory)
    (directory / CA_KEY_FILE).chmod(0o644)
    with pytest.raises(IdentityError, match="must be 0600"):
        DevelopmentCA.load_or_create(directory)


def test_key_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    DevelopmentCA.load_or_create(directory)
    key = directory / CA_KEY_FILE
    target = tmp_path / "moved.key"
    key.rename(target)
    key.symlink_to(target)
    with pytest.raises(IdentityError, match="symbolic link"):
        DevelopmentCA.load_or_create(directory)


def test_key_with_two_links_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    DevelopmentCA.load_or_create(directory)
    os.link(directory / CA_KEY_FILE, tmp_path / "second-link")
    with pytest.raises(IdentityError, match="hard links"):
        DevelopmentCA.load_or_create(directory)


def test_insecure_directories_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(IdentityError, match="symbolic link"):
        DevelopmentCA.load_or_create(link)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(IdentityError, match="writable by group or others"):
        DevelopmentCA.load_or_create(shared)
    plain = tmp_path / "file"
    plain.write_bytes(b"")
    with pytest.raises(IdentityError, match="not a directory"):
        DevelopmentCA.load_or_create(plain)


def test_corrupt_stored_files_are_reported(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    DevelopmentCA.load_or_create(directory)
    certificate = directory / CA_CERTIFICATE_FILE
    saved = certificate.read_bytes()
    certificate.write_bytes(b"not a certificate")
    with pytest.raises(IdentityError, match="is not a PEM certificate"):
        DevelopmentCA.load_or_create(directory)
    certificate.write_bytes(saved)
    key = directory / CA_KEY_FILE
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(IdentityError, match="not an unencrypted PEM private key"):
        DevelopmentCA.load_or_create(directory)
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(IdentityError, match="does not match"):
        DevelopmentCA.load_or_create(directory)
