"""The shape model behind every mesh: named dimensions over a strided slice of ranks.

Why a module of its own: host meshes, proc meshes, actor meshes and value meshes are all the
same thing from the addressing point of view, a hyper-rectangle of named dimensions laid over
"global ranks" (indices into a list of processes, or of values). Everything here is pure data:
immutable, picklable into plain tuples, no I/O, no clocks.

Theory of operation
-------------------
``Slice(offset, sizes, strides)`` maps a coordinate ``c`` (one index per dimension) to the global
rank ``offset + sum(c[i] * strides[i])``. Local (linear) indices enumerate coordinates in
row-major order, so local index ``k`` is the ``k``-th element of ``iter(slice)``.

``Shape(labels, slice)`` names the dimensions. The mesh algebra (``at``, ``select``, ``split``,
``flatten``, ``rename``) never moves a rank: it only builds a new slice that selects a subset of
the same global ranks, which is why a sliced mesh still addresses the same actors.

``Extent(labels, sizes)`` is the shape with the layout forgotten (what a user sees as
``{gpus: 2, x: 3}``) and ``Point(rank, extent)`` is one coordinate in it, stored as its row-major
rank.

Errors follow the reference implementation: ``Shape.at`` raises ``ValueError`` for unknown labels
and too-large indices and ``OverflowError`` for negative ones; ``MeshTrait.slice`` raises
``TypeError`` for unknown labels and ``IndexError("index out of range")`` for bad integers.
Every constructor validates its input (types, lengths, non-negative sizes, at most
``MAX_DIMS`` dimensions), so hostile pickles produce a ``ValueError``/``TypeError`` rather than a
corrupt object.
"""

from __future__ import annotations

import builtins
import itertools
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

__all__ = [
    "MAX_DIMS",
    "DimensionNotFoundError",
    "Extent",
    "MeshTrait",
    "Point",
    "Region",
    "Shape",
    "ShapedMesh",
    "Slice",
]

#: Upper bound on the number of dimensions of any slice, shape or extent.
MAX_DIMS = 64


