"""``ParentLinkManager``: keeps one parent link alive across failures (spec 3.7).

Why: a ``ParentLink`` is one incarnation of one stream. A node wants "a parent, whenever one is
reachable": this supervisor dials the configured endpoints round-robin, runs a ``ParentLink``
on each stream, and reconnects after it ends, with a fixed ``retry_delay`` only after a full
pass over the endpoints (no exponential growth, no jitter, as in the reference).

* Identity: ``NamespaceConfig.authority`` pins the parent PID; without it the first
  authenticated parent is pinned for the rest of the manager's life (discovery).
* Rejections ``INCOMPATIBLE_VERSION`` and ``IDENTITY_MISMATCH`` are terminal, and
  ``ALREADY_LINKED`` is terminal only before the first successful connection; the status then
  becomes ``FAILED`` and the manager stops. ``UNAVAILABLE`` is retried.
* An established link ended by the parent with ``ALREADY_LINKED`` was superseded by a newer
  connection with this node's identity (another process holds it): that is terminal too
  (``FAILED``, ``superseded``), so two processes with one identity do not take turns forever.
  An established link ended with ``UNAVAILABLE`` (a refused publication) is retried after
  ``retry_delay``.
* ``wait_connected`` raises ``TerminalRejection`` (a ``NameserverError``) for every terminal
  case: catch it to report the failure without a traceback.
* While connected, a **gated default route** toward the parent address is installed in the
  router (when one is given); when the link ends the gate is closed first, then the default
  route removed.
* ``resolve`` / ``enumerate`` use the current link and block across reconnects until a link
  answers or the manager stops (``UpstreamClosed``).

Dialling is injected (``ParentDialer``): the node passes a function that opens a link-local
nameserver stream, pinned or not; tests pass in-memory streams. Tasks run on a ``Spawner``
(the running asyncio loop by default, a nursery under trio).
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, final

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.datagram import Route, RouteGate, Router
from chrysalis.nameserver._errors import NameserverError
from chrysalis.nameserver._link import LinkState, ParentLink, ParentLinkRejected
from chrysalis.nameserver._protocol import (
    DEFAULT_VERSIONS,
    Consistency,
    EnumerationCursor,
    EnumerationResult,
    RejectCode,
    Resolution,
    VersionRange,
)
from chrysalis.nameserver._service import NameserverService, UpstreamClosed, Watch
from chrysalis.nameserver._stream import ByteStream
from chrysalis.nameserver.runtime import Spawner, Task, default_spawner, join_shielded, sleep

__all__ = [
    "DEFAULT_RETRY_DELAY",
    "NamespaceConfig",
    "ParentDialer",
    "ParentLinkManager",
    "ParentStatus",
    "ParentStatusKind",
    "TerminalRejection",
]

_log = logging.getLogger("chrysalis.nameserver")

DEFAULT_RETRY_DELAY: Final = 1.0
"""Seconds between passes over the parent endpoints."""
MAX_ENDPOINTS: Final = 64
_GATE_TIMEOUT: Final = 5.0

ParentDialer = Callable[[DatagramAddr, Pid | None], Awaitable[tuple[Pid, ByteStream]]]
"""``await dial(address, pinned_pid_or_None) -> (authenticated parent PID, byte stream)``."""


@final
@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    """Where the parent is: ``endpoints`` (1..64 addresses, tried in order) and optionally
    the pinned parent ``authority``; ``retry_delay`` seconds after each full pass.

    ``ValueError`` for no endpoints (NoAddresses), the link-local PID (ReservedParent) or a
    non-positive delay.
    """

    endpoints: tuple[DatagramAddr, ...]
    authority: Pid | None = None
    retry_delay: float = DEFAULT_RETRY_DELAY

    def __post_init__(self) -> None:
        endpoints = tuple(self.endpoints)
        object.__setattr__(self, "endpoints", endpoints)
        if not endpoints:
            raise ValueError("a namespace configuration needs at least one parent address")
        if len(endpoints) > MAX_ENDPOINTS:
            raise ValueError(f"at most {MAX_ENDPOINTS} parent addresses")
        for address in endpoints:
            if not isinstance(address, DatagramAddr):
                raise TypeError(f"parent addresses must be DatagramAddr, not {type(address)}")
        if self.authority is not None and self.authority.is_link_local:
            raise ValueError("the parent cannot be the link-local PID")
        if not self.retry_delay > 0:
            raise ValueError("retry_delay must be positive")


class ParentStatusKind(enum.Enum):
    """Where a ``ParentLinkManager`` stands."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    FAILED = "failed"
    STOPPED = "stopped"


@final
@dataclass(frozen=True, slots=True)
class ParentStatus:
    """The manager's status: ``peer``/``address``/``link`` while connected; ``peer``,
    ``address`` and ``code`` after a terminal rejection."""

    kind: ParentStatusKind
    peer: Pid | None = None
    address: DatagramAddr | None = None
    link: LinkId | None = None
    code: RejectCode | None = None
    superseded: bool = False
    """``FAILED`` because a newer connection with this node's identity replaced the link."""


