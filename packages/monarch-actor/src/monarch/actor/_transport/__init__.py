"""The ``_transport`` layer: moving envelopes between processes; it knows no actor, cell or mesh.

Modules, each importing only those before it (and ``_base``): ``seam`` (the ``ProcessTransport``
seam, ``InProcessFabric``) < ``shm`` (pooled memfd slots for large buffers) < ``lane_proto``
(sans-IO lane negotiation and framing) < ``lane`` (``LaneManager``, Unix and TCP lanes) <
``node`` (``NodeProcessTransport``, the seam over a Chrysalis ``Node``). The seam's names are
re-exported here because this package took the old module path ``monarch.actor._transport``.
"""

from monarch.actor._transport.seam import (
    Attachable,
    DeliverCallback,
    InProcessFabric,
    InProcessTransport,
    ProcessTransport,
    UndeliverableCallback,
)

__all__ = [
    "Attachable",
    "DeliverCallback",
    "InProcessFabric",
    "InProcessTransport",
    "ProcessTransport",
    "UndeliverableCallback",
]
