"""The ``Actor`` base class and the checks a class must pass to be spawned.

Why the checks live here and run at ``spawn``: a class that mixes sync and async endpoints has no
consistent execution model (sync endpoints must see no event loop, async ones need one), and an
endpoint named like a mesh attribute (``slice``, ``stop``...) could never be reached through the
mesh. Both are programming errors, so ``spawn`` raises ``ValueError`` synchronously instead of
letting a remote actor fail later.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

from monarch.actor._base.endpoint import EndpointProperty, endpoints_of
from monarch.actor._base.errors import MeshFailure
from monarch.actor._base.shape import MeshTrait, Shape, Slice

if TYPE_CHECKING:
    from monarch.actor._base.future import Future

__all__ = ["RESERVED_MESH_NAMES", "Actor", "check_actor_class"]

#: Names an endpoint may not have, because ``ActorMesh`` uses them.
RESERVED_MESH_NAMES = frozenset(
    {
        "extent",
        "flatten",
        "initialized",
        "region",
        "rename",
        "shape",
        "size",
        "sizes",
        "slice",
        "split",
        "stop",
    }
)


def _documentation_only(fn: Any) -> Any:
    fn._monarch_default = True
    return fn


class Actor(MeshTrait):
    """Base class of actors: subclass it, decorate methods with ``@endpoint``, spawn it.

    Constructor arguments come from ``proc_mesh.spawn(name, Class, *args, **kwargs)``. Optional
    hooks (``def`` or ``async def``, matching the endpoints): ``__supervise__(failure)`` for
    failures of meshes this actor owns (truthy return = handled), ``__cleanup__(exc)`` on stop
    (``exc is None``) or failure, and ``_handle_undeliverable_message(envelope)`` for messages it
    sent that bounced (``True`` = swallow). The base versions are documentation only: the runtime
    treats "not overridden" as "no handler".
    """

    # ``spawn`` is typed as returning the actor class, so that ``mesh.method.call()`` type-checks
    # (as in Monarch); the mesh members below exist for the type checker only. An actor
    # instance is not a mesh: its mesh members raise.
    @property
    def _ndslice(self) -> Slice:
        raise NotImplementedError("an actor instance is not a mesh")

    @property
    def _labels(self) -> Sequence[str]:
        raise NotImplementedError("an actor instance is not a mesh")

    def _new_with_shape(self, shape: Shape) -> Self:
        raise NotImplementedError("an actor instance is not a mesh")

    if TYPE_CHECKING:

        @property
        def initialized(self) -> Future[None]: ...

        @property
        def _name(self) -> Future[str]: ...

        def stop(self, reason: str = "stopped by client") -> Future[None]: ...

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the class, at level DEBUG."""
        cls = type(self)
        # a class of the client's main script, loaded in a worker (``_runtime.main_module``)
        module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
        logger = logging.getLogger(f"{module}.{cls.__qualname__}")
        logger.setLevel(logging.DEBUG)
        return logger

    @_documentation_only
    def __supervise__(self, failure: MeshFailure) -> Any:
        """Called with a failure of an owned mesh; return truthy to contain it."""
        return False

    @_documentation_only
    def __cleanup__(self, exc: BaseException | None) -> Any:
        """Called when the actor stops (``exc is None``) or fails (``exc`` set)."""
        return None

    @_documentation_only
    def _handle_undeliverable_message(self, envelope: Any) -> bool:
        """Called when a message this actor sent could not be delivered; ``True`` swallows it."""
        return False


_CHECKED: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _overridden(cls: type, name: str) -> Any:
    method = getattr(cls, name, None)
    if method is None or getattr(method, "_monarch_default", False):
        return None
    return method


def check_actor_class(cls: object) -> bool:
    """Validate ``cls`` for spawning; returns True for async actors.

    Raises ``ValueError`` if it is not an ``Actor`` subclass, mixes sync and async endpoints,
    has a ``__cleanup__`` (or, for sync actors, ``__supervise__`` or
    ``_handle_undeliverable_message``) of the other kind, or names an endpoint like a mesh
    attribute.
    """
    if not isinstance(cls, type) or not issubclass(cls, Actor):
        raise ValueError(f"{cls!r} is not a subclass of monarch.actor.Actor")
    cached = _CHECKED.get(cls)
    if cached is not None:
        return cached
    endpoints: dict[str, EndpointProperty[Any, Any]] = endpoints_of(cls)
    for name in endpoints:
        if name in RESERVED_MESH_NAMES:
            raise ValueError(
                f"{cls.__qualname__}.{name}: '{name}' is an attribute of actor meshes and "
                "collides with an endpoint name"
            )
    kinds = {prop.is_async or prop._concurrent for prop in endpoints.values()}
    if len(kinds) > 1:
        sync_names = sorted(n for n, p in endpoints.items() if not (p.is_async or p._concurrent))
        async_names = sorted(n for n, p in endpoints.items() if p.is_async or p._concurrent)
        raise ValueError(
            f"{cls.__qualname__} mixes both async and sync endpoints "
            f"(sync: {sync_names}, async: {async_names})"
        )
    cleanup = _overridden(cls, "__cleanup__")
    if kinds:
        is_async = kinds == {True}
    else:
        is_async = cleanup is not None and inspect.iscoroutinefunction(cleanup)
    if cleanup is not None and inspect.iscoroutinefunction(cleanup) != is_async:
        kind = "async" if is_async else "sync"
        raise ValueError(
            f"{cls.__qualname__} has {kind} endpoints, so __cleanup__ must be {kind} as well "
            "(it mixes both async and sync)"
        )
    if not is_async:
        for hook in ("__supervise__", "_handle_undeliverable_message"):
            method = _overridden(cls, hook)
            if method is not None and inspect.iscoroutinefunction(method):
                raise ValueError(
                    f"{cls.__qualname__} has sync endpoints but an async {hook} "
                    "(it mixes both async and sync)"
                )
    _CHECKED[cls] = is_async
    return is_async