class TerminalRejection(NameserverError):
    """The parent refused this node for good (``ParentStatusKind.FAILED``).

    ``child`` is this node's PID, ``code`` the ``RejectCode``; ``superseded`` is true when an
    established link was replaced by a newer connection with the same identity."""

    def __init__(self, child: Pid, code: RejectCode, *, superseded: bool = False) -> None:
        message = f"parent rejected nameserver link for PID {child.hex()}: {code.name.lower()}"
        if superseded:
            message += " (a newer connection with the same identity replaced this node's link)"
        super().__init__(message)
        self.child = child
        self.code = code
        self.superseded = superseded

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_rejection, (self.child, self.code, self.superseded))


def _rebuild_rejection(child: Pid, code: RejectCode, superseded: bool) -> TerminalRejection:
    return TerminalRejection(child, code, superseded=superseded)


def _terminal(code: RejectCode, connected_once: bool) -> bool:
    if code in (RejectCode.INCOMPATIBLE_VERSION, RejectCode.IDENTITY_MISMATCH):
        return True
    return code is RejectCode.ALREADY_LINKED and not connected_once


@final
class ParentLinkManager:
    """The reconnecting supervisor of this node's parent link (see the module docstring)."""

    __slots__ = (
        "_config",
        "_current",
        "_dial",
        "_link_watch",
        "_pinned",
        "_router",
        "_service",
        "_spawner",
        "_status",
        "_status_watch",
        "_stopping",
        "_task",
        "_versions",
    )

    def __init__(
        self,
        service: NameserverService,
        config: NamespaceConfig,
        dial: ParentDialer,
        *,
        router: Router | None = None,
        versions: VersionRange = DEFAULT_VERSIONS,
        spawner: Spawner | None = None,
    ) -> None:
        if service.local_entry is None:
            raise ValueError("the service needs its local entry before linking to a parent")
        if config.authority == service.authority:
            raise ValueError("a node cannot be its own parent (SelfLink)")
        self._service = service
        self._config = config
        self._dial = dial
        self._router = router
        self._versions = versions
        self._pinned = config.authority
        self._current: ParentLink | None = None
        self._status = ParentStatus(ParentStatusKind.CONNECTING)
        self._status_watch = Watch()
        self._link_watch = Watch()
        self._stopping = False
        self._spawner = spawner
        self._task: Task | None = None

    @classmethod
    def spawn(
        cls,
        service: NameserverService,
        config: NamespaceConfig,
        dial: ParentDialer,
        *,
        router: Router | None = None,
        versions: VersionRange = DEFAULT_VERSIONS,
        spawner: Spawner | None = None,
    ) -> ParentLinkManager:
        """Build the manager and start its supervisor task on ``spawner`` (the asyncio loop
        by default)."""
        spawner = default_spawner(spawner)
        manager = cls(service, config, dial, router=router, versions=versions, spawner=spawner)
        manager._task = spawner.spawn(manager._supervise)
        return manager

    # -- observers --------------------------------------------------------------------------

    @property
    def status(self) -> ParentStatus:
        """The current status."""
        return self._status

    @property
    def status_watch(self) -> Watch:
        """Bumped on every status change."""
        return self._status_watch

    @property
    def pinned(self) -> Pid | None:
        """The parent PID (configured, or pinned by discovery)."""
        return self._pinned

    @property
    def current_link(self) -> ParentLink | None:
        """The active link, if connected."""
        return self._current

    async def wait_connected(self) -> ParentStatus:
        """Wait for ``CONNECTED``; ``TerminalRejection`` on ``FAILED``, ``UpstreamClosed``
        once stopped."""
        while True:
            status = self._status
            if status.kind is ParentStatusKind.CONNECTED:
                return status
            if status.kind is ParentStatusKind.FAILED:
                assert status.code is not None
                raise TerminalRejection(
                    self._service.authority, status.code, superseded=status.superseded
                )
            if status.kind is ParentStatusKind.STOPPED:
                raise UpstreamClosed("the parent link manager stopped")
            await self._status_watch.wait_change(self._status_watch.version)

    def _set_status(self, status: ParentStatus) -> None:
        self._status = status
        self._status_watch.bump()

    # -- upstream ---------------------------------------------------------------------------

    async def resolve(self, pid: Pid, consistency: Consistency = Consistency.CACHED) -> Resolution:
        """Resolve through the current parent link, waiting across reconnects."""
        while True:
            link = await self._wait_link()
            try:
                return await link.resolve(pid, consistency)
            except UpstreamClosed:
                await self._wait_other_link(link)

    async def enumerate(
        self,
        cursor: EnumerationCursor | None = None,
        limit: int = 0,
        consistency: Consistency = Consistency.CACHED,
    ) -> EnumerationResult:
        """Enumerate through the current parent link, waiting across reconnects."""
        while True:
            link = await self._wait_link()
            try:
                return await link.enumerate(cursor, limit, consistency)
            except UpstreamClosed:
                await self._wait_other_link(link)

    async def _wait_link(self) -> ParentLink:
        while True:
            if self._current is not None:
                return self._current
            if self._status.kind in (ParentStatusKind.FAILED, ParentStatusKind.STOPPED):
                raise UpstreamClosed("the parent link manager stopped")
            await self._link_watch.wait_change(self._link_watch.version)

    async def _wait_other_link(self, link: ParentLink) -> None:
        while self._current is link:
            if self._status.kind in (ParentStatusKind.FAILED, ParentStatusKind.STOPPED):
                raise UpstreamClosed("the parent link manager stopped")
            await self._link_watch.wait_change(self._link_watch.version)

    # -- supervisor -------------------------------------------------------------------------

    async def _supervise(self) -> None:
        connected_once = False
        endpoints = self._config.endpoints
        index = 0
        try:
            while not self._stopping:
                address = endpoints[index]
                index = (index + 1) % len(endpoints)
                completed_round = index == 0
                outcome = await self._attempt(address, connected_once)
                if outcome is None:  # established, then refused: retry after the delay
                    connected_once = True
                    index = 0
                    completed_round = True
                elif outcome is True:
                    connected_once = True
                elif isinstance(outcome, ParentStatus):
                    self._set_status(outcome)
                    return
                if self._status.kind is not ParentStatusKind.CONNECTING:
                    self._set_status(ParentStatus(ParentStatusKind.CONNECTING))
                if completed_round and outcome is not True:
                    await sleep(self._config.retry_delay)
                elif outcome is True:
                    index = 0
        finally:
            if self._status.kind is not ParentStatusKind.FAILED:
                self._set_status(ParentStatus(ParentStatusKind.STOPPED))
            self._link_watch.bump()

    async def _attempt(
        self, address: DatagramAddr, connected_once: bool
    ) -> bool | ParentStatus | None:
        """One dial: ``True`` after a link was active (and ended), ``None`` after a link was
        active and then refused by the parent, ``False`` on a failure to retry, a ``FAILED``
        status on a terminal rejection."""
        try:
            peer, stream = await self._dial(address, self._pinned)
        except Exception as exc:
            _log.info("dialling parent at %s failed: %r", address, exc)
            return False
        if peer == self._service.authority or (self._pinned is not None and peer != self._pinned):
            _abort(stream)
            return False
        link = ParentLink.spawn(
            peer, address, stream, self._service, versions=self._versions, spawner=self._spawner
        )
        try:
            link_id = await link.wait_active()
        except ParentLinkRejected as rejected:
            await link.join()
            if _terminal(rejected.code, connected_once):
                return ParentStatus(ParentStatusKind.FAILED, peer, address, code=rejected.code)
            return False
        except NameserverError:
            await link.join()
            return False
        except BaseException:
            await link.shutdown()
            raise
        self._pinned = peer
        gate = self._install_default_route(address)
        self._current = link
        self._link_watch.bump()
        self._set_status(ParentStatus(ParentStatusKind.CONNECTED, peer, address, link_id))
        try:
            final = await link.wait_closed()
        finally:
            await link.shutdown()
            self._remove_default_route(gate)
            self._current = None
            self._link_watch.bump()
        if final.state is LinkState.REJECTED:
            if final.code is RejectCode.ALREADY_LINKED:
                return ParentStatus(
                    ParentStatusKind.FAILED, peer, address, code=final.code, superseded=True
                )
            return None
        return True

    def _install_default_route(self, address: DatagramAddr) -> RouteGate | None:
        if self._router is None:
            return None
        gate = RouteGate()
        self._router.set_default(Route.gated(address, gate))
        return gate

    def _remove_default_route(self, gate: RouteGate | None) -> None:
        router = self._router
        if router is None or gate is None:
            return
        try:
            gate.close(_GATE_TIMEOUT)
        except TimeoutError:
            _log.warning("the parent default route gate did not drain")
        current = router.default_route
        if current is not None and current.gate is gate:
            router.remove_default()

    # -- lifecycle --------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop: end the current link (it is finished cleanly), remove the default route
        and wait for the supervisor (idempotent)."""
        self._stopping = True
        task = self._task
        if task is not None:
            task.cancel()
            await join_shielded([task])
        if self._status.kind is not ParentStatusKind.FAILED:
            self._set_status(ParentStatus(ParentStatusKind.STOPPED))


def _abort(stream: ByteStream) -> None:
    with contextlib.suppress(Exception):  # nothing more to do with an unwanted stream
        stream.abort(0)
