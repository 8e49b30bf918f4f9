"""The README's demo (``./dev demo`` runs ``examples/demo.py``) runs and shows what it claims."""

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
