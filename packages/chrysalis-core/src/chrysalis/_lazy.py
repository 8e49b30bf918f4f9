"""Lazy re-exports for package facades (PEP 562): the ``__getattr__`` and ``__dir__`` of a
package whose public names are imported on first use.

Why: a facade that imports every defining module costs each process what only some use (the
``chrysalis`` command, a worker loop: issue 22, item 5). The facades of chrysalis-core,
-datagram, -quic, -node and monarch-job name such names in a table (name -> defining module)
and take these two functions for it::

    from chrysalis._lazy import lazy_exports

    if TYPE_CHECKING:  # what type checkers see: the names themselves
        from pkg._impl import Thing
    __getattr__, __dir__ = lazy_exports(globals(), {"Thing": "pkg._impl"})

Why here, beside ``chrysalis.core`` rather than in it: importing ``chrysalis.core._lazy`` would
run ``chrysalis.core``'s ``__init__`` (the wire types, ``typing``) in every process that
imports a facade using it, and the thin path of the ``chrysalis`` command imports
``chrysalis.node`` and nothing of chrysalis-core (``chrysalis.node`` imports this module only
at its first lazy look-up, see its ``__init__``). This module imports only ``sys`` (loaded with
the interpreter); ``TYPE_CHECKING`` is a local ``False``, not ``typing``'s.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any],
    table: Mapping[str, str],
    submodules: Collection[str] = (),
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` of the module whose globals are ``namespace``.

    ``__getattr__(name)``: a name of ``table`` is imported from its module (``table[name]``),
    stored in ``namespace`` (later look-ups are plain attribute reads, not calls) and returned;
    a name of ``submodules`` is the package's submodule of that name, imported (the import
    binds it on the package); any other name raises Python's own ``AttributeError`` (``module
    'pkg' has no attribute 'name'``). ``__dir__()``: the module's globals and its ``__all__``
    (read when called, so ``__all__`` may be assigned after this call), sorted.
    """
    package: str = namespace["__name__"]

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            if name not in submodules:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            module = f"{package}.{name}"
            __import__(module)
            return sys.modules[module]
        __import__(module)  # not importlib (it imports warnings): see the module's doc
        value: object = getattr(sys.modules[module], name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__
