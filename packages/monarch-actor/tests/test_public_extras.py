"""Public names of Monarch 0.7.0 that were missing: ``Uid``, ``returns_future``,
``ChannelTransport``/``enable_transport``, ``HostMesh.with_python_executable``,
``ProcMesh.logging_option``, ``run_worker_loop_until_shutdown``,
``start_worker_loop_forever`` and ``attach``.

Tests that need a fresh client (``enable_transport`` must come first) run a client script in a
subprocess; the others use this process's client and stop what they spawn.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import pickle
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import (
    ChannelTransport,
    Future,
    HostMesh,
    ProcMesh,
    Uid,
    attach,
    attach_to_workers,
    enable_transport,
    returns_future,
    this_host,
)
from monarch.actor._runtime.client import client
from monarch.actor._transport.lane import TcpLane, UnixLane
from monarch.actor._transport.node import NodeTransportSettings
from monarch.config import configured

sys.path.insert(0, str(Path(__file__).parent))  # workers import extras_actors by name
from extras_actors import Probe
from test_lanes import on_lane
from test_node_transport import Cluster

T = 30.0


@pytest.fixture
def stopped() -> Iterator[list[ProcMesh]]:
    meshes: list[ProcMesh] = []
    yield meshes
    for mesh in meshes:
        mesh.stop().get(timeout=T)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _run_client(script: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )


# -- Uid --------------------------------------------------------------------------------------
def test_uid_text_forms_and_equality_follow_the_reference() -> None:
    assert str(Uid.instance_from_value(42, "w")) == "w<J>"
    assert str(Uid.instance_from_value(42)) == "<J>"
    assert str(Uid.instance_from_value(2**64 - 1)) == "<JPwcyDCgEup>"
    assert Uid.instance_from_value(42, "w") == Uid.instance_from_value(42, "z")  # value only
    singleton = Uid.from_string("service")
    assert (singleton.label, singleton.is_singleton, singleton.instance_value) == (
        "service",
        True,
        None,
    )
    assert singleton != Uid.from_string("other")
    fresh = Uid.instance("worker")
    assert fresh.label == "worker"
    assert fresh.is_instance
    assert fresh != Uid.instance("worker")
    assert Uid.from_string(str(fresh)) == fresh
    assert pickle.loads(pickle.dumps(fresh)) == fresh
    assert Uid.anonymous().label is None
    assert Uid.from_string("<1J>").instance_value == 42


@pytest.mark.parametrize(
    "bad", ["", "_foo", "Foo", "foo-", "a" * 64, "foo.bar", "<>", "<l>", "<0>", "x<J>y", "foo<J"]
)
def test_uid_refuses_malformed_text(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid uid"):
        Uid.from_string(bad)


def test_uid_refuses_bad_construction() -> None:
    with pytest.raises(TypeError):
        Uid()
    with pytest.raises(ValueError, match="invalid uid label"):
        Uid.instance("Bad")
    with pytest.raises(OverflowError):
        Uid.instance_from_value(2**64)
    with pytest.raises(OverflowError):
        Uid.instance_from_value(-1)


labels = st.from_regex(r"[a-z]([a-z0-9_-]{0,61}[a-z0-9])?", fullmatch=True)


@given(st.integers(0, 2**64 - 1), st.none() | labels)
def test_uid_text_round_trips(value: int, label: str | None) -> None:
    uid = Uid.instance_from_value(value, label)
    again = Uid.from_string(str(uid))
    assert again == uid
    assert hash(again) == hash(uid)
    assert again.label == label
    assert again.instance_value == value


# -- returns_future ---------------------------------------------------------------------------
def test_returns_future_starts_its_body_at_the_first_observation() -> None:
    ran: list[str] = []
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")

    @returns_future
    async def work(x: int) -> int:
        ran.append(marker.get())
        await asyncio.sleep(0)
        return x * 2

    marker.set("caller's")
    future = work(21)
    assert isinstance(future, Future)
    assert ran == []  # calling does not start the body
    assert future.get(timeout=T) == 42
    assert future.get() == 42  # the outcome is cached: the body ran once
    assert ran == ["caller's"]

    async def main() -> int:
        return await work(5)

    assert asyncio.run(main()) == 10


def test_returns_future_errors_and_timeouts() -> None:
    cleaned = threading.Event()

    @returns_future
    async def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        fails().get(timeout=T)

    @returns_future
    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    future = slow()
    with pytest.raises(TimeoutError):
        future.get(timeout=0.2)
    assert cleaned.is_set()  # the owning get cancelled the body and ran its cleanup
    with pytest.raises(TimeoutError):
        future.get()  # one terminal outcome for every observer

    @returns_future
    async def own_timeout() -> None:
        raise TimeoutError("the body's own deadline passed")

    # The body's own TimeoutError is its outcome, not the get's expiry.
    with pytest.raises(TimeoutError, match="the body's own deadline passed"):
        own_timeout().get(timeout=T)

    def not_async() -> int:
        return 1

    with pytest.raises(TypeError, match="async function"):
        returns_future(not_async)  # type: ignore[arg-type]


# -- enable_transport -------------------------------------------------------------------------
def test_enable_transport_refuses_what_is_not_provided_here() -> None:
    for unsupported in (ChannelTransport.MetaTlsWithHostname, ChannelTransport.Tls, "metatls"):
        with pytest.raises(NotImplementedError, match="supported"):
            enable_transport(unsupported)
    with pytest.raises(NotImplementedError, match="explicit addresses"):
        enable_transport("tcp://127.0.0.1:8080")
    with pytest.raises(ValueError, match="neither a transport"):
        enable_transport("random_string")
    with pytest.raises(TypeError):
        enable_transport(42)  # type: ignore[arg-type]


def test_a_tcp_transport_makes_lanes_tcp_on_one_host() -> None:
    with configured(default_transport=ChannelTransport.TcpWithLocalhost, force_quic=False):
        cluster = Cluster(NodeTransportSettings(dial_timeout=2.0))
        try:
            root = cluster.add()
            a, b = cluster.add(root), cluster.add(root)
            on_lane(a, b)
            assert isinstance(a.transport._peers[b.transport.pid.raw].lane, TcpLane)
        finally:
            cluster.close()
    cluster = Cluster(NodeTransportSettings(dial_timeout=2.0))
    try:  # the default: a Unix lane between processes of one host
        with configured(force_quic=False):
            root = cluster.add()
            a, b = cluster.add(root), cluster.add(root)
            on_lane(a, b)
        assert isinstance(a.transport._peers[b.transport.pid.raw].lane, UnixLane)
    finally:
        cluster.close()


@pytest.mark.slow
def test_enable_transport_reaches_the_workers_and_is_set_once() -> None:
    done = _run_client(
        """
        from monarch.actor import ChannelTransport, enable_transport, this_host
        from extras_actors import Probe
        if __name__ == "__main__":
            enable_transport("quic")
            enable_transport(ChannelTransport.Quic)  # the same one again: no-op
            try:
                enable_transport("tcp")
            except RuntimeError as exc:
                print("SECOND", "Only one transport" in str(exc))
            procs = this_host().spawn_procs({"gpus": 2})
            probe = procs.spawn("probe", Probe)
            print("QUIC", probe.slice(gpus=0).env.call_one("MONARCH_FORCE_QUIC").get(30))
            print("SETTING", probe.slice(gpus=1).setting.call_one("default_transport").get(30))
            print("SUM", probe.add.call(1, 2).get(timeout=30).values())
            procs.stop().get(timeout=30)
        """
    )
    assert "SECOND True" in done.stdout, done
    assert "QUIC 1" in done.stdout, done
    assert "SETTING ChannelTransport.Quic" in done.stdout, done
    assert "SUM [3, 3]" in done.stdout, done


@pytest.mark.slow
def test_enable_transport_after_the_client_started_is_refused() -> None:
    done = _run_client(
        """
        from monarch.actor import enable_transport, this_host
        if __name__ == "__main__":
            this_host()
            from monarch.actor._runtime.client import client
            client()
            try:
                enable_transport("tcp")
            except RuntimeError as exc:
                print("REFUSED", "before any other calls" in str(exc))
        """
    )
    assert "REFUSED True" in done.stdout, done


# -- HostMesh.with_python_executable ------------------------------------------------------------
@pytest.mark.slow
def test_with_python_executable_starts_the_workers_with_that_interpreter(
    tmp_path: Path, stopped: list[ProcMesh]
) -> None:
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexport M_ALT_PYTHON=yes\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    host = this_host().with_python_executable(str(wrapper))
    assert isinstance(host, HostMesh)
    procs = host.spawn_procs({"gpus": 2})
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    assert probe.env.call("M_ALT_PYTHON").get(timeout=T).values() == ["yes", "yes"]
    plain = this_host().spawn_procs({"gpus": 1})  # the original handle is unchanged
    stopped.append(plain)
    other: Any = plain.spawn("probe", Probe)
    assert other.env.call_one("M_ALT_PYTHON").get(timeout=T) is None
    with pytest.raises(TypeError):
        this_host().with_python_executable("")


@pytest.mark.slow
def test_with_a_missing_interpreter_initialized_fails(stopped: list[ProcMesh]) -> None:
    procs = this_host().with_python_executable("/nonexistent/python3").spawn_procs({"gpus": 1})
    stopped.append(procs)
    with pytest.raises(Exception, match="could not be started"):
        procs.initialized.get(timeout=T)


# -- ProcMesh.logging_option ------------------------------------------------------------------
@pytest.mark.slow
def test_logging_option_sets_the_level_of_every_process(stopped: list[ProcMesh]) -> None:
    procs = this_host().spawn_procs({"gpus": 2})
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    asyncio.run(procs.logging_option(level=logging.DEBUG))
    assert probe.root_level.call().get(timeout=T).values() == [logging.DEBUG] * 2
    asyncio.run(procs.logging_option(level=logging.ERROR))
    assert probe.root_level.call().get(timeout=T).values() == [logging.ERROR] * 2
    with pytest.raises(ValueError, match="Invalid logging level"):
        asyncio.run(procs.logging_option(level=256))
    with pytest.raises(ValueError, match="stream_to_client"):
        asyncio.run(procs.logging_option(aggregate_window_sec=3))
    with configured(enable_log_forwarding=False), pytest.warns(UserWarning, match="forwarding"):
        asyncio.run(procs.logging_option(stream_to_client=True, level=logging.INFO))
    with configured(enable_log_forwarding=True):
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=1))


# -- worker loops -------------------------------------------------------------------------------
def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ca_dir() -> Path:
    layer = client().node_layer
    ca_dir = layer.cluster_ca_dir
    assert ca_dir is not None
    return ca_dir


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["start_worker_loop_forever", "run_worker_loop_until_shutdown"])
def test_a_worker_loop_serves_a_client_until_it_shuts_the_host_down(entry: str) -> None:
    ca_dir = _ca_dir()
    address = f"udp://127.0.0.1:{_free_udp_port()}"
    call = (
        f"start_worker_loop_forever(address={address!r}, ca={str(ca_dir)!r})"
        if entry == "start_worker_loop_forever"
        else f"run_worker_loop_until_shutdown(address={address!r}, ca={str(ca_dir)!r})"
    )
    started = "print('LISTENING', flush=True)\n    " if entry.startswith("start") else ""
    ended = "lifetime.get()\n    " if entry.startswith("start") else ""
    script = (
        "import logging, sys\n"
        f"from monarch.actor import {entry}\n"
        "if __name__ == '__main__':\n"
        "    logging.basicConfig(stream=sys.stdout, format='%(message)s')\n"
        "    logging.getLogger('monarch.actor.attach').setLevel(logging.INFO)\n"
        f"    lifetime = {call}\n"
        f"    {started}{ended}print('RETURNED', flush=True)\n"
    )
    daemon = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()  # the loop logs once it listens
        assert "listening on" in line, line
        if entry.startswith("start"):
            assert daemon.stdout.readline().strip() == "LISTENING"
        hosts = attach_to_workers(workers=[address], ca=ca_dir)
        procs = hosts.spawn_procs({"gpus": 2})
        probe: Any = procs.spawn("probe", Probe)
        assert probe.add.call(2, 3).get(timeout=T).values() == [5, 5]
        hosts.shutdown().get(timeout=T)
        out, _ = daemon.communicate(timeout=T)
        daemon.stdout.close()
        assert "RETURNED" in out  # the loop ended and the program went on
        assert daemon.returncode == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(T)


# -- attach -------------------------------------------------------------------------------------
_ROOT_NODE = """
import asyncio, sys, time
from pathlib import Path
from chrysalis.node import Node
from chrysalis.quic import DevelopmentIdentityProvider

