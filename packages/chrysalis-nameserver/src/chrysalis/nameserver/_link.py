"""``ParentLink``: the child side of one parent-link incarnation, on asyncio or trio (spec 3.5).

Why it looks like this: ``ChildSession`` checks messages, ``ChildPublisher`` decides what to
publish and ``ResolverCache`` remembers answers; this driver only moves frames. One task runs
the link:

1. send ``Hello``, read the first frame: ``Welcome`` establishes the link, ``Reject`` ends it
   (``state`` becomes ``REJECTED`` with the code), a clean end is ``ParentLinkClosed``;
2. publish the **export view** (this node's entry plus every directory entry, rewritten to this
   node's locators) as a chunked snapshot; the link is ``ACTIVE`` only once that snapshot is
   acknowledged;
3. then two loops share the stream: inbound frames (acks, resnapshot requests, answers, cache
   updates) and the service's revision watch (each change re-computes the export and sends at
   most one delta in flight, as the reference does).

A ``Reject`` on the established link ends it with ``state`` ``REJECTED``: ``ALREADY_LINKED``
when a newer connection of this node's PID superseded the link (another process holds this
identity), ``UNAVAILABLE`` when the parent refused a publication (its namespace bound, say); a
warning is logged. While established the link sends a keepalive (a ``CACHED`` resolve of the
parent's own PID, answered locally by any parent) every ``keepalive_interval`` seconds (30 by
default), so the parent's idle timeout (``NameserverService``, 120 s) never closes a quiet
link.

Requests (``resolve``, ``enumerate``) are written directly by the caller and completed by the
inbound loop; they are bounded by the session's ``max_pending_requests``. Every ``Found``
answer, cached or fresh, is rewritten to a single locator: the parent address this link dialled
(priority 0). When the link ends every waiter gets ``UpstreamClosed`` and the cache is cleared.

The task runs on a ``Spawner`` (the running asyncio loop by default, a nursery under trio).
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.nameserver._cache import ResolverCache
from chrysalis.nameserver._errors import CacheError, NameserverError
from chrysalis.nameserver._protocol import (
    DEFAULT_VERSIONS,
    Consistency,
    EnumerationCursor,
    EnumerationPage,
    EnumerationResult,
    EnumerationStale,
    Found,
    Locator,
    NotFound,
    NsMessage,
    RejectCode,
    Resolution,
    VersionRange,
)
from chrysalis.nameserver._publisher import ChildPublisher, export_view
from chrysalis.nameserver._service import NameserverService, UpstreamClosed, Watch
from chrysalis.nameserver._session import (
    CacheUpdated,
    ChildSession,
    EnumerateCompleted,
    Established,
    PublicationAcked,
    Rejected,
    ResnapshotRequested,
    ResolveCompleted,
)
from chrysalis.nameserver._stream import ByteStream, NsFrameStream
from chrysalis.nameserver._views import rewrite_enumeration, rewrite_resolution
from chrysalis.nameserver.runtime import (
    Event,
    Spawner,
    Task,
    default_spawner,
    is_cancellation,
    join_shielded,
    monotonic_millis,
    new_event,
    race,
    sleep,
)

__all__ = [
    "DEFAULT_KEEPALIVE_INTERVAL",
    "LinkState",
    "LinkStatus",
    "ParentLink",
    "ParentLinkClosed",
    "ParentLinkError",
    "ParentLinkRejected",
]

_log = logging.getLogger("chrysalis.nameserver")

DEFAULT_KEEPALIVE_INTERVAL: Final = 30.0
"""Seconds between the keepalives an established ``ParentLink`` sends."""


class ParentLinkError(NameserverError):
    """A parent link could not be set up or ended."""


class ParentLinkClosed(ParentLinkError):
    """The parent link ended before (or after) it became active."""


class ParentLinkRejected(ParentLinkError):
    """The parent refused the link; ``code`` says why."""

    def __init__(self, code: RejectCode, message: str = "") -> None:
        super().__init__(message or f"parent rejected the nameserver link: {code.name}")
        self.code = code


class LinkState(enum.Enum):
    """Where a ``ParentLink`` stands."""

    PENDING = "pending"
    ACTIVE = "active"
    REJECTED = "rejected"
    CLOSED = "closed"


@final
@dataclass(frozen=True, slots=True)
class LinkStatus:
    """A ``ParentLink`` state with its link id (once welcomed) and reject code."""

    state: LinkState
    link: LinkId | None = None
    code: RejectCode | None = None


@final
class _Waiter:
    """One request's answer slot (an event plus the result or the failure)."""

    __slots__ = ("error", "event", "result")

    def __init__(self) -> None:
        self.event: Event = new_event()
        self.result: Resolution | EnumerationResult | None = None
        self.error: BaseException | None = None

    def complete(self, result: Resolution | EnumerationResult) -> None:
        if not self.event.is_set():
            self.result = result
            self.event.set()

    def fail(self, error: BaseException) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()

    async def wait(self) -> Resolution | EnumerationResult:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@final
