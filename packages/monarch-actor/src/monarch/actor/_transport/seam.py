"""The runtime seam between actor processes and whatever moves envelopes between them.

Why a seam: the actor runtime (mailboxes, ports, supervision) must not care whether two
processes are threads of one Python process, OS processes on one host, or hosts apart. A
``ProcessTransport`` is all it sees: a process identity (a Chrysalis PID), ``send(envelope,
buffers)`` to any (PID, actor path), and two callbacks it installs when it attaches, one for
envelopes that arrive and one for envelopes that could not be delivered. Both callbacks run on
the attached process's runtime loop.

``InProcessFabric`` is the implementation used now: every attached "process" lives in this
Python process and has its own PID and runtime loop (several may share one loop). Sending copies
the out-of-band buffers once into receiver-owned memory (the header and pickle stream are
immutable and are shared), then hands the envelope to the destination loop with a thread-safe,
FIFO call: messages from one thread to one destination arrive in send order. An unknown or
detached destination makes the envelope bounce to the sender's ``undeliverable`` callback.

The Chrysalis Node process layer provides the same interface over its streams
(``node.NodeProcessTransport``); the runtime does not change. A fabric can have an
*uplink*: a transport that takes every envelope whose destination is not a fabric member (the
client's fabric hands them to its Node transport, which in turn delivers inbound envelopes to
fabric members with ``deliver_inbound``). The uplink runs on the loop of the members it serves,
so ``deliver_inbound`` calls a member's ``deliver`` callback directly, in the same loop tick: a
reply to the client costs no extra hop through the loop's queue.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from chrysalis.core import Pid
from monarch.actor._base.codec import ReceivedBuffer, detach_buffers
from monarch.actor._base.envelope import Envelope, FrameLimits, check_size
from monarch.actor._base.loop import (
    RuntimeLoop,
    RuntimeLoopClosedError,
    RuntimeLoopOverloadedError,
)

__all__ = [
    "Attachable",
    "DeliverCallback",
    "InProcessFabric",
    "InProcessTransport",
    "ProcessTransport",
    "UndeliverableCallback",
]

_log = logging.getLogger("monarch.actor.transport")
DeliverCallback = Callable[[Envelope, list[ReceivedBuffer]], None]
UndeliverableCallback = Callable[[Envelope, str], None]


class ProcessTransport(Protocol):
    """What the actor runtime needs from the layer that connects processes.

    Contract:

    - ``pid`` identifies this process for the transport's lifetime.
    - ``send`` may be called from any thread; it never blocks on the network. Envelopes sent
      from one thread to one destination are delivered in order. ``buffers`` may alias the
      sender's memory only until ``send`` returns. Raises ``MessageTooLargeError`` for messages
      over the transport's bound. ``more=True`` is a hint that the caller sends again at once
      (an actor thread with more calls queued): a transport may then hold the envelope to write
      it with the ones that follow (never reordering them).
    - Delivered envelopes reach the ``deliver`` callback, and envelopes that cannot be delivered
      reach the ``undeliverable`` callback with a reason, both on this process's runtime loop.
    - ``close`` detaches the process; later envelopes addressed to it are undeliverable.
    """

    @property
    def pid(self) -> Pid: ...

    def send(
        self, envelope: Envelope, buffers: Sequence[memoryview], more: bool = False
    ) -> None: ...

    def close(self) -> None: ...


class Attachable(Protocol):
    """What ``ProcRuntime`` attaches to: a fabric, or a transport serving one process."""

    def attach(
        self,
        loop: RuntimeLoop,
        deliver: DeliverCallback,
        undeliverable: UndeliverableCallback,
        pid: Pid | None = None,
    ) -> ProcessTransport: ...


class InProcessFabric:
    """A simulated network of processes inside this Python process (see module docstring)."""

    def __init__(self, limits: FrameLimits | Callable[[], FrameLimits] | None = None) -> None:
        self._limits = limits or FrameLimits()
        self._members: dict[bytes, InProcessTransport] = {}
        self._lock = threading.Lock()
        self.uplink: ProcessTransport | None = None
        """Where envelopes for non-members go (``None``: they bounce)."""

    @property
    def limits(self) -> FrameLimits:
        """Bounds applied to every message (a callable given at construction is asked each
        time, so configuration changes apply at once)."""
        return self._limits if isinstance(self._limits, FrameLimits) else self._limits()

    def attach(
        self,
        loop: RuntimeLoop,
        deliver: DeliverCallback,
        undeliverable: UndeliverableCallback,
        pid: Pid | None = None,
    ) -> InProcessTransport:
        """Attach a new process with a fresh random PID (or ``pid``) and return its transport."""
        with self._lock:
            while pid is None or pid.raw in self._members:
                pid = Pid(os.urandom(16))
            transport = InProcessTransport(self, pid, loop, deliver, undeliverable)
            self._members[pid.raw] = transport
        return transport

    def _detach(self, transport: InProcessTransport) -> None:
        with self._lock:
            if self._members.get(transport.pid.raw) is transport:
                del self._members[transport.pid.raw]

    def _lookup(self, pid: bytes) -> InProcessTransport | None:
        return self._members.get(pid)

    def hosts(self, pid: bytes) -> bool:
        """True when ``pid`` is an attached, open member."""
        member = self._members.get(pid)
        return member is not None and not member._closed

    def deliver_inbound(self, envelope: Envelope, buffers: list[ReceivedBuffer]) -> None:
        """Hand an envelope that arrived from the uplink to its member (dropped, with a log
        line, when the member is gone).

        The fast path: called on the member's own loop thread (the client's uplink runs on the
        client runtime's loop), the member's ``deliver`` callback runs at once, in the uplink's
        tick, as it would had the process attached to the uplink directly; from any other thread
        the envelope is handed over with the loop's FIFO ``call_soon``. Per-sender order holds
        either way: the uplink delivers one sender's envelopes from one thread, in order.
        """
        member = self._members.get(envelope.target.pid)
        if member is None or member._closed:
            _log.debug("inbound envelope for a detached process dropped")
            return
        loop = member._loop
        if loop.in_loop_thread():
            member._deliver(envelope, buffers)
            return
        with contextlib.suppress(RuntimeLoopClosedError):
            loop.call_soon(member._deliver, envelope, buffers)

    def bounce_inbound(self, envelope: Envelope, reason: str) -> None:
        """An envelope a member sent through the uplink bounced: tell its sender."""
        member = self._members.get(envelope.sender.pid)
        if member is not None:
            member._bounce(envelope, reason)

    def __len__(self) -> int:
        return len(self._members)


class InProcessTransport:
    """One process's attachment to an ``InProcessFabric``."""

    def __init__(
        self,
        fabric: InProcessFabric,
        pid: Pid,
        loop: RuntimeLoop,
        deliver: DeliverCallback,
        undeliverable: UndeliverableCallback,
    ) -> None:
        self._fabric = fabric
        self._pid = pid
        self._loop = loop
        self._deliver = deliver
        self._undeliverable = undeliverable
        self._closed = False

    @property
    def pid(self) -> Pid:
        """This process's PID."""
        return self._pid

    @property
    def closed(self) -> bool:
        """True once detached."""
        return self._closed

    def send(self, envelope: Envelope, buffers: Sequence[memoryview], more: bool = False) -> None:
        """Copy the buffers once and hand the envelope to the destination's loop (or to the
        uplink, which checks the size against its own bound)."""
        destination = self._fabric._lookup(envelope.target.pid)
        uplink = self._fabric.uplink
        if destination is None and uplink is not None:
            uplink.send(envelope, buffers, more)
            return
        check_size(
            len(envelope.payload),
            sum(b.nbytes for b in buffers),
            len(buffers),
            self._fabric.limits,
        )
        if destination is None or destination._closed:
            self._bounce(envelope, "the destination process is not reachable (stopped or unknown)")
            return
        owned = detach_buffers(buffers, envelope.buffer_kinds)
        try:
            destination._loop.call_soon(destination._deliver, envelope, owned)
        except RuntimeLoopOverloadedError:
            raise  # to the sender: its loop would refuse the bounce as well
        except RuntimeLoopClosedError:
            self._bounce(envelope, "the destination process has shut down")

    def send_each(self, envelopes: Sequence[Envelope], buffers: Sequence[memoryview]) -> None:
        """``send`` of each envelope in order; through the uplink's ``send_each`` (frames
        encoded first, then written back to back) when none is for a member."""
        fabric = self._fabric
        uplink = fabric.uplink
        send_each = getattr(uplink, "send_each", None)
        if send_each is not None:
            lookup = fabric._lookup
            for envelope in envelopes:  # (a loop, not ``any`` of a generator: every broadcast)
                if lookup(envelope.target.pid) is not None:
                    break
            else:
                send_each(envelopes, buffers)
                return
        for envelope in envelopes:
            self.send(envelope, buffers)

    def _bounce(self, envelope: Envelope, reason: str) -> None:
        # If the sender's own loop is gone, nobody is left to tell.
        with contextlib.suppress(RuntimeLoopClosedError):
            self._loop.call_soon(self._undeliverable, envelope, reason)

    def close(self) -> None:
        """Detach from the fabric (idempotent)."""
        self._closed = True
        self._fabric._detach(self)
