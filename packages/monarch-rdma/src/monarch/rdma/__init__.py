"""Monarch RDMA buffers: ibverbs through pyverbs where a device exists, a fast fallback where
not.
"""

from __future__ import annotations

__all__: list[str] = []
