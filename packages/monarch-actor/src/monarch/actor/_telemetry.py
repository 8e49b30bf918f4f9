"""Metrics, tracing spans and supervision event records of the actor runtime.

Why one module: the Monarch 0.2.0 release notes promise three kinds of observability, and all
three hang off the same few places in the runtime (a message sent, a message received, an
endpoint run, an actor failing), so the runtime calls one hook per place and this module decides
what each hook records.

Switches (module attributes read on the hot path, so a disabled hook costs one attribute load
and a branch; ``enable_telemetry`` sets them, and the ``MONARCH_TELEMETRY`` environment variable,
a comma-separated subset of ``metrics,tracing,otel``, sets them at import, which is how worker
processes inherit them):

- ``METRICS``: counters and histograms in the built-in registry (``metrics_snapshot()``): messages
  sent and received by kind, payload bytes, endpoint latency and errors by category, mailbox
  depth at enqueue, client-side call latency, supervision events.
- ``TRACING``: spans (``span(name)``, ``@traced``, one span per endpoint run). The caller's span
  travels in the CALL envelope (24 bytes: trace id and span id), so the endpoint's span is its
  child in another process. Finished spans go to a bounded ring (``finished_spans()``) and to
  listeners; ``chrome_trace()`` renders them for Perfetto.
- ``otel``: if the optional ``opentelemetry-api`` package is importable, instruments and spans are
  mirrored to OpenTelemetry (whatever SDK the program configured exports them). Without it the
  built-in registry is all there is; nothing else is imported (never torch).

Supervision event records are always on (they are rare): every failure, stop, undeliverable
message and unhandled fault becomes a ``SupervisionRecord`` (schema below, ``SCHEMA_VERSION``),
kept in a bounded ring (``supervision_events()``), passed to listeners
(``add_supervision_listener``) and logged as one JSON line on the ``monarch.supervision`` logger
at INFO.

Every store here is bounded: the two rings (``set_ring_capacity``), the series per instrument
(``MAX_SERIES``; later attribute sets share one overflow series), the listeners (``MAX_LISTENERS``).
"""

from __future__ import annotations

import bisect
import collections
import contextvars
import functools
import importlib
import inspect
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

import msgspec

from monarch.actor._base.errors import FailureEvent, error_category
from monarch.actor._runtime.context import _current

if TYPE_CHECKING:
    from monarch.actor._base.envelope import Envelope

__all__ = [
    "MAX_LISTENERS",
    "MAX_SERIES",
    "SCHEMA_VERSION",
    "ChainLink",
    "Counter",
    "Histogram",
    "Meter",
    "MetricPoint",
    "Span",
    "SupervisionRecord",
    "UpDownCounter",
    "add_span_listener",
    "add_supervision_listener",
    "chrome_trace",
    "disable_telemetry",
    "enable_telemetry",
    "finished_spans",
    "get_meter",
    "metrics_snapshot",
    "reset_metrics",
    "set_ring_capacity",
    "span",
    "supervision_events",
    "telemetry_state",
    "traced",
]

_log = logging.getLogger("monarch.actor.telemetry")
_event_log = logging.getLogger("monarch.supervision")

#: Version of the ``SupervisionRecord`` schema; bumped on any incompatible change.
SCHEMA_VERSION: Final = 1
#: Distinct attribute sets per instrument; later ones are counted in one overflow series.
MAX_SERIES: Final = 1024
#: Listeners per kind (supervision records, spans).
MAX_LISTENERS: Final = 64
#: Default capacity of the supervision-record ring and of the finished-span ring.
DEFAULT_RING_CAPACITY: Final = 4096
_OVERFLOW: Final = (("otel.metric.overflow", "true"),)

# Hot-path switches (see the module docstring). ``ACTIVE`` is ``METRICS or TRACING``.
METRICS = False
TRACING = False
ACTIVE = False
_otel_metrics: Any = None
_otel_trace: Any = None

Attributes = Mapping[str, str | int | float | bool] | None
_Key = tuple[tuple[str, str], ...]


def _key(attributes: Attributes) -> _Key:
    if not attributes:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


