"""``chrysalis scale``'s forked start (``chrysalis.node._forkserver``): small trees forked
from the fork server become resolvable in both topologies (leaves on Unix datagrams, heads on
UDP) and leave no process behind; a forked worker that crashes, before or after its ready line,
is reported with its exit status; a launcher killed (``SIGKILL``) or interrupted (``SIGINT``)
takes every worker with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chrysalis.core import DatagramAddr
from chrysalis.node._forkserver import ForkServerError
from chrysalis.node._scale import (
    ProcessGroup,
    ScaleError,
    ScaleSettings,
    _launched,
    _until_exit,
    _warm_join,
    plan_placement,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="fork server and /proc: Linux"
)


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` in the process table (``/proc/*/stat``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":  # exited, only not reaped yet
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait (on pidfds, bounded) until every process in ``pids`` has exited; those that
    have not by then."""
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    deadline = time.monotonic() + timeout
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return set(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize(("topology", "per_task"), [("flat", 16), ("task-head", 4)])
def test_forked_tree_becomes_resolvable_and_leaves_nothing_behind(
    tmp_path: Path, topology: str, per_task: int
) -> None:
    settings = ScaleSettings(16, per_task, topology, join_timeout=60)  # type: ignore[arg-type]
    placements = plan_placement(16, per_task, topology)  # type: ignore[arg-type]
    before = _descendants(os.getpid())

    own = Path("/proc/self/cmdline").read_bytes()

    async def go() -> tuple[
        dict[int, tuple[str, str]], list[int], dict[str, float] | None, dict[str, float] | None
    ]:
        group = ProcessGroup(tmp_path / "logs")
        try:
            async with _launched(settings, tmp_path, group, sys.stderr) as tree:
                assert group.forked
                assert group._fork is not None
                assert len(tree.pids) == 15
                assert len(set(tree.pids)) == 15  # identities issued ahead: one each
                entries = await tree.root.enumerate()
                assert {entry.pid for entry in entries} == {tree.root.pid, *tree.pids}
                for pid in group.pids():  # forked, not exec'd: the fork server's children
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    assert int(stat[stat.rindex(")") + 2 :].split()[1]) == group._fork.pid
                    assert Path(f"/proc/{pid}/cmdline").read_bytes() == own
                return dict(tree.tokens), group.pids(), tree.memory, tree.cpu
        finally:
            await group.stop()

    tokens, workers, memory, tree_cpu = asyncio.run(go())
    assert len(workers) == 15
    for placement in placements[1:]:
        scheme = DatagramAddr.parse(tokens[placement.rank][0]).scheme
        assert scheme == ("udp" if placement.role == "head" else "unixgram"), placement
    assert memory is not None
    assert memory["processes"] == 15
    assert 0 < memory["pss_mib_mean"] <= memory["rss_mib_mean"]
    # Every process's CPU once all were resolvable: leaves and heads by role, the fork server
    # and the root; per worker, all of it over the 15 workers.
    assert tree_cpu is not None
    assert tree_cpu["workers"] == 15
    heads = sum(p.role == "head" for p in placements)
    assert (tree_cpu["head_ms_total"] > 0) == (heads > 0)
    assert 0 < tree_cpu["leaf_ms_median"] < FORKED_READY_CPU_MS
    assert tree_cpu["forkserver_ms"] > 0
    assert tree_cpu["root_ms"] > 0
    parts = ("leaf_ms_total", "head_ms_total", "forkserver_ms", "root_ms")
    assert tree_cpu["ms_per_worker"] == pytest.approx(sum(tree_cpu[k] for k in parts) / 15)
    assert _descendants(os.getpid()) - before == set()  # workers and fork server: all gone
    cpu = _ready_cpu_ms(tmp_path / "logs")
    assert len(cpu) == 15
    assert max(cpu) < FORKED_READY_CPU_MS, cpu


def _ready_cpu_ms(logs: Path, timeout: float = 15.0) -> list[float]:
    """Each worker's CPU to its ready line, from the line it logs (``ready: X ms CPU``). A
    worker writes that line after its join, so the root may see every worker before the last
    lines reach the files: they are waited for, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found, missing = [], []
        for log in sorted(logs.glob("rank-*.log")):
            match = re.search(r"ready: ([0-9.]+) ms CPU", log.read_text())
            if match is None:
                missing.append(log)
            else:
                found.append(float(match.group(1)))
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not missing, [log.read_text()[-500:] for log in missing]
    return found


# An exec'd worker needs about 500 ms of CPU to its ready line (interpreter and imports); a
# forked one about 30 ms. CPU time, unlike wall time, hardly moves with the machine's load: a
# forked worker that imported the stack again would fail this.
FORKED_READY_CPU_MS = 250.0


def _crash_before_ready(argv: list[str]) -> int:
    raise RuntimeError(f"worker crashed on purpose: {argv}")


def _ready_then_exit(argv: list[str]) -> int:
    print("ready", flush=True)
    return int(argv[0])


def _ready_then_wait(argv: list[str]) -> int:
    print(f"ready {os.getppid()}", flush=True)
    sys.stdin.read()  # the lifeline: returns when the launcher closes it
    return 0


def test_the_fork_servers_warm_up_join_connects_and_leaves_no_thread_or_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile
    import threading

    from chrysalis.quic import DevelopmentCA

    DevelopmentCA.load_or_create(tmp_path / "ca")
    # Threads of earlier tests may still be ending: no thread may be new, some may be gone.
    before = set(threading.enumerate())
    leftovers = set(Path(tempfile.gettempdir()).glob("chrysalis-warm-*"))
    _warm_join(tmp_path / "ca")  # raises if a thread is left: a fork would lose it
    assert set(threading.enumerate()) <= before
    assert "warm-up join failed" not in capsys.readouterr().err  # the child did connect
    assert set(Path(tempfile.gettempdir()).glob("chrysalis-warm-*")) == leftovers


def test_forked_worker_crashing_before_its_ready_line_is_reported(tmp_path: Path) -> None:
    async def go() -> None:
        group = ProcessGroup(tmp_path)
        group.start_forkserver()
        try:
            with pytest.raises(ScaleError, match=r"(?s)broken exited with status 1.*on purpose"):
                await group.launch(
                    [[f"{__name__}:_crash_before_ready", "x"]],
                    names=["broken"],
                    concurrency=1,
                    timeout=10,
                )
        finally:
            await group.stop()

    asyncio.run(go())


_PREPARED: list[str] = []
"""In the fork server: what ``_prepare_or_fail`` did before each fork."""


def _prepare_or_fail() -> None:
    if not _PREPARED:
        _PREPARED.append("failed")
        raise RuntimeError("prepare failed on purpose")
    _PREPARED.append(f"prepared {len(_PREPARED)}")


def _ready_with_prepared(argv: list[str]) -> int:
    print(f"ready {_PREPARED[-1]}", flush=True)
    return 0


def test_the_fork_server_prepares_each_worker_before_forking_it(tmp_path: Path) -> None:
    """``prepare`` runs in the fork server before each fork and what it leaves is the
    forked worker's; a failing ``prepare`` fails that spawn only, with its reason."""

    async def go() -> None:
        group = ProcessGroup(tmp_path)
        group.start_forkserver(prepare=_prepare_or_fail)
        try:
            with pytest.raises(ForkServerError, match="prepare failed on purpose"):
                await group.launch(
                    [[f"{__name__}:_ready_with_prepared"]], names=["a"], concurrency=1, timeout=10
                )
            lines = await group.launch(
                [[f"{__name__}:_ready_with_prepared"], [f"{__name__}:_ready_with_prepared"]],
                names=["b", "c"],
                concurrency=1,
                timeout=10,
            )
            assert lines == ["ready prepared 1", "ready prepared 2"]
        finally:
            await group.stop()

    asyncio.run(go())
    assert _PREPARED == []  # this process never ran it: the fork server did


def test_forked_worker_exiting_or_killed_after_ready_is_reported(tmp_path: Path) -> None:
    async def go() -> None:
        group = ProcessGroup(tmp_path)
        group.start_forkserver()
        try:
            lines = await group.launch(
                [[f"{__name__}:_ready_then_exit", "3"], [f"{__name__}:_ready_then_wait"]],
                names=["quits", "waits"],
                concurrency=2,
                timeout=10,
            )
            assert lines[0] == "ready"
            assert group._fork is not None
            assert lines[1] == f"ready {group._fork.pid}"  # forked by the fork server
            assert await asyncio.wait_for(group.wait_exit(), 10) == [("quits", 3)]
            os.kill(group.pids()[1], signal.SIGKILL)
            assert await asyncio.wait_for(group.wait_exit(), 10) == [("waits", -signal.SIGKILL)]
        finally:
            await group.stop()

    asyncio.run(go())


def test_a_launch_fails_at_once_when_a_forked_worker_dies(tmp_path: Path) -> None:
    async def go() -> None:
        group = ProcessGroup(tmp_path / "logs")
        settings = ScaleSettings(4, 4, "task-head", join_timeout=60)
        try:
            with pytest.raises(ScaleError, match=r"rank-1 exited with status -9"):
                async with _launched(settings, tmp_path, group, sys.stderr):
                    pytest.fail("converged although a worker was killed")  # pragma: no cover
        finally:
            await group.stop()

    # Kill the first forked worker as soon as it exists: the launch must fail at once (not
    # after the 60 s join timeout) and name it with its status.
    original = ProcessGroup._forked

    async def forked_and_killed(  # type: ignore[no-untyped-def]
        self: ProcessGroup, command: list[str], name: str, log: int, netns: str | None = None
    ):
        child = await original(self, command, name, log, netns)
        if name == "rank-1":
            os.kill(child.proc.pid, signal.SIGKILL)
        return child

    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProcessGroup, "_forked", forked_and_killed)
        asyncio.run(go())
    assert time.monotonic() - started < 30


