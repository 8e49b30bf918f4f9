"""``aioquic.tls``, imported without paying for what its peer-chain verification alone uses.

Why: ``aioquic.tls`` imports ``service_identity`` (and with it pyOpenSSL, attrs and idna),
``OpenSSL.crypto`` and ``certifi`` at its top, and uses them in one function only,
``verify_certificate``, which aioquic calls when a configuration's ``verify_mode`` asks for
the peer chain to be checked. Chrysalis never does (both engines run with ``CERT_NONE``: the
endpoint checks the peer's certificate against its trust roots and PID itself), yet every
process that speaks QUIC paid for those imports at start-up: about a fifth of the QUIC stack's
import time, on the critical path of every worker loop a job starts (monarch-job, issue 19).

How: while ``aioquic.tls`` is first imported, each of those modules that is not imported yet is
stood in for by a ``_Deferred`` module. ``aioquic.tls`` binds the stand-ins as its globals; the
stand-ins are removed from ``sys.modules`` again right after, so any other importer gets the
real modules. The first attribute read from a stand-in (say ``verify_certificate`` runs after
all) imports the real module and forwards to it, so aioquic behaves exactly as before, only
later. Modules already imported (a program that uses pyOpenSSL itself) are used as they are.

Every engine module imports ``aioquic.tls`` (directly or through ``aioquic.quic``) only after
importing this module (``tests/test_engine_imports.py`` checks that none of the deferred
modules is imported by ``chrysalis.quic`` and that ``verify_certificate`` still works).
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any, Final

__all__ = ["DEFERRED", "tls"]

DEFERRED: Final = ("service_identity", "OpenSSL", "OpenSSL.crypto", "certifi")
"""The modules ``aioquic.tls`` imports at its top for ``verify_certificate`` only."""

_lock: Final = threading.RLock()


class _Deferred(types.ModuleType):
    """Stands in for the module of the same name until an attribute is read from it; then that
    module is imported for real and the read (and every later one) forwarded to it."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"deferred by chrysalis.quic: imported on first use of {name}")
        self.__dict__["_deferred_real"] = None

    def _deferred_load(self) -> types.ModuleType:
        real: types.ModuleType | None = self.__dict__["_deferred_real"]
        if real is None:
            with _lock:
                if sys.modules.get(self.__name__) is self:  # still standing in: step aside
                    del sys.modules[self.__name__]
                real = importlib.import_module(self.__name__)
                self.__dict__["_deferred_real"] = real
        return real

    def __getattr__(self, name: str) -> Any:  # only for names this stand-in lacks
        if name.startswith("__") and name.endswith("__"):
            # the import system's questions (``__path__`` for ``from OpenSSL import crypto``,
            # ``__spec__``...) are answered by the stand-in, not by loading the module
            raise AttributeError(name)
        return getattr(self._deferred_load(), name)


def _stand_in() -> dict[str, _Deferred]:
    """Put a stand-in into ``sys.modules`` for each deferred module not imported yet."""
    placed: dict[str, _Deferred] = {}
    if "aioquic.tls" in sys.modules:  # imported before (by a program): nothing to defer
        return placed
    for name in DEFERRED:
        if name not in sys.modules:
            placed[name] = _Deferred(name)
            sys.modules[name] = placed[name]
    if "OpenSSL" in placed and "OpenSSL.crypto" in placed:
        # ``from OpenSSL import crypto`` reads the submodule as the package's attribute
        placed["OpenSSL"].__dict__["crypto"] = placed["OpenSSL.crypto"]
    return placed


def _step_aside(placed: dict[str, _Deferred]) -> None:
    """Take the stand-ins out of ``sys.modules`` again (``aioquic.tls`` keeps its own)."""
    for name, stand_in in placed.items():
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]


with _lock:
    _placed = _stand_in()
    try:
        from aioquic import tls
    finally:
        _step_aside(_placed)
        del _placed