# ---------------------------------------------------------------------------------------------
# Metrics: a tiny registry with OpenTelemetry's instrument API (add / record with attributes)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One series of one instrument at snapshot time.

    Counters and up-down counters fill ``value``; histograms fill ``count``, ``sum``, ``min``,
    ``max`` and ``buckets`` (``(upper_bound, count)`` pairs, the last bound ``inf``).
    """

    name: str
    kind: str
    unit: str
    attributes: Mapping[str, str]
    value: float = 0.0
    count: int = 0
    sum: float = 0.0
    min: float = 0.0
    max: float = 0.0
    buckets: tuple[tuple[float, int], ...] = ()


class _Instrument:
    kind = "instrument"

    def __init__(self, name: str, unit: str = "", description: str = "") -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self._lock = threading.Lock()
        self._otel: Any = None


class _Sum(_Instrument):
    _monotonic = True

    def __init__(self, name: str, unit: str = "", description: str = "") -> None:
        super().__init__(name, unit, description)
        self._values: dict[_Key, float] = {}

    def add(self, amount: float, attributes: Attributes = None) -> None:
        """Add ``amount`` to the series named by ``attributes``."""
        if self._monotonic and amount < 0:
            raise ValueError(f"counter {self.name!r} cannot decrease (got {amount!r})")
        self._add_key(amount, _key(attributes))

    def _add_key(self, amount: float, key: _Key) -> None:
        with self._lock:
            if key not in self._values and len(self._values) >= MAX_SERIES:
                key = _OVERFLOW
            self._values[key] = self._values.get(key, 0) + amount
        if self._otel is not None:
            self._otel.add(amount, dict(key))

    def _points(self) -> list[MetricPoint]:
        with self._lock:
            items = list(self._values.items())
        return [
            MetricPoint(self.name, self.kind, self.unit, dict(k), value=float(v)) for k, v in items
        ]

    def _reset(self) -> None:
        with self._lock:
            self._values.clear()


class Counter(_Sum):
    """A monotonic sum (``add`` with a negative amount raises ``ValueError``)."""

    kind = "counter"


class UpDownCounter(_Sum):
    """A sum that may go down (``add(-1)``)."""

    kind = "up_down_counter"
    _monotonic = False


class _HistogramSeries:
    __slots__ = ("count", "counts", "max", "min", "sum")

    def __init__(self, nbuckets: int) -> None:
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.counts = [0] * nbuckets


#: Default histogram bounds: powers of two from 1 us to about 67 s (latencies in seconds).
SECONDS_BOUNDS: Final = tuple(1e-6 * 2**i for i in range(27))
#: Byte-size bounds: powers of four from 64 B to 16 GiB.
BYTES_BOUNDS: Final = tuple(float(64 * 4**i) for i in range(15))
#: Depth bounds (mailbox lengths): 0, 1, then powers of two up to 2**20.
DEPTH_BOUNDS: Final = (0.0, *(float(2**i) for i in range(21)))


class Histogram(_Instrument):
    """A distribution: count, sum, min, max and bucket counts per series.

    ``explicit_bucket_boundaries_advisory`` (OpenTelemetry's name) gives the bucket upper bounds
    (sorted, at most 64); the default suits latencies in seconds.
    """

    kind = "histogram"

    def __init__(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> None:
        super().__init__(name, unit, description)
        bounds = tuple(
            float(b)
            for b in (
                SECONDS_BOUNDS
                if explicit_bucket_boundaries_advisory is None
                else explicit_bucket_boundaries_advisory
            )
        )
        if list(bounds) != sorted(bounds) or len(bounds) > 64:
            raise ValueError("histogram bounds must be sorted and at most 64")
        self.bounds = bounds
        self._series: dict[_Key, _HistogramSeries] = {}

    def record(self, amount: float, attributes: Attributes = None) -> None:
        """Record one observation in the series named by ``attributes``."""
        self._record_key(amount, _key(attributes))

    def _record_key(self, amount: float, key: _Key) -> None:
        index = bisect.bisect_left(self.bounds, amount)
        with self._lock:
            series = self._series.get(key)
            if series is None and len(self._series) >= MAX_SERIES:
                key = _OVERFLOW
                series = self._series.get(key)
            if series is None:
                series = self._series[key] = _HistogramSeries(len(self.bounds) + 1)
            series.count += 1
            series.sum += amount
            if amount < series.min:
                series.min = amount
            if amount > series.max:
                series.max = amount
            series.counts[index] += 1
        if self._otel is not None:
            self._otel.record(amount, dict(key))

    def _points(self) -> list[MetricPoint]:
        upper = (*self.bounds, float("inf"))
        out = []
        with self._lock:
            for key, s in self._series.items():
                out.append(
                    MetricPoint(
                        self.name,
                        self.kind,
                        self.unit,
                        dict(key),
                        count=s.count,
                        sum=s.sum,
                        min=s.min,
                        max=s.max,
                        buckets=tuple(zip(upper, s.counts, strict=True)),
                    )
                )
        return out

    def _reset(self) -> None:
        with self._lock:
            self._series.clear()


_instruments: dict[str, _Instrument] = {}
_instruments_lock = threading.Lock()
_meters: dict[str, Meter] = {}

_I = TypeVar("_I", bound=_Instrument)


def _register(instrument: _I) -> _I:
    """Return the registered instrument of that name (creating it once)."""
    with _instruments_lock:
        existing = _instruments.get(instrument.name)
        if existing is not None:
            if type(existing) is not type(instrument):
                raise ValueError(
                    f"instrument {instrument.name!r} already exists as a {existing.kind}"
                )
            return existing
        if len(_instruments) >= MAX_SERIES:
            raise ValueError(f"too many instruments (limit {MAX_SERIES})")
        _instruments[instrument.name] = instrument
        _mirror(instrument)
        return instrument


def _mirror(instrument: _Instrument) -> None:
    if _otel_metrics is None:
        return
    meter = _otel_metrics.get_meter("monarch")
    try:
        if isinstance(instrument, Histogram):
            instrument._otel = meter.create_histogram(
                instrument.name, instrument.unit, instrument.description
            )
        elif isinstance(instrument, UpDownCounter):
            instrument._otel = meter.create_up_down_counter(
                instrument.name, instrument.unit, instrument.description
            )
        else:
            instrument._otel = meter.create_counter(
                instrument.name, instrument.unit, instrument.description
            )
    except Exception:  # an SDK may reject a name; the built-in registry still counts
        _log.warning("could not mirror instrument %s to OpenTelemetry", instrument.name)


class Meter:
    """Creates instruments (OpenTelemetry's ``Meter`` API); same name, same instrument."""

    def __init__(self, name: str, version: str | None = None) -> None:
        self.name = name
        self.version = version

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        """A monotonic counter."""
        return _register(Counter(name, unit, description))

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> UpDownCounter:
        """A counter that may decrease."""
        return _register(UpDownCounter(name, unit, description))

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> Histogram:
        """A histogram (bounds as in ``Histogram``)."""
        return _register(Histogram(name, unit, description, explicit_bucket_boundaries_advisory))


def get_meter(name: str, version: str | None = None) -> Meter:
    """The meter called ``name`` (``monarch.actor.get_meter``). Instruments are process-wide:
    a name means one instrument whichever meter created it."""
    with _instruments_lock:
        meter = _meters.get(name)
        if meter is None:
            if len(_meters) >= MAX_SERIES:
                raise ValueError(f"too many meters (limit {MAX_SERIES})")
            meter = _meters[name] = Meter(name, version)
        return meter


def metrics_snapshot(prefix: str = "") -> dict[str, list[MetricPoint]]:
    """Every series of every instrument whose name starts with ``prefix``, by name."""
    with _instruments_lock:
        instruments = [i for n, i in _instruments.items() if n.startswith(prefix)]
    out: dict[str, list[MetricPoint]] = {}
    for instrument in instruments:
        points = instrument._points()  # type: ignore[attr-defined]
        if points:
            out[instrument.name] = points
    return out


def reset_metrics() -> None:
    """Forget every recorded value (instruments stay registered)."""
    with _instruments_lock:
        instruments = list(_instruments.values())
    for instrument in instruments:
        instrument._reset()  # type: ignore[attr-defined]


# The runtime's own instruments.
_meter = get_meter("monarch.actor")
_sent = _meter.create_counter("monarch.messages.sent", "{message}", "envelopes sent, by kind")
_received = _meter.create_counter(
    "monarch.messages.received", "{message}", "envelopes received, by kind"
)
_payload = _meter.create_histogram(
    "monarch.messages.payload_size",
    "By",
    "pickle stream plus out-of-band buffers of each sent envelope, by kind",
    explicit_bucket_boundaries_advisory=BYTES_BOUNDS,
)
_latency = _meter.create_histogram(
    "monarch.endpoint.latency", "s", "time in the endpoint body (server side), by endpoint"
)
_errors = _meter.create_counter(
    "monarch.endpoint.errors", "{error}", "endpoint bodies that raised, by endpoint and category"
)
_depth = _meter.create_histogram(
    "monarch.mailbox.depth",
    "{message}",
    "items already queued in the actor's mailbox when a message is added",
    explicit_bucket_boundaries_advisory=DEPTH_BOUNDS,
)
_call_latency = _meter.create_histogram(
    "monarch.client.call_latency",
    "s",
    "reply port opened to last reply received (client side of call, call_one, choose)",
)
_supervision = _meter.create_counter(
    "monarch.supervision.events", "{event}", "supervision records, by event and category"
)
# Series keys of the per-kind series, computed once (kind is a small IntEnum).
_KIND_KEYS: dict[int, _Key] = {}


def _kind_key(kind: int) -> _Key:
    key = _KIND_KEYS.get(kind)
    if key is None:
        key = _KIND_KEYS[kind] = (("kind", getattr(kind, "name", str(kind)).lower()),)
    return key


# -- hooks the runtime calls (only when ACTIVE) ------------------------------------------------
def on_sent(envelope: Envelope) -> None:
    """An envelope left this process's runtime (sender thread)."""
    if METRICS:
        key = _kind_key(envelope.kind)
        sizes = envelope.buffer_sizes
        _sent._add_key(1, key)
        _payload._record_key(len(envelope.payload) + (sum(sizes) if sizes else 0), key)


def on_received(envelope: Envelope) -> None:
    """An envelope reached this process's runtime (runtime loop thread)."""
    if METRICS:
        _received._add_key(1, _kind_key(envelope.kind))


def on_enqueued(depth: int) -> None:
    """A message was added to a mailbox that already held ``depth`` items."""
    if METRICS:
        _depth._record_key(depth, ())


_opened: collections.OrderedDict[tuple[int, int], float] = collections.OrderedDict()
_opened_lock = threading.Lock()
#: Reply ports whose opening time is remembered (ports that never complete are forgotten).
MAX_TRACKED_PORTS: Final = 65_536


def on_port_opened(owner: object, index: int) -> None:
    """Port ``index`` of process runtime ``owner`` was opened: remember when."""
    if METRICS:
        with _opened_lock:
            _opened[(id(owner), index)] = time.perf_counter()
            if len(_opened) > MAX_TRACKED_PORTS:
                _opened.popitem(last=False)


def on_port_completed(owner: object, index: int) -> None:
    """Port ``index`` of ``owner`` received its last reply: record the call latency."""
    with _opened_lock:
        opened = _opened.pop((id(owner), index), None)
    if METRICS and opened is not None:
        _call_latency._record_key(time.perf_counter() - opened, ())


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
    timed = METRICS

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
        _latency.record(time.perf_counter() - started, {"endpoint": endpoint})
        if exc is not None:
            _errors.add(1, {"endpoint": endpoint, "category": str(error_category(exc))})
    if current is not None:
        current._end(exc)


# ---------------------------------------------------------------------------------------------
# Tracing
# ---------------------------------------------------------------------------------------------
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
            with _suppress_all():
                if exc is not None:
                    self._otel.record_exception(exc)
                    self._otel.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR))
                self._otel.end()
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


