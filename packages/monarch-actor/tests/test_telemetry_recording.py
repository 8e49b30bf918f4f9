"""How the runtime records telemetry on its hot path (issue 21, the overhead increment).

Metric hooks append raw observations to bounded logs, folded when a log fills and before every
snapshot; the runtime's send and receive spans are plain tuples (rows) until something reads
them. These tests check that nothing is lost or mislinked on the way: a snapshot after calls
from several threads counts every call, rows become spans with their parents and times, and
every buffer stays bounded.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from monarch.actor import Actor, ProcMesh, endpoint, finished_spans, metrics_snapshot, span
from monarch.actor._base.envelope import MessageKind
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import listeners as tm_listeners
from monarch.actor._runtime.telemetry import metrics as tm_metrics
from monarch.actor._runtime.telemetry import tracing as tm_tracing

Procs = Callable[..., ProcMesh]
T = 10.0


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


class Counted(Actor):
    @endpoint
    def bump(self, x: int) -> int:
        return x + 1

    @endpoint
    def fails(self) -> None:
        raise ValueError("on purpose")


def _points(name: str, **attributes: str) -> list[Any]:
    return [p for p in metrics_snapshot().get(name, []) if dict(p.attributes) == attributes]


def test_a_snapshot_after_calls_from_several_threads_counts_every_call(
    telemetry: None, procs: Procs
) -> None:
    """4 client threads x 60 calls (single and pipelined) with metrics and tracing on: the
    snapshot taken right after the last reply counts every call on both sides (the logs
    still pending are folded first), and every call has its send span and its receive span,
    the receive span the child of the send span."""
    actor = procs(gpus=1).spawn("counted", Counted)
    assert actor.bump.call_one(0).get(timeout=T) == 1  # spawned and warm
    tm.reset_metrics()
    per_thread, nthreads = 60, 4
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for i in range(0, per_thread, 6):
                assert actor.bump.call_one(i).get(timeout=T) == i + 1
                futures = [actor.bump.call_one(i + k) for k in range(1, 6)]  # 5 in flight
                assert [f.get(timeout=T) for f in futures] == [i + k + 1 for k in range(1, 6)]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(nthreads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    total = per_thread * nthreads
    (served,) = _points("monarch.endpoint.latency", endpoint="bump")
    (waited,) = _points("monarch.client.call_latency", endpoint="bump")
    assert (served.count, waited.count) == (total, total)
    # Both sides run in this process: each call received once (with its mailbox depth, one
    # tick for both: ``_runtime.proc``), each reply received once.
    (calls,) = _points("monarch.messages.received", kind="call")
    (replies,) = _points("monarch.messages.received", kind="port_value")
    (depth,) = _points("monarch.mailbox.depth")
    assert (calls.value, replies.value, depth.count) == (total, total, total)
    assert served.min > 0
    assert served.max >= served.min
    records = tm_tracing.span_records(remote=False)
    sends = {r.span_id: r for r in records if r.name == "call_one counted.bump"}
    receives = [r for r in records if r.name == "bump" and r.parent_id in sends]
    assert len(sends) == len(receives) == total + 1  # and the warm-up call
    for received in receives:
        sent = sends[received.parent_id]
        assert received.trace_id == sent.trace_id
        assert sent.start_ns <= received.start_ns <= received.end_ns
        assert received.attributes["span.kind"] == "receive"


class _Runtime:
    label = "procs{'gpus': 0/1}"


class _Cell:
    display = "<root>.<test Counted counted{'gpus': 0/1}>"
    rank = 0
    runtime = _Runtime()
    endpoints: ClassVar[dict[str, Any]] = {}
    _untraced: frozenset[str] = frozenset()  # as a runtime cell's
    _span_where: tuple[Any, ...] | None = None  # as a runtime cell's


class _Envelope:
    endpoint = "bump"
    trace = b""


class _Sender:
    display = "<root>"
    _span_where: tuple[Any, ...] | None = None  # as a runtime cell's


class _Endpoint:
    """What ``send_call_traced`` reads of an endpoint (``_mesh.adverbs.Endpoint``): its name
    and its mesh's."""

    _name = "bump"
    _user_name = "counted"

    @property
    def _mesh(self) -> _Endpoint:
        return self


