"""Network namespaces as hosts on one machine (public API): ``chrysalis scale --netns`` (issue 22,
item 4) runs every task whose head is not the root, its whole subtree, in a namespace of its
own, and monarch-job's tests and benchmarks run a job's hosts in them (``ProcessJob(...,
namespaces=...)``); anything that needs several hosts with their own addresses on one machine
can use it::

    from chrysalis.node.netns import Namespaces, NetnsUnavailable

    try:
        with Namespaces.for_tasks(3) as spaces:  # needs root and iproute2
            print(spaces.plan.task_names(), spaces.plan.task_addresses())
            # run processes there: spaces.prefix(task) + argv, or enter_netns(path) in a child
    except NetnsUnavailable as exc:
        print("no namespaces here:", exc)

Layout (``plan_namespaces``, pure; ``Namespaces``, the ``ip`` commands)::

    launcher (root)               switch namespace chs<tag>-sw      task namespace chs<tag>-T
    chs<tag>h 10.A.B.1/24 -veth- h0 -+- br0 (a bridge) -+- tT -veth- eth0 10.A.B.(T+1)/24
                                                        +- ...        (head T on UDP there,
                                                                        its leaves on Unix)

One bridge joins every namespace and the launcher's on one /24, like hosts on one LAN: each
task head is on UDP at its own address, every host reaches every other one directly (the
direct network baselines of an experiment too), and no IP forwarding or firewall setting of
the launcher's namespace is touched; it only gains one veth end and its connected route. The
/24 is chosen at random among those no route or address of the launcher's namespace uses
(``10.224.0.0/11``), names carry a random tag, so concurrent runs do not collide. Leaves keep
their Unix datagram sockets (on the file system, reachable inside their namespace).

Clean-up on every exit path: ``Namespaces.delete`` (the launcher's ``finally``) removes the
veth and the namespaces; before creating anything, ``Namespaces.create`` forks a *reaper*, a
small process in a session of its own that ignores SIGINT and SIGTERM and waits on a pidfd
for the launcher to exit. If the launcher ends without deleting (``kill -9``), the reaper kills
every process left in the namespaces (``ip netns pids``), deletes the veth and the namespaces
and exits; after a normal delete the launcher ends the reaper itself.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, final

__all__ = [
    "MAX_NAMESPACES",
    "NETNS_DIR",
    "Namespaces",
    "NetnsPlan",
    "NetnsUnavailable",
    "enter_netns",
    "netns_unavailable",
    "plan_namespaces",
]

MAX_NAMESPACES: Final = 250
"""Most task namespaces of one run (a /24 holds the launcher's address and 253 others)."""
NETNS_DIR: Final = Path("/run/netns")
"""Where ``ip netns`` keeps its named namespaces (``/run/netns/NAME``, for ``setns``)."""
_POOL: Final = ipaddress.IPv4Network("10.224.0.0/11")
_IP_TIMEOUT: Final = 20.0
_CLONE_NEWNET: Final = 0x40000000


class NetnsUnavailable(OSError):
    """Network namespaces cannot be made here (not Linux, not root, no iproute2, or the kernel
    or a sandbox refuses the first one); the message says why. Tests skip on it."""


def netns_unavailable() -> str | None:
    """Why this process cannot create network namespaces (``None`` if it can): not Linux,
    not root, or no ``ip`` command (iproute2)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "creating network namespaces needs iproute2 (no 'ip' command found)"
    return None


@final
@dataclass(frozen=True, slots=True)
class NetnsPlan:
    """Names and addresses of one run's namespaces: ``count`` task namespaces (tasks ``1 ..
    count``) on ``subnet`` (a /24), named after ``tag``."""

    tag: str
    subnet: ipaddress.IPv4Network
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_NAMESPACES:
            raise ValueError(f"1 to {MAX_NAMESPACES} namespaces, not {self.count}")
        if self.subnet.prefixlen != 24:
            raise ValueError(f"the namespaces' subnet must be a /24, not {self.subnet}")
        if not (self.tag.isascii() and self.tag.isalnum() and 1 <= len(self.tag) <= 8):
            raise ValueError(f"a tag is 1 to 8 ASCII letters or digits, not {self.tag!r}")

    @property
    def switch(self) -> str:
        """The namespace holding the bridge."""
        return f"chs{self.tag}-sw"

    @property
    def host_link(self) -> str:
        """The launcher's end of its veth to the bridge (at most 15 characters)."""
        return f"chs{self.tag}h"

    @property
    def root_address(self) -> str:
        """The launcher's (the root's) address on the bridge."""
        return str(self.subnet[1])

    def _check(self, task: int) -> None:
        if not 1 <= task <= self.count:
            raise ValueError(f"task {task} has no namespace (1..{self.count})")

    def name(self, task: int) -> str:
        """The namespace of task ``task`` (``1 .. count``)."""
        self._check(task)
        return f"chs{self.tag}-{task}"

    def address(self, task: int) -> str:
        """Task ``task``'s address in its namespace."""
        self._check(task)
        return str(self.subnet[task + 1])

    def path(self, task: int) -> str:
        """The file naming task ``task``'s namespace (``setns`` opens it)."""
        return str(NETNS_DIR / self.name(task))

    def names(self) -> list[str]:
        """Every namespace, the switch's first."""
        return [self.switch, *(self.name(t) for t in range(1, self.count + 1))]

    def task_names(self) -> list[str]:
        """The task namespaces in task order (``1 .. count``), for ``ip netns exec NAME``."""
        return [self.name(t) for t in range(1, self.count + 1)]

    def task_addresses(self) -> list[str]:
        """Each task namespace's address, in task order."""
        return [self.address(t) for t in range(1, self.count + 1)]