class ParentLink:
    """One incarnation of this node's link to its parent (see the module docstring).

    Use ``ParentLink.spawn(...)`` inside a running loop. ``ValueError`` when the service has
    no local entry or the parent is this node (``SelfLink``).
    """

    __slots__ = (
        "_address",
        "_cache",
        "_clock",
        "_ended_by",
        "_exported",
        "_frames",
        "_ids",
        "_keepalive",
        "_keepalive_id",
        "_parent",
        "_publisher",
        "_service",
        "_session",
        "_spawner",
        "_status",
        "_status_watch",
        "_task",
        "_waiters",
    )

    def __init__(
        self,
        parent: Pid,
        address: DatagramAddr,
        stream: ByteStream,
        service: NameserverService,
        *,
        versions: VersionRange = DEFAULT_VERSIONS,
        clock: Callable[[], int] = monotonic_millis,
        spawner: Spawner | None = None,
        keepalive_interval: float | None = DEFAULT_KEEPALIVE_INTERVAL,
    ) -> None:
        if keepalive_interval is not None and not keepalive_interval > 0:
            raise ValueError("keepalive_interval must be positive (or None)")
        local = service.local_entry
        if local is None:
            raise ValueError("the service needs its local entry before linking to a parent")
        if parent == service.authority:
            raise ValueError("a node cannot be its own parent (SelfLink)")
        self._parent = parent
        self._address = address
        self._service = service
        self._frames = NsFrameStream(stream)
        self._session = ChildSession(service.authority, parent, versions)
        self._publisher = ChildPublisher(self._session)
        self._cache = ResolverCache(parent)
        self._clock = clock
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._status = LinkStatus(LinkState.PENDING)
        self._status_watch = Watch()
        self._spawner = spawner
        self._exported = 0
        self._task: Task | None = None
        self._keepalive = keepalive_interval
        self._ended_by: RejectCode | None = None
        self._keepalive_id: int | None = None

    @classmethod
    def spawn(
        cls,
        parent: Pid,
        address: DatagramAddr,
        stream: ByteStream,
        service: NameserverService,
        *,
        versions: VersionRange = DEFAULT_VERSIONS,
        clock: Callable[[], int] = monotonic_millis,
        spawner: Spawner | None = None,
        keepalive_interval: float | None = DEFAULT_KEEPALIVE_INTERVAL,
    ) -> ParentLink:
        """Build the link and start its task on ``spawner`` (the asyncio loop by default)."""
        spawner = default_spawner(spawner)
        link = cls(
            parent,
            address,
            stream,
            service,
            versions=versions,
            clock=clock,
            spawner=spawner,
            keepalive_interval=keepalive_interval,
        )
        link._task = spawner.spawn(link._run)
        return link

    # -- observers --------------------------------------------------------------------------

    @property
    def parent(self) -> Pid:
        """The authenticated parent PID."""
        return self._parent

    @property
    def address(self) -> DatagramAddr:
        """The parent address this link dialled."""
        return self._address

    @property
    def status(self) -> LinkStatus:
        """The current status."""
        return self._status

    @property
    def cache(self) -> ResolverCache:
        """Answers cached from the parent."""
        return self._cache

    async def wait_active(self) -> LinkId:
        """The link id once the initial snapshot is acknowledged; ``ParentLinkRejected`` or
        ``ParentLinkClosed`` if the link ends first."""
        while True:
            status = self._status
            if status.state is LinkState.ACTIVE:
                assert status.link is not None
                return status.link
            self._raise_terminal(status)
            await self._status_watch.wait_change(self._status_watch.version)

    async def wait_closed(self) -> LinkStatus:
        """Wait until the link ended; return its final status."""
        while self._status.state not in (LinkState.REJECTED, LinkState.CLOSED):
            await self._status_watch.wait_change(self._status_watch.version)
        return self._status

    @staticmethod
    def _raise_terminal(status: LinkStatus) -> None:
        if status.state is LinkState.REJECTED:
            assert status.code is not None
            raise ParentLinkRejected(status.code)
        if status.state is LinkState.CLOSED:
            raise ParentLinkClosed("the parent link closed")

    # -- requests ---------------------------------------------------------------------------

    def _locators(self) -> tuple[Locator, ...]:
        return (Locator(self._address, 0),)

    async def resolve(self, pid: Pid, consistency: Consistency = Consistency.CACHED) -> Resolution:
        """Resolve through the parent (a live cache hit for ``CACHED`` needs no I/O).
        ``UpstreamClosed`` when the link is not (or no longer) active."""
        if consistency is Consistency.CACHED and self._status.state is LinkState.ACTIVE:
            cached = self._cache.resolve(pid, self._clock())
            if cached is not None:
                return rewrite_resolution(cached, self._locators())
        request = self._request_id()
        try:
            message = self._session.resolve(request, pid, consistency)
        except NameserverError as exc:
            raise UpstreamClosed(f"cannot send the request: {exc}") from exc
        result = await self._exchange(request, message)
        assert isinstance(result, Found | NotFound)
        return rewrite_resolution(result, self._locators())

    async def enumerate(
        self,
        cursor: EnumerationCursor | None = None,
        limit: int = 0,
        consistency: Consistency = Consistency.CACHED,
    ) -> EnumerationResult:
        """A page of the parent's view, every entry rewritten to the parent address."""
        request = self._request_id()
        try:
            message = self._session.enumerate(request, consistency, cursor, limit)
        except NameserverError as exc:
            raise UpstreamClosed(f"cannot send the request: {exc}") from exc
        result = await self._exchange(request, message)
        assert isinstance(result, EnumerationPage | EnumerationStale)
        return rewrite_enumeration(result, self._locators())

    def _request_id(self) -> int:
        if self._status.state is not LinkState.ACTIVE:
            raise UpstreamClosed("the parent link is not active")
        return next(self._ids)

    async def _exchange(self, request: int, message: NsMessage) -> Resolution | EnumerationResult:
        waiter = _Waiter()
        self._waiters[request] = waiter
        try:
            self._frames.send_nowait(message)
            return await waiter.wait()
        except UpstreamClosed:
            raise
        except Exception as exc:
            raise UpstreamClosed(f"the parent link failed: {exc}") from exc
        finally:
            self._waiters.pop(request, None)

    # -- lifecycle --------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop the link (the stream is finished) and wait for its task, even while the
        caller is being cancelled (it is a cleanup step)."""
        task = self._task
        if task is not None:
            task.cancel()
            await join_shielded([task])

    async def join(self) -> None:
        """Wait for the link task to end."""
        task = self._task
        if task is not None:
            await task.join()

    def _set_status(self, status: LinkStatus) -> None:
        self._status = status
        self._status_watch.bump()

    async def _run(self) -> None:
        clean = False
        final = LinkStatus(LinkState.CLOSED)
        try:
            established = await self._handshake()
            if isinstance(established, Rejected):
                final = LinkStatus(LinkState.REJECTED, code=established.code)
                clean = True
                return
            self._publish_snapshot(established)
            await self._run_active()
            clean = True
            if self._ended_by is not None:
                final = LinkStatus(LinkState.REJECTED, self._session.link, self._ended_by)
        except Exception as exc:
            _log.info("parent link to %s ended: %r", self._parent, exc)
        except BaseException as exc:
            clean = is_cancellation(exc)
            raise
        finally:
            self._session.close()
            self._cache.clear()
            for waiter in self._waiters.values():
                waiter.fail(UpstreamClosed("the parent link closed"))
            self._waiters.clear()
            if clean:
                self._frames.finish()
            else:
                self._frames.abort()
            self._set_status(final)

    async def _handshake(self) -> Established | Rejected:
        await self._frames.send(self._session.hello())
        message = await self._frames.receive()
        if message is None:
            raise ParentLinkClosed("the parent closed the stream before welcoming")
        event = self._session.receive(message)
        if not isinstance(event, Established | Rejected):
            raise ParentLinkError(f"unexpected {type(event).__name__} during the handshake")
        return event

    def _export(self) -> None:
        # The revision the export reflects: the outbound loop waits for changes after it, so
        # a commit between this snapshot and the loop's start is never missed.
        self._exported = self._service.revisions.version
        local = self._service.local_entry
        assert local is not None
        self._publisher.set_export(export_view(local, self._service.snapshot()))

    def _publish_snapshot(self, established: Established) -> None:
        self._status = LinkStatus(LinkState.PENDING, established.link)
        self._export()
        for message in self._publisher.start():
            self._frames.send_nowait(message)

    async def _run_active(self) -> None:
        assert self._spawner is not None
        if self._keepalive is None:
            await race(self._spawner, self._inbound, self._outbound)
        else:
            await race(self._spawner, self._inbound, self._outbound, self._keepalives)

    async def _keepalives(self) -> None:
        interval = self._keepalive
        assert interval is not None
        while True:
            await sleep(interval)
            if self._keepalive_id is not None:
                continue  # the previous keepalive is still unanswered
            request = next(self._ids)
            message = self._session.resolve(request, self._parent, Consistency.CACHED)
            self._keepalive_id = request
            self._frames.send_nowait(message)

    async def _outbound(self) -> None:
        watch = self._service.revisions
        seen = self._exported
        while True:
            seen = await watch.wait_change(seen)
            self._export()
            for message in self._publisher.poll():
                await self._frames.send(message)

    async def _inbound(self) -> None:
        while True:
            message = await self._frames.receive()
            if message is None:
                return
            event = self._session.receive(message)
            if isinstance(event, PublicationAcked | ResnapshotRequested):
                if isinstance(event, ResnapshotRequested):
                    self._set_status(LinkStatus(LinkState.PENDING, self._session.link))
                for reply in self._publisher.handle(event):
                    self._frames.send_nowait(reply)
                if self._publisher.synchronized and self._status.state is LinkState.PENDING:
                    self._set_status(LinkStatus(LinkState.ACTIVE, self._session.link))
            elif isinstance(event, ResolveCompleted):
                self._offer(event.resolution)
                self._complete(event.request, event.resolution)
            elif isinstance(event, EnumerateCompleted):
                self._complete(event.request, event.result)
            elif isinstance(event, CacheUpdated):
                self._offer(event.resolution)
            elif isinstance(event, Rejected):
                self._ended_by = event.code
                if event.code is RejectCode.ALREADY_LINKED:
                    _log.warning(
                        "parent %s ended this node's nameserver link: another connection "
                        "with the same identity (PID %s) superseded it",
                        self._parent,
                        self._service.authority,
                    )
                else:
                    _log.warning(
                        "parent %s refused this node's publication (%s); its namespace may "
                        "be full (see its log)",
                        self._parent,
                        event.code.name.lower(),
                    )
                return
            else:
                raise ParentLinkError(f"unexpected {type(event).__name__} on an active link")

    def _offer(self, resolution: Resolution) -> None:
        if resolution.revision.authority != self._parent:
            return  # an answer relayed from another authority is passed through uncached
        try:
            self._cache.update(resolution, self._clock())
        except CacheError as exc:
            _log.info("ignoring a cache update from %s: %s", self._parent, exc)

    def _complete(self, request: int, result: Resolution | EnumerationResult) -> None:
        waiter = self._waiters.get(request)
        if waiter is not None:
            waiter.complete(result)
        elif request == self._keepalive_id:
            self._keepalive_id = None
