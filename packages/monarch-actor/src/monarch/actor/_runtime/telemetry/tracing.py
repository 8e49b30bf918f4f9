"""Tracing: spans, their ring and listeners, and the trace context that crosses processes.

``span(name)`` (a context manager) and ``@traced`` time an operation; while a span is open it is
the current span, the parent of spans started inside it. The caller's span travels in the CALL
envelope (``outgoing_trace``: 24 bytes, trace id and span id), and the runtime runs each
endpoint in a span whose parent is that one (``wrap_endpoint``), in whatever process it runs:
``wrap_endpoint`` also times the endpoint for ``metrics``. Finished spans go to listeners
(``add_span_listener``) and to a bounded *pending* queue; ``chrome_trace()`` renders them for
Perfetto. Spans are made only while ``TRACING`` is on (``enable_telemetry``); while the
OpenTelemetry mirror is on, each span has a twin there (``otel``).

The runtime's own spans cost little on the call path (issue 21, the overhead target): the send
side (``send_call_traced``) and the receive side of a sync call (``run_endpoint``) make no
``Span`` object. Each reads the clock at its start and end (the receive span's two reads also
time the endpoint for ``metrics``), takes its span id as an int and makes its 24-byte context in
one C call (``_pack_context``), the send side hands that context straight to the envelopes it
posts (no context-variable switch, no ``outgoing_trace`` per envelope), and the finished span is
one plain tuple of what the hot path has (a *row*: 7 or 9 values, ``_row_fields``, not
``Span``'s 16) appended to ``_pending``; rows are packed as they are (about a third of a
``Span``'s packing time) and become ``Span`` objects or records only when read
(``finished_spans``, ``span_records``, ``decode_batch``). The current span is held as its 24-byte
context (``_CURRENT_SPAN``); while a sync endpoint runs in the runtime's receive span, that span's
context is kept on the message's ``Context`` instead (no context-variable switch per call), and
``_current_span`` reads the variable first, then the message's context. With a span listener or
the OpenTelemetry mirror set, the runtime makes ``Span`` objects at once, as before.

Where finished spans go (issue 21: spans of processes that die without a stop). A finishing
span (an object or a row) is appended to ``_pending`` (one ``deque.append`` on the finishing
thread, and a length check; if ``MAX_PENDING_SPANS`` are already waiting the oldest goes,
counted by ``dropped_spans`` and logged by the shipper). This process's *shipper* thread
(``_Shipper``, never an actor thread) drains it every ``SHIP_INTERVAL`` seconds, or as soon
as ``SHIP_AT`` spans are pending, packs them (``encode_batch``: a ``Span`` is a
``msgspec.Struct`` and a row a tuple of plain values, so a batch is the list of them
encoded as is, in C) and moves them to the small ring of recent spans (``finished_spans()``:
the ring, then what is still pending). A packed batch goes

- to the *stream* when one is set (``set_stream``: a worker process streams to the client, which
  started it; ``_runtime.proc`` sends each batch to the client's agent, endpoint ``__spans__``,
  from its runtime loop), so a worker killed without a stop loses at most its last interval;
- otherwise to this process's *store* (``_store``: packed batches, bounded by
  ``MAX_STORED_SPANS`` spans and ``MAX_STORED_BYTES`` bytes, the oldest batches dropped), where
  the batches other processes stream or push to it (``add_remote_batch``) go too. Batches stay
  packed until a trace is made (``span_records``), so keeping them costs no objects.

A stopping worker packs what is pending and hands every batch not yet sent to its stopper
(``take_unsent``), ahead of the stop's acknowledgement on the same path.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import operator
import os
import random
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

import msgspec

from monarch.actor._runtime.context import _CURRENT, _current
from monarch.actor._runtime.telemetry import listeners as _listeners
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import otel as _otel
from monarch.actor._runtime.telemetry.listeners import DEFAULT_RING_CAPACITY, add_listener

if TYPE_CHECKING:
    from monarch.actor._base.envelope import Envelope

__all__ = [
    "MAX_BATCH_SPANS",
    "MAX_PENDING_SPANS",
    "MAX_STORED_BYTES",
    "MAX_STORED_SPANS",
    "MAX_UNSENT_BATCHES",
    "PLAIN_RESULTS",
    "RECENT_SPANS",
    "SHIP_AT",
    "SHIP_INTERVAL",
    "Span",
    "SpanRecord",
    "add_remote_batch",
    "add_span_listener",
    "decode_batch",
    "dropped_spans",
    "encode_batch",
    "process_label",
    "chrome_trace",
    "finished_spans",
    "has_spans",
    "outgoing_trace",
    "resize",
    "run_endpoint",
    "send_span",
    "send_call_traced",
    "set_enabled",
    "set_process_label",
    "set_stream",
    "span",
    "span_records",
    "stored_spans",
    "take_unsent",
    "time_awaitable",
    "traced",
    "wait_stored",
    "wrap_endpoint",
]

_log = logging.getLogger("monarch.actor.telemetry")

#: Whether spans are made (set by ``enable_telemetry`` through ``set_enabled``).
TRACING = False


def set_enabled(on: bool) -> None:
    """Turn span making on or off (``enable_telemetry`` calls this); on, this process's
    shipper runs (``_Shipper``)."""
    global TRACING
    TRACING = bool(on)
    _refresh_plain()  # (``enable_telemetry`` has loaded or unloaded the mirror already)
    if TRACING:
        _shipper.start()
    _metrics.switched()  # the runtime's copies of the switches (``add_switch_listener``)


#: This OS process's id (kept current across forks) and the label of its main process
#: runtime (``"client"``, or a worker's label), which spans made outside any actor carry.
_PID = os.getpid()
_process_label = "client"


def _after_fork() -> None:
    """A forked child (the zygote, a worker forked from it, a program's own fork) starts
    with no spans: those in the ring were its parent's."""
    global _PID, _shipper, _stream, _store_lock, _store_changed, _ship_lock, _kick_at
    _PID = os.getpid()
    _kick_at = SHIP_AT
    _seed_ids()  # after ``random`` reseeded itself (registered first, runs first)
    _spans.clear()
    _pending.clear()
    _unsent.clear()
    _stream = None
    # Locks may have been held by a thread that is not here; the shipper thread is not.
    _store_lock = threading.Lock()
    _store_changed = threading.Condition(_store_lock)
    _ship_lock = threading.Lock()
    _store.clear()
    _store_counts[:] = [0, 0, 0]
    _shipper = _Shipper()


def set_process_label(label: str) -> None:
    """Name this OS process in traces (a worker's runtime label; the client is ``"client"``)."""
    global _process_label
    _process_label = label


def process_label() -> str:
    """The label spans made outside any actor carry (``set_process_label``)."""
    return _process_label


#: The current span's trace context: its 16-byte trace id and 8-byte span id (24 bytes, what a
#: CALL envelope carries: ``outgoing_trace``), or ``b""`` outside any span. The context, not the
#: ``Span``, so that the runtime's receive spans need no object while their endpoint runs.
_CURRENT_SPAN: contextvars.ContextVar[bytes] = contextvars.ContextVar("monarch_span", default=b"")
_current_span_var = _CURRENT_SPAN.get
_current_message = _CURRENT.get


def _current_span() -> bytes:
    """The current span's trace context: the innermost span entered (``_CURRENT_SPAN``), else
    the receive span the runtime runs the current message's sync endpoint in (kept on the
    message's ``Context``: ``run_endpoint``), else ``b""``."""
    current = _current_span_var()
    if current:
        return current
    message = _current_message()
    return message._span if message is not None else b""


_ZERO_SPAN_ID = bytes(8)


class Span(msgspec.Struct, array_like=True, gc=False, eq=False):
    """One timed operation: a name, ids (16-byte trace id, 8-byte span id, parent span id),
    start and end (``time.time_ns()``), attributes, and ``status`` (``"ok"``/``"error"``).
    Where it ran: ``os_pid``, ``proc`` (the process runtime's label: simulated processes share
    an OS process), ``track`` (the actor, ``<root>`` for the client) and ``thread_id``.

    Use it as a context manager (``with span("step"):``); while it is open it is the current
    span, the parent of spans started inside it and of the endpoint spans of calls sent from it.

    A ``msgspec.Struct`` (made by ``span()`` and the runtime, not by hand): made in C with its
    fields in order, packed for the trace by encoding a list of them as is (``encode_batch``),
    untracked by the cyclic garbage collector (it refers to no container that refers back to it),
    equal only to itself.
    """

    name: str
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    start_ns: int
    end_ns: int
    os_pid: int
    proc: str
    track: str
    thread_id: int
    status: str
    error: str
    _attributes: dict[str, Any] | None
    _lazy: tuple[Any, ...] | None
    #: The context-variable token while entered (``__enter__``), else ``None``.
    _token: Any = None
    _otel: Any = None

    @property
    def attributes(self) -> dict[str, Any]:
        """The span's attributes (the runtime's send and receive spans keep theirs as a tuple
        until asked: ``_lazy_attributes``)."""
        attributes = self._attributes
        if attributes is None:
            attributes = self._attributes = _lazy_attributes(self._lazy)
            self._lazy = None
        return attributes

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        """Attach ``key=value`` (at most 64 attributes; more are ignored)."""
        attributes = self.attributes
        if len(attributes) < 64 or key in attributes:
            attributes[key] = value
        if self._otel is not None:
            self._otel.set_attribute(key, value)

    @property
    def duration_s(self) -> float:
        """Seconds from start to end (0 while open)."""
        return max(0, self.end_ns - self.start_ns) / 1e9 if self.end_ns else 0.0

    def __enter__(self) -> Span:
        self._token = _CURRENT_SPAN.set(self.trace_id + self.span_id)
        return self

    def __exit__(self, et: object, exc: BaseException | None, tb: object) -> None:
        token = self._token
        if token is not None:
            _CURRENT_SPAN.reset(token)
            self._token = None
        if exc is None and self._otel is None and not self.end_ns and not _span_listeners:
            # ``_end`` inlined for the common case (one frame less on every send).
            self.end_ns = time.time_ns()
            self.status = "ok"
            _pending.append(self)
            if len(_pending) >= _kick_at:
                _shipper.kick()
            return
        self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        if self.end_ns:
            return
        self.end_ns = time.time_ns()
        if exc is not None:
            self.status = "error"
            self.error = f"{type(exc).__name__}: {exc}"[:1024]
        else:
            self.status = "ok"
        if self._otel is not None:
            _otel.end_span(self._otel, exc)
        _pending.append(self)
        if len(_pending) >= _kick_at:
            _shipper.kick()
        if not _span_listeners:
            return
        for listener in tuple(_span_listeners):
            try:
                listener(self)
            except Exception:
                _log.exception("span listener %r raised", listener)

    def __repr__(self) -> str:
        return (
            f"Span({self.name!r}, trace={self.trace_id.hex()}, span={self.span_id.hex()}, "
            f"parent={self.parent_id.hex()}, status={self.status})"
        )


class _NoSpan:
    """What ``span()`` returns while tracing is off: a context manager that does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


#: Span ids: a counter from a random start (62 bits, drawn again in a forked child), so a span
#: id is unique in its process, and across processes unless two random starts fall within as
#: many spans of each other; a root span's trace id is this process's random 8-byte prefix and
#: its span id. Ids need to be unique, not secret: one ``next`` per span instead of two random
#: draws (``benchmarks/telemetry_hooks.py``). The runtime's spans take an id as the int and
#: make their context with it in one C call (``_pack_context``: the parent's trace id and the
#: new id; ``_pack_root``: a new trace's), with no ``to_bytes``, slice or join (about half the
#: time, in a loop: 145 against 310 ns a span).
_getrandbits = random.getrandbits
_next_id: Callable[[], int]
_trace_prefix = b""
#: ``_pack_context(parent, span_id)``: the 24-byte context of a new span whose parent's context
#: (24 bytes: the first 16 are taken) is ``parent``, ``span_id`` an int (``_next_id``).
_pack_context: Final = struct.Struct(">16sQ").pack
#: ``_pack_root(_trace_prefix, span_id, span_id)``: the 24-byte context of a new trace's root.
_pack_root: Final = struct.Struct(">8sQQ").pack
#: ``_pack_id(span_id)``: a span id's 8 bytes (spans made as objects: ``_start_span``).
_pack_id: Final = struct.Struct(">Q").pack


def _seed_ids() -> None:
    global _next_id, _trace_prefix
    _next_id = itertools.count(_getrandbits(62) + 1).__next__
    _trace_prefix = _getrandbits(64).to_bytes(8, "big")


_seed_ids()
_perf_counter = time.perf_counter
_FOLD_AT: Final = _metrics.FOLD_AT
_latency_logs: Final = _metrics._latency_logs  # the raw latency logs by endpoint (never rebound)
#: Results no endpoint awaits (the receive span's fast path skips ``inspect.isawaitable``).
_PLAIN_RESULTS: Final = frozenset({type(None), int, float, str, bytes, bool, list, dict, tuple})
#: The same, for ``_runtime.cell``'s inlined timing (metrics only).
PLAIN_RESULTS: Final = _PLAIN_RESULTS


def _lazy_attributes(lazy: Sequence[Any] | None) -> dict[str, Any]:
    """The attributes of a runtime span, from the tuple it was made with (``send_span``:
    ``("send", adverb, endpoint, mesh, ranks, actor)``; ``wrap_endpoint``: ``("receive",
    actor, endpoint, rank)``): built when first read, not on the hot path."""
    if lazy is None:
        return {}
    if lazy[0] == "send":
        _, adverb, endpoint, mesh, ranks, actor = lazy
        return {
            "span.kind": "send",
            "adverb": adverb,
            "endpoint": endpoint,
            "mesh": mesh,
            "ranks": ranks,
            "actor": actor,
        }
    _, actor, endpoint, rank = lazy
    return {"span.kind": "receive", "actor": actor, "endpoint": endpoint, "rank": int(rank)}


def _start_span(
    name: str,
    attributes: dict[str, Any] | None,
    remote_parent: tuple[bytes, bytes] | None = None,
    proc: str = "",
    track: str = "",
    lazy: tuple[Any, ...] | None = None,
) -> Span:
    span_id = _pack_id(_next_id())
    if remote_parent is not None:
        trace_id, parent_id = remote_parent
    else:
        parent = _current_span()
        if parent:
            trace_id, parent_id = parent[:16], parent[16:]
        else:
            trace_id, parent_id = _trace_prefix + span_id, _ZERO_SPAN_ID
    if _otel._otel_trace is None:  # no mirror: no call
        return _hot_span(name, trace_id, span_id, parent_id, proc, track, lazy, attributes)
    if attributes is None:
        attributes = _lazy_attributes(lazy)
    otel_span, trace_id, span_id = _otel.start_span(name, attributes, trace_id, parent_id, span_id)
    result = _hot_span(name, trace_id, span_id, parent_id, proc, track, None, attributes)
    result._otel = otel_span
    return result


def span(name: str, attributes: Mapping[str, Any] | None = None) -> Span | _NoSpan:
    """A span named ``name`` (use with ``with``); a no-op object while tracing is off."""
    if not TRACING:
        return _NO_SPAN
    attrs: dict[str, Any] = dict(attributes) if attributes else {}

    ctx = _current()
    if ctx is None:
        return _start_span(name, attrs, track="<root>")
    display = str(ctx.actor_instance)
    attrs.setdefault("actor", display)
    return _start_span(name, attrs, proc=ctx._cell.runtime.label, track=display)


def send_span(adverb: str, endpoint: str, mesh: str, ranks: int, runtime: Any, sender: Any) -> Span:
    """The send side of a call (only while ``TRACING``): a span around the fan-out of one
    adverb (``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``, ``send``) to
    ``ranks`` actors of ``mesh``, made by ``sender`` (a cell of process runtime ``runtime``).
    Entered by the caller while it posts, so each CALL envelope carries its ids and every
    endpoint span is its child."""
    display = sender.display
    if type(display) is not str:
        display = str(display)
    lazy = ("send", adverb, endpoint, mesh, ranks, display)
    if _otel._otel_trace is not None:
        return _start_span(f"{adverb} {mesh}.{endpoint}", None, None, runtime.label, display, lazy)
    # ``_start_span`` and ``_hot_span`` inlined (two frames less on every call): the caller's
    # span is the parent.
    span_id = _pack_id(_next_id())
    parent = _current_span()
    if parent:
        trace_id, parent_id = parent[:16], parent[16:]
    else:
        trace_id, parent_id = _trace_prefix + span_id, _ZERO_SPAN_ID
    return Span(
        f"{adverb} {mesh}.{endpoint}",
        trace_id,
        span_id,
        parent_id,
        _time_ns(),
        0,
        _PID,
        runtime.label or _process_label,
        display,
        _get_ident(),
        "unset",
        "",
        None,
        lazy,
    )


_time_ns = time.time_ns
_get_ident = threading.get_ident


def send_call_traced(
    adverb: str,
    port: Any,
    runtime: Any,
    sender: Any,
    payload: Any,
    targets: Sized,
    reply_port: Any,
    flags: int,
) -> None:
    """``runtime.post_calls(sender, targets, endpoint=port._name, reply_port=reply_port,
    payload=payload, flags=flags, trace=trace)``: the send side of a call (only while
    ``TRACING``), the fan-out of one adverb of endpoint ``port`` (``_mesh.adverbs.Endpoint``:
    its ``_name``, its mesh's ``_user_name``) to ``len(targets)`` actors by ``sender`` (a cell
    of process runtime ``runtime``, a ``ProcRuntime``) inside a send span, whose trace context
    ``trace`` (24 bytes) each CALL envelope carries, so every endpoint span is its child. What
    the endpoint's ``_post_each`` does untraced, called here directly (issue 21: one frame less
    a call), with a fixed number of arguments (variable ones cost two tuples and an unpacking).

    The common case (no OpenTelemetry mirror, no span listener) makes no ``Span`` and sets no
    context variable: it reads the clock before and after the posts and appends one plain
    tuple of what varies (a *row*, ``_row_fields``: made a ``Span`` when read, ``_row_span``)
    to the pending spans. Otherwise it enters ``send_span`` and posts with that span's context
    given (not left to ``ProcRuntime._envelope``, which reads the current span only while the
    package-level ``telemetry.TRACING`` is on: not with ``set_enabled`` called directly).
    """
    name = port._name
    if not _PLAIN:  # a ``Span`` wanted at once: entered, its context given to the envelopes
        with send_span(adverb, name, port._mesh._user_name, len(targets), runtime, sender) as made:
            runtime.post_calls(
                sender,
                targets,
                endpoint=name,
                reply_port=reply_port,
                payload=payload,
                flags=flags,
                trace=made.trace_id + made.span_id,
            )
        return
    span_id = _next_id()
    parent = _current_span_var()
    if not parent:  # ``_current_span`` inlined
        message = _current_message()
        if message is not None:
            parent = message._span
    if parent:
        context = _pack_context(parent, span_id)
    else:
        context = _pack_root(_trace_prefix, span_id, span_id)
    ident = _get_ident()
    where = sender._span_where  # a cell's (``_runtime.cell.CellBase``), None until made
    if where is None or where[3] != ident or where[0] != _PID:  # kept while the thread sends
        display = sender.display
        if type(display) is not str:
            display = str(display)
        where = sender._span_where = _where(runtime.label or _process_label, display, ident)
    packed = where[4]
    start_ns = _time_ns()
    try:
        runtime.post_calls(
            sender,
            targets,
            endpoint=name,
            reply_port=reply_port,
            payload=payload,
            flags=flags,
            trace=context,
        )
    except BaseException as exc:
        row = (context, parent, start_ns, 0, packed, adverb, name)
        failed = _row_span((*row, port._mesh._user_name, len(targets)))
        failed._end(exc)
        raise
    _pending.append(
        (
            context, parent, start_ns, _time_ns(), packed, adverb, name, port._mesh._user_name,
            len(targets),
        )
    )  # fmt: skip
    if len(_pending) >= _kick_at:
        _shipper.kick()


#: A finished runtime span as the hot path records it (``send_call_traced``, ``run_endpoint``): a
#: *row*, a plain tuple of what varies, packed as it is (``encode_batch``: fewer values than a
#: ``Span``'s 16 fields, so less to make and to encode per span) and made a ``Span`` or a
#: ``SpanRecord`` only when read (``_row_span``, ``decode_batch``). ``where`` is ``(os_pid,
#: proc, track, thread_id)``, already packed in a row on the hot path (a ``msgspec.Raw`` made
#: once per actor and thread: ``_where``), a tuple or list once decoded; the status is
#: ``"ok"``, the error empty.
#:
#: - a send span, 9 values: ``(context, parent, start_ns, end_ns, where, adverb, endpoint,
#:   mesh, ranks)``, ``context`` being its 16-byte trace id and 8-byte span id (what its
#:   envelopes carry), ``parent`` its parent's context (24 bytes: the parent's span id is its
#:   last 8), or ``b""`` for a root; named ``"ADVERB MESH.ENDPOINT"``, its actor the track;
#: - a receive span, 7 values: ``(trace, context, start_ns, end_ns, where, endpoint, rank)``,
#:   ``trace`` being the envelope's context (the trace id and the parent's span id),
#:   ``context`` its own (the same trace id and its span id: what the calls made in its
#:   endpoint carry); named after the endpoint, its actor the track.
#:
#: Both keep what the hot path has, so that recording a span slices and joins no bytes.
_SEND_ROW: Final = 9
_RECEIVE_ROW: Final = 7


def _where(proc: str, track: str, thread_id: int) -> tuple[int, str, str, int, msgspec.Raw]:
    """Where a cell's spans run on thread ``thread_id`` of this OS process, as the runtime
    keeps it on the cell (``CellBase._span_where``): ``(os_pid, proc, track, thread_id,
    packed)``, ``packed`` being the first four packed (msgpack), what its rows carry: encoded
    once, not with every span (about a quarter of a row's packing)."""
    where = (_PID, proc, track, thread_id)
    return (*where, msgspec.Raw(_encode(where)))


def _unpacked_where(where: Any) -> Sequence[Any]:
    """A row's ``where`` as its four values (a hot-path row's is still packed: ``_where``)."""
    if type(where) is msgspec.Raw:
        return _decode(where)  # type: ignore[no-any-return]
    return where  # type: ignore[no-any-return]


def _row_fields(row: Sequence[Any]) -> tuple[Any, ...]:
    """``Span``'s first 14 fields (its status ``"ok"``; the attributes as the runtime's lazy
    tuple, ``_lazy_attributes``) of a row (``_SEND_ROW`` or ``_RECEIVE_ROW`` values);
    ``ValueError`` if it is neither."""
    if len(row) == _SEND_ROW:
        context, parent, start_ns, end_ns, where, adverb, endpoint, mesh, ranks = row
        os_pid, proc, track, thread_id = _unpacked_where(where)
        return (
            f"{adverb} {mesh}.{endpoint}", context[:16], context[16:],
            parent[16:] if parent else _ZERO_SPAN_ID, start_ns, end_ns, os_pid, proc, track,
            thread_id, "ok", "", None, ("send", adverb, endpoint, mesh, ranks, track),
        )  # fmt: skip
    if len(row) == _RECEIVE_ROW:
        trace, context, start_ns, end_ns, where, endpoint, rank = row
        os_pid, proc, track, thread_id = _unpacked_where(where)
        return (
            endpoint, trace[:16], context[16:], trace[16:], start_ns, end_ns,
            os_pid, proc, track, thread_id, "ok", "", None, ("receive", track, endpoint, rank),
        )  # fmt: skip
    raise ValueError(f"not a span row ({len(row)} values)")


def _row_span(row: Span | tuple[Any, ...]) -> Span:
    """The ``Span`` of a pending or recent span (itself), or of a row the runtime's hot path
    recorded (``_row_fields``)."""
    if isinstance(row, Span):
        return row
    return Span(*_row_fields(row))


def _hot_span(
    name: str,
    trace_id: bytes,
    span_id: bytes,
    parent_id: bytes,
    proc: str,
    track: str,
    lazy: tuple[Any, ...] | None,
    attributes: dict[str, Any] | None = None,
) -> Span:
    """A new open span, started now on this thread (one positional ``Span`` call, made in C)."""
    return Span(
        name,
        trace_id,
        span_id,
        parent_id,
        _time_ns(),
        0,
        _PID,
        proc or _process_label,
        track,
        _get_ident(),
        "unset",
        "",
        attributes,
        lazy,
    )


_P = ParamSpec("_P")
_R = TypeVar("_R")


@overload
def traced(fn: Callable[_P, _R]) -> Callable[_P, _R]: ...


@overload
def traced(*, name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...


def traced(
    fn: Callable[_P, _R] | None = None, *, name: str | None = None
) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator: run the function (sync or async) in a span named ``name`` or its
    ``__name__``. Usable bare (``@traced``) or with a name (``@traced(name="load")``)."""

    def decorate(function: Callable[_P, _R]) -> Callable[_P, _R]:
        label = name if name is not None else function.__name__
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                with span(label):
                    return await function(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(function)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with span(label):
                return function(*args, **kwargs)

        return run

    if fn is not None:
        return decorate(fn)
    return decorate


#: Spans ``finished_spans()`` keeps once packed (the newest; ``resize``). Small: keeping
#: thousands of finished span objects alive cost tracing about 10 points of call throughput
#: (README, "Errors, logs and telemetry"); the trace keeps them packed (``_store``).
RECENT_SPANS: Final = 256
#: The shipper packs what is pending at least this often (seconds): what a killed process loses.
SHIP_INTERVAL: Final = 0.5
#: ... and as soon as this many spans are pending.
SHIP_AT: Final = 256
#: Spans in one packed batch (a ``__spans__`` message) at most.
MAX_BATCH_SPANS: Final = 1024
#: Finished spans waiting for the shipper at most (the oldest are dropped beyond: only if the
#: shipper thread cannot keep up).
MAX_PENDING_SPANS: Final = 16 * SHIP_AT
#: The pending length at which a finishing span kicks the shipper (``_Shipper.kick``):
#: ``SHIP_AT``, raised to ``MAX_PENDING_SPANS`` by a kick until the shipper has woken, so that
#: the spans finishing meanwhile make no call each (before the shipper got the GIL, about one
#: span in five kicked it again), while a full queue still counts every drop.
_kick_at = SHIP_AT
#: Packed batches waiting to be sent on the stream at most (the oldest are dropped beyond).
MAX_UNSENT_BATCHES: Final = 256
#: The store of packed spans (this process's own, and those other processes sent to it).
MAX_STORED_SPANS: Final = 16 * DEFAULT_RING_CAPACITY
MAX_STORED_BYTES: Final = 64 * 1024 * 1024

#: A finished span as the hot path records it: a row (``_row_fields``), packed as it is
#: (``encode_batch``) and made a ``Span`` only when read (``_row_span``: ``finished_spans``,
#: ``span_records``).
_SpanRow = tuple[Any, ...]
#: The ring of recent spans, and the finished spans waiting for the shipper: ``Span`` objects
#: (user spans, and the runtime's while a listener or the OpenTelemetry mirror is set) and rows.
_spans: collections.deque[Span | _SpanRow] = collections.deque(maxlen=RECENT_SPANS)
_pending: collections.deque[Span | _SpanRow] = collections.deque(maxlen=MAX_PENDING_SPANS)
_span_listeners: list[Callable[[Span], None]] = []


def finished_spans() -> list[Span]:
    """The most recent finished spans of this process, oldest first (the ring of recent spans,
    then those not yet packed: at least the last ``RECENT_SPANS``). Rows the runtime recorded
    are made ``Span`` objects here (a new object on every call)."""
    return [_row_span(s) for s in (*_spans, *_pending)]


def add_span_listener(listener: Callable[[Span], None]) -> Callable[[], None]:
    """Call ``listener(span)`` for every span as it finishes (on the finishing thread; keep it
    short). Returns a function that removes the listener."""
    return add_listener(_span_listeners, listener, _store_plain)


#: Whether the runtime's spans may be rows (``send_call_traced``, ``run_endpoint``): no span
#: listener and no OpenTelemetry mirror, which want ``Span`` objects as spans finish. One
#: global test on the hot path (issue 21), computed and stored under the listeners' lock when
#: either changes (``add_span_listener`` and its remover, through ``add_listener``'s
#: ``changed``; ``otel.load`` and ``otel.unload``, and ``set_enabled``, through
#: ``_refresh_plain``), so that concurrent changes cannot store a stale value last.
_PLAIN = True


def _store_plain() -> None:
    """``_PLAIN`` computed and stored (the caller holds ``listeners._listeners_lock``)."""
    global _PLAIN
    _PLAIN = _otel._otel_trace is None and not _span_listeners


def _refresh_plain() -> None:
    """``_store_plain`` under the listeners' lock (read as the module's attribute: a forked
    child replaces it)."""
    with _listeners._listeners_lock:
        _store_plain()


_otel._changed = _refresh_plain  # (``otel`` cannot import this module: it imports ``otel``)


class SpanRecord(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A finished span as plain data: what a process reports to the client (``__telemetry__``,
    and at its stop) and what ``chrome_trace`` renders. Fields as in ``Span``."""

    name: str
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    start_ns: int
    end_ns: int
    os_pid: int
    proc: str
    track: str
    thread_id: int
    status: str
    error: str = ""
    attributes: dict[str, str | int | float | bool] = {}

    @classmethod
    def of(cls, s: Span) -> SpanRecord:
        """The record of a finished span."""
        return cls(
            name=s.name,
            trace_id=s.trace_id,
            span_id=s.span_id,
            parent_id=s.parent_id,
            start_ns=s.start_ns,
            end_ns=s.end_ns,
            os_pid=s.os_pid,
            proc=s.proc,
            track=s.track,
            thread_id=s.thread_id,
            status=s.status,
            error=s.error,
            attributes={
                k: v for k, v in s.attributes.items() if isinstance(v, str | int | float | bool)
            },
        )


# -- packing, the stream and the store ---------------------------------------------------------
#: A packed span: these attributes, in this order, then two ``None`` (``Span``'s fields; the
#: slow path of ``encode_batch``, for spans whose attributes msgpack cannot carry).
_PACK_FIELDS: Final = (
    "name",
    "trace_id",
    "span_id",
    "parent_id",
    "start_ns",
    "end_ns",
    "os_pid",
    "proc",
    "track",
    "thread_id",
    "status",
    "error",
    "_attributes",
    "_lazy",
)
_pack_one = operator.attrgetter(*_PACK_FIELDS)
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode
_ATTRIBUTE_TYPES = (str, int, float, bool)


def _plain(attributes: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    return {k: v for k, v in attributes.items() if isinstance(v, _ATTRIBUTE_TYPES)}


def encode_batch(spans: Sequence[Span | _SpanRow]) -> bytes:
    """``spans`` packed: a msgpack array with one array per span (its fields in order; a
    runtime span's attributes still as their tuple), encoded as is, in C. Attribute values
    other than ``str``, ``int``, ``float`` and ``bool`` are left out (as ``SpanRecord.of``
    does), as is an OpenTelemetry twin."""
    try:
        return _encode(spans)
    except (TypeError, ValueError, OverflowError):  # something msgpack cannot carry
        rows = []
        for s in spans:
            if not isinstance(s, Span):  # a runtime row: plain values only
                rows.append(list(s))
                continue
            row = [*_pack_one(s), None, None]  # as ``Span``'s fields: token and twin left out
            row[12] = _plain(s.attributes)
            row[13] = None
            rows.append(row)
        return _encode(rows)


_Row = tuple[
    str,
    bytes,
    bytes,
    bytes,
    int,
    int,
    int,
    str,
    str,
    int,
    str,
    str,
    dict[str, Any] | None,
    list[Any] | None,
    Any,
    Any,
]
_Where = tuple[int, str, str, int]
_SendRow = tuple[bytes, bytes, int, int, _Where, str, str, str, int]
_ReceiveRow = tuple[bytes, bytes, int, int, _Where, str, int]
_ROW_TYPES: Final[dict[int, Any]] = {16: _Row, _SEND_ROW: _SendRow, _RECEIVE_ROW: _ReceiveRow}
_decode_rows = msgspec.msgpack.Decoder(list[list[Any]]).decode
_convert = msgspec.convert


def decode_batch(data: bytes) -> list[SpanRecord]:
    """The spans of a packed batch (``encode_batch``: ``Span``'s 16 fields, or a runtime
    span's row, ``_row_fields``); ``ValueError`` if it is not one."""
    try:
        rows = _decode_rows(data)
        typed = [_convert(row, _ROW_TYPES.get(len(row), _Row)) for row in rows]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not a packed span batch: {exc}") from exc
    out = []
    for row in typed:
        if len(row) != 16:
            if len(row[0]) != 24:
                raise ValueError(f"not a packed span batch: a trace context of {len(row[0])} bytes")
            if len(row[1]) != 24 and (len(row) == _RECEIVE_ROW or row[1]):
                size = len(row[1])
                raise ValueError(f"not a packed span batch: a second context of {size} bytes")
            row = _row_fields(row)
        (name, trace_id, span_id, parent_id, start_ns, end_ns, os_pid, proc, track) = row[:9]
        thread_id, status, error, attributes, lazy = row[9:14]
        try:
            plain = _plain(attributes if attributes is not None else _lazy_attributes(lazy))
        except (ValueError, TypeError, IndexError) as exc:
            raise ValueError(f"not a packed span batch: attributes {lazy!r}: {exc}") from exc
        out.append(
            SpanRecord(
                name=name,
                trace_id=trace_id,
                span_id=span_id,
                parent_id=parent_id,
                start_ns=start_ns,
                end_ns=end_ns,
                os_pid=os_pid,
                proc=proc,
                track=track,
                thread_id=thread_id,
                status=status,
                error=error,
                attributes=plain,
            )
        )
    return out


#: Where this process's packed batches go instead of its store (``set_stream``), or ``None``.
_stream: Callable[[], None] | None = None
#: Packed batches for the stream, not yet sent (``take_unsent``), oldest first.
_unsent: collections.deque[bytes] = collections.deque(maxlen=MAX_UNSENT_BATCHES)
#: The store: ``(spans, packed batch, sender)``, oldest first; ``_store_counts``: spans,
#: bytes, and batches ever stored (``wait_stored`` waits for it to change).
_store: collections.deque[tuple[int, bytes, str]] = collections.deque()
_store_counts = [0, 0, 0]
_store_lock = threading.Lock()
_store_changed = threading.Condition(_store_lock)
#: Held while pending spans are packed and placed (the shipper, ``take_unsent``).
_ship_lock = threading.Lock()


def set_stream(notify: Callable[[], None] | None) -> None:
    """Stream this process's spans: packed batches wait for ``take_unsent`` instead of going to
    the store, and ``notify()`` is called (on the shipper thread) whenever one is added, so the
    caller sends them (``_runtime.proc``: a worker, to the client). ``None``: keep them here."""
    global _stream
    _stream = notify
    if notify is not None and (TRACING or _pending):
        _shipper.start()  # else tracing's start, or the first kick, starts it


_repeat = itertools.repeat
_map = map
_call = operator.call


def _ship() -> bool:
    """Pack everything pending, in batches of at most ``MAX_BATCH_SPANS`` (the shipper thread,
    or ``take_unsent``); whether a batch was made. Called with ``_ship_lock`` held."""
    made = False
    _shipper._full = False
    popleft = _pending.popleft
    while _pending:
        # Nobody else drains it (the lock is held) and appends never shorten it, so the first
        # ``n`` are there to take.
        n = min(len(_pending), MAX_BATCH_SPANS)
        try:
            batch: list[Span | _SpanRow] = list(_map(_call, _repeat(popleft, n)))  # all in C
        except IndexError:  # cleared meanwhile (a fork's child): nothing more to pack
            break
        if not batch:
            break
        data = encode_batch(batch)
        _spans.extend(batch)
        made = True
        if _stream is not None:
            if len(_unsent) == _unsent.maxlen:
                _log.warning("span stream: %d batches unsent, the oldest dropped", len(_unsent))
            _unsent.append(data)
        else:
            _keep(len(batch), data, "")
    return made


def take_unsent(*, flush: bool = False) -> list[bytes]:
    """The packed batches waiting for the stream, oldest first (they are the caller's now);
    with ``flush``, what is pending is packed first (a stopping worker)."""
    if flush:
        with _ship_lock:
            _ship()
    out = []
    with contextlib.suppress(IndexError):
        while _unsent:
            out.append(_unsent.popleft())
    return out


def _keep(count: int, data: bytes, sender: str) -> None:
    """Put a packed batch in the store, dropping the oldest beyond the bounds."""
    with _store_changed:
        _store.append((count, data, sender))
        _store_counts[0] += count
        _store_counts[1] += len(data)
        while len(_store) > 1 and (
            _store_counts[0] > MAX_STORED_SPANS or _store_counts[1] > MAX_STORED_BYTES
        ):
            n, old, _ = _store.popleft()
            _store_counts[0] -= n
            _store_counts[1] -= len(old)
        _store_counts[2] += 1
        _store_changed.notify_all()


def add_remote_batch(data: bytes, sender: str = "") -> None:
    """A packed batch another process sent (its stream, or its stop): forwarded on this
    process's own stream if it has one (a worker that stopped a process its actors spawned),
    else kept in the store (checked when read: ``span_records``). ``sender``: who sent it."""
    if _stream is not None:
        _unsent.append(data)
        _stream()
        return
    _keep(_count_hint(data), data, sender)


def _count_hint(data: bytes) -> int:
    """The number of spans of a packed batch (its msgpack array header), 1 if unreadable."""
    if not data:
        return 1
    head = data[0]
    if head & 0xF0 == 0x90:
        return max(1, head & 0x0F)
    if head == 0xDC and len(data) >= 3:
        return max(1, int.from_bytes(data[1:3], "big"))
    if head == 0xDD and len(data) >= 5:
        return max(1, int.from_bytes(data[1:5], "big"))
    return 1


def stored_spans() -> int:
    """How many spans the store holds (packed)."""
    with _store_lock:
        return _store_counts[0]


def wait_stored(predicate: Callable[[], bool], timeout: float) -> bool:
    """Wait until ``predicate()`` is true, calling it now and again each time a batch reached
    the store (outside the store's lock: it may read ``span_records()``), at most ``timeout``
    seconds; whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        with _store_lock:
            seen = _store_counts[2]
        if predicate():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        with _store_changed:
            if _store_counts[2] == seen:
                _store_changed.wait(remaining)


class _Shipper:
    """This process's shipper thread (a daemon, started with tracing; it ends once tracing is
    off and nothing is pending, and starts again with tracing or a kick): packs the
    pending spans every ``SHIP_INTERVAL`` seconds, or when ``kick``ed (``SHIP_AT`` pending),
    and notifies the stream. One per OS process (a forked child makes its own)."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._kicked = False
        #: Whether the pending queue was full at the last kick (``_ship`` empties it).
        self._full = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="monarch-span-shipper", daemon=True
                )
                self._thread.start()

    def kick(self) -> None:
        """``SHIP_AT`` spans are pending: pack them now (any thread; cheap when repeated). A
        span added while ``MAX_PENDING_SPANS`` were pending pushed the oldest out: counted, and
        the shipper says how many it lost (``dropped_spans``)."""
        global _dropped, _kick_at
        if len(_pending) >= MAX_PENDING_SPANS:
            if self._full:  # it was full before this span came: the oldest went
                _dropped += 1
            else:
                self._full = True
        if not self._kicked:
            self._kicked = True
            _kick_at = MAX_PENDING_SPANS  # no more kicks until woken, unless full
            if self._thread is None:
                self.start()
            self._wake.set()

    def _run(self) -> None:
        global _kick_at
        while True:
            kicked = self._wake.wait(SHIP_INTERVAL)
            self._wake.clear()
            self._kicked = False
            _kick_at = SHIP_AT
            try:
                if _dropped > _dropped_told:
                    _tell_dropped()
                with _ship_lock:
                    made = _ship()
                notify = _stream
                if made and notify is not None:
                    notify()
            except Exception:
                _log.exception("span shipper: could not pack the finished spans")
            if not kicked and not TRACING and not _pending:
                with self._start_lock:  # idle and off: end (``start`` makes a new one)
                    if not _pending and not TRACING:
                        self._thread = None
                        return


