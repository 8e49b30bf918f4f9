"""``SPMDActor`` and ``setup_torch_elastic_env`` on real worker processes (spec section 4)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import ActorError, ProcMesh, this_host
from monarch.spmd import AddrType, SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async

sys.path.insert(0, str(Path(__file__).parent))  # workers import spmd_actors, spmd_script
from spmd_actors import EnvReader

TESTS = Path(__file__).parent

T = 60.0


@pytest.fixture(scope="module")
def mesh() -> Iterator[ProcMesh]:
    """Four worker processes, two "hosts" of two, shared by the tests of this module."""
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=T)


@pytest.fixture(scope="module")
def readers(mesh: ProcMesh) -> Any:
    return mesh.spawn("env_reader", EnvReader)


def test_setup_with_a_given_master_sets_torchruns_variables(mesh: ProcMesh, readers: Any) -> None:
    setup_torch_elastic_env(mesh, "master.example", 29501)
    envs = readers.torchrun_env.call().get(timeout=T).values()
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
        ("2", "0", "1"),
        ("3", "1", "1"),
    ]
    for env in envs:
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == env["GROUP_WORLD_SIZE"] == "2"
        assert env["ROLE_RANK"] == env["RANK"]
        assert env["ROLE_NAME"] == "rank"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("master.example", "29501")


def test_setup_without_a_master_picks_the_first_process_host_and_a_free_port(
    mesh: ProcMesh, readers: Any
) -> None:
    setup_torch_elastic_env(mesh)
    envs = readers.torchrun_env.call().get(timeout=T).values()
    assert {e["MASTER_ADDR"] for e in envs} == {socket.gethostname()}
    (port,) = {e["MASTER_PORT"] for e in envs}
    assert port is not None
    assert 0 < int(port) < 65536


def test_the_async_form_awaits_the_same_setup(mesh: ProcMesh, readers: Any) -> None:
    asyncio.run(setup_torch_elastic_env_async(mesh, "async.example", 29502))
    envs = readers.torchrun_env.call().get(timeout=T).values()
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("async.example", "29502")}
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(("addr", "port"), [("only.addr", None), (None, 29500)])
def test_master_addr_and_port_come_both_or_neither(
    mesh: ProcMesh, addr: str | None, port: int | None
) -> None:
    with pytest.raises(ValueError, match="both master_addr and master_port"):
        setup_torch_elastic_env(mesh, addr, port)
    with pytest.raises(ValueError, match="both master_addr and master_port"):
        asyncio.run(setup_torch_elastic_env_async(mesh, addr, port))


def test_get_host_port_gives_the_host_name_or_an_address(mesh: ProcMesh) -> None:
    actors: Any = mesh.spawn("host_port", SPMDActor)
    first = actors.slice(hosts=0, gpus=0)
    host, port = first.get_host_port.call_one(None).get(timeout=T)
    assert host == socket.gethostname()
    assert isinstance(port, int)
    assert 0 < port < 65536
    addr, _ = first.get_host_port.call_one(AddrType.IPv4).get(timeout=T)
    assert ipaddress.ip_address(addr).version == 4


@pytest.fixture(scope="module")
def spmd(mesh: ProcMesh) -> Any:
    return mesh.spawn("spmd", SPMDActor)


def _seen(out: Path) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(4)]


def test_main_runs_a_module_as_main_with_its_arguments(spmd: Any, tmp_path: Path) -> None:
    out = tmp_path / "module"
    done = spmd.main.call("localhost", 29503, ["-m", "spmd_script", str(out), "0"]).get(timeout=T)
    assert done.values() == [True] * 4
    seen = _seen(out)
    assert [s["env"]["RANK"] for s in seen] == ["0", "1", "2", "3"]
    assert [s["env"]["LOCAL_RANK"] for s in seen] == ["0", "1", "0", "1"]
    for s in seen:
        assert s["name"] == "__main__"
        assert s["argv"][1:] == [str(out), "0"]
        assert s["argv"][0].endswith("spmd_script.py")  # alter_sys: argv[0] is the file
        assert s["env"]["MASTER_PORT"] == "29503"


def test_main_runs_a_script_path_with_its_arguments(spmd: Any, tmp_path: Path) -> None:
    out = tmp_path / "script"
    script = str(TESTS / "spmd_script.py")
    assert (
        spmd.main.call("localhost", 29504, [script, str(out), "0"]).get(timeout=T).values()
        == [True] * 4
    )
    for s in _seen(out):
        assert s["argv"] == [script, str(out), "0"]
        assert s["env"]["WORLD_SIZE"] == "4"


def test_a_script_exiting_non_zero_is_an_error(spmd: Any, tmp_path: Path) -> None:
    with pytest.raises(ActorError, match="exited with status 3"):
        spmd.slice(hosts=0, gpus=1).main.call_one(
            "h", 1, ["-m", "spmd_script", str(tmp_path / "x"), "3"]
        ).get(timeout=T)


@pytest.mark.parametrize(("args", "message"), [([], "No script or module"), (["-m"], "No module")])
def test_main_without_a_script_is_a_value_error(spmd: Any, args: list[str], message: str) -> None:
    with pytest.raises(ActorError, match=message) as caught:
        spmd.slice(hosts=0, gpus=0).main.call_one("localhost", 29500, args).get(timeout=T)
    assert "ValueError" in str(caught.value)
