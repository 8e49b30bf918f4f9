"""``to_mesh``: dimensions matched by name (the reference's rules and errors), broadcast along
dimensions the source lacks, within one process mesh and between two (spawned once for the
module, per transport mode)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from monarch.actor import ProcMesh, this_host
from monarch.config import configured
from monarch.tensor import (
    RemoteException,
    Tensor,
    coalescing,
    fetch_shard,
    no_mesh,
    remote,
    slice_mesh,
    to_mesh,
)

sys.path.insert(0, str(Path(__file__).parent))  # workers import tensor_helpers by name
from tensor_helpers import expected_shard, explode, shard_data

T = 60.0

shard = remote(shard_data, propagate=lambda like: torch.empty_like(like))


@pytest.fixture(scope="module", params=["lanes", "force-quic"])
def meshes(request: pytest.FixtureRequest) -> Iterator[tuple[ProcMesh, ProcMesh]]:
    """Two process meshes of two processes each (dims ``gpus``)."""
    with configured(force_quic=request.param == "force-quic"):
        a = this_host().spawn_procs(per_host={"gpus": 2})
        b = this_host().spawn_procs(per_host={"gpus": 2})
        try:
            yield a, b
        finally:
            a.stop().get(timeout=T)
            b.stop().get(timeout=T)


def value(t: Any, **coords: int) -> torch.Tensor:
    got = fetch_shard(t, coords).get(timeout=T)
    assert isinstance(got, torch.Tensor)
    return got


def local(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    with no_mesh.activate():
        return expected_shard(rank, shape)


def test_between_process_meshes_each_process_gets_its_peer_shard(
    meshes: tuple[ProcMesh, ProcMesh],
) -> None:
    a, b = meshes
    with a.activate():
        x = shard(torch.zeros(3))
        moved = to_mesh(x, b)  # a ProcMesh names its whole device mesh
        x.add_(100)  # after the move: the moved copy keeps the earlier values
    assert isinstance(moved, Tensor)
    assert moved.mesh.client is not x.mesh.client
    with b.activate() as mesh:
        assert moved.mesh == mesh
        doubled = moved * 2  # runs on b's processes
        back = to_mesh(doubled + 1, x.mesh)
    assert torch.equal(value(doubled, gpus=0), local(0, (3,)) * 2)
    assert torch.equal(value(doubled, gpus=1), local(1, (3,)) * 2)
    assert torch.equal(value(back, gpus=1), local(1, (3,)) * 2 + 1)
    assert torch.equal(value(x, gpus=1), local(1, (3,)) + 100)


def test_a_source_dimension_missing_in_the_destination_is_broadcast(
    meshes: tuple[ProcMesh, ProcMesh],
) -> None:
    a, b = meshes
    with a.activate():
        x = shard(torch.zeros(2, 2))
        one = slice_mesh(x, gpus=1)  # no dims: rank 1's shard
        with pytest.warns(UserWarning, match="to_mesh is broadcasting along gpus dimension"):
            everywhere = to_mesh(one, b)
        with pytest.warns(UserWarning, match="broadcasting along gpus"):
            here = to_mesh(slice_mesh(x, gpus=0), x.mesh)  # within one process mesh
    for rank in (0, 1):
        assert torch.equal(value(everywhere, gpus=rank), local(1, (2, 2)))
        assert torch.equal(value(here, gpus=rank), local(0, (2, 2)))


def test_the_reference_errors_for_meshes_that_do_not_match(
    meshes: tuple[ProcMesh, ProcMesh],
) -> None:
    a, _ = meshes
    with a.activate() as mesh:
        x = torch.ones(2)
        with pytest.raises(
            ValueError,
            match="dimension gpus of destination device_mesh has a different length than the "
            "source tensor",
        ):
            to_mesh(x, mesh.slice(gpus=slice(0, 1)))
        with pytest.raises(
            ValueError, match=r"destination mesh does not have dimensions \{'gpus'\}"
        ):
            to_mesh(x, mesh.slice(gpus=0))


def test_a_failed_shard_moves_as_its_failure(meshes: tuple[ProcMesh, ProcMesh]) -> None:
    a, b = meshes
    with a.activate():
        bad = remote(explode, propagate=lambda x: x)(torch.ones(2))
        moved = to_mesh(bad, b)
    with b.activate():
        later = moved + 1
    with pytest.raises(RemoteException, match="exploded on purpose") as info:
        value(later, gpus=1)
    assert "explode" in info.value.op


def test_within_one_mesh_matches_by_name(meshes: tuple[ProcMesh, ProcMesh]) -> None:
    a, _ = meshes
    with a.activate() as mesh:
        x = shard(torch.zeros(2))
        same = to_mesh(x, mesh)  # a copy, not x itself
        x.mul_(0)
    assert same is not x
    assert torch.equal(value(same, gpus=1), local(1, (2,)))


def test_a_coalescing_block_refuses_a_second_mesh(meshes: tuple[ProcMesh, ProcMesh]) -> None:
    a, b = meshes

    def both() -> None:
        with coalescing():
            torch.ones(2) + 1
            with b.activate():
                torch.ones(2) + 1

    with a.activate(), pytest.raises(ValueError, match="multiple controllers"):
        both()


def test_the_tensor_methods_as_the_reference_writes_them(
    meshes: tuple[ProcMesh, ProcMesh],
) -> None:
    a, b = meshes
    with a.activate():
        x = shard(torch.zeros(2))
        with pytest.warns(UserWarning, match="broadcasting along gpus"):
            spread = x.slice_mesh(gpus=1).to_mesh(b)  # one process's shard to all of b
    assert spread.mesh.client is not x.mesh.client
    for rank in (0, 1):
        assert torch.equal(value(spread, gpus=rank), local(1, (2,)))
