"""Actors of the job tests (a module of their own: host processes import them by name)."""

from __future__ import annotations

import os
from typing import Any

from monarch.actor import Actor, current_rank, endpoint, this_host


class Where(Actor):
    """Reports where it runs: its pid, its host (the pid of the host's worker loop, which leads
    the session every process it starts is in, forked or exec'd) and its network namespace."""

    @endpoint
    def place(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host_pid": os.getsid(0),
            "netns": os.stat("/proc/self/ns/net").st_ino,
            "rank": current_rank().rank,
        }

    @endpoint
    def point(self) -> dict[str, int]:
        return dict(current_rank())


class HostProbe(Actor):
    """Spawns a process on its own ``this_host()`` and says which worker loop started it."""

    @endpoint
    def host_of_this_host(self) -> int:
        procs = this_host().spawn_procs()
        try:
            where = procs.spawn("probe_where", Where)
            place: dict[str, Any] = where.place.call_one().get(timeout=60)
            return int(place["host_pid"])
        finally:
            procs.stop().get(timeout=60)

    @endpoint
    def host_pid(self) -> int:
        return os.getsid(0)
