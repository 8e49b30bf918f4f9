"""The client's thread-local context, below every other client module: the active mesh (a
stack: ``activate()`` pushes a mesh, ``no_mesh.activate()`` pushes ``None``) and where an
operation was issued. It knows meshes only as a type, so ``_tensor`` (which reads the active
mesh) and ``_mesh`` (which activates one and makes tensors) both import it at module level."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from monarch.tensor._mesh import DeviceMesh

__all__ = ["active_mesh", "get_active_mesh", "issued_at", "no_mesh", "pushed"]

_HERE = __file__.rsplit("/", 1)[0]
_TORCH = torch.__file__.rsplit("/", 1)[0]


def issued_at() -> str:
    """``file:line in function`` of the first caller outside torch and monarch.tensor."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((_HERE, _TORCH, "<")):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


class _Active(threading.local):
    def __init__(self) -> None:
        self.stack: list[DeviceMesh | None] = []


_active = _Active()


def active_mesh() -> DeviceMesh | None:
    stack = _active.stack
    return stack[-1] if stack else None


def get_active_mesh() -> DeviceMesh | None:
    """The mesh torch operations run on now (``None`` outside ``activate()``)."""
    return active_mesh()


@contextlib.contextmanager
def pushed(mesh: DeviceMesh | None) -> Iterator[None]:
    """``mesh`` is the active mesh inside (``None``: operations run locally)."""
    _active.stack.append(mesh)
    try:
        yield
    finally:
        _active.stack.pop()


class _NoMesh:
    """``with no_mesh.activate():`` runs torch operations locally again."""

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return pushed(None)

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()
