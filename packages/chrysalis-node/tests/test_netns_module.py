"""``chrysalis.node.netns``, the public module (used by the scale tool and by monarch-job's
tests and benchmarks): the plan's task names and addresses, the reason given where namespaces
cannot be made, and, as root, namespaces made and removed by a ``with`` block that a forked
child enters with ``enter_netns`` (by name and by path)."""

from __future__ import annotations

import ipaddress
import os
import random
import sys
from pathlib import Path

import pytest

from chrysalis.node.netns import (
    Namespaces,
    NetnsUnavailable,
    enter_netns,
    netns_unavailable,
    plan_namespaces,
)


def test_the_plan_lists_task_namespaces_and_addresses_in_task_order() -> None:
    plan = plan_namespaces(3, [], random.Random(7), "ab12")
    assert plan.task_names() == ["chsab12-1", "chsab12-2", "chsab12-3"]
    subnet = plan.subnet
    assert plan.task_addresses() == [str(subnet[2]), str(subnet[3]), str(subnet[4])]
    assert plan.root_address == str(subnet[1])
    assert all(ipaddress.IPv4Address(a) in subnet for a in plan.task_addresses())


def test_where_namespaces_cannot_be_made_the_reason_is_an_oserror(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns_unavailable() == "creating network namespaces needs root (CAP_SYS_ADMIN)"
    with pytest.raises(NetnsUnavailable, match="needs root") as caught:
        Namespaces.for_tasks(2)
    assert isinstance(caught.value, OSError)  # callers that caught OSError still do
    with pytest.raises(FileNotFoundError):
        enter_netns("chs-no-such-namespace")


def _child_in(target: str) -> int:
    """The network namespace inode a forked child reports after ``enter_netns(target)``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(read)
            enter_netns(target)
            os.write(write, str(os.stat("/proc/self/ns/net").st_ino).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return int(data)


@pytest.mark.netns
def test_namespaces_made_in_a_with_block_are_entered_and_removed() -> None:
    if sys.platform != "linux":
        pytest.skip("network namespaces are Linux's")
    try:
        spaces = Namespaces.for_tasks(2)
        with spaces:
            names = spaces.plan.task_names()
            inodes = [os.stat(spaces.plan.path(t)).st_ino for t in (1, 2)]
            assert _child_in(names[0]) == inodes[0]  # by ip netns name
            assert _child_in(spaces.plan.path(2)) == inodes[1]  # by path
            assert os.stat("/proc/self/ns/net").st_ino not in inodes  # the parent stays
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    assert not any(Path("/run/netns", name).exists() for name in spaces.plan.names())
