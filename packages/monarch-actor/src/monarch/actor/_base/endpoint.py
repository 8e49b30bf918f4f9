"""Declaring endpoints: ``@endpoint``, ``@concurrent_endpoint``, and endpoint discovery.

Why a module of its own: declarations are needed both where messages are sent (to validate
arguments against the signature before anything leaves the caller) and where they are handled
(to know whether a method takes an explicit reply port or runs as a concurrent task), and
neither side may depend on the other's machinery. An ``EndpointProperty`` is a plain descriptor
holding the function and its options; ``endpoints_of(cls)`` lists a class's endpoints (inherited
ones included) once per class.

Accessed on an actor *instance*, an endpoint is the plain bound method (so actor code can call
its own endpoints directly); accessed on an actor *mesh* it is an ``Endpoint`` with the adverbs
(``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``). For static typing, ``spawn``
returns the actor class type, so the descriptor is typed as producing an ``Endpoint``.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

if TYPE_CHECKING:
    from monarch.actor._mesh.adverbs import Endpoint
    from monarch.actor._runtime.ports import Port

__all__ = [
    "EndpointProperty",
    "Propagator",
    "concurrent_endpoint",
    "endpoint",
    "endpoints_of",
]

P = ParamSpec("P")
R = TypeVar("R")
Propagator = Any  # a shape-inference callable or "cached" / "inspect" / "mocked" (tensor engine)


class EndpointProperty(Generic[P, R]):
    """Descriptor produced by ``@endpoint``: the method and its options.

    ``_explicit_response_port`` is true for ``explicit_response_port=True`` endpoints and for
    every concurrent endpoint (as in the reference); ``_user_port`` says whether the user's
    function itself takes the port after ``self``.
    """

    def __init__(
        self,
        method: Callable[..., Any],
        *,
        propagator: Propagator = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        if not callable(method):
            raise TypeError(f"endpoint needs a function, got {type(method).__name__}")
        self._method = method
        self._propagator = propagator
        self._user_port = explicit_response_port
        self._explicit_response_port = explicit_response_port or concurrent
        self._instrument = instrument
        self._concurrent = concurrent
        self._name = getattr(method, "__name__", "endpoint")
        self._signature: inspect.Signature | None = None
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The attribute name of the endpoint."""
        return self._name

    @property
    def is_async(self) -> bool:
        """True for ``async def`` endpoints."""
        return inspect.iscoroutinefunction(self._method)

    def bind_check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` now if the arguments do not fit the method's signature."""
        if not kwargs and len(args) == self._plain_arity:
            return  # the common case, decided without Signature.bind (on every call's path)
        if self._signature is None:
            try:
                self._signature = inspect.signature(self._method)
            except (TypeError, ValueError):
                return  # builtins without a signature: let the callee decide
        leading: tuple[Any, ...] = (None, None) if self._user_port else (None,)
        self._signature.bind(*leading, *args, **kwargs)

    @functools.cached_property
    def _plain_arity(self) -> int:
        """How many positional arguments bind trivially: the method's parameters after
        ``self`` (and the explicit port) when all are plain positional ones; -1 otherwise."""
        try:
            parameters = list(inspect.signature(self._method).parameters.values())
        except (TypeError, ValueError):
            return -1
        leading = 2 if self._user_port else 1
        if len(parameters) < leading:
            return -1
        rest = parameters[leading:]
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if any(p.kind not in plain for p in parameters):
            return -1
        return len(rest)

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> EndpointProperty[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> Endpoint[P, R]: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)

    def __repr__(self) -> str:
        return f"<endpoint {self._name}>"


class _EndpointDecorator(Protocol):
    """What ``@endpoint(...)`` returns: a decorator typed like ``endpoint`` itself."""

    @overload
    def __call__(
        self, method: Callable[Concatenate[Any, P], Awaitable[R]]
    ) -> EndpointProperty[P, R]: ...

    @overload
    def __call__(self, method: Callable[Concatenate[Any, P], R]) -> EndpointProperty[P, R]: ...


class _AsyncEndpointDecorator(Protocol):
    """What ``@concurrent_endpoint(...)`` returns."""

    def __call__(
        self, method: Callable[Concatenate[Any, P], Awaitable[R]]
    ) -> EndpointProperty[P, R]: ...


class _PortEndpointDecorator(Protocol):
    """What ``@endpoint(explicit_response_port=True)`` returns: the ``Port[R]`` parameter
    after ``self`` is not part of the endpoint's call signature, and ``R`` is its reply type."""

    def __call__(
        self, method: Callable[Concatenate[Any, Port[R], P], Any]
    ) -> EndpointProperty[P, R]: ...


@overload
def endpoint(
    method: Callable[Concatenate[Any, P], Awaitable[R]],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...


@overload
def endpoint(
    method: Callable[Concatenate[Any, P], R],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...


@overload
def endpoint(
    method: None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> _PortEndpointDecorator: ...


@overload
def endpoint(
    method: None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> _EndpointDecorator: ...


def endpoint(
    method: Any = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as an endpoint (bare ``@endpoint`` or with options).

    ``explicit_response_port=True`` injects a reply ``Port`` right after ``self``: the method
    replies with ``port.send``/``port.exception`` (maybe later, maybe from another thread) and
    its return value is discarded; if it raises, the actor fails. ``propagate`` is kept for the
    tensor engine; ``instrument`` for tracing.
    """
    if method is None:
        return functools.partial(
            endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )
    if isinstance(method, EndpointProperty):
        return method
    return EndpointProperty(
        method,
        propagator=propagate,
        explicit_response_port=explicit_response_port,
        instrument=instrument,
    )


@overload
def concurrent_endpoint(
    method: Callable[Concatenate[Any, P], Awaitable[R]],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...


@overload
def concurrent_endpoint(
    method: None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> _PortEndpointDecorator: ...


@overload
def concurrent_endpoint(
    method: None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> _AsyncEndpointDecorator: ...


def concurrent_endpoint(
    method: Any = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """An async endpoint whose body runs as an asyncio task, so later messages are admitted.

    For two messages from one sender, the first body starts (runs to its first ``await``)
    before the second. On stop, outstanding bodies are cancelled and awaited before
    ``__cleanup__``. Without an explicit port an exception goes back to the caller as
    ``ActorError``; with one, it fails the actor. Only ``async def`` methods are accepted, and it
    does not stack on ``@endpoint`` (both ``ValueError``).
    """
    if method is None:
        return functools.partial(
            concurrent_endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )
    if isinstance(method, EndpointProperty):
        raise ValueError(
            "concurrent_endpoint does not wrap @endpoint; pass endpoint options to "
            "@concurrent_endpoint instead"
        )
    if not inspect.iscoroutinefunction(method):
        raise ValueError("concurrent_endpoint can only wrap async endpoints")
    return EndpointProperty(
        method,
        propagator=propagate,
        explicit_response_port=explicit_response_port,
        instrument=instrument,
        concurrent=True,
    )


_ENDPOINTS: weakref.WeakKeyDictionary[type, dict[str, EndpointProperty[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)


def endpoints_of(cls: type) -> dict[str, EndpointProperty[Any, Any]]:
    """Every endpoint of ``cls`` by name, inherited ones included (cached per class)."""
    found = _ENDPOINTS.get(cls)
    if found is None:
        found = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, EndpointProperty):
                    found[name] = value
                elif name in found:
                    del found[name]  # overridden by a plain attribute
        _ENDPOINTS[cls] = found
    return found
