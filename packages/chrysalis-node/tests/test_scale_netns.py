"""Multi-host scale runs on one machine (issue 22, item 4): ``chrysalis scale --netns`` runs
each task head's subtree in a network namespace of its own, joined to the root's by a bridge.

The end-to-end test launches 32 processes with ``--persist``: task 0 (the root and 10 Unix
leaves) in the test's own namespace, tasks 1 and 2 (a UDP head and 10 Unix leaves each) in two
namespaces the launcher creates. An echo and a stream-transfer experiment are submitted from
processes inside those namespaces (``ip netns exec``), not the root, and inspected from a third
process in another namespace; a node is killed with SIGKILL while it runs a claim (reported
failed, not lost); Ctrl-C (SIGINT) of the launcher then removes every process, namespace and
veth. A second test kills the launcher itself with SIGKILL (exec'd workers, which only the
reaper kills): the reaper removes everything.

About 30 s on two busy cores. Without root or iproute2 the process tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chrysalis.node._scale import ScaleSettings
from chrysalis.node.netns import NetnsPlan, netns_unavailable, plan_namespaces

sys.path.insert(0, str(Path(__file__).parent))  # the shared process helper, by name
from node_processes import CLI, eventually, read_ready, run_json, stop_all

NODES, PER_TASK = 32, 11  # tasks 0 (ranks 0-10), 1 (11-21), 2 (22-31)


def _needs_netns() -> None:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended


def _assert_all_gone(ready: dict[str, Any], plan_tag: str, timeout: float) -> None:
    """Every process of the run ended, its namespaces and its veth deleted (bounded)."""
    pids = [int(pid) for pid in ready["processes"].values()]
    eventually(lambda: not any(_alive(pid) for pid in pids), timeout, "every process to end")
    ours = {name for name in _namespaces() if name.startswith(f"chs{plan_tag}")}
    eventually(
        lambda: not {n for n in _namespaces() if n.startswith(f"chs{plan_tag}")},
        timeout,
        f"the namespaces {sorted(ours)} to be deleted",
    )
    assert not Path("/sys/class/net", f"chs{plan_tag}h").exists()


def _tag(ready: dict[str, Any]) -> str:
    name = next(iter(ready["namespaces"].values()))
    tag: str = name.removeprefix("chs").rpartition("-")[0]
    return tag


# -- the plan (pure) ----------------------------------------------------------------------------


def test_the_plan_names_and_addresses_every_namespace_on_a_free_subnet() -> None:
    used = [ipaddress.IPv4Network("10.224.0.0/12"), ipaddress.IPv4Network("192.0.2.0/24")]
    for seed in range(20):  # the pool's lower half is used: always a /24 of the upper half
        drawn = plan_namespaces(2, used, random.Random(seed), "ab12cd34")
        assert drawn.subnet.subnet_of(ipaddress.IPv4Network("10.240.0.0/12")), drawn
    plan = plan_namespaces(2, used, random.Random(7), "ab12cd34")
    assert plan.names() == ["chsab12cd34-sw", "chsab12cd34-1", "chsab12cd34-2"]
    assert (plan.root_address, plan.address(1), plan.address(2)) == (
        str(plan.subnet[1]),
        str(plan.subnet[2]),
        str(plan.subnet[3]),
    )
    assert plan.path(2) == "/run/netns/chsab12cd34-2"
    assert len(plan.host_link) <= 15  # IFNAMSIZ - 1
    with pytest.raises(ValueError, match="task 3 has no namespace"):
        plan.address(3)
    with pytest.raises(ValueError, match="no free /24"):
        plan_namespaces(1, [ipaddress.IPv4Network("10.0.0.0/8")], random.Random(1), "t")


@pytest.mark.parametrize(
    ("tag", "subnet", "count", "message"),
    [
        ("x", "10.240.1.0/24", 0, "1 to 250 namespaces"),
        ("x", "10.240.0.0/23", 1, "must be a /24"),
        ("bad-tag", "10.240.1.0/24", 1, "a tag is"),
        ("123456789", "10.240.1.0/24", 1, "a tag is"),
    ],
)
def test_a_bad_plan_is_refused(tag: str, subnet: str, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NetnsPlan(tag, ipaddress.IPv4Network(subnet), count)


@pytest.mark.parametrize(
    ("nodes", "per_task", "topology"), [(8, 4, "flat"), (4, 4, "task-head"), (4, 8, "task-head")]
)
def test_netns_needs_task_heads_and_two_tasks(nodes: int, per_task: int, topology: str) -> None:
    with pytest.raises(ValueError, match="needs the task-head topology and at least two tasks"):
        ScaleSettings(nodes, per_task, topology, netns=True)  # type: ignore[arg-type]
    ScaleSettings(5, 4, "task-head", netns=True)  # two tasks: fine


# -- processes ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.netns
def test_32_processes_in_two_namespaces_run_experiments_administered_elsewhere(
    tmp_path: Path,
) -> None:
    _needs_netns()
    work = tmp_path / "w"
    log = tmp_path / "scale.log"
    argv = [*CLI, "scale", "--nodes", str(NODES), "--nodes-per-task", str(PER_TASK)]
    argv += ["--persist", "--netns", "--workdir", str(work), "--idle-timeout", "5"]
    argv += ["--join-timeout-secs", "80"]
    with log.open("wb") as err:
        scale = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
    ready: dict[str, Any] = {}
    try:
        ready = read_ready(scale, log)
        tokens, processes = ready["tokens"], ready["processes"]
        spaces = {int(task): name for task, name in ready["namespaces"].items()}
        assert sorted(spaces) == [1, 2]
        assert set(spaces.values()) <= _namespaces()
        # every process runs in its task's namespace (the root's task in the test's own)
        inode = {0: _netns_inode(os.getpid())}
        inode |= {task: os.stat(f"/run/netns/{name}").st_ino for task, name in spaces.items()}
        assert len(set(inode.values())) == 3
        placed = {int(rank): _netns_inode(pid) for rank, pid in processes.items()}
        assert placed == {rank: inode[rank // PER_TASK] for rank in range(NODES)}

        env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=ready["ca_dir"])

        def admin(rank: int, *args: str) -> Any:
            """``chrysalis admin`` at rank ``rank``'s token, run in that rank's namespace."""
            command = [*CLI, "admin", tokens[str(rank)], *args, "--json", "--timeout", "30"]
            task = rank // PER_TASK
            if task:
                command = ["ip", "netns", "exec", spaces[task], *command]
            code, record, stderr = run_json(command, env, timeout=45)
            assert code == 0, stderr
            return record

        nodes = admin(23, "nodes")  # from namespace 2, at a leaf
        by_rank = {n["rank"]: n for n in nodes}
        assert sorted(by_rank) == list(range(NODES))
        assert {n["state"] for n in nodes} == {"live"}
        pid = {rank: n["pid"] for rank, n in by_rank.items()}
        heads = {0: by_rank[0], 1: by_rank[11], 2: by_rank[22]}
        assert {h["carrier"] for h in heads.values()} == {"udp"}
        ips = {
            task: h["address"].removeprefix("udp://").rpartition(":")[0]
            for task, h in heads.items()
        }
        assert len(set(ips.values())) == 3, ips  # each host on an address of its own
        assert all(ipaddress.IPv4Address(ip).is_private for ip in ips.values())
        for rank, node in by_rank.items():
            if rank % PER_TASK:
                assert node["carrier"] == "unixgram", node
                assert node["parent"] == pid[rank - rank % PER_TASK]
            assert node["task"] == rank // PER_TASK
        assert by_rank[11]["parent"] == by_rank[22]["parent"] == pid[0]

        # echo: submitted in namespace 2, sources in namespaces 1 and 2, destinations in all
        sources, destinations = (12, 24), (0, 5, 11, 13, 22, 25)
        submitted = admin(
            23, "submit", "e1",
            "--sources", ",".join(f"rank:{r}" for r in sources),
            "--destinations", ",".join(f"rank:{r}" for r in destinations),
            "--count", "2", "--payload", "64", "--wait",
        )  # fmt: skip
        assert submitted["status"] == "done"
        assert submitted["submitted_by"] not in pid.values()

        report = admin(14, "show", "e1")  # inspected from a third process, in namespace 1
        assert report["status"] == "done"
        pairs = {(r["source"], r["destination"]): r for r in report["results"]}
        assert set(pairs) == {(pid[s], pid[d]) for s in sources for d in destinations}
        rank_of = {p: r for r, p in pid.items()}
        for (source, destination), result in pairs.items():
            assert (result["status"], result["completed"], result["error"]) == ("ok", 2, ""), result
            # the direct baselines cross namespaces too: each host reaches the others' IPs;
            # the Unix stream baseline (an abstract name: one per network namespace) only
            # reaches a destination in the source's own namespace, and says so for the others
            same = rank_of[source] // PER_TASK == rank_of[destination] // PER_TASK
            for method, figures in result["baselines"].items():
                if method == "unix" and not same:
                    assert figures["completed"] == 0
                    assert figures["error"], figures
                    continue
                assert (method, figures["completed"], figures["error"]) == (method, 2, "")
        assert report["summary"]["completed"] == report["summary"]["planned"] == 12 * 2

        # a stream transfer from namespace 1 to namespace 2, submitted in 2, shown at the root's
        admin(
            25, "submit", "t1", "--kind", "stream-transfer", "--sources", "rank:13",
            "--destinations", "rank:24", "--payload", str(1 << 20), "--count", "2", "--wait",
        )  # fmt: skip
        (transfer,) = admin(3, "show", "t1")["results"]
        assert (transfer["source"], transfer["destination"]) == (pid[13], pid[24])
        assert (transfer["status"], transfer["completed"], transfer["error"]) == ("ok", 2, "")
        assert transfer["mib_per_second"] > 0
        for method in ("quic", "tcp"):
            assert transfer["baselines"][method]["completed"] == 2, transfer["baselines"]

        # a node in namespace 1 killed with -9 while it runs a claim: failed, not lost
        admin(
            2, "submit", "long", "--sources", "rank:15", "--destinations", "rank:26",
            "--count", "100000", "--warmup", "0", "--run-timeout", "120",
        )  # fmt: skip

        def claim_state() -> str:
            claims = admin(27, "show", "long")["claims"]
            return str(claims[0]["state"]) if claims else "pending"

        eventually(lambda: claim_state() == "running", 20, "rank 15 to run its claim")
        os.kill(processes["15"], signal.SIGKILL)
        eventually(lambda: claim_state() == "failed", 20, "the killed claim to be failed")
        claim = admin(16, "show", "long")["claims"][0]
        assert claim["source"] == pid[15]
        assert "exited with status -9" in claim["error"]
        assert admin(0, "nodes", "rank:15")[0]["state"] == "lost"
    finally:
        if scale.poll() is None:
            scale.send_signal(signal.SIGINT)  # Ctrl-C: the launcher cleans up itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                scale.wait(timeout=30)
        stop_all([scale])
    assert scale.returncode == 0, log.read_text()[-2000:]
    _assert_all_gone(ready, _tag(ready), timeout=10)


@pytest.mark.slow
@pytest.mark.netns
def test_a_hung_head_in_its_namespace_is_declared_lost_with_its_subtree(tmp_path: Path) -> None:
    """Liveness across a namespace boundary: the root (in the test's namespace) declares the
    head of task 1 and its leaf lost once the head, in namespace 1, stops answering (SIGSTOP:
    no exit status for the launcher to see; the root's QUIC link to it idles out, the subtree
    leaves the root's namespace and the root's liveness check, after ``--idle-timeout``, marks
    both lost). The leaf's open claim is reported failed with that reason, and all of it is
    read from a process in namespace 2. Task 2 stays live."""
    _needs_netns()
    work = tmp_path / "w"
    log = tmp_path / "scale.log"
    argv = [*CLI, "scale", "--nodes", "6", "--nodes-per-task", "2", "--persist", "--netns"]
    argv += ["--workdir", str(work), "--idle-timeout", "5", "--join-timeout-secs", "80"]
    with log.open("wb") as err:
        scale = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
    ready: dict[str, Any] = {}
    stopped: int | None = None
    try:
        ready = read_ready(scale, log)
        tokens, processes = ready["tokens"], ready["processes"]
        spaces = {int(task): name for task, name in ready["namespaces"].items()}
        assert sorted(spaces) == [1, 2]
        head, leaf = int(processes["2"]), int(processes["3"])  # task 1: ranks 2 (head) and 3
        assert _netns_inode(head) == _netns_inode(leaf) == os.stat(f"/run/netns/{spaces[1]}").st_ino
        assert _netns_inode(head) != _netns_inode(os.getpid())
        env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=ready["ca_dir"])

        def admin(*args: str) -> Any:
            """``chrysalis admin`` at leaf 5, run in namespace 2."""
            command = [*CLI, "admin", tokens["5"], *args, "--json", "--timeout", "30"]
            command = ["ip", "netns", "exec", spaces[2], *command]
            code, record, stderr = run_json(command, env, timeout=45)
            assert code == 0, stderr
            return record

        nodes = {n["rank"]: n for n in admin("nodes")}
        assert {n["state"] for n in nodes.values()} == {"live"}
        assert nodes[3]["parent"] == nodes[2]["pid"]
        admin(
            "submit", "held", "--sources", "rank:3", "--destinations", "rank:1",
            "--count", "100000", "--warmup", "0", "--run-timeout", "120", "--no-baselines",
        )  # fmt: skip
        os.kill(head, signal.SIGSTOP)  # hung, not dead: only liveness can tell
        stopped = head

        def states() -> dict[int, str]:
            return {n["rank"]: n["state"] for n in admin("nodes")}

        eventually(
            lambda: states()[2] == states()[3] == "lost", 60, "head 2 and leaf 3 declared lost"
        )
        final = states()
        assert [final[rank] for rank in (0, 1, 4, 5)] == ["live"] * 4, final
        claim = admin("show", "held")["claims"][0]
        assert claim["source"] == nodes[3]["pid"]
        assert claim["state"] == "failed", claim
        assert "left the namespace" in claim["error"], claim
        assert f"{nodes[2]['pid'][:8]} lost: its node left the namespace" in log.read_text()
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)  # so that it can end with the others
        if scale.poll() is None:
            scale.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                scale.wait(timeout=30)
        stop_all([scale])
    assert scale.returncode == 0, log.read_text()[-2000:]
    _assert_all_gone(ready, _tag(ready), timeout=15)


@pytest.mark.slow
@pytest.mark.netns
def test_a_launcher_killed_with_sigkill_leaves_no_namespace_or_process(tmp_path: Path) -> None:
    _needs_netns()
    log = tmp_path / "scale.log"
    argv = [*CLI, "scale", "--nodes", "3", "--nodes-per-task", "1", "--persist", "--netns"]
    argv += ["--start", "exec", "--workdir", str(tmp_path / "w"), "--join-timeout-secs", "60"]
    with log.open("wb") as err:
        scale = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
    try:
        ready = read_ready(scale, log)
        spaces = ready["namespaces"]
        assert sorted(spaces) == ["1", "2"]
        assert set(spaces.values()) <= _namespaces()
        workers = [int(ready["processes"][rank]) for rank in ("1", "2")]
        assert [_netns_inode(p) for p in workers] == [
            os.stat(f"/run/netns/{spaces[rank]}").st_ino for rank in ("1", "2")
        ]
        started = time.monotonic()
        scale.kill()
        scale.wait(timeout=10)
    finally:
        stop_all([scale])
    _assert_all_gone(ready, _tag(ready), timeout=15)
    assert time.monotonic() - started < 15
