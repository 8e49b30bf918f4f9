"""The torchrun ranks of a mesh position (sans-IO), against an enumeration of the whole mesh."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.spmd import TorchrunRanks, torchrun_ranks

LABELS = ("hosts", "racks", "zones", "gpus")


def _points(sizes: dict[str, int]) -> list[dict[str, int]]:
    """Every position of the mesh in row-major order (rank = index)."""
    labels = list(sizes)
    return [
        dict(zip(labels, c, strict=True))
        for c in itertools.product(*(range(sizes[k]) for k in labels))
    ]


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(
    lambda sizes: {LABELS[-len(sizes) + i]: s for i, s in enumerate(sizes)}
)


@given(shapes)
def test_ranks_of_every_position_are_torchruns(sizes: dict[str, int]) -> None:
    points = _points(sizes)
    ranks = [torchrun_ranks(rank, point, sizes) for rank, point in enumerate(points)]
    local = list(sizes)[-1]
    hosts = [tuple(v for k, v in p.items() if k != local) for p in points]
    assert len(ranks) == math.prod(sizes.values())
    for r, point, host in zip(ranks, points, hosts, strict=True):
        assert r.world_size == len(points)
        assert r.local_world_size == sizes[local]
        assert r.local_rank == point[local]
        # one group per host (every other coordinate), numbered in mesh order
        assert r.group_rank == sorted(set(hosts)).index(host)
        assert r.group_world_size == len(set(hosts))
        assert r.rank == r.group_rank * r.local_world_size + r.local_rank
    assert sorted(r.rank for r in ranks) == list(range(len(points)))


def test_variables_are_torchruns_names_as_strings() -> None:
    ranks = torchrun_ranks(5, {"hosts": 1, "gpus": 2}, {"hosts": 2, "gpus": 3})
    assert ranks == TorchrunRanks(5, 2, 6, 3, 1, 2)
    assert ranks.variables("node0", 29500) == {
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "RANK": "5",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "6",
        "ROLE_NAME": "rank",
        "WORLD_SIZE": "6",
    }


def test_a_mesh_without_dimensions_is_one_process() -> None:
    assert torchrun_ranks(0, {}, {}) == TorchrunRanks(0, 0, 1, 1, 0, 1)


@pytest.mark.parametrize(
    ("rank", "coordinates", "sizes", "message"),
    [
        (0, {"gpus": 0}, {"hosts": 1, "gpus": 1}, "do not name"),
        (0, {"gpus": 2}, {"gpus": 2}, "outside size"),
        (0, {"gpus": 0}, {"gpus": 0}, "has size 0"),
        (4, {"gpus": 1}, {"gpus": 2}, "outside a world"),
    ],
)
def test_bad_positions_are_rejected(
    rank: int, coordinates: dict[str, int], sizes: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        torchrun_ranks(rank, coordinates, sizes)


@pytest.mark.parametrize(
    ("addr", "port", "message"),
    [("", 1, "non-empty"), ("h", 0, "1..65535"), ("h", 70000, "1..65535"), ("h", "80", "int")],
)
def test_bad_rendezvous_points_are_rejected(addr: str, port: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        torchrun_ranks(0, {"gpus": 0}, {"gpus": 1}).variables(addr, port)
