"""``ChildLinkServer``: admits child nameserver streams, on asyncio or trio (spec 3.6).

Why: the parent side of every child link is ``NameserverService.serve``; something must accept
the streams, give each a fresh link id and supervise the serving tasks. Link ids come from
``LinkIdAllocator`` (the first 8 bytes of the authority PID, then a big-endian counter from 1),
so they are parent-scoped and a reconnecting child always gets a new one. The number of
concurrently served links is bounded (``max_links``); a stream beyond it is refused at once.
``shutdown()`` stops accepting, cancels every serving task (each revokes its link on the way
out) and waits for them. Tasks run on a ``Spawner`` (the running asyncio loop by default, a
nursery under trio).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final, Protocol, final

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver._service import NameserverService, UpstreamNameserver
from chrysalis.nameserver._state import DEFAULT_MAX_LINKS, LinkIdAllocator
from chrysalis.nameserver._stream import ByteStream
from chrysalis.nameserver.runtime import Spawner, Task, default_spawner, join_shielded

__all__ = ["ChildLinkServer", "StreamAcceptor"]

_log = logging.getLogger("chrysalis.nameserver")
_REFUSED_CODE: Final = 0x3


class StreamAcceptor(Protocol):
    """A source of incoming nameserver streams with their authenticated peer
    (``chrysalis.quic``'s ``LinkProtocol`` is one). ``accept`` raises once it is closed."""

    async def accept(self) -> tuple[Pid, ByteStream]: ...


@final
class ChildLinkServer:
    """Accepts child links and serves each one (see the module docstring)."""

    __slots__ = (
        "_accepted",
        "_acceptor",
        "_allocator",
        "_max",
        "_service",
        "_spawner",
        "_task",
        "_tasks",
        "_upstream",
    )

    def __init__(
        self,
        service: NameserverService,
        acceptor: StreamAcceptor,
        *,
        upstream: UpstreamNameserver | None = None,
        max_links: int = DEFAULT_MAX_LINKS,
        spawner: Spawner | None = None,
    ) -> None:
        if max_links < 1:
            raise ValueError("max_links must be positive")
        self._service = service
        self._acceptor = acceptor
        self._upstream = upstream
        self._max = max_links
        self._allocator = LinkIdAllocator(service.authority)
        self._spawner = spawner
        self._tasks: set[Task] = set()
        self._task: Task | None = None
        self._accepted = 0

    @classmethod
    def spawn(
        cls,
        service: NameserverService,
        acceptor: StreamAcceptor,
        *,
        upstream: UpstreamNameserver | None = None,
        max_links: int = DEFAULT_MAX_LINKS,
        spawner: Spawner | None = None,
    ) -> ChildLinkServer:
        """Build the server and start its accept loop on ``spawner`` (the asyncio loop by
        default)."""
        spawner = default_spawner(spawner)
        server = cls(service, acceptor, upstream=upstream, max_links=max_links, spawner=spawner)
        server._task = spawner.spawn(server._accept_loop)
        return server

    @property
    def active_links(self) -> int:
        """Links being served now."""
        return len(self._tasks)

    @property
    def accepted(self) -> int:
        """Streams accepted so far."""
        return self._accepted

    def allocate_link(self) -> LinkId:
        """The next link id (exposed for tests of the allocation rule)."""
        return self._allocator.allocate()

    async def _accept_loop(self) -> None:
        while True:
            try:
                peer, stream = await self._acceptor.accept()
            except Exception as exc:
                _log.debug("child link acceptor ended: %r", exc)
                return
            self._accepted += 1
            if len(self._tasks) >= self._max:
                _refuse(stream)
                continue
            link = self._allocator.allocate()
            slot: list[Task] = []
            spawner = self._spawner
            assert spawner is not None
            task = spawner.spawn(self._serve, link, peer, stream, slot)
            slot.append(task)
            if not task.done:
                self._tasks.add(task)

    async def _serve(self, link: LinkId, peer: Pid, stream: ByteStream, slot: list[Task]) -> None:
        try:
            await self._service.serve(link, peer, stream, self._upstream)
        finally:
            for task in slot:
                self._tasks.discard(task)

    async def shutdown(self) -> None:
        """Stop accepting, end every link (each is revoked) and wait (idempotent)."""
        tasks = list(self._tasks)
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        await join_shielded(tasks)


def _refuse(stream: ByteStream) -> None:
    with contextlib.suppress(Exception):  # nothing more to do with a refused stream
        stream.abort(_REFUSED_CODE)
