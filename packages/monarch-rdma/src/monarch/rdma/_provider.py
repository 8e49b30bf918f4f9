"""The provider interface of ``monarch.rdma`` and the choice of a provider for a pair of processes.

Why: one ``RDMABuffer`` may be read from the same process, another process of its host, or
another host, and a different mechanism serves each best (a memcpy through shared memory,
ibverbs, chunked messages over the network). A *provider* is one such mechanism behind one
small interface (``RDMAProvider``): register local memory and hand out a picklable
``RemoteKey``, read and write through a key one-sidedly (the owner's user code takes no part),
and deregister. Providers are found through pluggy (``monarch.rdma.hookspecs``), so a third party
can add one.

The owner registers a buffer with every provider available in its process and publishes who it
is (``PeerInfo``) and one key per provider in the handle. The process that transfers picks the
provider with ``select_provider``: a pure function of the two ``PeerInfo`` and the providers'
``ProviderSpec`` (its ``reach`` and ``priority``), unit-tested without any process.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "PeerInfo",
    "ProviderSpec",
    "RDMAProvider",
    "Reach",
    "RegistrationDeclined",
    "RemoteKey",
    "select_provider",
]


class Reach(enum.Enum):
    """Which pairs of processes a provider can serve.

    ``PROCESS``: the owner's own process only; ``HOST``: processes of the owner's host (shared
    memory); ``ANY``: any pair where both processes offer the provider (the network, a fabric).
    """

    PROCESS = "process"
    HOST = "host"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """Who a process is, for the choice of a provider: ``host`` (the host's identity: its name
    and boot id), ``process`` (the process's id) and ``providers`` (the names of the providers
    available there)."""

    host: str
    process: str
    providers: frozenset[str]


@dataclass(frozen=True, slots=True)
class RemoteKey:
    """What a provider hands out for one registration, travelling inside the buffer's handle:
    ``provider`` (its name), ``region`` (the registration's number in the owner's process),
    ``size`` (bytes) and ``detail`` (the provider's own picklable data: a manager's address, a
    memory key, a file descriptor's name)."""

    provider: str
    region: int
    size: int
    detail: Any = None


class RegistrationDeclined(Exception):
    """Raised by ``RDMAProvider.register`` when the provider cannot serve this memory (the
    ``shm`` provider: memory in private pages); the buffer is then registered without it and
    another provider serves its transfers."""


@runtime_checkable
class RDMAProvider(Protocol):
    """One transfer mechanism. Contract:

    * ``register(memory, owner=...)`` runs in the owner's process, keeps ``memory`` (a flat byte
      ``memoryview``) alive until ``deregister`` and returns the ``RemoteKey`` other processes
      use; it neither copies nor changes the memory.
    * ``read(key, offset, dst)`` copies ``dst.nbytes`` bytes of the registration, starting at
      ``offset``, into ``dst``; ``write(key, offset, src)`` copies ``src`` into it. Both run in
      the process that transfers, are one-sided (no user code of the owner runs) and return an
      awaitable whose completion is the transfer's completion; a failure raises
      ``RuntimeError`` (an unknown or deregistered key, a lost owner). The caller bounds the
      time (``asyncio.wait_for``), so they must be cancellable.
    * ``deregister(key)`` releases the registration from any process; transfers through that
      key fail afterwards. Deregistering twice is not an error.
    * Optionally, ``transfer_now(kind, key, offset, memory) -> bool`` (``kind`` ``"read"`` or
      ``"write"``): the transfer done synchronously, in the calling thread, where that is cheap
      (bounded: no waiting on another process, no large copy), returning True; False to have
      the caller await ``read``/``write`` instead; failures raise as those would.
      ``RDMABuffer.read_into``/``write_from`` try it first (``shm``: a memcpy of a mapping it
      holds already).
    * Optionally, ``transfer_many(ops) -> Awaitable[list[BaseException | None]]`` (``ops``: a
      sequence of ``(kind, key, offset, memory)``): several transfers at once, each one's
      outcome in order (``None`` or its exception), the provider free to pipeline them.
      ``RDMAAction.submit`` hands it every operation this provider serves (``net``: the
      operations' chunks pipelined on a few connections per owner, no round trip each).
    """

    name: str

    def register(self, memory: memoryview, *, owner: str) -> RemoteKey: ...

    def read(self, key: RemoteKey, offset: int, dst: memoryview) -> Awaitable[None]: ...

    def write(self, key: RemoteKey, offset: int, src: memoryview) -> Awaitable[None]: ...

    def deregister(self, key: RemoteKey) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """What a plugin contributes (``monarch_rdma_providers``): a provider's ``name``, the
    ``backend`` it stands for in ``RDMABuffer.backend`` (``"ibverbs"`` or ``"tcp"``), its
    ``reach``, its ``priority`` (the higher wins among those that reach a pair), ``available``
    (a cheap probe: can it work in this process) and ``create`` (builds the process's one
    provider instance, called at most once per process)."""

    name: str
    backend: str
    reach: Reach
    priority: int
    available: Callable[[], bool]
    create: Callable[[], RDMAProvider]


def _reaches(reach: Reach, local: PeerInfo, owner: PeerInfo) -> bool:
    if reach is Reach.PROCESS:
        return local.host == owner.host and local.process == owner.process
    if reach is Reach.HOST:
        return local.host == owner.host
    return True


def select_provider(
    specs: Mapping[str, ProviderSpec] | Sequence[ProviderSpec],
    local: PeerInfo,
    owner: PeerInfo,
    keys: Mapping[str, RemoteKey],
) -> str | None:
    """The name of the provider that serves a transfer between ``local`` (the process that
    transfers) and ``owner`` (the buffer's), or ``None`` when none does.

    A candidate is offered by both processes, holds a key in ``keys`` (the owner registered
    the buffer with it) and reaches the pair; the highest ``priority`` wins, then the name
    (so the choice never depends on the order of plugins)."""
    table = list(specs.values()) if isinstance(specs, Mapping) else list(specs)
    candidates = [
        spec
        for spec in table
        if spec.name in local.providers
        and spec.name in owner.providers
        and spec.name in keys
        and _reaches(spec.reach, local, owner)
    ]
    if not candidates:
        return None
    best = max(candidates, key=lambda spec: (spec.priority, spec.name))
    return best.name
