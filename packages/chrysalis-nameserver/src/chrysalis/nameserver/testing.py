"""In-memory drivers for the pure nameserver sessions: a parent end, a child end and a pair
wired back to back through the real codec (style: "tests run both ends in memory").

``ParentEnd`` is the action chain of the service (spec 3.3) without I/O: receive a message,
commit to the ``Nameserver``, complete the commit, answer resolves and enumerations locally
(as a root does), project routes when a ``RouteSession`` is given, and tear the link down on
any protocol error (fence, ``RemoveLink``, finish; a refused publication is first answered
with ``Reject(UNAVAILABLE)``). Pairs that share a ``Nameserver`` may share a ``links``
registry: an admission that supersedes another pair's link then fences that pair (its child
gets ``Reject(ALREADY_LINKED)``), as the service does. ``ChildEnd`` runs a ``ChildSession`` and a
``ChildPublisher``. ``SessionPair`` moves encoded frames between them, one frame per step,
in an order chosen by a seeded ``random.Random`` and optionally dropping child-to-parent
messages, so convergence can be checked under interleavings and loss. Every queue is bounded.

Applications can use these to test code built on the nameserver without a network.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, final

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver._codec import NsCodec
from chrysalis.nameserver._errors import (
    ApplyError,
    PublicationRejected,
    RemoteProtocolError,
    SessionError,
)
from chrysalis.nameserver._protocol import (
    DEFAULT_VERSIONS,
    SNAPSHOT_CHUNK_ENTRIES,
    NsMessage,
    ProcEntry,
    VersionRange,
)
from chrysalis.nameserver._publisher import ChildPublisher
from chrysalis.nameserver._routes import RouteSession
from chrysalis.nameserver._session import (
    ChildEvent,
    ChildSession,
    ChildState,
    CommitCommand,
    EnumerateForChild,
    Established,
    ParentAction,
    ParentSession,
    PublicationAcked,
    Rejected,
    ResnapshotRequested,
    ResolveForChild,
    SendAndClose,
    SendMessage,
)
from chrysalis.nameserver._state import ApplyEffects, Nameserver
from chrysalis.nameserver._views import (
    DEFAULT_NEGATIVE_TTL_MS,
    enumerate_local,
    resolve_local,
    rewrite_enumeration,
    rewrite_resolution,
)

__all__ = ["DEFAULT_QUEUE_LIMIT", "ChildEnd", "ParentEnd", "SessionPair"]

DEFAULT_QUEUE_LIMIT: Final = 65_536
"""Default bound on frames queued in one direction of a ``SessionPair``."""


@final
class ParentEnd:
    """The parent side of one link: a ``ParentSession`` driven against a ``Nameserver``.

    ``receive(message)`` returns the messages to send back. After a ``SendAndClose``, a
    protocol error or ``close()``, ``closed`` is true; ``failure`` holds the error that ended
    the link, if any. Resolves and enumerations are answered locally, as a root serving a
    child does; with a ``local_entry`` every answer's locators are rewritten to its locators.
    """

    __slots__ = (
        "_local",
        "_on_superseded",
        "_routes",
        "_ttl",
        "closed",
        "failure",
        "nameserver",
        "session",
        "superseded",
    )

    def __init__(
        self,
        nameserver: Nameserver,
        session: ParentSession,
        *,
        local_entry: ProcEntry | None = None,
        routes: RouteSession | None = None,
        negative_ttl_ms: int = DEFAULT_NEGATIVE_TTL_MS,
        on_superseded: Callable[[LinkId], None] | None = None,
    ) -> None:
        self.nameserver = nameserver
        self.session = session
        self._on_superseded = on_superseded
        self.superseded: LinkId | None = None
        """The link this end's admission superseded, if any."""
        self._local = local_entry
        self._routes = routes
        self._ttl = negative_ttl_ms
        self.closed = False
        self.failure: SessionError | None = None

    def receive(self, message: NsMessage) -> list[NsMessage]:
        """Run the action chain for one inbound message."""
        if self.closed:
            return []
        out: list[NsMessage] = []
        try:
            return self._run(self.session.receive(message), out)
        except PublicationRejected as exc:
            self.failure = exc
            out.append(self.session.publication_refused())
            self.close()
            return out
        except RemoteProtocolError as exc:
            self.failure = exc
            self.close()
            return []

    def supersede(self) -> list[NsMessage]:
        """A newer link of the same child replaced this one: fence the routes, close without
        revoking (the directory already did), and return the ``Reject`` for the child."""
        if self.closed:
            return []
        if self._routes is not None:
            self._routes.fence()
        action = self.session.supersede()
        self.closed = True
        if self._routes is not None:
            self._routes.finish()
        return [] if action is None else [action.message]

    def close(self) -> None:
        """Fence, revoke the link's entries and remove its routes (idempotent)."""
        if self._routes is not None:
            self._routes.fence()
        action = self.session.close()
        if action is not None:
            self._run(action)
        self.closed = True
        if self._routes is not None:
            self._routes.finish()

    def _run(
        self, first: ParentAction | None, out: list[NsMessage] | None = None
    ) -> list[NsMessage]:
        if out is None:
            out = []
        action = first
        session = self.session
        local = self._local
        while action is not None:
            if isinstance(action, CommitCommand):
                result: ApplyEffects | ApplyError
                try:
                    result = self.nameserver.apply(action.command)
                except ApplyError as exc:
                    result = exc
                routes = self._routes
                if (
                    isinstance(result, ApplyEffects)
                    and result.directory_change is not None
                    and routes is not None
                    and not routes.finished
                ):
                    routes.apply(result.directory_change)
                if isinstance(result, ApplyEffects) and result.superseded is not None:
                    self.superseded = result.superseded
                    if self._on_superseded is not None:
                        self._on_superseded(result.superseded)
                action = session.complete_commit(result)
            elif isinstance(action, SendMessage):
                out.append(action.message)
                action = None
            elif isinstance(action, SendAndClose):
                out.append(action.message)
                self.closed = True
                action = None
            elif isinstance(action, ResolveForChild):
                answer = resolve_local(
                    self.nameserver, action.pid, local_entry=self._local, negative_ttl_ms=self._ttl
                )
                if local is not None:
                    answer = rewrite_resolution(answer, local.locators)
                action = session.resolved(action.request, answer)
            else:
                assert isinstance(action, EnumerateForChild)
                page = enumerate_local(
                    self.nameserver,
                    local_entry=self._local,
                    cursor=action.cursor,
                    limit=action.limit,
                )
                if local is not None:
                    page = rewrite_enumeration(page, local.locators)
                action = session.enumerated(action.request, page)
        if session.is_closed:
            self.closed = True
        return out


