"""Local workers start by fork from the zygote or by exec, and their output is drained."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # workers import procs_actors by name
from procs_actors import NestedSpawner

SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    from monarch.actor import Actor, endpoint, this_host


    class Chatty(Actor):
        @endpoint
        def shout(self, n: int) -> int:
            print("x" * 999, flush=True) if n else None
            for _ in range(n):
                print("y" * 999)  # about 1 KB a line, far more than a pipe holds
            sys.stdout.flush()
            return os.getppid()


    if __name__ == "__main__":
        procs = this_host().spawn_procs(per_host={"procs": 1})
        chatty = procs.spawn("chatty", Chatty)
        parent = chatty.shout.call_one(600).get(timeout=30)
        procs.stop().get()
        print("parent-is-client", parent == os.getpid(), flush=True)
    """
)


@pytest.mark.parametrize("method", ["zygote", "exec"])
def test_worker_that_prints_a_lot_does_not_block_and_its_output_reaches_the_client(
    tmp_path: Path, method: str
) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, MONARCH_WORKER_SPAWN_METHOD=method)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines.count("[0] " + "y" * 999) == 600  # each with its rank prefix
    # exec'd workers are the client's children; forked ones are the zygote's.
    assert f"parent-is-client {method == 'exec'}" in lines


def test_unknown_spawn_method_is_a_clear_error() -> None:
    from monarch.actor import this_host
    from monarch.config import configured

    with (
        configured(worker_spawn_method="vfork"),
        pytest.raises(ValueError, match="worker_spawn_method must be 'zygote' or 'exec'"),
    ):
        this_host().spawn_procs(per_host={"procs": 1})


def test_spawn_procs_inside_a_worker_spawns_processes_the_actor_owns() -> None:
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        spawner = procs.spawn("nested", NestedSpawner)
        message = spawner.nested.call_one().get(timeout=30)
        assert message == "spawned"  # more in test_nested_spawn.py
    finally:
        procs.stop().get()
