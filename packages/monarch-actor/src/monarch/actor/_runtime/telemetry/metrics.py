"""Metrics: a small registry with OpenTelemetry's instrument API, and the runtime's own.

``get_meter(name).create_counter`` / ``create_up_down_counter`` / ``create_histogram`` make
process-wide instruments (one per name); ``add`` / ``record`` take attributes, and each
distinct attribute set is a series (``MAX_SERIES`` per instrument; later sets share one overflow
series). ``metrics_snapshot()`` reads every series, ``reset_metrics()`` clears them.

The runtime's instruments (messages sent and received by kind, payload bytes, endpoint latency
and errors by category, mailbox depth at enqueue, client-side call latency, supervision events)
are fed by the hooks at the end of this module, which the runtime calls only while telemetry is
on (``telemetry.ACTIVE``); each records only while ``METRICS`` is on (``enable_telemetry``).
While the OpenTelemetry mirror is on, every instrument also feeds its twin (``otel``).

Cost: a hook takes no lock and builds no histogram. It appends its raw observation (a sent
envelope's kind and payload size as one int, a deep mailbox's depth, a latency in seconds) to a
bounded log of this module (one ``list.append``, atomic under the GIL), or, for what has few
values (a received envelope's kind, a mailbox depth below ``SMALL_DEPTHS``, both at once for a
received call, ``call_depth_counters``, a sent envelope's kind and size: ``sent_counters``, the
first ``MAX_SENT_CODES`` sizes), ticks a counter of that value (``next`` of an
``itertools.count``, one C call, atomic under the GIL: no log entry, no bound to check, nothing
to fold per observation). The logs and counters are folded into the instruments (counts by kind,
histogram buckets, sums, minima and maxima) under the instruments' lock by ``_fold``: when a log
reaches ``FOLD_AT`` entries (so each holds at most that many), and before every
``metrics_snapshot`` and ``reset_metrics``, so a snapshot sees every observation made before it.
Folding a batch costs little per observation: sizes and depths repeat (counted with
``collections.Counter``, in C), latencies are sorted once and their buckets found with one
``bisect`` per bucket bound. The runtime does what ``on_sent``, ``on_received``,
``on_enqueued``, ``call_opened`` and ``call_completed`` do inline (``_runtime.proc``: no frame
per envelope), and times a sync actor's endpoint bodies inline with metrics alone
(``_runtime.cell``: no ``run_endpoint`` frame per call), unless ``HOOKS`` is set (the mirror, a
profiler); a call's latency starts on its reply port's sink (``call_opened``), so nothing is
keyed by port (``on_port_opened`` and ``on_port_completed`` keep such a table for other callers:
only evicting its oldest entry takes a lock). While the OpenTelemetry mirror is on, each hook
also feeds the twins at once (an exporter wants its data when it happens).
``benchmarks/actor_telemetry.py`` measures the hooks' cost on real calls,
``benchmarks/telemetry_hooks.py`` the hook code alone.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from monarch.actor._base.envelope import MessageKind
from monarch.actor._base.errors import error_category
from monarch.actor._runtime.telemetry import otel as _otel

if TYPE_CHECKING:
    from monarch.actor._base.envelope import Envelope

__all__ = [
    "BYTES_BOUNDS",
    "DEPTH_BOUNDS",
    "FOLD_AT",
    "MAX_SERIES",
    "MAX_TRACKED_PORTS",
    "SECONDS_BOUNDS",
    "Counter",
    "CallOpened",
    "Histogram",
    "Meter",
    "MetricPoint",
    "UpDownCounter",
    "add_switch_listener",
    "call_completed",
    "call_opened",
    "descriptions",
    "instrument_specs",
    "get_meter",
    "latency_log",
    "metrics_snapshot",
    "note_latency",
    "on_enqueued",
    "on_port_completed",
    "on_port_opened",
    "on_received",
    "on_sent",
    "on_supervision",
    "record_elapsed",
    "record_endpoint",
    "reset_metrics",
    "set_enabled",
    "set_hooks",
    "set_mirrored",
    "switched",
]

#: Distinct attribute sets per instrument; later ones are counted in one overflow series.
MAX_SERIES: Final = 1024
_OVERFLOW: Final = (("otel.metric.overflow", "true"),)

#: Whether the runtime's hooks record (set by ``enable_telemetry`` through ``set_enabled``).
METRICS = False

Attributes = Mapping[str, str | int | float | bool] | None
_Key = tuple[tuple[str, str], ...]


def _key(attributes: Attributes) -> _Key:
    if not attributes:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


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
            self._add_locked(amount, key)
        if self._otel is not None:
            self._otel.add(amount, dict(key))

    def _add_locked(self, amount: float, key: _Key) -> None:
        """``_add_key`` without the mirror, the caller holding ``_lock``."""
        values = self._values
        if key not in values and len(values) >= MAX_SERIES:
            key = _OVERFLOW
        values[key] = values.get(key, 0) + amount

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
    __slots__ = ("counts", "max", "min", "sum")

    def __init__(self, nbuckets: int) -> None:
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
        with self._lock:
            self._record_locked(amount, key)
        if self._otel is not None:
            self._otel.record(amount, dict(key))

    def _record_locked(self, amount: float, key: _Key) -> None:
        """``_record_key`` without the mirror, the caller holding ``_lock``."""
        series = self._series_locked(key)
        series.counts[bisect.bisect_left(self.bounds, amount)] += 1  # count: their sum
        series.sum += amount
        if amount < series.min:
            series.min = amount
        if amount > series.max:
            series.max = amount

    def _series_locked(self, key: _Key) -> _HistogramSeries:
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= MAX_SERIES:
                key = _OVERFLOW
                series = self._series.get(key)
            if series is None:
                series = self._series[key] = _HistogramSeries(len(self.bounds) + 1)
        return series

    def _record_counted_locked(self, amount: float, times: int, key: _Key) -> None:
        """``times`` observations of ``amount`` at once, the caller holding ``_lock``."""
        series = self._series_locked(key)
        series.counts[bisect.bisect_left(self.bounds, amount)] += times
        series.sum += amount * times
        if amount < series.min:
            series.min = amount
        if amount > series.max:
            series.max = amount

    def _record_many_locked(self, values: list[float], key: _Key) -> None:
        """Every observation of ``values`` (sorted here, in place), the caller holding
        ``_lock``: the same counts as one ``_record_locked`` each, one ``bisect`` per bound."""
        if not values:
            return
        series = self._series_locked(key)
        values.sort()
        bounds, counts = self.bounds, series.counts
        first = bisect.bisect_left(bounds, values[0])
        last = bisect.bisect_left(bounds, values[-1])
        lo = 0
        for i in range(first, last):  # bucket i: bounds[i - 1] < value <= bounds[i]
            hi = bisect.bisect_right(values, bounds[i], lo)
            counts[i] += hi - lo
            lo = hi
        counts[last] += len(values) - lo
        series.sum += sum(values)
        if values[0] < series.min:
            series.min = values[0]
        if values[-1] > series.max:
            series.max = values[-1]

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
                        count=sum(s.counts),
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
    instrument._otel = _otel.instrument(
        instrument.kind, instrument.name, instrument.unit, instrument.description
    )


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
    _fold()
    with _instruments_lock:
        instruments = [i for n, i in _instruments.items() if n.startswith(prefix)]
    out: dict[str, list[MetricPoint]] = {}
    for instrument in instruments:
        points = instrument._points()  # type: ignore[attr-defined]
        if points:
            out[instrument.name] = points
    return out


def descriptions() -> dict[str, str]:
    """Every registered instrument's description, by name (``# HELP`` of the Prometheus text)."""
    with _instruments_lock:
        return {n: i.description for n, i in _instruments.items() if i.description}


