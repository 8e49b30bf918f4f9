"""``DatagramSocketSet``: several carriers behind one socket (spec 2.8).

Why: a task head talks UDP upstream and Unix datagrams to its local leaves, yet the transport
above wants one socket. The set holds at most one member per address scheme, sends through the
member whose scheme matches the destination, and fans receives in from all members.

Fairness: receives poll the members round-robin from a rotating start index; after a member
delivers, the next call starts at the member after it, so a busy member cannot starve the
others.

Readiness: members may mix kernel descriptors (UDP, Unix) and wakers (in-process). The set has
no descriptor of its own (``fileno()`` is ``None`` unless it has exactly one member); instead
``readiness_fds()`` lists every member descriptor and ``add_recv_waker`` registers one
one-shot waker on every member, so an adapter waits for "any descriptor readable or the waker
called". This needs no extra kernel object and no thread. Sends wait on the chosen member only
(``send_readiness_fd`` / ``add_send_waker`` delegate by scheme).

Ownership: the set owns its members. ``shutdown`` cascades to all of them, ``join`` waits for
all, and a member that shuts down by itself (a UDP receive error) shuts the whole set down. The
set notices that on every path: a receive or a send that meets the member's
:class:`SocketClosedError`, and ``is_shutdown``, which checks the members.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from chrysalis.core import DatagramAddr
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    SocketClosedError,
    UnsupportedSchemeError,
    Waker,
    once,
)

__all__ = ["MAX_SET_MEMBERS", "DatagramSocketSet"]

#: Most members a set may hold (one per scheme).
MAX_SET_MEMBERS = 16


class DatagramSocketSet(DatagramSocket):
    """One socket over ``primary`` and ``alternatives``, at most one per scheme.

    Raises ``ValueError`` if two members share a scheme (or the same socket is given twice)
    and ``TypeError`` for a non-socket. Advertises the primary's address. Sends to a scheme no
    member serves raise :class:`UnsupportedSchemeError` naming the available schemes.
    ``max_transmit_segments`` is the primary's, ``max_receive_segments`` the members'
    maximum, ``may_fragment`` true if any member may fragment.
    """

    def __init__(self, primary: DatagramSocket, *alternatives: DatagramSocket) -> None:
        members = (primary, *alternatives)
        if len(members) > MAX_SET_MEMBERS:
            raise ValueError(f"a socket set holds at most {MAX_SET_MEMBERS} members")
        by_scheme: dict[str, DatagramSocket] = {}
        for member in members:
            if not isinstance(member, DatagramSocket):
                raise TypeError(f"set members must be DatagramSocket, not {type(member).__name__}")
            scheme = member.local_addr.scheme
            if scheme in by_scheme:
                raise ValueError(f"duplicate scheme {scheme!r} in socket set")
            by_scheme[scheme] = member
        self._members = members
        self._by_scheme = by_scheme
        self._schemes = tuple(sorted(by_scheme))
        self._next = 0
        self._closed = False
        self._lock = threading.Lock()
        self._deferred_error: OSError | None = None

    @property
    def members(self) -> tuple[DatagramSocket, ...]:
        """The members, primary first."""
        return self._members

    @property
    def schemes(self) -> tuple[str, ...]:
        """The schemes this set can send to, sorted."""
        return self._schemes

    @property
    def local_addr(self) -> DatagramAddr:
        """The primary's address."""
        return self._members[0].local_addr

    def member_for(self, destination: DatagramAddr) -> DatagramSocket:
        """The member that sends to ``destination``; :class:`UnsupportedSchemeError` if none."""
        member = self._by_scheme.get(destination.scheme)
        if member is None:
            raise UnsupportedSchemeError.for_scheme(destination.scheme, self._schemes)
        return member

    # -- sending -------------------------------------------------------------------------------

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        """Send through the member serving ``destination.scheme``; a member that shut itself
        down shuts the set down (:class:`SocketClosedError`)."""
        if self._closed:
            raise SocketClosedError()
        member = self.member_for(destination)
        try:
            return member.try_send_to(data, destination)
        except SocketClosedError as closed:
            raise self._member_closed() from closed

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Delegate to the member serving the destination's scheme (its accepted prefix)."""
        if self._closed:
            raise SocketClosedError()
        member = self.member_for(transmit.destination)
        try:
            return member.try_send_transmit(transmit)
        except SocketClosedError as closed:
            raise self._member_closed() from closed

    # -- receiving -----------------------------------------------------------------------------

    def _member_closed(self) -> SocketClosedError:
        self.shutdown()
        return SocketClosedError()

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Fill buffers from the members in round-robin order (at most 32 in total)."""
        if self._closed:
            raise SocketClosedError()
        error = self._deferred_error
        if error is not None:
            self._deferred_error = None
            raise error
        members = self._members
        count = len(members)
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        start = self._next
        filled = 0
        for step in range(count):
            if filled >= limit:
                break
            index = (start + step) % count
            member = members[index]
            window = buffers if filled == 0 and limit == len(buffers) else buffers[filled:limit]
            try:
                got = member.try_recv(window, metas)
            except SocketClosedError as closed:
                if filled == 0:
                    raise self._member_closed() from closed
                self._deferred_error = self._member_closed()
                return filled
            except OSError as failure:
                self._next = (index + 1) % count
                if filled == 0:
                    raise
                self._deferred_error = failure
                return filled
            if got:
                filled += got
                self._next = (index + 1) % count
        return filled

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """One datagram from the next member (round-robin) that has one."""
        if self._closed:
            raise SocketClosedError()
        error = self._deferred_error
        if error is not None:
            self._deferred_error = None
            raise error
        members = self._members
        count = len(members)
        start = self._next
        for step in range(count):
            index = (start + step) % count
            try:
                got = members[index].try_recv_from()
            except SocketClosedError as closed:
                raise self._member_closed() from closed
            except OSError:
                self._next = (index + 1) % count
                raise
            if got is not None:
                self._next = (index + 1) % count
                return got
        return None

    # -- readiness -----------------------------------------------------------------------------

    def fileno(self) -> int | None:
        """The only member's descriptor, or ``None`` when there are several members (use
        ``readiness_fds`` and the wakers)."""
        if self._closed:
            raise SocketClosedError()
        if len(self._members) == 1:
            return self._members[0].fileno()
        return None

    def readiness_fds(self) -> list[int]:
        """The receive descriptors of all members."""
        if self._closed:
            raise SocketClosedError()
        return [fd for member in self._members for fd in member.readiness_fds()]

    def send_readiness_fd(self, destination: DatagramAddr) -> int | None:
        """The serving member's send descriptor (``None`` for an unknown scheme)."""
        if self._closed:
            raise SocketClosedError()
        member = self._by_scheme.get(destination.scheme)
        return None if member is None else member.send_readiness_fd(destination)

    def add_recv_waker(self, waker: Waker) -> None:
        """Register one one-shot waker on every member (whichever fires first wins)."""
        waker = once(waker)
        if self._closed:
            waker()
            return
        for member in self._members:
            member.add_recv_waker(waker)

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        """Delegate to the serving member; called at once for an unknown scheme."""
        member = self._by_scheme.get(destination.scheme)
        if member is None or self._closed:
            waker()
            return
        member.add_send_waker(destination, waker)

    # -- limits --------------------------------------------------------------------------------

    @property
    def max_transmit_segments(self) -> int:
        """The primary's."""
        return self._members[0].max_transmit_segments

    @property
    def max_receive_segments(self) -> int:
        """The largest of the members'."""
        return max(member.max_receive_segments for member in self._members)

    @property
    def may_fragment(self) -> bool:
        """Whether any member may fragment."""
        return any(member.may_fragment for member in self._members)

    # -- lifecycle -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Shut the set and every member down (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for member in self._members:
            member.shutdown()

    @property
    def is_shutdown(self) -> bool:
        """Whether the set was shut down, by ``shutdown`` or because a member shut itself down
        (noticing that shuts the other members down too)."""
        if self._closed:
            return True
        if any(member.is_shutdown for member in self._members):
            self.shutdown()
            return True
        return False

    def join(self, timeout: float | None = None) -> bool:
        """Join every member within one overall ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        done = True
        for member in self._members:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            done = member.join(remaining) and done
        return done

    def __repr__(self) -> str:
        inner = ", ".join(repr(member) for member in self._members)
        return f"DatagramSocketSet({inner})"
