"""The faultnet carrier, found through its real entry point."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from chrysalis.core import AddressError, CarrierSpec, DatagramAddr, PluginRegistry, hookimpl
from chrysalis.datagram import DatagramSocket, InprocNetwork
from chrysalis.faultnet import (
    FAULTNET_SCHEME,
    BindableNetwork,
    FaultDirection,
    FaultPlan,
    FaultySocket,
    faultnet_address,
    open_faultnet,
)


@pytest.fixture
def registry() -> PluginRegistry:
    reg = PluginRegistry()
    reg.load_entry_points()
    return reg


def test_plugin_is_discovered_through_its_entry_point(registry: PluginRegistry) -> None:
    assert "chrysalis-faultnet:faultnet" in registry.plugin_names()
    spec = registry.carrier(FAULTNET_SCHEME)
    assert spec.open is open_faultnet
    assert spec.description


def test_open_inproc_with_text_options(registry: PluginRegistry, memnet: BindableNetwork) -> None:
    sock = registry.open_carrier(
        faultnet_address("inproc"), network=memnet, loss="0.5", seed="3", direction="both"
    )
    assert isinstance(sock, FaultySocket)
    assert sock.plan == FaultPlan(seed=3, loss=0.5, direction=FaultDirection.BOTH)
    peer = memnet.bind()
    assert sock.local_addr != peer.local_addr
    sock.shutdown()
    assert sock.join(5.0)
    assert sock.inner.is_shutdown


def test_open_wraps_the_carrier_of_the_inner_address(
    registry: PluginRegistry, memnet: BindableNetwork
) -> None:
    opened: list[tuple[DatagramAddr, dict[str, object]]] = []

    class MemCarrier:
        @hookimpl
        def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
            def open_mem(address: DatagramAddr, /, **options: object) -> DatagramSocket:
                opened.append((address, options))
                return memnet.bind()

            return [CarrierSpec("memtest", open_mem)]

    registry.register(MemCarrier(), "memtest")
    inner = DatagramAddr("memtest", b"\x01\x02")
    with registry.open_carrier(
        str(faultnet_address(inner)), registry=registry, inner_options={"depth": 3}, delay=0.01
    ) as sock:
        assert isinstance(sock, FaultySocket)
        assert sock.plan.delay == 0.01
    assert opened == [(inner, {"depth": 3})]


def test_unknown_option_is_a_type_error_and_opens_nothing(
    registry: PluginRegistry, memnet: BindableNetwork
) -> None:
    before = memnet.bind()
    with pytest.raises(TypeError, match="unknown fault plan option 'lose'"):
        registry.open_carrier(faultnet_address("inproc"), network=memnet, lose=0.1)
    after = memnet.bind()
    assert after.local_addr.endpoint_id == before.local_addr.endpoint_id + 1


def test_bad_option_value_is_a_value_error(memnet: BindableNetwork) -> None:
    with pytest.raises(ValueError, match="probability"):
        open_faultnet(faultnet_address("inproc"), network=memnet, loss=2)


def test_address_text_round_trips_in_hex() -> None:
    addr = faultnet_address("inproc")
    assert addr == DatagramAddr(FAULTNET_SCHEME, b"inproc")
    assert str(addr) == "faultnet://696e70726f63"
    assert DatagramAddr.parse(str(addr)) == addr
    udp = DatagramAddr.udp("127.0.0.1", 9)
    assert faultnet_address(udp).opaque == b"udp://127.0.0.1:9"


@pytest.mark.parametrize(
    "inner", ["not an address", "faultnet://696e70726f63", "udp://999.1.1.1:1"]
)
def test_faultnet_address_rejects_bad_inner_text(inner: str) -> None:
    with pytest.raises(AddressError):
        faultnet_address(inner)


def test_factory_rejects_foreign_and_undecodable_addresses() -> None:
    with pytest.raises(ValueError, match="faultnet address"):
        open_faultnet(DatagramAddr.udp("127.0.0.1", 9))
    with pytest.raises(AddressError, match="UTF-8"):
        open_faultnet(DatagramAddr(FAULTNET_SCHEME, b"\xff\xfe"))


def test_network_option_only_applies_to_inproc(
    registry: PluginRegistry, memnet: BindableNetwork
) -> None:
    with pytest.raises(TypeError, match="network option"):
        open_faultnet(faultnet_address("udp://127.0.0.1:0"), network=memnet, registry=registry)


def test_inner_address_is_opened_by_the_registered_carrier(registry: PluginRegistry) -> None:
    network = InprocNetwork()
    peer = network.bind()
    inner = DatagramAddr.inproc(network.network_id, 77)
    with registry.open_carrier(faultnet_address(inner), duplicate=1.0) as sock:
        assert isinstance(sock, FaultySocket)
        assert sock.local_addr == inner
        assert sock.try_send_to(b"twice", peer.local_addr)
        assert peer.try_recv_from() == (b"twice", inner)
        assert peer.try_recv_from() == (b"twice", inner)
    peer.shutdown()
    assert peer.join(5.0)