class DimensionNotFoundError(KeyError, ValueError):
    """A ``Point`` or ``Extent`` was indexed with a label it does not have.

    It is both a ``KeyError`` (so ``Mapping.get`` and ``in`` behave) and a ``ValueError`` (the
    type the reference implementation raises: "Dimension 'x' not found").
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "dimension not found"


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return value


def _check_dims(values: Sequence[int] | Iterator[int], what: str) -> tuple[int, ...]:
    if isinstance(values, str | bytes):
        raise TypeError(f"{what} must be a sequence of ints")
    out = tuple(_check_int(v, what) for v in values)
    if len(out) > MAX_DIMS:
        raise ValueError(f"{what}: at most {MAX_DIMS} dimensions are supported, got {len(out)}")
    return out


def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, str):
        raise TypeError("labels must be a sequence of str, not a str")
    out = tuple(labels)
    for label in out:
        if not isinstance(label, str):
            raise TypeError(f"labels must be str, got {type(label).__name__}")
    if len(out) > MAX_DIMS:
        raise ValueError(f"at most {MAX_DIMS} dimensions are supported, got {len(out)}")
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate dimension labels in {list(out)!r}")
    return out


def _row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    if not sizes:  # zero dimensions (one element): no strides, not the ``(1,)`` of accumulate
        return ()
    strides = list(itertools.accumulate(reversed(sizes[1:]), operator.mul, initial=1))
    strides.reverse()
    return tuple(strides)


def _product(values: Sequence[int]) -> int:
    total = 1
    for value in values:
        total *= value
    return total


class Slice:
    """A strided, offset hyper-rectangle of global ranks (``NDSlice`` in the reference).

    ``Slice(offset=0, sizes=[2, 3], strides=[3, 1])`` holds ranks 0..5 in row-major order.
    Immutable, hashable, picklable. ``len`` is the number of elements; iteration yields global
    ranks in local (row-major coordinate) order.
    """

    __slots__ = ("_offset", "_sizes", "_strides")

    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]

    def __init__(self, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        offset = _check_int(offset, "offset")
        sizes_t = _check_dims(sizes, "sizes")
        strides_t = _check_dims(strides, "strides")
        if len(sizes_t) != len(strides_t):
            raise ValueError(
                f"sizes and strides must have the same length ({len(sizes_t)} != {len(strides_t)})"
            )
        if offset < 0:
            raise ValueError(f"offset must be non-negative, got {offset}")
        if any(s < 0 for s in sizes_t):
            raise ValueError(f"sizes must be non-negative, got {list(sizes_t)}")
        if any(s < 0 for s in strides_t):
            raise ValueError(f"strides must be non-negative, got {list(strides_t)}")
        object.__setattr__(self, "_offset", offset)
        object.__setattr__(self, "_sizes", sizes_t)
        object.__setattr__(self, "_strides", strides_t)

    @classmethod
    def new_row_major(cls, sizes: Sequence[int]) -> Slice:
        """A dense slice at offset 0 whose strides are row-major for ``sizes``."""
        sizes_t = _check_dims(sizes, "sizes")
        return cls(offset=0, sizes=sizes_t, strides=_row_major_strides(sizes_t))

    @property
    def offset(self) -> int:
        """Global rank of the all-zero coordinate."""
        return self._offset

    @property
    def sizes(self) -> list[int]:
        """Size of each dimension (a fresh list)."""
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        """Stride of each dimension in global ranks (a fresh list)."""
        return list(self._strides)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._sizes)

    def __len__(self) -> int:
        return _product(self._sizes)

    def __iter__(self) -> Iterator[int]:
        if any(s == 0 for s in self._sizes):
            return
        for coords in itertools.product(*(range(s) for s in self._sizes)):
            yield self._offset + sum(c * s for c, s in zip(coords, self._strides, strict=True))

    def nditem(self, coords: Sequence[int]) -> int:
        """Global rank at ``coords``; ``ValueError`` if the coordinate is outside the slice."""
        coords_t = _check_dims(coords, "coords")
        if len(coords_t) != len(self._sizes):
            raise ValueError(f"expected {len(self._sizes)} coordinates, got {len(coords_t)}")
        for c, size in zip(coords_t, self._sizes, strict=True):
            if not 0 <= c < size:
                raise ValueError(f"coordinate {list(coords_t)} out of range for {self.sizes}")
        return self._offset + sum(c * s for c, s in zip(coords_t, self._strides, strict=True))

    def get(self, index: int) -> int:
        """Global rank of the ``index``-th element (local row-major order)."""
        index = _check_int(index, "index")
        if not 0 <= index < len(self):
            raise ValueError(f"index {index} out of range for slice of length {len(self)}")
        return self.nditem(self._unravel(index))

    def _unravel(self, index: int) -> list[int]:
        coords = [0] * len(self._sizes)
        for dim in range(len(self._sizes) - 1, -1, -1):
            index, coords[dim] = divmod(index, self._sizes[dim])
        return coords

    def coordinates(self, rank: int) -> list[int]:
        """Coordinate of global ``rank``; ``ValueError`` if the rank is not in the slice."""
        rank = _check_int(rank, "rank")
        remaining = rank - self._offset
        if remaining < 0 or len(self) == 0:
            raise ValueError(f"rank {rank} is not in {self!r}")
        coords = [0] * len(self._sizes)
        # Greedy decomposition from the largest stride down; exact for every layout the mesh
        # algebra produces (each stride is at least the span of the smaller ones). The result is
        # verified, so an unusual hand-made layout can only fail, never answer wrongly.
        order = sorted(range(len(self._sizes)), key=lambda d: self._strides[d], reverse=True)
        for dim in order:
            stride = self._strides[dim]
            if stride == 0:
                continue
            c = min(remaining // stride, self._sizes[dim] - 1)
            coords[dim] = c
            remaining -= c * stride
        if remaining != 0:
            raise ValueError(f"rank {rank} is not in {self!r}")
        return coords

    def index(self, rank: int) -> int:
        """Local index of global ``rank``; ``ValueError`` if the rank is not in the slice."""
        coords = self.coordinates(rank)
        index = 0
        for c, size in zip(coords, self._sizes, strict=True):
            index = index * size + c
        return index

    def __contains__(self, rank: object) -> bool:
        if isinstance(rank, bool) or not isinstance(rank, int):
            return False
        try:
            self.coordinates(rank)
        except ValueError:
            return False
        return True

    def is_row_major(self) -> bool:
        """True when the strides are the dense row-major strides for the sizes."""
        return self._strides == _row_major_strides(self._sizes)

    def is_dense(self) -> bool:
        """True when the ranks are consecutive in local order (strides row-major, ignoring
        dimensions of size 1, whose stride never matters)."""
        expected = 1
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            if size == 1:
                continue
            if stride != expected:
                return False
            expected *= size
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return NotImplemented
        return (self._offset, self._sizes, self._strides) == (
            other._offset,
            other._sizes,
            other._strides,
        )

    def __hash__(self) -> int:
        return hash((Slice, self._offset, self._sizes, self._strides))

    def __repr__(self) -> str:
        return f"Slice(offset={self._offset}, sizes={self.sizes}, strides={self.strides})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Slice is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_slice, (self._offset, self._sizes, self._strides))


def _rebuild_slice(offset: int, sizes: Sequence[int], strides: Sequence[int]) -> Slice:
    return Slice(offset=offset, sizes=sizes, strides=strides)


class Extent(Mapping[str, int]):
    """Ordered mapping from dimension label to size, e.g. ``{gpus: 2, x: 3}``.

    Immutable and hashable; ``labels`` and ``sizes`` return fresh lists; ``nelements`` is the
    product of the sizes (1 for the empty extent).
    """

    __slots__ = ("_labels", "_sizes")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        labels_t = _check_labels(labels)
        sizes_t = _check_dims(sizes, "sizes")
        if len(labels_t) != len(sizes_t):
            raise ValueError(f"{len(labels_t)} labels but {len(sizes_t)} sizes")
        if any(s < 0 for s in sizes_t):
            raise ValueError(f"sizes must be non-negative, got {list(sizes_t)}")
        object.__setattr__(self, "_labels", labels_t)
        object.__setattr__(self, "_sizes", sizes_t)

    @property
    def labels(self) -> list[str]:
        """Dimension labels in order."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """Dimension sizes in order."""
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        """Number of points in the extent."""
        return _product(self._sizes)

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise DimensionNotFoundError(f"Dimension {label!r} not found in {self}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return (self._labels, self._sizes) == (other._labels, other._sizes)
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash((Extent, self._labels, self._sizes))

    def __str__(self) -> str:
        inner = ", ".join(
            f"{label}: {size}" for label, size in zip(self._labels, self._sizes, strict=True)
        )
        return "{" + inner + "}"

    def __repr__(self) -> str:
        return f"Extent({self})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Extent is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Extent, (self._labels, self._sizes))

    def point(self, rank: int) -> Point:
        """The point with row-major ``rank`` in this extent."""
        return Point(rank, self)

    def points(self) -> Iterator[Point]:
        """All points in row-major order."""
        return (Point(rank, self) for rank in range(self.nelements))


class Point(Mapping[str, int]):
    """A coordinate inside an ``Extent``, stored as its row-major ``rank``.

    ``point["gpus"]`` is the coordinate along ``gpus``; ``str(point)`` looks like
    ``{'hosts': 0/1, 'gpus': 1/2}`` (index/size per dimension, ``{}`` for no dimensions).
    Indexing an unknown label raises ``DimensionNotFoundError`` (a ``ValueError`` and a
    ``KeyError``). Points are deliberately unhashable, as in the reference implementation.
    """

    __slots__ = ("_coords", "_extent", "_rank")
    __hash__ = None  # type: ignore[assignment]

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent) -> None:
        rank = _check_int(rank, "rank")
        if not isinstance(extent, Extent):
            raise TypeError(f"extent must be an Extent, got {type(extent).__name__}")
        if not 0 <= rank < max(extent.nelements, 1) or extent.nelements == 0:
            raise ValueError(f"rank {rank} out of range for extent {extent}")
        coords = [0] * len(extent)
        rest = rank
        sizes = extent._sizes
        for dim in range(len(sizes) - 1, -1, -1):
            rest, coords[dim] = divmod(rest, sizes[dim])
        object.__setattr__(self, "_rank", rank)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", tuple(coords))

    @property
    def rank(self) -> int:
        """Row-major linear rank of this point within its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point lives in."""
        return self._extent

    def size(self, label: str) -> int:
        """Size of dimension ``label`` of the extent."""
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        try:
            return self._coords[self._extent._labels.index(label)]
        except ValueError:
            raise DimensionNotFoundError(f"Dimension {label!r} not found in point {self}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent._labels)

    def __len__(self) -> int:
        return len(self._extent)

    def __str__(self) -> str:
        inner = ", ".join(
            f"{label!r}: {coord}/{size}"
            for label, coord, size in zip(
                self._extent._labels, self._coords, self._extent._sizes, strict=True
            )
        )
        return "{" + inner + "}"

    __repr__ = __str__

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Point is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Point, (self._rank, self._extent))


class Shape:
    """Named dimensions over a ``Slice``: the addressing of a mesh.

    ``Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))``. Operations return new shapes
    selecting subsets of the same global ranks: ``at`` (fix one index, drop the dimension),
    ``select`` (restrict with a Python slice, keep the dimension), ``index`` (several ``at``).
    """

    __slots__ = ("_labels", "_slice")

    _labels: tuple[str, ...]
    _slice: Slice

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        labels_t = _check_labels(labels)
        if not isinstance(slice, Slice):
            raise TypeError(f"slice must be a Slice, got {type(slice).__name__}")
        if len(labels_t) != slice.ndim:
            raise ValueError(f"{len(labels_t)} labels for a {slice.ndim}-dimensional slice")
        object.__setattr__(self, "_labels", labels_t)
        object.__setattr__(self, "_slice", slice)

    @classmethod
    def unity(cls) -> Shape:
        """The zero-dimensional shape holding the single rank 0."""
        return cls([], Slice(offset=0, sizes=[], strides=[]))

    @classmethod
    def from_extent(cls, extent: Extent) -> Shape:
        """A dense row-major shape over ranks ``0..extent.nelements-1``."""
        return cls(extent._labels, Slice.new_row_major(extent._sizes))

    @property
    def labels(self) -> list[str]:
        """Dimension labels in order (a fresh list)."""
        return list(self._labels)

    @property
    def ndslice(self) -> Slice:
        """The underlying slice of global ranks."""
        return self._slice

    @property
    def extent(self) -> Extent:
        """Labels and sizes, without the layout."""
        return Extent(self._labels, self._slice._sizes)

    @property
    def region(self) -> Region:
        """The same labels and slice as a ``Region``."""
        return Region(self._labels, self._slice)

    def _dim(self, label: str) -> int:
        if label not in self._labels:
            raise ValueError(f"shape {self} has no dimension {label!r}")
        return self._labels.index(label)

    def at(self, label: str, index: int) -> Shape:
        """Fix ``label`` at ``index`` and drop the dimension (the offset moves accordingly)."""
        dim = self._dim(label)
        index = _check_int(index, "index")
        if index < 0:
            raise OverflowError(f"index {index} for dimension {label!r} is negative")
        size = self._slice._sizes[dim]
        if index >= size:
            raise ValueError(f"index {index} out of range for dimension {label!r} of size {size}")
        s = self._slice
        new_slice = Slice(
            offset=s._offset + index * s._strides[dim],
            sizes=s._sizes[:dim] + s._sizes[dim + 1 :],
            strides=s._strides[:dim] + s._strides[dim + 1 :],
        )
        return Shape(self._labels[:dim] + self._labels[dim + 1 :], new_slice)

    def select(self, label: str, selector: slice) -> Shape:
        """Restrict ``label`` to the Python slice ``selector`` (steps allowed, kept dimension)."""
        dim = self._dim(label)
        if not isinstance(selector, slice):
            raise TypeError(f"select needs a slice, got {type(selector).__name__}")
        for part in (selector.start, selector.stop, selector.step):
            if part is not None:
                _check_int(part, "slice bound")
        if selector.step is not None and selector.step <= 0:
            raise ValueError(f"slice step must be positive, got {selector.step}")
        s = self._slice
        start, _stop, step = selector.indices(s._sizes[dim])
        count = len(range(*selector.indices(s._sizes[dim])))
        if count == 0:
            raise ValueError(f"selection {selector} of dimension {label!r} is empty")
        sizes = list(s._sizes)
        strides = list(s._strides)
        sizes[dim] = count
        strides[dim] = s._strides[dim] * step
        new_slice = Slice(offset=s._offset + start * s._strides[dim], sizes=sizes, strides=strides)
        return Shape(self._labels, new_slice)

    def index(self, **kwargs: int) -> Shape:
        """Apply ``at`` for every ``label=index`` pair."""
        shape = self
        for label, index in kwargs.items():
            shape = shape.at(label, index)
        return shape

    def ranks(self) -> list[int]:
        """Global ranks in local order."""
        return list(self._slice)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Coordinate of global ``rank`` as a label-to-index dict."""
        return dict(zip(self._labels, self._slice.coordinates(rank), strict=True))

    def __len__(self) -> int:
        return len(self._slice)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._labels == other._labels and self._slice == other._slice

    def __hash__(self) -> int:
        return hash((Shape, self._labels, self._slice))

    def __repr__(self) -> str:
        return f"Shape({list(self._labels)!r}, {self._slice!r})"

    def __str__(self) -> str:
        return str(self.extent)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Shape is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Shape, (self._labels, self._slice))


