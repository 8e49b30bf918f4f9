"""Monarch programs that must run unchanged (issue #15, item 7): real worker processes."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

import monarch.actor
from chrysalis.core import Pid
from monarch.actor import BootstrapCommand, Channel, Extent, ProcMesh, Shape, Slice, this_host
from monarch.actor._hosts.commands import FAILED_LINE, READY_LINE, STAGE_LINE
from monarch.actor._hosts.groups import read_worker_pids

sys.path.insert(0, str(Path(__file__).parent))  # workers import compat_actors by name
from compat_actors import Echo, LateReplier

T = 30.0


@pytest.fixture
def spawned() -> Iterator[list[ProcMesh]]:
    """Proc meshes the test spawned: stopped at the end (their workers killed if that fails)."""
    meshes: list[ProcMesh] = []
    yield meshes
    for mesh in meshes:
        pids: list[int] = []
        with contextlib.suppress(Exception):
            pids = list(mesh.spawn("reaper", Echo).os_pid.call().get(timeout=T).values())
        try:
            mesh.stop().get(timeout=T)
        except Exception:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_spawn_procs_without_arguments_is_a_one_process_mesh(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    procs = this_host().spawn_procs()  # raised "sizes and strides must have the same length"
    spawned.append(procs)
    assert procs.size() == 1
    assert dict(procs.extent) == {}
    echo = procs.spawn("echo", Echo)
    assert echo.rank.call_one().get(timeout=T) == "{}"
    assert list(echo.rank.call().get(timeout=T).values()) == ["{}"]
    assert echo.os_pid.call_one().get(timeout=T) != os.getpid()


def test_a_zero_dimensional_row_major_slice_holds_one_rank() -> None:
    assert Slice.new_row_major([]) == Slice(offset=0, sizes=[], strides=[])
    shape = Shape.from_extent(Extent([], []))
    assert list(shape.ndslice) == [0]
    assert shape.labels == []


def test_lambdas_closures_and_local_classes_cross_processes(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    spawned.append(procs)
    echo = procs.spawn("echo", Echo)
    one = echo.slice(gpus=1)
    offset = 100

    class Local:
        def __init__(self, value: int) -> None:
            self.value = value

    # As arguments: a lambda, a closure, a local class (the worker builds an instance).
    assert one.apply.call_one(lambda x: x * 3, 7).get(timeout=T) == 21
    assert list(echo.apply.call(lambda x: x + offset, 1).get(timeout=T).values()) == [101, 101]
    made = one.apply.call_one(Local, 9).get(timeout=T)
    assert type(made).__name__ == "Local"
    assert made.value == 9
    # As results: a closure and an instance of a class local to the endpoint.
    adder = one.make_adder.call_one(10).get(timeout=T)
    assert adder(5) == 15
    local = one.make_local_object.call_one(4).get(timeout=T)
    assert local.doubled() == 8


def test_cloudpickle_is_a_required_dependency() -> None:
    # Not an extra: Monarch programs pass lambdas without installing anything more.
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    required = project["project"]["dependencies"]
    assert any(r.startswith("cloudpickle") for r in required), required
    assert "cloudpickle" not in project["project"].get("optional-dependencies", {})


def test_explicit_response_port_answered_from_a_thread_after_returning(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    # The endpoint returns at once; a thread it started replies later, outside any actor.
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    spawned.append(procs)
    late = procs.spawn("late", LateReplier)
    assert late.slice(gpus=0).from_thread.call_one(21).get(timeout=T) == 42
    assert list(late.from_thread.call(5).get(timeout=T).values()) == [10, 10]
    with pytest.raises(ValueError, match="late boom"):
        late.slice(gpus=1).error_from_thread.call_one("late boom").get(timeout=T)
    port, receiver = Channel[str].open()
    late.slice(gpus=1).send_from_thread.broadcast(port, "via a channel")
    assert receiver.recv().get(timeout=T) == "via a channel"


ACTOR = """
from monarch.actor import Actor, endpoint, this_host, this_proc


class Doubler(Actor):
    @endpoint
    def double(self, x: int) -> int:
        return 2 * x
"""

UNGUARDED = {
    # The usual mistake: the program at module level, run again by every worker's import.
    "this_host": """
procs = this_host().spawn_procs(per_host={"gpus": 1})
print(procs.spawn("doubler", Doubler).double.call_one(21).get(timeout=60))
procs.stop().get()
""",
    # An actor in the client first: the worker's import would bootstrap a client of its own.
    "this_proc": """
