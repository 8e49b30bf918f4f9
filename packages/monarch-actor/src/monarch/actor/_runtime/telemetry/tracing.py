"""Tracing: spans, their ring and listeners, and the trace context that crosses processes.

``span(name)`` (a context manager) and ``@traced`` time an operation; while a span is open it is
the current span, the parent of spans started inside it. The caller's span travels in the CALL
envelope (``outgoing_trace``: 24 bytes, trace id and span id), and the runtime runs each
endpoint in a span whose parent is that one (``wrap_endpoint``), in whatever process it runs:
``wrap_endpoint`` also times the endpoint for ``metrics``. Finished spans go to a bounded ring
(``finished_spans()``) and to listeners (``add_span_listener``); ``chrome_trace()`` renders
them for Perfetto. Spans are made only while ``TRACING`` is on (``enable_telemetry``); while
the OpenTelemetry mirror is on, each span has a twin there (``otel``).
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

import msgspec

from monarch.actor._runtime.context import _current
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import otel as _otel
from monarch.actor._runtime.telemetry.listeners import DEFAULT_RING_CAPACITY, add_listener

if TYPE_CHECKING:
    from monarch.actor._base.envelope import Envelope

__all__ = [
    "MAX_REMOTE_SPANS",
    "Span",
    "SpanRecord",
    "add_remote_spans",
    "add_span_listener",
    "process_label",
    "chrome_trace",
    "finished_spans",
    "has_spans",
    "outgoing_trace",
    "resize",
    "send_span",
    "set_enabled",
    "set_process_label",
    "span",
    "span_records",
    "traced",
    "wrap_endpoint",
]

_log = logging.getLogger("monarch.actor.telemetry")

#: Whether spans are made (set by ``enable_telemetry`` through ``set_enabled``).
TRACING = False


def set_enabled(on: bool) -> None:
    """Turn span making on or off (``enable_telemetry`` calls this)."""
    global TRACING
    TRACING = bool(on)


#: This OS process's id (kept current across forks) and the label of its main process
#: runtime (``"client"``, or a worker's label), which spans made outside any actor carry.
_PID = os.getpid()
_process_label = "client"


def _after_fork() -> None:
    """A forked child (the zygote, a worker forked from it, a program's own fork) starts
    with no spans: those in the ring were its parent's."""
    global _PID, _remote_lock
    _PID = os.getpid()
    _seed_ids()  # after ``random`` reseeded itself (registered first, runs first)
    _spans.clear()
    _remote.clear()
    _remote_lock = threading.Lock()  # it may have been held by a thread that is not here


def set_process_label(label: str) -> None:
    """Name this OS process in traces (a worker's runtime label; the client is ``"client"``)."""
    global _process_label
    _process_label = label


def process_label() -> str:
    """The label spans made outside any actor carry (``set_process_label``)."""
    return _process_label


_CURRENT_SPAN: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "monarch_span", default=None
)
_ZERO_SPAN_ID = bytes(8)


class Span:
    """One timed operation: a name, ids (16-byte trace id, 8-byte span id, parent span id),
    start and end (``time.time_ns()``), attributes, and ``status`` (``"ok"``/``"error"``).
    Where it ran: ``os_pid``, ``proc`` (the process runtime's label: simulated processes share
    an OS process), ``track`` (the actor, ``<root>`` for the client) and ``thread_id``.

    Use it as a context manager (``with span("step"):``); while it is open it is the current
    span, the parent of spans started inside it and of the endpoint spans of calls sent from it.
    """

    __slots__ = (
        "_attributes",
        "_lazy",
        "_otel",
        "_token",
        "end_ns",
        "error",
        "name",
        "os_pid",
        "parent_id",
        "proc",
        "span_id",
        "start_ns",
        "status",
        "thread_id",
        "trace_id",
        "track",
    )

    def __init__(
        self,
        name: str,
        trace_id: bytes,
        span_id: bytes,
        parent_id: bytes,
        attributes: dict[str, Any] | None,
        proc: str = "",
        track: str = "",
        lazy: tuple[Any, ...] | None = None,
    ) -> None:
        self.name = name
        self.os_pid = _PID
        self.proc = proc or _process_label
        self.track = track
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self._attributes = attributes
        self._lazy = lazy
        self.start_ns = time.time_ns()
        self.end_ns = 0
        self.status = "unset"
        self.error = ""
        self.thread_id = threading.get_ident()
        self._token: contextvars.Token[Span | None] | None = None
        self._otel: Any = None

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
        self._token = _CURRENT_SPAN.set(self)
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
            _spans.append(self)
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
        _spans.append(self)
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
#: its span id. Ids need to be unique, not secret: one ``next`` and one ``to_bytes`` per span
#: instead of two random draws (``benchmarks/telemetry_hooks.py``).
_getrandbits = random.getrandbits
_next_id: Callable[[], int]
_trace_prefix = b""


