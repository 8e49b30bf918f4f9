"""CPU cost of one QUIC round trip, counted rather than timed: instructions and Python calls.

Why a second QUIC benchmark: ``quic_throughput.py`` measures round-trip *time* between two
processes against plain aioquic, and on the shared machines a 3% cut in work is below what the
neighbours move between runs. Work per round trip is what the code controls, and it can be
counted exactly: this script runs two endpoints in one process (``AsyncioEndpoint`` with the
inline driver on both sides, the qh3 or the aioquic engine) and ping-pongs 16 bytes on one
long-lived stream.

- Without ``--callgrind``: ``N`` round trips after a warm-up, with the Python calls counted
  (``sys.setprofile``: calls of Python functions and of builtins, per round trip, both sides
  together). Deterministic up to timer-driven work (delayed ACKs), so two runs of one tree
  agree to within a call or two.
- With ``--callgrind``: the script runs itself under ``valgrind --tool=callgrind`` for 600 and
  for 100 round trips and reports ``(I(600) - I(100)) / 500`` instructions per round trip: the
  difference cancels interpreter start-up, imports and the handshake.

Usage::

    .venv/bin/python benchmarks/quic_cpu.py                     # calls per round trip, both engines
    .venv/bin/python benchmarks/quic_cpu.py --callgrind         # + instructions (~3 minutes)
    .venv/bin/python benchmarks/quic_cpu.py --engine qh3 --callgrind
    .venv/bin/python benchmarks/quic_cpu.py --engine plain-aioquic --callgrind   # the baseline
    .venv/bin/python benchmarks/quic_cpu.py --smoke --json out.json   # seconds: proves it runs

``--engine plain-aioquic`` counts the baseline of ``quic_throughput.py`` the same way: aioquic's
stock asyncio adapter (``aioquic.asyncio.serve`` / ``connect``, its defaults) running the very
same ping-pong in one process over UDP, so that an instruction ratio can stand beside the time
ratio (UDP only: the stock adapter has no other carrier).

Lower is better for every number here; compare two trees by running the script in each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    BenchmarkError,
    add_run_arguments,
    machine_facts,
    machine_line,
    partial_run_warning,
    run_mode,
    write_json,
)

PLAIN = "plain-aioquic"
ENGINES = ("qh3", "aioquic")  # the default: the chrysalis stack on either engine
BASELINES = (PLAIN,)  # on request only (``--engine plain-aioquic``; UDP only)
CARRIERS = ("udp", "inproc")
MESSAGE = b"0123456789abcdef"
WARMUP = 50
CALLGRIND_COUNTS = (100, 600)  # instructions per round trip: (I(600) - I(100)) / 500
CALLGRIND_TIMEOUT_S = 600.0
ROUND_TRIP_TIMEOUT_S = (
    10.0  # per 100 round trips in one process: milliseconds each, even under valgrind
)


@dataclass(frozen=True, slots=True)
class Config:
    """How many round trips the call count measures."""

    round_trips: int


FULL = Config(round_trips=2000)
QUICK = Config(round_trips=500)
SMOKE = Config(round_trips=20)


# --------------------------------------------------------------------------------------------
# The measured loop (runs in this process, or in the child under valgrind)


def _engine(name: str) -> Any:
    if name == "qh3":
        from chrysalis.quic import Qh3Engine

        return Qh3Engine
    if name == "aioquic":
        return None  # the endpoint's default
    raise BenchmarkError(f"unknown engine {name!r}")


class _CallCounter:
    """A ``sys.setprofile`` hook that counts calls (Python functions and builtins)."""

    def __init__(self) -> None:
        self.python = 0
        self.builtin = 0

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.python += 1
        elif event == "c_call":
            self.builtin += 1


@contextlib.contextmanager
def _counting(counter: _CallCounter | None) -> Iterator[None]:
    if counter is None:
        yield
        return
    sys.setprofile(counter)
    try:
        yield
    finally:
        sys.setprofile(None)


async def ping_pong(
    engine: str, carrier: str, round_trips: int, counter: _CallCounter | None = None
) -> int:
    """``WARMUP`` then ``round_trips`` 16-byte round trips between two endpoints of this
    process on one stream; ``counter`` (if any) counts the calls of the measured ones only.
    Returns the bytes echoed (a check that every round trip happened)."""
    from chrysalis.core import DatagramAddr
    from chrysalis.datagram import InprocNetwork, UdpSocket
    from chrysalis.quic._asyncio import AsyncioEndpoint
    from chrysalis.quic.testing import connected_stream_pair, issue_identities

    if engine == PLAIN:
        if carrier != "udp":
            raise BenchmarkError(f"{PLAIN} runs over UDP only (aioquic's stock adapter)")
        return await _plain_ping_pong(round_trips, counter)
    factory = _engine(engine)
    first_id, second_id = issue_identities(2)
    if carrier == "udp":
        loopback = DatagramAddr.udp("127.0.0.1", 0)
        sockets: tuple[Any, Any] = (UdpSocket.bind(loopback), UdpSocket.bind(loopback))
    elif carrier == "inproc":
        net = InprocNetwork()
        sockets = (net.bind(), net.bind())
    else:
        raise BenchmarkError(f"unknown carrier {carrier!r}")
    echoed = 0
    async with (
        AsyncioEndpoint.spawn_duplex(first_id, sockets[0], engine=factory) as first,
        AsyncioEndpoint.spawn_duplex(second_id, sockets[1], engine=factory) as second,
    ):
        a, b = await asyncio.wait_for(connected_stream_pair(first, second), 30)

        async def echo(count: int) -> None:
            nonlocal echoed
            for _ in range(count):
                data = await b.readexactly(len(MESSAGE))
                b.write(data)
                echoed += len(data)

        async def pings(count: int) -> None:
            for _ in range(count):
                a.write(MESSAGE)
                reply = await a.readexactly(len(MESSAGE))
                if reply != MESSAGE:
                    raise BenchmarkError(f"echo returned {reply!r}")

        async def run(count: int) -> None:
            # one timeout around the whole run, not one per round trip: a per-read
            # ``wait_for`` would add a timer and a task of its own to every measured round trip
            await asyncio.wait_for(
                asyncio.gather(pings(count), echo(count)), ROUND_TRIP_TIMEOUT_S * (1 + count / 100)
            )

        await run(WARMUP)
        with _counting(counter):
            await run(round_trips)
    return echoed


async def _plain_ping_pong(round_trips: int, counter: _CallCounter | None) -> int:
    """The baseline of ``quic_throughput.py``, in one process: aioquic's stock asyncio adapter
    (``aioquic.asyncio.serve`` / ``connect`` with a stream handler, its defaults and
    server-only TLS), the very same ping-pong loops."""
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.server import serve

    from benchmarks.quic_throughput import _plain_client_config, _plain_server_config
    from chrysalis.quic.testing import issue_identities

    server_id, client_id = issue_identities(2)
    streams: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue(1)
    server = await serve(
        "127.0.0.1",
        0,
        configuration=_plain_server_config(server_id),
        stream_handler=lambda reader, writer: streams.put_nowait((reader, writer)),
    )
    echoed = 0
    try:
        transport = server._transport
        assert transport is not None
        port = int(transport.get_extra_info("sockname")[1])
        async with connect(
            "127.0.0.1", port, configuration=_plain_client_config(client_id, server_id)
        ) as protocol:
            a_reader, a_writer = await asyncio.wait_for(protocol.create_stream(), 30)
            a_writer.write(b"!")  # the server learns of the stream with its first bytes
            b_reader, b_writer = await asyncio.wait_for(streams.get(), 30)
            if await b_reader.readexactly(1) != b"!":
                raise BenchmarkError("unexpected stream marker")

            async def echo(count: int) -> None:
                nonlocal echoed
                for _ in range(count):
                    data = await b_reader.readexactly(len(MESSAGE))
                    b_writer.write(data)
                    echoed += len(data)

            async def pings(count: int) -> None:
                for _ in range(count):
                    a_writer.write(MESSAGE)
                    reply = await a_reader.readexactly(len(MESSAGE))
                    if reply != MESSAGE:
                        raise BenchmarkError(f"echo returned {reply!r}")

            async def run(count: int) -> None:
                await asyncio.wait_for(
                    asyncio.gather(pings(count), echo(count)),
                    ROUND_TRIP_TIMEOUT_S * (1 + count / 100),
                )

            await run(WARMUP)
            with _counting(counter):
                await run(round_trips)
    finally:
        server.close()
    return echoed


def count_calls(engine: str, carrier: str, round_trips: int) -> dict[str, float]:
    """Python calls per round trip (both sides), measured over ``round_trips``."""
    counter = _CallCounter()
    echoed = asyncio.run(ping_pong(engine, carrier, round_trips, counter))
    if echoed != (WARMUP + round_trips) * len(MESSAGE):
        raise BenchmarkError(f"{engine}: echoed {echoed} bytes")
    return {
        "calls_per_rtt": (counter.python + counter.builtin) / round_trips,
        "python_calls_per_rtt": counter.python / round_trips,
        "builtin_calls_per_rtt": counter.builtin / round_trips,
    }


# --------------------------------------------------------------------------------------------
# Callgrind


_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def parse_collected(stderr: str) -> int:
    """The instruction count from callgrind's summary on stderr (``Collected : N``)."""
    match = _COLLECTED.search(stderr)
    if match is None:
        raise BenchmarkError(f"no instruction count in callgrind's output:\n{stderr[-2000:]}")
    return int(match.group(1))


