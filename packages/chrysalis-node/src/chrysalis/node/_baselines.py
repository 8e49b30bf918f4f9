"""Direct network baselines for scale experiments, measured in the same run as the Chrysalis
figure so that every figure is reported as a ratio (issue 22, item 3).

Every ``chrysalis scale --persist`` process runs ``baseline_servers`` next to its node, on the
host its UDP carrier binds (loopback by default): a UDP echo socket (raw carrier datagrams:
one datagram each way), a TCP server, a Unix stream server (``AF_UNIX``/``SOCK_STREAM`` on a
Linux abstract name: nothing is left in the file system, and only processes of the same host
and network namespace reach it) and a plain QUIC server (aioquic directly, the node's own
certificate and key, no Chrysalis layers: no PIDs, routing, nameserver or stream multiplexing
of ours). A source asks a destination for their addresses over Chrysalis (``BASELINES_OP``),
then, after its Chrysalis measurement of that pair, measures with ``measure_baselines``:

- ``echo``: ``chrysalis-pooled`` (``count`` echoes on one Chrysalis stream, against the
  experiment's fresh stream per echo), ``udp`` (one datagram each way per echo), ``tcp`` and
  ``unix`` (``count`` echoes on one connection) and ``quic`` (one aioquic connection, a fresh
  stream per echo, like Chrysalis' echo);
- ``stream-transfer``: ``tcp`` and ``unix`` (a fresh connection per transfer) and ``quic`` (a
  fresh stream per transfer); datagrams have no stream, so ``udp`` reports why it is absent.

A destination on another host (or in another network namespace) has a ``unix`` address the
source cannot reach: that method then carries the connection error, like any failed method.

The TCP, Unix and QUIC servers speak the worker's protocol (``chrysalis.node._scale``): first byte
``ECHO_OP`` (``[len][payload]`` answered with the same), ``DELIVERY_OP`` (bytes until FIN
answered with the count as u64 BE) or ``POOLED_ECHO_OP`` (``[len][payload]`` frames until FIN,
each answered). Handshakes are not timed (the Chrysalis figure reuses a pooled connection too).
The aioquic client does not verify the server's certificate chain (Chrysalis verifies PIDs
with its own code, which is exactly the layer left out).

The sans-IO parts (``MethodResult``, ``encode_baselines``/``decode_baselines``,
``pair_ratios``, ``FrameReader``) are pure and tested in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, cast, final

from chrysalis.node._scale import DELIVERY_OP as _DELIVERY_OP
from chrysalis.node._scale import ECHO_OP as _ECHO_OP
from chrysalis.node._scale import MAX_ECHO_PAYLOAD, POOLED_ECHO_OP

__all__ = [
    "BASELINE_METHODS",
    "MAX_BASELINES_JSON",
    "MAX_FRAME",
    "FrameReader",
    "MethodResult",
    "decode_baselines",
    "baseline_servers",
    "encode_baselines",
    "frame",
    "measure_baselines",
    "pair_ratios",
    "serve_stream",
]

BASELINE_METHODS: Final = ("chrysalis-pooled", "udp", "tcp", "unix", "quic")
"""The methods a result's baselines may hold, in report order."""
MAX_BASELINES_JSON: Final = 16 * 1024
"""Longest baselines document stored or decoded (bytes)."""
MAX_FRAME: Final = MAX_ECHO_PAYLOAD
"""Largest echo frame the baseline servers accept (the worker's)."""
MAX_DATAGRAM: Final = 65000
"""Largest UDP echo payload (one datagram)."""
UDP_TIMEOUT: Final = 2.0
"""Seconds a UDP echo may take before the method fails (a lost datagram)."""
_LENGTH: Final = struct.Struct(">I")
_COUNT: Final = struct.Struct(">Q")
_CHUNK: Final = 64 * 1024
_FILL: Final = b"\x2a" * _CHUNK
_ALPN: Final = "chrysalis-baseline"
_MAX_UNIX_NAME: Final = 108  # sun_path, the leading NUL included


# -- sans-IO ------------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class MethodResult:
    """One method's figures for one pair: ``completed`` operations in ``seconds``, latency
    percentiles in ms, payload MiB/s (both directions for an echo) and the first ``error``."""

    completed: int = 0
    seconds: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    max_ms: float = 0.0
    mib_per_second: float = 0.0
    error: str = ""

    @classmethod
    def measured(
        cls, latencies: Sequence[float], seconds: float, moved: int, error: str = ""
    ) -> MethodResult:
        """From per-operation ``latencies`` (s), the total ``seconds`` and bytes ``moved``."""
        if not latencies:
            return cls(error=error or "nothing completed")
        ordered = sorted(s * 1000 for s in latencies)

        def rank(fraction: float) -> float:
            return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]

        rate = moved / (1024 * 1024) / seconds if seconds > 0 else 0.0
        return cls(
            len(ordered), seconds, rank(0.5), rank(0.9), rank(0.99),
            sum(ordered) / len(ordered), ordered[-1], rate, error,
        )  # fmt: skip


