"""``monarch._src.actor.host_mesh`` as Monarch's documentation and examples import it: the
public names the reference's module has, re-exported from ``monarch.actor`` (``NDSlice`` is
``Slice``)."""

from __future__ import annotations

from monarch._src.actor._forward import forwarder
from monarch.actor import (
    Extent,
    Future,
    HostMesh,
    MeshTrait,
    Point,
    ProcMesh,
    Region,
    Shape,
    context,
    default_bootstrap_cmd,
    this_host,
    this_proc,
)
from monarch.actor import Slice as NDSlice

__all__ = [
    "Extent",
    "Future",
    "HostMesh",
    "MeshTrait",
    "NDSlice",
    "Point",
    "ProcMesh",
    "Region",
    "Shape",
    "context",
    "default_bootstrap_cmd",
    "this_host",
    "this_proc",
]

__getattr__ = forwarder(__name__, frozenset({"returns_future"}))