class _Posting(_Runtime):
    """A process runtime whose posts (``post_calls``, as ``send_call_traced`` makes them) go
    to ``post(targets, trace)``."""

    def __init__(self, post: Callable[[Any, bytes], None]) -> None:
        self._post = post
        self.given: list[bytes | None] = []

    def post_calls(
        self,
        sender: Any,
        targets: Any,
        *,
        endpoint: str,
        reply_port: Any,
        payload: Any,
        flags: int = 0,
        trace: bytes | None = None,
    ) -> None:
        assert endpoint == "bump"
        self.given.append(trace)
        # As ``ProcRuntime._envelope``: no context given, a CALL takes the current span's only
        # while the package-level switch is on.
        if trace is None:
            trace = tm.outgoing_trace(1) if tm.TRACING else b""
        self._post(targets, trace)


def test_runtime_spans_are_rows_until_read_and_keep_their_links_and_times(
    telemetry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send side (``send_call_traced``) and the receive side (``run_endpoint``) record plain
    tuples; read (``finished_spans``, or packed and decoded) they are spans named, linked
    (user span > send span > receive span, one trace) and timed as the objects were."""
    monkeypatch.setattr(tm_tracing, "_pending", collections.deque(maxlen=64))
    monkeypatch.setattr(tm_tracing, "_spans", collections.deque(maxlen=64))
    envelope, cell = _Envelope(), _Cell()
    posted: list[bytes] = []

    def post(targets: Any, trace: bytes) -> None:
        assert targets == ["the target"]
        posted.append(trace)
        envelope.trace = trace

    before = time.time_ns()
    with span("step") as step:
        tm_tracing.send_call_traced(
            "call_one", _Endpoint(), _Posting(post), _Sender(), None, ["the target"], None, 0
        )
    assert tm_tracing.run_endpoint(cell, envelope, lambda x: x + 1, (1,), {}) == 2  # type: ignore[arg-type]
    after = time.time_ns()
    rows = [r for r in tm_tracing._pending if not isinstance(r, tm.Span)]
    assert len(rows) == 2
    assert sorted(len(r) for r in rows) == [7, 9]  # a receive row, a send row
    assert isinstance(step, tm.Span)
    by_name = {s.name: s for s in finished_spans()}
    sent, received = by_name["call_one counted.bump"], by_name["bump"]
    assert posted == [sent.trace_id + sent.span_id]  # the envelope's context: the send span's
    assert (sent.trace_id, sent.parent_id) == (step.trace_id, step.span_id)
    assert (received.trace_id, received.parent_id) == (sent.trace_id, sent.span_id)
    assert before <= step.start_ns <= sent.start_ns <= sent.end_ns <= step.end_ns
    assert sent.end_ns <= received.start_ns <= received.end_ns <= after
    assert sent.attributes == {
        "span.kind": "send",
        "adverb": "call_one",
        "endpoint": "bump",
        "mesh": "counted",
        "ranks": 1,
        "actor": "<root>",
    }
    assert received.attributes == {
        "span.kind": "receive",
        "actor": cell.display,
        "endpoint": "bump",
        "rank": 0,
    }
    assert (received.proc, received.track, received.status) == (_Runtime.label, cell.display, "ok")
    assert received.os_pid == os.getpid()
    assert received.thread_id == threading.get_ident()
    packed = tm_tracing.decode_batch(tm_tracing.encode_batch(list(tm_tracing._pending)))
    assert packed == [tm_tracing.SpanRecord.of(s) for s in finished_spans()]
    latency = _points("monarch.endpoint.latency", endpoint="bump")[0]
    assert latency.count == 1  # one clock: the receive span's duration
    assert latency.sum == pytest.approx(received.duration_s, rel=1e-9, abs=1e-12)


def test_a_root_send_row_starts_a_trace_and_its_ids_survive_packing(
    telemetry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send outside any span is a trace's root (its trace id this process's prefix and its
    span id, no parent); its receive span is its child; ids are distinct per span; the rows
    decode to the same records ``finished_spans`` makes of them."""
    monkeypatch.setattr(tm_tracing, "_pending", collections.deque(maxlen=64))
    monkeypatch.setattr(tm_tracing, "_spans", collections.deque(maxlen=64))
    envelope, cell = _Envelope(), _Cell()

    def post(targets: Any, trace: bytes) -> None:
        envelope.trace = trace

    for _ in range(3):
        tm_tracing.send_call_traced(
            "call_one", _Endpoint(), _Posting(post), _Sender(), None, ["one"], None, 0
        )
        tm_tracing.run_endpoint(cell, envelope, lambda: None, (), {})  # type: ignore[arg-type]
    spans = finished_spans()
    assert [s.name for s in spans] == ["call_one counted.bump", "bump"] * 3
    assert len({s.span_id for s in spans}) == 6
    assert all(len(s.span_id) == 8 and len(s.trace_id) == 16 for s in spans)
    for sent, received in zip(spans[::2], spans[1::2], strict=True):
        assert sent.parent_id == bytes(8)
        assert sent.trace_id == tm_tracing._trace_prefix + sent.span_id
        assert (received.trace_id, received.parent_id) == (sent.trace_id, sent.span_id)
    assert len({s.trace_id for s in spans}) == 3  # each root send, its own trace
    packed = tm_tracing.decode_batch(tm_tracing.encode_batch(list(tm_tracing._pending)))
    assert packed == [tm_tracing.SpanRecord.of(s) for s in spans]


def test_a_failed_post_or_body_ends_its_span_with_the_error(
    telemetry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tm_tracing, "_pending", collections.deque(maxlen=64))
    envelope, cell = _Envelope(), _Cell()

    def refused(targets: Any, trace: bytes) -> None:
        envelope.trace = trace
        raise RuntimeError("mailbox full")

    with pytest.raises(RuntimeError, match="mailbox full"):
        tm_tracing.send_call_traced(
            "call_one", _Endpoint(), _Posting(refused), _Sender(), None, ["one"], None, 0
        )

    def body() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        tm_tracing.run_endpoint(cell, envelope, body, (), {})  # type: ignore[arg-type]
    by_name = {s.name: s for s in finished_spans()}
    sent, received = by_name["call_one counted.bump"], by_name["bump"]
    assert (sent.status, sent.error) == ("error", "RuntimeError: mailbox full")
    assert (received.status, received.error) == ("error", "ValueError: bad input")
    assert received.parent_id == sent.span_id
    (errors,) = _points("monarch.endpoint.errors", endpoint="bump", category="user")
    assert errors.value == 1


def test_with_a_listener_runtime_spans_are_objects_at_once(telemetry: None) -> None:
    """A span listener wants ``Span`` objects as spans finish: the runtime's spans take the
    object path then (the listener sees the send and the receive span, linked)."""
    envelope, cell = _Envelope(), _Cell()
    seen: list[tm.Span] = []
    remove = tm.add_span_listener(seen.append)
    try:

        def post(targets: Any, trace: bytes) -> None:
            envelope.trace = trace

        tm_tracing.send_call_traced(
            "call", _Endpoint(), _Posting(post), _Sender(), None, ["one", "two"], None, 0
        )
        tm_tracing.run_endpoint(cell, envelope, lambda: 7, (), {})  # type: ignore[arg-type]
    finally:
        remove()
    assert [s.name for s in seen] == ["call counted.bump", "bump"]
    assert seen[1].parent_id == seen[0].span_id
    assert all(s.end_ns >= s.start_ns > 0 for s in seen)


def test_pending_spans_are_bounded_and_a_drop_is_counted_and_logged(
    telemetry: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """Rows wait in a bounded queue for the shipper; were it not to keep up, the oldest go,
    counted (``dropped_spans``) and logged by the shipper, never silently."""
    monkeypatch.setattr(tm_tracing, "MAX_PENDING_SPANS", 300)
    pending: collections.deque[Any] = collections.deque(maxlen=300)
    monkeypatch.setattr(tm_tracing, "_pending", pending)
    caplog.set_level(logging.WARNING, logger="monarch.actor.telemetry")
    told = threading.Event()

    class _Told(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "finished spans dropped" in record.getMessage():
                told.set()

    handler = _Told()
    logging.getLogger("monarch.actor.telemetry").addHandler(handler)
    request.addfinalizer(
        lambda: logging.getLogger("monarch.actor.telemetry").removeHandler(handler)
    )
    envelope, cell = _Envelope(), _Cell()
    envelope.trace = bytes(24)
    dropped = tm_tracing.dropped_spans()
    with tm_tracing._ship_lock:  # the shipper cannot drain meanwhile: it does not keep up
        tm_tracing._shipper._full = False
        for _ in range(500):
            tm_tracing.run_endpoint(cell, envelope, lambda: None, (), {})  # type: ignore[arg-type]
        assert len(pending) == 300
        assert tm_tracing.dropped_spans() - dropped == 200
    # the shipper logged the loss (seen by a handler on the logger itself: caplog's, on the
    # root logger, misses it when an earlier test turned the logger's propagation off)
    assert told.wait(T)
    assert tm_tracing.wait_stored(lambda: not pending, T)  # and packed the rest


def test_metric_logs_fold_when_full_from_several_threads(telemetry: None) -> None:
    """Four threads fill the endpoint-latency and depth logs past ``FOLD_AT`` (folds racing
    appends): no log ever holds ``FOLD_AT`` entries after its hook returned, and the snapshot
    counts every observation, its sum and extremes exact."""
    per_thread, nthreads = tm_metrics.FOLD_AT + 123, 4
    longest = [0]

    def work(k: int) -> None:
        for _ in range(per_thread):
            tm_metrics.record_elapsed("folded", 0.001 * (k + 1), None)
            tm_metrics.on_enqueued(k)
            longest[0] = max(longest[0], len(tm_metrics._latency_logs["folded"]))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(nthreads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert longest[0] < tm_metrics.FOLD_AT + nthreads  # each hook folds the log it filled
    (latency,) = _points("monarch.endpoint.latency", endpoint="folded")
    (depth,) = _points("monarch.mailbox.depth")
    total = per_thread * nthreads
    assert (latency.count, depth.count) == (total, total)
    assert latency.sum == pytest.approx(per_thread * 0.001 * (1 + 2 + 3 + 4))
    assert (latency.min, latency.max) == (0.001, 0.004)
    assert depth.sum == per_thread * (0 + 1 + 2 + 3)
    assert not tm_metrics._latency_logs["folded"]  # the snapshot folded what was pending


def test_sent_envelopes_are_counted_by_kind_and_size_and_sum_exactly(
    telemetry: None, procs: Procs
) -> None:
    """A sent envelope's kind and size are counted by a tick (``sent_counters``; a size seen
    first gets its counter then): across folds (snapshots) and a reset, the sent counts by kind
    and the payload histogram's count and sum are those of the envelopes sent, and a size never
    seen before is counted too, within the bound (``MAX_SENT_CODES``)."""
    # The size tables are per process and bounded (``MAX_SENT_CODES``): earlier tests of this
    # process may have filled them. Start from empty ones (what they counted folded first).
    tm_metrics._forget_sent_codes()
    actor = procs(gpus=1).spawn("counted", Counted)
    assert actor.bump.call_one(0).get(timeout=T) == 1
    metrics_snapshot()  # the warm-up's codes: counted from now on
    tm.reset_metrics()

    def sent(kind: str) -> tuple[float, int, float]:
        (count,) = _points("monarch.messages.sent", kind=kind)
        (size,) = _points("monarch.messages.payload_size", kind=kind)
        return count.value, size.count, size.sum

    counted_before = tm_metrics._sent_codes_counted()
    assert counted_before > 0
    size = 0.0  # one call envelope's payload size (all alike)
    for n in (3, 40):
        for _ in range(n):
            assert actor.bump.call_one(7).get(timeout=T) == 8
        count, sizes, total = sent("call")
        size = size or total / n
        assert [count, sizes, total] == [n, n, size * n]  # n envelopes of one size
        count, sizes, _ = sent("port_value")
        assert [count, sizes] == [n, n]
        tm.reset_metrics()
    large = 10**400  # a payload of a size not sent before: counted from its first envelope
    for _ in range(2):
        assert actor.bump.call_one(large).get(timeout=T) == large + 1
        metrics_snapshot()
    count, sizes, total = sent("call")
    assert (count, sizes) == (2, 2)
    assert total > 2 * size + 300  # the two large payloads
    assert tm_metrics._sent_codes_counted() > counted_before  # their codes are counted now
    assert tm_metrics._sent_codes_counted() <= tm_metrics.MAX_SENT_CODES


def test_sent_sizes_past_the_bound_are_logged_and_still_sum_exactly(telemetry: None) -> None:
    """Sizes of one kind beyond ``MAX_SENT_CODES`` distinct ones are logged, not counted
    (``_SentSizes.__missing__``): the table stops growing, and the sent count and the
    payload histogram's count and sum still equal what was ticked, across a fold."""
    tm_metrics._forget_sent_codes()
    sizes = tm_metrics.sent_counters[MessageKind.CALL]
    n = tm_metrics.MAX_SENT_CODES + 40
    for size in range(1000, 1000 + n):
        for _ in range(2):
            next(sizes[size])  # what ``ProcRuntime._prepare`` does per envelope
    assert tm_metrics._sent_codes_counted() == tm_metrics.MAX_SENT_CODES
    assert len(tm_metrics._sent_log) == 2 * 40  # the sizes past the bound, logged
    (count,) = _points("monarch.messages.sent", kind="call")
    (payload,) = _points("monarch.messages.payload_size", kind="call")
    assert count.value == payload.count == 2 * n
    assert payload.sum == 2 * sum(range(1000, 1000 + n))
    assert (payload.min, payload.max) == (1000, 1000 + n - 1)
    tm_metrics._forget_sent_codes()


def _plain() -> bool:
    """``tracing._PLAIN`` as it is now (a call: no narrowing between reads)."""
    return tm_tracing._PLAIN


def test_plain_follows_span_listeners_and_the_otel_mirror(telemetry: None) -> None:
    """``_PLAIN`` (the runtime's spans may be rows) is off while a span listener is set or the
    OpenTelemetry mirror is loaded, and back on when the last listener goes and the mirror is
    unloaded (``otel.load``/``unload`` called directly, as ``enable_telemetry`` does)."""
    assert _plain() is True
    first, second = tm.add_span_listener(lambda s: None), tm.add_span_listener(lambda s: None)
    assert _plain() is False
    first()
    assert _plain() is False  # one left
    second()
    assert _plain() is True
    pytest.importorskip("opentelemetry.trace")
    from monarch.actor._runtime.telemetry import otel as tm_otel

    try:
        tm_otel.load()
        assert _plain() is False
    finally:
        tm_otel.unload()
    assert _plain() is True


class _RacedListeners(list[Any]):
    """A span-listener list whose truth test (what ``_PLAIN`` is computed from) lets a
    concurrent ``add_span_listener`` land right after it, as a thread switch would: at once
    when the listeners' lock is free (nothing keeps the add out), else once the remover is done
    (the add would wait for the lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.deferred: list[Callable[[], None]] = []
        self.added: list[Callable[[], None]] = []

    def _add(self) -> None:
        self.added.append(tm.add_span_listener(lambda s: None))

    def __bool__(self) -> bool:
        result = len(self) > 0
        if self.armed:  # once
            self.armed = False
            if tm_listeners._listeners_lock.locked():
                self.deferred.append(self._add)
            else:
                self._add()
        return result


def test_a_remove_racing_an_add_leaves_plain_off(
    telemetry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remover computing ``_PLAIN`` (no listener left: on) while an add lands (off) must not
    store its stale value last: the listener added would never see the runtime's spans."""
    raced = _RacedListeners()
    monkeypatch.setattr(tm_tracing, "_span_listeners", raced)
    remove = tm.add_span_listener(lambda s: None)
    raced.armed = True
    try:
        remove()  # its ``_PLAIN`` computation lets the racing add in
        for add in raced.deferred:
            add()
        assert len(raced) == 1  # the racing add's listener
        assert _plain() is False
    finally:
        for removed in raced.added:
            removed()
    assert _plain() is True


def test_with_tracing_alone_switched_on_the_send_context_is_given(telemetry: None) -> None:
    """With a listener, the send span's context goes to the envelopes explicitly: during
    ``disable_telemetry()`` with ``tracing.set_enabled(True)`` called directly (the package-level
    ``TRACING`` off, so ``ProcRuntime._envelope`` would put no context), the receive span is
    still the send span's child."""
    tm.disable_telemetry()
    tm_tracing.set_enabled(True)
    envelope, cell = _Envelope(), _Cell()
    seen: list[tm.Span] = []
    remove = tm.add_span_listener(seen.append)

    def post(targets: Any, trace: bytes) -> None:
        envelope.trace = trace

    posting = _Posting(post)
    try:
        assert tm.TRACING is False
        assert tm_tracing.TRACING is True
        tm_tracing.send_call_traced(
            "call_one", _Endpoint(), posting, _Sender(), None, ["one"], None, 0
        )
        tm_tracing.run_endpoint(cell, envelope, lambda: 7, (), {})  # type: ignore[arg-type]
    finally:
        remove()
        tm_tracing.set_enabled(False)
    sent, received = seen
    assert posting.given == [sent.trace_id + sent.span_id]
    assert (received.trace_id, received.parent_id) == (sent.trace_id, sent.span_id)
