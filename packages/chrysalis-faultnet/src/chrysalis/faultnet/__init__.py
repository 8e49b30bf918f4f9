"""chrysalis-faultnet: a fault-injection wrapper for any Chrysalis datagram carrier.

:class:`FaultySocket` wraps a :class:`~chrysalis.datagram.DatagramSocket` and applies a
:class:`FaultPlan` (seeded loss, duplication, reordering, delay with jitter, a bound on held
datagrams) plus run-time partitions, so every layer above the carriers can run its tests over a
bad network. The decisions come from :class:`FaultSchedule`, a pure seeded state machine that
takes ``now`` as an argument. :class:`FaultyNetwork` binds faulty endpoints on an in-process
network; the ``faultnet`` carrier plugin (``_plugin``) opens them from an address and options.
"""

from __future__ import annotations

from chrysalis.faultnet._network import (
    MAX_NETWORK_SOCKETS,
    BindableNetwork,
    FaultyNetwork,
    new_inproc_network,
)
from chrysalis.faultnet._plan import (
    DRAWS_PER_DECISION,
    MAX_FAULT_SECONDS,
    MAX_HELD_LIMIT,
    MAX_REORDER_WINDOW,
    Admission,
    FaultDecision,
    FaultDirection,
    FaultPlan,
    FaultSchedule,
    derive_seed,
)
from chrysalis.faultnet._plugin import (
    FAULTNET_SCHEME,
    INPROC_INNER,
    faultnet_address,
    open_faultnet,
)
from chrysalis.faultnet._socket import (
    MAX_PARTITIONED_PEERS,
    TIMER_MAX_WAIT,
    FaultStatistics,
    FaultySocket,
)

__all__ = [
    "DRAWS_PER_DECISION",
    "FAULTNET_SCHEME",
    "INPROC_INNER",
    "MAX_FAULT_SECONDS",
    "MAX_HELD_LIMIT",
    "MAX_NETWORK_SOCKETS",
    "MAX_PARTITIONED_PEERS",
    "MAX_REORDER_WINDOW",
    "TIMER_MAX_WAIT",
    "Admission",
    "BindableNetwork",
    "FaultDecision",
    "FaultDirection",
    "FaultPlan",
    "FaultSchedule",
    "FaultStatistics",
    "FaultyNetwork",
    "FaultySocket",
    "derive_seed",
    "faultnet_address",
    "new_inproc_network",
    "open_faultnet",
]