def callgrind_instructions(engine: str, carrier: str, round_trips: int, folder: Path) -> int:
    """Instructions of a whole child run (``round_trips`` after the warm-up) under callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise BenchmarkError("--callgrind needs valgrind on PATH")
    out = folder / f"callgrind.{engine}.{carrier}.{round_trips}.out"
    command = [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        engine,
        carrier,
        str(round_trips),
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=CALLGRIND_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise BenchmarkError(f"callgrind run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return parse_collected(proc.stderr)


def instructions_per_round_trip(low: int, high: int) -> float:
    """``(I(high count) - I(low count)) / (difference of the counts)``."""
    return (high - low) / (CALLGRIND_COUNTS[1] - CALLGRIND_COUNTS[0])


# --------------------------------------------------------------------------------------------
# Command line


def _child(argv: list[str]) -> None:
    engine, carrier, count = argv
    echoed = asyncio.run(ping_pong(engine, carrier, int(count)))
    print("ok", engine, carrier, count, echoed)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["--child"]:
        _child(raw[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(
        parser,
        quick=f"count calls over {QUICK.round_trips} round trips",
        smoke=f"count calls over {SMOKE.round_trips} round trips (CI)",
    )
    parser.add_argument("--engine", action="append", choices=ENGINES + BASELINES, default=[])
    parser.add_argument("--carrier", choices=CARRIERS, default="udp")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="also count instructions per round trip under valgrind (600 minus 100 round trips)",
    )
    args = parser.parse_args(raw)
    mode = run_mode(args)
    config = {"smoke": SMOKE, "quick": QUICK, "full": FULL}[mode]
    engines = args.engine or list(ENGINES)
    meta = machine_facts("benchmarks/quic_cpu.py", raw)
    lines = ["## QUIC CPU per round trip", "", machine_line(meta), ""]
    lines += partial_run_warning(mode)
    lines += ["| engine | carrier | calls/rtt | Python calls/rtt | instructions/rtt |"]
    lines += ["|---|---|---:|---:|---:|"]
    rows: list[dict[str, Any]] = []
    for engine in engines:
        row: dict[str, Any] = {"engine": engine, "carrier": args.carrier}
        row.update(count_calls(engine, args.carrier, config.round_trips))
        row["round_trips"] = config.round_trips
        if args.callgrind:
            with tempfile.TemporaryDirectory(prefix="quic_cpu.") as tmp:
                low, high = (
                    callgrind_instructions(engine, args.carrier, n, Path(tmp))
                    for n in CALLGRIND_COUNTS
                )
            row["instructions"] = {str(CALLGRIND_COUNTS[0]): low, str(CALLGRIND_COUNTS[1]): high}
            row["instructions_per_rtt"] = instructions_per_round_trip(low, high)
        rows.append(row)
        ipr = row.get("instructions_per_rtt")
        lines.append(
            f"| {engine} | {args.carrier} | {row['calls_per_rtt']:.1f} | "
            f"{row['python_calls_per_rtt']:.1f} | " + ("-" if ipr is None else f"{ipr:,.0f}") + " |"
        )
    print("\n".join(lines))
    if args.json is not None:
        write_json(args.json, {"mode": mode, "machine": meta, "cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