def instrument_specs() -> list[tuple[str, str, str, str]]:
    """``(name, kind, unit, description)`` of every registered instrument."""
    with _instruments_lock:
        return [(n, i.kind, i.unit, i.description) for n, i in _instruments.items()]


def reset_metrics() -> None:
    """Forget every recorded value (instruments stay registered)."""
    with _HOOK_LOCK:
        _sent_log.clear()
        _depth_log.clear()
        for counters, seen in (
            (_received_counters, _received_seen),
            (_depth_counters, _depth_seen),
            (_call_depth_counters, _call_depth_seen),
        ):
            for i, counter in enumerate(counters):
                seen[i] = _count_of(counter)
        for sizes in _sent_counters:
            for size, counter in sizes.items():
                sizes.seen[size] = _count_of(counter)
        for logs in (_latency_logs, _call_logs):
            for log in list(logs.values()):
                log.clear()
    with _instruments_lock:
        instruments = list(_instruments.values())
    for instrument in instruments:
        instrument._reset()  # type: ignore[attr-defined]


def set_mirrored(on: bool) -> None:
    """Give every registered instrument its OpenTelemetry twin (``on``; the mirror must be
    loaded) or drop the twins; instruments registered later follow the mirror's state."""
    global _MIRROR
    _MIRROR = bool(on)
    set_hooks(_MIRROR)
    with _instruments_lock:
        instruments = list(_instruments.values())
    for instrument in instruments:
        if not on:
            instrument._otel = None
        elif instrument._otel is None:
            _mirror(instrument)