class _suppress_all:
    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, exc: object, tb: object) -> bool:
        return True


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
    otel_span = None
    if _otel_trace is not None:
        otel_span, trace_id, span_id = _otel_start(name, attributes, trace_id, parent_id, span_id)
    result = Span(name, trace_id, span_id, parent_id, attributes)
    result._otel = otel_span
    return result


def _otel_start(
    name: str, attributes: dict[str, Any], trace_id: bytes, parent_id: bytes, span_id: bytes
) -> tuple[Any, bytes, bytes]:
    """Start the OpenTelemetry twin of a span; adopt its ids when an SDK assigns real ones."""
    trace = _otel_trace
    context = None
    if parent_id != _ZERO_SPAN_ID:
        parent = trace.SpanContext(
            trace_id=int.from_bytes(trace_id, "big"),
            span_id=int.from_bytes(parent_id, "big"),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    try:
        otel_span = trace.get_tracer("monarch").start_span(
            name, context=context, attributes=attributes
        )
    except Exception:
        return None, trace_id, span_id
    ctx = otel_span.get_span_context()
    if ctx.is_valid:
        return otel_span, ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")
    return otel_span, trace_id, span_id


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
    return _add_listener(_span_listeners, listener)


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


# ---------------------------------------------------------------------------------------------
# Supervision event records
# ---------------------------------------------------------------------------------------------
class ChainLink(msgspec.Struct, frozen=True, kw_only=True):
    """One link of a failure's causal chain (newest first in ``SupervisionRecord.chain``)."""

    actor: str
    actor_id: str
    category: str
    kind: str
    reason: str


class SupervisionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A supervision event as a structured record (schema version ``SCHEMA_VERSION``).

    Fields: ``version``; ``seq`` (per-process sequence number, for incremental reads);
    ``event`` (``actor_failed``, ``actor_stopped``, ``supervision_received``,
    ``unhandled_fault``, ``undeliverable``); ``timestamp`` (Unix seconds when recorded);
    ``proc`` (label of the recording process); ``actor`` (readable creation chain),
    ``actor_id`` (PID hex / actor path), ``mesh_name``, ``rank``; ``category`` (``user``,
    ``system``, ``infrastructure``) and ``kind`` (``failed``, ``stopped``, ``unhealthy``,
    ``undeliverable``) of the event; ``reason``; ``chain`` (the causal chain, newest first,
    the event itself included); ``root_cause`` (headline of the first triggering event).
    """

    version: int = SCHEMA_VERSION
    seq: int
    event: str
    timestamp: float
    proc: str
    actor: str
    actor_id: str
    mesh_name: str
    rank: int
    category: str
    kind: str
    reason: str
    chain: tuple[ChainLink, ...]
    root_cause: str

    @classmethod
    def from_event(
        cls, event: str, failure: FailureEvent, proc: str, seq: int, timestamp: float
    ) -> SupervisionRecord:
        """The record of ``failure`` observed as ``event`` in process ``proc``."""
        chain = failure.chain()
        return cls(
            seq=seq,
            event=event,
            timestamp=timestamp,
            proc=proc,
            actor=failure.actor,
            actor_id=failure.actor_id,
            mesh_name=failure.mesh_name,
            rank=failure.rank,
            category=failure.category,
            kind=failure.kind,
            reason=failure.reason,
            chain=tuple(
                ChainLink(
                    actor=e.actor,
                    actor_id=e.actor_id,
                    category=e.category,
                    kind=e.kind,
                    reason=e.reason,
                )
                for e in chain
            ),
            root_cause=chain[-1].headline(),
        )

    def to_json(self) -> str:
        """The record as one line of JSON (what the ``monarch.supervision`` logger emits)."""
        return msgspec.json.encode(self).decode()


_records: collections.deque[SupervisionRecord] = collections.deque(maxlen=DEFAULT_RING_CAPACITY)
_records_lock = threading.Lock()
_record_seq = itertools.count(1)
_record_listeners: list[Callable[[SupervisionRecord], None]] = []
_listeners_lock = threading.Lock()


def record_supervision(
    event: str, failure: FailureEvent, proc: str, now: float | None = None
) -> SupervisionRecord:
    """Record ``failure`` as a supervision ``event`` seen in process ``proc`` (runtime hook):
    ring, listeners, metrics, and one JSON line on the ``monarch.supervision`` logger."""
    with _records_lock:
        record = SupervisionRecord.from_event(
            event, failure, proc, next(_record_seq), time.time() if now is None else now
        )
        _records.append(record)
    if METRICS:
        _supervision.add(1, {"event": event, "category": failure.category})
    if _event_log.isEnabledFor(logging.INFO):
        _event_log.info(record.to_json())
    for listener in tuple(_record_listeners):
        try:
            listener(record)
        except Exception:
            _log.exception("supervision listener %r raised", listener)
    return record


def supervision_events(after: int = 0) -> list[SupervisionRecord]:
    """Recorded supervision events of this process with ``seq > after``, oldest first (a
    bounded ring: the oldest are dropped first). Poll with the last ``seq`` seen."""
    with _records_lock:
        return [r for r in _records if r.seq > after]


def iter_supervision_events(after: int = 0) -> Iterator[SupervisionRecord]:
    """Iterate over ``supervision_events(after)`` (a snapshot)."""
    return iter(supervision_events(after))


def add_supervision_listener(
    listener: Callable[[SupervisionRecord], None],
) -> Callable[[], None]:
    """Call ``listener(record)`` for every supervision record as it is made (on the thread
    that records it, a runtime thread: keep it short, never block). Returns a remover."""
    return _add_listener(_record_listeners, listener)


def _add_listener(listeners: list[Any], listener: Any) -> Callable[[], None]:
    with _listeners_lock:
        if len(listeners) >= MAX_LISTENERS:
            raise ValueError(f"too many listeners (limit {MAX_LISTENERS})")
        listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in listeners:
                listeners.remove(listener)

    return remove


def set_ring_capacity(capacity: int) -> None:
    """Resize the supervision-record and finished-span rings (keeps the newest entries)."""
    global _records, _spans
    if capacity < 1:
        raise ValueError("ring capacity must be at least 1")
    with _records_lock:
        _records = collections.deque(_records, maxlen=capacity)
        _spans = collections.deque(_spans, maxlen=capacity)


# ---------------------------------------------------------------------------------------------
# Switches
# ---------------------------------------------------------------------------------------------
def enable_telemetry(metrics: bool = True, tracing: bool = True, otel: bool = False) -> None:
    """Turn metrics and tracing on or off in this process (worker processes read
    ``MONARCH_TELEMETRY``, which this also sets so that workers spawned later inherit it).

    ``otel=True`` mirrors instruments and spans to OpenTelemetry; it needs the optional
    ``opentelemetry-api`` package (``ImportError`` otherwise).
    """
    global METRICS, TRACING, ACTIVE, _otel_metrics, _otel_trace
    if otel:
        # Imported by name: the package is an optional extra without type stubs here.
        otel_metrics = importlib.import_module("opentelemetry.metrics")
        otel_trace = importlib.import_module("opentelemetry.trace")
        _otel_metrics, _otel_trace = otel_metrics, otel_trace
        with _instruments_lock:
            instruments = list(_instruments.values())
        for instrument in instruments:
            if instrument._otel is None:
                _mirror(instrument)
    else:
        _otel_metrics = _otel_trace = None
        with _instruments_lock:
            for instrument in _instruments.values():
                instrument._otel = None
    METRICS, TRACING = bool(metrics), bool(tracing)
    ACTIVE = METRICS or TRACING
    parts = [n for n, on in (("metrics", METRICS), ("tracing", TRACING), ("otel", otel)) if on]
    if ACTIVE:
        os.environ["MONARCH_TELEMETRY"] = ",".join(parts)
    else:
        os.environ.pop("MONARCH_TELEMETRY", None)


def disable_telemetry() -> None:
    """Turn metrics, tracing and the OpenTelemetry mirror off."""
    enable_telemetry(metrics=False, tracing=False, otel=False)


def telemetry_state() -> dict[str, bool]:
    """Which switches are on: ``{"metrics": ..., "tracing": ..., "otel": ...}``."""
    return {"metrics": METRICS, "tracing": TRACING, "otel": _otel_trace is not None}


def _from_environment() -> None:
    raw = os.environ.get("MONARCH_TELEMETRY", "")
    parts = {p.strip().lower() for p in raw.split(",") if p.strip()}
    unknown = parts - {"metrics", "tracing", "otel"}
    if unknown:
        _log.warning("MONARCH_TELEMETRY: unknown parts %s ignored", sorted(unknown))
    if not parts & {"metrics", "tracing"}:
        return
    otel = "otel" in parts
    try:
        enable_telemetry("metrics" in parts, "tracing" in parts, otel)
    except ImportError:
        _log.warning("MONARCH_TELEMETRY asks for otel but opentelemetry-api is not installed")
        enable_telemetry("metrics" in parts, "tracing" in parts, False)


_from_environment()