print(this_proc().spawn("local", Doubler).double.call_one(1).get(timeout=60))
procs = this_host().spawn_procs(per_host={"gpus": 1})
print(procs.spawn("doubler", Doubler).double.call_one(21).get(timeout=60))
procs.stop().get()
""",
    # The program catches the refusal (and everything else) and goes on.
    "swallowed": """
try:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    print(procs.spawn("doubler", Doubler).double.call_one(21).get(timeout=60))
    procs.stop().get()
except Exception as exc:
    print("failed:", exc)
    raise SystemExit(7)
""",
}


def _run_script(tmp_path: Path, source: str, method: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(source)
    env = dict(os.environ, MONARCH_WORKER_SPAWN_METHOD=method)
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("method", ["zygote", "exec"])
@pytest.mark.parametrize("program", sorted(UNGUARDED))
def test_a_script_without_the_main_guard_is_told_what_is_wrong(
    tmp_path: Path, method: str, program: str
) -> None:
    done = _run_script(tmp_path, ACTOR + UNGUARDED[program], method)
    assert done.returncode != 0, done.stdout
    report = done.stdout + done.stderr
    assert "did not start in time" not in report
    assert "could not start: the client's main module" in report, report
    assert str(tmp_path / "prog.py") in report
    assert 'put it under `if __name__ == "__main__":`' in report


@pytest.mark.parametrize("method", ["zygote", "exec"])
def test_a_main_module_that_exits_on_import_is_told_what_is_wrong(
    tmp_path: Path, method: str
) -> None:
    source = ACTOR + textwrap.dedent(
        """
        import sys

        if __name__ != "__main__":
            sys.exit(4)  # e.g. argument parsing at module level, on the worker's arguments
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        print(procs.spawn("doubler", Doubler).double.call_one(21).get(timeout=60))
        """
    )
    done = _run_script(tmp_path, source, method)
    assert done.returncode != 0, done.stdout
    assert "ran code that exited (SystemExit(4))" in done.stderr, done.stderr
    assert 'if __name__ == "__main__":' in done.stderr


@pytest.mark.parametrize("method", ["zygote", "exec"])
def test_output_printed_while_a_worker_imports_the_main_module_is_forwarded(
    tmp_path: Path, method: str
) -> None:
    # A guarded script that prints at module level: each worker prints it too, before its
    # start-up line (once taken for that line: "did not start in time").
    source = ACTOR + textwrap.dedent(
        """
        print("module level", end="")  # no newline: the start-up line follows on its line
        print(" hello")

        if __name__ == "__main__":
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            print(procs.spawn("doubler", Doubler).double.call(21).get(timeout=60).values())
            procs.stop().get()
        """
    )
    done = _run_script(tmp_path, source, method)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("module level hello\n") == 3  # the client and two workers
    assert "[42, 42]" in done.stdout


class _FakeWorker:
    """A worker process that wrote ``output`` on its start-up pipe and then hung (or exited)."""

    def __init__(self, output: bytes, status: int | None) -> None:
        read, write = os.pipe()
        os.write(write, output)
        self._write: int | None = write
        if status is not None:
            self.close_pipe()  # it exited: end of file
        self.stdout = os.fdopen(read, "rb")
        self.stderr: IO[bytes] | None = None
        self.pid = 1
        self.status = status

    def close_pipe(self) -> None:
        if self._write is not None:
            os.close(self._write)
            self._write = None

    def close(self) -> None:
        self.close_pipe()
        self.stdout.close()

    def poll(self) -> int | None:
        return self.status

    def kill(self) -> None:
        self.status = -9

    def wait(self, timeout: float | None = None) -> int:
        if self.status is None:
            raise subprocess.TimeoutExpired("worker", timeout or 0.0)
        return self.status


@pytest.fixture
def fake_workers() -> Iterator[Callable[[bytes, int | None], _FakeWorker]]:
    made: list[_FakeWorker] = []

    def make(output: bytes, status: int | None) -> _FakeWorker:
        made.append(_FakeWorker(output, status))
        return made[-1]

    yield make
    for worker in made:
        worker.close()


def test_a_worker_that_hangs_while_importing_the_main_module_says_so(
    capfd: pytest.CaptureFixture[str], fake_workers: Callable[[bytes, int | None], _FakeWorker]
) -> None:
    stage = f"{STAGE_LINE}importing the client's main module /x/prog.py\n"
    worker = fake_workers(f"the program's output\n{stage}".encode(), None)
    why = read_worker_pids([worker], ["procs{'gpus': 0/1}"], timeout=0.2)
    assert why == (
        "worker process procs{'gpus': 0/1} did not start in time "
        "(while importing the client's main module /x/prog.py)"
    )
    assert capfd.readouterr().out == "the program's output\n"


def test_a_worker_start_up_failure_and_its_ready_line(
    fake_workers: Callable[[bytes, int | None], _FakeWorker],
) -> None:
    failed = fake_workers(f"{FAILED_LINE}could not join the client: nope\n".encode(), 1)
    assert read_worker_pids([failed], ["w"], timeout=5.0) == (
        "worker process w could not start: could not join the client: nope"
    )
    pid = "ab" * 16
    ready = fake_workers(f"before{READY_LINE}{pid}\n".encode(), None)
    assert read_worker_pids([ready], ["w"], timeout=5.0) == [Pid(bytes.fromhex(pid))]


SRC_ALIASES = {
    "actor_mesh": ["Actor", "ActorMesh", "Channel", "Port", "ValueMesh", "context", "send"],
    "bootstrap": ["attach_to_workers", "run_worker_loop_forever", "HostMesh"],
    "endpoint": ["Endpoint", "endpoint"],
    "future": ["Future"],
    "host_mesh": ["HostMesh", "this_host", "this_proc", "default_bootstrap_cmd"],
    "proc_mesh": ["ProcMesh", "get_or_spawn_controller"],
    "shape": ["Shape", "Slice", "MeshTrait", "Extent"],
}


@pytest.mark.parametrize("module", sorted(SRC_ALIASES))
def test_monarch_src_actor_modules_re_export_the_public_names(module: str) -> None:
    alias = importlib.import_module(f"monarch._src.actor.{module}")
    assert set(SRC_ALIASES[module]) <= set(alias.__all__)
    for name in alias.__all__:
        value = getattr(alias, name)
        public = getattr(monarch.actor, name, None)
        assert public is None or value is public, name  # the same objects, not copies
    if module in ("actor_mesh", "host_mesh", "shape"):
        assert alias.NDSlice is monarch.actor.Slice


def test_monarch_src_stays_a_namespace_other_packages_can_share() -> None:
    # No __init__.py: other distributions (monarch-rdma, ...) can add monarch._src.<theirs>.
    # ``monarch`` itself has one only where monarch-tensor is installed, and it keeps the
    # package open to the others (pkgutil.extend_path).
    for name in ("monarch", "monarch._src", "monarch._src.actor"):
        package = importlib.import_module(name)
        init = getattr(package, "__file__", None)
        shared = name == "monarch" and init is not None
        assert init is None or (shared and "extend_path(__path__" in Path(init).read_text()), name
    src = Path(importlib.import_module("monarch._src.actor.bootstrap").__file__ or "").parent
    assert not (src / "__init__.py").exists()
    assert not (src.parent / "__init__.py").exists()


def test_monarch_src_aliases_find_names_monarch_actor_gains_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import monarch._src.actor.bootstrap as bootstrap

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = bootstrap.not_a_name
    marker = object()
    monkeypatch.setattr(monarch.actor, "start_worker_loop_forever", marker, raising=False)
    assert bootstrap.start_worker_loop_forever is marker


def test_the_wheel_carries_the_monarch_src_aliases(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    root = Path(__file__).parent.parent
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=root,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in [*SRC_ALIASES, "bootstrap_main"]:
        assert f"monarch/_src/actor/{module}.py" in names, module
    assert "monarch/_src/__init__.py" not in names
    assert "monarch/_src/actor/__init__.py" not in names


def test_a_worker_started_with_the_references_bootstrap_main(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    # Monarch's documentation starts workers with `-m monarch._src.actor.bootstrap_main`.
    module = ["-m", "monarch._src.actor.bootstrap_main"]
    command = BootstrapCommand(sys.executable, None, module, {})
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=command)
    spawned.append(procs)
    echo = procs.spawn("echo", Echo)
    scripts = {Path(a).parts[-3:] for a in echo.argv0.call().get(timeout=T).values()}
    assert scripts == {("_src", "actor", "bootstrap_main.py")}
    assert echo.slice(gpus=1).apply.call_one(abs, -3).get(timeout=T) == 3


def test_the_readme_compatibility_example_runs_as_a_script(tmp_path: Path) -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    start = readme.index("# prog.py: written for Monarch 0.7.0")
    source = readme[start : readme.index("```", start)]
    done = _run_script(tmp_path, source, "zygote")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["11", "42"]
