"""The ``monarch.rdma`` plugin contract: how a distribution adds an RDMA provider.

A plugin is a module (or object) with a function marked ``@hookimpl`` named
``monarch_rdma_providers``. It reaches a process in one of two ways: an installed distribution
declares it in the ``monarch.rdma`` entry-point group, for example in its ``pyproject.toml``::

    [project.entry-points."monarch.rdma"]
    myfabric = "myfabric_rdma.plugin"

or code registers it with ``ProviderRegistry.register(plugin)``. The built-in ``net`` provider is
declared the same way (and registered in code as well, so that it is there also where the
package's metadata is stale).

As for the chrysalis plugins (``chrysalis.core.hookspecs``): the hook takes no arguments and
returns a sequence of records; it is not ``firstresult`` (every plugin's contributions are
gathered) and a provider name claimed by two plugins is a ``ProviderConflictError`` naming
both, never a silent override.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pluggy

from monarch.rdma._provider import ProviderSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_SPECS_PER_HOOK",
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "monarch_rdma_providers",
]

#: The pluggy project name: hook markers and the plugin manager use it.
PROJECT_NAME: Final = "monarch.rdma"
#: The entry-point group scanned for provider plugins in installed distributions.
ENTRY_POINT_GROUP: Final = "monarch.rdma"
#: The most providers one plugin may return from one hook call.
MAX_SPECS_PER_HOOK: Final = 16

#: Marks the hook specification in this module.
hookspec: Final = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a plugin's hook implementation: ``@hookimpl def monarch_rdma_providers(): ...``.
hookimpl: Final = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def monarch_rdma_providers() -> Sequence[ProviderSpec]:
    """Return the RDMA providers this plugin offers (a list or tuple of ``ProviderSpec``).

    Contract:

    * Each ``ProviderSpec.name`` (a short lowercase name: ``net``, ``shm``, ``ibverbs``) is
      claimed by at most one plugin per process; a second claim makes every lookup fail with
      ``ProviderConflictError`` naming both plugins.
    * ``ProviderSpec.available()`` is cheap, opens nothing that outlives it and says whether the
      provider can work in this process (a device exists, a library imports).
    * ``ProviderSpec.create()`` builds the provider (``monarch.rdma.RDMAProvider``); it is
      called at most once per process, when a buffer is first registered or transferred.
    * This hook opens nothing, has no side effects and returns the same providers each time;
      at most ``MAX_SPECS_PER_HOOK`` of them, possibly none.
    """
    raise NotImplementedError("hook specification: implemented by plugins, never called")