class Region:
    """Labels plus a slice, seen as a region of a base rank space.

    ``point_of_base_rank(r)`` turns a global rank into the ``Point`` it occupies in this region.
    """

    __slots__ = ("_labels", "_slice")

    _labels: tuple[str, ...]
    _slice: Slice

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        shape = Shape(labels, slice)  # validates
        object.__setattr__(self, "_labels", shape._labels)
        object.__setattr__(self, "_slice", shape._slice)

    @property
    def labels(self) -> list[str]:
        """Dimension labels in order."""
        return list(self._labels)

    def slice(self) -> Slice:
        """The region's slice of base ranks."""
        return self._slice

    @property
    def extent(self) -> Extent:
        """Labels and sizes of the region."""
        return Extent(self._labels, self._slice._sizes)

    def point_of_base_rank(self, rank: int) -> Point:
        """The point that global ``rank`` occupies; ``ValueError`` if it is outside."""
        return Point(self._slice.index(rank), self.extent)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Region):
            return NotImplemented
        return self._labels == other._labels and self._slice == other._slice

    def __hash__(self) -> int:
        return hash((Region, self._labels, self._slice))

    def __repr__(self) -> str:
        return f"Region({list(self._labels)!r}, {self._slice!r})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Region is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Region, (self._labels, self._slice))


