"""The lifecycle every engine shares (``JobTrait``), with an in-memory engine: apply, state,
kill, the saved-job cache and its reuse, dumps/loads, the current-job context, ``JobState``."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from monarch.job import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    LocalJob,
    job_load,
    job_loads,
    load_current_job,
    set_current_job,
)

# What the fake engine's allocations did, by allocation number (shared across pickles).
EVENTS: list[tuple[str, int]] = []
ALIVE: set[int] = set()


class FakeJob(JobTrait):
    """An engine whose allocation is a number in ``ALIVE``."""

    next_allocation = 0

    def __init__(self, meshes: dict[str, int]) -> None:
        super().__init__()
        self.meshes = dict(meshes)
        self.allocation: int | None = None

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise RuntimeError("no scripts")
        FakeJob.next_allocation += 1
        self.allocation = FakeJob.next_allocation
        ALIVE.add(self.allocation)
        EVENTS.append(("create", self.allocation))

    def _state(self) -> JobState:
        assert self.allocation in ALIVE
        EVENTS.append(("state", self.allocation))
        return JobState({name: f"mesh-{name}-{self.allocation}" for name in self.meshes})  # type: ignore[misc]

    def _kill(self) -> None:
        assert self.allocation is not None
        ALIVE.discard(self.allocation)
        EVENTS.append(("kill", self.allocation))

    def can_run(self, spec: JobTrait) -> bool:
        return isinstance(spec, FakeJob) and spec.meshes == self.meshes and self.allocation in ALIVE


def mesh(state: JobState, name: str) -> Any:
    return getattr(state, name)


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    EVENTS.clear()
    ALIVE.clear()
    FakeJob.next_allocation = 0
    monkeypatch.chdir(tmp_path)


def test_apply_creates_once_and_sets_the_apply_id() -> None:
    job = FakeJob({"hosts": 2})
    assert (job.active, job.apply_id) == (False, None)
    job.apply()
    first = job.apply_id
    assert job.active is True
    assert first is not None
    job.apply()  # already running: a no-op
    assert EVENTS == [("create", 1)]
    assert job.apply_id == first


def test_state_applies_and_caches_then_a_new_spec_reconnects() -> None:
    job = FakeJob({"trainers": 2})
    state = job.state()
    assert mesh(state, "trainers") == "mesh-trainers-1"
    assert Path(DEFAULT_JOB_PATH).exists()
    again = FakeJob({"trainers": 2})  # a later client process would build the same spec
    state2 = again.state()
    assert mesh(state2, "trainers") == "mesh-trainers-1"  # the saved allocation, not a new one
    assert EVENTS == [("create", 1), ("state", 1), ("state", 1)]
    assert again.active
    assert again.apply_id == job.apply_id
    again.kill()
    assert EVENTS[-1] == ("kill", 1)
    assert not again.active


def test_a_saved_job_that_cannot_run_the_spec_is_killed_and_replaced() -> None:
    FakeJob({"a": 1}).state()
    other = FakeJob({"b": 3})
    state = other.state()
    assert mesh(state, "b") == "mesh-b-2"
    assert ("kill", 1) in EVENTS
    assert 1 not in ALIVE
    assert 2 in ALIVE
    saved = job_load()
    assert isinstance(saved, FakeJob)
    assert saved.meshes == {"b": 3}


def test_a_dead_saved_allocation_is_not_reused() -> None:
    FakeJob({"a": 1}).state()
    ALIVE.clear()  # the allocation ended behind the client's back
    state = FakeJob({"a": 1}).state()
    assert mesh(state, "a") == "mesh-a-2"


def test_state_without_a_cache_path_writes_nothing() -> None:
    FakeJob({"a": 1}).state(cached_path=None)
    assert not Path(".monarch").exists()


def test_dumps_and_loads_round_trip_the_allocation(tmp_path: Path) -> None:
    job = FakeJob({"a": 2})
    job.apply()
    loaded = job_loads(job.dumps())
    assert isinstance(loaded, FakeJob)
    assert loaded.allocation == job.allocation
    assert loaded.apply_id == job.apply_id
    path = tmp_path / "sub" / "job.pkl"
    job.dump(str(path))
    assert job_load(str(path)).apply_id == job.apply_id
    link = tmp_path / "link.pkl"
    link.symlink_to(path)
    FakeJob({"z": 1}).dump(str(link))  # follows the link: the link stays
    assert link.is_symlink()
    assert job_load(str(path)).meshes == {"z": 1}  # type: ignore[attr-defined]


def test_job_loads_refuses_what_is_not_a_job() -> None:
    with pytest.raises(TypeError, match=r"not a monarch\.job JobTrait"):
        job_loads(pickle.dumps({"not": "a job"}))
    with pytest.raises(FileNotFoundError):
        job_load("missing.pkl")


def test_kill_is_idempotent_and_kills_the_saved_allocation_it_reconnected_to() -> None:
    FakeJob({"a": 1}).state()
    job = FakeJob({"a": 1})
    job.kill()  # not running: nothing to do
    assert EVENTS == [("create", 1), ("state", 1)]
    job.state()
    job.kill()
    job.kill()
    assert EVENTS.count(("kill", 1)) == 1


def test_job_state_names_the_meshes_there_are() -> None:
    state = JobState({"trainers": "t", "dataloaders": "d"})  # type: ignore[dict-item]
    assert mesh(state, "trainers") == "t"
    with pytest.raises(AttributeError, match="Available names: dataloaders, trainers"):
        state.missing  # noqa: B018
    assert "trainers" in dir(state)
    assert "trainers" in repr(state)
    copy: Any = pickle.loads(pickle.dumps(JobState({})))
    assert copy._hosts == {}


def test_the_current_job_context(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No spec found"):
        load_current_job()
    module = tmp_path / "my_job_spec.py"
    module.write_text("from monarch.job import LocalJob\njob = LocalJob(('a', 'b'))\nnot_job = 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        set_current_job("my_job_spec.job")
        assert os.path.islink(DEFAULT_JOB_PATH)
        job = load_current_job()
        assert isinstance(job, LocalJob)
        set_current_job("my_job_spec.not_job")
        with pytest.raises(TypeError, match="must be a JobTrait"):
            load_current_job()
        set_current_job("nodot")
        with pytest.raises(ValueError, match=r"module\.attr"):
            load_current_job()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_job_spec", None)


def test_a_plain_saved_file_moves_into_the_default_context() -> None:
    FakeJob({"a": 1}).state()
    set_current_job("x.y")
    assert os.path.islink(DEFAULT_JOB_PATH)
    assert Path(".monarch/default/state.pkl").exists()
    assert isinstance(job_load(), FakeJob)


def test_local_job_is_this_host_under_every_name() -> None:
    from monarch.actor import this_host

    job = LocalJob(("a", "b"))
    state = job.state(cached_path=None)
    assert state.a is this_host()
    assert state.b is this_host()
    assert not job.can_run(job)
    with pytest.raises(TypeError):
        LocalJob("hosts")
    with pytest.raises(RuntimeError, match="client scripts"):
        LocalJob().apply(client_script="train.py")