async def main() -> None:
    identity = DevelopmentIdentityProvider(Path(sys.argv[1])).issue_identity()
    async with Node.serve(identity, "udp://127.0.0.1:0") as node:
        print(node.local_addr, flush=True)
        # Routes to the client and to its worker, through it: looked at after every commit of
        # the directory (a route is projected before its revision is announced), so a worker
        # that joins and leaves between two looks is still seen; the most ever seen is printed.
        deadline = time.monotonic() + 60
        watch = node.nameserver.revisions
        most = node.statistics().routes
        while most < 2 and time.monotonic() < deadline:
            seen = watch.version
            try:
                await asyncio.wait_for(watch.wait_change(seen), deadline - time.monotonic())
            except TimeoutError:
                break
            most = max(most, node.statistics().routes)
        print("ROUTES", most, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@pytest.mark.slow
def test_attach_joins_the_client_under_an_existing_node(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    root = subprocess.Popen(
        [sys.executable, "-c", _ROOT_NODE, str(ca_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert root.stdout is not None
        address = root.stdout.readline().strip()
        assert address.startswith("udp://127.0.0.1:"), address
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(f"""
                from monarch.actor import attach, this_host
                from monarch.actor._runtime.client import client
                from extras_actors import Probe
                if __name__ == "__main__":
                    attach({address!r})
                    attach({address!r})  # the same address again: no-op
                    procs = this_host().spawn_procs({{"gpus": 1}})
                    probe = procs.spawn("probe", Probe)
                    print("SUM", probe.add.call_one(2, 2).get(timeout=30))
                    parent = client().node_layer.node.statistics().parent
                    print("JOINED", parent is not None)
                    try:
                        attach("udp://127.0.0.1:9")
                    except RuntimeError as exc:
                        print("OTHER", "already attached" in str(exc))
                    procs.stop().get(timeout=30)
            """),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env=dict(_env(), CHRYSALIS_DEV_CA_DIR=str(ca_dir)),
            check=False,
        )
        assert "SUM 4" in done.stdout, done
        assert "JOINED True" in done.stdout, done
        assert "OTHER True" in done.stdout, done
        line = root.stdout.readline().split()
        assert line[0] == "ROUTES"
        assert int(line[1]) >= 2, line  # the root routes to the client and its worker
    finally:
        root.kill()
        root.wait(T)
        if root.stdout is not None:
            root.stdout.close()
        if root.stdin is not None:
            root.stdin.close()


def test_attach_refuses_bad_addresses_and_a_started_client() -> None:
    for bad in ("tcp://127.0.0.1:8080", "ipc:///tmp/sock", "udp://127.0.0.1:0"):
        with pytest.raises(ValueError, match="udp://HOST:PORT"):
            attach(bad)
    this_host().spawn_procs({"gpus": 1}).stop().get(timeout=T)  # this client's node runs
    with pytest.raises(RuntimeError, match="before the client starts"):
        attach("udp://127.0.0.1:9")
