"""``monarch.job``: ask an engine for hosts, run a worker loop on each, get them back as
``HostMesh``es, and reconnect to the same allocation from a later client process.

API-compatible with Meta Monarch's ``monarch.job``: ``JobTrait`` (the lifecycle every engine
shares: ``apply``, ``state``, ``kill``, ``dump``/``dumps``, ``can_run``), ``JobState`` (the meshes
by name), ``job_load``/``job_loads``, ``load_current_job``/``set_current_job``, ``LocalJob`` (this
host), ``ProcessJob`` (hosts as local worker-loop processes, optionally each in its own
network namespace) and ``SlurmJob`` (nodes of a Slurm allocation). ``KubernetesJob`` (pods) is
in ``monarch.job.kubernetes`` (the ``kubernetes`` extra).

The names are imported on first use (PEP 562): ``python -m monarch.job._host_worker``, the
worker loop every cluster host starts, imports this package first, and should pay only for
what the worker loop needs (see ``_host_worker``), not for the client's side of every engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chrysalis._lazy import lazy_exports

if TYPE_CHECKING:
    from monarch.job._job import (
        DEFAULT_JOB_PATH,
        JobState,
        JobTrait,
        LocalJob,
        job_load,
        job_loads,
        load_current_job,
        set_current_job,
    )
    from monarch.job._process import ProcessJob
    from monarch.job._slurm import SlurmJob
    from monarch.job._spec import MeshSpec

#: Where each public name is defined.
_WHERE = {
    "DEFAULT_JOB_PATH": "monarch.job._job",
    "JobState": "monarch.job._job",
    "JobTrait": "monarch.job._job",
    "LocalJob": "monarch.job._job",
    "MeshSpec": "monarch.job._spec",
    "ProcessJob": "monarch.job._process",
    "job_load": "monarch.job._job",
    "job_loads": "monarch.job._job",
    "load_current_job": "monarch.job._job",
    "set_current_job": "monarch.job._job",
    "SlurmJob": "monarch.job._slurm",
}

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshSpec",
    "ProcessJob",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
    "SlurmJob",
]

__getattr__, __dir__ = lazy_exports(globals(), _WHERE)
