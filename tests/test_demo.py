"""The README's demo (``./dev demo`` runs ``examples/demo.py``, ``tree.py`` and ``actors.py``) runs
and shows what it claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_and_exchanges_authenticated_data() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "carriers found through entry points:" in out
    for scheme in ("udp", "unixgram", "inproc"):
        assert f"  {scheme} " in out
    assert "sent b'ping' and got b'pong'" in out


def test_tree_demo_shows_every_node_and_pings_them() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tree.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "$ chrysalis ls ROOT" in out
    ping = out.split("$ chrysalis ping ROOT", 1)[1]
    oks = [line for line in ping.splitlines() if " ok " in line]
    assert len(oks) == 5, ping
    assert "FAILED" not in ping


def test_actor_demo_calls_broadcasts_slices_and_survives_a_failure() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "actors.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "process mesh: {gpus: 4}"
    assert out[1] == "4 trainers in 4 processes, none of them this one: True"
    # Three broadcast steps, each replica's gradient scaled by its rank, in rank order.
    assert out[2:6] == [
        "  {'gpus': 0/4}: weight=0.91 after 3 steps",
        "  {'gpus': 1/4}: weight=0.82 after 3 steps",
        "  {'gpus': 2/4}: weight=0.74 after 3 steps",
        "  {'gpus': 3/4}: weight=0.65 after 3 steps",
    ]
    assert "  message rank {'gpus': 1/2}, spawn rank {'gpus': 3/4}" in out
    assert "ActorError from a call: weight 0.74 fell below 0.8" in out
    assert "failures seen by the coordinator: 1" in out
    assert "calling the dead rank: SupervisionError" in out
    assert out[-2:] == [
        "the other ranks carry on: ['weight=0.74 after 3 steps', 'weight=0.65 after 3 steps']",
        "stopped",
    ]
