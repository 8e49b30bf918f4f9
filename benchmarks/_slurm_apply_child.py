"""One measurement of ``benchmarks/slurm_apply.py``, run by either interpreter (this project's
or the reference Monarch's: both have ``monarch.job.SlurmJob`` and ``monarch.actor``)::

    python benchmarks/_slurm_apply_child.py HOSTS PORT LOG_DIR

On the cluster ``$SLURM_CONF`` names, it times ``SlurmJob({"hosts": HOSTS}).apply()`` until
``state()`` returned the ``HostMesh`` and ``hosts.initialized`` resolved (``ready``, as
``benchmarks/job_apply.py`` measures ``ProcessJob``), then until one process per host answered
a call (``first_call``). The last stdout line is that JSON; the job is killed afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from monarch.actor import Actor, endpoint


class Ping(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def main() -> None:
    from monarch.job import SlurmJob

    hosts, port, log_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    job = SlurmJob(
        {"hosts": hosts},
        python_exe=sys.executable,
        monarch_port=port,
        log_dir=log_dir,
        exclusive=False,
        time_limit="00:10:00",
        job_name="monarch_bench",
    )
    try:
        started = time.perf_counter()
        job.apply()
        mesh = job.state(cached_path=None).hosts
        mesh.initialized.get(timeout=240)
        ready = time.perf_counter() - started
        pings: Any = mesh.spawn_procs(per_host={"gpus": 1}).spawn("ping", Ping)
        pids = pings.pid.call().get(timeout=240)
        first_call = time.perf_counter() - started
        if len(set(pids.values())) != hosts:
            raise SystemExit(f"expected {hosts} distinct processes, got {pids}")
    finally:
        job.kill()
    print(json.dumps({"ready": ready, "first_call": first_call}), flush=True)
    os._exit(0)  # the reference's client can linger at exit


if __name__ == "__main__":
    main()
