"""One measurement of ``benchmarks/job_apply.py``, run by either interpreter (this project's or
the reference Monarch's: both have ``monarch.job`` and ``monarch.actor``)::

    python benchmarks/_job_apply_child.py ENGINE HOSTS [PORT LOG_DIR]

ENGINE is ``process`` (``ProcessJob``), ``netns`` (``ProcessJob`` with one network namespace a
host: this project only) or ``slurm`` (``SlurmJob`` on the cluster ``$SLURM_CONF`` names). It
times ``apply()`` until the job's ``HostMesh`` is *ready*: ``state()`` returned it and an actor
on every host answered (the reference's ``state()`` returns before its hosts are connected, so
only an answer from every host is the same point for both). The last stdout line is JSON:
``state_s`` (``apply()`` + ``state()``) and ``ready_s``. The job is killed afterwards.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from monarch.actor import Actor, endpoint


class Ping(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def _job(engine: str, hosts: int, argv: list[str]) -> tuple[Any, Any]:
    if engine == "process":
        from monarch.job import ProcessJob

        return ProcessJob({"hosts": hosts}), None
    if engine == "netns":
        from monarch.job import ProcessJob
        from monarch.job._netns import NetnsHosts

        spaces = NetnsHosts(hosts)
        spaces.create()  # not timed: the hosts exist before the job
        return ProcessJob({"hosts": hosts}, namespaces=spaces.names), spaces
    if engine == "slurm":
        from monarch.job import SlurmJob

        port, log_dir = int(argv[0]), argv[1]
        job = SlurmJob(
            {"hosts": hosts},
            python_exe=sys.executable,
            monarch_port=port,
            log_dir=log_dir,
            exclusive=False,
            time_limit="00:10:00",
            job_name="monarch_bench",
        )
        return job, None
    raise SystemExit(f"unknown engine {engine!r}")


def main() -> None:
    engine, hosts = sys.argv[1], int(sys.argv[2])
    job, spaces = _job(engine, hosts, sys.argv[3:])
    try:
        started = time.perf_counter()
        job.apply()
        mesh = job.state(cached_path=None).hosts
        stated = time.perf_counter()
        pings: Any = mesh.spawn_procs(per_host={"gpus": 1}).spawn("ping", Ping)
        answers = list(pings.ping.call().get(timeout=120).values())
        ready = time.perf_counter()
        if answers != [1] * hosts:
            raise SystemExit(f"unexpected answers {answers}")
    finally:
        job.kill()
        if spaces is not None:
            spaces.delete()
    print(json.dumps({"state_s": stated - started, "ready_s": ready - started}), flush=True)


if __name__ == "__main__":
    main()