@final
class ChildEnd:
    """The child side of one link: a ``ChildSession`` and a ``ChildPublisher``.

    ``receive(message)`` returns the messages to send; every event is appended to
    ``events``. The initial snapshot goes out when the link is established.
    """

    __slots__ = ("events", "publisher", "session")

    def __init__(self, session: ChildSession, publisher: ChildPublisher) -> None:
        self.session = session
        self.publisher = publisher
        self.events: list[ChildEvent] = []

    def open(self) -> list[NsMessage]:
        """The ``Hello``."""
        return [self.session.hello()]

    def publish(self, entries: Iterable[ProcEntry]) -> list[NsMessage]:
        """Set the export view and send what the window allows."""
        self.publisher.set_export(entries)
        return self.publisher.poll()

    def receive(self, message: NsMessage) -> list[NsMessage]:
        """Handle one message from the parent."""
        event = self.session.receive(message)
        self.events.append(event)
        if isinstance(event, Established):
            return self.publisher.start()
        if isinstance(event, PublicationAcked | ResnapshotRequested):
            return self.publisher.handle(event)
        return []


@final
class SessionPair:
    """A ``ChildEnd`` and a ``ParentEnd`` back to back over two bounded frame queues.

    Frames go through ``NsCodec``; ``step_parent`` / ``step_child`` deliver one frame.
    ``run(rng, drop)`` delivers until both queues are empty, picking a direction at random
    with ``rng`` (in order without it) and discarding child-to-parent messages for which
    ``drop`` returns true. ``RuntimeError`` if a queue exceeds ``queue_limit`` or ``run``
    exceeds ``max_steps``. Pairs built with one ``links`` dict (and one ``nameserver``) find
    each other by link id, so a child that reconnects supersedes its earlier pair.
    """

    __slots__ = (
        "child",
        "dropped",
        "parent",
        "queue_limit",
        "to_child",
        "to_parent",
    )

    def __init__(
        self,
        *,
        parent_pid: Pid,
        child_pid: Pid,
        link: LinkId,
        nameserver: Nameserver | None = None,
        parent_versions: VersionRange = DEFAULT_VERSIONS,
        child_versions: VersionRange = DEFAULT_VERSIONS,
        authenticated_child: Pid | None = None,
        max_in_flight: int = 1,
        chunk_entries: int = SNAPSHOT_CHUNK_ENTRIES,
        local_entry: ProcEntry | None = None,
        routes: RouteSession | None = None,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        links: dict[LinkId, SessionPair] | None = None,
    ) -> None:
        directory = nameserver if nameserver is not None else Nameserver(parent_pid)
        peer = child_pid if authenticated_child is None else authenticated_child

        def superseded(old: LinkId) -> None:
            pair = None if links is None else links.get(old)
            if pair is not None:
                pair.fence()

        self.parent = ParentEnd(
            directory,
            ParentSession(parent_pid, peer, link, parent_versions),
            local_entry=local_entry,
            routes=routes,
            on_superseded=superseded,
        )
        if links is not None:
            links[link] = self
        session = ChildSession(child_pid, parent_pid, child_versions)
        publisher = ChildPublisher(
            session, max_in_flight=max_in_flight, chunk_entries=chunk_entries
        )
        self.child = ChildEnd(session, publisher)
        self.to_parent: deque[bytes] = deque()
        self.to_child: deque[bytes] = deque()
        self.queue_limit = queue_limit
        self.dropped: list[NsMessage] = []

    def _push(self, queue: deque[bytes], messages: Iterable[NsMessage]) -> None:
        for message in messages:
            if len(queue) >= self.queue_limit:
                raise RuntimeError(f"more than {self.queue_limit} frames queued")
            queue.append(NsCodec.encode(message))

    def send_to_parent(self, *messages: NsMessage) -> None:
        """Queue messages toward the parent as if the child sent them (for requests built
        with ``child.session`` and for injecting misbehaviour)."""
        self._push(self.to_parent, messages)

    def fence(self) -> None:
        """This pair's link was superseded: the parent end closes and the child is sent the
        ``Reject``; frames still queued toward the parent are later refused."""
        self._push(self.to_child, self.parent.supersede())

    def send_to_child(self, *messages: NsMessage) -> None:
        """Queue messages toward the child as if the parent sent them."""
        self._push(self.to_child, messages)

    def connect(self) -> None:
        """Queue the child's ``Hello``."""
        self._push(self.to_parent, self.child.open())

    def publish(self, entries: Iterable[ProcEntry]) -> None:
        """Change the child's export view (and queue what it sends now)."""
        self._push(self.to_parent, self.child.publish(entries))

    def resync(self) -> None:
        """Make the child send a complete snapshot now."""
        self._push(self.to_parent, self.child.publisher.resync())

    def step_parent(self, drop: Callable[[NsMessage], bool] | None = None) -> bool:
        """Deliver (or drop) one frame to the parent; ``False`` when none is queued."""
        if not self.to_parent:
            return False
        message = NsCodec.decode(self.to_parent.popleft())
        if drop is not None and drop(message):
            self.dropped.append(message)
            return True
        self._push(self.to_child, self.parent.receive(message))
        return True

    def step_child(self) -> bool:
        """Deliver one frame to the child; ``False`` when none is queued."""
        if not self.to_child:
            return False
        message = NsCodec.decode(self.to_child.popleft())
        if self.child.session.state is ChildState.CLOSED:
            return True  # the child hung up: frames after a Reject are discarded
        self._push(self.to_parent, self.child.receive(message))
        return True

    def run(
        self,
        rng: random.Random | None = None,
        drop: Callable[[NsMessage], bool] | None = None,
        *,
        max_steps: int = 1_000_000,
    ) -> int:
        """Deliver until both queues are empty; returns the number of steps."""
        steps = 0
        while self.to_parent or self.to_child:
            if steps >= max_steps:
                raise RuntimeError(f"no quiescence after {max_steps} steps")
            steps += 1
            to_parent = bool(self.to_parent) and (
                not self.to_child or (rng.random() < 0.5 if rng is not None else True)
            )
            if to_parent:
                self.step_parent(drop)
            else:
                self.step_child()
        return steps

    @property
    def rejected(self) -> bool:
        """True when the child received a ``Reject``."""
        return any(isinstance(event, Rejected) for event in self.child.events)