def plan_namespaces(
    count: int, used: Iterable[ipaddress.IPv4Network], rng: random.Random, tag: str
) -> NetnsPlan:
    """A plan for ``count`` namespaces on a random /24 of ``10.224.0.0/11`` that overlaps
    no network in ``used`` (the launcher's routes and addresses); ``ValueError`` if none of
    64 draws is free."""
    taken = list(used)
    for _ in range(64):
        index = rng.randrange(_POOL.num_addresses // 256)
        subnet = ipaddress.IPv4Network((int(_POOL.network_address) + 256 * index, 24))
        if not any(subnet.overlaps(net) for net in taken):
            return NetnsPlan(tag, subnet, count)
    raise ValueError(f"no free /24 in {_POOL} for the namespaces")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False
    )


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of this namespace's routes and addresses (``ip -4 -o``)."""
    found: list[ipaddress.IPv4Network] = []
    for args in (("-4", "-o", "route", "show", "table", "all"), ("-4", "-o", "addr", "show")):
        for line in _ip(*args).stdout.splitlines():
            for word in line.split():
                if word[:1].isdigit() and "." in word:
                    with contextlib.suppress(ValueError):
                        found.append(ipaddress.IPv4Network(word, strict=False))
    return found


def _remove(plan: NetnsPlan) -> list[str]:
    """Kill what runs in the plan's namespaces, delete its veth and namespaces (each only
    if present); the errors, if any."""
    errors = []
    for task in range(1, plan.count + 1):
        if not Path(plan.path(task)).exists():
            continue
        for word in _ip("netns", "pids", plan.name(task)).stdout.split():
            with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
                os.kill(int(word), signal.SIGKILL)
    if Path("/sys/class/net", plan.host_link).exists():
        done = _ip("link", "delete", plan.host_link)
        if done.returncode != 0:
            errors.append(done.stderr.strip())
    for name in reversed(plan.names()):
        if (NETNS_DIR / name).exists():
            done = _ip("netns", "delete", name)
            if done.returncode != 0:
                errors.append(done.stderr.strip())
    return errors


