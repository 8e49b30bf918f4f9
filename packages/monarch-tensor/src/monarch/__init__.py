"""``monarch``: the namespace every monarch-* distribution installs into.

Only monarch-tensor ships this file. It keeps ``monarch`` open to the other distributions'
portions (``pkgutil.extend_path``: ``monarch.actor``, ``monarch.rdma``, ... are found wherever
they are installed, editable installs included) and gives Monarch programs the reference's
top-level names (``from monarch import fetch_shard, remote, ...``), each imported on first use,
so ``import monarch.actor`` does not import torch. Without monarch-tensor, ``monarch`` is a
plain namespace package (PEP 420) and these names are absent.
"""

from __future__ import annotations

from importlib import import_module as _import_module
from pkgutil import extend_path as _extend_path
from typing import Any

__path__ = _extend_path(__path__, __name__)

#: name -> (module, attribute): the tensor engine's top-level names, imported on first use.
_PUBLIC = {
    name: ("monarch.tensor", name)
    for name in (
        "RemoteException",
        "Stream",
        "Tensor",
        "call_on_shard_and_fetch",
        "coalescing",
        "fetch_shard",
        "get_active_mesh",
        "get_active_stream",
        "grad_generator",
        "inspect",
        "no_mesh",
        "reduce",
        "reduce_",
        "remote",
        "slice_mesh",
        "to_mesh",
    )
}
_PUBLIC["Future"] = ("monarch.actor", "Future")
_PUBLIC["Extent"] = ("monarch.actor", "Extent")
_PUBLIC["Shape"] = ("monarch.actor", "Shape")

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'monarch' has no attribute {name!r}") from None
    value = getattr(_import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
