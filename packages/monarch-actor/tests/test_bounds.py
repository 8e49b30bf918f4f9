"""Every queue has a bound, and hitting it gives a documented exception."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    Channel,
    Port,
    PortOverflowError,
    ProcMesh,
    SupervisionError,
    endpoint,
)
from monarch.actor._base.errors import MessageTooLargeError
from monarch.config import clear_runtime_config, configure, get_runtime_config

Procs = Callable[..., ProcMesh]
T = 5.0


class Slow(Actor):
    @endpoint
    def block(self, ready: Port[Port[None]]) -> None:
        """Tell the caller a release port, then block this (sync) actor until it is used."""
        release, released = Channel[None].open()
        ready.send(release)
        released.recv().get(timeout=T)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


@pytest.fixture(autouse=True)
def restore_config() -> Iterator[None]:
    saved = get_runtime_config()
    yield
    clear_runtime_config()
    configure(**saved)


def test_a_full_mailbox_rejects_calls_with_a_supervision_error(procs: Procs) -> None:
    configure(actor_mailbox_capacity=3)
    slow = procs(gpus=1).spawn("slow", Slow)
    ready, releases = Channel[Port[None]].open()
    blocking = slow.block.call_one(ready)
    release = releases.recv().get(timeout=T)  # the actor is busy; its mailbox is empty
    queued = [slow.echo.call_one(i) for i in range(6)]
    for future in queued[3:]:
        with pytest.raises(SupervisionError, match="mailbox is full"):
            future.get(timeout=T)
    assert not any(future.done() for future in queued[:3])
    release.send(None)
    blocking.get(timeout=T)
    assert [future.get(timeout=T) for future in queued[:3]] == [0, 1, 2]
    assert slow.echo.call_one("after").get(timeout=T) == "after"


def test_a_mailbox_is_bounded_by_bytes_too(procs: Procs) -> None:
    """Queued calls are bounded by their bytes (``actor_mailbox_max_bytes``), not only by their
    number: a sender gets the same clear ``SupervisionError`` as for a full count, and one
    message larger than the bound still enters an empty mailbox."""
    mib = 1024 * 1024
    configure(actor_mailbox_max_bytes=3 * mib + mib // 2)
    slow = procs(gpus=1).spawn("slow", Slow)
    ready, releases = Channel[Port[None]].open()
    blocking = slow.block.call_one(ready)
    release = releases.recv().get(timeout=T)  # the actor is busy; its mailbox is empty
    queued = [slow.echo.call_one(bytes([i]) * mib) for i in range(5)]
    for future in queued[3:]:
        with pytest.raises(SupervisionError, match=r"mailbox is full.*actor_mailbox_max_bytes"):
            future.get(timeout=T)
    assert not any(future.done() for future in queued[:3])
    release.send(None)
    blocking.get(timeout=T)
    assert [future.get(timeout=T)[:1] for future in queued[:3]] == [b"\x00", b"\x01", b"\x02"]
    big = bytes(8 * mib)  # alone in an empty mailbox: accepted although over the bound
    assert len(slow.echo.call_one(big).get(timeout=T)) == 8 * mib


def test_a_port_receiver_queue_overflows_into_an_error() -> None:
    configure(port_queue_capacity=2)
    port, receiver = Channel[int].open()
    for i in range(5):
        port.send(i)
    # A round trip through the same runtime loop: FIFO, so the five sends were handled first.
    probe, probed = Channel[str].open()
    probe.send("after")
    assert probed.recv().get(timeout=T) == "after"
    assert receiver.recv().get(timeout=T) == 0
    assert receiver.recv().get(timeout=T) == 1
    with pytest.raises(PortOverflowError, match="3 messages were dropped"):
        receiver.recv().get(timeout=T)


def test_pending_recv_calls_are_bounded() -> None:
    configure(port_queue_capacity=2)
    _, receiver = Channel[int].open()
    receiver.recv()
    receiver.recv()
    with pytest.raises(PortOverflowError, match="pending recv"):
        receiver.recv().get(timeout=T)


def test_open_ports_per_process_are_bounded() -> None:
    from monarch.actor._runtime.client import client

    configure(max_open_ports=client().runtime.open_ports + 1)
    keep = Channel[int].open()
    with pytest.raises(PortOverflowError, match="open ports"):
        Channel[int].open()
    keep[1].close()


def test_actors_per_process_are_bounded(procs: Procs) -> None:
    configure(max_actors_per_proc=1)
    pm = procs(gpus=1)
    pm.spawn("first", Slow).initialized.get(timeout=T)
    second = pm.spawn("second", Slow)
    with pytest.raises(RuntimeError, match="already runs 1 actors"):
        second.initialized.get(timeout=T)


def test_oversize_messages_fail_at_the_sender(procs: Procs) -> None:
    slow = procs(gpus=1).spawn("slow", Slow)
    configure(codec_max_frame_length=64 * 1024)
    with pytest.raises(MessageTooLargeError, match="exceeds the frame limit"):
        slow.echo.call_one(b"x" * 100_000)
    clear_runtime_config()
    assert slow.echo.call_one(b"ok").get(timeout=T) == b"ok"


def test_stopping_meshes_releases_threads_and_ownership_records(
    wait_until: Callable[..., None],
) -> None:
    import threading

    from monarch.actor import _local_proc_mesh
    from monarch.actor._runtime.client import client

    root = client().root
    baseline_threads = threading.active_count()
    baseline_owned = len(root.owned)
    for _ in range(5):
        pm = _local_proc_mesh(per_host={"gpus": 2})
        pm.spawn("slow", Slow).echo.call(1).get(timeout=T)
        pm.stop().get(timeout=T)
    wait_until(lambda: threading.active_count() <= baseline_threads)
    pm = _local_proc_mesh(per_host={"gpus": 1})
    assert len(root.owned) <= baseline_owned + 1  # stopped meshes were pruned
    pm.stop().get(timeout=T)
