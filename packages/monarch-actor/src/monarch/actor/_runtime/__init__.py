"""The ``_runtime`` layer: one process's actors (cells and mailboxes, ports, reply sinks,
supervision, the process runtime and the client runtime).

This package took the old module path ``monarch.actor._runtime``; the names that module
exported are re-exported here for one release. Code inside ``monarch.actor`` imports the
module that defines a name.
"""

from monarch.actor._runtime.proc import (
    FLUSH_ENDPOINT,
    HEARTBEAT_ENDPOINT,
    MAX_TOMBSTONES,
    ActorCell,
    CellBase,
    FlushReport,
    Heartbeat,
    ProcDeath,
    ProcRuntime,
    Reply,
    RootCell,
    UndeliverableEnvelope,
    broadcast_proc_death,
    client,
    current_sender,
    decode_reply,
    shutdown_client,
)

__all__ = [
    "FLUSH_ENDPOINT",
    "HEARTBEAT_ENDPOINT",
    "MAX_TOMBSTONES",
    "ActorCell",
    "CellBase",
    "FlushReport",
    "Heartbeat",
    "ProcDeath",
    "ProcRuntime",
    "Reply",
    "RootCell",
    "UndeliverableEnvelope",
    "broadcast_proc_death",
    "client",
    "current_sender",
    "decode_reply",
    "shutdown_client",
]
