"""``monarch.job``: ask an engine for hosts, run a worker loop on each, get them back as
``HostMesh``es, and reconnect to the same allocation from a later client process.

API-compatible with Meta Monarch's ``monarch.job``: ``JobTrait`` (the lifecycle every engine
shares: ``apply``, ``state``, ``kill``, ``dump``/``dumps``, ``can_run``), ``JobState`` (the meshes
by name), ``job_load``/``job_loads``, ``load_current_job``/``set_current_job``, ``LocalJob`` (this
host), ``ProcessJob`` (hosts as local worker-loop processes, optionally each in its own
network namespace) and ``SlurmJob`` (nodes of a Slurm allocation). ``KubernetesJob`` (pods) is
in ``monarch.job.kubernetes`` (the ``kubernetes`` extra).
"""

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
