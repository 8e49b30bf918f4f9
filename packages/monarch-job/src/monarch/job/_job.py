"""The job lifecycle shared by every engine: ``JobTrait``, ``JobState``, ``job_load``/``job_loads``,
the current-job context (``set_current_job``/``load_current_job``) and ``LocalJob``.

Why this shape (Monarch's ``monarch.job``, API-compatible): a job is a declarative
*specification* (which meshes, how many hosts each) plus, once applied, the *allocation* an engine
made for it (process ids, scheduler job ids, worker-loop addresses). ``apply()`` asks the engine
for the hosts and starts a worker loop on each (``_create``); ``state()`` attaches the client to
those worker loops and returns their ``HostMesh``es (``_state``); ``kill()`` ends the allocation
(``_kill``). The allocation is plain picklable data, never a live handle, so a job dumped by one
client process (``dump``/``dumps``) lets a *later* client process reconnect to the same hosts:
``state(cached_path=...)`` loads the saved job and reuses it when ``saved.can_run(spec)`` says the
allocation still serves this specification (and still lives), else kills it and applies anew.

Engines subclass ``JobTrait`` and implement ``_create(client_script)``, ``_state()``,
``_kill()`` and ``can_run(spec)``; they never set ``_status`` themselves (``apply`` does, after
``_create`` returned), so the status transitions and the cache stay in one place.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, Literal, NamedTuple

from monarch.actor import HostMesh, this_host

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
]

_log = logging.getLogger("monarch.job")

#: Where ``state()`` caches the applied job unless told otherwise (relative to the cwd).
DEFAULT_JOB_PATH: Final = ".monarch/job_state.pkl"
_MONARCH_DIR: Final = ".monarch"
_CONTEXT_STATE_FILE: Final = "state.pkl"
_CONTEXT_SPEC_FILE: Final = "spec"
#: Largest job file ``job_load`` reads (a job is a small specification plus addresses).
MAX_JOB_BYTES: Final = 16 * 1024 * 1024


class JobState:
    """The meshes of an applied job, each an attribute holding a ``HostMesh`` ready for
    ``spawn_procs``::

        state = job.state()
        state.trainers      # HostMesh of the "trainers" mesh
        state.dataloaders   # HostMesh of the "dataloaders" mesh

    An unknown name raises ``AttributeError`` listing the names there are. ``layout(name)`` is
    the per-host process layout the job gives that mesh (``{}``: one process per host), made
    for ``spawn_procs``::

        procs = state.trainers.spawn_procs(per_host=state.layout("trainers"))
    """

    def __init__(
        self,
        hosts: Mapping[str, HostMesh],
        layouts: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self._hosts: dict[str, HostMesh] = dict(hosts)
        self._layouts: dict[str, dict[str, int]] = {
            name: dict(layout) for name, layout in (layouts or {}).items()
        }

    def layout(self, name: str) -> dict[str, int]:
        """The per-host process layout of mesh ``name`` (``KeyError`` for an unknown mesh)."""
        if name not in self._hosts:
            raise KeyError(f"no mesh {name!r} in this job: {', '.join(sorted(self._hosts))}")
        return dict(self._layouts.get(name, {}))

    def __getattr__(self, attr: str) -> HostMesh:
        if attr.startswith("__") or attr in ("_hosts", "_layouts"):
            raise AttributeError(attr)
        try:
            return self._hosts[attr]
        except KeyError:
            available = ", ".join(sorted(self._hosts))
            raise AttributeError(
                f"'{attr}' is not a valid host mesh name. Available names: {available}"
            ) from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._hosts})

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts})"


class CachedRunning(NamedTuple):
    """The status of a specification that found a live saved allocation: that saved job runs
    it."""

    job: JobTrait


Status = Literal["running", "not_running"] | CachedRunning


class JobTrait(ABC):
    """A job: a specification of host meshes and, once applied, the allocation an engine made
    for it (see the module docstring).

    ``apply()`` creates the allocation (a no-op when it exists), ``state()`` connects and
    returns a ``JobState`` (applying first, or reusing a saved allocation), ``kill()`` ends
    it, ``dump``/``dumps`` save it for a later client process (``job_load``/``job_loads``).

    Subclasses implement ``_create``, ``_state``, ``_kill`` and ``can_run``; they must not set
    ``_status`` (``apply`` does after ``_create`` returns, and ``state`` caches only then).
    """

    def __init__(self) -> None:
        self._status: Status = "not_running"
        self._apply_id: str | None = None

    # -- status -------------------------------------------------------------------------------
    @property
    def _running(self) -> JobTrait | None:
        """The job whose allocation runs this specification: ``self``, a saved job found by
        ``state()``, or None."""
        status = self._status
        if status == "running":
            return self
        if isinstance(status, CachedRunning):
            return status.job
        return None

    @property
    def active(self) -> bool:
        """Whether an allocation runs this job (it was applied or reconnected and not killed)."""
        return self._running is not None

    @property
    def apply_id(self) -> str | None:
        """A UUID naming the current allocation (fresh at each ``apply`` that creates one, kept
        through ``dump``/``job_load``); None before ``apply``."""
        running = self._running
        return running._apply_id if running is not None else None

    # -- lifecycle ------------------------------------------------------------------------------
    def apply(self, client_script: str | None = None) -> None:
        """Bring the job as specified into existence: allocate its hosts and start a worker
        loop on each. A no-op when this job already runs. ``client_script``: run that script
        as the job's client (only engines that can, else ``RuntimeError``)."""
        if self._running is None:
            self._create(client_script)
            self._apply_id = str(uuid.uuid4())
            self._status = "running"

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """Connect to this job's hosts and return their meshes.

        When the job is not running yet and ``cached_path`` names a saved job that
        ``can_run`` this specification (its allocation still lives), reconnect to that one;
        a saved job that cannot is killed and its file removed. Otherwise apply this job and,
        with a ``cached_path``, save it there for later client processes.
        """
        running = self._running
        if running is not None:
            return running._state()
        cached = self._load_cached(cached_path)
        if cached is not None:
            self._status = CachedRunning(cached)
            _log.info("reconnecting to the saved job at %s", cached_path)
            return cached._state()
        self.apply()
        hosts = self._state()
        if cached_path is not None:
            _log.info("saving the job at %s", cached_path)
            self.dump(cached_path)
        return hosts

    def kill(self) -> None:
        """End the allocation (every worker loop and the processes they run). Idempotent."""
        running = self._running
        if running is not None:
            running._kill()
            running._status = "not_running"
        self._status = "not_running"

    def _is_running(self) -> bool:
        """Whether the saved allocation still runs (no connection made)."""
        return self.can_run(self)

    def _load_cached(self, cached_path: str | None) -> JobTrait | None:
        if cached_path is None:
            return None
        try:
            job = job_load(cached_path)
        except FileNotFoundError:
            return None
        running = job._running
        if running is None:
            return None
        running._rebind_connection_inputs(self)
        if running.can_run(self):
            return job
        _log.info("the saved job at %s cannot run this specification: killing it", cached_path)
        try:
            running._kill()
        except Exception:  # a stale cache must not block applying the current specification
            _log.warning("could not kill the stale saved job at %s", cached_path, exc_info=True)
        target = os.path.realpath(cached_path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)
        return None

    def _rebind_connection_inputs(self, spec: JobTrait) -> None:
        """Take what a saved job could not keep from ``spec``, the current specification, before
        reconnecting (Kubernetes: an in-memory API configuration). Default: nothing."""
        del spec  # an engine whose saved jobs keep everything needs nothing from it

    # -- persistence ----------------------------------------------------------------------------
    def dump(self, filename: str) -> None:
        """Save the job (specification and allocation) to ``filename``, following a symlink
        there and creating the parent directory."""
        path = os.path.realpath(filename) if os.path.islink(filename) else filename
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        data = self.dumps()
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # a concurrent reader sees the old job or the new one

    def dumps(self) -> bytes:
        """The job as bytes (``job_loads`` reads them)."""
        return pickle.dumps(self)

    # -- engine hooks ---------------------------------------------------------------------------
    @abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Allocate the hosts and start a worker loop on each (called by ``apply`` when not
        running; must not set ``_status``)."""

    @abstractmethod
    def _state(self) -> JobState:
        """Attach to the running allocation's worker loops and return their meshes."""

    @abstractmethod
    def _kill(self) -> None:
        """End the allocation; afterwards no process of it runs on any host."""

    @abstractmethod
    def can_run(self, spec: JobTrait) -> bool:
        """Whether this (saved, running) job's allocation can serve ``spec``: same engine, same
        meshes, and still alive."""


