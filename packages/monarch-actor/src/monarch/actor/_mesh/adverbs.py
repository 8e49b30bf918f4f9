"""Endpoint adverbs: how a message is sent to a mesh and how its replies come back.

Why: Monarch builds every adverb from one primitive, "send these arguments to these ranks and
reply (or not) to this port". Here each adverb validates the arguments against the endpoint's
signature on the caller side (``TypeError`` before anything is sent), pickles them once, opens
the reply port with the right collector, and sends one envelope per rank in rank order:

=============  =========================  ==================================================
adverb         returns                    reply collection
=============  =========================  ==================================================
``call``       ``Future[ValueMesh[R]]``   one reply per rank; the lowest failing rank's error
``call_one``   ``Future[R]``              mesh must have exactly one rank (``ValueError``)
``choose``     ``Future[R]``              one rank, chosen round-robin
``stream``     iterator of ``Future[R]``  the k-th future gets the k-th arriving reply
``broadcast``  ``None``                   no reply port: a raise kills the actor
=============  =========================  ==================================================

The request leaves when the adverb is called; futures only govern waiting. While tracing is on
(``enable_telemetry(tracing=True)``), the fan-out of each adverb runs in a *send span*
(``"<adverb> <mesh>.<endpoint>"``, ``span.kind`` ``send``) whose ids every CALL envelope
carries, so each rank's endpoint span is its child, in whatever process it runs; with tracing
off the cost is one flag check.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, NoReturn, ParamSpec, TypeVar

from monarch.actor._base import codec as _codec
from monarch.actor._base.endpoint import EndpointProperty
from monarch.actor._base.envelope import FLAG_EXPLICIT_PORT, ActorAddr, CastInfo
from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.value_mesh import ValueMesh, _dense
from monarch.actor._runtime.context import (
    current_sender,
)
from monarch.actor._runtime.sinks import (
    GatherSink,
    OneSink,
    Reply,
    StreamSink,
    decode_reply,
)
from monarch.actor._runtime.telemetry import tracing as _tracing

if TYPE_CHECKING:
    from monarch.actor._base.shape import Extent
    from monarch.actor._mesh.meshes import ActorMesh
    from monarch.actor._runtime.ports import Port

__all__ = ["Endpoint", "NotAnEndpoint", "as_endpoint", "send"]

P = ParamSpec("P")
R = TypeVar("R")


def _gathered(extent: Extent) -> Callable[[list[Reply]], ValueMesh[Any]]:
    """The decoder of a ``call()``'s gathered replies over ``extent``, made once per endpoint
    (the extent's dense shape and ranks looked up here, not per call). ``GatherSink`` completes
    with the replies already in rank order (slot ``i`` holds cast rank ``i``), so they are not
    sorted again."""
    shape, ranks = _dense(extent)
    n = len(ranks)
    decode_payload = _codec.decode

    def decode(replies: list[Reply]) -> ValueMesh[Any]:
        for reply in replies:
            if not reply.ok:
                decode_reply(reply)  # raises the lowest-ranked failure
        if len(replies) != n:
            raise ValueError(f"shape has {n} ranks but {len(replies)} values were given")
        return ValueMesh._from_table(
            shape,
            dict(
                zip(
                    ranks,
                    [decode_payload(r.payload, r.buffers, r.kinds) for r in replies],
                    strict=True,
                )
            ),
        )

    return decode


#: The module that registers the tensor engine's hooks when imported (monarch-tensor, a higher
#: package: imported by name on first use, never statically).
TENSOR_ENGINE_MODULE: Final = "monarch.tensor"

#: ``Endpoint.rref``: ``(actor mesh, endpoint name, propagator, args, kwargs) -> tensors``;
#: registered by the tensor engine at import.
_rref_hook: Callable[..., Any] | None = None


def set_rref_hook(fn: Callable[..., Any]) -> None:
    """Register what ``Endpoint.rref`` does (``monarch.tensor``, at import)."""
    global _rref_hook
    _rref_hook = fn


def load_tensor_engine(feature: str) -> None:
    """Import the tensor engine (which registers its hooks); ``NotImplementedError`` naming
    monarch-tensor for ``feature`` when it is not installed."""
    try:
        importlib.import_module(TENSOR_ENGINE_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and TENSOR_ENGINE_MODULE.startswith(exc.name):
            raise NotImplementedError(
                f"{feature} needs the tensor engine: install monarch-tensor"
            ) from exc
        raise


class Endpoint(Generic[P, R]):
    """An endpoint of an actor mesh, with the adverbs as methods (see the module docstring)."""

    __slots__ = ("_explicit", "_gather", "_mesh", "_name", "_prop")

    def __init__(
        self,
        mesh: ActorMesh[Any],
        name: str,
        prop: EndpointProperty[P, R] | None,
        *,
        explicit: bool = False,
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop
        self._explicit = explicit if prop is None else prop._user_port
        #: ``call()``'s decoder of the gathered replies (``_gathered``), made on first use
        self._gather: Callable[[list[Reply]], ValueMesh[Any]] | None = None

    @property
    def name(self) -> str:
        """The endpoint's method name."""
        return self._name

    def _encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _codec.Payload:
        if self._prop is not None:
            self._prop.bind_check(args, kwargs)
        return _codec.encode((args, kwargs))

    def _post_all(
        self,
        payload: _codec.Payload,
        targets: list[tuple[ActorAddr, CastInfo]],
        reply_port: Any,
        adverb: str,
        opened_by: tuple[Any, Any] | None = None,
    ) -> None:
        # ``opened_by``: the runtime and sender that opened ``reply_port`` (asked once per call)
        runtime, sender = opened_by if opened_by is not None else current_sender()
        flags = FLAG_EXPLICIT_PORT if self._explicit and self._prop is None else 0
        if _tracing.TRACING and (self._prop is None or self._prop._instrument):
            # the posts inside a send span, its trace context given to every envelope
            _tracing.send_call_traced(
                adverb, self, runtime, sender, payload, targets, reply_port, flags
            )
            return
        self._post_each(runtime, sender, payload, targets, reply_port, flags)

    def _post_each(
        self,
        runtime: Any,
        sender: Any,
        payload: _codec.Payload,
        targets: list[tuple[ActorAddr, CastInfo]],
        reply_port: Any,
        flags: int,
    ) -> None:
        # (traced, ``_tracing.send_call_traced`` posts the same itself, with its span's context)
        runtime.post_calls(
            sender,
            targets,
            endpoint=self._name,
            reply_port=reply_port,
            payload=payload,
            flags=flags,
        )

    def _open(self, sink: Any) -> Any:
        runtime, sender = current_sender()
        return runtime, sender, runtime.open_port(sender, sink, self._name)

    def _send_with(
        self,
        payload: _codec.Payload,
        targets: list[tuple[ActorAddr, CastInfo]],
        sink: Any,
        adverb: str,
    ) -> None:
        runtime, sender, port = self._open(sink)
        try:
            self._post_all(payload, targets, port, adverb, (runtime, sender))
        except BaseException:
            runtime.close_port(port.index)
            raise

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Send to every rank; the future holds a ``ValueMesh`` of the replies."""
        payload = self._encode(args, kwargs)
        targets = self._mesh._targets()
        cell: _Cell[list[Reply]] = _Cell()
        if targets:
            # ``_send_with`` inlined (every broadcast's path)
            runtime, sender = current_sender()
            port = runtime.open_port(sender, GatherSink(len(targets), cell), self._name)
            try:
                self._post_all(payload, targets, port, "call", (runtime, sender))
            except BaseException:
                runtime.close_port(port.index)
                raise
        else:
            cell.set_result([])
        gather = self._gather
        if gather is None:
            gather = self._gather = _gathered(self._mesh.extent)
        return Future._create(cell, gather)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call a mesh of exactly one rank (``ValueError`` otherwise, before binding)."""
        size = len(self._mesh)
        if size != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {size}")
        payload = self._encode(args, kwargs)
        targets = self._mesh._targets()
        cell: _Cell[Reply] = _Cell()
        # ``_send_with`` inlined (every call's path)
        runtime, sender = current_sender()
        port = runtime.open_port(sender, OneSink(cell), self._name)
        try:
            self._post_all(payload, targets, port, "call_one", (runtime, sender))
        except BaseException:
            runtime.close_port(port.index)
            raise
        return Future._create(cell, decode_reply)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Send to one rank chosen by the runtime (round-robin) and return its reply."""
        payload = self._encode(args, kwargs)
        targets = self._mesh._targets()
        if not targets:
            raise ValueError("choose needs a mesh with at least one rank")
        target = targets[next(self._mesh._chooser) % len(targets)]
        cell: _Cell[Reply] = _Cell()
        self._send_with(payload, [target], OneSink(cell), "choose")
        return Future._create(cell, decode_reply)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Send to every rank now; yield one future per rank, in reply-arrival order."""
        payload = self._encode(args, kwargs)
        targets = self._mesh._targets()
        cells: list[_Cell[Reply]] = [_Cell() for _ in targets]
        if targets:
            self._send_with(payload, targets, StreamSink(cells), "stream")
        return iter([Future._create(cell, decode_reply) for cell in cells])

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every rank without a reply port (fire and forget, still FIFO)."""
        payload = self._encode(args, kwargs)
        self._post_all(payload, self._mesh._targets(), None, "broadcast")

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call on every rank inside the tensor engine's order: distributed tensor arguments
        arrive as the local shards and the returned tensors form distributed tensors (shapes
        from the endpoint's ``propagate``). Needs monarch-tensor (``NotImplementedError``)."""
        if _rref_hook is None:
            load_tensor_engine("Endpoint.rref()")
        if _rref_hook is None:
            raise NotImplementedError(f"{TENSOR_ENGINE_MODULE} did not register rref")
        propagator = self._prop._propagator if self._prop is not None else None
        return _rref_hook(self._mesh, self._name, propagator, args, kwargs)

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port[Any] | None,
        selection: Literal["all", "choose"],
    ) -> None:
        payload = self._encode(args, kwargs)
        targets = self._mesh._targets()
        if selection == "choose":
            if not targets:
                raise ValueError("choose needs a mesh with at least one rank")
            targets = [targets[next(self._mesh._chooser) % len(targets)]]
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        self._post_all(payload, targets, port.addr if port is not None else None, "send")

    def __repr__(self) -> str:
        return f"<Endpoint {self._name} of {self._mesh!r}>"


class NotAnEndpoint:
    """What a mesh returns for a method that is not decorated with ``@endpoint``."""

    __slots__ = ("_mesh", "_name")

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError(
            f"Actor method {self._name!r} is not an endpoint: decorate it with @endpoint or "
            f"wrap it with as_endpoint(mesh.{self._name})"
        )

    def __getattr__(self, name: str) -> NoReturn:
        raise RuntimeError(
            f"Actor method {self._name!r} is not an endpoint: decorate it with @endpoint or "
            f"wrap it with as_endpoint(mesh.{self._name}) before using .{name}"
        )


def as_endpoint(
    not_an_endpoint: Any,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
) -> Endpoint[Any, Any]:
    """Turn ``mesh.method`` of an undecorated method into an ``Endpoint``.

    Anything else raises ``ValueError``.
    """
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("as_endpoint takes an undecorated actor method of a mesh (mesh.method)")
    return Endpoint(
        not_an_endpoint._mesh, not_an_endpoint._name, None, explicit=explicit_response_port
    )


def send(
    endpoint: Endpoint[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Low-level send: every selected rank replies to ``port`` (or nobody, if ``None``)."""
    endpoint._send(tuple(args), dict(kwargs), port, selection)
