"""Where the time of one actor call goes: a per-stage profile of a ``call_one`` round trip.

Why: to cut the hot path (issue 23) one must know which stages dominate. This script spawns one
worker process (``this_host().spawn_procs``), then follows calls one at a time (nothing else in
flight) and takes a timestamp at each stage boundary, in the client and in the worker. Three
kinds of call: a tiny ``call_one``, one with a 1 MiB ``bytes`` argument and, where torch is
importable, one with a 64 MiB float32 tensor (both through the lane's shared-memory slots; for
them the copy into the slot and the worker's taking of it are timed too, ``WITHIN``):

    client   call -> encoded (args pickled) -> send (port opened, envelope built, transport
             entered) -> framed (frame encoded, or the buffer copied into shared memory) ->
             sent (lane write returned)
    worker   read (first recvmsg of the frame) -> decoded (envelope decoded, transport hands it
             over) -> enqueued (routed: mailbox put entered) -> picked (the actor thread took it) ->
             begun (args unpickled) -> returned (endpoint body done) -> reply_send (reply
             pickled, envelope built) -> reply_framed -> reply_sent
    client   reply_read (first recvmsg of the reply) -> reply_decoded -> delivered (the port's
             sink entered, about to complete the future's cell) -> done (``Future.get``
             returned the value)

Stages are the differences of consecutive timestamps, so they add up to the round trip; the
two "wire" stages (``framed`` -> worker ``read``, worker ``reply_framed`` -> ``reply_read``)
are the ``sendmsg``, kernel delivery and the reader's wake-up. The end of ``sendmsg``
(``sent``, ``reply_sent``) is reported apart, as an overlapping span: the kernel wakes the
reader inside that call, and the reader often runs before it returns. Both processes read
``time.perf_counter_ns``, which is ``CLOCK_MONOTONIC`` on Linux, one clock for every process of
the machine.

The probes are wrappers this script installs around runtime functions (``_encode``,
``NodeProcessTransport.send``, ``encode_frame``, ``LaneDecoder.get_buffer`` /
``buffer_updated``, ``_on_inbound``, ``_Mailbox.put``, ``_SyncRunner._call``,
``ActorCell._begin`` / ``_reply_value``, ``_Cell.set_result``): the package has no
probe code at all, so with probes off (every program but this one) the hot path is unchanged.
In the worker an endpoint of the profiled actor installs them. They cost some tens of microseconds
per call when on, so the script also times the same calls without them (``plain``) and reports
both round trips.

CPU per call: process CPU time (``time.process_time``, all threads) of the client and of the
worker over the plain calls, divided by the number of calls. Instructions per call, of both
processes over the plain calls, less what an empty counting window costs: where
``perf stat -e instructions:u`` counts (a PMU the kernel lets us use), ``perf`` is attached to
both processes; with ``--callgrind``, the script runs again under ``valgrind --tool=callgrind
--instr-atstart=no --trace-children=yes`` (the worker too) and ``callgrind_control`` switches
the counting on and off around the plain calls (every time of that run is then 10 to 50 times
too long: only its instruction counts mean something). Where neither is asked for or possible,
the report says why and gives the CPU time only.

    .venv/bin/python benchmarks/actor_profile.py            # 2,000 + 300 + 40 calls, ~20 s
    .venv/bin/python benchmarks/actor_profile.py --quick    # 500 + 100 + 15 calls
    .venv/bin/python benchmarks/actor_profile.py --smoke    # 30 + 10 + 3 calls (CI, ~3 s)
    .venv/bin/python benchmarks/actor_profile.py --json out.json   # the report as JSON
    .venv/bin/python benchmarks/actor_profile.py --callgrind  # instructions per call (~2 min)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import os
import pstats
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    add_run_arguments,
    machine_facts,
    machine_line,
    partial_run_warning,
    run_mode,
    write_json,
)
from monarch.actor import Actor, endpoint, this_host  # noqa: E402
from monarch.actor._base.envelope import MessageKind  # noqa: E402
from monarch.actor._base.future import _Cell  # noqa: E402
from monarch.actor._mesh.adverbs import Endpoint  # noqa: E402
from monarch.actor._runtime.cell import ActorCell, _Mailbox, _SyncRunner  # noqa: E402
from monarch.actor._transport import node as _node  # noqa: E402
from monarch.actor._transport import shm as _shm  # noqa: E402
from monarch.actor._transport.lane_proto import LaneDecoder  # noqa: E402

PROFILED = frozenset({"ping", "nbytes", "numel"})
"""The endpoints whose calls are followed (other traffic, heartbeats included, is ignored)."""

MIB = 1 << 20

#: (stage, process, from mark, to mark), in the order a call passes them.
STAGES: tuple[tuple[str, str, str, str], ...] = (
    ("client encode (args pickled)", "client", "call", "encoded"),
    ("envelope (port, Envelope, post)", "client", "encoded", "send"),
    ("frame encode / shm copy", "client", "send", "framed"),
    ("lane write + wire + worker wake-up", "both", "framed", "w.read"),
    ("worker read + frame decode", "worker", "w.read", "w.decoded"),
    ("route (to the mailbox put)", "worker", "w.decoded", "w.enqueued"),
    ("mailbox put + actor-thread hand-off", "worker", "w.enqueued", "w.picked"),
    ("args decode (unpickle)", "worker", "w.picked", "w.begun"),
    ("endpoint body", "worker", "w.begun", "w.returned"),
    ("reply encode + envelope", "worker", "w.returned", "w.reply_send"),
    ("reply frame encode", "worker", "w.reply_send", "w.reply_framed"),
    ("reply lane write + wire + client wake-up", "both", "w.reply_framed", "reply_read"),
    ("client read + frame decode", "client", "reply_read", "reply_decoded"),
    ("reply dispatch (port, sink)", "client", "reply_decoded", "delivered"),
    ("future completion (wake, decode)", "client", "delivered", "done"),
)

#: Spans that overlap the stages above (not part of their sum): how long the writer's
#: ``sendmsg`` call took. The kernel wakes the reader inside it, and on a busy machine the
#: reader often runs before the writer's call returns, so the write's end is no stage boundary.
OVERLAPPING: tuple[tuple[str, str, str, str], ...] = (
    ("(overlaps) client send returned after", "client", "framed", "sent"),
    ("(overlaps) worker reply send returned after", "worker", "w.reply_framed", "w.reply_sent"),
)

#: Spans inside the stages above, for calls whose buffers travel in shared memory (absent for
#: the others): the sender's copy into its memfd slots (``ShmPool.put``, inside "frame encode /
#: shm copy") and the receiver's taking of the slots (``shm.receive_buffer``: a copy out of a
#: view, a read, or a mapping; inside "worker read + frame decode"). Each is the sum over the
#: call's slots. A lent ``bytes`` (``ShmPool.lend``, no copy on the sender) is read by the
#: receiver out of the sender's memory (``PeerReader.read``), which counts as its slot take.
WITHIN: tuple[tuple[str, str, str], ...] = (
    ("(within) client shm slot copy", "client", "shm_put"),
    ("(within) worker shm slot take", "worker", "w.shm_take"),
)


# --------------------------------------------------------------------------------------------
# Probes: wrappers installed by this script only


class _Recorder:
    """The timestamps of the call being followed in this process, and those of past calls."""

    def __init__(self) -> None:
        self.current: dict[str, int] = {}
        self.records: collections.deque[dict[str, int]] = collections.deque(maxlen=100_000)
        self.active = False  # client: a followed call is between ``begin`` and ``finish``
        self.env: Any = None  # worker: the envelope of the call its actor thread runs
        #: worker: calls read but not yet taken by the actor thread, by ``id`` of the envelope
        self.arrived: dict[int, tuple[Any, dict[str, int]]] = {}
        self.actor_thread = 0
        self.send_thread = 0  # the thread inside a followed ``send`` (0: none)
        self.last_buffer = 0
        self.read_start = 0
        self.previous_read = 0
        self.shm_take = 0  # worker: ns spent taking shm slots since the last frame handed over
        self.installed: list[tuple[Any, str, Any]] = []

    def begin(self) -> None:
        self.current = {"call": time.perf_counter_ns()}
        self.active = True

    def finish(self) -> None:
        self.current["done"] = time.perf_counter_ns()
        self.active = False
        self.records.append(self.current)
        self.current = {}

    def wrap(
        self,
        owner: Any,
        name: str,
        before: Callable[..., None] | None = None,
        after: Callable[..., None] | None = None,
    ) -> None:
        """Replace ``owner.name`` by a wrapper calling ``before(*args)`` and
        ``after(result, *args)`` around it (positional arguments only)."""
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before(*args)
            result = original(*args, **kwargs)
            if after is not None:
                after(result, *args)
            return result

        setattr(owner, name, wrapper)
        self.installed.append((owner, name, original))

    def uninstall(self) -> None:
        """Put every wrapped function back (last wrapped first)."""
        while self.installed:
            owner, name, original = self.installed.pop()
            setattr(owner, name, original)

    # -- hooks shared by both sides -----------------------------------------------------------
    def _framed_key(self) -> str:
        return "framed" if self.active else "reply_framed"

    def _on_framed(self, _result: object, *_args: object) -> None:
        if self.send_thread == threading.get_ident():
            self.current.setdefault(self._framed_key(), time.perf_counter_ns())

    def _on_get_buffer(self, *_args: object) -> None:
        self.last_buffer = time.perf_counter_ns()

    def _on_buffer_updated(self, *_args: object) -> None:
        if not self.read_start:
            self.read_start = self.last_buffer

    def _take_read_start(self) -> int:
        """When the frame now handed over began to be read: the first ``recvmsg`` that
        returned bytes since the last frame, or, for a second frame out of the same read, the
        start of that read."""
        read = self.read_start or self.previous_read
        self.previous_read, self.read_start = read, 0
        return read

    def _timed(self, owner: Any, name: str, add: Callable[[int], None]) -> None:
        """Replace ``owner.name`` by a wrapper that reports its duration (ns) to ``add``."""
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                add(time.perf_counter_ns() - t0)

        setattr(owner, name, wrapper)
        self.installed.append((owner, name, original))

    def _add_put(self, ns: int) -> None:
        if self.send_thread == threading.get_ident():
            self.current["shm_put"] = self.current.get("shm_put", 0) + ns

    def _add_take(self, ns: int) -> None:
        self.shm_take += ns

    def _install_common(self) -> None:
        self._timed(_shm.ShmPool, "put", self._add_put)
        self._timed(_shm.ShmPool, "lend", self._add_put)
        self._timed(_shm, "receive_buffer", self._add_take)
        self._timed(_shm.PeerReader, "read", self._add_take)
        self.wrap(_node, "encode_frame", after=self._on_framed)
        self.wrap(_node.NodeProcessTransport, "_share", after=self._on_framed)
        self.wrap(LaneDecoder, "get_buffer", before=self._on_get_buffer)
        self.wrap(LaneDecoder, "buffer_updated", before=self._on_buffer_updated)

    # -- the client's side --------------------------------------------------------------------
    def install_client(self) -> None:
        """Follow the calls this process makes between ``begin`` and ``finish``."""
        self._install_common()
        self.wrap(Endpoint, "_encode", after=self._client_encoded)
        self.wrap(
            _node.NodeProcessTransport, "send", before=self._client_send, after=self._client_sent
        )
        self.wrap(_node.NodeProcessTransport, "_on_inbound", before=self._client_inbound)
        # The reply completes its call's cell (the port table hands a one-reply port's reply
        # to the cell itself, without ``OneSink.deliver``).
        self.wrap(_Cell, "set_result", before=self._client_delivered)

    def _client_encoded(self, _result: object, endpoint: Any, *_args: object) -> None:
        if self.active and endpoint.name in PROFILED:
            self.current.setdefault("encoded", time.perf_counter_ns())

    def _client_send(self, _transport: object, envelope: Any, *_args: object) -> None:
        if (
            self.active
            and envelope.kind == MessageKind.CALL
            and envelope.endpoint in PROFILED
            and "send" not in self.current
        ):
            self.current["send"] = time.perf_counter_ns()
            self.current["port"] = envelope.reply_port.index
            self.current["seq"] = envelope.sequence
            self.send_thread = threading.get_ident()

    def _client_sent(self, _result: object, *_args: object) -> None:
        if self.send_thread == threading.get_ident():
            self.current["sent"] = time.perf_counter_ns()
            self.send_thread = 0

    def _client_inbound(self, _transport: object, _peer: object, envelope: Any, *_: object) -> None:
        now = time.perf_counter_ns()
        read = self._take_read_start()
        if (
            self.active
            and envelope.kind == MessageKind.PORT_VALUE
            and envelope.port == self.current.get("port")
        ):
            if read:
                self.current["reply_read"] = read
            self.current["reply_decoded"] = now

    def _client_delivered(self, *_args: object) -> None:
        if self.active and "reply_decoded" in self.current:
            self.current.setdefault("delivered", time.perf_counter_ns())

    # -- the worker's side --------------------------------------------------------------------
    def install_worker(self) -> None:
        """Follow every call of a profiled endpoint that reaches this process."""
        self._install_common()
        self.wrap(_node.NodeProcessTransport, "_on_inbound", before=self._worker_inbound)
        self.wrap(_Mailbox, "put", before=self._worker_enqueued)
        self.wrap(_SyncRunner, "_call", before=self._worker_picked)
        self.wrap(ActorCell, "_begin", after=self._worker_begun)
        self.wrap(ActorCell, "_reply_value", before=self._worker_returned)
        self.wrap(
            _node.NodeProcessTransport, "send", before=self._worker_send, after=self._worker_sent
        )

    def _worker_inbound(self, _transport: object, _peer: object, envelope: Any, *_: object) -> None:
        now = time.perf_counter_ns()
        read = self._take_read_start()
        take, self.shm_take = self.shm_take, 0
        if envelope.kind == MessageKind.CALL and envelope.endpoint in PROFILED:
            record = {"seq": envelope.sequence, "decoded": now}
            if take:
                record["shm_take"] = take
            if read:
                record["read"] = read
            if len(self.arrived) >= 10_000:  # bounded: calls never taken are forgotten
                self.arrived.clear()
            self.arrived[id(envelope)] = (envelope, record)

    def _worker_enqueued(self, _mailbox: object, item: Any, *_: object) -> None:
        env = getattr(item, "env", None)
        if env is not None and id(env) in self.arrived:
            self.arrived[id(env)][1].setdefault("enqueued", time.perf_counter_ns())

    def _worker_picked(self, _runner: object, item: Any, *_: object) -> None:
        now = time.perf_counter_ns()
        found = self.arrived.pop(id(item.env), None)
        if found is not None and found[0] is item.env:
            self.env, self.current = found
            self.current["picked"] = now
            self.actor_thread = threading.get_ident()

    def _worker_begun(self, _result: object, _cell: object, item: Any, *_: object) -> None:
        if self.env is not None and item.env is self.env:
            self.current.setdefault("begun", time.perf_counter_ns())

    def _worker_returned(self, _cell: object, env: Any, *_: object) -> None:
        if self.env is not None and env is self.env:
            self.current.setdefault("returned", time.perf_counter_ns())

    def _worker_send(self, _transport: object, envelope: Any, *_: object) -> None:
        if (
            self.env is not None
            and envelope.kind == MessageKind.PORT_VALUE
            and threading.get_ident() == self.actor_thread
            and "reply_send" not in self.current
        ):
            self.current["reply_send"] = time.perf_counter_ns()
            self.send_thread = threading.get_ident()

    def _worker_sent(self, _result: object, *_args: object) -> None:
        if self.send_thread == threading.get_ident() and self.env is not None:
            self.current["reply_sent"] = time.perf_counter_ns()
            self.send_thread = 0
            self.records.append(self.current)
            self.current = {}
            self.env = None


_RECORDER = _Recorder()
"""This process's recorder (the client's in the client, the worker's in the worker)."""


