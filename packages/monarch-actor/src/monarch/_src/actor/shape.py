"""``monarch._src.actor.shape`` as Monarch's documentation and examples import it: the public
names the reference's module has, re-exported from ``monarch.actor`` (``NDSlice`` is
``Slice``). Not here: the reference's helpers ``iter_ranks``, ``Slices`` and ``ShapeExt``."""

from __future__ import annotations

from monarch.actor import Extent, MeshTrait, Shape, Slice
from monarch.actor import Slice as NDSlice

__all__ = ["Extent", "MeshTrait", "NDSlice", "Shape", "Slice"]
