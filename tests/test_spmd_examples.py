"""``examples/spmd``: an unchanged torchrun script run on a process mesh through ``SPMDActor``
(its result equals what ``torchrun`` makes of the same script), and a Lightning DDP run; both print
their ``*.expected`` output."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "spmd"
TIMEOUT = 300


def _run(*args: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


TORCH_EXIT_ABORT = "terminate called without an active exception"


def _torchrun(script: Path, result: Path, *, cwd: Path) -> None:
    """``torchrun --standalone --nproc-per-node 2 SCRIPT RESULT``, the baseline. Once on a
    loaded CI machine a rank of this plain torch script died by ``SIGABRT`` with gloo's
    ``terminate called without an active exception`` (torch's own threads, none of this
    project's code runs under torchrun): that one failure of the baseline is run again once;
    any other failure, or a second one, fails the test."""
    args = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    command = [sys.executable, *args, str(script), str(result)]
    for attempt in (1, 2):
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
        if done.returncode == 0:
            return
        if attempt == 2 or TORCH_EXIT_ABORT not in done.stderr:
            break
        result.unlink(missing_ok=True)
    raise AssertionError(f"torchrun {script.name} failed:\n{done.stdout}\n{done.stderr}")


def test_a_torchrun_script_runs_unchanged_on_a_mesh_as_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = _run(str(EXAMPLES / "run_script.py"))
    assert out == (EXAMPLES / "run_script.expected").read_text()
    # the same script under torchrun itself: the same result
    _torchrun(EXAMPLES / "train.py", tmp_path / "result.json", cwd=tmp_path)
    under_torchrun = json.loads((tmp_path / "result.json").read_text())
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert under_torchrun == {
        "world_size": int(lines["world size"]),
        "losses": ast.literal_eval(lines["loss by step"]),
        "weight": ast.literal_eval(lines["weight"]),
    }


def test_lightning_trains_with_ddp_on_a_mesh() -> None:
    pytest.importorskip("lightning")
    out = _run(str(EXAMPLES / "lightning_train.py"))
    assert out == (EXAMPLES / "lightning_train.expected").read_text()
