"""Lifecycle as Monarch behaves (issue 15, item 10): a client that exits while its processes
start, stops that end in bounded time, normal worker exits, and supervision that fails owners."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Channel, ProcMesh, SupervisionError, this_host

HERE = Path(__file__).parent
T = 20.0

sys.path.insert(0, str(HERE))  # workers import lifecycle_actors by name
from lifecycle_actors import NeverReady, Plain, hold  # noqa: E402


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


# -- ActorMesh.stop() of an actor whose __init__ never returns --------------------------------
def _stuck_init_is_stopped(procs: ProcMesh, key: str) -> None:
    started, running = Channel[int].open(once=True)
    stuck: Any = procs.spawn("stuck", NeverReady, started, key)
    sibling: Any = procs.spawn("sibling", Plain)
    running.recv().get(timeout=T)  # __init__ is running (and will not return)
    started_at = time.monotonic()
    assert stuck.stop().get(timeout=T) is None  # it never completed
    assert time.monotonic() - started_at < 10.0  # bounded by stop_actor_timeout (1 s here)
    with pytest.raises(SupervisionError, match="stopped"):
        stuck.ok.call_one().get(timeout=T)
    assert sibling.ok.call_one().get(timeout=T) == "ok"  # the process lives on


@pytest.fixture
def quick_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stop_actor_timeout`` of 1 s, here and in the workers spawned meanwhile."""
    monkeypatch.setenv("HYPERACTOR_STOP_ACTOR_TIMEOUT", "1")


def test_stop_completes_when_init_never_returns(
    quick_stop: None, procs: Callable[..., ProcMesh]
) -> None:
    key = uuid.uuid4().hex
    try:
        _stuck_init_is_stopped(procs(gpus=1), key)
    finally:
        hold(key).set()  # the stuck thread (in this process) returns and ends


def test_stop_completes_when_init_never_returns_in_a_worker(
    quick_stop: None, transport_mode: str
) -> None:
    procs = this_host().spawn_procs({"gpus": 1})
    try:
        _stuck_init_is_stopped(procs, uuid.uuid4().hex)
    finally:
        procs.stop().get(timeout=T)