class Profiled(Actor):
    """The worker's actor: the profiled endpoints and the probes' remote control."""

    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def nbytes(self, payload: bytes) -> int:
        return len(payload)

    @endpoint
    def numel(self, tensor: Any) -> int:
        return int(tensor.numel())

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def cpu_seconds(self) -> float:
        return time.process_time()

    @endpoint
    def install_probes(self) -> None:
        if not _RECORDER.installed:
            _RECORDER.install_worker()

    @endpoint
    def take_records(self) -> list[dict[str, int]]:
        records = list(_RECORDER.records)
        _RECORDER.records.clear()
        return records

    @endpoint
    def uninstall_probes(self) -> None:
        _RECORDER.uninstall()

    @endpoint
    def usage(self) -> tuple[float, int, int, int, int]:
        return process_usage()

    @endpoint
    def start_thread_profiles(self) -> None:
        _PROFILES.start()

    @endpoint
    def stop_thread_profiles(self) -> None:
        _PROFILES.stop()

    @endpoint
    def take_thread_profiles(self) -> dict[str, tuple[int, float]]:
        return _PROFILES.take()


# --------------------------------------------------------------------------------------------
# Pipelined calls: per-call CPU, faults and context switches of both processes, and which
# Python functions run per call (cProfile in every thread of both processes)