def set_enabled(on: bool) -> None:
    """Turn the runtime's metric hooks on or off (``enable_telemetry`` calls this)."""
    global METRICS
    METRICS = bool(on)
    if not METRICS:
        _opened.clear()  # calls opened while on are not timed once it is off
    switched()


def set_hooks(on: bool) -> None:
    """Make the runtime call the hooks (``on_sent``, ...) rather than record inline (``HOOKS``:
    the mirror sets it, a profiler may)."""
    global HOOKS
    HOOKS = bool(on)
    switched()


#: Told (called) whenever a switch changes (``switched``): the runtime's modules keep the
#: switches their hot paths test as module globals of their own (one ``LOAD_GLOBAL`` each,
#: and one test where ``METRICS`` and ``HOOKS`` were two), rebound by their listener.
_switch_listeners: list[Callable[[], None]] = []


def add_switch_listener(listener: Callable[[], None]) -> None:
    """Call ``listener()`` now and whenever ``METRICS``, ``HOOKS`` or the tracing switch
    changes (``switched``); it reads the switches it needs."""
    _switch_listeners.append(listener)
    listener()


def switched() -> None:
    """A switch changed (``set_enabled``, ``set_hooks``, ``tracing.set_enabled``): tell the
    listeners (``add_switch_listener``)."""
    for listener in list(_switch_listeners):
        listener()


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
    "reply port opened to last reply received (client side of call, call_one, choose, "
    "stream), by endpoint",
)
_supervision = _meter.create_counter(
    "monarch.supervision.events", "{event}", "supervision records, by event and category"
)
# The hooks below update the runtime's instruments under one lock (one acquisition per hook,
# not one per instrument): they share it.
_HOOK_LOCK = _sent._lock
for _shared in (_received, _payload, _depth, _latency, _call_latency):
    _shared._lock = _HOOK_LOCK
del _shared
# Series keys of the per-kind series, computed once (kind is a small IntEnum).
_KIND_KEYS: dict[int, _Key] = {}


def _kind_key(kind: int) -> _Key:
    key = _KIND_KEYS.get(kind)
    if key is None:
        with contextlib.suppress(ValueError):
            kind = MessageKind(kind)  # a plain int from the sent log: named by its kind
        key = _KIND_KEYS[kind] = (("kind", getattr(kind, "name", str(kind)).lower()),)
    return key