def encode_baselines(methods: Mapping[str, MethodResult]) -> str:
    """The JSON text stored with a result (keys in ``BASELINE_METHODS``)."""
    unknown = set(methods) - set(BASELINE_METHODS)
    if unknown:
        raise ValueError(f"unknown baseline methods: {', '.join(sorted(unknown))}")
    text = json.dumps({m: asdict(methods[m]) for m in BASELINE_METHODS if m in methods})
    if len(text) > MAX_BASELINES_JSON:
        raise ValueError(f"baselines document of {len(text)} bytes exceeds {MAX_BASELINES_JSON}")
    return text


def decode_baselines(text: str) -> dict[str, MethodResult]:
    """The methods stored in ``text`` (empty for ``""``); ``ValueError`` for anything else
    than what ``encode_baselines`` writes."""
    if not text:
        return {}
    if len(text) > MAX_BASELINES_JSON:
        raise ValueError("baselines document too long")
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("baselines document is not an object")
    found: dict[str, MethodResult] = {}
    fields = set(MethodResult.__dataclass_fields__)
    for method, value in raw.items():
        if method not in BASELINE_METHODS:
            raise ValueError(f"unknown baseline method {method!r}")
        if not isinstance(value, dict) or set(value) != fields:
            raise ValueError(f"baseline {method!r} has fields {sorted(value)}")
        for name, item in value.items():
            expected = str if name == "error" else (int if name == "completed" else (int, float))
            if not isinstance(item, expected) or isinstance(item, bool):
                raise ValueError(f"baseline {method!r} field {name!r} is {item!r}")
        found[method] = MethodResult(**value)
    return found


def pair_ratios(
    p50_ms: float, p99_ms: float, mib_per_second: float, baselines: Mapping[str, MethodResult]
) -> dict[str, dict[str, float | None]]:
    """Per method: Chrysalis' p50 and p99 over the baseline's (above 1: Chrysalis slower) and
    Chrysalis' MiB/s over the baseline's (below 1: Chrysalis slower); ``None`` where the
    baseline has no figure."""

    def over(a: float, b: float) -> float | None:
        return a / b if a > 0 and b > 0 else None

    return {
        method: {
            "p50": over(p50_ms, result.p50_ms),
            "p99": over(p99_ms, result.p99_ms),
            "throughput": over(mib_per_second, result.mib_per_second),
        }
        for method, result in baselines.items()
    }


@final
class FrameReader:
    """Incremental ``[len u32 BE][payload]`` frames (pooled echo): ``feed`` bytes, get the
    complete payloads; a length above ``limit`` raises ``ValueError``. Holds at most one
    frame plus its header."""

    __slots__ = ("_buffer", "_limit")

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > self._limit:
                raise ValueError(f"frame of {length} bytes exceeds {self._limit}")
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[_LENGTH.size : end]))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)


def frame(payload: bytes) -> bytes:
    """``[len u32 BE][payload]``."""
    return _LENGTH.pack(len(payload)) + payload


# -- servers ------------------------------------------------------------------------------------


