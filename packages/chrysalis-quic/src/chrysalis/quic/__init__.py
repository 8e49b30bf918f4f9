"""Chrysalis PID-routed QUIC endpoint on aioquic, process identity, asyncio and trio adapters
and the stream transport.
"""

from __future__ import annotations

__all__: list[str] = []
