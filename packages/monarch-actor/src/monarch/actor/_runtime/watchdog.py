"""The client's heartbeat driver: ``liveness.HeartbeatMonitor`` on the client's runtime loop.

Why here: the client starts (or asks the host daemons for) every worker process, and the host
layer already turns a worker's exit into a process death
(``_hosts.groups.WorkerGroup.on_exit``). A worker that stops answering does not exit, so the
driver pings each watched worker's agent (``_runtime.proc.HEARTBEAT_ENDPOINT``) through the
client's runtime, over the same transport as every message (direct lane or QUIC stream), and
hands a worker silent for
``supervision_watchdog_timeout`` seconds to the callback given to ``watch``, on a thread of its
own (the callback declares the process dead: see ``WorkerGroup.on_unresponsive``).

Each watched process has its own reply port (the port says who answered; nothing in a payload
is trusted for that). The timeout is read from ``monarch.config`` at every poll, so
``configure(supervision_watchdog_timeout=...)`` applies at once; 0 turns the check off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Final

from chrysalis.core import Pid
from monarch.actor._base.envelope import PortAddr
from monarch.actor._base.loop import RuntimeLoop, RuntimeLoopClosedError
from monarch.actor._runtime.liveness import HeartbeatMonitor
from monarch.actor._runtime.proc import (
    ProcRuntime,
)
from monarch.actor._runtime.sinks import (
    PortSink,
    Reply,
)
from monarch.config import _registry as _config

__all__ = ["HeartbeatDriver"]

_log = logging.getLogger("monarch.actor.watchdog")
#: Seconds between looks at the setting while the check is off.
_OFF_RECHECK: Final = 1.0

SilentCallback = Callable[[float, float], None]
"""Called as ``callback(silence, timeout)`` once the watched process is declared dead."""


class _Answers(PortSink):
    """The reply port of one watched process: every answer counts as heard (loop thread)."""

    __slots__ = ("_driver", "_pid")

    def __init__(self, driver: HeartbeatDriver, pid: bytes) -> None:
        super().__init__()
        self._driver = driver
        self._pid = pid

    def deliver(self, reply: Reply) -> bool:
        if reply.ok:
            self._driver._heard(self._pid)
        return False  # stays open until the process is forgotten

    def abandon(self, exc: BaseException) -> None:
        pass


class HeartbeatDriver:
    """Pings watched processes and reports the silent ones (module docstring)."""

    def __init__(self, runtime: ProcRuntime, loop: RuntimeLoop) -> None:
        self._runtime = runtime
        self._loop = loop
        self._monitor: HeartbeatMonitor[bytes] = HeartbeatMonitor()
        self._watched: dict[bytes, tuple[PortAddr, SilentCallback]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    # -- any thread ---------------------------------------------------------------------------
    def watch(self, pid: Pid, on_silent: SilentCallback) -> None:
        """Start pinging ``pid``; ``on_silent(silence, timeout)`` once it is declared dead."""
        self._call_soon(self._watch, pid.raw, on_silent)

    def forget(self, pid: Pid) -> None:
        """Stop watching ``pid`` (it exited, or its mesh stopped)."""
        self._call_soon(self._forget, pid.raw)

    def close(self) -> None:
        """Stop every heartbeat (idempotent)."""
        self._call_soon(self._close)

    def _call_soon(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeLoopClosedError):
            self._loop.call_soon(fn, *args)

    # -- loop thread ----------------------------------------------------------------------------
    def _now(self) -> float:
        return self._loop.loop.time()

    def _watch(self, pid: bytes, on_silent: SilentCallback) -> None:
        if self._closed or pid in self._watched:
            return
        try:
            port = self._runtime.open_port(self._runtime.agent, _Answers(self, pid))
        except Exception as exc:  # PortOverflowError: max_open_ports
            _log.warning("process %s is not watched: %s", pid.hex(), exc)
            return
        try:
            self._monitor.watch(pid, self._now())
        except OverflowError as exc:
            self._runtime.close_port(port.index)
            _log.warning("process %s is not watched: %s", pid.hex(), exc)
            return
        self._watched[pid] = (port, on_silent)
        self._schedule(self._now())

    def _forget(self, pid: bytes) -> None:
        self._monitor.forget(pid)
        entry = self._watched.pop(pid, None)
        if entry is not None:
            self._runtime.close_port(entry[0].index)

    def _close(self) -> None:
        self._closed = True
        for pid in list(self._watched):
            self._forget(pid)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _heard(self, pid: bytes) -> None:
        self._monitor.heard(pid, self._now())

    def _schedule(self, now: float) -> None:
        if self._closed or not self._watched:
            return
        timeout = float(_config.get("supervision_watchdog_timeout"))
        when = self._monitor.next_poll(now, timeout)
        if when is None:
            when = now + _OFF_RECHECK
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = self._now()
        timeout = float(_config.get("supervision_watchdog_timeout"))
        due = self._monitor.poll(now, timeout)
        for pid in due.pings:
            entry = self._watched.get(pid)
            if entry is not None:
                self._runtime.send_heartbeat(pid, entry[0], timeout)
        for pid, silence in due.dead:
            entry = self._watched.pop(pid, None)
            if entry is None:
                continue
            port, on_silent = entry
            self._runtime.close_port(port.index)
            threading.Thread(
                target=_report,
                args=(on_silent, silence, timeout),
                name="monarch-unresponsive",
                daemon=True,
            ).start()
        self._schedule(now)


def _report(on_silent: SilentCallback, silence: float, timeout: float) -> None:
    try:
        on_silent(silence, timeout)
    except Exception:
        _log.exception("declaring an unresponsive process dead failed")