def _seed_ids() -> None:
    global _next_id, _trace_prefix
    _next_id = itertools.count(_getrandbits(62) + 1).__next__
    _trace_prefix = _getrandbits(64).to_bytes(8, "big")


_seed_ids()
_perf_counter = time.perf_counter
_FOLD_AT: Final = _metrics.FOLD_AT
#: Results no endpoint awaits (the receive span's fast path skips ``inspect.isawaitable``).
_PLAIN_RESULTS: Final = frozenset({type(None), int, float, str, bytes, bool, list, dict, tuple})


def _lazy_attributes(lazy: tuple[Any, ...] | None) -> dict[str, Any]:
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
    span_id = _next_id().to_bytes(8, "big")
    if remote_parent is not None:
        trace_id, parent_id = remote_parent
    else:
        parent = _CURRENT_SPAN.get()
        if parent is not None:
            trace_id, parent_id = parent.trace_id, parent.span_id
        else:
            trace_id, parent_id = _trace_prefix + span_id, _ZERO_SPAN_ID
    if _otel._otel_trace is None:  # no mirror: no call
        return Span(name, trace_id, span_id, parent_id, attributes, proc, track, lazy)
    if attributes is None:
        attributes = _lazy_attributes(lazy)
    otel_span, trace_id, span_id = _otel.start_span(name, attributes, trace_id, parent_id, span_id)
    result = Span(name, trace_id, span_id, parent_id, attributes, proc, track)
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
    # ``_start_span`` inlined (one frame less on every call): the caller's span is the parent.
    span_id = _next_id().to_bytes(8, "big")
    parent = _CURRENT_SPAN.get()
    if parent is not None:
        trace_id, parent_id = parent.trace_id, parent.span_id
    else:
        trace_id, parent_id = _trace_prefix + span_id, _ZERO_SPAN_ID
    return _hot_span(
        f"{adverb} {mesh}.{endpoint}", trace_id, span_id, parent_id, runtime.label, display, lazy
    )


_new_span = object.__new__
_time_ns = time.time_ns
_get_ident = threading.get_ident


def _hot_span(
    name: str,
    trace_id: bytes,
    span_id: bytes,
    parent_id: bytes,
    proc: str,
    track: str,
    lazy: tuple[Any, ...],
) -> Span:
    """``Span(name, ..., None, proc, track, lazy)`` without the mirror, minus ``__init__``'s
    keyword handling (the runtime's send and receive spans: one per call each)."""
    result: Span = _new_span(Span)
    result.name = name
    result.os_pid = _PID
    result.proc = proc or _process_label
    result.track = track
    result.trace_id = trace_id
    result.span_id = span_id
    result.parent_id = parent_id
    result._attributes = None
    result._lazy = lazy
    result.start_ns = _time_ns()
    result.end_ns = 0
    result.status = "unset"
    result.error = ""
    result.thread_id = _get_ident()
    result._token = None
    result._otel = None
    return result


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


_spans: collections.deque[Span] = collections.deque(maxlen=DEFAULT_RING_CAPACITY)
_span_listeners: list[Callable[[Span], None]] = []


def finished_spans() -> list[Span]:
    """The most recent finished spans of this process, oldest first (a bounded ring)."""
    return list(_spans)


def add_span_listener(listener: Callable[[Span], None]) -> Callable[[], None]:
    """Call ``listener(span)`` for every span as it finishes (on the finishing thread; keep it
    short). Returns a function that removes the listener."""
    return add_listener(_span_listeners, listener)


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


#: Spans other processes reported to this one (their stop, or a pull), bounded.
MAX_REMOTE_SPANS: Final = 4 * DEFAULT_RING_CAPACITY
_remote: collections.deque[SpanRecord] = collections.deque(maxlen=MAX_REMOTE_SPANS)
_remote_lock = threading.Lock()


def add_remote_spans(records: Sequence[SpanRecord]) -> None:
    """Keep spans another process reported (those made in this OS process are already in the
    ring and are skipped; the oldest are dropped beyond ``MAX_REMOTE_SPANS``)."""
    with _remote_lock:
        _remote.extend(r for r in records if r.os_pid != _PID)


