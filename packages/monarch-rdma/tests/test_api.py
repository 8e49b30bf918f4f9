"""Spec section 3 inside the client process: validation rules, error types, backends, warnings,
configuration keys, pickling and the action's conflict rules."""

from __future__ import annotations

import array
import asyncio
import gc
import pickle
import subprocess
import sys
import warnings
import weakref

import pytest

import monarch.rdma
from monarch.config import configured, settings
from monarch.rdma import (
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    _buffer,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")
T = 30.0


def test_the_exports_are_the_references() -> None:
    assert sorted(monarch.rdma.__all__) == sorted(
        [
            "RDMABuffer",
            "RDMAAction",
            "is_ibverbs_available",
            "is_rdma_available",
            "get_rdma_backend",
            "RDMATcpFallbackWarning",
            "RDMAReadTransferWarning",
            "RDMAWriteTransferWarning",
        ]
    )
    for warning in (RDMATcpFallbackWarning, RDMAReadTransferWarning, RDMAWriteTransferWarning):
        assert issubclass(warning, Warning)


def test_importing_monarch_rdma_does_not_import_torch() -> None:
    code = "import sys, monarch.rdma; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_configuration_keys_exist_with_their_environment_variables() -> None:
    known = settings()
    expected = {
        "rdma_allow_tcp_fallback": ("MONARCH_RDMA_ALLOW_TCP_FALLBACK", True),
        "rdma_disable_ibverbs": ("MONARCH_RDMA_DISABLE_IBVERBS", False),
        "rdma_max_chunk_size_mb": ("MONARCH_RDMA_MAX_CHUNK_SIZE_MB", 64),
        "rdma_tcp_fallback_parallelism": ("MONARCH_RDMA_TCP_FALLBACK_PARALLELISM", 1),
        "rdma_net_chunks_in_flight": ("MONARCH_RDMA_NET_CHUNKS_IN_FLIGHT", 4),
    }
    for name, (env, default) in expected.items():
        assert known[name].env == env, name
        assert known[name].default == default, name


def test_the_environment_configures_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_rdma_backend() == "tcp"
    monkeypatch.setenv("MONARCH_RDMA_ALLOW_TCP_FALLBACK", "false")
    assert get_rdma_backend() == "none"


def test_backends_and_the_deprecated_probe() -> None:
    assert is_ibverbs_available() is False  # no device on this machine kind
    assert get_rdma_backend() == "tcp"
    with configured(rdma_allow_tcp_fallback=False):
        assert get_rdma_backend() == "none"
        with pytest.raises(RuntimeError, match="rdma_allow_tcp_fallback=True"):
            RDMABuffer(memoryview(bytearray(8)))
    with configured(rdma_disable_ibverbs=True):
        assert get_rdma_backend() == "tcp"
    with pytest.warns(DeprecationWarning, match="is_rdma_available is deprecated"):
        assert is_rdma_available() is False


def test_the_fallback_warning_is_emitted_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_buffer, "_fallback_warned", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = RDMABuffer(memoryview(bytearray(8)))
        second = RDMABuffer(memoryview(bytearray(8)))
    assert [w.category for w in seen] == [RDMATcpFallbackWarning]
    first.drop().get(timeout=T)
    second.drop().get(timeout=T)


def test_shapes_sizes_and_types_are_refused_with_value_error() -> None:
    memory = bytearray(16)
    with pytest.raises(ValueError, match="1d contiguous"):
        RDMABuffer(memoryview(memory).cast("B", (4, 4)))
    with pytest.raises(ValueError, match="1d contiguous"):
        RDMABuffer(memoryview(memory)[::2])
    with pytest.raises(ValueError, match="1d contiguous"):
        RDMABuffer(memory)  # not a memoryview
    with pytest.raises(ValueError, match=r"Cannot create RDMABuffer with size 0\."):
        RDMABuffer(memoryview(bytearray()))
    buffer = RDMABuffer(memoryview(memory))
    with pytest.raises(ValueError, match="must be >= RDMA buffer size"):
        buffer.read_into(memoryview(bytearray(15)))
    with pytest.raises(ValueError, match="must be <= RDMA buffer size"):
        buffer.write_from(memoryview(bytearray(17)))
    with pytest.raises(ValueError, match="1d contiguous"):
        buffer.read_into(memoryview(bytearray(32))[::2])
    with pytest.raises(ValueError, match="read-only"):
        buffer.read_into(memoryview(bytes(16)))
    buffer.drop().get(timeout=T)


def test_timeouts_are_whole_seconds_checked_before_any_work() -> None:
    memory = bytearray(b"0123456789abcdef")
    buffer = RDMABuffer(memoryview(memory))
    dst = memoryview(bytearray(16))
    with pytest.raises(TypeError):
        buffer.read_into(dst, timeout=1.5)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        buffer.write_from(dst, timeout=-1)
    with pytest.raises(OverflowError):
        RDMAAction().submit(timeout=1 << 64)
    RDMAAction().submit(timeout=(1 << 64) - 1).get(timeout=T)  # the largest is accepted
    buffer.read_into(dst, timeout=5).get(timeout=T)
    assert bytes(dst) == bytes(memory)
    buffer.drop().get(timeout=T)


def test_memory_of_any_format_counts_in_bytes() -> None:
    memory = bytearray(range(16))
    buffer = RDMABuffer(memoryview(memory).cast("I"))  # four 4-byte items
    assert buffer.size() == 16
    dst = bytearray(16)
    buffer.read_into(memoryview(dst).cast("H")).get(timeout=T)
    assert dst == memory
    buffer.write_from(memoryview(bytes([9] * 8))).get(timeout=T)  # read-only sources are fine
    assert memory[:8] == bytes([9] * 8)
    assert memory[8:] == bytes(range(8, 16))
    buffer.drop().get(timeout=T)


def test_the_handle_pickles_without_the_memory_and_still_works() -> None:
    memory = bytearray(b"pickled handle!!")
    buffer = RDMABuffer(memoryview(memory))
    copy = pickle.loads(pickle.dumps(buffer))
    assert (copy.size(), copy.owner, copy.backend, copy.transport) == (
        16,
        buffer.owner,
        "tcp",
        "net",
    )
    assert b"pickled handle" not in pickle.dumps(buffer)
    dst = bytearray(16)
    copy.read_into(memoryview(dst)).get(timeout=T)
    assert dst == memory
    copy.drop().get(timeout=T)
    with pytest.raises(RuntimeError, match="not registered"):
        buffer.read_into(memoryview(dst)).get(timeout=T)


def test_the_buffer_keeps_its_memory_alive_until_dropped() -> None:
    memory = array.array("b", b"only the buffer holds me")
    alive = weakref.ref(memory)
    buffer = RDMABuffer(memoryview(memory))
    del memory
    gc.collect()
    assert alive() is not None  # the registration holds it
    dst = bytearray(buffer.size())
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert dst == b"only the buffer holds me"
    buffer.drop().get(timeout=T)
    gc.collect()
    assert alive() is None  # released by the drop


def test_futures_are_awaitable() -> None:
    memory = bytearray(b"awaited")
    buffer = RDMABuffer(memoryview(memory))
    dst = bytearray(7)

    async def main() -> None:
        await buffer.read_into(memoryview(dst))
        await buffer.drop()

    asyncio.run(main())
    assert dst == memory


def test_an_action_refuses_conflicting_local_ranges_at_once() -> None:
    remote = RDMABuffer(memoryview(bytearray(8)))
    other = RDMABuffer(memoryview(bytearray(8)))
    local = bytearray(16)
    view = memoryview(local)
    action = RDMAAction().read_remote(view[:8], remote)
    assert action.read_remote(view[8:], other) is action  # adjacent, chainable
    with pytest.raises(ValueError, match="overlaps"):
        action.read_remote(view[4:12], remote)  # two writers of local bytes
    with pytest.raises(ValueError, match="overlaps"):
        action.write_remote(remote, view[:8])  # a source that is also a destination
    sources = RDMAAction().write_remote(remote, view[:8]).write_remote(other, view[:8])
    local[:8] = b"shared!!"
    sources.submit().get(timeout=T)  # one local range as the source of several writes
    dst = bytearray(8)
    other.read_into(memoryview(dst)).get(timeout=T)
    assert dst == b"shared!!"
    with pytest.raises(TypeError):
        RDMAAction().read_remote(view, b"not a buffer")  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        RDMAAction().fetch_add(remote, view[:8], 1)
    with pytest.raises(NotImplementedError):
        RDMAAction().compare_and_swap(remote, view[:8], 0, 1)
    remote.drop().get(timeout=T)
    other.drop().get(timeout=T)


def test_a_failed_operation_fails_the_submission() -> None:
    alive = RDMABuffer(memoryview(bytearray(b"alive")))
    gone = RDMABuffer(memoryview(bytearray(b"gone!")))
    gone.drop().get(timeout=T)
    first, second = bytearray(5), bytearray(5)
    action = RDMAAction().read_remote(memoryview(first), alive)
    action.read_remote(memoryview(second), gone)
    with pytest.raises(RuntimeError, match="not registered"):
        action.submit().get(timeout=T)
    assert first == b"alive"  # the others still ran
    alive.drop().get(timeout=T)


def test_torch_tensors_are_accepted_when_torch_is_installed() -> None:
    torch = pytest.importorskip("torch")
    source = torch.arange(10, dtype=torch.float32)
    buffer = RDMABuffer(source.view(torch.uint8).flatten())
    assert buffer.size() == 40
    dst = torch.zeros(10, dtype=torch.float32)
    buffer.read_into(dst.view(torch.uint8).flatten()).get(timeout=T)
    assert torch.equal(dst, source)
    with pytest.raises(ValueError, match="1d contiguous"):
        RDMABuffer(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="1d contiguous"):
        RDMABuffer(torch.zeros(8)[::2])
    buffer.drop().get(timeout=T)
