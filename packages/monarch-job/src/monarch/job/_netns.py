"""Network namespaces as separate hosts on one machine, for tests and benchmarks of jobs
(``ProcessJob(..., namespaces=hosts.names)``).

``NetnsHosts(n)`` creates ``n`` namespaces (``ip netns add``, needs root and iproute2), each
joined to the calling namespace by a veth pair on a /30 of its own, with a default route back:
host ``i`` is ``10.A.B.(4i+2)``, the caller's end ``10.A.B.(4i+1)``, where ``10.A.B.0/24`` is
picked at random among /24s no route of the caller uses. So every host has its own routable
address and reaches the client, and a worker loop listening on the wildcard advertises that
address. ``delete()`` (or leaving the ``with`` block) deletes the namespaces, which removes
both ends of their veth pairs. Names carry the creating process id and a random tag, so runs of
several users on one machine do not collide.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import subprocess
from types import TracebackType
from typing import Final

__all__ = ["MAX_NETNS_HOSTS", "NetnsHosts", "NetnsUnavailable"]

#: Most namespaces one ``NetnsHosts`` creates (a /24 holds 64 /30s).
MAX_NETNS_HOSTS: Final = 63
_IP_TIMEOUT: Final = 20.0


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (not root, no iproute2, no kernel support);
    the message says why."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False
    )


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class NetnsHosts:
    """``count`` network namespaces with their own addresses (see the module docstring)."""

    def __init__(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 63:
            raise ValueError(f"NetnsHosts takes 1 to {MAX_NETNS_HOSTS} hosts, not {count!r}")
        self.count = count
        self.tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.names = [f"mj{self.tag}-{i}" for i in range(count)]
        self.addresses: list[str] = []
        self.created: list[str] = []

    def create(self) -> list[str]:
        """Create the namespaces; their names. ``NetnsUnavailable`` when this machine cannot,
        ``RuntimeError`` for any other failure (what was made is deleted first)."""
        try:
            probe = _ip("netns", "list")
        except (OSError, subprocess.SubprocessError) as exc:
            raise NetnsUnavailable(f"cannot run 'ip' ({exc}): needs iproute2") from None
        if probe.returncode != 0:
            raise NetnsUnavailable(f"'ip netns' does not work here: {probe.stderr.strip()}")
        try:
            base = self._free_subnet()
            for i, name in enumerate(self.names):
                done = _ip("netns", "add", name)
                if done.returncode != 0:
                    why = done.stderr.strip()
                    if not self.created:
                        raise NetnsUnavailable(f"cannot create network namespaces: {why}")
                    raise RuntimeError(f"ip netns add {name}: {why}")
                self.created.append(name)
                outer, inner = f"mj{self.tag}o{i}", f"mj{self.tag}i{i}"
                here, there = base + 4 * i + 1, base + 4 * i + 2
                _must("-n", name, "link", "set", "lo", "up")
                _must("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", name)
                _must("addr", "add", f"{here}/30", "dev", outer)
                _must("link", "set", outer, "up")
                _must("-n", name, "addr", "add", f"{there}/30", "dev", inner)
                _must("-n", name, "link", "set", inner, "up")
                _must("-n", name, "route", "add", "default", "via", str(here))
                self.addresses.append(str(there))
        except BaseException:
            self.delete()
            raise
        return list(self.names)

    def _free_subnet(self) -> ipaddress.IPv4Address:
        routes = _ip("-4", "route", "show", "table", "all").stdout
        for _ in range(64):
            a, b = 100 + secrets.randbelow(150), secrets.randbelow(256)
            if f"10.{a}.{b}." not in routes:
                return ipaddress.IPv4Address(f"10.{a}.{b}.0")
        raise RuntimeError("found no free 10.A.B.0/24 for the namespaces' links")

    def delete(self) -> list[str]:
        """Delete the namespaces made (their veth pairs go with them); the names that could
        not be deleted (none normally)."""
        left: list[str] = []
        for name in reversed(self.created):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if _ip("netns", "delete", name).returncode == 0:
                    continue
            left.append(name)
        self.created = left
        return left

    def exists(self) -> list[str]:
        """Which of this object's namespaces exist now."""
        listed = _ip("netns", "list").stdout.split()
        return [name for name in self.names if name in listed]

    def __enter__(self) -> NetnsHosts:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.delete()
