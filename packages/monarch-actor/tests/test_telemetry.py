"""Metrics, tracing and supervision event records (in process)."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import monarch.actor
from monarch.actor import (
    Actor,
    ActorError,
    ProcMesh,
    SupervisionRecord,
    add_supervision_listener,
    chrome_trace,
    context,
    endpoint,
    finished_spans,
    get_meter,
    metrics_snapshot,
    span,
    supervision_events,
    traced,
)
from monarch.actor._base.errors import ErrorCategory, FailureEvent
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import metrics as tm_metrics
from monarch.actor._runtime.telemetry import tracing as tm_tracing

Procs = Callable[..., ProcMesh]
T = 5.0


@pytest.fixture
def telemetry() -> Iterator[None]:
    saved = os.environ.get("MONARCH_TELEMETRY")
    tm.enable_telemetry(metrics=True, tracing=True)
    tm.reset_metrics()
    try:
        yield
    finally:
        tm.disable_telemetry()
        tm.reset_metrics()
        if saved is None:
            os.environ.pop("MONARCH_TELEMETRY", None)
        else:
            os.environ["MONARCH_TELEMETRY"] = saved


def _value(name: str, **attributes: str) -> float:
    for point in metrics_snapshot().get(name, []):
        if dict(point.attributes) == attributes:
            return point.value if point.kind != "histogram" else float(point.count)
    return 0.0


class Worker(Actor):
    @endpoint
    def double(self, x: int) -> int:
        return 2 * x

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")

    @endpoint
    def nested(self, other: Any) -> int:
        with span("inner work"):
            return int(other.double.call_one(5).get(timeout=T))

    @endpoint
    def relay(self, other: Any) -> int:
        return int(other.double.call_one(4).get(timeout=T))

    @endpoint
    def die(self) -> None:
        context().actor_instance.abort("on purpose")


class AsyncWorker(Actor):
    @endpoint
    async def double(self, x: int) -> int:
        return 2 * x

    @endpoint
    async def boom(self) -> None:
        raise KeyError("async boom")


class Quiet(Actor):
    @endpoint(instrument=False)
    def ping(self) -> int:
        return 1


class Parent(Actor):
    def __init__(self) -> None:
        self.child = context().actor_instance.proc.spawn("child", Worker)

    @endpoint
    def kill_child(self) -> None:
        self.child.die.broadcast()


# -- the registry ---------------------------------------------------------------------------
def test_counter_series_by_attributes_and_no_decrease() -> None:
    counter = get_meter("test").create_counter("test.counter.a", "1", "a counter")
    assert get_meter("other").create_counter("test.counter.a") is counter  # one per name
    counter.add(2, {"k": "x"})
    counter.add(3, {"k": "x"})
    counter.add(1)
    points = {tuple(p.attributes.items()): p.value for p in metrics_snapshot()["test.counter.a"]}
    assert points == {(("k", "x"),): 5.0, (): 1.0}
    with pytest.raises(ValueError, match="cannot decrease"):
        counter.add(-1)
    updown = get_meter("test").create_up_down_counter("test.updown.a")
    updown.add(3)
    updown.add(-5)
    assert metrics_snapshot("test.updown.a")["test.updown.a"][0].value == -2.0
    with pytest.raises(ValueError, match="already exists"):
        get_meter("test").create_histogram("test.counter.a")


def test_histogram_buckets_min_max() -> None:
    h = get_meter("test").create_histogram(
        "test.hist.a", explicit_bucket_boundaries_advisory=[1.0, 10.0]
    )
    for value in (0.5, 1.0, 5.0, 50.0):
        h.record(value)
    (point,) = metrics_snapshot()["test.hist.a"]
    assert (point.count, point.sum, point.min, point.max) == (4, 56.5, 0.5, 50.0)
    assert point.buckets == ((1.0, 2), (10.0, 1), (math.inf, 1))
    with pytest.raises(ValueError, match="sorted"):
        get_meter("test").create_histogram(
            "test.hist.bad", explicit_bucket_boundaries_advisory=[2.0, 1.0]
        )


def test_series_per_instrument_are_bounded() -> None:
    counter = get_meter("test").create_counter("test.counter.many")
    for i in range(tm.MAX_SERIES + 50):
        counter.add(1, {"i": i})
    points = metrics_snapshot()["test.counter.many"]
    assert len(points) == tm.MAX_SERIES + 1
    overflow = [p for p in points if p.attributes == {"otel.metric.overflow": "true"}]
    assert overflow[0].value == 50.0


@given(st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1))
def test_histogram_totals_match_observations(values: list[float]) -> None:
    h = tm.Histogram("scratch", explicit_bucket_boundaries_advisory=tm.BYTES_BOUNDS)
    for v in values:
        h.record(v)
    (point,) = h._points()
    assert point.count == len(values) == sum(c for _, c in point.buckets)
    assert point.min == min(values)
    assert point.max == max(values)
    for (bound, count), lower in zip(point.buckets, (-1.0, *tm.BYTES_BOUNDS), strict=True):
        assert count == sum(1 for v in values if lower < v <= bound)


@given(
    st.lists(st.floats(min_value=0, max_value=100.0, allow_nan=False), min_size=1),
    st.lists(st.floats(min_value=0, max_value=100.0, allow_nan=False)),
)
def test_batched_histogram_fold_matches_one_record_each(
    before: list[float], batch: list[float]
) -> None:
    """The hooks' folding (``_record_many_locked``: sort, one bisect per bound) gives the same
    buckets, count, minimum and maximum as recording each value, and the same sum to rounding."""
    one, many = tm.Histogram("one"), tm.Histogram("many")
    for h in (one, many):
        for v in before:
            h.record(v)
    for v in batch:
        one.record(v)
    many._record_many_locked(list(batch), ())
    (a,), (b,) = one._points(), many._points()
    assert (a.buckets, a.count, a.min, a.max) == (b.buckets, b.count, b.min, b.max)
    assert math.isclose(a.sum, b.sum, rel_tol=1e-9, abs_tol=1e-12)


def test_hook_logs_are_bounded_and_folded(telemetry: None) -> None:
    """Each raw log holds fewer than ``FOLD_AT`` observations (the hook that fills it folds);
    small mailbox depths are counted, not logged; a snapshot folds what is pending (logged and
    counted), ``reset_metrics`` forgets it."""
    n = 2 * tm_metrics.FOLD_AT + 7
    deep = tm_metrics.SMALL_DEPTHS  # logged from here
    for i in range(n):
        tm_metrics.on_enqueued(i % 3)
        tm_metrics.on_enqueued(deep + i % 3)
        tm_metrics.record_endpoint("bounded", 0.0, None)
    assert len(tm_metrics._depth_log) < tm_metrics.FOLD_AT
    assert len(tm_metrics._latency_logs["bounded"]) < tm_metrics.FOLD_AT
    assert tm_metrics._depth_log  # 7 pending: the snapshot must see them
    (depth,) = tm.metrics_snapshot()["monarch.mailbox.depth"]
    expected = (2 * n, float(sum(deep + 2 * (i % 3) for i in range(n))), 0.0, deep + 2.0)
    assert (depth.count, depth.sum, depth.min, depth.max) == expected
    assert _value("monarch.endpoint.latency", endpoint="bounded") == n
    tm_metrics.on_enqueued(5)  # pending when reset (counted and logged): forgotten with the rest
    tm_metrics.on_enqueued(deep)
    tm.reset_metrics()
    assert "monarch.mailbox.depth" not in tm.metrics_snapshot()
    tm_metrics.on_enqueued(1)  # counted after the reset: only this one
    (depth,) = tm.metrics_snapshot()["monarch.mailbox.depth"]
    assert (depth.count, depth.sum) == (1, 1.0)


def test_sent_and_received_counts_by_kind_and_payload_sizes(telemetry: None) -> None:
    """Sent envelopes are logged as one int each (kind and payload size) and received ones
    counted by kind: a snapshot gives the counts by kind name and the payload histogram."""
    from monarch.actor._base.envelope import MessageKind

    def envelope(kind: MessageKind, payload: bytes) -> Any:
        return type("E", (), {"kind": kind, "payload": payload, "buffer_sizes": (3, 4)})()

    for _ in range(5):
        tm_metrics.on_sent(envelope(MessageKind.CALL, b"x" * 100))
        tm_metrics.on_received(envelope(MessageKind.PORT_VALUE, b""))
    tm_metrics.on_sent(envelope(MessageKind.STOP_PROC, b"x" * 5000))
    assert _value("monarch.messages.sent", kind="call") == 5
    assert _value("monarch.messages.sent", kind="stop_proc") == 1
    assert _value("monarch.messages.received", kind="port_value") == 5
    sizes = {
        p.attributes["kind"]: p for p in tm.metrics_snapshot()["monarch.messages.payload_size"]
    }
    assert (sizes["call"].count, sizes["call"].sum) == (5, 5 * 107.0)
    assert (sizes["stop_proc"].min, sizes["stop_proc"].max) == (5007.0, 5007.0)
    tm.reset_metrics()
    assert "monarch.messages.received" not in tm.metrics_snapshot()


def test_span_ids_are_unique_and_differ_after_fork(telemetry: None) -> None:
    """Span ids count from a random start; a root span's trace id is the process's random
    prefix and its id; a forked child draws a new start (its ids are not the parent's)."""
    spans = [tm_tracing._start_span("s", {}) for _ in range(1000)]
    assert len({s.span_id for s in spans}) == 1000
    assert all(len(s.span_id) == 8 and len(s.trace_id) == 16 for s in spans)
    assert spans[0].trace_id == tm_tracing._trace_prefix + spans[0].span_id
    assert spans[0].parent_id == bytes(8)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id and prefix, then out without cleanup
        try:
            child = tm_tracing._start_span("child", {})
            os.write(write, child.trace_id + child.span_id)
        finally:
            os._exit(0)
    os.close(write)
    try:
        data = os.read(read, 24)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    mine = tm_tracing._start_span("parent", {})
    assert len(data) == 24
    assert data[:8] != mine.trace_id[:8]  # another random prefix
    assert abs(int.from_bytes(data[16:], "big") - int.from_bytes(mine.span_id, "big")) > 1000


# -- the span stream and store (issue 21: spans of processes that die without a stop) -------
@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty store for the test (what it adds leaves with it)."""
    monkeypatch.setattr(tm_tracing, "_store", collections.deque())
    monkeypatch.setattr(tm_tracing, "_store_counts", [0, 0, 0])


def test_packed_batches_round_trip(telemetry: None) -> None:
    """A packed batch decodes to the records ``SpanRecord.of`` makes, runtime spans (their
    attributes still a tuple) and user spans alike; values msgpack cannot carry are left out."""
    with span("user", {"n": 3, "f": 0.5, "ok": True, "s": "x"}) as user:
        pass
    with span("odd", {"obj": object(), "kept": 1}) as odd:
        pass
    sent = tm_tracing._hot_span(
        "call x.y",
        b"t" * 16,
        b"s" * 8,
        bytes(8),
        "client",
        "<root>",
        ("send", "call", "y", "x", 2, "<root>"),
    )
    sent._end(None)
    got = tm_tracing.decode_batch(tm_tracing.encode_batch([user, sent]))  # type: ignore[list-item]
    assert got == [tm_tracing.SpanRecord.of(user), tm_tracing.SpanRecord.of(sent)]  # type: ignore[arg-type]
    assert got[1].attributes["span.kind"] == "send"
    assert got[1].attributes["ranks"] == 2
    (odd_record,) = tm_tracing.decode_batch(tm_tracing.encode_batch([odd]))  # type: ignore[list-item]
    assert odd_record.attributes == {"kept": 1}


def test_a_malformed_batch_is_refused_and_skipped(
    telemetry: None, store: None, caplog: pytest.LogCaptureFixture
) -> None:
    where = [1, "proc", "track", 2]
    for junk in (
        b"",
        b"\xc1",
        msgspec.msgpack.encode([["name", "not bytes"]]),
        b"\x92\x01",
        # runtime rows: a receive row whose trace context is short, one with a str for a time,
        # one whose own context is not 24 bytes, a send row whose parent context is neither 24
        # bytes nor empty, and eight values (neither a receive nor a send row nor a span)
        msgspec.msgpack.encode([[b"short", bytes(24), 1, 2, where, "ping", 0]]),
        msgspec.msgpack.encode([[bytes(24), bytes(24), "1", 2, where, "ping", 0]]),
        msgspec.msgpack.encode([[bytes(24), bytes(8), 1, 2, where, "ping", 0]]),
        msgspec.msgpack.encode([[bytes(24), bytes(8), 1, 2, where, "call", "y", "x", 1]]),
        msgspec.msgpack.encode([[bytes(24), bytes(8), 1, 2, where, "a", "b", "c"]]),
    ):
        with pytest.raises(ValueError, match="not a packed span batch"):
            tm_tracing.decode_batch(junk)
    tm_tracing.add_remote_batch(b"\x91\x01", "process deadbeef")
    with span("still here") as kept:
        pass
    caplog.set_level(logging.WARNING, logger="monarch.actor.telemetry")
    records = tm_tracing.span_records()
    assert kept.span_id in {r.span_id for r in records}  # type: ignore[union-attr]
    assert "spans from process deadbeef dropped" in caplog.text


def test_finished_spans_are_packed_into_the_store_by_the_shipper(
    telemetry: None, store: None
) -> None:
    """Within ``SHIP_INTERVAL`` (the timer) or at ``SHIP_AT`` pending (a kick), finished spans
    reach the store packed; ``finished_spans()`` keeps the newest, in order."""
    with span("one") as one:
        pass

    def stored(ids: set[bytes]) -> Callable[[], bool]:
        def check() -> bool:
            with tm_tracing._store_lock:
                batches = [data for _, data, _ in tm_tracing._store]
            found = {r.span_id for data in batches for r in tm_tracing.decode_batch(data)}
            return ids <= found

        return check

    assert tm_tracing.wait_stored(stored({one.span_id}), T)  # type: ignore[union-attr]
    many = []
    for i in range(3 * tm_tracing.SHIP_AT):
        with span(f"many {i}") as s:
            many.append(s)
    assert tm_tracing.wait_stored(stored({s.span_id for s in many}), T)  # type: ignore[union-attr]
    recent = finished_spans()
    assert (
        tm_tracing.RECENT_SPANS
        <= len(recent)
        <= (tm_tracing.RECENT_SPANS + tm_tracing.MAX_PENDING_SPANS)
    )
    assert recent[-1] is many[-1]
    assert [s.name for s in recent[-3:]] == [s.name for s in many[-3:]]  # type: ignore[union-attr]


def test_the_store_is_bounded(
    telemetry: None, store: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tm_tracing, "MAX_STORED_SPANS", 10)
    batch = tm_tracing.encode_batch([tm_tracing._start_span(f"s{i}", {}) for i in range(4)])
    for _ in range(5):
        tm_tracing.add_remote_batch(batch, "test")
    assert tm_tracing.stored_spans() <= 10
    monkeypatch.setattr(tm_tracing, "MAX_STORED_SPANS", 1 << 30)
    monkeypatch.setattr(tm_tracing, "MAX_STORED_BYTES", 2 * len(batch))
    for _ in range(5):
        tm_tracing.add_remote_batch(batch, "test")
    with tm_tracing._store_lock:
        assert tm_tracing._store_counts[1] <= 2 * len(batch)


def test_a_streaming_process_hands_its_batches_to_the_stream(telemetry: None, store: None) -> None:
    """With a stream set (a worker), packed batches wait for the sender (``take_unsent``)
    instead of the store; a stop flushes what is pending at once."""
    notified = threading.Event()
    tm_tracing.set_stream(notified.set)
    try:
        before = tm_tracing.stored_spans()
        with span("streamed") as streamed:
            pass
        sent: set[bytes] = set()
        deadline = time.monotonic() + T
        while streamed.span_id not in sent:  # type: ignore[union-attr]
            # The shipper's timer packed it and told the stream (maybe after older spans).
            assert notified.wait(max(0.0, deadline - time.monotonic()))
            notified.clear()
            sent |= {
                r.span_id
                for data in tm_tracing.take_unsent()
                for r in tm_tracing.decode_batch(data)
            }
        with span("at stop") as last:
            pass
        flushed = tm_tracing.take_unsent(flush=True)  # packed now, not at the next interval
        assert last.span_id in {  # type: ignore[union-attr]
            r.span_id for data in flushed for r in tm_tracing.decode_batch(data)
        }
        assert tm_tracing.stored_spans() == before  # none went to the store
    finally:
        tm_tracing.set_stream(None)


# -- runtime metrics ----------------------------------------------------------------------
def test_disabled_telemetry_records_nothing(procs: Procs) -> None:
    tm.disable_telemetry()
    tm.reset_metrics()
    workers = procs(gpus=1).spawn("w", Worker)
    assert workers.double.call_one(2).get(timeout=T) == 4
    assert metrics_snapshot("monarch.") == {}
    assert finished_spans() == [] or all(s.name != "double" for s in finished_spans())


@pytest.mark.parametrize("cls", [Worker, AsyncWorker])
def test_messages_latency_and_errors_are_counted(
    telemetry: None, procs: Procs, cls: type[Actor]
) -> None:
    workers: Any = procs(gpus=2).spawn("w", cls)
    assert workers.double.call(3).get(timeout=T).values() == [6, 6]
    with pytest.raises(ActorError):
        workers.slice(gpus=0).boom.call_one().get(timeout=T)
    assert _value("monarch.messages.sent", kind="call") >= 3  # spawn init aside
    assert _value("monarch.messages.received", kind="call") >= 3
    assert _value("monarch.messages.received", kind="port_value") >= 2
    assert _value("monarch.endpoint.latency", endpoint="double") == 2
    assert _value("monarch.endpoint.latency", endpoint="boom") == 1
    assert _value("monarch.endpoint.errors", endpoint="boom", category="user") == 1
    assert _value("monarch.client.call_latency", endpoint="double") == 1  # one call: 2 ranks
    assert _value("monarch.client.call_latency", endpoint="boom") == 1
    assert _value("monarch.mailbox.depth") >= 3
    (payload,) = [
        p
        for p in metrics_snapshot()["monarch.messages.payload_size"]
        if p.attributes == {"kind": "call"}
    ]
    assert payload.min > 0


# -- tracing ------------------------------------------------------------------------------
def test_span_is_noop_when_tracing_is_off() -> None:
    tm.disable_telemetry()
    with span("nothing") as s:
        s.set_attribute("a", 1)
    assert not isinstance(s, tm.Span)


def test_spans_nest_and_traced_names_them(telemetry: None) -> None:
    @traced
    def inner() -> int:
        return 1

    @traced(name="named")
    async def other() -> int:
        return 2

    with span("outer", {"step": 1}) as outer:
        assert inner() == 1
        assert asyncio.run(other()) == 2
    assert isinstance(outer, tm.Span)
    by_name = {s.name: s for s in finished_spans()[-3:]}
    assert set(by_name) == {"outer", "inner", "named"}
    for name in ("inner", "named"):
        assert by_name[name].parent_id == outer.span_id
        assert by_name[name].trace_id == outer.trace_id
    assert outer.parent_id == bytes(8)
    assert outer.status == "ok"
    assert outer.attributes == {"step": 1}
    with pytest.raises(ZeroDivisionError), span("fails") as failing:
        _ = 1 / 0
    assert isinstance(failing, tm.Span)
    assert failing.status == "error"
    assert "ZeroDivisionError" in failing.error


def test_caller_span_propagates_to_endpoint_spans(telemetry: None, procs: Procs) -> None:
    mesh = procs(gpus=1)
    a = mesh.spawn("a", Worker)
    b = mesh.spawn("b", Worker)
    with span("client step") as root:
        assert a.nested.call_one(b).get(timeout=T) == 10
    assert isinstance(root, tm.Span)
    spans = [s for s in finished_spans() if s.trace_id == root.trace_id]
    by_name = {s.name: s for s in spans}
    assert {"client step", "nested", "inner work", "double"} <= set(by_name)
    # Each call: the caller's span > the send span of the adverb > the endpoint's span.
    send_nested = by_name["call_one a.nested"]
    assert send_nested.parent_id == root.span_id
    assert send_nested.attributes["span.kind"] == "send"
    assert by_name["nested"].parent_id == send_nested.span_id
    assert by_name["inner work"].parent_id == by_name["nested"].span_id
    send_double = by_name["call_one b.double"]
    assert send_double.parent_id == by_name["inner work"].span_id
    assert by_name["double"].parent_id == send_double.span_id
    assert by_name["double"].attributes["endpoint"] == "double"
    assert by_name["double"].attributes["span.kind"] == "receive"
    assert "<root>.<" in str(by_name["nested"].attributes["actor"])
    trace = chrome_trace(spans)
    json.dumps(trace)  # serialisable as is
    events = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert events["nested"]["args"]["parent_id"] == send_nested.span_id.hex()
    assert events["nested"]["dur"] >= events["double"]["dur"]


def test_endpoint_span_records_errors(telemetry: None, procs: Procs) -> None:
    workers = procs(gpus=1).spawn("w", AsyncWorker)
    with pytest.raises(ActorError):
        workers.boom.call_one().get(timeout=T)
    failed = [s for s in finished_spans() if s.name == "boom"]
    assert failed
    assert failed[-1].status == "error"
    assert "KeyError" in failed[-1].error


class Sleeper(Actor):
    @endpoint
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def fail(self, seconds: float) -> None:
        time.sleep(seconds)
        raise ValueError("late")


class AsyncSleeper(Actor):
    @endpoint
    async def anap(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds


def _latency_point(endpoint: str) -> Any:
    (point,) = [
        p
        for p in metrics_snapshot()["monarch.endpoint.latency"]
        if dict(p.attributes) == {"endpoint": endpoint}
    ]
    return point


@pytest.mark.parametrize("name", ["nap", "anap", "fail"])
def test_endpoint_latency_is_the_receive_spans_duration(
    telemetry: None, procs: Procs, name: str
) -> None:
    """Metrics and tracing on: one clock (the receive span's start and end) gives the span
    and the latency metric, so the latency recorded is the span's duration, for a sync body,
    an async one, and one that raised (counted as an error too)."""
    sleeper: Any = procs(gpus=1).spawn("s", AsyncSleeper if name == "anap" else Sleeper)
    call = getattr(sleeper, name)
    if name == "fail":
        with pytest.raises(ActorError):
            call.call_one(0.02).get(timeout=T)
        assert _value("monarch.endpoint.errors", endpoint=name, category="user") == 1
    else:
        assert call.call_one(0.02).get(timeout=T) == 0.02
    (received,) = [s for s in finished_spans() if s.name == name]
    assert received.status == ("error" if name == "fail" else "ok")
    point = _latency_point(name)
    assert point.count == 1
    assert received.duration_s >= 0.02
    assert point.sum == pytest.approx(received.duration_s, rel=1e-9, abs=1e-12)
    assert point.min == point.max == point.sum


def test_a_call_made_in_an_endpoint_is_a_child_of_its_receive_span(
    telemetry: None, procs: Procs
) -> None:
    """No span entered in the body: the runtime's receive span (kept on the message's context,
    not in the context variable) is the parent of the calls it makes, and is current only while
    its endpoint runs."""
    mesh = procs(gpus=1)
    a = mesh.spawn("a", Worker)
    b = mesh.spawn("b", Worker)
    for _ in range(2):
        assert a.relay.call_one(b).get(timeout=T) == 8
    relays = [s for s in finished_spans() if s.name == "relay"][-2:]
    traces = {s.trace_id for s in relays}
    spans = [s for s in finished_spans() if s.trace_id in traces]  # earlier tests' spans stay
    sends = [s for s in spans if s.name == "call_one b.double"]
    doubles = [s for s in spans if s.name == "double"]
    assert len(relays) == len(sends) == len(doubles) == 2
    for relay in relays:
        (send,) = [s for s in sends if s.parent_id == relay.span_id]
        assert send.trace_id == relay.trace_id
        (double,) = [s for s in doubles if s.parent_id == send.span_id]
        assert double.trace_id == relay.trace_id
    assert relays[0].trace_id != relays[1].trace_id  # two client calls: two traces
    assert tm_tracing._current_span() == b""  # nothing left current on the client


class Later(Actor):
    @endpoint
    def later(self, x: int) -> Any:
        return asyncio.sleep(0, result=3 * x)  # a coroutine: the runner awaits it


def test_metrics_alone_time_a_sync_actors_calls_exactly(procs: Procs) -> None:
    """Metrics on, tracing off: a sync actor's calls are timed without ``run_endpoint`` (the
    runner inlines the timing): each call is one latency on each side, a raising body is one
    latency and one error, and a body returning a coroutine is timed once, awaited."""
    tm.enable_telemetry(metrics=True, tracing=False)
    tm.reset_metrics()
    try:
        mesh = procs(gpus=1)
        workers: Any = mesh.spawn("w", Worker)
        later: Any = mesh.spawn("l", Later)
        calls = 7
        futures = [workers.double.call_one(i) for i in range(calls)]
        assert [f.get(timeout=T) for f in futures] == [2 * i for i in range(calls)]
        with pytest.raises(ActorError):
            workers.boom.call_one().get(timeout=T)
        assert later.later.call_one(5).get(timeout=T) == 15
        assert _value("monarch.endpoint.latency", endpoint="double") == calls
        assert _value("monarch.client.call_latency", endpoint="double") == calls
        assert _value("monarch.endpoint.latency", endpoint="boom") == 1
        assert _value("monarch.endpoint.errors", endpoint="boom", category="user") == 1
        assert _value("monarch.endpoint.latency", endpoint="later") == 1
        assert not [s for s in finished_spans() if s.name == "later"]  # tracing is off
    finally:
        tm.disable_telemetry()
        tm.reset_metrics()


def test_uninstrumented_endpoints_get_no_span(telemetry: None, procs: Procs) -> None:
    before = len([s for s in finished_spans() if s.name == "ping"])
    assert procs(gpus=1).spawn("q", Quiet).ping.call_one().get(timeout=T) == 1
    assert len([s for s in finished_spans() if s.name == "ping"]) == before
    assert _value("monarch.endpoint.latency", endpoint="ping") == 1  # still timed


def test_span_and_record_listeners(telemetry: None) -> None:
    seen: list[tm.Span] = []
    remove = tm.add_span_listener(seen.append)
    try:
        with span("listened"):
            pass
    finally:
        remove()
    with span("not listened"):
        pass
    assert [s.name for s in seen] == ["listened"]


def test_listeners_are_bounded() -> None:
    removers = [tm.add_span_listener(lambda s: None) for _ in range(tm.MAX_LISTENERS)]
    try:
        with pytest.raises(ValueError, match="too many listeners"):
            tm.add_span_listener(lambda s: None)
    finally:
        for remove in removers:
            remove()


# -- supervision records ------------------------------------------------------------------
class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_failure_produces_structured_records(procs: Procs, faults: Any) -> None:
    logger = logging.getLogger("monarch.supervision")
    capture = _Capture()
    logger.addHandler(capture)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    received: list[SupervisionRecord] = []
    remove = add_supervision_listener(received.append)
    last = supervision_events()[-1].seq if supervision_events() else 0
    try:
        workers = procs(gpus=1).spawn("dying", Worker)
        workers.die.broadcast()
        faults.wait_for(1)
    finally:
        remove()
        logger.removeHandler(capture)
        logger.setLevel(old_level)
    records = [r for r in supervision_events(after=last) if r.mesh_name.startswith("dying")]
    events = [r.event for r in records]
    assert "actor_failed" in events
    assert "unhandled_fault" in events
    failed = records[events.index("actor_failed")]
    assert failed.version == tm.SCHEMA_VERSION
    assert failed.category == "user"
    assert failed.kind == "failed"
    assert "on purpose" in failed.reason
    assert failed.actor.startswith("<root>.<")
    assert "dying" in failed.actor
    assert failed.actor_id.startswith(failed.mesh_name + "@")
    assert failed.proc
    assert failed.rank == 0
    assert failed.timestamp > 0
    assert failed.chain[0].reason == failed.reason
    assert failed.root_cause
    assert all(r.seq > last for r in records)
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    assert {r.seq for r in records} <= {r.seq for r in received}
    lines = [json.loads(line) for line in capture.lines]
    assert any(d["event"] == "actor_failed" and d["mesh_name"] == failed.mesh_name for d in lines)
    assert all("\n" not in line for line in capture.lines)


def test_unhandled_child_failure_chain_names_both_actors(procs: Procs, faults: Any) -> None:
    last = supervision_events()[-1].seq if supervision_events() else 0
    parent = procs(gpus=1).spawn("parent", Parent)
    parent.kill_child.call_one().get(timeout=T)
    faults.wait_for(1)
    records = supervision_events(after=last)
    received = [r for r in records if r.event == "supervision_received"]
    assert received
    assert received[0].mesh_name.startswith("child")
    at_root = [r for r in records if r.event == "unhandled_fault"]
    assert at_root
    chain = at_root[-1].chain
    assert len(chain) == 2
    assert "parent" in chain[0].actor
    assert chain[0].category == "system"
    assert "child" in chain[1].actor
    assert chain[1].category == "user"
    assert at_root[-1].root_cause.startswith(f"The actor {chain[1].actor}")


def test_stop_is_recorded(procs: Procs) -> None:
    last = supervision_events()[-1].seq if supervision_events() else 0
    workers = procs(gpus=1).spawn("stopping", Worker)
    workers.stop().get(timeout=T)
    stopped = [
        r
        for r in supervision_events(after=last)
        if r.event == "actor_stopped" and r.mesh_name.startswith("stopping")
    ]
    assert stopped
    assert stopped[0].kind == "stopped"
    assert stopped[0].category == "system"


def test_record_schema_round_trips_as_json() -> None:
    cause = FailureEvent(
        category=str(ErrorCategory.INFRASTRUCTURE),
        kind="failed",
        actor="<root>.<m.C c{}>",
        mesh_name="c-1",
        rank=0,
        reason="process died",
        actor_id="c-1@abc",
        proc="p0",
    )
    event = FailureEvent(
        category="system",
        kind="failed",
        actor="<root>.<m.P p{}>",
        mesh_name="p-1",
        rank=1,
        reason="unhandled",
    ).with_cause(cause)
    record = tm.record_supervision("actor_failed", event, "test-proc", now=123.5)
    assert record.timestamp == 123.5
    decoded = msgspec.json.decode(record.to_json(), type=SupervisionRecord)
    assert decoded == record
    assert decoded.root_cause.endswith("process died")
    assert [link.category for link in decoded.chain] == ["system", "infrastructure"]
    assert json.loads(record.to_json())["version"] == 1


_links = st.builds(
    FailureEvent,
    category=st.sampled_from([str(c) for c in ErrorCategory]),
    kind=st.sampled_from(["failed", "stopped", "unhealthy", "undeliverable"]),
    actor=st.text(max_size=30),
    mesh_name=st.text(max_size=20),
    rank=st.integers(min_value=-1, max_value=10_000),
    reason=st.text(max_size=60),
    actor_id=st.text(max_size=30),
    proc=st.text(max_size=10),
)


@given(st.lists(_links, min_size=1, max_size=20), st.floats(min_value=0, max_value=4e9))
def test_records_mirror_any_chain_and_round_trip(links: list[FailureEvent], now: float) -> None:
    event = links[-1]
    for link in reversed(links[:-1]):
        event = link.with_cause(event)
    record = SupervisionRecord.from_event("actor_failed", event, "p", 7, now)
    chain = event.chain()
    assert len(record.chain) == len(chain) <= 16
    assert [(c.actor, c.reason, c.category) for c in record.chain] == [
        (e.actor, e.reason, e.category) for e in chain
    ]
    assert record.root_cause == chain[-1].headline()
    line = record.to_json()
    assert "\n" not in line
    assert msgspec.json.decode(line, type=SupervisionRecord) == record


def test_ring_is_bounded() -> None:
    event = FailureEvent(
        category="user", kind="failed", actor="a", mesh_name="m", rank=0, reason="r"
    )
    tm.set_ring_capacity(8)
    try:
        for _ in range(20):
            tm.record_supervision("actor_failed", event, "p")
        assert len(supervision_events()) == 8
    finally:
        tm.set_ring_capacity(tm.DEFAULT_RING_CAPACITY)
    with pytest.raises(ValueError):
        tm.set_ring_capacity(0)


def test_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_TELEMETRY", "metrics")
    try:
        tm._from_environment()
        assert tm.telemetry_state() == {"metrics": True, "tracing": False, "otel": False}
        assert tm.ACTIVE
    finally:
        tm.disable_telemetry()
    assert not tm.ACTIVE


def test_enable_sets_the_environment_for_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONARCH_TELEMETRY", raising=False)
    try:
        tm.enable_telemetry(metrics=False, tracing=True)
        assert os.environ["MONARCH_TELEMETRY"] == "tracing"
    finally:
        tm.disable_telemetry()


def test_every_copy_of_the_switches_follows_enable_telemetry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runtime reads ``ACTIVE``/``TRACING`` on the package, the hooks read ``METRICS`` in
    ``metrics`` and ``TRACING`` in ``tracing``: ``enable_telemetry`` sets them all."""
    monkeypatch.delenv("MONARCH_TELEMETRY", raising=False)
    try:
        for metrics, tracing in ((True, False), (False, True), (True, True), (False, False)):
            tm.enable_telemetry(metrics=metrics, tracing=tracing)
            assert (tm.METRICS, tm.TRACING, tm.ACTIVE) == (metrics, tracing, metrics or tracing)
            assert (tm_metrics.METRICS, tm_tracing.TRACING) == (metrics, tracing)
            assert tm.telemetry_state() == {"metrics": metrics, "tracing": tracing, "otel": False}
    finally:
        tm.disable_telemetry()


