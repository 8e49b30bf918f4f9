"""``NameserverService``: the node's nameserver executor, on asyncio or trio (spec 3.3).

Why it looks like this: the directory (``Nameserver``) and the parent session are pure; this
module is the thin driver that owns the one directory of a node and serves child streams.

* ``apply(command)`` is the **commit point**. It is synchronous: on one event loop nothing
  interleaves with it, so it needs no lock (the reference needs a mutex because it is
  multi-threaded). After a successful apply it projects the link's routes (before any
  acknowledgement can be written), then bumps the coalescing revision watch and, when the
  admitted children changed, the child-links watch.
* ``serve(link, peer, stream, upstream)`` runs one ``ParentSession`` over one stream: read a
  frame, ``receive``, execute the action chain (commit, answer, send). Every exit path (clean
  EOF, protocol error, truncated frame, write failure, rejected publication, cancellation) does,
  in order: fence the link's route gate, commit ``RemoveLink``, and only then remove the link's
  routes. So once a link is gone no datagram is forwarded into its subtree.
* A child that connects again while its old link is still served (a node restarted with the
  same identity inside the transport's idle timeout) supersedes the old link: ``apply`` fences
  the old link's routes, the admission revokes its entries, its routes are removed, and the
  old stream is sent ``Reject(ALREADY_LINKED)`` and finished; the old session is closed, so
  whatever else arrives on it is refused. The new link then publishes its subtree afresh.
* A refused publication (a bound, a conflict) is answered with ``Reject(UNAVAILABLE)`` before
  the link ends, so the child sees why.
* A child stream that sends nothing for ``idle_timeout`` seconds (120 by default; ``None``
  disables it) is closed like any other ending link. ``ParentLink`` sends a keepalive well
  inside that time, so only streams that were abandoned (or never said ``Hello``) are closed.
* Rejoining children (``rejoining``). A link that ends without the child finishing its stream
  (a QUIC connection that idled out while one side was starved of CPU, a reset) revokes the
  link's entries like any other end, but the service remembers those PIDs for
  ``rejoin_grace`` seconds: the child is probably alive and dialling again (its entries come
  back with its next snapshot), so a caller that finds such a PID missing may wait for it
  (``chrysalis.node.Node.dial`` does, within a bound) instead of reporting ``NotFound`` at
  once. So does a child whose new link is admitted but whose snapshot is not committed yet.
  A child's resolve of such a PID (a worker dialling a sibling that is joining again) is
  answered once the PID is back, or ``NotFound`` after ``rejoin_wait`` seconds (5 by default;
  the wire protocol has no "rejoining" answer, so the answer is late instead of wrong; the
  asking link's other requests wait behind it, as they do behind an upstream resolve).
  A clean end (the child finished its stream: it stopped) is forgotten at once. At most
  ``MAX_REJOINING`` PIDs are remembered (the oldest are dropped).
* Answers to a child are rewritten to this node's own locators: this node is the child's next
  hop toward everything it can name. Misses go upstream (``UpstreamNameserver``) when there is a
  parent, within ``upstream_timeout``; otherwise (or on failure) a local ``NotFound``.

Runtime services (events, deadlines) come from ``runtime``, so the same code runs under
asyncio and under trio.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Final, Protocol, final

from chrysalis.core import LinkId, Pid
from chrysalis.datagram import Router
from chrysalis.nameserver._errors import ApplyError, NameserverError, PublicationRejected
from chrysalis.nameserver._protocol import (
    DEFAULT_VERSIONS,
    Consistency,
    EnumerationCursor,
    EnumerationResult,
    Found,
    Locator,
    ProcEntry,
    Resolution,
    Revision,
    VersionRange,
)
from chrysalis.nameserver._routes import RouteProjector, RouteSession
from chrysalis.nameserver._session import (
    CommitCommand,
    EnumerateForChild,
    ParentAction,
    ParentSession,
    ResolveForChild,
    SendAndClose,
    SendMessage,
)
from chrysalis.nameserver._state import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_LINKS,
    AdmitLink,
    ApplyEffects,
    DirectoryCommand,
    Nameserver,
    RemoveLink,
)
from chrysalis.nameserver._stream import ByteStream, NsFrameStream
from chrysalis.nameserver._views import (
    DEFAULT_NEGATIVE_TTL_MS,
    enumerate_local,
    lookup_local,
    resolve_local,
    rewrite_enumeration,
    rewrite_resolution,
)
from chrysalis.nameserver.runtime import Event, fail_after, monotonic, new_event

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_REJOIN_GRACE",
    "DEFAULT_REJOIN_WAIT",
    "DEFAULT_UPSTREAM_TIMEOUT",
    "MAX_REJOINING",
    "LocalEntryError",
    "NameserverService",
    "UpstreamClosed",
    "UpstreamNameserver",
    "Watch",
]

_log = logging.getLogger("chrysalis.nameserver")

DEFAULT_UPSTREAM_TIMEOUT: Final = 10.0
"""Seconds a child's request may wait on the upstream before a local answer is sent."""
DEFAULT_IDLE_TIMEOUT: Final = 120.0
"""Seconds a served child stream may stay silent before it is closed (``ParentLink`` sends a
keepalive every ``DEFAULT_KEEPALIVE_INTERVAL``, 30 s)."""
DEFAULT_REJOIN_GRACE: Final = 30.0
"""Seconds a PID whose link was lost (not closed) counts as ``rejoining``."""
DEFAULT_REJOIN_WAIT: Final = 5.0
"""Seconds a child's resolve of a ``rejoining`` PID waits for it before ``NotFound``."""
MAX_REJOINING: Final = 4096
"""Most PIDs remembered as ``rejoining`` at once (the oldest are dropped first)."""
_GATE_TIMEOUT: Final = 5.0