_shipper = _Shipper()
#: Finished spans pushed out of the full pending queue (``_Shipper.kick``), ever; and how many
#: of them the shipper has logged.
_dropped = 0
_dropped_told = 0


def dropped_spans() -> int:
    """How many finished spans this process lost because ``MAX_PENDING_SPANS`` were waiting
    for the shipper (it did not keep up): each was logged as a warning."""
    return _dropped


def _tell_dropped() -> None:
    global _dropped_told
    now = _dropped
    _log.warning(
        "span shipper: %d finished spans dropped (more than %d waiting to be packed)",
        now - _dropped_told,
        MAX_PENDING_SPANS,
    )
    _dropped_told = now


def has_spans() -> bool:
    """Whether any finished span (own or reported) is held here."""
    return bool(_spans) or bool(_pending) or bool(_store) or bool(_unsent)


def span_records(*, remote: bool = True) -> list[SpanRecord]:
    """The finished spans held here, as records, each once: those of the store (this
    process's packed ones and, with ``remote``, those other processes sent), those packed
    and not yet streamed, the recent ring and what is pending. A batch that does not decode
    is skipped with a warning naming its sender."""
    with _store_lock:
        stored = list(_store)
    out: list[SpanRecord] = []
    for _, data, sender in stored:
        try:
            records = decode_batch(data)
        except ValueError as exc:
            _log.warning("spans from %s dropped: %s", sender or "this process", exc)
            continue
        out.extend(r for r in records if remote or r.os_pid == _PID)
    for data in list(_unsent):
        with contextlib.suppress(ValueError):
            out.extend(r for r in decode_batch(data) if remote or r.os_pid == _PID)
    out.extend(SpanRecord.of(s) for s in finished_spans() if s.os_pid == _PID)
    return _unique(out)