def test_waiting_for_convergence_ends_when_a_ready_worker_dies(tmp_path: Path) -> None:
    async def go() -> None:
        group = ProcessGroup(tmp_path)
        group.start_forkserver()
        try:
            await group.launch(
                [[f"{__name__}:_ready_then_wait"]] * 2, names=["a", "b"], concurrency=2, timeout=10
            )
            never = asyncio.Event()
            waiting = asyncio.ensure_future(_until_exit(group, never.wait()))
            await asyncio.sleep(0)
            assert not waiting.done()
            os.kill(group.pids()[1], signal.SIGKILL)
            with pytest.raises(
                ScaleError, match=r"exited before the tree converged: b \(status -9\)"
            ):
                await asyncio.wait_for(waiting, 10)
        finally:
            await group.stop()

    asyncio.run(go())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_workers_die_with_their_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    command = [
        sys.executable, "-m", "chrysalis.node._scale", "run", "--nodes", "8",
        "--nodes-per-task", "4", "--echo-rounds", "1000000", "--echo-timeout-secs", "60",
        "--workdir", str(tmp_path),
    ]  # fmt: skip
    launcher = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        assert launcher.stderr is not None
        deadline = time.monotonic() + 60
        for raw in launcher.stderr:
            if b"resolvable after" in raw or time.monotonic() > deadline:
                break
        workers = _descendants(launcher.pid)
        assert len(workers) == 8  # the fork server and seven workers
        # forked, not fresh interpreters (which need about 500 ms of CPU each to get ready)
        assert max(_ready_cpu_ms(tmp_path / "logs")) < FORKED_READY_CPU_MS
        launcher.send_signal(sig)
        assert _wait_gone(workers, 15) == set()
        launcher.wait(15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(15)
