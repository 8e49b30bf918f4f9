"""The argument codec: pickle protocol 5 with out-of-band buffers, copied once."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.actor._base import codec as _codec
from monarch.actor._base.codec import (
    KIND_PERSISTENT,
    KIND_READONLY,
    MAX_BUFFERS,
    OOB_THRESHOLD,
    decode,
    detach_buffers,
    encode,
)
from monarch.actor._base.errors import CodecError, MessageTooLargeError


class ArrayLike:
    """Pickles like a numpy array: one native protocol-5 ``PickleBuffer``."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (ArrayLike._rebuild, (pickle.PickleBuffer(self.data),))

    @staticmethod
    def _rebuild(buffer: Any) -> ArrayLike:
        view = memoryview(buffer)
        return ArrayLike(view.obj if isinstance(view.obj, bytearray) else bytearray(view))


def transmit(payload: _codec.Payload) -> Any:
    """What a transport does: copy the buffers once into receiver memory, then decode."""
    received = detach_buffers(payload.buffers, payload.kinds)
    return decode(payload.data, received, payload.kinds)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(value=json_like, blob=st.binary(max_size=3 * OOB_THRESHOLD))
def test_round_trip_of_plain_values_and_blobs(value: Any, blob: bytes) -> None:
    args = ((value, blob, bytearray(blob)), {"k": blob})
    assert transmit(encode(args)) == args


def test_small_values_stay_in_band() -> None:
    payload = encode(((b"x" * 100, 1), {}))
    assert payload.buffers == ()
    assert payload.kinds == b""


def test_large_bytes_travel_out_of_band_and_are_rebuilt_without_another_copy() -> None:
    blob = bytes(range(256)) * 64
    payload = encode(((blob,), {}))
    assert len(payload.data) < 200  # the blob is not in the pickle stream
    assert payload.kinds == bytes([KIND_READONLY | KIND_PERSISTENT])
    assert payload.buffers[0].obj is blob  # encoding does not copy
    received = detach_buffers(payload.buffers, payload.kinds)
    assert type(received[0]) is bytes
    (back,), _ = decode(payload.data, received, payload.kinds)
    assert back is received[0]  # the receiver's copy is the value: one copy in total


def test_large_bytearray_comes_back_as_a_writable_bytearray_over_received_memory() -> None:
    data = bytearray(b"a" * (2 * OOB_THRESHOLD))
    payload = encode(((data,), {}))
    assert payload.kinds == bytes([KIND_PERSISTENT])
    received = detach_buffers(payload.buffers, payload.kinds)
    (back,), _ = decode(payload.data, received, payload.kinds)
    assert back is received[0]
    assert isinstance(back, bytearray)
    back[0] = ord("b")
    assert data[0] == ord("a")  # the sender's memory is separate


def test_memoryviews_are_supported_with_format_and_shape() -> None:
    raw = bytearray(range(24))
    view = memoryview(raw).cast("B", (4, 6))
    (back,), _ = transmit(encode(((view,), {})))
    assert isinstance(back, memoryview)
    assert back.shape == (4, 6)
    assert back.tolist() == view.tolist()
    assert not back.readonly
    readonly = memoryview(bytes(range(8))).cast("i")
    (back_ro,), _ = transmit(encode(((readonly,), {})))
    assert back_ro.readonly
    assert back_ro.format == "i"
    assert back_ro.tolist() == readonly.tolist()


def test_non_contiguous_memoryview_is_compacted() -> None:
    view = memoryview(bytearray(range(10)))[::2]
    (back,), _ = transmit(encode(((view,), {})))
    assert back.tolist() == [0, 2, 4, 6, 8]


def test_native_pickle_buffers_go_out_of_band() -> None:
    data = bytearray(b"z" * 64)
    payload = encode(((ArrayLike(data),), {}))
    assert payload.kinds == b"\x00"
    assert payload.buffers[0].obj is data
    (back,), _ = transmit(payload)
    assert back.data == data
    assert back.data is not data


def test_large_bytes_nested_deeper_than_the_scan_still_round_trip() -> None:
    blob = b"q" * (OOB_THRESHOLD * 2)
    value: Any = (([[[[blob]]]],), {})
    assert transmit(encode(value)) == value


def test_nested_memoryview_is_found_by_the_fallback() -> None:
    view = memoryview(b"abc")
    value: Any = (([[[[view]]]],), {})
    back = transmit(encode(value))
    assert bytes(back[0][0][0][0][0][0]) == b"abc"


def test_lambdas_closures_and_local_classes_round_trip() -> None:
    # cloudpickle is a dependency: what the standard pickler refuses travels by value.
    n = 5

    class Local:
        def __init__(self, value: int) -> None:
            self.value = value

    value: Any = ((lambda x: x + 1, lambda x: x + n, Local(7), Local), {})
    ((plus_one, plus_n, local, cls), _) = transmit(encode(value))
    assert plus_one(1) == 2
    assert plus_n(1) == 6
    assert local.value == 7
    assert cls(3).value == 3


def test_getstate_failure_raises_at_the_sender() -> None:
    class Bad:
        def __reduce__(self) -> Any:
            raise RuntimeError("no pickling today")

    with pytest.raises(RuntimeError, match="no pickling today"):
        encode(((Bad(),), {}))


def test_too_many_buffers_is_refused() -> None:
    many = [ArrayLike(bytearray(1)) for _ in range(MAX_BUFFERS + 1)]
    with pytest.raises(MessageTooLargeError, match="buffers"):
        encode(((many,), {}))


def test_decode_rejects_buffers_and_kinds_of_different_lengths() -> None:
    payload = encode(((b"x" * OOB_THRESHOLD,), {}))
    with pytest.raises(CodecError):
        decode(payload.data, [], payload.kinds)


def test_decode_of_an_out_of_band_stream_without_its_buffers_fails_cleanly() -> None:
    payload = encode(((b"x" * OOB_THRESHOLD,), {}))
    with pytest.raises(pickle.UnpicklingError):
        decode(payload.data, [], b"")


def test_decode_of_a_persistent_id_naming_no_buffer_is_an_unpickling_error() -> None:
    payload = encode(((b"x" * OOB_THRESHOLD, b"y" * OOB_THRESHOLD), {}))
    with pytest.raises(pickle.UnpicklingError, match="names no buffer"):
        decode(payload.data, payload.buffers[:1], payload.kinds[:1])
