"""The zygote forks warm processes on request and reports how they end."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from monarch.actor._hosts import zygote as zygote_module
from monarch.actor._hosts.zygote import Zygote, ZygoteUnavailableError, fork_between_imports

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
HERE = __name__


def _echo(argv: Sequence[str]) -> int:
    print(" ".join(argv), threading.active_count(), sys.stdin.read() == "", flush=True)
    return int(argv[0])


def _sleep(argv: Sequence[str]) -> int:
    print("ready", flush=True)
    threading.Event().wait(30)
    return 0


def _pipes(argv: Sequence[str]) -> int:
    line = sys.stdin.readline().strip()
    print(f"out {line}", flush=True)
    print(f"err {line}", file=sys.stderr, flush=True)
    return 0


def _sleep_or_echo(argv: Sequence[str]) -> int:
    if argv[0] == "sleep":
        return _sleep(argv)
    print(f"out {argv[0]}", flush=True)
    print(f"err {argv[0]}", file=sys.stderr, flush=True)
    return int(argv[0])


def _identity(argv: Sequence[str]) -> int:
    """Print the identity handed to this child for the CA in ``argv[0]`` (its PID, whether its
    leaf was signed by that CA), whether a second take finds none, and whether one is handed
    for another CA directory."""
    from chrysalis.quic import DevelopmentCA

    ca = DevelopmentCA.load_or_create(Path(argv[0]))
    identity = zygote_module.handed_identity(argv[0])
    if identity is None:
        print("none", flush=True)
        return 0
    leaf = identity.chain[0]
    signed = leaf.issuer == ca.certificate.subject
    leaf.verify_directly_issued_by(ca.certificate)  # raises unless the CA signed it
    print(identity.pid.hex(), signed, zygote_module.handed_identity(argv[0]) is None, flush=True)
    return 0


def _fail(argv: Sequence[str]) -> int:
    raise RuntimeError("boom in the child")


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote.start()
    yield z
    z.close()


def _read_line(process: object) -> str:
    stdout = process.stdout  # type: ignore[attr-defined]
    assert stdout is not None
    data = b""
    while not data.endswith(b"\n"):
        chunk = stdout.read(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


def test_child_runs_target_with_argv_single_threaded_and_its_status_is_reported(
    zygote: Zygote,
) -> None:
    child = zygote.spawn(["7", "b"], target=f"{HERE}:_echo")
    # The zygote runs no threads, so neither does a fresh child; stdin is /dev/null.
    assert _read_line(child) == "7 b 1 True\n"
    assert child.wait(10) == 7
    assert child.poll() == 7


@pytest.mark.parametrize("stdin", [False, True])
@pytest.mark.parametrize("stderr", [False, True])
def test_stdin_and_stderr_pipes_are_each_optional(
    zygote: Zygote, stdin: bool, stderr: bool
) -> None:
    read_fd, write_fd = os.pipe()
    try:
        child = zygote.spawn(
            [], target=f"{HERE}:_pipes", stdin=read_fd if stdin else None, stderr=stderr
        )
    finally:
        os.close(read_fd)
    with os.fdopen(write_fd, "wb") as feed:
        if stdin:
            feed.write(b"hello\n")
    word = "hello" if stdin else ""  # without a stdin pipe the child reads /dev/null
    assert _read_line(child) == f"out {word}\n"
    if stderr:
        assert child.stderr is not None
        assert child.stderr.read() == f"err {word}\n".encode()
    else:
        assert child.stderr is None
    assert child.wait(10) == 0


def test_killed_child_reports_the_signal(zygote: Zygote) -> None:
    child = zygote.spawn([], target=f"{HERE}:_sleep")
    assert _read_line(child) == "ready\n"
    assert child.poll() is None
    child.kill()
    assert child.wait(10) == -signal.SIGKILL


def test_failing_target_exits_with_status_one(zygote: Zygote) -> None:
    child = zygote.spawn([], target=f"{HERE}:_fail")
    assert child.wait(10) == 1


def test_unknown_target_exits_with_status_one(zygote: Zygote) -> None:
    child = zygote.spawn([], target="no_such_module_zz:main")
    assert child.wait(10) == 1


def test_many_children_each_get_their_own_status(zygote: Zygote) -> None:
    children = [zygote.spawn([str(i)], target=f"{HERE}:_echo") for i in range(8)]
    assert [c.wait(10) for c in children] == list(range(8))


def test_one_request_forks_a_batch_each_with_its_own_pipes(zygote: Zygote) -> None:
    children, error = zygote.spawn_many(
        [["sleep"], ["3"], ["4"]], target=f"{HERE}:_sleep_or_echo", stderr=True
    )
    assert error is None
    assert len({c.pid for c in children}) == 3
    assert _read_line(children[0]) == "ready\n"
    # A sibling holds no copy of another's pipes: an exited worker's pipes end at once, while
    # the first still runs.
    for child, n in zip(children[1:], (3, 4), strict=True):
        assert child.wait(10) == n
        assert child.stdout is not None
        assert child.stderr is not None
        assert child.stdout.read() == f"out {n}\n".encode()
        assert child.stderr.read() == f"err {n}\n".encode()
    assert children[0].poll() is None
    children[0].kill()
    assert children[0].wait(10) == -signal.SIGKILL


def test_a_batch_larger_than_one_request_is_sent_as_several(
    zygote: Zygote, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zygote_module, "MAX_BATCH", 2)
    children, error = zygote.spawn_many([[str(i)] for i in range(5)], target=f"{HERE}:_echo")
    assert error is None
    assert [c.wait(10) for c in children] == list(range(5))
    with pytest.raises(ValueError, match="1 to 2 workers"):
        zygote._request([["0"]] * 3, f"{HERE}:_echo", None, None, False)


def test_a_batch_the_zygote_cannot_fork_whole_returns_those_it_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(zygote_module, "_MAX_CHILDREN", 2)  # the zygote forked below has it
    z = Zygote.start()
    try:
        fds = os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else None
        children, error = z.spawn_many([[str(i)] for i in range(4)], target=f"{HERE}:_echo")
        assert error is not None
        assert "more than 2 workers" in error
        if fds is not None:  # the pipes of the two never forked are closed: two stdouts kept
            assert len(os.listdir("/proc/self/fd")) == len(fds) + 2
        assert [c.wait(10) for c in children] == [0, 1]
        # Once reaped, they make room again.
        again, error = z.spawn_many([["5"]], target=f"{HERE}:_echo")
        assert error is None
        assert again[0].wait(10) == 5
    finally:
        z.close()


def test_each_child_is_handed_an_identity_of_its_own_issued_ahead_by_the_zygote(
    zygote: Zygote, tmp_path: Path
) -> None:
    ca_dir = tmp_path / "ca"
    seen: list[str] = []
    # Two requests: the second takes identities left from the first's batch, a third one more
    # than a batch holds (the zygote issues what it lacks).
    for size in (3, 2, zygote_module.IDENTITY_BATCH + 1):
        children, error = zygote.spawn_many(
            [[str(ca_dir)]] * size, target=f"{HERE}:_identity", identities=ca_dir
        )
        assert error is None
        for child in children:
            pid, signed, taken_once = _read_line(child).split()
            assert (signed, taken_once) == ("True", "True")
            seen.append(pid)
            assert child.wait(10) == 0
    assert len(seen) == len(set(seen)) == 5 + zygote_module.IDENTITY_BATCH + 1
    # Without ``identities`` (or for another CA) nothing is handed: the worker issues its own.
    child = zygote.spawn([str(ca_dir)], target=f"{HERE}:_identity")
    assert _read_line(child) == "none\n"
    other = tmp_path / "other"
    children, error = zygote.spawn_many(
        [[str(other)]], target=f"{HERE}:_identity", identities=ca_dir
    )
    assert error is None
    assert _read_line(children[0]) == "none\n"


def test_malformed_request_is_refused_with_a_reason(zygote: Zygote) -> None:
    import array
    import json
    import socket

    read_fd, write_fd = os.pipe()
    try:
        with zygote._lock:
            zygote._sock.sendmsg(
                [json.dumps({"workers": [["0"], ["1"]]}).encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_fd]))],
            )
            reply = zygote._next_reply()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert reply["spawned"] == []
    assert "expected 2 descriptors, got 1" in str(reply["error"])


def test_a_request_naming_no_ca_directory_for_its_identities_is_refused(zygote: Zygote) -> None:
    import array
    import json
    import socket

    read_fd, write_fd = os.pipe()
    try:
        with zygote._lock:
            zygote._sock.sendmsg(
                [json.dumps({"workers": [["0"]], "identities": 5}).encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_fd]))],
            )
            reply = zygote._next_reply()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert reply["spawned"] == []
    assert "identities must name a CA directory" in str(reply["error"])


def test_closed_zygote_refuses_spawns_clearly() -> None:
    z = Zygote.start()
    z.close()
    with pytest.raises(ZygoteUnavailableError):
        z.spawn(["0"], target=f"{HERE}:_echo")
    with pytest.raises(ZygoteUnavailableError):
        z.spawn_many([["0"], ["1"]], target=f"{HERE}:_echo")
    with pytest.raises(ChildProcessError):
        os.waitpid(z.pid, os.WNOHANG)  # reaped by close()


def test_wait_times_out_without_killing(zygote: Zygote) -> None:
    import subprocess

    child = zygote.spawn([], target=f"{HERE}:_sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.05)
    assert child.poll() is None
    child.kill()
    assert child.wait(10) == -signal.SIGKILL


def _runtime_threads(argv: Sequence[str]) -> int:
    from monarch.actor._base import loop as _loop

    print(len(_loop._RUNTIME_THREADS), flush=True)
    return 0


def test_forked_child_forgets_the_parents_runtime_loop_threads() -> None:
    # A child's threads can reuse the parent's thread idents: a stale entry made a worker's
    # actor thread look like a runtime loop (Future.get refused to block).
    from monarch.actor._base.loop import RuntimeLoop, is_runtime_thread

    loop = RuntimeLoop("parent-loop")
    loop.start()
    try:
        z = Zygote.start()
        try:
            child = z.spawn([], target=f"{HERE}:_runtime_threads")
            assert _read_line(child) == "0\n"
            assert child.wait(10) == 0
        finally:
            z.close()
    finally:
        loop.stop(timeout=1.0)
    assert not is_runtime_thread()


def test_a_fork_waits_for_an_import_another_thread_has_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork copies a module's import lock held by a thread running that module's body, not
    the thread: in the child, importing the module again (unpickling a lambda needs
    ``cloudpickle``) waited forever. The zygote's fork waits for such imports to finish."""
    gate = types.ModuleType("zygote_import_gate")
    started, release = threading.Event(), threading.Event()
    gate.started, gate.release = started, release  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zygote_import_gate", gate)
    (tmp_path / "zygote_slow_module.py").write_text(
        "import zygote_import_gate as gate\ngate.started.set()\ngate.release.wait(30)\nVALUE = 7\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importer = threading.Thread(target=importlib.import_module, args=("zygote_slow_module",))
    importer.start()
    assert started.wait(10)
    pids: list[int] = []

    def fork() -> None:
        pid = fork_between_imports()
        if pid == 0:  # the child: is the module whole, or still "being imported"?
            module = sys.modules.get("zygote_slow_module")
            whole = module is not None and not module.__spec__._initializing  # type: ignore[union-attr]
            os._exit(0 if whole and getattr(module, "VALUE", None) == 7 else 3)
        pids.append(pid)

    forker = threading.Thread(target=fork)
    forker.start()
    forker.join(0.5)
    waited = forker.is_alive()  # still waiting for the import (a plain fork returns at once)
    release.set()
    forker.join(10)
    importer.join(10)
    assert pids, "the fork never happened"
    _, status = os.waitpid(pids[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert waited
    sys.modules.pop("zygote_slow_module", None)
