"""``chrysalis.node.forking``: descriptors pass with a packet; a fork server forks workers that
run their target on the descriptors given as standard streams, reports their exit statuses
(returned integer, ``SystemExit``, an exception's traceback, a signal), exits when its client's
end closes, and dies with its parent when asked to (``lifeline``)."""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Iterator

import pytest

from chrysalis.node import forking

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not forking.can_fork_server(),
    reason="fork servers, PR_SET_PDEATHSIG and pidfds: Linux",
)

TIMEOUT = 20.0


def echo_main(argv: list[str]) -> int:
    """A worker: print its arguments and what it read on stdin, exit with its first argument."""
    print(" ".join(argv), sys.stdin.read(), sep="|")
    return int(argv[0])


def exit_main(argv: list[str]) -> int:
    raise SystemExit(int(argv[0]))


def raise_main(argv: list[str]) -> int:
    raise RuntimeError("worker failed: " + " ".join(argv))


def kill_main(argv: list[str]) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


def _handle(loop: forking.ServerLoop, data: bytes, fds: list[int]) -> None:
    """A test server's requests: ``{"target", "argv", "null_stdin"}``; the descriptors are the
    worker's stdin (unless ``null_stdin``), stdout and stderr."""
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        stdio: list[int | None] = [None, *fds] if request["null_stdin"] else list(fds)
        forking.run_child(loop, request["target"], request["argv"], stdio)
    for fd in fds:
        os.close(fd)
    loop.children.add(pid)
    loop.sock.send(json.dumps({"spawned": pid}).encode())


def _serve(sock: socket.socket) -> int:
    return forking.serve(sock, _handle, max_bytes=4096, max_fds=3)


def _wait_exit(pid: int) -> int:
    """The exit status of our child ``pid`` (bounded)."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], TIMEOUT)
        assert ready, f"process {pid} did not exit"
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _read_all(fd: int) -> str:
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([fd], [], [], TIMEOUT)
        assert ready, "no end of file from the worker's pipe"
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks).decode()
        chunks.append(chunk)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[socket.socket, int]]:
    sock, pid = forking.fork_server(_serve)
    sock.settimeout(TIMEOUT)
    try:
        yield sock, pid
    finally:
        sock.close()
        assert _wait_exit(pid) == 0  # the server returns 0 on end of file


def _run(
    server: tuple[socket.socket, int], target: str, argv: list[str], stdin: bytes | None
) -> tuple[int, str, str]:
    """Fork one worker through ``server``; its exit status, stdout and stderr."""
    sock, _ = server
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fds = [out_w, err_w]
    in_w = None
    if stdin is not None:
        in_r, in_w = os.pipe()
        fds.insert(0, in_r)
    request = {"target": f"{__name__}:{target}", "argv": argv, "null_stdin": stdin is None}
    sock.sendmsg(
        [json.dumps(request).encode()],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
    )
    for fd in fds:
        os.close(fd)
    if in_w is not None:
        assert stdin is not None
        os.write(in_w, stdin)
        os.close(in_w)
    pid = json.loads(sock.recv(4096))["spawned"]
    out, err = _read_all(out_r), _read_all(err_r)
    os.close(out_r)
    os.close(err_r)
    exited = json.loads(sock.recv(4096))
    assert exited["exited"] == pid
    return int(exited["status"]), out, err


def test_receive_returns_the_packet_and_its_descriptors() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_end, write_end = os.pipe()
    with ours, theirs:
        ours.sendmsg(
            [b"hello"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_end]))]
        )
        data, fds = forking.receive(theirs, 64, 3)
        assert data == b"hello"
        assert len(fds) == 1
        assert fds[0] != write_end  # a new descriptor for the same pipe
        os.write(fds[0], b"through")
        assert os.read(read_end, 16) == b"through"
        for fd in (read_end, write_end, *fds):
            os.close(fd)
        ours.send(b"plain")
        assert forking.receive(theirs, 64, 3) == (b"plain", [])
        ours.shutdown(socket.SHUT_WR)
        assert forking.receive(theirs, 64, 3) == (b"", [])


def test_worker_gets_its_streams_and_exits_with_its_result(
    server: tuple[socket.socket, int],
) -> None:
    assert _run(server, "echo_main", ["7", "a", "b"], b"input") == (7, "7 a b|input\n", "")


def test_a_missing_stdin_is_dev_null(server: tuple[socket.socket, int]) -> None:
    assert _run(server, "echo_main", ["0"], None) == (0, "0|\n", "")


def test_system_exit_and_exceptions_set_the_status(server: tuple[socket.socket, int]) -> None:
    assert _run(server, "exit_main", ["5"], None) == (5, "", "")
    status, out, err = _run(server, "raise_main", ["x", "y"], None)
    assert (status, out) == (1, "")
    assert "RuntimeError: worker failed: x y" in err


def test_a_signal_is_a_negative_status(server: tuple[socket.socket, int]) -> None:
    assert _run(server, "kill_main", [], None)[0] == -signal.SIGKILL


def test_die_with_parent_exits_when_the_parent_is_gone_already() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        forking.die_with_parent(os.getppid() + 1_000_000)  # not its parent: as if it had died
        os._exit(0)
    assert _wait_exit(pid) == 1


def test_a_lifeline_server_dies_with_its_parent() -> None:
    """An intermediate process forks a server with ``lifeline`` and exits: the server is
    killed (the write end of a pipe it alone holds closes) although its socket stays open."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the intermediate process
        code = 1
        try:
            os.close(read_end)

            def hold(sock: socket.socket) -> int:
                # It does not watch its socket: only the lifeline can end it before this does.
                select.select([], [], [], TIMEOUT * 2)
                return 0

            forking.fork_server(hold, lifeline=True)
            os.close(write_end)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    assert _wait_exit(pid) == 0
    ready, _, _ = select.select([read_end], [], [], TIMEOUT)
    assert ready, "the server outlived its parent"
    assert os.read(read_end, 1) == b""
    os.close(read_end)
