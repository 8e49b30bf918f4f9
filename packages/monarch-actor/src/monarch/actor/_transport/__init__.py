"""The ``_transport`` layer: moving envelopes between processes; it knows no actor, cell or mesh.

``seam`` (the ``ProcessTransport`` seam, ``InProcessFabric``), ``node`` (``NodeProcessTransport``),
``lane_proto`` (sans-IO lane negotiation and framing), ``lane`` and ``shm``. The seam's names are
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
