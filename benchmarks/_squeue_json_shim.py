#!/usr/bin/env python3
"""``squeue`` for the reference's ``SlurmJob`` on Slurm older than 24.05 (benchmarks only).

The reference reads ``squeue --json`` in the newer schema (``job_resources.nodes.allocation``,
a list of ``{"name": ...}``); Slurm 22.05 prints ``job_resources.nodes`` as a host list string
(``n[1-4]``) and ``job_resources.allocated_nodes``. This shim runs the real ``squeue`` (the
``MONARCH_REAL_SQUEUE`` path) and, for ``--json``, rewrites each job's ``job_resources.nodes`` to
the newer shape (the names from ``scontrol show hostnames``) and applies ``--job ID`` (which
22.05 ignores with ``--json``: it lists every job); anything else passes through.
``benchmarks/job_apply.py`` puts it first on the reference client's ``PATH`` as ``squeue``.
"""

import json
import os
import subprocess
import sys

real = os.environ.get("MONARCH_REAL_SQUEUE", "/usr/bin/squeue")
done = subprocess.run([real, *sys.argv[1:]], capture_output=True, text=True, check=False)
if done.returncode != 0 or "--json" not in sys.argv[1:]:
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    sys.exit(done.returncode)
data = json.loads(done.stdout)
args = sys.argv[1:]
if "--job" in args[:-1]:
    wanted = {int(j) for j in args[args.index("--job") + 1].split(",")}
    data["jobs"] = [job for job in data.get("jobs", []) if job.get("job_id") in wanted]
for job in data.get("jobs", []):
    resources = job.get("job_resources") or {}
    nodes = resources.get("nodes")
    if isinstance(nodes, str) and nodes:
        names = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        ).stdout.split()
        resources["nodes"] = {"allocation": [{"name": name} for name in names]}
    state = job.get("job_state")
    if isinstance(state, str):
        job["job_state"] = [state]
json.dump(data, sys.stdout)