# -- hooks the runtime calls (only while telemetry is ACTIVE) ---------------------------------
#: Whether the OpenTelemetry mirror is on (``set_mirrored``): the hooks then feed the twins too.
_MIRROR = False
#: Whether the runtime must call ``on_sent``, ``on_received``, ``on_enqueued``, ``call_opened``
#: and ``call_completed`` rather than do what they do itself (``_runtime.proc`` inlines them:
#: one frame less each, per envelope or call): while the mirror is on (``set_mirrored``), or
#: when a profiler times those hooks (``set_hooks``: assigning it directly would not reach
#: the runtime's copies, ``add_switch_listener``).
HOOKS = False
#: Entries a raw log holds before the hook that fills it folds every log (``_fold``).
FOLD_AT: Final = 4096
#: Raw observations not yet folded (see the module docstring): the kind and payload size of
#: each sent envelope as one int (``size << _KIND_BITS | kind``: no tuple per envelope), the
#: mailbox depths of ``SMALL_DEPTHS`` and more at an enqueue, and the latencies in seconds of
#: endpoint bodies and of calls, by endpoint name (at most ``MAX_SERIES`` names each; later
#: names share the overflow log).
_sent_log: list[int] = []
_KIND_BITS: Final = 4
_KIND_MASK: Final = (1 << _KIND_BITS) - 1
assert max(MessageKind) <= _KIND_MASK
#: A sent envelope's kind and payload size are counted, like a received kind (a program's
#: messages mostly repeat their kinds and sizes): one table per kind (``sent_counters[kind]``, a
#: ``_SentSizes``) of an ``itertools.count`` per payload size, ticked by
#: ``next(sent_counters[kind][size])`` (two subscripts and one C call per envelope, nothing to
#: fold per observation: counting a log cost about 65 ns an entry at each fold, and one code per
#: envelope, ``size << _KIND_BITS | kind``, cost three integer objects). A size seen first gets
#: its counter from the table's ``__missing__``; at most ``MAX_SENT_CODES`` sizes (of all kinds)
#: are counted, later ones are logged as codes (and ``on_sent``, the hook, logs every envelope).
MAX_SENT_CODES: Final = 256


class _SentSizes(dict[int, "itertools.count[int]"]):
    """One message kind's sent-size counters (``sent_counters``): a size seen first gets its
    counter (``__missing__``), or, past ``MAX_SENT_CODES``, is logged (a spare counter ticked
    instead)."""

    __slots__ = ("kind", "seen")

    def __init__(self, kind: int) -> None:
        super().__init__()
        self.kind = kind
        #: What each counter had counted when ``_fold`` last read it.
        self.seen: dict[int, int] = {}

    def __missing__(self, size: int) -> itertools.count[int]:
        global _sent_codes
        if _sent_codes < MAX_SENT_CODES:  # (past the bound: no lock taken per send)
            with _HOOK_LOCK:  # (``_fold`` reads the tables under it)
                counter = self.get(size)
                if counter is not None:  # another thread made it meanwhile
                    return counter
                if _sent_codes < MAX_SENT_CODES:
                    _sent_codes += 1
                    self.seen[size] = 0  # (before the counter is seen by the senders)
                    counter = self[size] = itertools.count()
                    return counter
        _sent_log.append(size << _KIND_BITS | self.kind)
        if len(_sent_log) >= FOLD_AT:
            _fold()
        return _SPARE


_SPARE: Final = itertools.count()  # ticked for a logged size, never read
sent_counters: Final = [_SentSizes(kind) for kind in range(_KIND_MASK + 1)]
_sent_counters = sent_counters


_sent_codes = 0  # sizes counted, of every kind (under ``_HOOK_LOCK``)


def _sent_codes_counted() -> int:
    """How many sent kinds and sizes are counted rather than logged (``sent_counters``)."""
    return sum(len(sizes) for sizes in _sent_counters)


def _forget_sent_codes() -> None:
    """Forget every counted sent size (after a fold: for tests of the bound)."""
    global _sent_codes
    _fold()
    with _HOOK_LOCK:
        for sizes in _sent_counters:
            sizes.clear()
            sizes.seen.clear()
        _sent_codes = 0


