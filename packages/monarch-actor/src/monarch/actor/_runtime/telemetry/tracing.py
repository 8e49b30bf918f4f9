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
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

from monarch.actor._runtime.context import _current
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import otel as _otel
from monarch.actor._runtime.telemetry.listeners import DEFAULT_RING_CAPACITY, add_listener

if TYPE_CHECKING:
    from monarch.actor._base.envelope import Envelope

__all__ = [
    "Span",
    "add_span_listener",
    "chrome_trace",
    "finished_spans",
    "outgoing_trace",
    "resize",
    "set_enabled",
    "span",
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


_CURRENT_SPAN: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "monarch_span", default=None
)
_ZERO_SPAN_ID = bytes(8)


class Span:
    """One timed operation: a name, ids (16-byte trace id, 8-byte span id, parent span id),
    start and end (``time.time_ns()``), attributes, and ``status`` (``"ok"``/``"error"``).

    Use it as a context manager (``with span("step"):``); while it is open it is the current
    span, the parent of spans started inside it and of the endpoint spans of calls sent from it.
    """

    __slots__ = (
        "_otel",
        "_token",
        "attributes",
        "end_ns",
        "error",
        "name",
        "parent_id",
        "span_id",
        "start_ns",
        "status",
        "thread_id",
        "trace_id",
    )

    def __init__(
        self,
        name: str,
        trace_id: bytes,
        span_id: bytes,
        parent_id: bytes,
        attributes: dict[str, Any],
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.attributes = attributes
        self.start_ns = time.time_ns()
        self.end_ns = 0
        self.status = "unset"
        self.error = ""
        self.thread_id = threading.get_ident()
        self._token: contextvars.Token[Span | None] | None = None
        self._otel: Any = None

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        """Attach ``key=value`` (at most 64 attributes; more are ignored)."""
        if len(self.attributes) < 64 or key in self.attributes:
            self.attributes[key] = value
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
        if self._token is not None:
            _CURRENT_SPAN.reset(self._token)
            self._token = None
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


def _random_bytes(n: int) -> bytes:
    """Random ids, as OpenTelemetry's SDK makes them (``random``, not a system call: ids
    need to be unique, not secret)."""
    return random.getrandbits(8 * n).to_bytes(n, "big")


def _parent_from(trace: bytes) -> tuple[bytes, bytes] | None:
    if len(trace) == 24:
        return trace[:16], trace[16:]
    return None


def _start_span(
    name: str, attributes: dict[str, Any], remote_parent: tuple[bytes, bytes] | None = None
) -> Span:
    if remote_parent is not None:
        trace_id, parent_id = remote_parent
    else:
        parent = _CURRENT_SPAN.get()
        if parent is not None:
            trace_id, parent_id = parent.trace_id, parent.span_id
        else:
            trace_id, parent_id = _random_bytes(16), _ZERO_SPAN_ID
    span_id = _random_bytes(8)
    otel_span, trace_id, span_id = _otel.start_span(name, attributes, trace_id, parent_id, span_id)
    result = Span(name, trace_id, span_id, parent_id, attributes)
    result._otel = otel_span
    return result


def span(name: str, attributes: Mapping[str, Any] | None = None) -> Span | _NoSpan:
    """A span named ``name`` (use with ``with``); a no-op object while tracing is off."""
    if not TRACING:
        return _NO_SPAN
    attrs: dict[str, Any] = dict(attributes) if attributes else {}

    ctx = _current()
    if ctx is not None:
        attrs.setdefault("actor", str(ctx.actor_instance))
    return _start_span(name, attrs)


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


def chrome_trace(spans: Sequence[Span] | None = None) -> dict[str, Any]:
    """``spans`` (default: the ring) in the Chrome trace-event JSON format that Perfetto and
    ``chrome://tracing`` open: one complete (``"ph": "X"``) event per span, microseconds."""
    pid = os.getpid()
    events = []
    for s in finished_spans() if spans is None else spans:
        events.append(
            {
                "name": s.name,
                "ph": "X",
                "ts": s.start_ns / 1000,
                "dur": max(0, s.end_ns - s.start_ns) / 1000,
                "pid": pid,
                "tid": s.thread_id,
                "args": {
                    **dict(s.attributes.items()),
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_id": s.parent_id.hex(),
                    "status": s.status,
                    **({"error": s.error} if s.error else {}),
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


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
    awaitable, a coroutine that awaits it inside the span (async endpoints).
    """
    endpoint = envelope.endpoint
    traced_call = TRACING and (prop is None or getattr(prop, "_instrument", True))
    timed = _metrics.METRICS

    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        current: Span | None = None
        token = None
        if traced_call:
            current = _start_span(
                endpoint,
                {"actor": str(cell.display), "endpoint": endpoint, "rank": int(cell.rank)},
                _parent_from(envelope.trace),
            )
            token = _CURRENT_SPAN.set(current)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _finish_endpoint(endpoint, started, current, exc, timed)
            raise
        finally:
            if token is not None:
                _CURRENT_SPAN.reset(token)
        if inspect.isawaitable(result):
            return _await_endpoint(result, endpoint, started, current, timed)
        _finish_endpoint(endpoint, started, current, None, timed)
        return result

    return run


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