def process_usage() -> tuple[float, int, int, int, int]:
    """This process's CPU seconds (all threads), minor page faults, voluntary and involuntary
    context switches, and garbage collections (all generations) so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    collections_ = sum(generation["collections"] for generation in gc.get_stats())
    return time.process_time(), ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw, collections_


#: Functions that run on the runtime's threads at every call (the loop thread: lane reads,
#: acknowledgements, the outbox drain; the worker's actor thread: ``_SyncRunner._call``): the
#: first time one runs in a thread while profiling is on, that thread's profiler starts, and
#: the first time after ``stop`` it stops (a profiler can only be switched in its own thread).
THREAD_HOOKS: tuple[tuple[Any, str], ...] = (
    (_node.NodeProcessTransport, "_on_inbound"),
    (_node.NodeProcessTransport, "_drain_outbox"),
    (_SyncRunner, "_call"),
)


class _ThreadProfiles:
    """One ``cProfile.Profile`` per thread of this process that passes a hook (and the thread
    that calls ``start``), merged by ``take``: function -> (calls, own seconds)."""

    def __init__(self) -> None:
        self.on = False
        self.profiles: dict[int, cProfile.Profile] = {}
        self.stopped: set[int] = set()
        self.installed: list[tuple[Any, str, Any]] = []
        self.lock = threading.Lock()

    def _visit(self) -> None:
        ident = threading.get_ident()
        with self.lock:
            if self.on and ident not in self.profiles:
                profile = self.profiles[ident] = cProfile.Profile()
            elif not self.on and ident in self.profiles and ident not in self.stopped:
                self.stopped.add(ident)
                profile = self.profiles[ident]
                profile.disable()
                return
            else:
                return
        profile.enable()

    def start(self) -> None:
        self.profiles.clear()
        self.stopped.clear()
        for owner, name in THREAD_HOOKS:
            original = getattr(owner, name)

            def wrapper(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                self._visit()
                return __original(*args, **kwargs)

            setattr(owner, name, wrapper)
            self.installed.append((owner, name, original))
        self.on = True
        self._visit()

    def stop(self) -> None:
        """Stop profiling (the calling thread now, the others when they next pass a hook)."""
        self.on = False
        self._visit()

    def take(self) -> dict[str, tuple[int, float]]:
        """The merged profile of the threads that stopped; hooks removed."""
        while self.installed:
            owner, name, original = self.installed.pop()
            setattr(owner, name, original)
        merged: dict[str, tuple[int, float]] = {}
        for ident, profile in self.profiles.items():
            if ident not in self.stopped:
                continue  # still on in a thread that never came back: its counts are unsafe
            stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            for (filename, line, function), (_cc, calls, own, _cum, _callers) in stats.items():
                key = _function_name(filename, line, function)
                old = merged.get(key, (0, 0.0))
                merged[key] = (old[0] + calls, old[1] + own)
        self.profiles.clear()
        return merged


def _function_name(filename: str, line: int, function: str) -> str:
    if filename == "~":  # a built-in: "<method 'sendmsg' of '_socket.socket' objects>"
        return function
    parts = Path(filename).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else filename
    return f"{short}:{line}({function})"


_PROFILES = _ThreadProfiles()
"""This process's per-thread profiles (pipelined section)."""

