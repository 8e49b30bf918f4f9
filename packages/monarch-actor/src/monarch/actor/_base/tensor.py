"""torch tensors through the codec: storage out of band, never pickled.

Why: torch's own reducer pickles a CPU tensor's storage with ``torch.save`` into a ``bytes``
that then lands in the pickle stream, so a 64 MiB tensor argument was copied three times on the
sender and twice more on the receiver. Here a plain CPU tensor is reduced to its dtype, shape,
strides and ``requires_grad`` plus one ``PickleBuffer`` over the bytes of its storage that its
elements span (from its first element to its last: a view keeps its strides without a copy); the
codec sends that buffer out of band like any protocol-5 buffer, and the receiver rebuilds the
tensor over the buffer it received (``torch.frombuffer``: no copy when the buffer is the
receiver-owned ``bytearray`` or ``mmap`` the transport handed over, one copy otherwise). Spans
below ``OOB_THRESHOLD`` go in band as ``bytes``.

Semantics match plain pickling: the receiver's tensor owns fresh storage (two views of one
storage sent in one message do not alias on the receiver, as with ``pickle``), the same object
sent twice in one message arrives as one object (the pickle memo), and dtype, shape, strides and
``requires_grad`` are kept; ``storage_offset`` becomes 0 (only the elements' span travels).
Anything else (subclasses other than ``Parameter``, which torch reduces to a plain tensor,
non-CPU devices, sparse or quantized layouts, conjugate or negative bits, backward hooks, Python
attributes set on the tensor) keeps torch's own reducer.

torch is never imported here: ``dispatch_table`` returns ``None`` unless the user's program has
imported torch (``sys.modules``), and the receiver's ``rebuild`` only runs when a tensor was sent.
"""

from __future__ import annotations

import ctypes
import importlib
import mmap
import pickle
import sys
from typing import Any

__all__ = ["dispatch_table", "rebuild"]

#: Spans of at least this many bytes go out of band (the codec's threshold for ``bytes``).
_OOB_BYTES = 4096

_table: dict[type, Any] | None = None
_dtype_names: dict[Any, str] = {}


def dispatch_table() -> dict[type, Any] | None:
    """The pickler ``dispatch_table`` entries for tensors, or ``None`` while torch is not
    imported by the program (the codec then keeps the plain fast path)."""
    global _table
    if _table is None:
        torch = sys.modules.get("torch")
        tensor_type = getattr(torch, "Tensor", None)
        dtype_type = getattr(torch, "dtype", None)
        if not isinstance(tensor_type, type) or not isinstance(dtype_type, type):
            return None
        _dtype_names.update(
            (value, name)
            for name, value in vars(torch).items()
            if isinstance(value, dtype_type) and str(value) == f"torch.{name}"
        )
        _table = {tensor_type: _reduce}
    return _table


def _span(size: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    """Bytes from a strided tensor's first element to the end of its last (0 when empty)."""
    if 0 in size:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))) * itemsize


def _fallback(tensor: Any) -> Any:
    return tensor.__reduce_ex__(5)


def _reduce(tensor: Any) -> Any:
    torch = sys.modules["torch"]
    if (
        tensor.device.type != "cpu"
        or tensor.layout is not torch.strided
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
        or tensor._backward_hooks
        or getattr(tensor, "__dict__", None)
        or tensor.dtype not in _dtype_names
    ):
        return _fallback(tensor)
    size = tuple(tensor.shape)
    stride = tuple(tensor.stride())
    itemsize = tensor.element_size()
    span = _span(size, stride, itemsize)
    data: Any
    if span == 0:
        data = b""
    else:
        start = tensor.untyped_storage().data_ptr() + tensor.storage_offset() * itemsize
        raw = (ctypes.c_char * span).from_address(start)
        raw._monarch_owner = tensor  # type: ignore[attr-defined]  # keeps the memory alive
        data = pickle.PickleBuffer(raw) if span >= _OOB_BYTES else bytes(raw)
    return rebuild, (data, _dtype_names[tensor.dtype], size, stride, tensor.requires_grad)


def rebuild(
    data: Any, dtype_name: str, size: tuple[int, ...], stride: tuple[int, ...], grad: bool
) -> Any:
    """Rebuild a tensor sent by ``_reduce`` over ``data`` (the received buffer): without a copy
    when ``data`` is a ``bytearray`` or an ``mmap`` (the transports hand one over,
    receiver-owned, for a writable buffer), else over a writable copy. ``UnpicklingError`` on a
    malformed message."""
    torch: Any = importlib.import_module("torch")  # a tensor was sent: the program uses torch
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise pickle.UnpicklingError(f"unknown torch dtype {dtype_name!r:.40}")
    if len(size) != len(stride) or any(n < 0 for n in size) or any(s < 0 for s in stride):
        raise pickle.UnpicklingError(f"malformed tensor geometry {size!r:.60} {stride!r:.60}")
    if type(data) is not bytearray and type(data) is not mmap.mmap:
        data = bytearray(memoryview(data).cast("B"))  # a bytes, or a view that may be reused
    span = _span(size, stride, dtype.itemsize)
    if len(data) != span:
        raise pickle.UnpicklingError(f"tensor buffer has {len(data)} bytes, {span} expected")
    if not span:
        out = torch.empty_strided(size, stride, dtype=dtype)
    else:
        storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
        out = torch.empty(0, dtype=dtype).set_(storage, 0, size, stride)
    if grad:
        out.requires_grad_(True)
    return out
