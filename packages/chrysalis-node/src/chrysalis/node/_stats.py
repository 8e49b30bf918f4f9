"""What a node started with ``--echo`` tells ``chrysalis top`` about itself (``_top``).

A stream whose only bytes are ``STATS_REQUEST`` gets one JSON document (``node_report``): the
node's PID, namespace size, routes, parent status, endpoint error counters, and one record per
live QUIC connection from its endpoint's statistics (datagrams and bytes each way, smoothed
RTT, congestion window, bytes in flight, PTO count). Any other stream is echoed as before
(``stats_or_echo``; ``ping``'s payloads start with a zero byte, never this request's).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Final

from chrysalis.node._echo import ECHO_CHUNK, StreamHandler, echo_raw
from chrysalis.quic import ByteStream

if TYPE_CHECKING:
    from chrysalis.node._node import Node

__all__ = ["MAX_REPORT", "STATS_REQUEST", "node_report", "stats_or_echo"]

STATS_REQUEST: Final = b"\x07chrysalis-top-stats\n"
"""The whole of a stream that asks a node for its report."""
MAX_REPORT: Final = 4 * 1024 * 1024
"""Longest report read (bytes)."""


def node_report(node: Node) -> dict[str, Any]:
    """What ``node`` tells ``top``: itself and one record per live QUIC connection."""
    stats = node.statistics()
    endpoint: Any = node.transport.endpoint
    links = []
    connections = getattr(endpoint, "connections", None)
    for conn in connections() if callable(connections) else []:
        s = conn.statistics()
        if s is None:
            continue
        links.append(
            {
                "peer": s.peer.hex() if s.peer is not None else "",
                "established": s.established,
                "datagrams_sent": s.datagrams_sent,
                "datagrams_received": s.datagrams_received,
                "bytes_sent": s.bytes_sent,
                "bytes_received": s.bytes_received,
                "rtt_ms": round(s.smoothed_rtt * 1000, 3),
                "congestion_window": s.congestion_window,
                "bytes_in_flight": s.bytes_in_flight,
                "pto_count": s.pto_count,
                "streams": s.active_streams,
            }
        )
    counters: dict[str, int] = {}
    endpoint_stats = getattr(endpoint, "statistics", None)
    if callable(endpoint_stats):
        e = endpoint_stats()
        for name in ("backpressure_drops", "engine_errors", "routing_errors", "parse_errors"):
            counters[name] = int(getattr(e, name, 0))
    return {
        "pid": node.pid.hex(),
        "time": time.time(),
        "entries": stats.entries,
        "routes": stats.routes,
        "parent": "" if stats.parent is None else str(getattr(stats.parent, "name", stats.parent)),
        "endpoint": counters,
        "links": links,
    }


def stats_or_echo(node: Node) -> StreamHandler:
    """The ``--echo`` handler: a stream holding exactly ``STATS_REQUEST`` gets ``node``'s
    report; any other is echoed (``echo_raw``)."""

    async def handle(stream: ByteStream) -> None:
        first = await stream.read(ECHO_CHUNK)
        while first and len(first) < len(STATS_REQUEST) and STATS_REQUEST.startswith(first):
            more = await stream.read(ECHO_CHUNK)
            if not more:
                break
            first += more
        if first == STATS_REQUEST and not await stream.read(1):
            stream.write(json.dumps(node_report(node)).encode())
            await stream.drain()
            return
        await echo_raw(stream, first)

    return handle
