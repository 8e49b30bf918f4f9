"""The scale tool's QUIC settings: larger datagrams only where every path is local."""

from __future__ import annotations

from chrysalis.core import DatagramAddr
from chrysalis.datagram import InprocNetwork
from chrysalis.node import Node
from chrysalis.node._baselines import _client_configuration, _host_datagrams
from chrysalis.node._scale_quic import (
    LOCAL_MAX_UDP_PAYLOAD,
    datagram_size,
    is_local,
    scale_quic_config,
)
from chrysalis.quic import QuicConfig
from chrysalis.quic.testing import issue_identity


def test_unix_and_loopback_paths_are_local_and_others_are_not() -> None:
    assert is_local(DatagramAddr.parse("unixgram:///tmp/task-0/head.sock"))
    assert is_local(DatagramAddr.parse("udp://127.0.0.1:5000"))
    assert is_local(DatagramAddr.parse("udp://127.8.0.3:5000"))
    assert is_local(DatagramAddr.parse("udp://[::1]:5000"))
    assert not is_local(DatagramAddr.parse("udp://10.0.0.2:5000"))
    assert not is_local(DatagramAddr.parse("udp://[fd00::2]:5000"))


def test_a_node_uses_local_datagrams_only_when_all_its_addresses_are_local() -> None:
    unix = DatagramAddr.parse("unixgram:///tmp/task-0/head.sock")
    loopback = DatagramAddr.parse("udp://127.0.0.1:0")
    remote = DatagramAddr.parse("udp://192.0.2.7:4000")
    local = scale_quic_config(60.0, None, unix)  # a Unix leaf: no UDP of its own
    assert local.max_udp_payload == LOCAL_MAX_UDP_PAYLOAD
    assert (local.idle_timeout, local.keepalive_interval) == (60.0, 15.0)
    assert scale_quic_config(60.0, loopback).max_udp_payload == LOCAL_MAX_UDP_PAYLOAD
    default = QuicConfig().max_udp_payload
    assert scale_quic_config(60.0, loopback, remote).max_udp_payload == default
    assert scale_quic_config(60.0, remote).max_udp_payload == default
    assert scale_quic_config(60.0).max_udp_payload == default  # nothing known: the default


def test_a_node_skips_the_stateless_retry_only_when_all_its_addresses_are_local() -> None:
    unix = DatagramAddr.parse("unixgram:///tmp/task-0/head.sock")
    loopback = DatagramAddr.parse("udp://127.0.0.1:0")
    remote = DatagramAddr.parse("udp://192.0.2.7:4000")
    assert QuicConfig().retry  # the transport's default
    assert not scale_quic_config(60.0, None, unix).retry
    assert not scale_quic_config(60.0, loopback, unix).retry
    assert scale_quic_config(60.0, loopback, remote).retry
    assert scale_quic_config(60.0, remote).retry
    assert scale_quic_config(60.0).retry


def test_plain_quic_baselines_send_the_datagrams_a_scale_node_there_sends() -> None:
    # like for like: the aioquic server on a loopback host and the client of a local node
    assert _host_datagrams("127.0.0.1") == LOCAL_MAX_UDP_PAYLOAD
    assert _host_datagrams("10.1.2.3") == QuicConfig().max_udp_payload
    assert datagram_size(DatagramAddr.parse("udp://10.1.2.3:0")) == QuicConfig().max_udp_payload
    assert _client_configuration(LOCAL_MAX_UDP_PAYLOAD).max_datagram_size == LOCAL_MAX_UDP_PAYLOAD
    assert _client_configuration(None).max_datagram_size == 1200  # aioquic's own default
    net = InprocNetwork()
    config = scale_quic_config(30.0, DatagramAddr.parse("udp://127.0.0.1:0"))
    node = Node(issue_identity(), carrier=net.bind(), quic_config=config)
    assert node.quic_config.max_udp_payload == LOCAL_MAX_UDP_PAYLOAD  # what a source passes
    assert Node(issue_identity(), carrier=net.bind()).quic_config == QuicConfig()
