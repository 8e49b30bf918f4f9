"""Which address a node on a wildcard bind advertises (``chrysalis.node._advertise``): the
rule alone (sans-IO), the kernel's view, a real ``Node`` and ``chrysalis serve`` on loopback."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chrysalis.core import DatagramAddr, Pid
from chrysalis.node import Node
from chrysalis.node._advertise import (
    HostView,
    advertised_address,
    choose_advertised,
    host_view,
    is_wildcard,
    parse_advertise,
)
from chrysalis.quic import DevelopmentIdentityProvider

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, start_node, stop_all

IP = ipaddress.ip_address
WILD = DatagramAddr.parse("udp://0.0.0.0:4000")
LO = ("lo", IP("127.0.0.1"), True)
ETH = ("eth0", IP("10.1.2.3"), False)
VETH = ("a-veth", IP("10.9.9.9"), False)


def test_a_wildcard_is_only_a_udp_unspecified_address() -> None:
    assert is_wildcard(WILD)
    assert is_wildcard(DatagramAddr.parse("udp://[::]:1"))
    assert not is_wildcard(DatagramAddr.parse("udp://127.0.0.1:1"))
    assert not is_wildcard(DatagramAddr.unixgram("/tmp/x"))


def test_the_rule_in_its_order() -> None:
    everything = HostView(IP("192.168.0.7"), IP("10.1.2.3"), [LO, ETH])
    # 1. an explicit address wins, even over a concrete bind; the bound port is kept
    assert str(choose_advertised(WILD, everything, IP("172.16.0.1"))) == "udp://172.16.0.1:4000"
    bound = DatagramAddr.parse("udp://127.0.0.1:5")
    assert str(choose_advertised(bound, None, IP("10.0.0.1"))) == "udp://10.0.0.1:5"
    # 2. a concrete bind is itself
    assert choose_advertised(bound, None) == bound
    # 3. toward the parent, 4. the default route
    assert str(choose_advertised(WILD, everything)) == "udp://192.168.0.7:4000"
    no_parent = everything._replace(toward_parent=None)
    assert str(choose_advertised(WILD, no_parent)) == "udp://10.1.2.3:4000"
    # 5. the first non-loopback, non-link-local interface in name order
    link_local = ("b0", IP("169.254.1.1"), False)
    view = HostView(None, None, [LO, ETH, link_local, VETH])
    assert str(choose_advertised(WILD, view)) == "udp://10.9.9.9:4000"
    # 6. loopback when nothing else exists
    assert str(choose_advertised(WILD, HostView(None, None, [LO]))) == "udp://127.0.0.1:4000"
    assert str(choose_advertised(WILD, HostView(None, None, []))) == "udp://127.0.0.1:4000"


def test_the_rule_keeps_the_address_family() -> None:
    wild6 = DatagramAddr.parse("udp://[::]:7")
    view = HostView(IP("10.0.0.2"), IP("fd00::5"), [ETH])
    assert str(choose_advertised(wild6, view)) == "udp://[fd00::5]:7"
    assert str(choose_advertised(wild6, HostView(None, None, [ETH]))) == "udp://[::1]:7"
    assert str(choose_advertised(WILD, view)) == "udp://10.0.0.2:7"[:-1] + "4000"


def test_non_udp_carriers_are_advertised_as_bound() -> None:
    unix = DatagramAddr.unixgram("/tmp/node.sock")
    assert choose_advertised(unix, None, IP("10.0.0.1")) == unix


def test_a_wildcard_without_a_view_is_refused() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        choose_advertised(WILD, None)


@pytest.mark.parametrize(
    ("text", "ip"),
    [("10.0.0.5", "10.0.0.5"), ("udp://10.0.0.5:99", "10.0.0.5"), ("udp://[fe80::1]", "fe80::1")],
)
def test_advertise_values(text: str, ip: str) -> None:
    assert parse_advertise(text) == IP(ip)


@pytest.mark.parametrize("bad", ["", "host.example", "0.0.0.0", "udp://::", "10.0.0"])
def test_bad_advertise_values_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="advertise address"):
        parse_advertise(bad)


def test_the_kernel_view_of_this_host() -> None:
    view = host_view(DatagramAddr.parse("udp://127.0.0.1:9"))
    assert view.toward_parent == IP("127.0.0.1")  # loopback reaches loopback
    names = [name for name, _ip, _lo in view.interfaces]
    assert any(loopback for _n, _ip, loopback in view.interfaces), names
    chosen = advertised_address(WILD)
    assert not chosen.ip.is_unspecified
    assert chosen.port == 4000
    if view.default_route is not None:
        assert chosen.ip == view.default_route
    addresses = {ip for _n, ip, _lo in view.interfaces}
    assert chosen.ip in addresses  # an address this host really has


def _identity(tmp_path: Path) -> object:
    return DevelopmentIdentityProvider(tmp_path / "ca").issue_identity()


def test_a_node_on_a_wildcard_advertises_and_is_joined_there(tmp_path: Path) -> None:
    """A real root bound to 0.0.0.0 advertises the address given (loopback here) in its join
    token and locator, and a child joins it through that token."""

    async def main() -> tuple[str, str, str]:
        root = Node.serve(_identity(tmp_path), "udp://0.0.0.0:0", advertise="127.0.0.1")  # type: ignore[arg-type]
        async with root:
            token = root.join_token
            address, _, authority = token.partition("?authority=")
            child = Node.join(_identity(tmp_path), address, Pid.parse(authority))  # type: ignore[arg-type]
            async with child:
                await asyncio.wait_for(child.wait_connected(), 20)
                return token, str(root.advertised_addr), str(root.local_addr)

    token, advertised, bound = asyncio.run(main())
    port = bound.rsplit(":", 1)[1]
    assert bound.startswith("udp://0.0.0.0:")
    assert advertised == f"udp://127.0.0.1:{port}"
    assert token.startswith(f"udp://127.0.0.1:{port}?authority=")


def test_a_bad_advertise_fails_before_binding(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="advertise address"):
        Node.serve(_identity(tmp_path), "udp://0.0.0.0:0", advertise="nowhere")  # type: ignore[arg-type]


def test_chrysalis_serve_on_a_wildcard_prints_a_routable_token(tmp_path: Path) -> None:
    """``serve --listen udp://0.0.0.0:0`` prints an address of this host (not 0.0.0.0) that
    ``chrysalis ls`` reaches; ``--advertise 127.0.0.1`` prints that one."""
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        found, token = start_node(
            [*CLI, "serve", "--listen", "udp://0.0.0.0:0"], env, tmp_path / "a.log"
        )
        procs.append(found)
        given, given_token = start_node(
            [*CLI, "serve", "--listen", "udp://0.0.0.0:0", "--advertise", "127.0.0.1"],
            env,
            tmp_path / "b.log",
        )
        procs.append(given)
        assert not token.startswith("udp://0.0.0.0:"), token
        assert DatagramAddr.parse(token.partition("?")[0]) == advertised_address(
            DatagramAddr.parse("udp://0.0.0.0:" + token.partition("?")[0].rsplit(":", 1)[1])
        )
        assert given_token.startswith("udp://127.0.0.1:"), given_token
        for each in (token, given_token):
            done = subprocess.run(
                [*CLI, "ls", each, "--timeout", "15"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            assert each.partition("?")[0] in done.stdout  # its locator: the advertised address
    finally:
        stop_all(procs)
