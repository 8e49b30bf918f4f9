"""The runtime of one process: routing, ports, tombstones, stops, flushes and liveness.

Theory of operation
-------------------
A *process* is a ``ProcRuntime``: a transport attachment (its PID), a ``RuntimeLoop`` that
receives envelopes, the actors living in it (``_runtime.cell``, by path), and the ports opened
in it (``_runtime.sinks``, by index). The client script's OS process has one
(``_runtime.client``), with the *root client* pseudo-actor at path ``"root"``; in-process
simulated processes (``_local_proc_mesh``) are more of them on the same fabric.

Threads:

- The runtime loop thread routes every inbound envelope (``_on_envelope``): calls, stops and
  supervision events go into the target actor's mailbox; port messages complete futures or fill
  port receivers. It never runs user code and never blocks.
- Each actor has its own thread (``_runtime.cell``).
- Senders (user threads, actor threads) encode values and call the transport themselves; the
  transport hands envelopes to the destination loop in FIFO order, which is what preserves
  per-sender, per-receiver order.

A retired actor leaves a *tombstone* (bounded, oldest dropped) so later messages to it fail fast
with the original failure, which is how slices containing a failed rank keep failing. Calls
that overtake their actor's spawn are *parked* (bounded by ``MAX_PARKED_CALLS``, for
``PARK_TIMEOUT`` seconds) until it lands.

Stops are bounded: an actor that has not stopped ``stop_actor_timeout`` after a stop reached it
(stuck in user code) is *fenced* (``ProcRuntime._fence``): retired as stopped, the call it is
stuck in answered, and whatever its thread sends afterwards refused.

Settling (``_hosts.settle.flush_supervision``, test support): a process's agent answers a
flush request once every actor took a marker queued behind its pending supervision events; each
process counts the supervision envelopes it sent and received per peer, so the client can tell
that none is still in flight between two workers.

Liveness (``_runtime.liveness``, driven by ``_runtime.watchdog``): the client pings each worker
process (``HEARTBEAT_ENDPOINT``, answered here on the runtime loop); every heartbeat renews this
process's ``lease`` for the timeout it carries. Once the lease ran out the client may have declared
this process dead: ``post`` sends nothing more and ``on_fenced`` (the worker's exit) is called.

Telemetry (``_runtime.telemetry.report``): the agent endpoint ``__telemetry__`` answers a pull
of this process's spans, metrics and lifecycle records on the runtime loop; on ``STOP_PROC``
the process pushes its finished spans to the stopper's agent (``__spans__``) right before the
acknowledgement, on the same path, so a stopped process's spans are with its stopper once the
stop returned. A worker also streams its finished spans to the client as they are packed
(``stream_spans_to``), so a worker killed without a stop loses at most its last interval.
These system endpoints, like heartbeats, are sent with ``send_system`` and are not counted in
the message metrics.

Every queue is bounded by ``monarch.config`` settings: actor mailboxes
(``actor_mailbox_capacity`` messages and ``actor_mailbox_max_bytes`` bytes; an overflowing call
is rejected with a ``SupervisionError``), port
receivers (``port_queue_capacity``), open ports (``max_open_ports``), actors per process
(``max_actors_per_proc``), tombstones (``MAX_TOMBSTONES``) and the fault-hook queue
(``_runtime.cell.MAX_PENDING_FAULTS``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import msgspec

from chrysalis.core import Pid
from monarch.actor._base import codec as _codec
from monarch.actor._base.envelope import (
    ActorAddr,
    CastInfo,
    Envelope,
    MessageKind,
    PortAddr,
)
from monarch.actor._base.errors import (
    ErrorCategory,
    FailureEvent,
    PortOverflowError,
    SupervisionError,
)
from monarch.actor._base.ids import ProcId
from monarch.actor._base.loop import RuntimeLoop, RuntimeLoopClosedError
from monarch.actor._base.shape import Extent, Point
from monarch.actor._runtime import logging as _logging
from monarch.actor._runtime import telemetry as _telemetry
from monarch.actor._runtime.cell import (
    _FAILED,
    _NONE_PAYLOAD,
    _RUNNING,
    _STARTING,
    _STOPPED,
    ActorCell,
    CellBase,
    RootCell,
    _actor_text,
    _AgentCell,
    _Bounce,
    _BounceItem,
    _CallItem,
    _FlushItem,
    _InitItem,
    _Item,
    _StopItem,
    _SuperviseItem,
)
from monarch.actor._runtime.context import Context, _reset_context, _set_context
from monarch.actor._runtime.liveness import Lease
from monarch.actor._runtime.sinks import OneSink, PortSink, Reply, _encode_exception
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import report as _report
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._transport.seam import Attachable
from monarch.config import _registry as _config

__all__ = [
    "FLUSH_ENDPOINT",
    "HEARTBEAT_ENDPOINT",
    "MAX_TOMBSTONES",
    "FlushReport",
    "Heartbeat",
    "ProcDeath",
    "ProcRuntime",
]

_log = logging.getLogger("monarch.actor.runtime")

#: Retired actors remembered per process (for fail-fast replies); the oldest are forgotten.
MAX_TOMBSTONES = 4096
#: Calls held for an actor whose spawn has not reached this process yet (per process), and
#: how long (seconds) one is held before it is rejected as addressed to no actor.
MAX_PARKED_CALLS = 1024
PARK_TIMEOUT = 3.0
_EMPTY = _codec.Payload(b"")
#: The agent endpoint (path ``""``) that answers a ``flush_supervision`` round.
FLUSH_ENDPOINT = "__flush_supervision__"
#: The agent endpoint that answers the client's heartbeats (``liveness``, ``watchdog``).
HEARTBEAT_ENDPOINT = "__heartbeat__"
_SUPERVISION_TRAFFIC = frozenset({MessageKind.SUPERVISION, MessageKind.UNDELIVERABLE})
# Module constants for the per-message checks: an enum member read off its class costs an
# attribute lookup through the enum's metaclass (about 70 ns on CPython 3.11) on every message.
_PORT_VALUE = MessageKind.PORT_VALUE
_REPLY_KINDS = frozenset({MessageKind.PORT_VALUE, MessageKind.PORT_ERROR})
_CALL = MessageKind.CALL
_TELEMETRY_ENDPOINTS = (_report.TELEMETRY_ENDPOINT, _report.SPANS_ENDPOINT)
#: System endpoints left out of the message metrics (their answers carry the same name).
_UNCOUNTED = frozenset((HEARTBEAT_ENDPOINT, *_TELEMETRY_ENDPOINTS))
# The metric hooks of every envelope, recorded inline while metrics are on and no hook must be
# called (``_metrics.HOOKS``: the OpenTelemetry mirror, a profiler): what the hook would do,
# one append to its raw log (folded as the hook's entries are: ``_metrics._fold``) or one tick
# of its counter.
_sent_counters = _metrics.sent_counters
_received_counters = _metrics.received_counters
_depth_counters = _metrics.depth_counters
_call_depth_counters = _metrics.call_depth_counters
_SMALL_DEPTHS = _metrics.SMALL_DEPTHS
_call_logs = _metrics._call_logs
_perf_counter = time.perf_counter
_FOLD_AT = _metrics.FOLD_AT
#: The metric switches the per-envelope sites test, copied from ``_metrics`` by its switch
#: listener (one ``LOAD_GLOBAL`` a test, and one test where ``METRICS`` then ``HOOKS`` were two):
#: ``_INLINE``, metrics on and recorded here; ``_HOOKED``, metrics on through the hooks.
_INLINE = False
_HOOKED = False


def _metrics_switched() -> None:
    global _INLINE, _HOOKED
    _INLINE = _metrics.METRICS and not _metrics.HOOKS
    _HOOKED = _metrics.METRICS and _metrics.HOOKS


_metrics.add_switch_listener(_metrics_switched)


def _count_received(env: Envelope) -> None:
    """``on_received`` for the runtime (metrics on, ``_INLINE``), where ``_route`` does not
    count a received envelope with something else."""
    if env.endpoint not in _UNCOUNTED:
        next(_received_counters[env.kind])


def _count_enqueued(env: Envelope, depth: int, received: bool) -> None:
    """``on_enqueued(depth)`` for the runtime (metrics on, ``_INLINE``), and ``env``'s receipt
    if it was ``received``, where they are not one tick (``_route``)."""
    if depth < _SMALL_DEPTHS:
        next(_depth_counters[depth])
    else:
        _metrics.on_enqueued(depth)
    if received:
        _count_received(env)


class ProcRuntime:
    """The runtime of one (possibly simulated) process. See the module docstring."""

    def __init__(
        self, fabric: Attachable, loop: RuntimeLoop, label: str, pid: Pid | None = None
    ) -> None:
        self.loop = loop
        self.label = label
        _logging.install(label)
        self.transport = fabric.attach(loop, self._on_envelope, self._on_undeliverable, pid)
        self.pid_raw = self.transport.pid.raw
        self.proc_id = ProcId(self.transport.pid, label)
        self.cells: dict[str, ActorCell] = {}
        self.tombstones: collections.OrderedDict[str, tuple[FailureEvent, str]] = (
            collections.OrderedDict()
        )
        # Calls that overtook their actor's spawn (a mesh handed on by its owner reaches a
        # third process before the owner's SPAWN reaches the target): held, in order, until
        # the spawn lands or PARK_TIMEOUT passes. Bounded by MAX_PARKED_CALLS.
        self._parked: dict[str, list[tuple[Envelope, list[_codec.ReceivedBuffer]]]] = {}
        self._parked_count = 0
        self.root: RootCell | None = None
        self.agent = _AgentCell(self, "", f"<proc {label}>", "")
        self.stopped = False
        self._ports: dict[int, PortSink] = {}
        self._port_lock = threading.Lock()
        self._next_port = itertools.count(1)
        self._dead: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        # Supervision traffic (SUPERVISION and UNDELIVERABLE envelopes: what can turn into a
        # fault) counted per peer PID, for ``flush_supervision``'s check that nothing is in
        # flight between two processes. ``_sent`` is net of bounces. Bounded (oldest dropped).
        self._traffic_lock = threading.Lock()
        self._sent: dict[bytes, int] = {}
        self._received: dict[bytes, int] = {}
        # Liveness: renewed by the client's heartbeats; once expired, this process is fenced.
        self.lease = Lease()
        self._lease_timer: asyncio.TimerHandle | None = None
        self.fenced: str | None = None
        """Why this process was fenced (``None``: it was not)."""
        self.on_fenced: Callable[[str], None] | None = None
        """Called once when the lease runs out (a worker exits); without it, sends are dropped."""
        self._span_target: bytes | None = None

    # -- supervision traffic and flushes -------------------------------------------------------
    def _count(self, table: dict[bytes, int], pid: bytes, delta: int) -> None:
        with self._traffic_lock:
            table[pid] = table.pop(pid, 0) + delta  # re-inserted: the most recent stay
            if len(table) > MAX_TOMBSTONES:
                del table[next(iter(table))]

    def _snapshot(self, table: dict[bytes, int]) -> dict[str, int]:
        with self._traffic_lock:
            return {pid.hex(): n for pid, n in table.items()}

    def _flush_request(self, env: Envelope) -> None:
        """A ``flush_supervision`` round reached this process (runtime loop thread), behind
        everything that reached it before, death notices included (their supervision events
        are in the owners' mailboxes by now). A marker goes into every actor's mailbox; once
        each actor handled its marker (so the supervision events queued before it, and sent
        what handling them sent) or retired, the last one to finish replies with a
        ``FlushReport``. The reply leaves after those sends (a happens-before edge through the
        countdown's lock), so on the same path to the client it arrives after them.

        What it reports as received is counted *now*, when everything received is queued
        ahead of the markers (so handled before the reply); what it reports as sent is
        counted at the reply, so it includes what handling sent (an event received after
        the markers may be counted as sent and not yet as received: the next round sees it).
        """
        received = self._snapshot(self._received)
        cells = list(self.cells.values())
        remaining = [len(cells) + 1]
        lock = threading.Lock()

        def one_done() -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last and env.reply_port is not None:
                report = FlushReport(self._snapshot(self._sent), received)
                payload = _codec.Payload(msgspec.msgpack.encode(report))
                with contextlib.suppress(Exception):  # the client is gone: nobody waits
                    self.post(
                        self.agent,
                        MessageKind.PORT_VALUE,
                        env.reply_port.actor,
                        port=env.reply_port.index,
                        payload=payload,
                    )

        for cell in cells:
            if not cell.enqueue(_FlushItem(one_done), force=True):
                one_done()  # its mailbox is closed: it retired, its sends are done
        one_done()

    # -- telemetry (``_runtime.telemetry.report``) ---------------------------------------------
    def _telemetry_request(self, env: Envelope) -> None:
        """A pull of this process's spans and metrics, or spans a stopping child pushed
        (runtime loop thread)."""
        try:
            if env.endpoint == _report.SPANS_ENDPOINT:
                # Checked when a trace is made (``span_records``): decoding every batch as it
                # comes would cost this loop what the stream saves the workers.
                _tracing.add_remote_batch(env.payload, self._peer_label(env))
                return
            request = msgspec.msgpack.decode(env.payload, type=_report.TelemetryRequest)
            actors = [cell.status() for cell in list(self.cells.values())] if request.actors else []
            data = _report.encode(_report.local_report(self.label, request, actors))
        except (msgspec.DecodeError, msgspec.ValidationError):
            _log.warning("malformed %s message from %s dropped", env.endpoint, env.sender.pid.hex())
            return
        if env.reply_port is not None:
            reply = env.reply_port
            with contextlib.suppress(Exception):  # the asker is gone
                self.send_system(
                    MessageKind.PORT_VALUE,
                    reply.actor,
                    env.endpoint,
                    reply.index,
                    None,
                    env.cast,
                    data,
                )

    @staticmethod
    def _peer_label(env: Envelope) -> str:
        return f"process {env.sender.pid.hex()[:8]}"

    def stream_spans_to(self, pid: bytes) -> None:
        """Stream this OS process's finished spans to process ``pid``'s agent (a worker, to the
        client that started it): the span shipper packs them every ``SHIP_INTERVAL`` seconds
        or ``SHIP_AT`` spans (``_runtime.telemetry.tracing``), and this runtime's loop sends
        each batch (``__spans__``), so a worker killed without a stop loses at most its
        last interval. One runtime per OS process may stream (the worker's)."""
        self._span_target = pid
        _tracing.set_stream(self._spans_ready)

    def _spans_ready(self) -> None:
        """Packed spans wait (the shipper thread): send them from the runtime loop."""
        with contextlib.suppress(RuntimeLoopClosedError):  # stopping: the stop pushes them
            self.loop.call_soon(self._send_spans)

    def _send_spans(self) -> None:
        target = self._span_target
        if target is None:
            return
        for data in _tracing.take_unsent():
            try:
                self.send_system(
                    MessageKind.CALL, ActorAddr(target, ""), _report.SPANS_ENDPOINT, payload=data
                )
            except Exception as exc:  # the client is gone: nobody collects them
                _log.debug("could not stream %d bytes of spans: %r", len(data), exc)

    def _push_spans(self, to: bytes) -> None:
        """Before acknowledging a stop: send this process's finished spans not yet streamed
        (what is pending, packed now) to the stopper's process ``to`` (the same path as the
        acknowledgement, so they arrive first). Only a streaming process (a worker) pushes:
        processes simulated in the client's OS process share its store."""
        if to == self.pid_raw or self._span_target is None:
            return
        for data in _tracing.take_unsent(flush=True):
            with contextlib.suppress(Exception):  # the stopper is gone: nobody collects them
                self.send_system(
                    MessageKind.CALL, ActorAddr(to, ""), _report.SPANS_ENDPOINT, payload=data
                )

    # -- sending ------------------------------------------------------------------------------
    def post(
        self,
        sender: CellBase,
        kind: MessageKind,
        target: ActorAddr,
        *,
        port: int = -1,
        endpoint: str = "",
        reply_port: PortAddr | None = None,
        cast: CastInfo | None = None,
        payload: _codec.Payload = _EMPTY,
        flags: int = 0,
        more: bool = False,
        trace: bytes | None = None,
    ) -> None:
        """Send one envelope from ``sender`` (any thread; FIFO per thread and destination).
        Nothing leaves a fenced process (its lease ran out), nor a fenced actor. ``more``: the
        sender posts again at once (the transport may write this envelope with the next).
        ``trace``: the envelope's trace context (a send span's: ``_tracing.send_call_traced``),
        else the current span's for a CALL while tracing is on."""
        envelope = self._envelope(
            sender, kind, target, port, endpoint, reply_port, cast, payload, flags, trace
        )
        if envelope is None:
            return
        if more:
            self.transport.send(envelope, payload.buffers, True)
        else:
            self.transport.send(envelope, payload.buffers)
        if kind in _SUPERVISION_TRAFFIC:
            self._count(self._sent, target.pid, 1)

    def post_calls(
        self,
        sender: CellBase,
        targets: Sequence[tuple[ActorAddr, CastInfo]],
        *,
        endpoint: str,
        reply_port: PortAddr | None,
        payload: _codec.Payload,
        flags: int = 0,
        trace: bytes | None = None,
    ) -> None:
        """``post`` of one CALL to each of ``targets`` (a mesh's ranks), in order: the
        envelopes are made first, then handed to the transport together (``send_each``: the
        frames encoded, then written back to back). One target (``call_one``, ``choose``):
        the plain ``post`` (no list, no lookup: a pipelining client's path)."""
        if len(targets) == 1:
            target, cast = targets[0]
            envelope = self._envelope(
                sender, _CALL, target, -1, endpoint, reply_port, cast, payload, flags, trace
            )
            if envelope is not None:
                self.transport.send(envelope, payload.buffers)
            return
        envelopes = []
        for target, cast in targets:
            envelope = self._envelope(
                sender, _CALL, target, -1, endpoint, reply_port, cast, payload, flags, trace
            )
            if envelope is None:
                break  # fenced meanwhile: the ones made before it still go, as ``post`` sent them
            envelopes.append(envelope)
        send_each = getattr(self.transport, "send_each", None)
        if send_each is not None and len(envelopes) > 1:
            send_each(envelopes, payload.buffers)
            return
        for envelope in envelopes:
            self.transport.send(envelope, payload.buffers)

    def _envelope(
        self,
        sender: CellBase,
        kind: MessageKind,
        target: ActorAddr,
        port: int,
        endpoint: str,
        reply_port: PortAddr | None,
        cast: CastInfo | None,
        payload: _codec.Payload,
        flags: int,
        trace: bytes | None,
    ) -> Envelope | None:
        """The envelope ``post`` sends (counted as sent), or ``None`` when this process was
        just fenced (nothing leaves it); ``RuntimeError`` for a fenced sender."""
        if sender.fenced:
            raise RuntimeError(
                f"{sender.display} was stopped (it did not stop within the stop timeout); it "
                "can no longer send"
            )
        lease = self.lease
        if lease.armed and lease.expired(time.monotonic()):
            self._fence_process("no heartbeat from the client within its timeout")
            return None
        data = payload.data
        sizes = tuple([b.nbytes for b in payload.buffers]) if payload.buffers else ()
        envelope = Envelope(
            kind,
            sender.addr,
            target,
            port,
            endpoint,
            sender.next_sequence(),
            reply_port,
            cast,
            data,
            sizes,
            payload.kinds,
            flags,
            trace
            if trace is not None
            else (_telemetry.outgoing_trace(kind) if _telemetry.TRACING and kind == _CALL else b""),
        )
        if _INLINE:  # ``on_sent`` inlined: its kind and size counted (or logged: ``__missing__``)
            next(_sent_counters[kind][len(data) + sum(sizes) if sizes else len(data)])
        elif _HOOKED:
            _telemetry.on_sent(envelope)
        return envelope

    def reply_error(
        self, sender: CellBase, reply_port: PortAddr, cast: CastInfo | None, exc: BaseException
    ) -> None:
        """Send ``exc`` to ``reply_port`` (falling back to a stand-in if it cannot be pickled)."""
        payload = _encode_exception(exc)
        try:
            self.post(
                sender,
                MessageKind.PORT_ERROR,
                reply_port.actor,
                port=reply_port.index,
                cast=cast,
                payload=payload,
            )
        except Exception:
            _log.exception("could not send an error reply to %r", reply_port)

    # -- ports ----------------------------------------------------------------------------------
    def open_port(self, owner: CellBase, sink: PortSink, endpoint: str = "") -> PortAddr:
        """Register ``sink`` under a new port index owned by ``owner`` (any thread); it
        collects the replies of calls to ``endpoint``, if given: the calls' latency is then
        timed, by endpoint (a port opened without one, for the runtime's own requests such as
        a metrics snapshot, or a user's channel, is not a call and is not timed)."""
        limit = int(_config.get("max_open_ports"))
        with self._port_lock:
            if len(self._ports) >= limit:
                raise PortOverflowError(f"this process already has {limit} open ports")
            index = next(self._next_port)
            self._ports[index] = sink
        if _INLINE and endpoint:  # the call latency's start (``call_opened`` inlined)
            try:
                log = _call_logs[endpoint]
            except KeyError:
                log = _metrics._log_of(_call_logs, endpoint)
            sink.opened = (_perf_counter(), log, endpoint)
        elif _HOOKED and endpoint:
            sink.opened = _metrics.call_opened(endpoint)
        if type(sink) is not OneSink:  # a OneSink's port leaves the table in ``_deliver_port``
            sink.closer = partial(self.close_port, index)
        return PortAddr(self.pid_raw, owner.path, index)

    def close_port(self, index: int) -> None:
        """Forget port ``index`` (idempotent)."""
        with self._port_lock:
            self._ports.pop(index, None)

    @property
    def open_ports(self) -> int:
        """Number of open ports (for tests and statistics)."""
        return len(self._ports)

    def _deliver_port(self, index: int, reply: Reply) -> None:
        with self._port_lock:
            sink = self._ports.get(index)
            if type(sink) is OneSink:
                # One reply completes it: the port is closed in this same locked lookup
                # (before the caller can see the result, as ``closer`` does for the others).
                del self._ports[index]
        if sink is None:
            _log.debug("dropping a message for closed port %d", index)
            return
        if type(sink) is OneSink:
            sink.cell.set_result(reply)
            opened = sink.opened
            if opened is not None:  # opened while metrics were on: timed if they still are
                if _INLINE:  # ``call_completed`` inlined
                    log = opened[1]
                    log.append(_perf_counter() - opened[0])
                    if len(log) >= _FOLD_AT:
                        _metrics._fold()
                elif _HOOKED:
                    _metrics.call_completed(opened)
            return
        if sink.deliver(reply):
            if index in self._ports:  # most sinks closed their port already (``closer``)
                self.close_port(index)
            if sink.opened is not None and _telemetry.METRICS:
                _metrics.call_completed(sink.opened)

    # -- inbound (runtime loop thread) ---------------------------------------------------------
    def _on_envelope(self, env: Envelope, buffers: list[_codec.ReceivedBuffer]) -> None:
        # Metrics inline (``_INLINE``): ``on_received`` is done by ``_route`` where it routes
        # (a call's receipt and its mailbox depth are one tick there).
        if _HOOKED and env.endpoint not in _UNCOUNTED:
            _telemetry.on_received(env)
        if env.kind in _SUPERVISION_TRAFFIC:
            self._count(self._received, env.sender.pid, 1)
        try:
            self._route(env, buffers, True)
        except Exception:
            _log.exception("failed to route %s envelope", env.kind.name)

    def _route(
        self, env: Envelope, buffers: list[_codec.ReceivedBuffer], received: bool = False
    ) -> None:
        """Deliver ``env``; ``received``: it just arrived (``_on_envelope``), not a parked call
        routed again or an envelope made here, so metrics count it as received (inline)."""
        kind = env.kind
        if kind in _REPLY_KINDS:
            if _INLINE and received and env.endpoint not in _UNCOUNTED:  # ``on_received`` inlined
                next(_received_counters[kind])
            cast = env.cast
            reply = Reply(
                kind == _PORT_VALUE,
                env.payload,
                buffers,
                env.buffer_kinds,
                cast.rank if cast is not None else 0,
            )
            self._deliver_port(env.port, reply)
            return
        path = env.target.path
        cell: ActorCell | None
        if (
            kind == MessageKind.SPAWN
            or kind == MessageKind.STOP_PROC
            or (path == "root" and self.root is not None)
        ):
            cell = None  # the process's own and the root client's envelopes, routed below
        else:
            cell = self.cells.get(path)
        if cell is None:
            # Every envelope not for a live actor is counted here, once (a parked call is not
            # counted again when routed); a call to a live actor with its mailbox depth, one
            # tick, and any other envelope to one before its payload is decoded (below). (The
            # same tests on the way to a live actor as one count per route took.)
            if _INLINE and received:
                _count_received(env)
            if kind == MessageKind.SPAWN:
                self._spawn(env, buffers)
                return
            if kind == MessageKind.STOP_PROC:
                self._stop_proc(env)
                return
            if path == "root" and self.root is not None:
                self._to_root(env)
                return
            if not path and kind == MessageKind.SUPERVISION:  # a process-death notice
                notice = msgspec.msgpack.decode(env.payload, type=ProcDeath)
                self.proc_died(notice.pid, notice.reason, fenced=notice.fenced)
                return
            if not path and kind == MessageKind.CALL and env.endpoint == FLUSH_ENDPOINT:
                self._flush_request(env)
                return
            if not path and kind == MessageKind.CALL and env.endpoint == HEARTBEAT_ENDPOINT:
                self._heartbeat(env)
                return
            if not path and kind == MessageKind.CALL and env.endpoint in _TELEMETRY_ENDPOINTS:
                self._telemetry_request(env)
                return
            if self._park(env, buffers):
                return
            self._reject(env, self._missing_event(env))
            return
        item: _Item
        if kind == _CALL:
            item = _CallItem(env, buffers)
            if _INLINE:  # ``on_received`` and ``on_enqueued`` inlined: one tick for both
                depth = len(cell.mailbox._items)
                if depth < _SMALL_DEPTHS and received:
                    next(_call_depth_counters[depth])
                else:  # (a deep mailbox not by ``IndexError``: each enqueue would raise)
                    _count_enqueued(env, depth, received)
            elif _HOOKED:
                _telemetry.on_enqueued(len(cell.mailbox._items))
        else:
            if _INLINE and received:  # before its payload is decoded: a malformed one too
                _count_received(env)
            if kind == MessageKind.STOP:
                item = _StopItem("stopped by its owner", env)
                self.loop.loop.call_later(
                    float(_config.get("stop_actor_timeout")),
                    self._fence,
                    cell,
                    "stopped by its owner",
                )
            elif kind == MessageKind.SUPERVISION:
                item = _SuperviseItem(msgspec.msgpack.decode(env.payload, type=FailureEvent))
                _telemetry.record_supervision("supervision_received", item.event, self.label)
            else:  # UNDELIVERABLE
                item = _BounceItem(msgspec.msgpack.decode(env.payload, type=_Bounce))
            if _INLINE:
                _count_enqueued(env, len(cell.mailbox._items), False)
            elif _HOOKED:
                _telemetry.on_enqueued(len(cell.mailbox._items))
        if not cell.enqueue(item, force=kind != _CALL):
            event = FailureEvent(
                category=str(ErrorCategory.SYSTEM),
                kind="undeliverable",
                actor=cell.display,
                mesh_name=path,
                rank=cell.rank,
                reason=cell.mailbox.full_reason(),
            )
            self._reject(env, (event, cell.user_name))

    def _to_root(self, env: Envelope) -> None:
        assert self.root is not None
        if env.kind == MessageKind.SUPERVISION:
            self.root.on_fault(msgspec.msgpack.decode(env.payload, type=FailureEvent))
        elif env.kind == MessageKind.UNDELIVERABLE:
            bounce = msgspec.msgpack.decode(env.payload, type=_Bounce)
            self.root.on_fault(
                FailureEvent(
                    category=str(ErrorCategory.SYSTEM),
                    kind="undeliverable",
                    actor=_actor_text(bounce.target),
                    mesh_name=bounce.target.path,
                    rank=-1,
                    reason=f"a message from the client ({bounce.endpoint or 'port'}) could not "
                    f"be delivered: {bounce.reason}",
                )
            )
        else:
            event = FailureEvent(
                category=str(ErrorCategory.SYSTEM),
                kind="undeliverable",
                actor="<root>",
                mesh_name="root",
                rank=-1,
                reason="the root client has no endpoints",
            )
            self._reject(env, (event, "root"))

    def _park(self, env: Envelope, buffers: list[_codec.ReceivedBuffer]) -> bool:
        """Hold a call to an unknown actor that may still be on its way (see ``_parked``)."""
        path = env.target.path
        if (
            env.kind != MessageKind.CALL
            or self.stopped
            or path in self.tombstones
            or path in ("", "root")
            or self._parked_count >= MAX_PARKED_CALLS
        ):
            return False
        waiting = self._parked.get(path)
        if waiting is None:
            waiting = self._parked[path] = []
            self.loop.loop.call_later(PARK_TIMEOUT, self._unpark, path)
        waiting.append((env, buffers))
        self._parked_count += 1
        return True

    def _unpark(self, path: str) -> None:
        """Route the calls held for ``path``: to the actor if it exists now, else rejected."""
        waiting = self._parked.pop(path, None)
        if not waiting:
            return
        self._parked_count -= len(waiting)
        for env, buffers in waiting:
            if path in self.cells:
                self._route(env, buffers)
            else:
                self._reject(env, self._missing_event(env))

    def _missing_event(self, env: Envelope) -> tuple[FailureEvent, str]:
        path = env.target.path
        stone = self.tombstones.get(path)
        if stone is not None:
            event, user_name = stone
            if event.kind == "failed":
                unhealthy = FailureEvent(
                    category=event.category,
                    kind="unhealthy",
                    actor=event.actor,
                    mesh_name=event.mesh_name,
                    rank=event.rank,
                    reason=event.headline(),
                ).with_cause(event)
                return unhealthy, user_name
            return event, user_name
        reason = (
            "actor mesh is stopped due to proc mesh shutdown"
            if self.stopped
            else f"no actor {path!r} exists in this process"
        )
        event = FailureEvent(
            category=str(ErrorCategory.SYSTEM),
            kind="stopped" if self.stopped else "undeliverable",
            actor=_actor_text(env.target),
            mesh_name=path,
            rank=env.cast.rank if env.cast is not None else -1,
            reason=reason,
        )
        return event, path.rsplit("-", 1)[0]

    def _ack(self, env: Envelope) -> None:
        """Answer ``env``'s reply port with ``None`` (a stop or spawn that completed)."""
        reply = env.reply_port
        assert reply is not None
        self.post(
            self.agent,
            MessageKind.PORT_VALUE,
            reply.actor,
            port=reply.index,
            cast=env.cast,
            payload=_NONE_PAYLOAD,
        )

    def _reject(self, env: Envelope, why: tuple[FailureEvent, str]) -> None:
        event, user_name = why
        if env.kind in (MessageKind.CALL, MessageKind.SPAWN):
            if env.reply_port is not None:
                endpoint = f"{user_name}.{env.endpoint or 'spawn'}"
                self.reply_error(
                    self.agent,
                    env.reply_port,
                    env.cast,
                    SupervisionError(event=event, endpoint=endpoint),
                )
            elif env.kind == MessageKind.CALL:
                self._bounce_to_sender(env, event.report())
        elif env.kind == MessageKind.STOP and env.reply_port is not None:
            self._ack(env)
        elif env.kind == MessageKind.SUPERVISION:
            _log.warning("supervision event for a retired owner %s dropped", env.target.path)

    def _bounce_to_sender(self, env: Envelope, reason: str) -> None:
        bounce = _Bounce(env.sender, env.target, env.endpoint, reason)
        payload = _codec.Payload(msgspec.msgpack.encode(bounce))
        try:
            self.post(self.agent, MessageKind.UNDELIVERABLE, env.sender, payload=payload)
        except Exception:
            _log.exception("could not bounce a message back to its sender")

    def _on_undeliverable(self, env: Envelope, reason: str) -> None:
        """An envelope this process sent could not be delivered (runtime loop thread)."""
        if env.endpoint == HEARTBEAT_ENDPOINT and not env.sender.path:
            return  # a heartbeat or its answer: the watcher's timeout decides, not a bounce
        if env.kind in _SUPERVISION_TRAFFIC:
            self._count(self._sent, env.target.pid, -1)
        event = FailureEvent(
            category=str(ErrorCategory.INFRASTRUCTURE),
            kind="undeliverable",
            actor=_actor_text(env.target),
            mesh_name=env.target.path,
            rank=env.cast.rank if env.cast is not None else -1,
            reason=reason,
        )
        _telemetry.record_supervision("undeliverable", event, self.label)
        if (
            env.kind
            in (MessageKind.CALL, MessageKind.SPAWN, MessageKind.STOP_PROC, MessageKind.STOP)
            and env.reply_port is not None
        ):
            user_name = env.target.path.rsplit("-", 1)[0]
            error = SupervisionError(event=event, endpoint=f"{user_name}.{env.endpoint or 'stop'}")
            rank = env.cast.rank if env.cast is not None else 0
            if env.reply_port.pid == self.pid_raw:
                self._deliver_port(env.reply_port.index, Reply.error(error, rank))
            else:
                self.reply_error(self.agent, env.reply_port, env.cast, error)
        elif env.kind == MessageKind.CALL:
            bounce = _Bounce(env.sender, env.target, env.endpoint, reason)
            self._route(
                Envelope(
                    MessageKind.UNDELIVERABLE,
                    self.agent.addr,
                    env.sender,
                    -1,
                    "",
                    0,
                    None,
                    None,
                    msgspec.msgpack.encode(bounce),
                ),
                [],
            )
        else:
            _log.debug("undeliverable %s envelope dropped: %s", env.kind.name, reason)

    def _spawn(self, env: Envelope, buffers: list[_codec.ReceivedBuffer]) -> None:
        path = env.target.path
        problem = None
        if self.stopped:
            problem = "`ProcMesh` has already been stopped"
        elif path in self.cells or path in self.tombstones or path in ("", "root"):
            problem = f"an actor named {path!r} already exists in this process"
        elif len(self.cells) >= int(_config.get("max_actors_per_proc")):
            problem = f"this process already runs {len(self.cells)} actors"
        if problem is not None:
            if env.reply_port is not None:
                self.reply_error(self.agent, env.reply_port, env.cast, RuntimeError(problem))
            return
        cell = ActorCell(self, env)
        self.cells[path] = cell
        cell.start(_InitItem(env, buffers))
        if path in self._parked:
            self._unpark(path)

    def _stop_proc(self, env: Envelope) -> None:
        self.stopped = True
        # Stopped by its owner, who stopped watching it: a slow stop is no lost process.
        self.lease.release()
        cells = list(self.cells.values())
        finished = [False]
        timer: list[asyncio.TimerHandle] = []

        def finish() -> None:
            if finished[0]:
                return
            finished[0] = True
            for handle in timer:
                handle.cancel()
            self._push_spans(env.sender.pid)
            if env.reply_port is not None:
                self._ack(env)
            if self.root is None:
                self.transport.close()

        remaining = [len(cells)]

        def one_done() -> None:
            remaining[0] -= 1
            if remaining[0] <= 0:
                finish()

        if not cells:
            finish()
            return
        for cell in cells:
            cell.enqueue(
                _StopItem("actor mesh is stopped due to proc mesh shutdown", None, one_done),
                force=True,
            )

        def give_up() -> None:
            for cell in cells:
                self._fence(cell, "actor mesh is stopped due to proc mesh shutdown")
            finish()

        timer.append(self.loop.loop.call_later(float(_config.get("stop_actor_timeout")), give_up))

    def _fence(self, cell: ActorCell, reason: str) -> None:
        """A stop waited ``stop_actor_timeout`` for ``cell`` in vain (runtime loop thread): its
        thread is stuck in user code (an ``__init__`` or endpoint that never returns), and a
        thread cannot be killed. Retire the actor now, as Monarch kills it: it counts as
        stopped (no supervision event), the stop is acknowledged, queued and later messages
        are refused, what it owns is stopped, and anything its thread sends later is refused.
        If that thread ever returns, it ends without handling another message."""
        if cell.fenced or self.cells.get(cell.path) is not cell:
            return  # it stopped (or failed) in time
        timeout = _config.get("stop_actor_timeout")
        _log.warning("%s did not stop within %s s; fenced", cell.display, timeout)
        starting, inflight = cell.state == _STARTING, cell._inflight
        if cell.state not in (_STOPPED, _FAILED) or cell.failure is None:
            cell.state = _STOPPED
            cell.failure = cell._event(
                ErrorCategory.SYSTEM,
                f"{reason} (it did not stop within {timeout} s and was fenced)",
                kind="stopped",
            )
            _telemetry.record_supervision("actor_stopped", cell.failure, self.label)
            cell.lifecycle("actor_stopped", cell.failure.reason)
        spawn = cell.spawn_env
        if starting and spawn.reply_port is not None:  # ``initialized`` resolves (as Monarch's)
            self._ack(spawn)
        if inflight is not None and inflight.reply_port is not None:  # the call it is stuck in
            error = SupervisionError(
                event=cell.failure, endpoint=f"{cell.user_name}.{inflight.endpoint}"
            )
            self.reply_error(self.agent, inflight.reply_port, inflight.cast, error)
        owned, cell.owned = cell.owned, []
        if owned and cell.instance is not None:
            token = _set_context(Context(cell.instance, cell.spawn_point))
            try:  # the stops leave as this actor; nobody waits for them here
                for mesh in owned:
                    with contextlib.suppress(Exception):
                        mesh._stop_owned()
            finally:
                _reset_context(token)
        self._retire(cell)
        cell.fenced = True

    def _retire(self, cell: ActorCell) -> None:
        """An actor thread finished: forget it, keep a tombstone, reject what is left."""
        if cell.fenced:
            return  # retired already, when a stop gave up on it
        if self.cells.get(cell.path) is cell:
            del self.cells[cell.path]
        event = cell.failure or cell._event(ErrorCategory.SYSTEM, "stopped", kind="stopped")
        self.tombstones[cell.path] = (event, cell.user_name)
        while len(self.tombstones) > MAX_TOMBSTONES:
            self.tombstones.popitem(last=False)
        for item in cell.mailbox.close():
            if isinstance(item, _CallItem):
                self._reject(item.env, self._missing_event(item.env))
            elif isinstance(item, _StopItem):
                if item.env is not None:
                    self._reject(item.env, (event, cell.user_name))
                if item.done is not None:
                    item.done()
            elif isinstance(item, _FlushItem):
                item.done()

    # -- liveness ------------------------------------------------------------------------------
    def send_heartbeat(self, pid: bytes, port: PortAddr, timeout: float) -> None:
        """Ping process ``pid``'s agent; the answer goes to ``port`` (client side; any thread)."""
        payload = msgspec.msgpack.encode(Heartbeat(timeout))
        self._send_quiet(MessageKind.CALL, ActorAddr(pid, ""), -1, port, None, payload)

    def _send_quiet(
        self,
        kind: MessageKind,
        target: ActorAddr,
        port: int,
        reply_port: PortAddr | None,
        cast: CastInfo | None,
        payload: bytes,
    ) -> None:
        """``post`` for heartbeats: no telemetry, no lease check."""
        try:
            self.send_system(kind, target, HEARTBEAT_ENDPOINT, port, reply_port, cast, payload)
        except Exception:
            _log.exception("could not send a heartbeat")

    def send_system(
        self,
        kind: MessageKind,
        target: ActorAddr,
        endpoint: str,
        port: int = -1,
        reply_port: PortAddr | None = None,
        cast: CastInfo | None = None,
        payload: bytes = b"",
    ) -> None:
        """Send one envelope of a system endpoint (heartbeats, telemetry) from this process's
        agent (any thread): not counted in the metrics (nor is its answer, which carries the
        endpoint's name too), no lease check, no trace context. Raises what the transport
        raises."""
        envelope = Envelope(
            kind,
            self.agent.addr,
            target,
            port,
            endpoint,
            self.agent.next_sequence(),
            reply_port,
            cast,
            payload,
        )
        self.transport.send(envelope, ())

    def _heartbeat(self, env: Envelope) -> None:
        """The client's heartbeat (runtime loop thread): renew the lease and answer, or, if the
        lease ran out before it came, fence this process."""
        try:
            beat = msgspec.msgpack.decode(env.payload, type=Heartbeat)
        except (msgspec.DecodeError, msgspec.ValidationError):
            _log.warning("malformed heartbeat from %s dropped", env.sender.pid.hex())
            return
        if not self.lease.renew(time.monotonic(), beat.timeout):
            self._fence_process(f"a heartbeat came after the lease of {beat.timeout:g} s ran out")
            return
        if self._lease_timer is None and self.lease.armed:
            self._arm_lease_timer()
        if env.reply_port is not None:
            reply = env.reply_port
            self._send_quiet(MessageKind.PORT_VALUE, reply.actor, reply.index, None, env.cast, b"")

    def _arm_lease_timer(self) -> None:
        expiry = self.lease.expiry
        if expiry is None or self.fenced is not None:
            self._lease_timer = None
            return
        # Both clocks are time.monotonic; a little past the expiry, so that it has passed.
        self._lease_timer = self.loop.loop.call_at(expiry + 0.001, self._check_lease)

    def _check_lease(self) -> None:
        self._lease_timer = None
        if self.lease.expired(time.monotonic()):
            self._fence_process("no heartbeat from the client within its timeout")
        else:
            self._arm_lease_timer()

    def _fence_process(self, reason: str) -> None:
        """The lease ran out: the client may have declared this process dead. Send nothing
        more (``post``), and call ``on_fenced`` once (a worker exits)."""
        if self.fenced is not None:
            return
        self.fenced = reason
        _log.error("this process is fenced (%s): it sends nothing more", reason)
        hook = self.on_fenced
        if hook is not None:
            hook(reason)

    def proc_died(self, pid: bytes, reason: str, *, fenced: bool = False) -> None:
        """The process ``pid`` died (runtime loop thread; once per PID): later messages to it
        fail fast, the owners here of actors on it get a ``MeshFailure`` per rank
        (``__supervise__``; the root client's go to ``unhandled_fault_hook``), and actors here
        owned by actors of that process are stopped (children never outlive their parent).
        ``fenced``: it was declared dead for not answering heartbeats and may still run; what
        it sends from now on is refused."""
        if pid in self._dead or pid == self.pid_raw:
            return
        self._dead[pid] = reason
        while len(self._dead) > MAX_TOMBSTONES:
            self._dead.popitem(last=False)
        mark = getattr(self.transport, "mark_unreachable", None)
        if mark is not None:
            if fenced:
                mark(pid, reason, fence=True)
            else:
                mark(pid, reason)
        owners: list[CellBase] = [self.root] if self.root is not None else []
        owners += [c for c in self.cells.values() if c.state in (_STARTING, _RUNNING)]
        for owner in owners:
            for mesh in list(owner.owned):
                for event in _dead_ranks(owner, mesh, pid, reason):
                    _telemetry.record_supervision("process_died", event, self.label)
                    if isinstance(owner, RootCell):
                        owner.on_fault(event)
                    elif isinstance(owner, ActorCell):
                        owner.enqueue(_SuperviseItem(event), force=True)
        for cell in list(self.cells.values()):
            if cell.owner.pid == pid:
                cell.request_stop(f"the process of its owner died: {reason}")

    def close(self) -> None:
        """Detach from the transport and abandon open ports."""
        self.transport.close()
        with self._port_lock:
            sinks, self._ports = list(self._ports.values()), {}
        for sink in sinks:
            sink.abandon(SupervisionError("the client runtime was shut down"))


class FlushReport(msgspec.Struct, frozen=True):
    """A process's answer to a ``flush_supervision`` round: supervision envelopes it sent
    (net of bounces) and received, per peer PID (hex)."""

    sent: dict[str, int]
    received: dict[str, int]


class Heartbeat(msgspec.Struct, frozen=True):
    """A heartbeat's payload: the watcher's timeout (seconds), which the lease adopts."""

    timeout: float


class ProcDeath(msgspec.Struct, frozen=True):
    """A process-death notice: a SUPERVISION envelope to a process's agent (path ``""``);
    ``fenced``: declared dead for not answering heartbeats (it may still run)."""

    pid: bytes
    reason: str
    fenced: bool = False


def _dead_ranks(owner: CellBase, mesh: Any, pid: bytes, reason: str) -> list[FailureEvent]:
    """One failure event per rank of the owned actor mesh ``mesh`` that lived on ``pid``."""
    procs = getattr(mesh, "_procs", None)
    path = getattr(mesh, "_path", None)
    if procs is None or path is None or getattr(mesh, "_stopped", True):
        return []
    shape = mesh._shape
    extent = Extent(list(shape.labels), list(shape.ndslice.sizes))
    cls = mesh._class
    events = []
    for rank, global_rank in enumerate(shape.ndslice):
        if procs[global_rank].pid.raw != pid:
            continue
        point = Point(rank, extent)
        display = f"{owner.display}.<{cls.__module__}.{cls.__qualname__} {mesh._user_name}{point}>"
        events.append(
            FailureEvent(
                category=str(ErrorCategory.INFRASTRUCTURE),
                kind="failed",
                actor=display,
                mesh_name=path,
                rank=rank,
                reason=f"its process failed: {reason}",
                actor_id=f"{path}@{pid.hex()}",
                proc=procs[global_rank].label,
            )
        )
    return events
