"""``chrysalis top`` (monarch issue 21, item 5): a root and a child, both ``--echo``; ``top
--once --json`` through the root lists both nodes and their QUIC links with RTTs and rates; the
live view, driven in a pseudo-terminal, shows the links and quits on ``q``; an echo stream that
is not the stats request is still echoed."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, run_json, start_node, stop_all

from chrysalis.node import _top

T = 30.0


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("top")
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"))
    procs = []
    try:
        root, token = start_node([*CLI, "serve", "--echo"], env, tmp / "root.log")
        procs.append(root)
        child, child_token = start_node([*CLI, "join", token, "--echo"], env, tmp / "child.log")
        procs.append(child)
        yield {
            "env": env,
            "token": token,
            "root": token.rsplit("=", 1)[1],
            "child": child_token.rsplit("=", 1)[1],
        }
    finally:
        stop_all(procs)


def test_once_json_lists_the_nodes_and_their_links(tree: dict[str, Any]) -> None:
    argv = [*CLI, "top", tree["token"], "--once", "--json", "--interval", "0.3"]
    rc, doc, err = run_json([*argv, "--timeout", "20"], tree["env"], timeout=T)
    assert rc == 0, err
    assert doc["unreachable"] == []
    assert {r["pid"] for r in doc["reports"]} == {tree["root"], tree["child"]}
    # The child's link to the root, seen from both ends, with an RTT and traffic.
    down = [r for r in doc["rows"] if (r["node"], r["peer"]) == (tree["root"], tree["child"])]
    up = [r for r in doc["rows"] if (r["node"], r["peer"]) == (tree["child"], tree["root"])]
    assert down, doc["rows"]
    assert up, doc["rows"]
    assert all(r["established"] and r["rtt_ms"] > 0 for r in down + up)
    assert all(r["datagrams_sent"] > 0 and r["datagrams_received"] > 0 for r in up)
    assert all(r["packets_out"] is not None for r in up)  # two polls: rates


def test_the_live_view_in_a_terminal_shows_the_links_and_quits_on_q(
    tree: dict[str, Any],
) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "top", tree["token"], "--interval", "0.3", "--timeout", "20"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=dict(tree["env"], COLUMNS="140", LINES="40"),
        close_fds=True,
    )
    os.close(follower)
    screen = b""
    try:
        deadline = time.monotonic() + T
        while screen.count(b"chrysalis top ") < 2 or tree["child"][:12].encode() not in screen:
            left = deadline - time.monotonic()
            assert left > 0, screen.decode(errors="replace")
            if select.select([leader], [], [], left)[0]:
                screen += os.read(leader, 65536)
        last = screen.decode(errors="replace").split("\x1b[2J")[-1]
        assert "nodes 2" in last, last
        assert tree["root"][:12] in last
        os.write(leader, b"q")
        assert proc.wait(timeout=T) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=T)
        os.close(leader)


def test_ping_still_echoes(tree: dict[str, Any]) -> None:
    rc, doc, err = run_json(
        [*CLI, "ping", tree["token"], "--json", "--timeout", "20"], tree["env"], timeout=T
    )
    assert rc == 0, err
    assert {pid for pid, r in doc.items() if r["ok"]} == {tree["root"], tree["child"]}


def test_rates_and_rendering_are_pure() -> None:
    link = {"peer": "bb", "established": True, "rtt_ms": 1.5, "pto_count": 0}
    link |= {"congestion_window": 1, "bytes_in_flight": 0, "streams": 1}
    first = [{"pid": "aa", "time": 1.0, "links": [link | _counts(10, 1000)]}]
    second = [{"pid": "aa", "time": 3.0, "links": [link | _counts(30, 5000)]}]
    (row,) = _top.link_rows(second, first)
    assert (row.packets_out, row.bytes_out) == (10.0, 2000.0)
    (fresh,) = _top.link_rows(second)
    assert fresh.packets_out is None
    lines = _top.render(second, [row], ["cc"], width=50, height=10)
    assert all(len(line) <= 50 for line in lines)
    assert any(line.startswith("aa") for line in lines)
    assert any("(no report)" in line for line in lines)


def _counts(datagrams: int, octets: int) -> dict[str, int]:
    return {
        "datagrams_sent": datagrams,
        "datagrams_received": datagrams,
        "bytes_sent": octets,
        "bytes_received": octets,
    }
