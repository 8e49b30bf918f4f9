"""Run the unchanged torchrun script ``train.py`` on a process mesh of 2 through ``SPMDActor``.

``SPMDActor.main`` gives every process torchrun's environment and runs the script as
``__main__`` there; this prints what rank 0 wrote (``run_script.expected``; the same as
``torchrun --nproc-per-node 2 examples/spmd/train.py RESULT.json`` writes).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from monarch.actor import this_host
from monarch.spmd import SPMDActor


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        spmd: Any = procs.spawn("_SPMDActor", SPMDActor)
        host, port = spmd.slice(gpus=0).get_host_port.call_one(None).get()  # rank 0's
        result = Path(tempfile.mkdtemp()) / "result.json"
        script = Path(__file__).with_name("train.py")
        done = spmd.main.call(host, port, [str(script), str(result)]).get(timeout=300)
        print("ran on every rank:", done.values())
        seen = json.loads(result.read_text())
        print("world size:", seen["world_size"])
        print("loss by step:", seen["losses"])
        print("weight:", seen["weight"])
    finally:
        procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
