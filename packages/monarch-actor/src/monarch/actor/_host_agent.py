"""Split into ``_hosts.nested``, ``_hosts.agent`` and ``_hosts.spawn``: this path stays
importable for one release.

It re-exports the names the old module had from their new homes (a patch of one of them here
does not reach the code that uses it: patch the new home)."""

# ruff: noqa: I001  (one import block per new home; ``name as name`` marks a re-export)

from monarch.actor._hosts.agent import (
    _agent as _agent,
    _agent_mesh as _agent_mesh,
    _answer as _answer,
    _HostAgent as _HostAgent,
    _wait as _wait,
    AGENT_PATH as AGENT_PATH,
    ensure_agent as ensure_agent,
    get_or_spawn_controller as get_or_spawn_controller,
    MAX_CONTROLLERS as MAX_CONTROLLERS,
    NestedDelegate as NestedDelegate,
    REQUEST_TIMEOUT as REQUEST_TIMEOUT,
    spawn_from_worker as spawn_from_worker,
)
from monarch.actor._hosts.nested import (
    _DEAD_REMEMBERED as _DEAD_REMEMBERED,
    _kill_groups as _kill_groups,
    _Nested as _Nested,
    MAX_HOST_TOKENS as MAX_HOST_TOKENS,
    MAX_NESTED_PROCS as MAX_NESTED_PROCS,
    MAX_REQUESTS_IN_FLIGHT as MAX_REQUESTS_IN_FLIGHT,
    MAX_SPAWN_DEPTH as MAX_SPAWN_DEPTH,
    NestedProcs as NestedProcs,
)
from monarch.actor._hosts.spawn import (
    _awaited as _awaited,
    ProcSetup as ProcSetup,
)

__all__ = [
    "AGENT_PATH",
    "MAX_NESTED_PROCS",
    "MAX_SPAWN_DEPTH",
    "NestedDelegate",
    "NestedProcs",
    "ProcSetup",
    "get_or_spawn_controller",
]
