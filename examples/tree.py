"""A small local Chrysalis tree started with the ``chrysalis`` command, shown with ``chrysalis ls``.

A root on UDP, a child that serves its own children over a Unix datagram socket, and two
grandchildren (one under each); every node echoes. The script prints the root's namespace and
pings every echo node through the root, then stops the tree (SIGTERM: clean shutdown).

Run it with ``./dev demo`` or, in the workspace environment, ``python examples/tree.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "chrysalis.node._cli"]
TIMEOUT = 60.0


def start(*args: str, ca_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """Start a node; return it and the join token it prints as its first line."""
    process = subprocess.Popen(
        [*CLI, *args, "--echo", "--ca-dir", str(ca_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    token = process.stdout.readline().strip()
    if not token:
        raise RuntimeError(f"node {' '.join(args)} exited before printing its join token")
    return process, token


def chrysalis(*args: str, ca_dir: Path) -> str:
    # A lone `ls` would start an agent for the next commands: this demo leaves nothing behind.
    env = {**os.environ, "CHRYSALIS_AGENT_AUTOSTART": "0"}
    result = subprocess.run(
        [*CLI, *args, "--ca-dir", str(ca_dir)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
        env=env,
    )
    return result.stdout


def main() -> None:
    nodes: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="chrysalis-demo-") as scratch:
        ca_dir = Path(scratch) / "ca"
        try:
            root, root_token = start("serve", "--listen", "udp://127.0.0.1:0", ca_dir=ca_dir)
            nodes.append(root)
            print(f"root:        {root_token}")
            unix_path = Path(scratch) / "child.sock"
            child_u, child_u_token = start(
                "join", root_token, "--listen", f"unix://{unix_path}", ca_dir=ca_dir
            )
            nodes.append(child_u)
            print(f"child:       {child_u_token}")
            child_d, child_d_token = start(
                "join", root_token, "--listen", "udp://127.0.0.1:0", ca_dir=ca_dir
            )
            nodes.append(child_d)
            print(f"child:       {child_d_token}")
            for parent in (child_u_token, child_d_token):
                grandchild, token = start(
                    "join", parent, "--listen", "udp://127.0.0.1:0", ca_dir=ca_dir
                )
                nodes.append(grandchild)
                print(f"grandchild:  {token}")

            deadline = time.monotonic() + TIMEOUT
            while True:
                entries = json.loads(chrysalis("ls", root_token, "--json", ca_dir=ca_dir))
                echoing = [e for e in entries if e["labels"].get("echo") == "true"]
                if len(echoing) >= len(nodes) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            print("\n$ chrysalis ls ROOT")
            print(chrysalis("ls", root_token, ca_dir=ca_dir), end="")
            print("\n$ chrysalis ping ROOT      (every echo node, through the root)")
            print(chrysalis("ping", root_token, ca_dir=ca_dir), end="")
        finally:
            for process in reversed(nodes):
                process.terminate()
            for process in nodes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


if __name__ == "__main__":
    main()