def has_spans() -> bool:
    """Whether any finished span (own or reported) is held here."""
    return bool(_spans) or bool(_remote)


def span_records(*, remote: bool = True) -> list[SpanRecord]:
    """This OS process's finished spans (the ring) and, with ``remote``, those other processes
    reported to it, as records, each span once."""
    out = [SpanRecord.of(s) for s in list(_spans) if s.os_pid == _PID]
    if remote:
        with _remote_lock:
            out.extend(_remote)
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
            for s in (list(_spans) if spans is None else spans)
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
    """Resize the finished-span ring (keeps the newest spans; ``set_ring_capacity``)."""
    global _spans
    _spans = collections.deque(_spans, maxlen=capacity)


def outgoing_trace(kind: int) -> bytes:
    """The trace context to put in an envelope of ``kind`` (CALL only): the current span's."""
    if not TRACING or kind != 1:  # MessageKind.CALL
        return b""
    current = _CURRENT_SPAN.get()
    if current is None:
        return b""
    return current.trace_id + current.span_id


def wrap_endpoint(cell: Any, envelope: Envelope, fn: Callable[..., Any], prop: Any) -> Any:
    """``fn`` timed (metrics) and run in a span (tracing) whose parent is the caller's span.

    Returns a callable with ``fn``'s calling convention: its result is ``fn``'s, or, when that is
    awaitable, a coroutine that awaits it inside the span (async endpoints). The callable is a
    ``functools.partial`` of a module function (made in C: no closure and no cells per call).
    """
    if TRACING and (prop is None or getattr(prop, "_instrument", True)):
        return _partial(_run_traced, cell, envelope, fn)
    if _metrics.METRICS:
        return _partial(_run_timed, envelope.endpoint, fn)
    return fn


_partial = functools.partial


def _run_timed(endpoint: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with its latency recorded (metrics on, tracing off)."""
    started = _perf_counter()
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _metrics.record_endpoint(endpoint, started, exc)
        raise
    if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
        return _await_endpoint(result, endpoint, started, None, True)
    elapsed = _perf_counter() - started
    log = _metrics._latency_logs.get(endpoint)
    if log is None:
        log = _metrics.latency_log(endpoint)
    log.append(elapsed)
    if len(log) >= _FOLD_AT or _metrics._MIRROR:
        _metrics.note_latency(endpoint, log, elapsed)
    return result


def _run_traced(
    cell: Any, envelope: Envelope, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)`` in a receive span whose parent is the caller's span (the ids
    the envelope carries), timed too while metrics are on."""
    started = _perf_counter()
    endpoint = envelope.endpoint
    display = cell.display
    trace = envelope.trace
    lazy = ("receive", display, endpoint, cell.rank)
    current: Span
    if len(trace) == 24 and _otel._otel_trace is None:  # the common case, inlined
        current = _hot_span(
            endpoint,
            trace[:16],
            _next_id().to_bytes(8, "big"),
            trace[16:],
            cell.runtime.label,
            display,
            lazy,
        )
    else:
        current = _start_span(
            endpoint,
            None,
            (trace[:16], trace[16:]) if len(trace) == 24 else None,
            cell.runtime.label,
            display,
            lazy,
        )
    token = _CURRENT_SPAN.set(current)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _finish_endpoint(endpoint, started, current, exc, _metrics.METRICS)
        raise
    finally:
        _CURRENT_SPAN.reset(token)
    if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
        return _await_endpoint(result, endpoint, started, current, _metrics.METRICS)
    if _metrics.METRICS:
        _metrics.record_endpoint(endpoint, started, None)
    if current._otel is None and not _span_listeners and not current.end_ns:
        current.end_ns = _time_ns()  # ``_end`` inlined for the common case
        current.status = "ok"
        _spans.append(current)
    else:
        current._end(None)
    return result


async def _await_endpoint(
    awaitable: Awaitable[Any], endpoint: str, started: float, current: Span | None, timed: bool
) -> Any:
    token = _CURRENT_SPAN.set(current) if current is not None else None
    try:
        result = await awaitable
    except BaseException as exc:
        _finish_endpoint(endpoint, started, current, exc, timed)
        raise
    finally:
        if token is not None:
            _CURRENT_SPAN.reset(token)
    _finish_endpoint(endpoint, started, current, None, timed)
    return result


def _finish_endpoint(
    endpoint: str, started: float, current: Span | None, exc: BaseException | None, timed: bool
) -> None:
    if timed:
        _metrics.record_endpoint(endpoint, started, exc)
    if current is not None:
        current._end(exc)


os.register_at_fork(after_in_child=_after_fork)