class UpstreamClosed(NameserverError):
    """The upstream (parent link or manager) is gone; the request was not answered."""


class LocalEntryError(NameserverError):
    """The local entry is not the authority's (``PidMismatch``) or is already set."""


class UpstreamNameserver(Protocol):
    """Where a non-root nameserver forwards what it cannot answer (spec 3.6).

    Both methods raise ``UpstreamClosed`` when no parent can answer any more.
    """

    async def resolve(self, pid: Pid, consistency: Consistency) -> Resolution: ...

    async def enumerate(
        self, cursor: EnumerationCursor | None, limit: int, consistency: Consistency
    ) -> EnumerationResult: ...


@final
class Watch:
    """A coalescing change counter: ``bump()`` advances it, ``wait_change(seen)`` returns
    the current version once it differs from ``seen`` (intermediate versions may be skipped)."""

    __slots__ = ("_event", "_version")

    def __init__(self) -> None:
        self._version = 0
        self._event: Event | None = None

    @property
    def version(self) -> int:
        """The current version."""
        return self._version

    def bump(self) -> None:
        """Advance the version and wake every waiter."""
        self._version += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait_change(self, seen: int) -> int:
        """Wait until the version is not ``seen``; return it."""
        while self._version == seen:
            if self._event is None:
                self._event = new_event()
            await self._event.wait()
        return self._version


