"""FaultyNetwork: every endpoint faulty, seeds derived per socket, group partitions."""

from __future__ import annotations

import threading
import time

import pytest

import chrysalis.datagram
from chrysalis.datagram import DatagramSocket
from chrysalis.faultnet import (
    BindableNetwork,
    FaultPlan,
    FaultStatistics,
    FaultyNetwork,
)


def drain(sock: DatagramSocket) -> list[bytes]:
    out = []
    while (got := sock.try_recv_from()) is not None:
        out.append(got[0])
    return out


def test_each_socket_gets_a_plan_derived_from_its_binding_index(memnet: BindableNetwork) -> None:
    plan = FaultPlan(seed=5, loss=0.25)
    with FaultyNetwork(plan, memnet) as net:
        socks = [net.bind() for _ in range(3)]
        assert [s.plan for s in socks] == [plan.derive(i) for i in range(3)]
        assert len({s.plan.seed for s in socks}) == 3
        own = FaultPlan(seed=1)
        assert net.bind(plan=own).plan is own
        assert net.sockets() == (*socks, net.sockets()[3])


def test_same_binding_order_repeats_a_run_exactly(memnet: BindableNetwork) -> None:
    def run() -> list[bytes]:
        with FaultyNetwork(FaultPlan(seed=12, loss=0.3, duplicate=0.2), memnet) as net:
            a, b = net.bind(), net.bind()
            got: list[bytes] = []
            for i in range(200):
                assert a.try_send_to(i.to_bytes(2, "big"), b.local_addr)
                got.extend(drain(b))
            return got

    first = run()
    assert first == run()
    assert 0 < len(first) < 240


def test_partition_cuts_both_directions_between_groups_and_heal_restores(
    memnet: BindableNetwork,
) -> None:
    with FaultyNetwork(FaultPlan(), memnet) as net:
        a, b, c = net.bind(), net.bind(), net.bind()
        net.partition([a], [b.local_addr])
        assert a.try_send_to(b"a->b", b.local_addr)
        assert b.try_send_to(b"b->a", a.local_addr)
        assert a.try_send_to(b"a->c", c.local_addr)
        assert drain(a) == []
        assert drain(b) == []
        assert drain(c) == [b"a->c"]
        assert net.statistics().dropped_partition == 2
        net.heal()
        assert a.try_send_to(b"again", b.local_addr)
        assert drain(b) == [b"again"]


def test_statistics_sum_every_socket_including_shut_down_ones(memnet: BindableNetwork) -> None:
    with FaultyNetwork(FaultPlan(), memnet) as net:
        a, b = net.bind(), net.bind()
        assert a.try_send_to(b"x", b.local_addr)
        assert drain(b) == [b"x"]
        a.shutdown()
        assert net.statistics() == FaultStatistics(sent=1, received=1, delivered=2)


def test_exit_shuts_down_and_joins_every_socket(memnet: BindableNetwork) -> None:
    with FaultyNetwork(FaultPlan(delay=0.5), memnet) as net:
        a, b = net.bind(), net.bind()
        assert a.try_send_to(b"held", b.local_addr)
    assert a.is_shutdown
    assert b.is_shutdown
    assert net.join(1.0)


def test_bind_checks_the_plan(memnet: BindableNetwork) -> None:
    with FaultyNetwork(network=memnet) as net, pytest.raises(TypeError, match="FaultPlan"):
        net.bind(plan="lossy")  # type: ignore[arg-type]


def test_over_the_real_inproc_network() -> None:
    if getattr(chrysalis.datagram, "InprocNetwork", None) is None:
        pytest.skip("chrysalis.datagram has no InprocNetwork yet (carrier not installed)")
    plan = FaultPlan(seed=3, loss=0.2, reorder=0.3, reorder_timeout=0.01)
    with FaultyNetwork(plan) as net:
        a, b = net.bind(), net.bind()
        sent = [i.to_bytes(1, "big") for i in range(50)]
        for item in sent:
            assert a.try_send_to(item, b.local_addr)
        got: list[bytes] = []
        deadline = time.monotonic() + 5.0
        while len(got) < 50 - a.statistics().dropped_loss and time.monotonic() < deadline:
            woken = threading.Event()
            b.add_recv_waker(woken.set)
            woken.wait(0.05)
            got.extend(drain(b))
        assert sorted(got) == sorted(set(got))
        assert len(got) == 50 - a.statistics().dropped_loss
        assert set(got) <= set(sent)
