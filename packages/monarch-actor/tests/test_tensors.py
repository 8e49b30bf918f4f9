"""torch tensors travel with their storage as one out-of-band buffer (issue 23).

In-process through the codec (what a transport does: the buffers copied once, then decoded) and
through a real mesh of worker processes, over direct lanes and with every message on QUIC.
"""

from __future__ import annotations

import ctypes
import mmap
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import ProcMesh, this_host
from monarch.actor._base.codec import OOB_THRESHOLD, decode, detach_buffers, encode

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))  # workers import tensor_actors by name
from tensor_actors import TensorEcho  # noqa: E402

T = 30.0

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def transmit(value: Any) -> Any:
    payload = encode(value)
    return decode(payload.data, detach_buffers(payload.buffers, payload.kinds), payload.kinds)


def make(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> Any:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=gen) * 50
    if dtype.is_complex:
        return torch.complex(base, base.flip(-1) if base.dim() else base).to(dtype)
    return base.to(dtype)


def assert_same(received: Any, sent: Any) -> None:
    assert type(received) is type(sent)
    assert received.dtype == sent.dtype
    assert received.shape == sent.shape
    assert received.stride() == sent.stride()
    assert received.requires_grad == sent.requires_grad
    assert torch.equal(received.detach(), sent.detach())


def address(buffer: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 9), max_size=3)))
    lead = draw(st.sampled_from([1, 2, 400]))  # 400 makes most spans leave the stream
    tensor = make((lead, *shape), dtype, draw(st.integers(0, 2**16)))
    view = draw(st.sampled_from(["whole", "transpose", "step", "narrow", "index"]))
    if view == "transpose" and tensor.dim() >= 2:
        tensor = tensor.transpose(0, tensor.dim() - 1)
    elif view == "step":
        tensor = tensor[::3]
    elif view == "narrow" and tensor.shape[0] > 1:
        tensor = tensor[1:]
    elif view == "index":
        tensor = tensor[0]
    return tensor


@given(tensors())
def test_round_trip_keeps_dtype_shape_strides_and_values(tensor: Any) -> None:
    assert_same(transmit(tensor), tensor)


@given(tensors())
def test_round_trip_matches_plain_pickling(tensor: Any) -> None:
    ours, theirs = transmit(tensor), pickle.loads(pickle.dumps(tensor))
    assert_same(ours, theirs)


def test_a_large_tensor_leaves_the_stream_as_one_buffer() -> None:
    tensor = torch.ones(1 << 20, dtype=torch.float32)  # 4 MiB
    payload = encode(tensor)
    assert len(payload.data) < 512
    assert [b.nbytes for b in payload.buffers] == [tensor.nbytes]
    assert not payload.buffers[0].readonly  # the receiver gets a writable bytearray


def test_a_view_sends_only_the_span_of_its_elements_without_a_copy() -> None:
    base = torch.arange(100_000, dtype=torch.float64)
    view = base[10_000:20_000:2]
    payload = encode(view)
    (buffer,) = payload.buffers
    assert buffer.nbytes == (4_999 * 2 + 1) * 8  # from the first element to the last
    sent_from = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    assert sent_from == base.data_ptr() + 10_000 * 8  # the sender's memory, not a copy
    received = transmit(view)
    assert_same(received, view)
    assert received.storage_offset() == 0


def test_a_transposed_tensor_keeps_its_strides() -> None:
    tensor = make((300, 7), torch.float32).t()
    payload = encode(tensor)
    assert len(payload.buffers) == 1
    received = transmit(tensor)
    assert received.stride() == (1, 7)
    assert_same(received, tensor)


def test_the_receiver_rebuilds_over_the_received_bytearray_without_a_copy() -> None:
    tensor = make((1 << 12,), torch.float32)
    payload = encode(tensor)
    received = detach_buffers(payload.buffers, payload.kinds)
    assert type(received[0]) is bytearray
    rebuilt = decode(payload.data, received, payload.kinds)
    assert rebuilt.data_ptr() == address(received[0])
    rebuilt[0] = 123.0  # writable, and the memory is the received buffer
    assert torch.frombuffer(received[0], dtype=torch.float32)[0] == 123.0


def test_the_receiver_rebuilds_over_a_received_mapping_without_a_copy() -> None:
    tensor = make((1 << 16,), torch.float64)
    payload = encode(tensor)
    mapping = mmap.mmap(-1, payload.buffers[0].nbytes)
    mapping[:] = payload.buffers[0]
    rebuilt = decode(payload.data, [mapping], payload.kinds)
    assert_same(rebuilt, tensor)
    assert rebuilt.data_ptr() == ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    del mapping  # the tensor keeps the memory alive
    assert_same(rebuilt, tensor)


def test_a_read_only_received_buffer_is_copied_into_a_writable_tensor() -> None:
    tensor = make((1 << 12,), torch.int32)
    payload = encode(tensor)
    rebuilt = decode(payload.data, [bytes(b) for b in payload.buffers], payload.kinds)
    assert_same(rebuilt, tensor)
    rebuilt.add_(1)  # writable
    assert torch.equal(rebuilt, tensor + 1)


