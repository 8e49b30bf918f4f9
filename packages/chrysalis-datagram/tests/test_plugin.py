"""The chrysalis plugin of this package: entry point, carrier specs and factories."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from chrysalis.core import AddressError, DatagramAddr, PluginRegistry
from chrysalis.datagram import (
    HostUnreachableError,
    InprocNetwork,
    InprocSocket,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.datagram import _plugin as plugin


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry()
    registry.register(plugin, name="chrysalis-datagram")
    return registry


def test_entry_point_is_declared_in_the_chrysalis_group() -> None:
    entry_points = importlib.metadata.entry_points(group="chrysalis")
    (ours,) = [ep for ep in entry_points if ep.value == "chrysalis.datagram._plugin"]
    assert ours.name == "datagram"
    assert ours.load() is plugin


def test_entry_point_registry_serves_the_three_carriers() -> None:
    registry = PluginRegistry()
    registry.load_entry_points()
    assert registry.carrier("udp").open is plugin.open_udp
    assert registry.carrier("unixgram").open is plugin.open_unixgram
    assert registry.carrier("inproc").open is plugin.open_inproc


def test_hook_describes_carriers_without_opening_anything() -> None:
    first = plugin.chrysalis_carriers()
    assert [spec.scheme for spec in first] == ["udp", "unixgram", "inproc"]
    assert all(spec.description for spec in first)
    assert plugin.chrysalis_carriers() == first


def test_open_udp_honours_options(registry: PluginRegistry) -> None:
    sock = registry.open_carrier("udp://127.0.0.1:0", gso=False, gro=False)
    try:
        assert isinstance(sock, UdpSocket)
        assert not sock.gso_enabled
        assert not sock.gro_enabled
        assert sock.local_addr.port != 0
    finally:
        sock.shutdown()
        assert sock.join(1)


def test_unknown_or_mistyped_options_are_type_errors(registry: PluginRegistry) -> None:
    with pytest.raises(TypeError, match="bogus"):
        registry.open_carrier("udp://127.0.0.1:0", bogus=1)
    with pytest.raises(TypeError, match="recv_buffer"):
        registry.open_carrier("udp://127.0.0.1:0", recv_buffer="big")
    with pytest.raises(TypeError, match="network"):
        registry.open_carrier("inproc://1/1", network="n")


def test_open_unixgram_binds_the_path(registry: PluginRegistry, tmp_path: Path) -> None:
    address = DatagramAddr.unixgram(str(tmp_path / "p.sock"))
    sock = registry.open_carrier(address)
    try:
        assert isinstance(sock, UnixDatagramSocket)
        assert sock.local_addr == address
    finally:
        sock.shutdown()
        assert sock.join(1)


def test_open_inproc_finds_the_network_by_id(registry: PluginRegistry) -> None:
    network = InprocNetwork()
    sock = registry.open_carrier(DatagramAddr.inproc(network.network_id, 7))
    assert isinstance(sock, InprocSocket)
    assert sock.network is network
    assert sock.endpoint_id == 7
    explicit = registry.open_carrier(DatagramAddr.inproc(network.network_id, 8), network=network)
    assert explicit.local_addr == DatagramAddr.inproc(network.network_id, 8)


def test_open_inproc_rejects_unknown_or_mismatched_networks(registry: PluginRegistry) -> None:
    network = InprocNetwork()
    with pytest.raises(HostUnreachableError):
        registry.open_carrier(DatagramAddr.inproc(network.network_id + 1_000_000, 1))
    with pytest.raises(AddressError):
        registry.open_carrier(DatagramAddr.inproc(network.network_id + 1, 1), network=network)
    with pytest.raises(AddressError):
        plugin.open_inproc(DatagramAddr.udp("127.0.0.1", 1))