async def serve_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The worker's protocol on an asyncio stream pair (a TCP or Unix connection, or an
    aioquic stream); errors end the stream."""
    try:
        first = await reader.readexactly(1)
        if first[0] == _DELIVERY_OP:
            received = 0
            while chunk := await reader.read(_CHUNK):
                received += len(chunk)
            writer.write(_COUNT.pack(received))
        elif first[0] == _ECHO_OP:
            (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
            if length > MAX_FRAME:
                raise ValueError(f"echo of {length} bytes refused")
            writer.write(frame(await reader.readexactly(length)))
        elif first[0] == POOLED_ECHO_OP:
            while header := await reader.read(_LENGTH.size):
                header += await reader.readexactly(_LENGTH.size - len(header))
                (length,) = _LENGTH.unpack(header)
                if length > MAX_FRAME:
                    raise ValueError(f"echo of {length} bytes refused")
                writer.write(frame(await reader.readexactly(length)))
                await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


class _UdpEcho(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        if self.transport is not None:
            self.transport.sendto(data, addr)


def _server_configuration(identity: Any, datagram_size: int | None) -> Any:
    from aioquic.quic.configuration import QuicConfiguration

    config = QuicConfiguration(is_client=False, alpn_protocols=[_ALPN], idle_timeout=30.0)
    if datagram_size is not None:
        config.max_datagram_size = datagram_size
    config.certificate = identity.chain[0]
    config.certificate_chain = list(identity.chain[1:])
    config.private_key = identity.private_key
    return config


@contextlib.asynccontextmanager
async def baseline_servers(
    host: str, identity: Any, *, datagram_size: int | None = None
) -> AsyncIterator[dict[str, str]]:
    """UDP echo, TCP, Unix stream and plain-QUIC servers on ``host`` (ephemeral ports; the Unix
    server on a fresh abstract name) while the block runs; yields their addresses ``{"udp":
    "H:P", "tcp": "H:P", "unix": "@NAME", "quic": "H:P"}``. ``identity`` is a
    ``chrysalis.quic.Identity`` (its certificate and key serve QUIC). The QUIC server sends
    datagrams of ``datagram_size`` bytes, by default those a scale node on ``host`` sends
    (``chrysalis.node._scale_quic.datagram_size``: 16 KiB on a loopback address), so that
    plain QUIC is measured like for like."""
    from aioquic.asyncio.server import serve

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(_UdpEcho, local_addr=(host, 0))
    tcp = await asyncio.start_server(serve_stream, host, 0)
    unix_name = f"@chrysalis-baseline-{secrets.token_hex(8)}"
    try:
        unix = await asyncio.start_unix_server(serve_stream, _unix_path(unix_name))
    except BaseException:
        transport.close()
        tcp.close()
        raise
    quic: Any = None
    streams: set[asyncio.Task[None]] = set()

    def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = loop.create_task(serve_stream(reader, writer))
        streams.add(task)
        task.add_done_callback(streams.discard)

    try:
        quic = await serve(
            host,
            0,
            configuration=_server_configuration(
                identity, datagram_size if datagram_size is not None else _host_datagrams(host)
            ),
            stream_handler=on_stream,
        )
        udp_port = transport.get_extra_info("sockname")[1]
        tcp_port = tcp.sockets[0].getsockname()[1]
        quic_port = quic._transport.get_extra_info("sockname")[1]
        yield {
            "udp": f"{host}:{udp_port}",
            "tcp": f"{host}:{tcp_port}",
            "unix": unix_name,
            "quic": f"{host}:{quic_port}",
        }
    finally:
        transport.close()
        tcp.close()
        unix.close()
        if quic is not None:
            quic.close()
        for task in list(streams):
            task.cancel()


# -- measuring ----------------------------------------------------------------------------------


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad baseline address {address!r}")
    return host, int(port)


def _host_datagrams(host: str) -> int:
    from chrysalis.core import DatagramAddr
    from chrysalis.node._scale_quic import datagram_size

    return datagram_size(DatagramAddr.udp(host, 0))


def _client_configuration(datagram_size: int | None) -> Any:
    from aioquic.quic.configuration import QuicConfiguration

    config = QuicConfiguration(is_client=True, alpn_protocols=[_ALPN], idle_timeout=30.0)
    config.verify_mode = ssl.CERT_NONE
    if datagram_size is not None:
        config.max_datagram_size = datagram_size
    return config


def _unix_path(address: str) -> str:
    """``@NAME`` (the form ``baseline_servers`` yields) as the socket's abstract address."""
    if not address.startswith("@") or len(address.encode()) > _MAX_UNIX_NAME:
        raise ValueError(f"bad unix baseline address {address!r}")
    return "\0" + address[1:]


def _payload(size: int) -> bytes:
    return _FILL[:size] if size <= _CHUNK else b"\x2a" * size


class _UdpClient(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.replies.put_nowait(data)


async def _timed(count: int, op: Callable[[], Awaitable[None]], moved_each: int) -> MethodResult:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    error = ""
    started = loop.time()
    try:
        for _ in range(count):
            t0 = loop.time()
            await op()
            latencies.append(loop.time() - t0)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    seconds = loop.time() - started
    return MethodResult.measured(latencies, seconds, len(latencies) * moved_each, error)


async def _udp(address: str, kind: str, size: int, count: int) -> MethodResult:
    if kind != "echo":
        return MethodResult(error="not applicable: datagrams carry no stream")
    if size > MAX_DATAGRAM:
        return MethodResult(error=f"payload over {MAX_DATAGRAM} bytes does not fit a datagram")
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(_UdpClient, remote_addr=_split(address))
    payload = _payload(size)
    try:

        async def once() -> None:
            transport.sendto(payload)
            reply = await asyncio.wait_for(client.replies.get(), UDP_TIMEOUT)
            if reply != payload:
                raise ValueError("the echoed datagram differs")

        await once()  # warm-up
        return await _timed(count, once, 2 * size)
    finally:
        transport.close()


async def _stream_echo(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes
) -> None:
    writer.write(frame(payload))
    await writer.drain()
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length != len(payload) or await reader.readexactly(length) != payload:
        raise ValueError("the echo differs")


async def _transfer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int) -> None:
    writer.write(bytes([_DELIVERY_OP]))
    left = size
    while left:
        chunk = min(left, _CHUNK)
        writer.write(_FILL[:chunk])
        await writer.drain()
        left -= chunk
    writer.write_eof()
    (received,) = _COUNT.unpack(await reader.readexactly(_COUNT.size))
    if received != size:
        raise ValueError(f"the destination received {received} of {size} bytes")


