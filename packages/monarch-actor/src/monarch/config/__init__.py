"""Monarch configuration (``monarch.config``): the runtime's settings.

``configure(cleanup_timeout=5.0)`` overrides a setting for this process, ``configured(...)`` does
so for a ``with`` block, ``get_global_config()`` shows every effective value and
``get_runtime_config()`` only the overrides. Environment variables (``HYPERACTOR_*``,
``MONARCH_*``) sit between overrides and defaults. See ``settings()`` for the list of keys: every
key of Monarch 0.7.0 (those with ``applied=False`` change nothing here) and a few of this
implementation's own. Durations read back as Monarch's strings (``"1m 30s"``).
``ChannelTransport`` is importable from here, as in Monarch (not in ``__all__``; it is
``monarch.actor.ChannelTransport``).
"""

from __future__ import annotations

from monarch.config._registry import ChannelTransport as ChannelTransport
from monarch.config._registry import (
    Encoding,
    Setting,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    settings,
)

__all__ = [
    "Encoding",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "settings",
]

for _public in (Encoding, Setting):
    _public.__module__ = __name__
