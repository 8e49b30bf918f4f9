"""The ``_runtime`` layer: one process's actors (mailboxes, actor threads, ports, supervision).

Modules, each importing only those before it (and the layers to the right, ``_transport`` and
``_base``): ``context`` (who is running: ``context()``, ``Instance``, ``current_sender``) <
``logging`` (system and user logs, ``LinePrefixer``/``LineAggregator`` for forwarded output) <
``sinks`` (``Reply``, the port sinks) < ``ports`` (``Port``, ``PortReceiver``, ``Channel``) <
``telemetry/`` (metrics, tracing spans, supervision and lifecycle records, process reports, the
``monarch`` command; the package holds the switches) < ``liveness`` (sans-IO heartbeats and
leases) < ``main_module`` (the client's ``__main__`` in workers) < ``cell`` (actor cells,
mailboxes, the root client's cell) < ``proc`` (``ProcRuntime``: routing, tombstones, stops,
flushes, heartbeats) < ``client`` (this OS process's client runtime) < (``watchdog``: the
client's heartbeat driver; ``enable_transport``; ``returns_future``).

Hooks a higher layer sets at import: ``context.set_root_context`` (by ``client``, H1),
``context.set_proc_resolver`` (by ``_mesh.meshes``, H2), ``client.set_node_layer`` (by
``_hosts.host_mesh``, H3); inside the layer, ``logging.set_client_probe`` (by ``client``).

This package took the old module path ``monarch.actor._runtime``; the names that module
exported are re-exported here for one release. Code inside ``monarch.actor`` imports the
module that defines a name. One of them shadows a module: the package's attribute ``client``
is the function ``client()`` (as in the old module), so ``import monarch.actor._runtime.client
as m`` yields the function; reach the module with ``from monarch.actor._runtime.client import
...`` or ``importlib.import_module``.
"""

from monarch.actor._runtime.cell import ActorCell, CellBase, RootCell, UndeliverableEnvelope
from monarch.actor._runtime.client import broadcast_proc_death, client, shutdown_client
from monarch.actor._runtime.context import current_sender
from monarch.actor._runtime.proc import (
    FLUSH_ENDPOINT,
    HEARTBEAT_ENDPOINT,
    MAX_TOMBSTONES,
    FlushReport,
    Heartbeat,
    ProcDeath,
    ProcRuntime,
)
from monarch.actor._runtime.sinks import Reply, decode_reply

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
