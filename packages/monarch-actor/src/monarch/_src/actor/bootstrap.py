"""``monarch._src.actor.bootstrap`` as Monarch's documentation and examples import it
(``from monarch._src.actor.bootstrap import attach_to_workers``): the public names the
reference's module has, re-exported from ``monarch.actor``. ``CA`` and ``PrivateKey`` are the
types of the ``ca=`` and ``private_key=`` arguments (only ``private_key=None`` is supported)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from monarch._src.actor._forward import forwarder
from monarch.actor import Extent, Future, HostMesh, attach_to_workers, run_worker_loop_forever

__all__ = [
    "CA",
    "Extent",
    "Future",
    "HostMesh",
    "PrivateKey",
    "attach_to_workers",
    "run_worker_loop_forever",
]

PrivateKey = bytes | Path | None
CA = str | os.PathLike[str] | Literal["trust_all_connections"]

__getattr__ = forwarder(
    __name__, frozenset({"run_worker_loop_until_shutdown", "start_worker_loop_forever"})
)