def _unique(records: Sequence[SpanRecord]) -> list[SpanRecord]:
    seen: set[bytes] = set()
    out = []
    for r in records:
        if r.span_id not in seen:
            seen.add(r.span_id)
            out.append(r)
    return out


def chrome_trace(spans: Sequence[Span | SpanRecord] | None = None) -> dict[str, Any]:
    """``spans`` (default: this process's ring) in the Chrome trace-event JSON format that
    Perfetto and ``chrome://tracing`` open.

    One ``pid`` per process (an OS process, or a simulated one: named by ``process_name``
    metadata, ``label (os pid N)``), one ``tid`` per actor in it (a track, named by
    ``thread_name``: the actor's chain, ``<root>`` for the client), one complete event
    (``"ph": "X"``, microseconds) per span, and a flow (``"ph": "s"`` on the parent's slice,
    ``"ph": "f"`` with ``"bp": "e"`` on the child's) wherever a span's parent ran in another
    process or on another track: the causal arrows of a call from its send to its receive.
    """
    records = _unique(
        [
            s if isinstance(s, SpanRecord) else SpanRecord.of(s)
            for s in (finished_spans() if spans is None else spans)
        ]
    )
    procs: dict[tuple[int, str], int] = {}
    tracks: dict[tuple[int, str], int] = {}
    meta: list[dict[str, Any]] = []
    where: dict[bytes, tuple[int, int, float, float]] = {}
    events: list[dict[str, Any]] = []
    for r in sorted(records, key=lambda r: r.start_ns):
        pkey = (r.os_pid, r.proc)
        pid = procs.get(pkey)
        if pid is None:
            pid = procs[pkey] = len(procs) + 1
            meta.append(_meta("process_name", pid, 0, f"{r.proc} (os pid {r.os_pid})"))
            meta.append(
                {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}
            )
        track = r.track or f"thread {r.thread_id}"
        tkey = (pid, track)
        tid = tracks.get(tkey)
        if tid is None:
            tid = tracks[tkey] = len(tracks) + 1
            meta.append(_meta("thread_name", pid, tid, track))
        ts, dur = r.start_ns / 1000, max(0, r.end_ns - r.start_ns) / 1000
        where[r.span_id] = (pid, tid, ts, dur)
        events.append(
            {
                "name": r.name,
                "cat": str(r.attributes.get("span.kind", "span")),
                "ph": "X",
                "ts": ts,
                "dur": dur,
                "pid": pid,
                "tid": tid,
                "args": {
                    **r.attributes,
                    "trace_id": r.trace_id.hex(),
                    "span_id": r.span_id.hex(),
                    "parent_id": r.parent_id.hex(),
                    "status": r.status,
                    **({"error": r.error} if r.error else {}),
                },
            }
        )
    flows = 0
    for r in records:
        parent = where.get(r.parent_id)
        child = where[r.span_id]
        if parent is None or parent[:2] == child[:2]:
            continue
        ppid, ptid, pts, pdur = parent
        flows += 1
        # The arrow leaves from inside the parent's slice (its start, or the middle when the
        # child began after the parent ended: a send span ends once its envelopes are out).
        out_ts = child[2] if pts <= child[2] < pts + pdur else pts + pdur / 2
        common = {"name": "call", "cat": "monarch.flow", "id": flows}
        events.append({**common, "ph": "s", "pid": ppid, "tid": ptid, "ts": out_ts})
        events.append(
            {**common, "ph": "f", "bp": "e", "pid": child[0], "tid": child[1], "ts": child[2]}
        )
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def resize(capacity: int) -> None:
    """Resize the ring of recent finished spans (keeps the newest spans; ``set_ring_capacity``);
    the trace's store is bounded separately (``MAX_STORED_SPANS``)."""
    global _spans
    _spans = collections.deque(_spans, maxlen=capacity)


