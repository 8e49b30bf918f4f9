"""The sans-IO pieces: the workers' bounded table and the geometry of device meshes."""

from __future__ import annotations

from typing import Any

import pytest

from monarch.tensor._mesh import Client, DeviceMesh
from monarch.tensor._table import Failure, TableFull, TensorTable


class _Workers:
    def slice(self, **coords: Any) -> _Workers:
        return self


def _mesh(**sizes: int) -> DeviceMesh:
    client = Client(_Workers(), list(sizes), list(sizes.values()))
    return DeviceMesh(client, _Workers(), tuple(tuple(range(s)) for s in sizes.values()))


def test_the_table_is_bounded_and_names_missing_refs() -> None:
    table = TensorTable(capacity=2)
    table.put(1, "a")
    table.put(2, "b")
    table.put(2, "b2")  # replacing is not growing
    with pytest.raises(TableFull, match="capacity 2"):
        table.put(3, "c")
    table.drop(1)
    table.put(3, "c")
    with pytest.raises(KeyError, match="ref 1 is not on this worker"):
        table.get(1)
    with pytest.raises(ValueError, match="at least 1"):
        TensorTable(capacity=0)


def test_the_first_failure_among_inputs_is_found() -> None:
    table = TensorTable()
    failure = Failure("aten::add.Tensor", "prog.py:3 in main", "Traceback ...", 1)
    table.put(1, "ok")
    table.put(2, failure)
    assert table.first_failure([1, 2]) is failure
    assert table.first_failure([1]) is None
    assert "aten::add.Tensor (issued at prog.py:3 in main) failed on worker rank 1" in (
        failure.describe()
    )


def test_reduction_groups_of_a_two_by_three_mesh() -> None:
    mesh = _mesh(hosts=2, gpus=3)
    assert mesh.ranks == (0, 1, 2, 3, 4, 5)
    assert mesh.groups(["gpus"]) == ((0, 1, 2), (3, 4, 5))
    assert mesh.groups(["hosts"]) == ((0, 3), (1, 4), (2, 5))
    assert mesh.groups(["hosts", "gpus"]) == ((0, 1, 2, 3, 4, 5),)
    with pytest.raises(ValueError, match="this mesh has dims"):
        mesh.groups(["procs"])


def test_slices_keep_root_ranks() -> None:
    mesh = _mesh(hosts=2, gpus=3)
    second_host = mesh.slice(hosts=1)
    assert second_host.names == ("gpus",)
    assert second_host.ranks == (3, 4, 5)
    assert second_host.rank_set == frozenset({3, 4, 5})
    assert mesh.rank_set is None
    assert second_host.groups(["gpus"]) == ((3, 4, 5),)
    odd = mesh.slice(gpus=slice(1, 3))
    assert odd.sizes == {"hosts": 2, "gpus": 2}
    assert odd.groups(["hosts"]) == ((1, 4), (2, 5))
    assert odd.rank_of({"hosts": 1, "gpus": 0}) == 4
    assert mesh.slice(hosts=1) == second_host
    with pytest.raises(ValueError, match="missing"):
        mesh.rank_of({"hosts": 0})
    with pytest.raises(IndexError):
        mesh.slice(gpus=3)
