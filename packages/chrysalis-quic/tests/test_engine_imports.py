"""``aioquic.tls``'s verification-only imports are deferred (``_engines/_aioquic_tls``): no
process pays for service_identity, pyOpenSSL or certifi by importing ``chrysalis.quic``, and
aioquic's own certificate verification, should anything call it, still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

#: Top-level packages ``chrysalis.quic`` must not import (all of them come only with
#: ``service_identity`` or pyOpenSSL).
DEFERRED_TOPS = ("service_identity", "OpenSSL", "certifi", "attr", "idna")


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[-1]


def test_importing_the_quic_stack_defers_the_verification_modules() -> None:
    out = _run(
        """
        import json, sys
        import chrysalis.quic
        import aioquic.quic.connection  # what the engines use of aioquic
        print(json.dumps(sorted(sys.modules)))
        """
    )
    modules = json.loads(out)
    assert "aioquic.tls" in modules  # the probe does import it
    eager = sorted(m for m in modules if m.split(".")[0] in DEFERRED_TOPS)
    assert eager == []


def test_aioquic_verification_still_works_through_the_stand_ins() -> None:
    out = _run(
        """
        import datetime, json, sys
        import chrysalis.quic
        from aioquic import tls
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a.example")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("a.example")]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM)
        results = {}
        try:  # service_identity's host name check, through the stand-in
            tls.verify_certificate(cert, server_name="b.example", cadata=pem)
        except tls.AlertBadCertificate as exc:
            results["mismatch"] = str(exc)
        try:  # pyOpenSSL's chain check, through the stand-in: an untrusted root
            tls.verify_certificate(cert, server_name="a.example", cadata=b"")
        except tls.AlertBadCertificate as exc:
            results["untrusted"] = str(exc)
        tls.verify_certificate(cert, server_name="a.example", cadata=pem)
        results["ok"] = True
        import service_identity, OpenSSL.crypto
        results["real"] = [
            type(m).__name__ for m in (service_identity, OpenSSL.crypto, sys.modules["OpenSSL"])
        ]
        print(json.dumps(results))
        """
    )
    results = json.loads(out)
    assert "'b.example' doesn't match DNSPattern(pattern=b'a.example')" in results["mismatch"]
    assert results["untrusted"]
    assert results["ok"] is True
    assert len(results["real"]) == 3
    assert "_Deferred" not in results["real"]  # the real modules, not the stand-ins


def test_a_program_that_imported_pyopenssl_first_keeps_it() -> None:
    out = _run(
        """
        import sys
        import OpenSSL.crypto, service_identity
        import chrysalis.quic
        from aioquic import tls
        print(tls.crypto is sys.modules["OpenSSL.crypto"], tls.service_identity is service_identity)
        """
    )
    assert out == "True True"
