"""Local memory as the RDMA API sees it: validation, byte views and addresses.

Why: every operation of ``monarch.rdma`` takes local memory as a 1-D contiguous torch tensor or a
1-D C-contiguous ``memoryview`` and must refuse anything else with the reference's
``ValueError`` before any work starts. This module turns such an object into one
``LocalMemory`` record: a flat byte ``memoryview`` over the same memory (no copy), its address
(for the conflict check of ``RDMAAction``) and the object that keeps it alive.

torch is never imported here: a tensor is recognised only when ``torch`` is already in
``sys.modules`` (whoever made the tensor imported it). A tensor's bytes are reached through its
data pointer with ``ctypes``, so numpy is not needed either. CUDA tensors never reach this
module: ``_staging`` serves them through pinned host memory; tensors of other devices are
refused (``NotImplementedError``).
"""

from __future__ import annotations

import ctypes
import operator
import sys
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["MAX_TIMEOUT", "LocalMemory", "address_of", "local_memory", "validate_timeout"]

#: The largest timeout accepted, in seconds (the reference's u64).
MAX_TIMEOUT: Final = (1 << 64) - 1


@dataclass(slots=True)
class LocalMemory:
    """One local memory region: ``view`` (format ``B``, 1-D, the region's bytes, no copy),
    ``address`` (of the first byte; 0 for an empty region), ``readonly`` and ``owner`` (the
    object the caller passed, kept alive with the record). Not frozen: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (about 1 us a record, made on
    every transfer); nothing changes a record after it is made."""

    view: memoryview
    address: int
    readonly: bool
    owner: Any

    @property
    def nbytes(self) -> int:
        return self.view.nbytes


def _refuse(data: object) -> ValueError:
    return ValueError(
        "RDMABuffer only supports 1d contiguous torch.Tensor or 1d c-contiguous memoryview. "
        f"Got: {type(data).__name__}"
    )


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the fields up to ``internal``), to read a buffer's address
    also when it is read-only (``ctypes.c_char.from_buffer`` takes writable ones only)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


# Indexing makes function objects of our own: attributes of ``ctypes.pythonapi`` are shared by
# every module of the process (monarch-actor's shared memory sets prototypes on its own too).
_get_buffer = ctypes.pythonapi["PyObject_GetBuffer"]
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi["PyBuffer_Release"]
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def address_of(view: memoryview) -> int:
    """The address of ``view``'s first byte (``view`` is C-contiguous)."""
    if view.nbytes == 0:
        return 0
    raw = _PyBuffer()
    _get_buffer(view, ctypes.byref(raw), 0)  # PyBUF_SIMPLE; raises on failure
    try:
        return int(raw.buf or 0)
    finally:
        _release_buffer(ctypes.byref(raw))


_tensor_type: type | None = None  # ``torch.Tensor`` once seen (torch is never unloaded)


def _torch_tensor_type() -> type | None:
    global _tensor_type
    if _tensor_type is None:
        tensor = getattr(sys.modules.get("torch"), "Tensor", None)
        _tensor_type = tensor if isinstance(tensor, type) else None
    return _tensor_type


#: Byte views over tensors' memory by (address, size): a view is only the address and the size
#: (the tensor keeps the memory alive, through ``LocalMemory.owner``), so one made earlier is
#: the same as a new one, and making it (a ctypes array and a memoryview cast) was a sixth of a
#: small ``shm`` transfer's fixed cost. Bounded: emptied when full.
_views: dict[tuple[int, int], memoryview] = {}
_MAX_VIEWS: Final = 256


def _tensor_view(address: int, nbytes: int) -> memoryview:
    key = (address, nbytes)
    view = _views.get(key)
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        view = _views[key] = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
    return view


def local_memory(data: object) -> LocalMemory:
    """``data`` as a ``LocalMemory``; ``ValueError`` (the reference's message) unless it is a
    1-D contiguous tensor or a 1-D C-contiguous memoryview; ``NotImplementedError`` for a
    tensor neither in host memory nor on a CUDA device (those are staged before this)."""
    if isinstance(data, memoryview):
        if data.ndim != 1 or not data.c_contiguous:
            raise _refuse(data)
        flat = data.cast("B") if data.format != "B" else data
        return LocalMemory(flat, address_of(flat), data.readonly, data)
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(data, tensor_type):
        tensor: Any = data
        # ``ndim``, ``is_cpu`` and ``nbytes`` rather than ``dim()``, ``device.type`` and
        # ``element_size() * numel()``: the same answers without a ``torch.device`` object or
        # a method call each (a 1 MiB ``shm`` read is a few tens of microseconds in all).
        if tensor.ndim != 1 or not tensor.is_contiguous():
            raise _refuse(data)
        if not tensor.is_cpu:
            raise NotImplementedError(
                f"RDMABuffer over a {tensor.device.type} tensor is not supported by monarch-rdma "
                "(CPU tensors are registered, CUDA tensors staged through pinned host memory); "
                "copy it to a CPU tensor first"
            )
        nbytes = int(tensor.nbytes)
        if nbytes:
            address = int(tensor.data_ptr())
            return LocalMemory(_tensor_view(address, nbytes), address, False, tensor)
        return LocalMemory(memoryview(b""), 0, False, tensor)
    raise _refuse(data)


def validate_timeout(timeout: object) -> int:
    """``timeout`` as whole seconds: ``TypeError`` unless an integer (a float is refused),
    ``OverflowError`` when negative or beyond an unsigned 64-bit integer."""
    value = operator.index(timeout)  # type: ignore[arg-type]
    if value < 0 or value > MAX_TIMEOUT:
        raise OverflowError(f"timeout must fit in an unsigned 64-bit integer, got {value}")
    return value
