"""CPU cost of the monarch-actor telemetry hooks of one call round trip, this tree against a git
revision (default ``main``), side by side in one process.

Why: ``actor_telemetry.py`` measures what turning telemetry on costs a real round trip, but on a
shared two-core box its per-round ratios spread from 0.3x to 2x, far wider than a change to the
hooks. This script isolates the hooks: it loads the revision's ``metrics`` and ``tracing``
modules (``git show REV:path``, under other module names) next to this tree's, and runs the
calls one ``call_one`` round trip makes, on fake envelopes and cells, alternately (ABAB rounds):

- ``metric hooks``: port opened, CALL sent, received, enqueued, endpoint latency, reply sent,
  received, port completed (metrics on);
- ``tracing``: the send span entered, the trace context taken for the envelope, the receive span
  around a sync endpoint (tracing on).

Rates are round trips per second of this process's CPU time; ratio = this tree / revision (above
1.0x: this tree's hooks are cheaper).

``--per-hook`` adds one row per hook (same ABAB rounds, each hook called alone in a loop), with
the nanoseconds of CPU per call on each side: where a round trip's hook time goes. The loop
itself (a ``for`` over ``range`` and the call) is included, about 10 to 30 ns here. The
revision's ``tracing`` module is given the revision's ``metrics`` module, so its endpoint
wrapper times with the revision's code.

    .venv/bin/python benchmarks/telemetry_hooks.py                 # about 20 s
    .venv/bin/python benchmarks/telemetry_hooks.py --against HEAD~3
    .venv/bin/python benchmarks/telemetry_hooks.py --smoke         # about 2 s
    .venv/bin/python benchmarks/telemetry_hooks.py --per-hook      # + a row per hook, ~1 min
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    CaseResult,
    Trial,
    add_run_arguments,
    alternate,
    machine_facts,
    run_mode,
    write_json,
)
from monarch.actor._base.envelope import MessageKind  # noqa: E402
from monarch.actor._runtime.telemetry import metrics as tree_metrics  # noqa: E402
from monarch.actor._runtime.telemetry import tracing as tree_tracing  # noqa: E402

_PACKAGE = "packages/monarch-actor/src/monarch/actor/_runtime/telemetry"
MODES: dict[str, tuple[int, int, float]] = {
    "full": (15, 20_000, 10.0),
    "quick": (8, 10_000, 5.0),
    "smoke": (2, 500, 1.0),
}
"""Rounds, round trips per trial and budget per case (seconds) of each mode."""


def load_revision(revision: str, name: str, folder: Path) -> ModuleType:
    """Module ``name`` (``metrics``, ``tracing``) of the telemetry package at ``revision``,
    loaded as ``_rev_NAME``."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{_PACKAGE}/{name}.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / f"_rev_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"_rev_{name}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Envelope:
    def __init__(self, kind: MessageKind, size: int) -> None:
        self.kind = kind
        self.payload = b"x" * size
        self.buffer_sizes = ()
        self.endpoint = "ping"
        self.trace = b""


class _Runtime:
    label = "procs{'gpus': 0/1}"

    def post_calls(self, sender: Any, targets: Any, **posted: Any) -> None:
        """What ``ProcRuntime.post_calls`` does with the trace context ``send_call_traced``
        gives it (this tree's; a revision's posts through ``_Port._post_each``)."""
        _set_trace(targets[0], posted["trace"])


class _Cell:
    display = "<root>.<bench.Echo echo{'gpus': 0/1}>"
    rank = 0
    runtime = _Runtime()
    endpoints: ClassVar[dict[str, Any]] = {}
    _untraced: frozenset[str] = frozenset()  # as a runtime cell's
    _span_where: tuple[Any, ...] | None = None  # as a runtime cell's


class _Sender:
    display = "<root>"
    _span_where: tuple[Any, ...] | None = None  # as a runtime cell's


def metric_trip(m: Any, n: int) -> Trial:
    call, reply, owner = (
        _Envelope(MessageKind.CALL, 100),
        _Envelope(MessageKind.PORT_VALUE, 20),
        object(),
    )
    opened, completed, endpoint = m.on_port_opened, m.on_port_completed, m.record_endpoint
    on_sent, on_received, on_enqueued = m.on_sent, m.on_received, m.on_enqueued
    clock = time.perf_counter
    start = time.process_time()
    for i in range(n):
        opened(owner, i, "ping")
        on_sent(call)
        on_received(call)
        on_enqueued(0)
        endpoint("ping", clock(), None)
        on_sent(reply)
        on_received(reply)
        completed(owner, i)
    seconds = time.process_time() - start
    m.reset_metrics()
    return Trial(counted=n, seconds=seconds, received=n, sent=n)


def _set_trace(envelope: _Envelope, trace: bytes) -> None:
    """What ``ProcRuntime.post`` does with the trace context ``send_call_traced`` gives it."""
    envelope.trace = trace