PIPELINE_BATCH = 8
"""Calls in flight at once in the pipelined section (``actor_bench.py``'s 1 MiB batches)."""


def _pipelined_calls(actor: Any, kind: str, n: int, payload: Any) -> None:
    done = 0
    while done < n:
        count = min(PIPELINE_BATCH, n - done)
        if kind == "call_one":
            futures = [actor.ping.call_one(done + i) for i in range(count)]
            for i, future in enumerate(futures):
                if future.get(timeout=30) != done + i:
                    raise RuntimeError("wrong echo")
        else:
            futures = [actor.nbytes.call_one(payload) for _ in range(count)]
            for future in futures:
                if future.get(timeout=30) != len(payload):
                    raise RuntimeError("wrong length")
        done += count


def pipelined(actor: Any, kind: str, n: int, profile: bool = True) -> dict[str, Any]:
    """``n`` calls of ``kind`` in batches of ``PIPELINE_BATCH`` (as ``actor_bench.py``'s 1 MiB
    figure): wall time, CPU, minor faults and context switches per call of both processes;
    then, with ``profile``, the same calls again under cProfile in every thread of both
    processes: which functions run how often per call (the times of that run are inflated by
    the profiler; its call counts are exact)."""
    payload = _payload(kind)
    _pipelined_calls(actor, kind, max(2 * PIPELINE_BATCH, n // 10), payload)  # warm-up
    w0 = actor.usage.call_one().get(timeout=30)
    c0 = process_usage()
    t0 = time.perf_counter_ns()
    _pipelined_calls(actor, kind, n, payload)
    wall = time.perf_counter_ns() - t0
    c1 = process_usage()
    w1 = actor.usage.call_one().get(timeout=30)
    per = {
        side: {
            "cpu_us": (b[0] - a[0]) / n * 1e6,
            "minor_faults": (b[1] - a[1]) / n,
            "voluntary_switches": (b[2] - a[2]) / n,
            "involuntary_switches": (b[3] - a[3]) / n,
            "gc_collections": (b[4] - a[4]) / n,
        }
        for side, a, b in (("client", c0, c1), ("worker", w0, w1))
    }
    result: dict[str, Any] = {
        "calls": n,
        "batch": PIPELINE_BATCH,
        "wall_us_per_call": wall / n / 1000,
        "per_call": per,
    }
    if kind != "call_one":
        result["MBps"] = n * len(payload) / (wall / 1e9) / 1e6
    if profile:
        actor.start_thread_profiles.call_one().get(timeout=30)
        _PROFILES.start()
        try:
            _pipelined_calls(actor, kind, n, payload)
        finally:
            _PROFILES.stop()
            actor.stop_thread_profiles.call_one().get(timeout=30)
            # one more round so that every thread passes a hook and stops its profiler
            _pipelined_calls(actor, "call_one", PIPELINE_BATCH, None)
        functions = {
            "client": _PROFILES.take(),
            "worker": actor.take_thread_profiles.call_one().get(timeout=30),
        }
        result["functions"] = {
            side: {name: [calls / n, own / n * 1e6] for name, (calls, own) in table.items()}
            for side, table in functions.items()
        }
    return result


def function_diff(
    small: dict[str, list[float]], large: dict[str, list[float]], top: int
) -> list[tuple[str, float, float, float]]:
    """Functions whose per-call count or own time grew from ``small`` to ``large`` calls:
    ``(name, calls per large call, extra calls per call, extra own us per call)``, most extra
    time first, at most ``top``."""
    rows = []
    for name, (calls, own) in large.items():
        base_calls, base_own = small.get(name, [0.0, 0.0])
        if calls - base_calls > 0.05 or own - base_own > 1.0:
            rows.append((name, calls, calls - base_calls, own - base_own))
    rows.sort(key=lambda row: -row[3])
    return rows[:top]


def pipelined_report(section: dict[str, Any], top: int = 25) -> str:
    """The pipelined section as Markdown."""
    small, large = section["call_one"], section["payload_1mib"]
    lines = [
        f"### Pipelined calls (batches of {PIPELINE_BATCH}, as `actor_bench.py`'s 1 MiB figure)",
        "",
        "| per call | call_one | payload_1mib |",
        "|---|---:|---:|",
        f"| wall us | {_fmt(small['wall_us_per_call'])} | {_fmt(large['wall_us_per_call'])} |",
    ]
    for side in ("client", "worker"):
        for key, label in (
            ("cpu_us", "CPU us"),
            ("minor_faults", "minor faults"),
            ("voluntary_switches", "voluntary context switches"),
            ("involuntary_switches", "involuntary context switches"),
            ("gc_collections", "garbage collections"),
        ):
            lines.append(
                f"| {side} {label} | {_fmt(small['per_call'][side][key], 2)} | "
                f"{_fmt(large['per_call'][side][key], 2)} |"
            )
    if "MBps" in large:
        lines.append(f"| 1 MiB MB/s | | {_fmt(large['MBps'])} |")
    if "functions" in small and "functions" in large:
        for side in ("client", "worker"):
            lines += [
                "",
                f"{side}: what a pipelined 1 MiB call runs beyond a tiny one (cProfile in every "
                "thread; own time inflated by the profiler, counts exact)",
                "",
                "| function | calls per 1 MiB call | extra calls | extra own us |",
                "|---|---:|---:|---:|",
            ]
            diff = function_diff(small["functions"][side], large["functions"][side], top)
            for name, calls, extra_calls, extra_own in diff:
                lines.append(f"| `{name}` | {calls:.2f} | {extra_calls:+.2f} | {extra_own:+.1f} |")
            total_small = sum(own for _c, own in small["functions"][side].values())
            total_large = sum(own for _c, own in large["functions"][side].values())
            lines.append(
                f"| all profiled functions (own us per call) | | | "
                f"{total_large - total_small:+.1f} ({total_small:.0f} -> {total_large:.0f}) |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Instructions (perf), where the machine counts them


def perf_instructions_available() -> str | None:
    """``None`` if ``perf stat -e instructions:u`` counts here, else why not (for the report)."""
    perf = shutil.which("perf")
    if perf is None:
        return "no perf on this machine"
    try:
        probe = subprocess.run(
            [perf, "stat", "-x,", "-e", "instructions:u", "true"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf could not run: {exc}"
    if probe.returncode != 0 or parse_perf_count(probe.stderr) is None:
        last = probe.stderr.strip().splitlines()[-1:] or [""]
        return f"perf stat cannot count instructions here ({last[0][:80]!r})"
    return None


def parse_perf_count(stderr: str) -> int | None:
    """The instruction count of a ``perf stat -x,`` report, ``None`` if it has none (the
    counter is ``<not supported>`` or ``<not counted>``)."""
    for line in stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2].startswith("instructions") and fields[0].isdigit():
            return int(fields[0])
    return None


class _PerfAttach:
    """``perf stat -e instructions:u -p PID`` for each pid, from ``start`` to ``stop``."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        self.procs = []
        for pid in self.pids:
            self.procs.append(
                subprocess.Popen(
                    ["perf", "stat", "-x,", "-e", "instructions:u", "-p", str(pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        time.sleep(0.2)  # perf attaches asynchronously; counting starts a little later

    def stop(self) -> list[int | None]:
        counts: list[int | None] = []
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
            try:
                _out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
            counts.append(parse_perf_count(err))
        return counts


UNDER_CALLGRIND = "ACTOR_PROFILE_UNDER_CALLGRIND"
"""Set in the environment of the run ``--callgrind`` starts under valgrind."""

_THREAD_TOTAL = re.compile(r"^\s*Th\s+\d+\s+([\d,]+)\s*$", re.MULTILINE)


def parse_callgrind_totals(stdout: str) -> int | None:
    """The instructions (``Ir``) of every thread of a ``callgrind_control -e Ir PID`` answer,
    summed; ``None`` if it has none (instrumentation off, no such run)."""
    counts = [int(m.group(1).replace(",", "")) for m in _THREAD_TOTAL.finditer(stdout)]
    return sum(counts) if counts else None


class _CallgrindCounters:
    """Instructions of processes running under ``valgrind --tool=callgrind --instr-atstart=no``:
    instrumentation switched on at ``start`` and off at ``stop`` with ``callgrind_control``."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.base: list[int | None] = []

    @staticmethod
    def _control(*args: str) -> str:
        """``callgrind_control *args``'s answer, asked up to three times: ``vgdb`` sometimes
        fails to interrupt a process whose threads all wait in system calls (an assertion in
        its ptrace invoker), and then answers nothing useful."""
        answer = ""
        for _ in range(3):
            done = subprocess.run(
                ["callgrind_control", *args],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            answer = done.stdout
            switched = args[0] == "-i" and "OK" in answer
            if switched or parse_callgrind_totals(answer) is not None:
                break
        return answer

    def start(self) -> None:
        for pid in self.pids:
            self._control("-i", "on", str(pid))
        self.base = [parse_callgrind_totals(self._control("-e", "Ir", str(p))) for p in self.pids]

    def stop(self) -> list[int | None]:
        ends = [parse_callgrind_totals(self._control("-e", "Ir", str(p))) for p in self.pids]
        for pid in self.pids:
            self._control("-i", "off", str(pid))
        return [
            None if end is None or base is None else end - base
            for base, end in zip(self.base, ends, strict=True)
        ]


def rerun_under_callgrind(argv: Sequence[str]) -> int:
    """Run this script again, with ``argv``, under callgrind (instrumentation off until the
    plain calls; the worker processes it starts are followed into valgrind too); its exit
    status."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("--callgrind needs valgrind and callgrind_control", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="actor-profile-cg-") as folder:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--trace-children=yes",
            f"--callgrind-out-file={folder}/callgrind.out.%p",
            "--log-file=" + os.path.join(folder, "valgrind.%p.log"),
            sys.executable,
            str(Path(__file__).resolve()),
            *argv,
        ]
        env = dict(os.environ, **{UNDER_CALLGRIND: "1"})
        return subprocess.call(command, env=env)


# --------------------------------------------------------------------------------------------
# Measuring


def _pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[k]


def _stats_us(values_ns: Sequence[float]) -> dict[str, float]:
    us = [v / 1000 for v in values_ns]
    return {"median_us": _pct(us, 50), "p90_us": _pct(us, 90), "n": len(us)}


def join_records(
    client: Sequence[dict[str, int]], worker: Sequence[dict[str, int]]
) -> list[dict[str, int]]:
    """One mark table per call: the client's marks, and the worker's under ``w.``, paired by
    the envelope's sequence number (``seq``). Calls either side missed are left out."""
    by_seq = {w["seq"]: w for w in worker if "seq" in w}
    joined = []
    for c in client:
        w = by_seq.get(c.get("seq", -1))
        if w is None:
            continue
        row = dict(c)
        row.update({f"w.{k}": v for k, v in w.items()})
        joined.append(row)
    return joined


def stage_table(rows: Sequence[dict[str, int]]) -> list[dict[str, Any]]:
    """Median, p90 and share of the median round trip of every stage over ``rows``."""
    totals = [r["done"] - r["call"] for r in rows]
    total_median = _pct(totals, 50)
    table: list[dict[str, Any]] = []
    for stage, process, start, end in STAGES + OVERLAPPING:
        values = [r[end] - r[start] for r in rows if start in r and end in r]
        entry: dict[str, Any] = {"stage": stage, "process": process, "from": start, "to": end}
        if values:
            entry.update(_stats_us(values))
            entry["share"] = _pct(values, 50) / total_median if total_median else 0.0
        else:
            entry.update({"median_us": None, "p90_us": None, "n": 0, "share": None})
        table.append(entry)
        if stage == STAGES[-1][0]:
            table.append({"stage": "round trip (probed)", "process": "client", **_stats_us(totals)})
    for stage, process, key in WITHIN:
        values = [r[key] for r in rows if key in r]
        entry = {"stage": stage, "process": process, "from": key, "to": key}
        if values:
            entry.update(_stats_us(values))
            entry["share"] = _pct(values, 50) / total_median if total_median else 0.0
        else:
            entry.update({"median_us": None, "p90_us": None, "n": 0, "share": None})
        table.append(entry)
    return table


def _one_call(actor: Any, kind: str, i: int, payload: Any) -> None:
    if kind == "call_one":
        if actor.ping.call_one(i).get(timeout=30) != i:
            raise RuntimeError("wrong echo")
    elif kind == "tensor_64mib":
        if actor.numel.call_one(payload).get(timeout=60) != payload.numel():
            raise RuntimeError("wrong element count")
    elif actor.nbytes.call_one(payload).get(timeout=30) != len(payload):
        raise RuntimeError("wrong length")


def _payload(kind: str) -> Any:
    """The argument of the calls of ``kind``: 1 MiB of ``bytes``, or a 64 MiB float32 tensor."""
    if kind == "tensor_64mib":
        import torch  # only for this case (the script runs without torch)

        return torch.ones(16 * MIB, dtype=torch.float32)
    return b"x" * MIB


def measure(actor: Any, kind: str, n: int, worker_pid: int, counter: str | None) -> dict[str, Any]:
    """Plain calls (wall time, CPU, instructions), then the same calls probed (stages)."""
    payload = _payload(kind)
    for i in range(max(2 if kind == "tensor_64mib" else 5, n // 10)):  # warm-up
        _one_call(actor, kind, i, payload)
    # plain: no probe anywhere
    pids = [os.getpid(), worker_pid]
    counters: _PerfAttach | _CallgrindCounters | None = None
    if counter == "perf":
        counters = _PerfAttach(pids)
    elif counter == "callgrind":
        counters = _CallgrindCounters(pids)
    idle: list[int | None] = []
    if counters is not None:  # what counting itself adds: an empty window, subtracted below
        counters.start()
        idle = counters.stop()
    worker_cpu0 = actor.cpu_seconds.call_one().get(timeout=30)
    if counters is not None:
        counters.start()
    cpu0 = time.process_time()
    walls = []
    for i in range(n):
        t = time.perf_counter_ns()
        _one_call(actor, kind, i, payload)
        walls.append(time.perf_counter_ns() - t)
    cpu1 = time.process_time()
    counts = counters.stop() if counters is not None else None
    worker_cpu1 = actor.cpu_seconds.call_one().get(timeout=30)
    result: dict[str, Any] = {
        "calls": n,
        "round_trip": _stats_us(walls),
        "cpu_us_per_call": {
            "client": (cpu1 - cpu0) / n * 1e6,
            "worker": (worker_cpu1 - worker_cpu0) / n * 1e6,
        },
    }
    if counts is not None:
        result["instructions_per_call"] = {
            side: per_call(count, empty, n)
            for side, count, empty in zip(("client", "worker"), counts, idle, strict=True)
        }
    # probed
    _RECORDER.records.clear()
    _RECORDER.install_client()
    try:
        actor.install_probes.call_one().get(timeout=30)
        actor.take_records.call_one().get(timeout=30)
        for i in range(n):
            _RECORDER.begin()
            _one_call(actor, kind, i, payload)
            _RECORDER.finish()
        worker_records = actor.take_records.call_one().get(timeout=30)
        actor.uninstall_probes.call_one().get(timeout=30)
    finally:
        _RECORDER.uninstall()
    rows = join_records(list(_RECORDER.records), worker_records)
    _RECORDER.records.clear()
    if not rows:
        raise RuntimeError("no call was seen by both the client's and the worker's probes")
    result["followed"] = len(rows)
    result["stages"] = stage_table(rows)
    return result


def per_call(count: int | None, idle: int | None, n: int) -> float | None:
    """Instructions per call: a window's ``count`` of ``n`` calls less the ``idle`` count of an
    empty window (what starting and stopping the counters costs); ``None`` if either is
    missing."""
    if count is None or idle is None:
        return None
    return (count - idle) / n


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def report(document: dict[str, Any]) -> str:
    """The profile as Markdown: one stage table with both kinds of call side by side."""
    kinds = [k for k in KINDS if k in document["cases"]]
    lines = [
        "## Actor call profile (`benchmarks/actor_profile.py`)",
        "",
        *partial_run_warning(document["mode"]),
        *(
            [
                "**Under callgrind: every time below is 10 to 50 times too long; only the "
                "instruction counts mean something.**",
                "",
            ]
            if document["instruction_counter"] == "callgrind"
            else []
        ),
        f"{machine_line(document)}; one worker process, one call at a time.",
        "",
        "| stage | process | " + " | ".join(f"{k} p50 us | p90 us | share" for k in kinds) + " |",
        "|---|---|" + "---:|---:|---:|" * len(kinds),
    ]
    tables = [document["cases"][k]["stages"] for k in kinds]
    for i, first in enumerate(tables[0]):
        cells = []
        for table in tables:
            entry = table[i]
            share = entry.get("share")
            cells.append(
                f"{_fmt(entry['median_us'])} | {_fmt(entry['p90_us'])} | "
                + ("" if share is None else f"{share:.0%}")
            )
        lines.append(f"| {first['stage']} | {first['process']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| without probes | " + " | ".join(kinds) + " |")
    lines.append("|---|" + "---:|" * len(kinds))
    cases = [document["cases"][k] for k in kinds]
    lines.append(
        "| round trip p50 / p90 us | "
        + " | ".join(
            f"{_fmt(c['round_trip']['median_us'])} / {_fmt(c['round_trip']['p90_us'])}"
            for c in cases
        )
        + " |"
    )
    for side in ("client", "worker"):
        lines.append(
            f"| {side} CPU us per call | "
            + " | ".join(_fmt(c["cpu_us_per_call"][side]) for c in cases)
            + " |"
        )
    if document["instructions"] is None:
        for side in ("client", "worker"):
            lines.append(
                f"| {side} instructions per call ({document['instruction_counter']}) | "
                + " | ".join(_fmt(c["instructions_per_call"][side], 0) for c in cases)
                + " |"
            )
    else:
        lines.append("")
        lines.append(f"Instructions per call: not measured: {document['instructions']}.")
    return "\n".join(lines)


KINDS: tuple[str, ...] = ("call_one", "payload_1mib", "tensor_64mib")
"""The kinds of call profiled, in report order (``tensor_64mib`` only where torch imports)."""

MODES: dict[str, tuple[int, int, int]] = {
    "full": (2000, 300, 40),
    "quick": (500, 100, 15),
    "smoke": (30, 10, 3),
}
"""Calls of each kind (``call_one``, 1 MiB, 64 MiB tensor) per mode."""

PIPELINED_CALLS: dict[str, int] = {"full": 1600, "quick": 400, "smoke": 16}
"""Calls of each kind in the pipelined section, per mode."""


def torch_available() -> bool:
    """Whether the 64 MiB tensor case can run (torch importable)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_run_arguments(parser, quick="500 + 100 + 15 calls", smoke="30 + 10 + 3 calls (~3 s)")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count instructions per call under valgrind's callgrind (times then mean nothing)",
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="also profile pipelined calls (batches of 8) in both processes: CPU, faults, "
        "context switches and the functions run per call (cProfile in every thread)",
    )
    parser.add_argument(
        "--no-cprofile",
        action="store_true",
        help="pipelined section without its cProfile pass (for an outside profiler: perf)",
    )
    parser.add_argument(
        "--only-pipelined",
        action="store_true",
        help="profile pipelined calls only (no call-at-a-time stage table)",
    )
    args = parser.parse_args(argv)
    under_callgrind = bool(os.environ.get(UNDER_CALLGRIND))
    if args.callgrind and not under_callgrind:
        return rerun_under_callgrind(sys.argv[1:] if argv is None else argv)
    mode = run_mode(args)
    n_small, n_large, n_tensor = MODES[mode]
    counter: str | None
    if under_callgrind:
        counter, no_count = "callgrind", None
    else:
        no_count = perf_instructions_available()
        counter = "perf" if no_count is None else None
        if no_count is not None and shutil.which("valgrind") is not None:
            no_count += "; valgrind is installed: --callgrind counts them"
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("profiled", Profiled)
        worker_pid = actor.pid.call_one().get(timeout=120)
        cases: dict[str, Any] = {}
        if not args.only_pipelined:
            cases["call_one"] = measure(actor, "call_one", n_small, worker_pid, counter)
            cases["payload_1mib"] = measure(actor, "payload_1mib", n_large, worker_pid, counter)
            if torch_available():
                cases["tensor_64mib"] = measure(
                    actor, "tensor_64mib", n_tensor, worker_pid, counter
                )
        section: dict[str, Any] | None = None
        if args.pipelined or args.only_pipelined:
            n_pipe = PIPELINED_CALLS[mode]
            section = {
                "call_one": pipelined(actor, "call_one", n_pipe, not args.no_cprofile),
                "payload_1mib": pipelined(actor, "payload_1mib", n_pipe, not args.no_cprofile),
            }
    finally:
        procs.stop().get(timeout=120)
    document: dict[str, Any] = {
        "mode": mode,
        **machine_facts("benchmarks/actor_profile.py", argv),
        "clock": "time.perf_counter_ns (CLOCK_MONOTONIC, shared by every process)",
        "instruction_counter": counter,
        "instructions": no_count,
        "cases": cases,
    }
    if section is not None:
        document["pipelined"] = section
    if cases:
        print(report(document))
    else:
        print(f"## Actor call profile (`benchmarks/actor_profile.py`)\n\n{machine_line(document)}")
    if section is not None:
        print()
        print(pipelined_report(section))
    if args.json is not None:
        write_json(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