def test_otel_mirror_needs_the_optional_package() -> None:
    if importlib.util.find_spec("opentelemetry") is not None:
        pytest.skip("opentelemetry is installed here")
    with pytest.raises(ImportError):
        tm.enable_telemetry(otel=True)
    assert tm.telemetry_state()["otel"] is False


_OTEL_SCRIPT = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from monarch.actor import _local_proc_mesh, enable_telemetry, span
from otel_actor import Doubler

enable_telemetry(metrics=True, tracing=True, otel=True)
procs = _local_proc_mesh(per_host={"gpus": 1})
d = procs.spawn("d", Doubler)
with span("client step") as root:
    assert d.double.call_one(4).get(timeout=10) == 8
procs.stop().get(timeout=10)
spans = {s.name: s for s in exporter.get_finished_spans()}
send = spans["call_one d.double"]  # the send side, between the caller's span and the endpoint's
assert send.parent.span_id == spans["client step"].context.span_id, spans
assert spans["double"].parent.span_id == send.context.span_id, spans
assert spans["double"].context.trace_id == int.from_bytes(root.trace_id, "big")
names = {
    m.name
    for rm in reader.get_metrics_data().resource_metrics
    for sm in rm.scope_metrics
    for m in sm.metrics
}
assert "monarch.endpoint.latency" in names and "monarch.messages.sent" in names, names
print("otel ok")
"""


def test_otel_mirror_with_an_sdk(tmp_path: Path) -> None:
    """Runs where ``opentelemetry-sdk`` is importable (``OTEL_TEST_PATH`` may point at it)."""
    extra = os.environ.get("OTEL_TEST_PATH", "")
    paths = (extra, str(tmp_path), os.environ.get("PYTHONPATH", ""))  # this checkout's first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env.pop("MONARCH_TELEMETRY", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import opentelemetry.sdk"], env=env, capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip("opentelemetry-sdk is not installed")
    (tmp_path / "otel_actor.py").write_text(
        "from monarch.actor import Actor, endpoint\n"
        "class Doubler(Actor):\n"
        "    @endpoint\n"
        "    def double(self, x: int) -> int:\n"
        "        return 2 * x\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", _OTEL_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "otel ok" in out.stdout


def test_facade_names() -> None:
    assert monarch.actor.get_meter is get_meter
    assert monarch.actor.SupervisionRecord.__module__ == "monarch.actor"


def test_hooks_count_exactly_from_many_threads(
    telemetry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's hooks append to raw logs without a lock and fold them when full (4 threads
    x 2000 calls pass ``FOLD_AT`` several times, folds racing appends): concurrent senders and
    receivers lose no count; reply ports are tracked without a lock and stay bounded."""
    import threading

    from monarch.actor._base.envelope import MessageKind

    class _Envelope:
        kind = MessageKind.CALL
        payload = b"x" * 100
        buffer_sizes = (28,)

    envelope: Any = _Envelope()
    owner = object()
    per_thread, nthreads = 2000, 4

    def work(base: int) -> None:
        for i in range(per_thread):
            tm_metrics.on_sent(envelope)
            tm_metrics.on_received(envelope)
            tm_metrics.on_port_opened(owner, base + i, "hammer")
            tm_metrics.on_port_completed(owner, base + i)

    threads = [threading.Thread(target=work, args=(n * per_thread,)) for n in range(nthreads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    snapshot = tm.metrics_snapshot("monarch.")
    total = per_thread * nthreads
    (sent,) = [p for p in snapshot["monarch.messages.sent"] if p.attributes == {"kind": "call"}]
    (received,) = snapshot["monarch.messages.received"]
    (size,) = snapshot["monarch.messages.payload_size"]
    (latency,) = [
        p for p in snapshot["monarch.client.call_latency"] if p.attributes == {"endpoint": "hammer"}
    ]
    assert (sent.value, received.value, size.count, latency.count) == (total,) * 4
    assert size.sum == 128 * total
    monkeypatch.setattr(tm_metrics, "MAX_TRACKED_PORTS", 10)
    for i in range(25):
        tm_metrics.on_port_opened(owner, 10_000 + i)
    assert len(tm_metrics._opened) == 10
    tm_metrics.on_port_completed(owner, 10_024)  # the newest is kept
    tm_metrics.on_port_completed(owner, 10_000)  # the oldest was evicted: no latency
    (latency,) = [
        p for p in tm.metrics_snapshot()["monarch.client.call_latency"] if not p.attributes
    ]
    assert latency.count == 1
    tm_metrics._opened.clear()
