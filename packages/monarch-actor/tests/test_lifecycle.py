"""Lifecycle as Monarch behaves (issue 15, item 10): a client that exits while its processes
start, stops that end in bounded time, normal worker exits, and supervision that fails owners."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).parent
T = 20.0


def _run_client(
    tmp_path: Path, body: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "client.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout
    )


# -- a client that ends while its processes are still starting -------------------------------
def test_a_client_that_exits_right_after_spawn_procs_exits_promptly(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _run_client(
        tmp_path,
        """
        from monarch.actor import this_host

        if __name__ == "__main__":
            procs = this_host().spawn_procs({"gpus": 2})  # returns while the workers start
            print("spawned", flush=True)
        """,
    )  # it hung for good at interpreter shutdown (subprocess.TimeoutExpired here)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "spawned"
    assert time.monotonic() - started < 30.0