class _Port:
    """What ``send_call_traced`` reads of an endpoint: its name, its mesh's, and, in revisions
    that post through it, its ``_post_each``."""

    _name = "ping"
    _user_name = "echo"

    @property
    def _mesh(self) -> _Port:
        return self

    def _post_each(self, *posted: Any) -> None:
        # (runtime, sender, payload, targets, reply_port, flags, trace): one target here
        _set_trace(posted[3][0], posted[6])


def send_side(t: Any) -> Callable[[Any, Any, _Envelope], None]:
    """The send side of one call in tracing module ``t``: ``send_call_traced`` or, in a
    revision before it, ``send_traced`` (gone since; the posts inside it are given the span's
    context), or, in a revision before those, ``send_span`` entered around ``outgoing_trace``."""
    send_call_traced = getattr(t, "send_call_traced", None)
    if send_call_traced is not None:
        port = _Port()

        def send_call(runtime: Any, sender: Any, envelope: _Envelope) -> None:
            send_call_traced("call_one", port, runtime, sender, None, (envelope,), None, 0)

        return send_call
    send_traced = getattr(t, "send_traced", None)
    if send_traced is not None:

        def send(runtime: Any, sender: Any, envelope: _Envelope) -> None:
            send_traced("call_one", "ping", "echo", 1, runtime, sender, _set_trace, envelope)

        return send
    send_span, outgoing = t.send_span, t.outgoing_trace

    def send_old(runtime: Any, sender: Any, envelope: _Envelope) -> None:
        with send_span("call_one", "ping", "echo", 1, runtime, sender):
            envelope.trace = outgoing(1)

    return send_old


def receive_side(t: Any) -> Callable[[Any, Any, Callable[[int], int], int], Any]:
    """The receive side of one sync call in tracing module ``t``, as the runtime runs it:
    ``run_endpoint`` (no wrapper made), or, in a revision before it, the wrapper
    ``wrap_endpoint`` makes, called."""
    run_endpoint = getattr(t, "run_endpoint", None)
    if run_endpoint is not None:

        def run(cell: Any, envelope: Any, body: Callable[[int], int], i: int) -> Any:
            return run_endpoint(cell, envelope, body, (i,), {})

        return run
    wrap = t.wrap_endpoint

    def run_old(cell: Any, envelope: Any, body: Callable[[int], int], i: int) -> Any:
        return wrap(cell, envelope, body, None)(i)

    return run_old


def tracing_trip(t: Any, n: int) -> Trial:
    envelope, cell, sender, runtime = _Envelope(MessageKind.CALL, 0), _Cell(), _Sender(), _Runtime()
    send, receive = send_side(t), receive_side(t)

    def body(x: int) -> int:
        return x

    start = time.process_time()
    for i in range(n):
        send(runtime, sender, envelope)
        receive(cell, envelope, body, i)
    seconds = time.process_time() - start
    return Trial(counted=n, seconds=seconds, received=n, sent=n)


def _timed(n: int, loop: Callable[[int], None]) -> Trial:
    start = time.process_time()
    loop(n)
    seconds = time.process_time() - start
    return Trial(counted=n, seconds=seconds, received=n, sent=n)


def per_hook_cases() -> list[tuple[str, str, Callable[[Any, Any, int], Trial]]]:
    """``(name, "metrics"|"tracing"|"both", trial(metrics module, tracing module, n))`` per
    hook (the switches it runs with)."""
    call, reply = _Envelope(MessageKind.CALL, 100), _Envelope(MessageKind.PORT_VALUE, 20)
    cell, sender, runtime = _Cell(), _Sender(), _Runtime()
    owner = object()

    def body(x: int) -> int:
        return x

    def ports(m: Any, t: Any, n: int) -> Trial:
        opened, completed = m.on_port_opened, m.on_port_completed

        def loop(n: int) -> None:
            for i in range(n):
                opened(owner, i, "ping")
                completed(owner, i)

        return _timed(n, loop)

    def sent(m: Any, t: Any, n: int) -> Trial:
        hook = m.on_sent

        def loop(n: int) -> None:
            for _ in range(n):
                hook(call)

        return _timed(n, loop)

    def received(m: Any, t: Any, n: int) -> Trial:
        hook = m.on_received

        def loop(n: int) -> None:
            for _ in range(n):
                hook(reply)

        return _timed(n, loop)

    def enqueued(m: Any, t: Any, n: int) -> Trial:
        hook = m.on_enqueued

        def loop(n: int) -> None:
            for i in range(n):
                hook(i & 7)

        return _timed(n, loop)

    def latency(m: Any, t: Any, n: int) -> Trial:
        hook, clock = m.record_endpoint, time.perf_counter

        def loop(n: int) -> None:
            for _ in range(n):
                hook("ping", clock(), None)

        return _timed(n, loop)

    def wrapper(m: Any, t: Any, n: int) -> Trial:
        receive = receive_side(t)

        def loop(n: int) -> None:
            for i in range(n):
                receive(cell, call, body, i)

        return _timed(n, loop)

    def send(m: Any, t: Any, n: int) -> Trial:
        one = send_side(t)

        def loop(n: int) -> None:
            for _ in range(n):
                one(runtime, sender, call)

        return _timed(n, loop)

    return [
        ("port opened + completed (call latency)", "metrics", ports),
        ("envelope sent (count, payload size)", "metrics", sent),
        ("envelope received (count)", "metrics", received),
        ("mailbox enqueue (depth)", "metrics", enqueued),
        ("endpoint latency (+ the caller's perf_counter)", "metrics", latency),
        ("endpoint timed, metrics only (+ body)", "metrics", wrapper),
        ("send span + trace context for the envelope", "tracing", send),
        ("receive span, tracing only (+ body)", "tracing", wrapper),
        ("receive span and endpoint latency, both on (+ body)", "both", wrapper),
    ]


def run(
    revision: str, rounds: int, trips: int, budget_s: float, per_hook: bool = False
) -> list[CaseResult]:
    with tempfile.TemporaryDirectory() as folder:
        rev_metrics = load_revision(revision, "metrics", Path(folder))
        rev_tracing = load_revision(revision, "tracing", Path(folder))
    rev_tracing.__dict__["_metrics"] = rev_metrics  # its endpoint wrapper: its own metrics
    cases: list[tuple[str, Callable[[Any, int], Trial], Any, Any]] = [
        ("metric hooks", metric_trip, rev_metrics, tree_metrics),
        ("tracing", tracing_trip, rev_tracing, tree_tracing),
    ]
    results = []
    for name, trip, old, new in cases:
        for module in (old, new):
            module.set_enabled(True)
        try:
            base, cand = alternate(
                lambda trip=trip, old=old: trip(old, trips),  # type: ignore[misc]
                lambda trip=trip, new=new: trip(new, trips),  # type: ignore[misc]
                rounds,
                budget_s=budget_s,
            )
        finally:
            for module in (old, new):
                module.set_enabled(False)
        results.append(CaseResult(name, revision, "this tree", None, base, cand))
    if per_hook:
        sides = ((rev_metrics, rev_tracing), (tree_metrics, tree_tracing))
        for name, switch, hook_trial in per_hook_cases():
            for m, t in sides:
                m.set_enabled(switch in ("metrics", "both"))
                t.set_enabled(switch in ("tracing", "both"))
            try:
                base, cand = alternate(
                    lambda f=hook_trial, s=sides[0]: f(*s, trips),  # type: ignore[misc]
                    lambda f=hook_trial, s=sides[1]: f(*s, trips),  # type: ignore[misc]
                    rounds,
                    budget_s=budget_s,
                )
            finally:
                for m, t in sides:
                    m.set_enabled(False)
                    t.set_enabled(False)
                    m.reset_metrics()
            results.append(CaseResult(f"hook: {name}", revision, "this tree", None, base, cand))
    return results


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default="main", help="git revision to compare with (main)")
    parser.add_argument(
        "--per-hook", action="store_true", help="also time each hook alone (ns per call)"
    )
    add_run_arguments(parser, quick="fewer, shorter rounds (~8 s)", smoke="two tiny rounds")
    args = parser.parse_args(argv)
    mode = run_mode(args)
    rounds, trips, budget_s = MODES[mode]
    results = run(args.against, rounds, trips, budget_s, args.per_hook)
    print(table(results))
    for r in results:
        if r.measured:
            unit, scale = ("ns per call", 1e9) if r.name.startswith("hook:") else ("us", 1e6)
            print(
                f"{r.name}: {scale / r.baseline_median:.2f} {unit} at {args.against}, "
                f"{scale / r.candidate_median:.2f} {unit} here"
            )
    if args.json is not None:
        document = {
            "mode": mode,
            **machine_facts("benchmarks/telemetry_hooks.py", argv),
            "config": {
                "against": args.against,
                "rounds": rounds,
                "trips": trips,
                "per_hook": args.per_hook,
            },
            "cases": [r.to_json() for r in results],
        }
        write_json(args.json, document)
    return 0


def table(results: list[CaseResult]) -> str:
    """The results as Markdown: round trips of hooks per CPU second, and the ratio."""
    lines = [
        "| case | revision /CPU s | this tree /CPU s | ratio | min-max | rounds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if not r.measured:
            lines.append(f"| {r.name} | - | - | - | - | 0 |")
            continue
        ratios = r.pair_ratios
        lines.append(
            f"| {r.name} | {r.baseline_median:,.0f} | {r.candidate_median:,.0f} | "
            f"{r.ratio:.3f}x | {min(ratios):.2f}-{max(ratios):.2f} | {len(ratios)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
