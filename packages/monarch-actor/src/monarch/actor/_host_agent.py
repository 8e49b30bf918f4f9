"""Split into ``_hosts.nested``, ``_hosts.agent`` and ``_hosts.spawn``: this path stays
importable for one release.

It re-exports the names the old module had from their new homes (a patch of one of them here
does not reach the code that uses it: patch the new home)."""

from monarch.actor._hosts.agent import (
    AGENT_PATH as AGENT_PATH,
)
from monarch.actor._hosts.agent import (
    MAX_CONTROLLERS as MAX_CONTROLLERS,
)
from monarch.actor._hosts.agent import (
    REQUEST_TIMEOUT as REQUEST_TIMEOUT,
)
from monarch.actor._hosts.agent import (
    NestedDelegate as NestedDelegate,
)
from monarch.actor._hosts.agent import (
    _agent as _agent,
)
from monarch.actor._hosts.agent import (
    _agent_mesh as _agent_mesh,
)
from monarch.actor._hosts.agent import (
    _answer as _answer,
)
from monarch.actor._hosts.agent import (
    _HostAgent as _HostAgent,
)
from monarch.actor._hosts.agent import (
    _wait as _wait,
)
from monarch.actor._hosts.agent import (
    ensure_agent as ensure_agent,
)
from monarch.actor._hosts.agent import (
    get_or_spawn_controller as get_or_spawn_controller,
)
from monarch.actor._hosts.agent import (
    spawn_from_worker as spawn_from_worker,
)
from monarch.actor._hosts.nested import (
    _DEAD_REMEMBERED as _DEAD_REMEMBERED,
)
from monarch.actor._hosts.nested import (
    MAX_HOST_TOKENS as MAX_HOST_TOKENS,
)
from monarch.actor._hosts.nested import (
    MAX_NESTED_PROCS as MAX_NESTED_PROCS,
)
from monarch.actor._hosts.nested import (
    MAX_REQUESTS_IN_FLIGHT as MAX_REQUESTS_IN_FLIGHT,
)
from monarch.actor._hosts.nested import (
    MAX_SPAWN_DEPTH as MAX_SPAWN_DEPTH,
)
from monarch.actor._hosts.nested import (
    NestedProcs as NestedProcs,
)
from monarch.actor._hosts.nested import (
    _kill_groups as _kill_groups,
)
from monarch.actor._hosts.nested import (
    _Nested as _Nested,
)
from monarch.actor._hosts.spawn import (
    ProcSetup as ProcSetup,
)
from monarch.actor._hosts.spawn import (
    _awaited as _awaited,
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