@final
class NameserverService:
    """The nameserver of one node (see the module docstring).

    ``NameserverService(authority, router=None, ...)``: with a ``router``, every child link's
    publications become gated routes in it (``RouteProjector``).
    """

    __slots__ = (
        "_child_links",
        "_clock",
        "_directory",
        "_idle_timeout",
        "_local",
        "_lost",
        "_negative_ttl",
        "_projector",
        "_rejoin_grace",
        "_rejoin_wait",
        "_revisions",
        "_serving",
        "_upstream_timeout",
        "_versions",
    )

    def __init__(
        self,
        authority: Pid,
        *,
        router: Router | None = None,
        versions: VersionRange = DEFAULT_VERSIONS,
        negative_ttl_ms: int = DEFAULT_NEGATIVE_TTL_MS,
        upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT,
        max_links: int = DEFAULT_MAX_LINKS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        rejoin_grace: float = DEFAULT_REJOIN_GRACE,
        rejoin_wait: float = DEFAULT_REJOIN_WAIT,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        if not rejoin_grace >= 0:
            raise ValueError("rejoin_grace must not be negative")
        if not rejoin_wait >= 0:
            raise ValueError("rejoin_wait must not be negative")
        if upstream_timeout <= 0:
            raise ValueError("upstream_timeout must be positive")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError("idle_timeout must be positive (or None)")
        self._directory = Nameserver(
            authority, max_links=max_links, max_entries=max_entries, max_bytes=max_bytes
        )
        self._idle_timeout = idle_timeout
        self._serving: dict[LinkId, tuple[ParentSession, NsFrameStream]] = {}
        self._projector = None if router is None else RouteProjector(router)
        self._versions = versions
        self._negative_ttl = negative_ttl_ms
        self._upstream_timeout = upstream_timeout
        self._local: ProcEntry | None = None
        self._revisions = Watch()
        self._child_links = Watch()
        self._rejoin_grace = rejoin_grace
        self._rejoin_wait = rejoin_wait
        self._clock = clock
        # PID -> until when it counts as rejoining (insertion order = oldest first).
        self._lost: dict[Pid, float] = {}

    # -- observers --------------------------------------------------------------------------

    @property
    def authority(self) -> Pid:
        """This node's PID."""
        return self._directory.authority

    @property
    def directory(self) -> Nameserver:
        """The directory (read it; change it only through ``apply``)."""
        return self._directory

    @property
    def local_entry(self) -> ProcEntry | None:
        """This node's own entry, once installed."""
        return self._local

    @property
    def versions(self) -> VersionRange:
        """The protocol versions offered to children."""
        return self._versions

    @property
    def revisions(self) -> Watch:
        """Bumped after every commit that changed the directory (a re-publish hint)."""
        return self._revisions

    @property
    def child_links_watch(self) -> Watch:
        """Bumped when the directly admitted children change."""
        return self._child_links

    def revision(self) -> Revision:
        """The current directory revision."""
        return self._directory.revision

    def get(self, pid: Pid) -> ProcEntry | None:
        """The local entry or a directory entry for ``pid``."""
        if self._local is not None and pid == self._local.pid:
            return self._local
        return self._directory.get(pid)

    def snapshot(self) -> tuple[ProcEntry, ...]:
        """Every directory entry in PID order (the local entry is not included)."""
        return self._directory.snapshot()

    def child_links(self) -> Mapping[Pid, LinkId]:
        """Directly admitted children: child PID -> link id."""
        return self._directory.child_links()

    def rejoining(self, pid: Pid) -> bool:
        """Whether ``pid`` is missing only because its child is joining again: its link was
        lost (not closed) less than ``rejoin_grace`` seconds ago, or the child's new link is
        admitted and its snapshot not committed yet. ``False`` for a PID in the directory,
        one never seen, or one whose child stopped cleanly (module docstring)."""
        if self._directory.get(pid) is not None:
            return False
        if pid in self._directory.child_links():
            return True
        until = self._lost.get(pid)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._lost[pid]
        return False

    async def await_rejoined(self, pid: Pid, timeout: float) -> Resolution | None:
        """Wait, at most ``timeout`` seconds, for a ``rejoining`` PID to be published again:
        its ``Found``, ``NotFound`` once it no longer counts as rejoining (its grace ended or
        its child stopped cleanly), ``None`` when the time ran out first."""
        watch = self._revisions

        async def republished() -> Resolution:
            while True:
                seen = watch.version
                resolution = self.resolve(pid)
                if isinstance(resolution, Found) or not self.rejoining(pid):
                    return resolution
                await watch.wait_change(seen)

        try:
            return await fail_after(timeout, republished)
        except TimeoutError:
            return None

    def _remember_lost(self, pids: tuple[Pid, ...]) -> None:
        until = self._clock() + self._rejoin_grace
        lost = self._lost
        for pid in pids:
            lost.pop(pid, None)  # re-inserted last: the newest
            lost[pid] = until
        while len(lost) > MAX_REJOINING:
            del lost[next(iter(lost))]

    def set_local_entry(self, entry: ProcEntry) -> None:
        """Install this node's own entry, once (``LocalEntryError`` otherwise)."""
        if entry.pid != self.authority:
            raise LocalEntryError(f"local entry {entry.pid} is not the authority {self.authority}")
        if self._local is not None:
            raise LocalEntryError("the local entry is already set")
        self._local = entry
        self._revisions.bump()

    # -- the commit point -------------------------------------------------------------------

    def apply(self, command: DirectoryCommand) -> ApplyEffects:
        """Apply ``command`` (``ApplyError`` leaves everything unchanged), project its routes,
        then notify the watches. An admission that supersedes a link fences that link's
        routes first and removes them after, then closes its session (module docstring)."""
        before = self._directory.child_links() if _changes_links(command) else None
        stale: RouteSession | None = None
        if isinstance(command, AdmitLink) and before is not None:
            old = before.get(command.child)
            if old is not None and old != command.link and self._projector is not None:
                stale = self._projector.session(old)
                if stale is not None:
                    _fence(stale, old)
        effects = self._directory.apply(command)
        change = effects.directory_change
        if change is not None:
            projector = self._projector
            if projector is not None:
                session = projector.session(change.link)
                if session is not None and not session.fenced:
                    session.apply(change)
            self._revisions.bump()
        if effects.superseded is not None:
            if change is not None:  # the child is back on a new link: its snapshot follows
                self._remember_lost(change.removals)
            if stale is not None:
                try:
                    stale.finish(_GATE_TIMEOUT)
                except TimeoutError:
                    _log.warning("route gate of link %s did not drain", effects.superseded)
            self._fence_superseded(effects.superseded)
        if before is not None and dict(before) != dict(self._directory.child_links()):
            self._child_links.bump()
        return effects

    def _fence_superseded(self, link: LinkId) -> None:
        """Close the superseded link's session and tell its stream why (best effort: the
        old peer is usually gone)."""
        serving = self._serving.pop(link, None)
        if serving is None:
            return
        session, frames = serving
        _log.info("nameserver link %s of %s superseded by a new connection", link, session.peer)
        action = session.supersede()
        if action is not None:
            with contextlib.suppress(Exception):  # a dead stream cannot be told
                frames.send_nowait(action.message)
        frames.finish()

    # -- local answers ----------------------------------------------------------------------

    def resolve(self, pid: Pid) -> Resolution:
        """Resolve as a root does: local entry or directory, else ``NotFound`` with TTL."""
        return resolve_local(
            self._directory, pid, local_entry=self._local, negative_ttl_ms=self._negative_ttl
        )

    def enumerate(self, cursor: EnumerationCursor | None, limit: int) -> EnumerationResult:
        """One page of the local view (``EnumerationStale`` for a cursor of another
        revision)."""
        return enumerate_local(self._directory, local_entry=self._local, cursor=cursor, limit=limit)

    async def resolve_for_child(
        self, pid: Pid, consistency: Consistency, upstream: UpstreamNameserver | None
    ) -> Resolution:
        """What a child learns about ``pid``: rewritten to this node's locators."""
        found = lookup_local(self._directory, pid, self._local)
        result: Resolution
        if found is None and self._rejoin_wait > 0 and self.rejoining(pid):
            # In this node's subtree and joining again: answer once it is back (bounded).
            waited = await self.await_rejoined(pid, self._rejoin_wait)
            if waited is not None:
                return rewrite_resolution(waited, self._own_locators())
            _log.info(
                "resolve for a child: %s did not join again within %g s",
                pid.hex(),
                self._rejoin_wait,
            )
            return rewrite_resolution(self.resolve(pid), self._own_locators())
        if found is not None:
            result = found
        elif upstream is None:
            result = self.resolve(pid)
        else:
            try:
                result = await fail_after(
                    self._upstream_timeout, lambda: upstream.resolve(pid, consistency)
                )
            except (UpstreamClosed, TimeoutError):
                result = self.resolve(pid)
            if result.pid != pid:
                result = self.resolve(pid)
        return rewrite_resolution(result, self._own_locators())

    async def enumerate_for_child(
        self,
        cursor: EnumerationCursor | None,
        limit: int,
        consistency: Consistency,
        upstream: UpstreamNameserver | None,
    ) -> EnumerationResult:
        """A page for a child: upstream for ``REFRESH`` with a parent, else local; every
        entry rewritten to this node's locators."""
        result: EnumerationResult | None = None
        if consistency is Consistency.REFRESH and upstream is not None:
            try:
                result = await fail_after(
                    self._upstream_timeout,
                    lambda: upstream.enumerate(cursor, limit, consistency),
                )
            except (UpstreamClosed, TimeoutError):
                result = None
        if result is None:
            result = self.enumerate(cursor, limit)
        return rewrite_enumeration(result, self._own_locators())

    def _own_locators(self) -> tuple[Locator, ...]:
        return () if self._local is None else self._local.locators

    # -- serving one child ------------------------------------------------------------------

    async def serve(
        self,
        link: LinkId,
        peer: Pid,
        stream: ByteStream,
        upstream: UpstreamNameserver | None = None,
    ) -> None:
        """Serve one child stream until it ends; the link's entries and routes are revoked
        on every exit path (see the module docstring). Errors are logged, not raised;
        cancellation is re-raised after the cleanup."""
        frames = NsFrameStream(stream)
        session = ParentSession(self.authority, peer, link, self._versions)
        routes = self._projector.open(link) if self._projector is not None else None
        self._serving[link] = (session, frames)
        clean = False
        try:
            clean = await self._serve_loop(session, frames, upstream)
        except PublicationRejected as exc:
            _log.warning("nameserver link %s from %s: publication refused: %s", link, peer, exc)
            with contextlib.suppress(Exception):  # the child may be gone already
                frames.send_nowait(session.publication_refused())
            clean = True
        except TimeoutError:
            _log.info("nameserver link %s from %s idle for %s s", link, peer, self._idle_timeout)
        except Exception as exc:
            _log.info("nameserver link %s from %s ended: %r", link, peer, exc)
        finally:
            if self._serving.get(link, (None,))[0] is session:
                del self._serving[link]
            self._revoke(session, routes, link, lost=not clean)
            if clean:
                frames.finish()
            else:
                frames.abort()

    async def _serve_loop(
        self, session: ParentSession, frames: NsFrameStream, upstream: UpstreamNameserver | None
    ) -> bool:
        idle = self._idle_timeout
        while True:
            if idle is None:
                message = await frames.receive()
            else:
                message = await fail_after(idle, frames.receive)
            if message is None or session.is_closed:
                return True  # the end of the stream, or a late message of a superseded link
            action: ParentAction | None = session.receive(message)
            while action is not None:
                if isinstance(action, CommitCommand):
                    result: ApplyEffects | ApplyError
                    try:
                        result = self.apply(action.command)
                    except ApplyError as error:
                        result = error
                    action = session.complete_commit(result)
                elif isinstance(action, ResolveForChild):
                    answer = await self.resolve_for_child(action.pid, action.consistency, upstream)
                    action = session.resolved(action.request, answer)
                elif isinstance(action, EnumerateForChild):
                    page = await self.enumerate_for_child(
                        action.cursor, action.limit, action.consistency, upstream
                    )
                    action = session.enumerated(action.request, page)
                elif isinstance(action, SendMessage):
                    await frames.send(action.message)
                    action = None
                else:
                    assert isinstance(action, SendAndClose)
                    await frames.send(action.message)
                    return True

    def _revoke(
        self, session: ParentSession, routes: RouteSession | None, link: LinkId, *, lost: bool
    ) -> None:
        """Fence, commit ``RemoveLink``, then (only if that worked) remove the routes. The
        revoked PIDs of a ``lost`` link count as ``rejoining`` for a while; those of a link
        the child closed are forgotten."""
        if routes is not None:
            _fence(routes, link)
        session.close()
        try:
            effects = self.apply(RemoveLink(link))
        except ApplyError:
            _log.exception("removing nameserver link %s failed; its routes stay fenced", link)
            return
        change = effects.directory_change
        if change is not None and change.removals:
            if lost:
                _log.info(
                    "nameserver link %s of %s was lost: %d entries revoked until it rejoins",
                    link,
                    session.peer,
                    len(change.removals),
                )
                self._remember_lost(change.removals)
            else:
                for pid in change.removals:
                    self._lost.pop(pid, None)
        if routes is not None:
            routes.finish(_GATE_TIMEOUT)


def _fence(routes: RouteSession, link: LinkId) -> None:
    try:
        routes.fence(_GATE_TIMEOUT)
    except TimeoutError:
        _log.warning("route gate of link %s did not drain", link)


def _changes_links(command: DirectoryCommand) -> bool:
    return isinstance(command, AdmitLink | RemoveLink)
