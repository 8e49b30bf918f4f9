"""``RDMABuffer`` and ``RDMAAction``: Monarch's RDMA API over the providers of this process.

An ``RDMABuffer`` registers (does not copy) local memory with every usable provider of the
owner's process and is itself only a small picklable handle: the owner's ``PeerInfo``, the
buffer's size and owner, and one ``RemoteKey`` per provider. Any process that holds the handle
transfers one-sidedly: it picks a provider for the pair (``select_provider``) and calls it; the
owner's user code takes no part.

``read_into``/``write_from`` behave as one-operation ``RDMAAction``s, as in the reference, but
go straight to the provider (``_one_sided``): no action is built, and the provider serving the
pair is chosen once per buffer and process (``RDMABuffer._route``, chosen again when a setting
that rules providers in or out changes, or the plugin set does). Where the provider can finish
the transfer at once and cheaply (``transfer_now``: ``shm`` with the owner's memory mapped
already and a copy below its thread threshold), it does so at the call, as the reference
submits eagerly, and the returned ``Future`` is complete; otherwise the transfer runs as the
future's body. (A 1 MiB ``shm`` read is a memcpy of about 40 us; the action, the provider
choice and an event loop around it had cost several times that.) An action validates each
operation when it is queued (sizes, contiguity, conflicting local ranges), runs all of them in
parallel on ``submit`` and may be submitted again. The ``timeout`` (whole seconds) is checked
before anything starts and bounds the whole submission.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Final, Literal

from monarch.actor import Future, context, returns_future
from monarch.rdma import _staging
from monarch.rdma._config import setting
from monarch.rdma._host import HOST
from monarch.rdma._ibverbs import is_ibverbs_available, unavailable_reason
from monarch.rdma._memory import LocalMemory, _torch_tensor_type, local_memory, validate_timeout
from monarch.rdma._provider import (
    PeerInfo,
    ProviderSpec,
    RDMAProvider,
    RegistrationDeclined,
    RemoteKey,
    select_provider,
)
from monarch.rdma._registry import default_registry

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]

DEFAULT_TIMEOUT: Final = 60
_log = logging.getLogger("monarch.rdma")


class RDMAReadTransferWarning(Warning):
    """Reserved for reads that take a slower path than asked for (the reference's class)."""


class RDMAWriteTransferWarning(Warning):
    """Reserved for writes that take a slower path than asked for (the reference's class)."""


class RDMATcpFallbackWarning(Warning):
    """A buffer was created without ibverbs: transfers use the TCP fallback (once per process)."""


_fallback_warned = False
_fallback_lock = threading.Lock()


_HOST: Final = HOST


def _usable() -> dict[str, ProviderSpec]:
    """The providers this process may use now, given ``rdma_disable_ibverbs``,
    ``rdma_disable_shm`` and ``rdma_allow_tcp_fallback``."""
    usable = {}
    for name, spec in default_registry().available().items():
        if spec.backend == "ibverbs" and setting("rdma_disable_ibverbs"):
            continue
        if name == "shm" and setting("rdma_disable_shm"):
            continue
        if spec.backend != "ibverbs" and not setting("rdma_allow_tcp_fallback"):
            continue
        usable[name] = spec
    return usable


def _local_peer(usable: dict[str, ProviderSpec]) -> PeerInfo:
    return PeerInfo(_HOST, f"{_HOST}/{os.getpid()}", frozenset(usable))


def is_rdma_available() -> bool:
    """Deprecated: whether RDMA over ibverbs is available (use ``is_ibverbs_available`` or
    ``get_rdma_backend``)."""
    warnings.warn(
        "is_rdma_available is deprecated because Monarch now supports multiple RDMA backends, "
        "making this function ambiguous. For now it indicates whether RDMA over ibverbs is "
        "available. Use is_ibverbs_available() or get_rdma_backend() instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


def get_rdma_backend() -> str:
    """``"ibverbs"`` where an ibverbs provider serves this process, else ``"tcp"`` where the
    fallback is allowed (``rdma_allow_tcp_fallback``), else ``"none"``."""
    backends = {spec.backend for spec in _usable().values()}
    if "ibverbs" in backends:
        return "ibverbs"
    if backends:
        return "tcp"
    return "none"


class RDMABuffer:
    """A registered region of local memory, as a picklable handle for one-sided transfers.

    ``RDMABuffer(data)`` takes a 1-D contiguous CPU torch tensor or a 1-D C-contiguous
    ``memoryview`` (any format; bytes are what count) and keeps it alive until ``drop()``.
    ``ValueError`` for other shapes or zero bytes, ``RuntimeError`` when no provider may serve
    (``rdma_allow_tcp_fallback=False`` and no ibverbs)."""

    def __init__(self, data: Any) -> None:
        usable = _usable()
        backend = get_rdma_backend()
        if backend == "none":
            raise RuntimeError(
                "Tried to create an RDMABuffer, but RDMA is not available on this platform. To "
                "enable TCP fallback transport, call "
                "monarch.configure(rdma_allow_tcp_fallback=True) before creating buffers."
            )
        if backend == "tcp":
            _warn_fallback()
        stage: _staging.StageRef | None = None
        if _staging.device_ops().is_device(data):  # CUDA: a pinned staging copy is registered
            if int(data.dim()) == 1 and int(data.numel()) == 0:
                raise ValueError("Cannot create RDMABuffer with size 0.")
            context()
            host, stage = _staging.stage_owner(data)
            memory = local_memory(host)
        else:
            memory = local_memory(data)
        if memory.nbytes == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        owner = str(context().actor_instance.actor_id)
        if "shm" in usable and stage is None and _move_to_shared_memory(memory.owner):
            memory = local_memory(data)  # the tensor's storage moved
        registry = default_registry()
        keys = {}
        for name in usable:
            try:
                keys[name] = registry.provider(name).register(memory.view, owner=owner)
            except RegistrationDeclined as exc:
                _log.debug("RDMA provider %s declined a buffer of %d bytes: %s", name,
                           memory.nbytes, exc)  # fmt: skip
        if not keys:
            raise RuntimeError(f"no RDMA provider of this process accepted the buffer ({usable})")
        self._size = memory.nbytes
        self._owner = owner
        self._backend = backend
        self._peer = _local_peer(usable)
        self._keys: dict[str, RemoteKey] = keys
        self._stage = stage  # the owner's staging of a device tensor, or None
        self._memory: LocalMemory | None = memory  # the owner's reference; not pickled
        self._device: Any = data if stage is not None else None  # not pickled
        self._routed: _Routed | None = None  # not pickled

    def __getstate__(self) -> dict[str, Any]:
        state = {slot: getattr(self, slot) for slot in ("_size", "_owner", "_backend", "_peer")}
        state["_keys"] = self._keys
        state["_stage"] = self._stage
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._stage = None
        self.__dict__.update(state)
        self._memory = None
        self._device = None
        self._routed = None

    def __repr__(self) -> str:
        return f"RDMABuffer(size={self._size}, owner={self._owner!r}, backend={self._backend!r})"

    def size(self) -> int:
        """The registered length in bytes."""
        return self._size

    @property
    def owner(self) -> str:
        """The id of the actor (or client) that created the buffer."""
        return self._owner

    @property
    def backend(self) -> str:
        """``"ibverbs"`` or ``"tcp"``: the backend class of the provider that serves this
        process's transfers (the owner's where none does)."""
        name = self._choose(_usable())
        if name is None:
            return self._backend
        return default_registry().specs()[name].backend

    @property
    def transport(self) -> str:
        """The provider that serves this process's transfers (``"net"``, ...), ``"none"`` if
        none reaches the owner from here."""
        return self._choose(_usable()) or "none"

    def _choose(self, usable: dict[str, ProviderSpec]) -> str | None:
        return select_provider(usable, _local_peer(usable), self._peer, self._keys)

    def _route(self) -> _Routed:
        """The provider that serves this process's transfers through this buffer, with its key:
        chosen once per process, and again when ``rdma_disable_ibverbs``,
        ``rdma_disable_shm``, ``rdma_allow_tcp_fallback`` or the plugin set changed.
        ``RuntimeError`` when none reaches the owner."""
        registry = default_registry()
        rules = (
            _pid,
            registry.generation,
            setting("rdma_disable_ibverbs"),
            setting("rdma_disable_shm"),
            setting("rdma_allow_tcp_fallback"),
        )
        routed = self._routed
        if (
            routed is not None
            and routed.rules == rules
            and self._keys.get(routed.name) is routed.key  # its keys replaced (tests)
        ):
            return routed
        usable = _usable()
        name = self._choose(usable)
        if name is None:
            raise RuntimeError(
                f"no RDMA provider of this process reaches the owner of {self!r} (this process "
                f"offers {sorted(usable)}, the owner {sorted(self._keys)})"
            )
        provider = registry.provider(name)
        now = getattr(provider, "transfer_now", None)
        routed = self._routed = _Routed(rules, name, provider, self._keys[name], now)
        return routed

    def read_into(self, dst: Any, *, timeout: int = DEFAULT_TIMEOUT) -> Future[None]:
        """Copy the buffer into the leading bytes of ``dst`` (at least ``size()`` bytes, 1-D
        contiguous; ``ValueError`` at once otherwise)."""
        return _one_sided("read", self, dst, timeout)

    def write_from(self, src: Any, *, timeout: int = DEFAULT_TIMEOUT) -> Future[None]:
        """Copy ``src`` (at most ``size()`` bytes, 1-D contiguous; ``ValueError`` at once
        otherwise) into the leading bytes of the buffer."""
        return _one_sided("write", self, src, timeout)

    def drop(self) -> Future[None]:
        """Release the registration everywhere; transfers through any copy of this handle fail
        afterwards, and the owner's memory is no longer held."""
        context()
        keys = dict(self._keys)
        self._memory = None
        self._device = None
        return _drop(keys, self._stage)


@dataclass(frozen=True, slots=True)
class _Routed:
    """A buffer's provider for this process (``RDMABuffer._route``): what the choice depended
    on (``rules``), the provider and the buffer's key for it."""

    rules: tuple[Any, ...]
    name: str
    provider: RDMAProvider
    key: RemoteKey
    now: Any  # the provider's ``transfer_now``, or None


def _one_sided(kind: Literal["read", "write"], buffer: RDMABuffer, data: Any,
               timeout: int) -> Future[None]:  # fmt: skip
    """``read_into``/``write_from`` (module docstring): the checks of ``read_remote`` /
    ``write_remote`` and ``submit``, in that order, then the transfer straight through the
    buffer's provider; done at once where the provider can (``transfer_now``)."""
    if buffer._stage is not None or _staging.device_ops().is_device(data):
        action = RDMAAction()
        if kind == "read":
            action.read_remote(data, buffer)
        else:
            action.write_remote(buffer, data)
        return action.submit(timeout=timeout)
    local = local_memory(data)
    if kind == "read":
        _check_read(local, buffer)
        view = local.view if local.nbytes == buffer._size else local.view[: buffer._size]
    else:
        _check_write(local, buffer)
        view = local.view
    seconds = validate_timeout(timeout)
    try:
        routed = buffer._route()
        now = routed.now
        if now is not None and now(kind, routed.key, 0, view):
            return _DONE or _done()
    except Exception as exc:  # the outcome, as a submitted action reports it
        return _raise(exc)
    return _transfer_one(routed.provider, kind, routed.key, local, view, seconds)


#: The outcome of every transfer finished at the call (``transfer_now``): one completed
#: ``Future`` of ``None`` per process, shared (a future only reports its outcome, and this
#: one's never changes), made with monarch-actor's public API only (``_done``). A future made
#: per transfer cost a tenth of a 1 MiB ``shm`` read's fixed cost.
_DONE: Future[None] | None = None


@returns_future
async def _nothing() -> None:
    return None


@returns_future
async def _raise(exc: BaseException) -> None:
    """A failure found at the call, as the future's outcome (a rare path: its body runs when
    the caller observes it)."""
    raise exc


def _done() -> Future[None]:
    """``_DONE``, made on first use: a ``returns_future`` observed once, on a thread of its own
    (the caller may be running an event loop, where ``.get()`` warns)."""
    global _DONE
    done = _nothing()
    observer = threading.Thread(target=done.get, name="monarch-rdma-done", daemon=True)
    observer.start()
    observer.join()
    _DONE = done
    return done


@returns_future
async def _transfer_one(provider: RDMAProvider, kind: Literal["read", "write"], key: RemoteKey,
                        local: LocalMemory, view: memoryview, timeout: int) -> None:  # fmt: skip
    """One transfer as a future's body; ``local`` keeps the caller's memory alive until it ran
    (a tensor's view is a bare address)."""
    try:
        async with asyncio.timeout(timeout):
            if kind == "read":
                await provider.read(key, 0, view)
            else:
                await provider.write(key, 0, view)
    except TimeoutError:
        raise TimeoutError(
            f"RDMA transfer of 1 operation(s) timed out: not complete within {timeout} s"
        ) from None
    finally:
        del local


def _check_read(local: LocalMemory, src: RDMABuffer) -> None:
    if local.nbytes < src.size():
        raise ValueError(
            f"Destination tensor size ({local.nbytes}) must be >= RDMA buffer size ({src.size()})"
        )
    if local.readonly:
        raise ValueError("RDMA read destination is read-only memory")


def _check_write(local: LocalMemory, dst: RDMABuffer) -> None:
    if local.nbytes > dst.size():
        raise ValueError(
            f"Source tensor size ({local.nbytes}) must be <= RDMA buffer size ({dst.size()})"
        )


def _move_to_shared_memory(data: Any) -> bool:
    """Move a CPU tensor's storage into shared memory (``Tensor.share_memory_()``: one copy,
    once, in place: every view of the storage then uses the shared memory), so that the ``shm``
    provider shares it without copies. True when it moved."""
    tensor_type = _torch_tensor_type()
    if tensor_type is None or not isinstance(data, tensor_type):
        return False
    tensor: Any = data
    if tensor.device.type != "cpu" or tensor.is_shared():
        return False
    try:
        tensor.share_memory_()
    except (RuntimeError, OSError) as exc:  # /dev/shm full, a storage that cannot move
        _log.warning("RDMA buffer: the tensor stays in private memory (net serves it): %s", exc)
        return False
    return True


@returns_future
async def _drop(keys: dict[str, RemoteKey], stage: _staging.StageRef | None) -> None:
    registry = default_registry()
    for name, key in keys.items():
        await registry.provider(name).deregister(key)
    if stage is not None:
        await _staging.release(stage)


#: This process's id (``os.getpid()`` is a system call, on every transfer's path).
_pid = os.getpid()


def _forget_after_fork() -> None:
    global _fallback_warned, _fallback_lock, _pid
    _pid = os.getpid()
    _fallback_warned = False  # once per process: a forked child warns on its own
    _fallback_lock = threading.Lock()  # a fork while another thread held it left it held


os.register_at_fork(after_in_child=_forget_after_fork)


def _warn_fallback() -> None:
    global _fallback_warned
    with _fallback_lock:
        if _fallback_warned:
            return
        _fallback_warned = True
    _log.info(
        "RDMA without ibverbs: %s", unavailable_reason() or "disabled by rdma_disable_ibverbs"
    )
    warnings.warn(
        "No ibverbs RDMA hardware detected. Falling back to TCP transport, which has "
        "significantly lower throughput and higher latency than native RDMA. To disable this "
        "fallback and fail explicitly, call monarch.configure(rdma_allow_tcp_fallback=False).",
        RDMATcpFallbackWarning,
        stacklevel=3,
    )


@dataclass(frozen=True, slots=True)
class _Op:
    kind: Literal["read", "write"]
    buffer: RDMABuffer
    local: LocalMemory
    stage: _staging.LocalStage | None = None  # a CUDA tensor's staging


def _local(data: Any) -> tuple[LocalMemory, _staging.LocalStage | None]:
    if _staging.device_ops().is_device(data):
        stage = _staging.stage_local(data)
        return stage.memory, stage
    return local_memory(data), None


class RDMAAction:
    """A batch of RDMA operations, submitted as one unit (and as often as wanted).

    ``read_remote(dst, buffer)`` and ``write_remote(buffer, src)`` queue an operation and return
    the action; each is validated at once (``ValueError``): sizes, contiguity, and local ranges
    that conflict with an operation already queued (a destination overlapping any other local
    range; several operations may read the same source)."""

    def __init__(self) -> None:
        self._ops: list[_Op] = []
        self._claims: list[tuple[int, int, bool]] = []  # (start, end, written)

    def _claim(self, local: LocalMemory, written: bool) -> None:
        if local.nbytes == 0:
            return
        start, end = local.address, local.address + local.nbytes
        for other_start, other_end, other_written in self._claims:
            if start < other_end and other_start < end and (written or other_written):
                raise ValueError(
                    f"RDMAAction: local memory [0x{start:x}, 0x{end:x}) overlaps "
                    f"[0x{other_start:x}, 0x{other_end:x}) of an operation already queued, and "
                    "one of them writes it"
                )
        self._claims.append((start, end, written))

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Queue a read of buffer ``src`` into local memory ``dst``."""
        if not isinstance(src, RDMABuffer):
            raise TypeError(f"read_remote reads from an RDMABuffer, got {type(src).__name__}")
        local, stage = _local(dst)
        _check_read(local, src)
        self._claim(local, written=True)
        self._ops.append(_Op("read", src, local, stage))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Queue a write of local memory ``src`` into buffer ``dst``."""
        if not isinstance(dst, RDMABuffer):
            raise TypeError(f"write_remote writes to an RDMABuffer, got {type(dst).__name__}")
        local, stage = _local(src)
        _check_write(local, dst)
        self._claim(local, written=False)
        self._ops.append(_Op("write", dst, local, stage))
        return self

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> RDMAAction:
        """Atomic fetch-and-add: not supported (as in the reference)."""
        raise NotImplementedError("Not yet supported")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int, swap: int) -> RDMAAction:
        """Atomic compare-and-swap: not supported (as in the reference)."""
        raise NotImplementedError("Not yet supported")

    def submit(self, *, timeout: int = DEFAULT_TIMEOUT) -> Future[None]:
        """Run every queued operation in parallel; the Future resolves when all are done, or
        fails with the first failure (``TimeoutError`` "timed out" after ``timeout`` seconds).
        ``TypeError`` for a timeout that is not an int, ``OverflowError`` for one out of range."""
        seconds = validate_timeout(timeout)
        staged: dict[int, tuple[Any, Any]] = {}
        for index, op in enumerate(self._ops):
            if op.stage is not None:  # the caller's stream; a write's copy is queued now
                nbytes = op.local.nbytes if op.kind == "write" else op.buffer.size()
                staged[index] = op.stage.begin(op.kind, nbytes)
        return _submit(list(self._ops), seconds, staged)


async def _run(op: _Op, usable: dict[str, ProviderSpec], staged: tuple[Any, Any] | None) -> None:
    if op.stage is None and op.buffer._stage is None:
        await _transfer(op, usable)
        return
    stream, token = staged if staged is not None else (None, None)
    if op.stage is not None:
        await op.stage.before(token)
    if op.buffer._stage is not None and op.kind == "read":
        await _staging.sync_owner(op.buffer._stage, "to_host", op.buffer.size())
    await _transfer(op, usable)
    if op.buffer._stage is not None and op.kind == "write":
        await _staging.sync_owner(op.buffer._stage, "to_device", op.local.nbytes)
    if op.stage is not None and op.kind == "read":
        await op.stage.after_read(stream, op.buffer.size())


async def _transfer(op: _Op, usable: dict[str, ProviderSpec]) -> None:
    buffer = op.buffer
    name = buffer._choose(usable)
    if name is None:
        raise RuntimeError(
            f"no RDMA provider of this process reaches the owner of {buffer!r} (this process "
            f"offers {sorted(usable)}, the owner {sorted(buffer._keys)})"
        )
    provider = default_registry().provider(name)
    key = buffer._keys[name]
    if op.kind == "read":
        await provider.read(key, 0, op.local.view[: buffer.size()])
    else:
        await provider.write(key, 0, op.local.view)


@returns_future
async def _submit(ops: list[_Op], timeout: int, staged: dict[int, tuple[Any, Any]]) -> None:
    if not ops:
        return
    usable = _usable()
    try:
        async with asyncio.timeout(timeout):  # no extra task (a 1 MiB shm read is ~40 us)
            if len(ops) == 1:
                await _run(ops[0], usable, staged.get(0))
                return
            errors = await _run_all(ops, usable, staged)
    except TimeoutError:
        raise TimeoutError(
            f"RDMA transfer of {len(ops)} operation(s) timed out: not complete within {timeout} s"
        ) from None
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} more operation(s) of this RDMAAction failed too")
        raise first