_depth_log: list[int] = []
#: Envelopes received by kind, and mailbox depths below ``SMALL_DEPTHS`` by depth, are counted,
#: not logged: one ``itertools.count`` per kind and per depth (``received_counters``,
#: ``depth_counters``), ticked by ``next(counter)``: one C call, atomic under the GIL (no lock, no
#: log entry, no bound to check, nothing to fold per observation; the builtin ``next`` reaches the
#: counter's C ``__next__`` directly, where calling its bound ``__next__`` method-wrapper costs
#: about 80 instructions more a tick); ``_fold`` adds what each counted since it last looked
#: (``_received_seen``, ``_depth_seen``). A depth's sum, minimum and maximum follow from the
#: counts of each exact depth. Deeper mailboxes go to ``_depth_log``.
SMALL_DEPTHS: Final = 64
received_counters: Final = [itertools.count() for _ in range(_KIND_MASK + 1)]
_received_counters = received_counters
_received_seen = [0] * len(_received_counters)
depth_counters: Final = [itertools.count() for _ in range(SMALL_DEPTHS)]
_depth_counters = depth_counters
_depth_seen = [0] * SMALL_DEPTHS
#: A received CALL enqueued in a mailbox of a depth below ``SMALL_DEPTHS`` is counted once for
#: both (``_runtime.proc``): a tick of ``call_depth_counters[depth]`` is one CALL received and
#: one observation of ``depth`` (one tick a call where there were two).
call_depth_counters: Final = [itertools.count() for _ in range(SMALL_DEPTHS)]
_call_depth_counters = call_depth_counters
_call_depth_seen = [0] * SMALL_DEPTHS


def _count_of(counter: itertools.count[int]) -> int:
    """How often ``next`` was called on ``counter`` (made as ``itertools.count()``): its
    ``repr`` is ``count(N)``, read without advancing it."""
    return int(repr(counter)[6:-1])


def _take_counts(counters: list[itertools.count[int]], seen: list[int]) -> list[tuple[int, int]]:
    """``(index, times)`` of each counter that counted since the last call (``_fold``)."""
    out = []
    for i, counter in enumerate(counters):
        now = _count_of(counter)
        if now != seen[i]:
            out.append((i, now - seen[i]))
            seen[i] = now
    return out


def _take_keyed_counts(
    counters: dict[int, itertools.count[int]], seen: dict[int, int]
) -> list[tuple[int, int]]:
    """``(key, times)`` of each counter of ``counters`` that counted since the last call."""
    out = []
    for key, counter in counters.items():
        now = _count_of(counter)
        if now != seen[key]:
            out.append((key, now - seen[key]))
            seen[key] = now
    return out


_latency_logs: dict[str, list[float]] = {}
_call_logs: dict[str, list[float]] = {}
_OVERFLOW_NAME: Final = "\x00overflow"
_CALL_KIND: Final = int(MessageKind.CALL)


def _log_of(logs: dict[str, list[float]], endpoint: str) -> list[float]:
    """The raw latency log of ``endpoint`` in ``logs`` (made on first use, bounded)."""
    log = logs.get(endpoint)
    if log is None:
        if len(logs) >= MAX_SERIES:
            endpoint = _OVERFLOW_NAME
        log = logs.setdefault(endpoint, [])
    return log


def latency_log(endpoint: str) -> list[float]:
    """The raw log an endpoint body's latency (seconds) is appended to (``tracing``); append
    with ``note_latency`` or check ``FOLD_AT`` after appending."""
    log = _latency_logs.get(endpoint)
    return _log_of(_latency_logs, endpoint) if log is None else log


def _take(log: list[Any]) -> list[Any]:
    """The entries of ``log`` so far, removed from it; entries other threads append meanwhile
    stay (each step is one atomic list operation under the GIL: no lock on the append side)."""
    n = len(log)
    batch = log[:n]
    del log[:n]
    return batch


