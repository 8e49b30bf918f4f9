"""Compatibility name of ``chrysalis.node.netns`` (the public module): the scale launcher and its
tests imported it from here before it was public."""

from __future__ import annotations

from chrysalis.node.netns import (
    MAX_NAMESPACES,
    NETNS_DIR,
    Namespaces,
    NetnsPlan,
    NetnsUnavailable,
    enter_netns,
    netns_unavailable,
    plan_namespaces,
)

__all__ = [
    "MAX_NAMESPACES",
    "NETNS_DIR",
    "Namespaces",
    "NetnsPlan",
    "NetnsUnavailable",
    "enter_netns",
    "netns_unavailable",
    "plan_namespaces",
]