def _reap(plan: NetnsPlan, launcher: int) -> None:  # pragma: no cover - runs in the reaper
    """The reaper's life: outlive the launcher, then remove what it left."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        os.setsid()  # a kill of the launcher's process group does not take the reaper
        pidfd = os.pidfd_open(launcher)
        if os.getppid() != launcher:  # gone before the pidfd was opened
            os.close(pidfd)
            pidfd = -1
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
        keep = sorted({2, pidfd} - {-1})
        start = 3
        for fd in keep:
            if fd >= start:
                os.closerange(start, fd)
                start = fd + 1
        os.closerange(start, max(65536, os.sysconf("SC_OPEN_MAX")))
        if pidfd >= 0:
            select.select([pidfd], [], [])
        for error in _remove(plan):
            print(f"chrysalis-scale: netns clean-up: {error}", file=sys.stderr)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


@final
class Namespaces:
    """The namespaces of ``plan``: ``create`` them (reaper first), ``delete`` them."""

    def __init__(self, plan: NetnsPlan) -> None:
        self.plan = plan
        self._reaper: int | None = None

    @classmethod
    def for_tasks(cls, count: int) -> Namespaces:
        """Namespaces for ``count`` tasks on a /24 free in this namespace
        (``NetnsUnavailable`` with the reason where namespaces cannot be made here)."""
        reason = netns_unavailable()
        if reason is not None:
            raise NetnsUnavailable(reason)
        return cls(plan_namespaces(count, _used_networks(), random.Random(), secrets.token_hex(4)))

    def create(self) -> None:
        """Fork the reaper, then make the switch, the launcher's veth and one namespace per
        task with its veth on the bridge (``OSError`` naming the failed command; whatever was
        made is removed first; ``NetnsUnavailable`` when the first namespace cannot be made)."""
        plan = self.plan
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the reaper
            _reap(plan, launcher)
        self._reaper = pid
        try:
            sw = plan.switch
            first = _ip("netns", "add", sw)
            if first.returncode != 0:
                raise NetnsUnavailable(f"cannot create network namespaces: {first.stderr.strip()}")
            _must("-n", sw, "link", "add", "br0", "type", "bridge")
            _must("-n", sw, "link", "set", "br0", "up")
            _must("link", "add", plan.host_link, "type", "veth", "peer", "name", "h0", "netns", sw)
            _must("-n", sw, "link", "set", "h0", "master", "br0", "up")
            _must("addr", "add", f"{plan.root_address}/24", "dev", plan.host_link)
            _must("link", "set", plan.host_link, "up")
            for task in range(1, plan.count + 1):
                name, port = plan.name(task), f"t{task}"
                _must("netns", "add", name)
                _must("-n", name, "link", "set", "lo", "up")
                _must("-n", name, "link", "add", "eth0", "type", "veth",
                      "peer", "name", port, "netns", sw)  # fmt: skip
                _must("-n", sw, "link", "set", port, "master", "br0", "up")
                _must("-n", name, "addr", "add", f"{plan.address(task)}/24", "dev", "eth0")
                _must("-n", name, "link", "set", "eth0", "up")
        except BaseException:
            self.delete()
            raise

    def delete(self) -> None:
        """Kill what still runs in the namespaces, delete them and the veth, end the reaper
        (``OSError`` if something could not be deleted)."""
        errors = _remove(self.plan)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(reaper, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(reaper, 0)
        if errors:
            raise OSError(f"network namespaces not removed: {'; '.join(errors)}")

    def prefix(self, task: int) -> Sequence[str]:
        """The command prefix that runs an exec'd process in task ``task``'s namespace."""
        return ["ip", "netns", "exec", self.plan.name(task)]

    def __enter__(self) -> Namespaces:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.delete()


def enter_netns(name_or_path: str) -> None:
    """Move this process into a network namespace: an ``ip netns`` name (``/run/netns/NAME``)
    or the path of a namespace file (``/proc/PID/ns/net``). Only a single-threaded process
    moves whole: call it in a freshly forked child before it starts threads. ``OSError``
    naming the namespace otherwise."""
    path = name_or_path if "/" in name_or_path else str(NETNS_DIR / name_or_path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12+
        if setns is not None:
            setns(fd, _CLONE_NEWNET)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {path}: {os.strerror(errno)}")
    finally:
        os.close(fd)
