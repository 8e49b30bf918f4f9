"""``ValueMesh``: construction, access, iteration, slicing and pickling (reference catalogue 78)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.actor import Point, Shape, Slice, ValueMesh


def xy() -> ValueMesh[str]:
    shape = Shape(["x", "y"], Slice(offset=0, sizes=[2, 3], strides=[3, 1]))
    return ValueMesh(shape, ["00", "01", "02", "10", "11", "12"])


def test_construction_counts_values() -> None:
    assert len(xy()) == 6
    with pytest.raises(ValueError, match="6 ranks but 2 values"):
        ValueMesh(Shape(["x", "y"], Slice.new_row_major([2, 3])), [1, 2])


def test_values_are_in_rank_order() -> None:
    assert xy().values() == ["00", "01", "02", "10", "11", "12"]


def test_get_by_local_index_and_bounds() -> None:
    vm = xy()
    assert vm.get(4) == "11"
    with pytest.raises(ValueError, match="out of range"):
        vm.get(6)


def test_item_names_every_dimension() -> None:
    vm = xy()
    assert vm.item(x=0, y=2) == "02"
    assert vm.item(x=1, y=1) == "11"
    with pytest.raises(KeyError):
        vm.item(x=0, y=0, z=0)
    with pytest.raises(KeyError):
        vm.item(x=0)
    with pytest.raises(IndexError):
        vm.item(x=0, y=3)


def test_item_without_arguments_on_a_singleton() -> None:
    assert xy().slice(x=1, y=2).item() == "12"


def test_items_and_iteration_yield_point_value_pairs() -> None:
    items = xy().items()
    assert [v for _, v in items] == xy().values()
    point, value = items[4]
    assert isinstance(point, Point)
    assert (dict(point), value) == ({"x": 1, "y": 1}, "11")
    assert [v for _, v in xy()] == xy().values()


def test_dict_of_items_fails_because_points_are_unhashable() -> None:
    with pytest.raises(TypeError):
        dict(xy().items())


def test_from_indexed_is_order_independent_last_write_wins() -> None:
    shape = Shape(["r"], Slice.new_row_major([3]))
    vm = ValueMesh.from_indexed(shape, [(2, "c"), (0, "a"), (1, "x"), (1, "b")])
    assert vm.values() == ["a", "b", "c"]


def test_from_indexed_missing_rank_is_an_error() -> None:
    shape = Shape(["r"], Slice.new_row_major([3]))
    with pytest.raises(ValueError, match="missing"):
        ValueMesh.from_indexed(shape, [(0, "a"), (2, "c")])
    with pytest.raises(ValueError, match="out of range"):
        ValueMesh.from_indexed(shape, [(3, "d")])


def test_slice_rebases_indices() -> None:
    sliced = xy().slice(x=1)
    assert sliced.values() == ["10", "11", "12"]
    assert sliced.get(0) == "10"
    assert xy().slice(y=slice(1, 3)).values() == ["01", "02", "11", "12"]


def test_flatten_rename_split() -> None:
    vm = ValueMesh(Shape(["x", "y"], Slice.new_row_major([2, 3])), list(range(6)))
    flat = vm.flatten("r")
    assert flat.shape.labels == ["r"]
    assert flat.values() == list(range(6))
    assert flat.slice(r=1).item() == 1
    assert vm.rename(x="rows", y="cols").shape.labels == ["rows", "cols"]
    split = ValueMesh(Shape(["rank"], Slice.new_row_major([6])), list(range(6))).split(
        rank=("x", "y"), y=3
    )
    assert split.sizes == {"x": 2, "y": 3}
    assert split.values() == list(range(6))


def test_mesh_trait_members() -> None:
    vm = xy()
    assert vm.extent["x"] == 2
    assert vm.extent["y"] == 3
    assert vm.sizes == {"x": 2, "y": 3}
    assert vm.size() == 6
    assert vm.size("y") == 3


def test_repr_lists_points_and_values() -> None:
    shape = Shape(["x", "y", "z"], Slice(offset=0, sizes=[2, 2, 2], strides=[4, 2, 1]))
    vm = ValueMesh(shape, ["000", "001", "010", "011", "100", "101", "110", "111"])
    lines = repr(vm).splitlines()
    assert lines[0] == "ValueMesh({x: 2, y: 2, z: 2}):"
    # The reference Monarch 0.7.0's layout: the pairs pretty-printed as a tuple, indented.
    assert lines[1] == "  (({'x': 0/2, 'y': 0/2, 'z': 0/2}, '000'),"
    assert lines[2] == "   ({'x': 0/2, 'y': 0/2, 'z': 1/2}, '001'),"
    assert lines[-1] == "   ({'x': 1/2, 'y': 1/2, 'z': 1/2}, '111'))"
    short = ValueMesh(Shape(["g"], Slice.new_row_major([2])), [3, 4])
    assert repr(short) == "ValueMesh({g: 2}):\n  (({'g': 0/2}, 3), ({'g': 1/2}, 4))"


def test_pickle_round_trip_of_a_slice_keeps_only_its_values() -> None:
    big = ValueMesh(Shape(["x"], Slice.new_row_major([100])), [bytes(1000)] * 100)
    small = big.slice(x=slice(0, 2))
    payload = pickle.dumps(small)
    assert len(payload) < 10_000
    back = pickle.loads(payload)
    assert back.values() == small.values()
    assert back.shape == small.shape


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    picks=st.lists(st.integers(0, 10), min_size=3, max_size=3),
)
def test_slicing_a_value_mesh_matches_slicing_its_shape(sizes: list[int], picks: list[int]) -> None:
    labels = [f"d{i}" for i in range(len(sizes))]
    shape = Shape(labels, Slice.new_row_major(sizes))
    vm = ValueMesh(shape, [f"v{r}" for r in shape.ndslice])
    dim = picks[0] % len(sizes)
    index = picks[1] % sizes[dim]
    sliced = vm.slice(**{labels[dim]: index})
    expected_ranks = list(shape.at(labels[dim], index).ndslice)
    assert sliced.values() == [f"v{r}" for r in expected_ranks]
    for i, (point, value) in enumerate(sliced.items()):
        assert point.rank == i
        assert sliced.item(**dict(point)) == value