async def _run_all(
    ops: list[_Op], usable: dict[str, ProviderSpec], staged: dict[int, tuple[Any, Any]]
) -> list[BaseException]:
    """Every operation at once; their failures in the operations' order. Operations that one
    provider with ``transfer_many`` serves (no staging) go to it together, so that it can
    pipeline them (``net``: no round trip per operation); the others run one by one, all in
    parallel."""
    outcomes: list[BaseException | None] = [None] * len(ops)
    together: dict[str, list[int]] = {}
    alone: list[int] = []
    for index, op in enumerate(ops):
        if op.stage is not None or op.buffer._stage is not None:
            alone.append(index)
            continue
        name = op.buffer._choose(usable)
        if name is None or not hasattr(default_registry().provider(name), "transfer_many"):
            alone.append(index)  # ``_transfer`` reports a provider missing
            continue
        together.setdefault(name, []).append(index)
    for name, indices in list(together.items()):
        if len(indices) == 1:
            alone.extend(indices)
            del together[name]

    async def many(name: str, indices: list[int]) -> None:
        batch = []
        for index in indices:
            op = ops[index]
            view = op.local.view[: op.buffer.size()] if op.kind == "read" else op.local.view
            batch.append((op.kind, op.buffer._keys[name], 0, view))
        results = await default_registry().provider(name).transfer_many(batch)  # type: ignore[attr-defined]
        for index, result in zip(indices, results, strict=True):
            outcomes[index] = result

    async def one(index: int) -> None:
        try:
            await _run(ops[index], usable, staged.get(index))
        except Exception as exc:
            outcomes[index] = exc

    jobs = [many(name, indices) for name, indices in together.items()]
    jobs.extend(one(index) for index in sorted(alone))
    for result in await asyncio.gather(*jobs, return_exceptions=True):
        if isinstance(result, BaseException):  # a provider's own failure, not an operation's
            raise result
    return [outcome for outcome in outcomes if outcome is not None]
