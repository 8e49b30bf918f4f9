"""An actor that installs the pyverbs emulation (``fake_pyverbs``) in its worker process, for
``test_verbs_procs.py`` (imported by the worker processes by module name)."""

from __future__ import annotations

from typing import Any

from fake_pyverbs import Fabric

from monarch.actor import Actor, endpoint
from monarch.rdma import _verbs


class VerbsSetup(Actor):
    """Makes the ``ibverbs`` provider available in its process over an emulated device."""

    @endpoint
    def install(self, directory: str) -> None:
        _verbs.use_api(Fabric(directory).api, "fake0")

    @endpoint
    def uninstall(self) -> None:
        if _verbs._state is not None:
            _verbs._state.close()
        _verbs.use_api(None)

    @endpoint
    def queue_pairs(self) -> dict[str, Any]:
        """This process's queue pairs: those it connected (towards owners), those it accepted
        (from requesters), and the states each went through."""
        state = _verbs._state
        if state is None:
            return {"connected": 0, "accepted": 0, "transitions": []}
        fabric: Fabric = state.ctx.fabric
        return {
            "connected": len(state.connections),
            "accepted": len(state.accepted),
            "transitions": list(fabric.transitions.values()),
        }