def _endpoint_series(endpoint: str) -> _Key:
    if endpoint == _OVERFLOW_NAME:
        return _OVERFLOW
    return (("endpoint", endpoint),) if endpoint else ()


def _fold() -> None:
    """Fold every raw log into the runtime's instruments (see the module docstring)."""
    with _HOOK_LOCK:
        sent = _sent._values
        for sizes in _sent_counters:
            if sizes:
                key = _KIND_KEYS.get(sizes.kind) or _kind_key(sizes.kind)
                for size, times in _take_keyed_counts(sizes, sizes.seen):
                    sent[key] = sent.get(key, 0) + times
                    _payload._record_counted_locked(size, times, key)
        if _sent_log:
            for code, times in collections.Counter(_take(_sent_log)).items():
                kind, size = code & _KIND_MASK, code >> _KIND_BITS
                key = _KIND_KEYS.get(kind) or _kind_key(kind)
                sent[key] = sent.get(key, 0) + times
                _payload._record_counted_locked(size, times, key)
        received = _received._values
        call_depths = _take_counts(_call_depth_counters, _call_depth_seen)
        calls = sum(times for _, times in call_depths)  # received calls counted with a depth
        for kind, times in [*_take_counts(_received_counters, _received_seen), (_CALL_KIND, calls)]:
            if times:
                key = _KIND_KEYS.get(kind) or _kind_key(kind)
                received[key] = received.get(key, 0) + times
        for depth, times in (
            _take_counts(_depth_counters, _depth_seen)
            + call_depths
            + list(collections.Counter(_take(_depth_log)).items())
        ):
            _depth._record_counted_locked(depth, times, ())
        for instrument, logs in ((_latency, _latency_logs), (_call_latency, _call_logs)):
            for endpoint, log in list(logs.items()):
                if log:
                    instrument._record_many_locked(_take(log), _endpoint_series(endpoint))


def on_sent(envelope: Envelope) -> None:
    """An envelope left this process's runtime (sender thread)."""
    if METRICS:
        sizes = envelope.buffer_sizes
        size = len(envelope.payload) + sum(sizes) if sizes else len(envelope.payload)
        _sent_log.append(size << _KIND_BITS | envelope.kind)
        if len(_sent_log) >= FOLD_AT:
            _fold()
        if _MIRROR:
            key = _kind_key(envelope.kind)
            if _sent._otel is not None:
                _sent._otel.add(1, dict(key))
            if _payload._otel is not None:
                _payload._otel.record(size, dict(key))


def on_received(envelope: Envelope) -> None:
    """An envelope reached this process's runtime (runtime loop thread)."""
    if METRICS:
        next(_received_counters[envelope.kind])
        if _MIRROR and _received._otel is not None:
            _received._otel.add(1, dict(_kind_key(envelope.kind)))


def on_enqueued(depth: int) -> None:
    """A message was added to a mailbox that already held ``depth`` items."""
    if METRICS:
        if depth < SMALL_DEPTHS:
            next(_depth_counters[depth])
        else:
            _depth_log.append(depth)
            if len(_depth_log) >= FOLD_AT:
                _fold()
        if _MIRROR and _depth._otel is not None:
            _depth._otel.record(depth, {})


#: Open reply ports: (owner, index) -> (opening time, the raw log of the endpoint's call
#: latencies, the endpoint). Setting and popping one key is atomic (one dict operation), so
#: the hooks take no lock; evicting the oldest (insertion order) when full does, so that two
#: threads never evict at once.
_opened: dict[tuple[object, int], tuple[float, list[float], str]] = {}
_opened_lock = threading.Lock()
#: Reply ports whose opening time is remembered (ports that never complete are forgotten).
MAX_TRACKED_PORTS: Final = 65_536
_perf_counter = time.perf_counter