def outgoing_trace(kind: int) -> bytes:
    """The trace context to put in an envelope of ``kind`` (CALL only): the current span's."""
    if not TRACING or kind != 1:  # MessageKind.CALL
        return b""
    return _current_span()


def wrap_endpoint(cell: Any, envelope: Envelope, fn: Callable[..., Any], prop: Any) -> Any:
    """``fn`` timed (metrics) and run in a span (tracing) whose parent is the caller's span.

    Returns a callable with ``fn``'s calling convention: its result is ``fn``'s, or, when that is
    awaitable, a coroutine that awaits it inside the span (async endpoints). The callable is a
    ``functools.partial`` of a module function (made in C: no closure and no cells per call).
    """
    if (TRACING and (prop is None or getattr(prop, "_instrument", True))) or _metrics.METRICS:
        return _partial(_run_wrapped, cell, envelope, fn)
    return fn


_partial = functools.partial


def _run_wrapped(
    cell: Any, envelope: Envelope, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)`` timed and in a receive span (``wrap_endpoint``'s callable)."""
    return run_endpoint(cell, envelope, fn, args, kwargs)


def run_endpoint(
    cell: Any,
    envelope: Envelope,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``fn(*args, **kwargs)`` timed while metrics are on, and, while tracing is on (unless
    ``cell._untraced`` names the endpoint: its property says ``instrument=False``), in a
    receive span whose parent is the caller's span (the ids the envelope carries):
    ``wrap_endpoint(cell, envelope, fn, prop)(*args, **kwargs)`` without making the wrapper
    (a sync actor's call: ``_runtime.cell``). One frame on the call's path (issue 21: every
    frame there counts).

    The common traced case (the envelope carries a parent, no OpenTelemetry mirror, no
    listener, a plain result) makes no ``Span``: the current trace context is the envelope's
    trace id and a new span id while ``fn`` runs (kept on the message's ``Context``, which the
    runtime makes per message: ``_current_span``), the clock is read twice (``time.time_ns``: the
    span's start and end, whose difference is also the endpoint latency metrics record: one
    clock for both), and the finished span is one plain tuple appended to the pending spans
    (``send_call_traced``). An exception or an awaitable result makes the ``Span`` after all
    (``_run_traced_slow``'s ending)."""
    if TRACING and envelope.endpoint not in cell._untraced:
        trace = envelope.trace
        if len(trace) != 24 or not _PLAIN:
            return _run_traced_slow(cell, envelope, fn, args, kwargs)
        context = _pack_context(trace, _next_id())  # the trace id, a new span id
        # The current span while ``fn`` runs: kept on the message's context (the runtime
        # makes one per message, current until it resets it after the call; whatever
        # copied the context meanwhile keeps the span, as it would a context variable's
        # value), without a context-variable switch; set in the variable instead when
        # there is no such context (called from outside the runtime's call path), or a
        # span was entered around this run.
        message = _current_message()
        if message is not None and not message._span and not _current_span_var():
            message._span = context
            token = None
        else:
            token = _CURRENT_SPAN.set(context)
        start_ns = _time_ns()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _finish_endpoint_ns(
                envelope.endpoint,
                start_ns,
                _receive_span(cell, envelope, context, start_ns),
                exc,
            )
            raise
        finally:
            if token is not None:
                _CURRENT_SPAN.reset(token)
        if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
            current = _receive_span(cell, envelope, context, start_ns)
            return _await_endpoint(result, envelope.endpoint, 0.0, current, _metrics.METRICS, True)
        end_ns = _time_ns()
        endpoint = envelope.endpoint
        ident = _get_ident()
        where = cell._span_where
        if where is None or where[3] != ident:  # made once: an actor's calls on one thread
            label = cell.runtime.label or _process_label
            where = cell._span_where = _where(label, cell.display, ident)
        _pending.append((trace, context, start_ns, end_ns, where[4], endpoint, cell.rank))
        if len(_pending) >= _kick_at:
            _shipper.kick()
        if not _metrics.METRICS:
            return result
        elapsed = (end_ns - start_ns) * 1e-9 if end_ns > start_ns else 0.0
    else:  # not traced: timed only, while metrics are on
        if not _metrics.METRICS:
            return fn(*args, **kwargs)
        started = _perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _metrics.record_endpoint(envelope.endpoint, started, exc)
            raise
        if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
            return _await_endpoint(result, envelope.endpoint, started, None, True)
        elapsed = _perf_counter() - started
        endpoint = envelope.endpoint
    log = _latency_logs.get(endpoint)
    if log is None:
        log = _metrics.latency_log(endpoint)
    log.append(elapsed)
    if len(log) >= _FOLD_AT or _metrics._MIRROR:
        _metrics.note_latency(endpoint, log, elapsed)
    return result


def _receive_span(cell: Any, envelope: Envelope, context: bytes, start_ns: int) -> Span:
    """The open receive span ``run_endpoint`` did not make (the body raised, or returned an
    awaitable): as its fast path would have recorded it (``context``: its own)."""
    trace, endpoint, display = envelope.trace, envelope.endpoint, cell.display
    return Span(
        endpoint,
        trace[:16],
        context[16:],
        trace[16:],
        start_ns,
        0,
        _PID,
        cell.runtime.label or _process_label,
        display,
        _get_ident(),
        "unset",
        "",
        None,
        ("receive", display, endpoint, cell.rank),
    )


def _finish_endpoint_ns(
    endpoint: str, start_ns: int, current: Span, exc: BaseException | None
) -> None:
    """End the receive span ``current`` (with ``exc`` if the body raised) and, while metrics
    are on, record the endpoint's latency from the span's own clock (``run_endpoint``)."""
    current._end(exc)
    if _metrics.METRICS:
        end_ns = current.end_ns
        elapsed = (end_ns - start_ns) * 1e-9 if end_ns > start_ns else 0.0
        _metrics.record_elapsed(endpoint, elapsed, exc)


def _run_traced_slow(
    cell: Any,
    envelope: Envelope,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``run_endpoint`` traced, for an envelope without a parent, or with the OpenTelemetry
    mirror or a span listener set."""
    started = _perf_counter()
    endpoint = envelope.endpoint
    display = cell.display
    trace = envelope.trace
    current = _start_span(
        endpoint,
        None,
        (trace[:16], trace[16:]) if len(trace) == 24 else None,
        cell.runtime.label,
        display,
        ("receive", display, endpoint, cell.rank),
    )
    token = _CURRENT_SPAN.set(current.trace_id + current.span_id)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _finish_endpoint(endpoint, started, current, exc, _metrics.METRICS)
        raise
    finally:
        _CURRENT_SPAN.reset(token)
    if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
        return _await_endpoint(result, endpoint, started, current, _metrics.METRICS)
    _finish_endpoint(endpoint, started, current, None, _metrics.METRICS)
    return result


async def _await_endpoint(
    awaitable: Awaitable[Any],
    endpoint: str,
    started: float,
    current: Span | None,
    timed: bool,
    span_clock: bool = False,
) -> Any:
    """Await an async endpoint's result inside ``current`` (if any), then end the span and
    record the latency. ``span_clock``: ``current`` started on ``time.time_ns`` and its clock
    gives the latency (``run_endpoint``'s fast path); else ``started`` is a ``perf_counter``."""
    token = _CURRENT_SPAN.set(current.trace_id + current.span_id) if current is not None else None
    try:
        result = await awaitable
    except BaseException as exc:
        if span_clock and current is not None:
            _finish_endpoint_ns(endpoint, current.start_ns, current, exc)
        else:
            _finish_endpoint(endpoint, started, current, exc, timed)
        raise
    finally:
        if token is not None:
            _CURRENT_SPAN.reset(token)
    if span_clock and current is not None:
        _finish_endpoint_ns(endpoint, current.start_ns, current, None)
    else:
        _finish_endpoint(endpoint, started, current, None, timed)
    return result


def time_awaitable(awaitable: Awaitable[Any], endpoint: str, started: float) -> Any:
    """A coroutine awaiting ``awaitable`` (an endpoint body's result, the body having started
    at ``started``, a ``perf_counter``), then recording the endpoint's latency (metrics only:
    ``_runtime.cell``'s inlined timing, for an async result)."""
    return _await_endpoint(awaitable, endpoint, started, None, True)


def _finish_endpoint(
    endpoint: str, started: float, current: Span | None, exc: BaseException | None, timed: bool
) -> None:
    if timed:
        _metrics.record_endpoint(endpoint, started, exc)
    if current is not None:
        current._end(exc)


os.register_at_fork(after_in_child=_after_fork)
