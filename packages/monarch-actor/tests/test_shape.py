"""Shapes, slices, extents, points and the mesh slicing algebra.

Example tests pin the reference behaviour (``test_actor_shape.py`` of Monarch); a hypothesis
test checks random chains of ``slice``/``split``/``flatten``/``rename`` against a naive model that
keeps every point as an explicit (coordinates, global rank) pair.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.actor import Extent, MeshTrait, Point, Region, Shape, Slice
from monarch.actor._base.shape import MAX_DIMS, DimensionNotFoundError


# -- Slice ------------------------------------------------------------------------------------
def test_row_major_slice_enumerates_ranks_in_order() -> None:
    s = Slice.new_row_major([2, 3])
    assert s.strides == [3, 1]
    assert list(s) == [0, 1, 2, 3, 4, 5]
    assert len(s) == 6


def test_slice_index_coordinates_nditem_and_get_agree() -> None:
    s = Slice(offset=5, sizes=[2, 3], strides=[10, 2])
    assert list(s) == [5, 7, 9, 15, 17, 19]
    assert s.index(17) == 4
    assert s.coordinates(17) == [1, 1]
    assert s.nditem([1, 1]) == 17
    assert s.get(4) == 17
    assert 17 in s
    assert 6 not in s


def test_slice_rejects_ranks_and_indices_outside() -> None:
    s = Slice.new_row_major([2, 2])
    with pytest.raises(ValueError, match="not in"):
        s.index(7)
    with pytest.raises(ValueError, match="out of range"):
        s.get(4)
    with pytest.raises(ValueError, match="out of range"):
        s.nditem([2, 0])
    with pytest.raises(ValueError, match="expected 2 coordinates"):
        s.nditem([0])


def test_slice_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="same length"):
        Slice(offset=0, sizes=[1, 2], strides=[1])
    with pytest.raises(ValueError, match="non-negative"):
        Slice(offset=0, sizes=[-1], strides=[1])
    with pytest.raises(ValueError, match="non-negative"):
        Slice(offset=-1, sizes=[1], strides=[1])
    with pytest.raises(TypeError):
        Slice(offset=0, sizes=["2"], strides=[1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="dimensions"):
        Slice.new_row_major([1] * (MAX_DIMS + 1))


def test_slice_is_immutable_hashable_and_picklable() -> None:
    s = Slice(offset=3, sizes=[2], strides=[4])
    assert pickle.loads(pickle.dumps(s)) == s
    assert hash(s) == hash(Slice(offset=3, sizes=[2], strides=[4]))
    with pytest.raises(AttributeError):
        s._offset = 4


def test_zero_dimensional_slice_holds_its_offset() -> None:
    s = Slice(offset=7, sizes=[], strides=[])
    assert list(s) == [7]
    assert s.index(7) == 0


# -- Extent and Point ---------------------------------------------------------------------------
def test_extent_is_an_ordered_mapping_that_prints_like_monarch() -> None:
    e = Extent(["gpus", "x"], [2, 3])
    assert str(e) == "{gpus: 2, x: 3}"
    assert dict(e) == {"gpus": 2, "x": 3}
    assert e.labels == ["gpus", "x"]
    assert e.sizes == [2, 3]
    assert e.nelements == 6
    assert e == Extent(["gpus", "x"], [2, 3])
    assert hash(e) == hash(Extent(["gpus", "x"], [2, 3]))
    assert pickle.loads(pickle.dumps(e)) == e


def test_extent_rejects_duplicate_labels_and_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Extent(["a", "a"], [1, 2])
    with pytest.raises(ValueError, match="labels but"):
        Extent(["a"], [1, 2])


def test_point_coordinates_rank_and_string_form() -> None:
    p = Point(4, Extent(["hosts", "gpus"], [2, 3]))
    assert p["hosts"] == 1
    assert p["gpus"] == 1
    assert p.rank == 4
    assert p.size("gpus") == 3
    assert str(p) == "{'hosts': 1/2, 'gpus': 1/3}"
    assert dict(p) == {"hosts": 1, "gpus": 1}
    assert str(Point(0, Extent([], []))) == "{}"


def test_point_unknown_dimension_is_a_value_error_and_a_key_error() -> None:
    p = Point(0, Extent([], []))
    with pytest.raises(ValueError, match="Dimension 'gpus' not found"):
        p["gpus"]
    assert p.get("gpus") is None
    assert "gpus" not in p
    assert issubclass(DimensionNotFoundError, KeyError)


def test_point_is_not_hashable_like_the_reference() -> None:
    p = Point(1, Extent(["x"], [2]))
    with pytest.raises(TypeError):
        hash(p)
    assert p == {"x": 1}


def test_point_rank_out_of_range_is_rejected() -> None:
    with pytest.raises(ValueError, match="out of range"):
        Point(6, Extent(["x", "y"], [2, 3]))


# -- Shape -------------------------------------------------------------------------------------
def test_shape_at_removes_dimension_and_moves_offset() -> None:
    shape = Shape(
        ["batch", "height", "width"], Slice(offset=0, sizes=[2, 3, 4], strides=[12, 4, 1])
    )
    first = shape.at("batch", 1)
    assert first.labels == ["height", "width"]
    assert (first.ndslice.sizes, first.ndslice.strides, first.ndslice.offset) == (
        [3, 4],
        [4, 1],
        12,
    )
    middle = shape.at("height", 2)
    assert (middle.ndslice.sizes, middle.ndslice.strides, middle.ndslice.offset) == (
        [2, 4],
        [12, 1],
        8,
    )
    last = shape.at("width", 3)
    assert (last.labels, last.ndslice.offset) == (["batch", "height"], 3)


def test_shape_select_keeps_dimension_with_step() -> None:
    shape = Shape(["rows", "cols"], Slice.new_row_major([4, 6]))
    rows = shape.select("rows", slice(1, 3))
    assert (rows.ndslice.sizes, rows.ndslice.offset) == ([2, 6], 6)
    cols = shape.select("cols", slice(0, 6, 2))
    assert (cols.ndslice.sizes, cols.ndslice.strides) == ([4, 3], [6, 2])


def test_shape_chained_operations() -> None:
    shape = Shape(["batch", "height", "width"], Slice.new_row_major([2, 3, 4]))
    assert shape.select("width", slice(1, 4)).at("batch", 0).ndslice.sizes == [3, 3]
    assert shape.at("height", 1).select("width", slice(2, 4)).ndslice.sizes == [2, 2]


def test_shape_at_error_types() -> None:
    shape = Shape(["rows", "cols"], Slice.new_row_major([2, 3]))
    with pytest.raises(ValueError):
        shape.at("nonexistent", 0)
    with pytest.raises(ValueError):
        shape.at("rows", 5)
    with pytest.raises(OverflowError):
        shape.at("rows", -1)


def test_shape_select_rejects_empty_and_negative_steps() -> None:
    shape = Shape(["rows"], Slice.new_row_major([4]))
    with pytest.raises(ValueError, match="empty"):
        shape.select("rows", slice(3, 1))
    with pytest.raises(ValueError, match="positive"):
        shape.select("rows", slice(None, None, -1))


def test_shape_index_unity_ranks_and_region() -> None:
    shape = Shape(["a", "b"], Slice.new_row_major([2, 3]))
    assert shape.index(a=1, b=2).ranks() == [5]
    assert Shape.unity().ranks() == [0]
    region = shape.region
    assert isinstance(region, Region)
    assert region.point_of_base_rank(4) == {"a": 1, "b": 1}
    assert region.slice() == shape.ndslice
    assert pickle.loads(pickle.dumps(shape)) == shape


# -- MeshTrait ------------------------------------------------------------------------------------
@dataclass
class Grid(MeshTrait):
    """A minimal mesh: only the three abstract members (reference ``test_mesh_trait``)."""

    shape: Shape

    @property
    def _ndslice(self) -> Slice:
        return self.shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self.shape.labels

    def _new_with_shape(self, shape: Shape) -> Grid:
        return Grid(shape)


def grid(**sizes: int) -> Grid:
    return Grid(Shape(list(sizes), Slice.new_row_major(list(sizes.values()))))


def test_mesh_trait_gives_len_for_free() -> None:
    assert len(grid(hosts=3, gpus=4)) == 12


def test_mesh_slice_int_removes_dimension_and_slice_keeps_it() -> None:
    g = grid(a=4, b=5, c=6)
    assert g.slice(a=1, c=2).shape.labels == ["b"]
    kept = g.slice(b=slice(1, 4), c=slice(0, 6, 2))
    assert kept.sizes == {"a": 4, "b": 3, "c": 3}
    mixed = g.slice(a=2, b=slice(1, 3))
    assert mixed.sizes == {"b": 2, "c": 6}


def test_mesh_slice_errors() -> None:
    g = grid(gpus=2)
    with pytest.raises(TypeError, match="dimension"):
        g.slice(hosts=0)
    with pytest.raises(IndexError, match="index out of range"):
        g.slice(gpus=2)
    with pytest.raises(IndexError, match="index out of range"):
        g.slice(gpus=-1)
    with pytest.raises(TypeError):
        g.slice(gpus="0")  # type: ignore[arg-type]


def test_mesh_split_infers_one_size_per_group() -> None:
    g = grid(hosts=8, gpus=2).split(hosts=("dp", "pp"), pp=2)
    assert g.sizes == {"dp": 4, "pp": 2, "gpus": 2}
    assert list(g._ndslice) == list(range(16))


def test_mesh_split_errors() -> None:
    g = grid(hosts=6)
    with pytest.raises(ValueError, match="does not divide"):
        g.split(hosts=("dp", "pp"), pp=4)
    with pytest.raises(ValueError, match="duplicate"):
        g.split(hosts=("x", "x"), x=2)
    with pytest.raises(ValueError, match="unused size constraints"):
        g.split(hosts=("dp", "pp"), pp=2, zz=3)
    with pytest.raises(ValueError, match="sequence"):
        g.split(hosts="dp")
    with pytest.raises(ValueError, match="infer"):
        g.split(hosts=("a", "b"))


def test_mesh_rename_and_flatten() -> None:
    g = grid(x=2, y=3)
    assert g.rename(x="rows", y="cols").shape.labels == ["rows", "cols"]
    flat = g.flatten("r")
    assert flat.sizes == {"r": 6}
    assert list(flat._ndslice) == list(range(6))


def test_flatten_rejects_sparse_meshes() -> None:
    with pytest.raises(ValueError, match="sparse"):
        grid(hosts=2, gpus=4).slice(gpus=slice(0, 2)).flatten("r")


def test_mesh_size_sizes_extent() -> None:
    g = grid(hosts=2, gpus=3)
    assert g.size() == 6
    assert g.size("gpus") == 3
    assert g.size(["hosts", "gpus"]) == 6
    with pytest.raises(KeyError):
        g.size("nope")
    assert str(g.extent) == "{hosts: 2, gpus: 3}"


# -- property test: the algebra against a naive model ----------------------------------------------
Model = tuple[list[str], list[int], list[tuple[tuple[int, ...], int]]]


def model_of(shape: Shape) -> Model:
    sizes = shape.ndslice.sizes
    points = []
    for index, rank in enumerate(shape.ndslice):
        coords = []
        rest = index
        for size in reversed(sizes):
            rest, c = divmod(rest, size)
            coords.append(c)
        points.append((tuple(reversed(coords)), rank))
    return list(shape.labels), list(sizes), points


def naive_start(labels: list[str], sizes: list[int], offset: int) -> Model:
    points = []
    import itertools

    for coords in itertools.product(*(range(s) for s in sizes)):
        rank = offset
        for c, stride in zip(coords, Slice.new_row_major(sizes).strides, strict=True):
            rank += c * stride
        points.append((coords, rank))
    return labels, sizes, points


def naive_at(m: Model, dim: int, index: int) -> Model:
    labels, sizes, points = m
    kept = [(c[:dim] + c[dim + 1 :], r) for c, r in points if c[dim] == index]
    return labels[:dim] + labels[dim + 1 :], sizes[:dim] + sizes[dim + 1 :], kept


def naive_select(m: Model, dim: int, sel: slice) -> Model:
    labels, sizes, points = m
    chosen = list(range(*sel.indices(sizes[dim])))
    where = {v: i for i, v in enumerate(chosen)}
    kept = [((*c[:dim], where[c[dim]], *c[dim + 1 :]), r) for c, r in points if c[dim] in where]
    new_sizes = list(sizes)
    new_sizes[dim] = len(chosen)
    return labels, new_sizes, kept


def naive_split(m: Model, dim: int, inner: int, names: tuple[str, str]) -> Model:
    labels, sizes, points = m
    outer = sizes[dim] // inner
    new_points = [
        ((*c[:dim], c[dim] // inner, c[dim] % inner, *c[dim + 1 :]), r) for c, r in points
    ]
    return (
        labels[:dim] + list(names) + labels[dim + 1 :],
        [*sizes[:dim], outer, inner, *sizes[dim + 1 :]],
        new_points,
    )


def naive_flatten(m: Model, name: str) -> Model | None:
    _, _, points = m
    ranks = [r for _, r in points]
    if any(b - a != 1 for a, b in itertools.pairwise(ranks)):
        return None
    return [name], [len(points)], [((i,), r) for i, (_, r) in enumerate(points)]


ops = st.lists(
    st.tuples(
        st.sampled_from(["at", "select", "split", "flatten", "rename"]),
        st.integers(0, 7),
        st.integers(0, 7),
        st.integers(1, 3),
    ),
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    offset=st.integers(0, 9),
    program=ops,
)
def test_mesh_algebra_matches_naive_model(
    sizes: list[int], offset: int, program: list[tuple[str, int, int, int]]
) -> None:
    labels = [f"d{i}" for i in range(len(sizes))]
    base = Slice.new_row_major(sizes)
    g = Grid(Shape(labels, Slice(offset=offset, sizes=sizes, strides=base.strides)))
    model = naive_start(labels, sizes, offset)
    fresh = iter(range(1000))
    for op, a, b, step in program:
        m_labels, m_sizes, _ = model
        if op == "flatten":
            expected = naive_flatten(model, f"f{next(fresh)}")
            name = f"f{next(fresh)}"
            if expected is None:
                with pytest.raises(ValueError, match="sparse"):
                    g.flatten(name)
                continue
            g = g.flatten(name)
            model = ([name], expected[1], expected[2])
            continue
        if not m_labels:
            continue
        dim = a % len(m_labels)
        label = m_labels[dim]
        if op == "at":
            index = b % m_sizes[dim]
            g = g.slice(**{label: index})
            model = naive_at(model, dim, index)
        elif op == "select":
            start = a % m_sizes[dim]
            sel = slice(start, start + b + 1, step)
            g = g.slice(**{label: sel})
            model = naive_select(model, dim, sel)
        elif op == "split":
            inner = step if m_sizes[dim] % step == 0 else 1
            names = (f"s{next(fresh)}", f"s{next(fresh)}")
            split_args: dict[str, Any] = {label: names, names[1]: inner}
            g = g.split(**split_args)
            model = naive_split(model, dim, inner, names)
        else:
            new = f"r{next(fresh)}"
            g = g.rename(**{label: new})
            model = ([*m_labels[:dim], new, *m_labels[dim + 1 :]], m_sizes, model[2])
        m_labels, m_sizes, m_points = model
        assert list(g._labels) == m_labels
        assert g._ndslice.sizes == m_sizes
        assert list(g._ndslice) == [r for _, r in m_points]
        for index, (coords, rank) in enumerate(m_points):
            assert g._ndslice.nditem(list(coords)) == rank
            assert g._ndslice.index(rank) == index
            assert g._ndslice.coordinates(rank) == list(coords)
    assert model_of(g.shape)[2] == model[2]