async def _tcp(address: str, kind: str, size: int, count: int) -> MethodResult:
    host, port = _split(address)
    return await _connection_method(lambda: asyncio.open_connection(host, port), kind, size, count)


async def _unix(address: str, kind: str, size: int, count: int) -> MethodResult:
    path = _unix_path(address)
    return await _connection_method(lambda: asyncio.open_unix_connection(path), kind, size, count)


_Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _connection_method(open_: _Opener, kind: str, size: int, count: int) -> MethodResult:
    """A stream-socket method: echoes on one connection, a fresh connection per transfer."""
    if kind == "echo":
        reader, writer = await open_()
        payload = _payload(size)
        try:
            writer.write(bytes([POOLED_ECHO_OP]))
            await _stream_echo(reader, writer, payload)  # warm-up
            return await _timed(count, lambda: _stream_echo(reader, writer, payload), 2 * size)
        finally:
            writer.close()

    async def fresh() -> None:
        reader, writer = await open_()
        try:
            await _transfer(reader, writer, size)
        finally:
            writer.close()

    return await _timed(count, fresh, size)


async def _quic(
    address: str, kind: str, size: int, count: int, datagram_size: int | None = None
) -> MethodResult:
    from aioquic.asyncio.client import connect

    host, port = _split(address)
    config = _client_configuration(datagram_size)
    payload = _payload(size)
    async with connect(host, port, configuration=config) as client:

        async def once() -> None:
            reader, writer = await client.create_stream()
            if kind == "echo":
                writer.write(bytes([_ECHO_OP]) + frame(payload))
                writer.write_eof()
                (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
                if length != size or await reader.readexactly(length) != payload:
                    raise ValueError("the echo differs")
            else:
                await _transfer(reader, writer, size)

        await once()  # warm-up
        return await _timed(count, once, (2 if kind == "echo" else 1) * size)


PooledEcho = Callable[[int, int], Awaitable[MethodResult]]
"""``(size, count)``: the Chrysalis pooled-stream echo against the same destination."""


async def measure_baselines(
    addresses: Mapping[str, str],
    kind: str,
    size: int,
    count: int,
    *,
    pooled: PooledEcho | None = None,
    timeout: float = 60.0,
    datagram_size: int | None = None,
) -> dict[str, MethodResult]:
    """Each method against a destination's ``addresses`` (``baseline_servers``), one after
    another, each bounded by ``timeout``; a method that fails carries its error. The plain
    QUIC client sends datagrams of ``datagram_size`` bytes (aioquic's default if ``None``;
    a source passes its node's ``max_udp_payload``, like for like)."""
    methods: dict[str, Callable[[], Awaitable[MethodResult]]] = {}
    if pooled is not None and kind == "echo":
        methods["chrysalis-pooled"] = lambda: pooled(size, count)

    async def quic(address: str, kind: str, size: int, count: int) -> MethodResult:
        return await _quic(address, kind, size, count, datagram_size)

    measures = {"udp": _udp, "tcp": _tcp, "unix": _unix, "quic": quic}
    for name, measure in measures.items():
        address = addresses.get(name)
        if address is None:
            methods[name] = _missing(name)
        else:
            methods[name] = _bind(measure, address, kind, size, count)
    found: dict[str, MethodResult] = {}
    for name, run in methods.items():
        try:
            found[name] = await asyncio.wait_for(run(), timeout)
        except TimeoutError:
            found[name] = MethodResult(error=f"no result within {timeout:g} s")
        except Exception as exc:
            found[name] = MethodResult(error=f"{type(exc).__name__}: {exc}")
    return found


def _missing(name: str) -> Callable[[], Awaitable[MethodResult]]:
    async def run() -> MethodResult:
        return MethodResult(error=f"the destination serves no {name} baseline")

    return run


def _bind(
    measure: Callable[[str, str, int, int], Awaitable[MethodResult]],
    address: str,
    kind: str,
    size: int,
    count: int,
) -> Callable[[], Awaitable[MethodResult]]:
    return lambda: measure(address, kind, size, count)
