"""Tests of the identity providers, ``write_identity``, the plugin entry point, and that
aioquic accepts the material the providers issue (a real in-memory handshake)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import stat
from pathlib import Path

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted
from cryptography.hazmat.primitives import serialization

from chrysalis.core import IdentityMaterial, IdentityProvider, PluginRegistry
from chrysalis.quic import _plugin
from chrysalis.quic._devca import CA_CERTIFICATE_FILE, DevelopmentCA
from chrysalis.quic._identity import Identity, IdentityError, verify_peer_chain
from chrysalis.quic._providers import (
    DEV_CA_DIR_ENV,
    DevelopmentIdentityProvider,
    FileIdentityProvider,
    IdentityFiles,
    default_dev_ca_directory,
    write_identity,
)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def ca() -> DevelopmentCA:
    return DevelopmentCA.create()


@pytest.fixture
def files(tmp_path: Path, ca: DevelopmentCA) -> IdentityFiles:
    return write_identity(ca.issue(), tmp_path / "identity")


# -- development provider ------------------------------------------------------------------


def test_dev_provider_issues_a_fresh_pid_per_call_from_one_ca(tmp_path: Path) -> None:
    provider: IdentityProvider = DevelopmentIdentityProvider(tmp_path / "ca")  # conforms
    first = Identity.from_material(provider.issue())
    second = Identity.from_material(provider.issue())
    assert first.pid != second.pid
    assert first.roots == second.roots
    assert verify_peer_chain([first.leaf_der], second.roots, now=_now()) == first.pid
    assert (tmp_path / "ca" / CA_CERTIFICATE_FILE).exists()


def test_dev_providers_sharing_a_directory_trust_each_other(tmp_path: Path) -> None:
    one = DevelopmentIdentityProvider(tmp_path / "ca").issue_identity()
    other = DevelopmentIdentityProvider(str(tmp_path / "ca")).issue_identity()
    assert one.pid != other.pid
    assert other.verify_peer([one.leaf_der], now=_now(), server_name="localhost") == one.pid


def test_dev_provider_directory_defaults_to_env_then_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEV_CA_DIR_ENV, str(tmp_path / "from-env"))
    assert DevelopmentIdentityProvider().directory == tmp_path / "from-env"
    monkeypatch.delenv(DEV_CA_DIR_ENV)
    default = default_dev_ca_directory()
    assert default.name == f"chrysalis-dev-ca-{os.geteuid()}"
    assert DevelopmentIdentityProvider().directory == default


def test_dev_provider_reports_an_insecure_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(IdentityError, match="writable"):
        DevelopmentIdentityProvider(shared).issue()


# -- write_identity and the file provider ---------------------------------------------------


def test_write_identity_then_file_provider_reads_the_same_identity(
    tmp_path: Path, ca: DevelopmentCA
) -> None:
    identity = ca.issue()
    files = write_identity(identity, tmp_path / "out")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700
    for provider in (
        FileIdentityProvider(files.chain, files.key, files.roots),
        FileIdentityProvider.from_directory(tmp_path / "out"),
    ):
        assert provider.files == files
        loaded = provider.issue_identity()
        assert loaded == identity
        assert loaded.pid == identity.pid
        assert Identity.from_material(provider.issue()).pid == identity.pid


def test_write_identity_replaces_earlier_files(tmp_path: Path, ca: DevelopmentCA) -> None:
    write_identity(ca.issue(), tmp_path)
    newer = ca.issue()
    write_identity(newer, tmp_path)
    assert FileIdentityProvider.from_directory(tmp_path).issue_identity().pid == newer.pid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.pem", "key.pem", "roots.pem"]


def test_file_provider_reports_a_missing_file(files: IdentityFiles, tmp_path: Path) -> None:
    provider = FileIdentityProvider(files.chain, tmp_path / "nope.pem", files.roots)
    with pytest.raises(IdentityError, match=r"private key file .*nope\.pem does not exist"):
        provider.issue()


def test_file_provider_reports_a_directory_and_an_empty_file(
    files: IdentityFiles, tmp_path: Path
) -> None:
    with pytest.raises(IdentityError, match=r"trust roots file .* is a directory"):
        FileIdentityProvider(files.chain, files.key, tmp_path).issue()
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"\n")
    with pytest.raises(IdentityError, match=r"certificate chain file .*empty\.pem is empty"):
        FileIdentityProvider(empty, files.key, files.roots).issue()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read files without permission")
def test_file_provider_reports_an_unreadable_file(files: IdentityFiles) -> None:
    files.key.chmod(0)
    with pytest.raises(IdentityError, match=r"cannot read private key file .*permission denied"):
        FileIdentityProvider(files.chain, files.key, files.roots).issue()


def test_file_provider_reports_other_os_errors_with_their_reason(
    files: IdentityFiles, tmp_path: Path
) -> None:
    loop = tmp_path / "loop.pem"
    loop.symlink_to(tmp_path / "loop2.pem")
    (tmp_path / "loop2.pem").symlink_to(loop)
    with pytest.raises(
        IdentityError, match=r"cannot read trust roots file .*loop\.pem: .*symbolic"
    ):
        FileIdentityProvider(files.chain, files.key, loop).issue()


def test_file_provider_reports_malformed_pem_per_file(files: IdentityFiles, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(IdentityError, match=r"certificate chain file .*garbage\.pem"):
        FileIdentityProvider(garbage, files.key, files.roots).issue()
    with pytest.raises(IdentityError, match=r"trust roots file .*garbage\.pem"):
        FileIdentityProvider(files.chain, files.key, garbage).issue()
    with pytest.raises(IdentityError, match=r"private key file .*chain\.pem: .*not a valid"):
        FileIdentityProvider(files.chain, files.chain, files.roots).issue()


def test_file_provider_reports_a_key_that_does_not_match_the_leaf(
    files: IdentityFiles, tmp_path: Path, ca: DevelopmentCA
) -> None:
    other = write_identity(ca.issue(), tmp_path / "other")
    with pytest.raises(IdentityError, match=r"do not form an identity: .*does not match"):
        FileIdentityProvider(files.chain, other.key, files.roots).issue()


def test_file_provider_refuses_oversized_files(files: IdentityFiles, tmp_path: Path) -> None:
    huge = tmp_path / "huge.pem"
    huge.write_bytes(files.roots.read_bytes() + b"\n" * (1 << 20))
    with pytest.raises(IdentityError, match="larger than"):
        FileIdentityProvider(files.chain, files.key, huge).issue()


def test_file_provider_picks_up_rotated_files(tmp_path: Path, ca: DevelopmentCA) -> None:
    provider = FileIdentityProvider.from_directory(tmp_path)
    first = ca.issue()
    write_identity(first, tmp_path)
    assert provider.issue_identity().pid == first.pid
    second = ca.issue()
    write_identity(second, tmp_path)
    assert provider.issue_identity().pid == second.pid


# -- the plugin -----------------------------------------------------------------------------


def test_entry_point_names_the_plugin_module() -> None:
    (entry_point,) = importlib.metadata.entry_points(group="chrysalis", name="quic")
    assert entry_point.value == "chrysalis.quic._plugin"
    assert entry_point.load() is _plugin


def test_registry_discovers_dev_provider_through_entry_point(tmp_path: Path) -> None:
    registry = PluginRegistry()
    registry.load_entry_points()
    assert {"dev", "file"} <= set(registry.identity_providers())
    provider = registry.identity_provider("dev").create(directory=str(tmp_path / "ca"))
    material = provider.issue()
    assert isinstance(material, IdentityMaterial)
    one, two = Identity.from_material(material), Identity.from_material(provider.issue())
    assert one.pid != two.pid
    assert verify_peer_chain([two.leaf_der], one.roots, now=_now(), server_name="127.0.0.1")


def test_registry_file_provider_accepts_paths_or_a_directory(
    files: IdentityFiles,
) -> None:
    registry = PluginRegistry()
    registry.register(_plugin)
    spec = registry.identity_provider("file")
    by_paths = spec.create(chain=str(files.chain), key=files.key, roots=files.roots)
    by_directory = spec.create(directory=files.chain.parent)
    assert by_paths.issue() == by_directory.issue()
    with pytest.raises(TypeError, match="needs chain, key and roots"):
        spec.create(chain=files.chain)
    with pytest.raises(TypeError, match="not both"):
        spec.create(directory=files.chain.parent, key=files.key)


# -- aioquic accepts the material -----------------------------------------------------------


def test_aioquic_handshake_succeeds_with_issued_material(tmp_path: Path) -> None:
    provider = DevelopmentIdentityProvider(tmp_path / "ca")
    server_identity = provider.issue_identity()
    client_identity = provider.issue_identity()
    server_files = write_identity(server_identity, tmp_path / "server")

    server_config = QuicConfiguration(is_client=False, alpn_protocols=["chrysalis-test"])
    server_config.load_cert_chain(server_files.chain, server_files.key)
    client_config = QuicConfiguration(
        is_client=True, alpn_protocols=["chrysalis-test"], server_name="localhost"
    )
    client_config.load_verify_locations(cadata=client_identity.roots_pem())

    client = QuicConnection(configuration=client_config)
    server = QuicConnection(
        configuration=server_config,
        original_destination_connection_id=client.original_destination_connection_id,
    )
    client_address, server_address = ("127.0.0.1", 4433), ("127.0.0.1", 4434)
    now = 1.0
    client.connect(server_address, now=now)
    completed: dict[str, bool] = {}
    for _ in range(20):  # a handshake needs a handful of flights; bounded
        for data, _ in client.datagrams_to_send(now=now):
            server.receive_datagram(data, client_address, now=now)
        for data, _ in server.datagrams_to_send(now=now):
            client.receive_datagram(data, server_address, now=now)
        for name, connection in (("client", client), ("server", server)):
            while (event := connection.next_event()) is not None:
                if isinstance(event, HandshakeCompleted):
                    completed[name] = True
        if len(completed) == 2:
            break
        now += 0.01
    assert completed == {"client": True, "server": True}
    # The certificate the server presented is the issued leaf, and it yields the server PID.
    presented = server_config.certificate
    assert presented is not None
    der = presented.public_bytes(serialization.Encoding.DER)
    assert verify_peer_chain([der], client_identity.roots, now=_now(), server_name="localhost") == (
        server_identity.pid
    )