def _slice_shape(shape: Shape, selection: Mapping[str, object]) -> Shape:
    for label, selector in selection.items():
        if label not in shape._labels:
            raise TypeError(f"mesh does not have a dimension labeled {label!r}")
        if isinstance(selector, slice):
            shape = shape.select(label, selector)
            continue
        if isinstance(selector, bool) or not isinstance(selector, int):
            raise TypeError(
                f"selector for {label!r} must be an int or a slice, got {type(selector).__name__}"
            )
        size = shape._slice._sizes[shape._labels.index(label)]
        if not 0 <= selector < size:
            raise IndexError("index out of range")
        shape = shape.at(label, selector)
    return shape


def _split_shape(shape: Shape, kwargs: Mapping[str, object]) -> Shape:
    groups: dict[str, tuple[str, ...]] = {}
    constraints: dict[str, int] = {}
    for key, value in kwargs.items():
        if key in shape._labels:
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise ValueError(
                    f"split of {key!r} expects a sequence of new dimension names, got {value!r}"
                )
            names = tuple(value)
            if not names or not all(isinstance(n, str) for n in names):
                raise ValueError(f"split of {key!r} expects dimension names, got {value!r}")
            if len(set(names)) != len(names):
                raise ValueError(f"duplicate dimension name in {names!r}")
            groups[key] = names
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{key!r} is not a dimension of the mesh, so it must be an int size "
                    f"constraint for a new dimension, got {value!r}"
                )
            if value <= 0:
                raise ValueError(f"size constraint {key}={value} must be positive")
            constraints[key] = value

    new_labels: list[str] = []
    new_sizes: list[int] = []
    new_strides: list[int] = []
    s = shape._slice
    for label, size, stride in zip(shape._labels, s._sizes, s._strides, strict=True):
        names = groups.get(label, (label,))
        known = 1
        unknown: str | None = None
        for name in names:
            if name in constraints:
                known *= constraints[name]
            elif unknown is None:
                unknown = name
            else:
                raise ValueError(
                    f"cannot infer the sizes of both {unknown!r} and {name!r} when splitting "
                    f"{label!r}; give one of them a size, e.g. {name}=2"
                )
        sizes_here: dict[str, int] = {}
        if unknown is not None:
            inferred, rest = divmod(size, known)
            if rest != 0:
                raise ValueError(
                    f"dimension {label!r} of size {size} does not divide into {names!r}"
                )
            sizes_here[unknown] = inferred
        elif known != size:
            raise ValueError(
                f"dimension {label!r} of size {size} does not split into {names!r} "
                f"with sizes {tuple(constraints[n] for n in names)!r}"
            )
        for name in names:
            if name not in sizes_here:
                sizes_here[name] = constraints.pop(name)
        group_sizes = [sizes_here[name] for name in names]
        # The innermost new dimension keeps the old stride; each outer one strides over the
        # ones inside it.
        group_strides = [0] * len(names)
        running = stride
        for i in range(len(names) - 1, -1, -1):
            group_strides[i] = running
            running *= group_sizes[i]
        for name in names:
            if name in new_labels:
                raise ValueError(f"duplicate dimension name {name!r}")
            new_labels.append(name)
        new_sizes.extend(group_sizes)
        new_strides.extend(group_strides)
    if constraints:
        raise ValueError(f"unused size constraints: {tuple(constraints)}")
    return Shape(new_labels, Slice(offset=s._offset, sizes=new_sizes, strides=new_strides))