def test_small_tensors_stay_in_band_and_are_writable() -> None:
    tensor = torch.arange(10, dtype=torch.int16)
    payload = encode(tensor)
    assert payload.buffers == ()
    assert len(payload.data) < OOB_THRESHOLD
    received = transmit(tensor)
    assert_same(received, tensor)
    received.add_(1)


def test_aliasing_is_what_plain_pickling_gives() -> None:
    tensor = torch.arange(2000, dtype=torch.float32)
    a, b, view = transmit([tensor, tensor, tensor[5:]])
    assert a is b
    assert view.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    p_a, p_b, p_view = pickle.loads(pickle.dumps([tensor, tensor, tensor[5:]]))
    assert p_a is p_b
    assert p_view.untyped_storage().data_ptr() != p_a.untyped_storage().data_ptr()


def test_requires_grad_zero_dim_empty_and_parameters() -> None:
    leaf = torch.randn(2000, requires_grad=True)
    assert_same(transmit(leaf), leaf)
    assert_same(transmit(torch.tensor(2.5)), torch.tensor(2.5))
    empty = torch.zeros(0, 5, dtype=torch.int64)
    assert_same(transmit(empty), empty)
    param = torch.nn.Parameter(torch.randn(3000))
    received = transmit(param)
    assert_same(received, param)
    assert len(encode(param).buffers) == 1


def test_other_tensors_keep_torchs_own_reducer() -> None:
    sparse = torch.eye(3).to_sparse()
    assert torch.equal(transmit(sparse).to_dense(), torch.eye(3))
    tagged = torch.ones(3)
    setattr(tagged, "note", "kept")  # noqa: B010 (a Python attribute on a tensor)
    assert transmit(tagged).note == "kept"
    conj = torch.complex(torch.ones(2), torch.ones(2)).conj()
    assert torch.equal(transmit(conj), conj)


def test_a_truncated_tensor_buffer_is_an_unpickling_error() -> None:
    payload = encode(torch.ones(2048))
    with pytest.raises(pickle.UnpicklingError, match="bytes"):
        decode(payload.data, [bytearray(100)], payload.kinds)


def test_the_codec_never_imports_torch_for_other_values() -> None:
    code = textwrap.dedent(
        """
        import sys
        from monarch.actor._base.codec import decode, encode
        payload = encode([1, b"x" * 100_000, {"a": bytearray(5000)}])
        decode(payload.data, list(payload.buffers), payload.kinds)
        import monarch.actor
        print("torch" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False", done


@pytest.fixture(scope="module")
def echo(transport_mode: str) -> Iterator[Any]:
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield procs.spawn("tensors", TensorEcho)
    finally:
        procs.stop().get(timeout=T)


MESH_CASES = [
    ("contiguous float32, 4 MiB", lambda: make((1 << 20,), torch.float32)),
    ("transposed float64", lambda: make((300, 40), torch.float64).t()),
    ("stepped int32", lambda: torch.arange(50_000, dtype=torch.int32)[::7]),
    ("bfloat16 narrowed", lambda: make((64, 128), torch.bfloat16)[3:]),
    ("bool", lambda: torch.arange(10_000) % 3 == 0),
    ("uint8 small", lambda: torch.arange(200, dtype=torch.uint8)),
    ("int64 empty", lambda: torch.zeros(0, 4, dtype=torch.int64)),
    ("float16 zero-dim", lambda: torch.tensor(1.5, dtype=torch.float16)),
    ("requires_grad", lambda: torch.randn(3000, requires_grad=True)),
]


@pytest.mark.parametrize("case", MESH_CASES, ids=[name for name, _ in MESH_CASES])
def test_round_trip_through_worker_processes(echo: Any, case: Any) -> None:
    tensor = case[1]()
    described = echo.describe.call(tensor).get(timeout=T).values()
    expected_sum = float(tensor.detach().double().sum())
    for dtype, shape, stride, grad, total in described:
        assert (dtype, shape, stride, grad) == (
            str(tensor.dtype),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.requires_grad,
        )
        assert total == pytest.approx(expected_sum)
    back = echo.slice(gpus=1).echo.call_one(tensor).get(timeout=T)
    assert_same(back, tensor)


def test_numpy_arrays_still_round_trip_through_worker_processes(echo: Any) -> None:
    np = pytest.importorskip("numpy")
    array = np.arange(300_000, dtype=np.float64).reshape(600, 500)  # 2.4 MB: shared memory
    back = echo.slice(gpus=0).echo.call_one(array).get(timeout=T)
    assert back.dtype == array.dtype
    assert (back == array).all()
    back[0, 0] = -1.0  # writable on arrival


def test_identity_and_aliasing_through_a_worker(echo: Any) -> None:
    tensor = torch.arange(5000, dtype=torch.float32)
    same, shares = echo.slice(gpus=0).aliasing.call_one([tensor, tensor, tensor[1:]]).get(T)
    assert same
    assert not shares