def job_loads(data: bytes) -> JobTrait:
    """A job from ``JobTrait.dumps`` bytes. Only load bytes you wrote: this is ``pickle``."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"the data hold a {type(job).__name__}, not a monarch.job JobTrait")
    return job


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """A job saved by ``JobTrait.dump`` (``FileNotFoundError`` if there is none). Only load
    files you wrote: this is ``pickle``."""
    with open(filename, "rb") as f:
        data = f.read(MAX_JOB_BYTES + 1)
    if len(data) > MAX_JOB_BYTES:
        raise ValueError(f"{filename} is larger than {MAX_JOB_BYTES} bytes: not a saved job")
    return job_loads(data)


# -- the current job's context (``.monarch/``) -------------------------------------------------
def _current_spec_file() -> Path:
    link = Path(DEFAULT_JOB_PATH)
    if link.is_symlink():
        target = Path(os.readlink(link))
        return Path(_MONARCH_DIR) / target.parent / _CONTEXT_SPEC_FILE
    return Path(_MONARCH_DIR) / "default" / _CONTEXT_SPEC_FILE


def _import_job(module_path: str) -> JobTrait:
    module_name, dot, attr = module_path.rpartition(".")
    if not dot or not module_name or not attr:
        raise ValueError(f"a job spec is 'module.attr', got {module_path!r}")
    module = importlib.import_module(module_name)
    job = getattr(module, attr, None)
    if job is None:
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(job, JobTrait):
        raise TypeError(f"{module_path!r} must be a JobTrait, got {type(job).__name__}")
    return job


def set_current_job(module_path: str) -> None:
    """Make ``module_path`` (``package.module.attr``, a ``JobTrait``) the current context's job
    spec: ``.monarch/job_state.pkl`` becomes a link to the context's ``state.pkl`` (a plain file
    there is moved into the ``default`` context)."""
    link = Path(DEFAULT_JOB_PATH)
    Path(_MONARCH_DIR).mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        default = Path(_MONARCH_DIR) / "default"
        default.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.rename(default / _CONTEXT_STATE_FILE)
        link.symlink_to(Path("default") / _CONTEXT_STATE_FILE)
    spec = _current_spec_file()
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(module_path)


def load_current_job() -> JobTrait:
    """A fresh job object for the current context's spec (see ``set_current_job``), not yet
    connected: its ``state()`` reuses the context's saved allocation when it still serves it.
    ``FileNotFoundError`` when no spec is set."""
    spec = _current_spec_file()
    try:
        module_path = spec.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No spec found at {spec}. Run 'monarch apply <module.path>' first "
            "(or monarch.job.set_current_job)."
        ) from None
    return _import_job(module_path)


class LocalJob(JobTrait):
    """A job on this host: every mesh is ``this_host()``. A stand-in that lets a program switch
    between remote and local execution by changing its job only."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        if isinstance(hosts, str):
            raise TypeError("LocalJob(hosts=...) takes a sequence of mesh names, not one str")
        self._host_names = tuple(hosts)

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise RuntimeError("LocalJob does not run client scripts in this implementation")

    def _state(self) -> JobState:
        return JobState({name: this_host() for name in self._host_names})

    def _kill(self) -> None:
        pass  # this host is not allocated: nothing to end

    def can_run(self, spec: JobTrait) -> bool:
        # Local jobs are the same whatever was saved: use the new spec (its mesh names).
        return False

    def _is_running(self) -> bool:
        return True
