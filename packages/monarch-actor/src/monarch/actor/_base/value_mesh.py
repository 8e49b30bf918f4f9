"""``ValueMesh[R]``: one value per rank of a shape, with the mesh slicing API.

Why it looks like this: ``call()`` gathers one reply per rank and hands the caller something that
can be sliced exactly like the actor mesh it came from. A value mesh keeps a table from global
rank to value (shared, never mutated) and a ``Shape`` saying which of those ranks it currently
shows, so slicing is O(size of the result) and indices inside a slice are re-based: the first
value of ``vm.slice(x=1)`` is local index 0.
"""

from __future__ import annotations

import functools
import pprint
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from monarch.actor._base.shape import Extent, Point, Shape, ShapedMesh, Slice

__all__ = ["ValueMesh"]

R = TypeVar("R")


class ValueMesh(ShapedMesh, Generic[R]):
    """Values indexed by the points of a ``Shape``.

    ``ValueMesh(shape, values)`` takes ``values`` in the shape's local (row-major) order.
    ``values()`` is that list; ``items()`` and iteration yield ``(Point, value)`` pairs in the same
    order; ``item(**coords)`` reads one value; ``slice``/``split``/``flatten``/``rename`` return
    value meshes. Immutable and picklable (the values must be picklable).
    """

    __slots__ = ("_by_rank", "_shape")

    _shape: Shape
    _by_rank: Mapping[int, R]

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if not isinstance(shape, Shape):
            raise TypeError(f"shape must be a Shape, got {type(shape).__name__}")
        values = list(values)
        if len(values) != len(shape):
            raise ValueError(f"shape has {len(shape)} ranks but {len(values)} values were given")
        self._shape = shape
        self._by_rank = dict(zip(shape.ndslice, values, strict=True))

    @classmethod
    def _from_table(cls, shape: Shape, by_rank: Mapping[int, R]) -> ValueMesh[R]:
        vm: ValueMesh[R] = cls.__new__(cls)
        vm._shape = shape
        vm._by_rank = by_rank
        return vm

    @classmethod
    def from_indexed(cls, shape: Shape, pairs: Iterable[tuple[int, R]]) -> ValueMesh[R]:
        """Build from ``(local index, value)`` pairs in any order; the last duplicate wins.

        Raises ``ValueError`` if an index is out of range or any index is missing.
        """
        n = len(shape)
        slots: dict[int, R] = {}
        for index, value in pairs:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
                raise ValueError(f"index {index!r} out of range for a mesh of {n} ranks")
            slots[index] = value
        if len(slots) != n:
            missing = sorted(set(range(n)) - set(slots))[:8]
            raise ValueError(f"from_indexed is missing ranks {missing} (of {n})")
        return cls(shape, [slots[i] for i in range(n)])

    # -- MeshTrait -------------------------------------------------------------------------
    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        return ValueMesh._from_table(shape, self._by_rank)

    # -- access ------------------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        """The shape the values are laid over."""
        return self._shape

    def values(self) -> list[R]:
        """Values in local (row-major) order."""
        return [self._by_rank[rank] for rank in self._shape.ndslice]

    def get(self, index: int) -> R:
        """Value at local ``index``; ``ValueError`` (mentioning "out of range") if too large."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        if index < 0:
            raise OverflowError(f"index {index} is negative")
        if index >= len(self._shape):
            raise ValueError(f"index {index} out of range for a mesh of {len(self._shape)} ranks")
        return self._by_rank[self._shape.ndslice.get(index)]

    def items(self) -> list[tuple[Point, R]]:
        """``(Point, value)`` pairs in local order."""
        extent = self._shape.extent
        return [
            (Point(i, extent), self._by_rank[rank]) for i, rank in enumerate(self._shape.ndslice)
        ]

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return iter(self.items())

    def item(self, **coords: int) -> R:
        """Value at the coordinate naming every dimension (``item()`` on a singleton).

        Unknown or missing dimension names raise ``KeyError``; an index outside a dimension
        raises ``IndexError``.
        """
        labels = self._shape.labels
        extra = [k for k in coords if k not in labels]
        if extra:
            raise KeyError(f"value mesh {self._shape.extent} has no dimensions {extra}")
        missing = [k for k in labels if k not in coords]
        if missing:
            raise KeyError(f"item() needs a coordinate for every dimension; missing {missing}")
        sizes = self._shape.ndslice.sizes
        position = []
        for label, size in zip(labels, sizes, strict=True):
            value = coords[label]
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"coordinate {label}={value!r} must be an int")
            if not 0 <= value < size:
                raise IndexError("index out of range")
            position.append(value)
        return self._by_rank[self._shape.ndslice.nditem(position)]

    def __repr__(self) -> str:
        # The reference's layout exactly (pformat of the pairs, indented), so programs that
        # print a value mesh produce the same output under both implementations.
        body = textwrap.indent(pprint.pformat(tuple(self.items())), "  ")
        return f"ValueMesh({self._shape.extent}):\n{body}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return self._shape.extent == other._shape.extent and self.values() == other.values()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # The shape plus the values it shows: a slice does not drag its parent's table along.
        return (_rebuild_value_mesh, (self._shape.labels, self._shape.ndslice, self.values()))


def _rebuild_value_mesh(labels: list[str], ndslice: Slice, values: list[Any]) -> ValueMesh[Any]:
    return ValueMesh(Shape(labels, ndslice), values)


@functools.lru_cache(maxsize=256)
def _dense(extent: Extent) -> tuple[Shape, tuple[int, ...]]:
    # A mesh's ``call()`` gathers over the same extent every time: its shape (immutable,
    # shared by every value mesh over it) and global ranks are made once, not per call.
    shape = Shape.from_extent(extent)
    return shape, tuple(shape.ndslice)


def _value_mesh_over(extent: Extent, values: Sequence[R]) -> ValueMesh[R]:
    """A dense value mesh over ``extent`` (used for ``call()`` results)."""
    shape, ranks = _dense(extent)
    if len(values) != len(ranks):
        raise ValueError(f"shape has {len(ranks)} ranks but {len(values)} values were given")
    return ValueMesh._from_table(shape, dict(zip(ranks, values, strict=True)))