def _flatten_shape(shape: Shape, name: str) -> Shape:
    if not isinstance(name, str):
        raise TypeError(f"flatten needs a dimension name, got {type(name).__name__}")
    s = shape._slice
    if not s.is_dense():
        raise ValueError(
            f"cannot flatten a sparse mesh: strides {s.strides} are not the dense strides "
            f"{list(_row_major_strides(s._sizes))} for sizes {s.sizes}"
        )
    return Shape([name], Slice(offset=s._offset, sizes=[len(s)], strides=[1]))


class MeshTrait(ABC):
    """The slicing API shared by host, proc, actor and value meshes.

    Implementors provide ``_ndslice``, ``_labels`` and ``_new_with_shape(shape)``; this class
    derives ``slice``, ``split``, ``rename``, ``flatten``, ``size``, ``sizes``, ``extent`` and
    ``len``. ``_new_with_shape`` is only ever given shapes that select a subset of the ranks of
    the current ``_ndslice``.
    """

    __slots__ = ()

    @property
    @abstractmethod
    def _ndslice(self) -> Slice: ...

    @property
    @abstractmethod
    def _labels(self) -> Sequence[str]: ...

    @abstractmethod
    def _new_with_shape(self, shape: Shape) -> Self: ...

    def _shape_now(self) -> Shape:
        return Shape(list(self._labels), self._ndslice)

    def slice(self, **kwargs: int | builtins.slice) -> Self:
        """Select along named dimensions.

        An ``int`` picks one index and removes the dimension; a ``slice`` restricts it and keeps
        it. Unknown labels raise ``TypeError``; bad integers ``IndexError("index out of range")``.
        """
        return self._new_with_shape(_slice_shape(self._shape_now(), kwargs))

    def split(self, **kwargs: Sequence[str] | int) -> Self:
        """Split dimensions into several, e.g. ``split(hosts=("dp", "pp"), pp=2)``.

        Each existing label maps to a sequence of new names; other keywords give sizes of new
        dimensions; one size per group may be inferred. Non-divisible sizes, duplicate names,
        unused size constraints and a plain string instead of a sequence raise ``ValueError``.
        """
        return self._new_with_shape(_split_shape(self._shape_now(), kwargs))

    def rename(self, **kwargs: str) -> Self:
        """Relabel dimensions (``rename(hosts="dp")``); others are kept."""
        return self.split(**{old: (new,) for old, new in kwargs.items()})

    def flatten(self, name: str) -> Self:
        """Collapse all dimensions into one named ``name``; ``ValueError`` unless dense."""
        return self._new_with_shape(_flatten_shape(self._shape_now(), name))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Number of ranks, or the size (product of sizes) of the named dimension(s).

        Unknown dimensions raise ``KeyError``.
        """
        labels = list(self._labels)
        if dim is None:
            return len(self._ndslice)
        if isinstance(dim, str):
            if dim not in labels:
                raise KeyError(f"mesh with dimensions {labels} does not have dimension {dim!r}")
            return self._ndslice.sizes[labels.index(dim)]
        total = 1
        for d in dim:
            total *= self.size(d)
        return total

    @property
    def sizes(self) -> dict[str, int]:
        """Label-to-size dict."""
        return dict(zip(self._labels, self._ndslice.sizes, strict=True))

    @property
    def extent(self) -> Extent:
        """The mesh's ``Extent``."""
        return Extent(list(self._labels), self._ndslice.sizes)

    def __len__(self) -> int:
        return len(self._ndslice)


class ShapedMesh(MeshTrait):
    """A ``MeshTrait`` whose shape is its ``_shape`` attribute (host, proc, actor and value
    meshes): it derives ``_ndslice`` and ``_labels`` from it."""

    __slots__ = ()

    _shape: Shape

    @property
    def _ndslice(self) -> Slice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels
