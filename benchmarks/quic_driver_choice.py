"""Where should the QUIC endpoint's driver run: inline on the event loop, or on its own thread?

The reference implementation runs every endpoint on a dedicated OS thread. In CPython a thread
hand-off costs tens of microseconds each way and both threads share the GIL, so the asyncio
adapter can also run the same ``EndpointDriver.step`` inline on the event loop. This script
measures both, the way small-message latency matters to the layers above: a 16-byte ping-pong
on one long-lived stream between two processes over UDP loopback, asyncio on both sides, both
sides using the same driver placement.

Method: each trial forks a fresh server process and a fresh client process (the handshake and
a warm-up are excluded), then times ``pings`` round trips (``write`` 16 bytes, ``readexactly``
16 bytes; the server echoes). Placements alternate ``inline thread inline thread ...`` so both
see the same load drift (the machines are shared and noisy); the headline is the median of the
per-round ratios thread/inline of the per-trial median round trip. Optionally
(``--pipelined``) each trial also measures messages per second with 64 pings in flight.

Usage::

    .venv/bin/python benchmarks/quic_driver_choice.py            # ~40 s
    .venv/bin/python benchmarks/quic_driver_choice.py --quick    # ~10 s
    .venv/bin/python benchmarks/quic_driver_choice.py --smoke    # a few seconds, proves it runs
    .venv/bin/python benchmarks/quic_driver_choice.py --json out.json

Every wait has a timeout and a child that overstays is killed, so a run always ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from chrysalis.core import DatagramAddr
from chrysalis.datagram import UdpSocket
from chrysalis.quic import DevelopmentCA, Identity
from chrysalis.quic._asyncio import AsyncioEndpoint

MODES = ("inline", "thread")
MESSAGE = b"0123456789abcdef"
PIPELINE_DEPTH = 64


@dataclass(frozen=True, slots=True)
class Trial:
    """One measured client run: round-trip times (seconds) and the pipelined rate."""

    mode: str
    rtts: tuple[float, ...]
    pipelined_rate: float | None

    @property
    def median_us(self) -> float:
        return statistics.median(self.rtts) * 1e6

    @property
    def p90_us(self) -> float:
        ordered = sorted(self.rtts)
        return ordered[int(0.9 * (len(ordered) - 1))] * 1e6


# --- the two processes -------------------------------------------------------------------------


def _engine(name: str) -> Any:
    """The engine factory for ``--engine`` (None: the endpoint's default, aioquic)."""
    if name == "qh3":
        from chrysalis.quic._engines.qh3 import Qh3Engine

        return Qh3Engine
    return None


async def _serve(identity: Identity, mode: str, link: Connection, engine: str = "aioquic") -> None:
    sock = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
    async with AsyncioEndpoint.spawn_server(
        identity, sock, driver=mode, engine=_engine(engine)
    ) as endpoint:
        link.send(str(sock.local_addr))
        _, stream = await asyncio.wait_for(endpoint.accept(), 30)
        while True:
            data = await stream.read(65536)
            if not data:
                break
            stream.write(data)
        stream.write_eof()
        await asyncio.wait_for(stream.wait_closed(), 10)


def _server_main(identity: Identity, mode: str, link: Connection, engine: str = "aioquic") -> None:
    asyncio.run(_serve(identity, mode, link, engine))


async def _ping(
    identity: Identity,
    server: Identity,
    address: DatagramAddr,
    mode: str,
    warmup: int,
    pings: int,
    pipelined: bool,
    engine: str,
) -> Trial:
    sock = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
    async with AsyncioEndpoint.spawn_client(
        identity, sock, driver=mode, engine=_engine(engine)
    ) as endpoint:
        conn = await asyncio.wait_for(endpoint.connect(server.pid, address), 10)
        stream = await conn.open_stream()
        size = len(MESSAGE)
        for _ in range(warmup):
            stream.write(MESSAGE)
            await stream.readexactly(size)
        rtts = []
        clock = time.perf_counter
        for _ in range(pings):
            start = clock()
            stream.write(MESSAGE)
            await stream.readexactly(size)
            rtts.append(clock() - start)
        rate = None
        if pipelined:
            total = pings * 4
            start = clock()
            for _ in range(PIPELINE_DEPTH):
                stream.write(MESSAGE)
            received = 0
            sent = PIPELINE_DEPTH
            while received < total:
                await stream.readexactly(size)
                received += 1
                if sent < total:
                    stream.write(MESSAGE)
                    sent += 1
            rate = total / (clock() - start)
        stream.write_eof()
        await asyncio.wait_for(stream.read(), 10)
        return Trial(mode, tuple(rtts), rate)


def _client_main(
    identity: Identity,
    server: Identity,
    address: str,
    mode: str,
    warmup: int,
    pings: int,
    pipelined: bool,
    engine: str,
    link: Connection,
) -> None:
    trial = asyncio.run(
        _ping(identity, server, DatagramAddr.parse(address), mode, warmup, pings, pipelined, engine)
    )
    link.send((trial.rtts, trial.pipelined_rate))


def run_trial(
    ca: DevelopmentCA,
    mode: str,
    warmup: int,
    pings: int,
    pipelined: bool,
    timeout: float,
    engine: str = "aioquic",
) -> Trial:
    """Fork a server and a client using driver placement ``mode``; return the client's trial."""
    ctx = multiprocessing.get_context("fork")
    server_id, client_id = ca.issue(), ca.issue()
    server_end, server_link = ctx.Pipe()
    client_end, client_link = ctx.Pipe()
    server = ctx.Process(
        target=_server_main, args=(server_id, mode, server_link, engine), daemon=True
    )
    client: Any = None
    try:
        server.start()
        if not server_end.poll(timeout):
            raise RuntimeError("the server did not report its address")
        address = server_end.recv()
        client = ctx.Process(
            target=_client_main,
            args=(
                client_id,
                server_id,
                address,
                mode,
                warmup,
                pings,
                pipelined,
                engine,
                client_link,
            ),
            daemon=True,
        )
        client.start()
        if not client_end.poll(timeout):
            raise RuntimeError(f"the {mode} client did not finish within {timeout} s")
        rtts, rate = client_end.recv()
        client.join(timeout)
        server.join(timeout)
        return Trial(mode, tuple(rtts), rate)
    finally:
        for process in (client, server):
            if process is not None and process.is_alive():
                process.kill()
                process.join(5)


# --- the run -----------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1,000 pings")
    parser.add_argument("--smoke", action="store_true", help="1 round of 50 pings")
    parser.add_argument("--pipelined", action="store_true", help="also 64 pings in flight")
    parser.add_argument("--json", type=Path, help="write every trial as JSON")
    parser.add_argument("--engine", choices=("aioquic", "qh3"), default="aioquic")
    args = parser.parse_args(argv)
    rounds, pings, warmup = args.rounds, args.pings, args.warmup
    if args.quick:
        rounds, pings, warmup = 3, 1000, 100
    if args.smoke:
        rounds, pings, warmup = 1, 50, 10
    ca = DevelopmentCA.create()
    trials: dict[str, list[Trial]] = {mode: [] for mode in MODES}
    for index in range(rounds):
        for mode in MODES:
            trial = run_trial(
                ca, mode, warmup, pings, args.pipelined, timeout=60.0, engine=args.engine
            )
            trials[mode].append(trial)
            extra = (
                f", {trial.pipelined_rate:,.0f} msg/s pipelined"
                if trial.pipelined_rate is not None
                else ""
            )
            print(
                f"round {index + 1}/{rounds} {mode:>6}: median {trial.median_us:7.0f} us, "
                f"p90 {trial.p90_us:7.0f} us{extra}",
                file=sys.stderr,
                flush=True,
            )
    inline, thread = trials["inline"], trials["thread"]
    ratios = [t.median_us / i.median_us for i, t in zip(inline, thread, strict=True)]
    summary: dict[str, Any] = {
        "python": platform.python_version(),
        "engine": args.engine,
        "cpus": os.cpu_count(),
        "rounds": rounds,
        "pings": pings,
        "inline_median_us": statistics.median(t.median_us for t in inline),
        "thread_median_us": statistics.median(t.median_us for t in thread),
        "inline_p90_us": statistics.median(t.p90_us for t in inline),
        "thread_p90_us": statistics.median(t.p90_us for t in thread),
        "ratio_thread_over_inline": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    if args.pipelined:
        summary["inline_pipelined_msg_s"] = statistics.median(
            t.pipelined_rate or 0.0 for t in inline
        )
        summary["thread_pipelined_msg_s"] = statistics.median(
            t.pipelined_rate or 0.0 for t in thread
        )
    print("| driver | round trip p50 (median of trials) | p90 |")
    print("|---|---:|---:|")
    print(f"| inline | {summary['inline_median_us']:.0f} us | {summary['inline_p90_us']:.0f} us |")
    print(f"| thread | {summary['thread_median_us']:.0f} us | {summary['thread_p90_us']:.0f} us |")
    print(
        f"\nthread / inline (median of per-round ratios): "
        f"{summary['ratio_thread_over_inline']:.2f}x "
        f"(min {summary['ratio_min']:.2f}, max {summary['ratio_max']:.2f}, {rounds} rounds)"
    )
    if args.pipelined:
        print(
            f"pipelined ({PIPELINE_DEPTH} in flight): inline "
            f"{summary['inline_pipelined_msg_s']:,.0f} msg/s, thread "
            f"{summary['thread_pipelined_msg_s']:,.0f} msg/s"
        )
    if args.json is not None:
        document = {
            "summary": summary,
            "trials": {
                mode: [
                    {"median_us": t.median_us, "p90_us": t.p90_us, "pipelined": t.pipelined_rate}
                    for t in trials[mode]
                ]
                for mode in MODES
            },
        }
        args.json.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