def on_port_opened(owner: object, index: int, endpoint: str = "") -> None:
    """Port ``index`` of process runtime ``owner`` was opened (to collect the replies of calls
    to ``endpoint``, if given): remember when, and for which endpoint."""
    if METRICS:
        log = _call_logs.get(endpoint)
        if log is None:
            log = _log_of(_call_logs, endpoint)
        _opened[(owner, index)] = (_perf_counter(), log, endpoint)
        if len(_opened) > MAX_TRACKED_PORTS:
            with _opened_lock:
                while len(_opened) > MAX_TRACKED_PORTS:
                    with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                        del _opened[next(iter(_opened))]


def on_port_completed(owner: object, index: int) -> None:
    """Port ``index`` of ``owner`` received its last reply: record the call latency."""
    opened = _opened.pop((owner, index), None)
    if opened is not None:
        call_completed(opened)


#: When a reply port opened (``perf_counter``), the raw log of its endpoint's call latencies,
#: and the endpoint (``call_opened``).
CallOpened = tuple[float, list[float], str]


def call_opened(endpoint: str = "") -> CallOpened:
    """A reply port for the replies of a call to ``endpoint`` opens now (metrics on): what the
    runtime keeps on the port's sink (``PortSink.opened``) until ``call_completed``. On the
    sink, not in a table keyed by port (``on_port_opened``): no key made, set and popped per
    call, and it is bounded by the open ports and goes with its port."""
    log = _call_logs.get(endpoint)
    if log is None:
        log = _log_of(_call_logs, endpoint)
    return (_perf_counter(), log, endpoint)


def call_completed(opened: CallOpened) -> None:
    """The port ``opened`` describes (``call_opened``) received its last reply: record the
    call latency."""
    elapsed = _perf_counter() - opened[0]
    log = opened[1]
    log.append(elapsed)
    if len(log) >= FOLD_AT:
        _fold()
    if _MIRROR and _call_latency._otel is not None:
        _call_latency._otel.record(elapsed, dict(_endpoint_series(opened[2])))


def note_latency(endpoint: str, log: list[float], elapsed: float) -> None:
    """After ``elapsed`` was appended to ``log`` (``latency_log(endpoint)``): fold when full,
    feed the mirror."""
    if len(log) >= FOLD_AT:
        _fold()
    if _MIRROR and _latency._otel is not None:
        _latency._otel.record(elapsed, dict(_endpoint_series(endpoint)))


def record_endpoint(endpoint: str, started: float, exc: BaseException | None) -> None:
    """An endpoint body that started at ``started`` (``time.perf_counter()``) finished, with
    ``exc`` if it raised: its latency, and its error by category."""
    record_elapsed(endpoint, _perf_counter() - started, exc)


def record_elapsed(endpoint: str, elapsed: float, exc: BaseException | None) -> None:
    """An endpoint body finished after ``elapsed`` seconds, with ``exc`` if it raised (the
    receive span's clock measured it: ``tracing``): its latency, and its error by category."""
    log = latency_log(endpoint)
    log.append(elapsed)
    note_latency(endpoint, log, elapsed)
    if exc is not None:
        _errors.add(1, {"endpoint": endpoint, "category": str(error_category(exc))})


def on_supervision(event: str, category: str) -> None:
    """A supervision record was made (``records``)."""
    if METRICS:
        _supervision.add(1, {"event": event, "category": category})


def _after_fork() -> None:
    """A forked child (the zygote, a worker forked from it, a program's own fork) gets new
    locks: one held by another thread of the parent at the fork (a fold, a snapshot, a reset,
    a registration) would stay held in the child, whose next hook fold or snapshot would wait
    for good; that thread is not here. The values are the parent's, as they stood."""
    global _HOOK_LOCK, _instruments_lock, _opened_lock
    shared = _HOOK_LOCK
    _HOOK_LOCK = threading.Lock()
    _instruments_lock = threading.Lock()
    _opened_lock = threading.Lock()
    for instrument in _instruments.values():
        instrument._lock = _HOOK_LOCK if instrument._lock is shared else threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
