"""Chrysalis wire types (PIDs, connection IDs, datagram addresses), the runtime-neutral
completion model and the plugin hookspecs.

This facade is the only supported import location; the ``_``-prefixed modules behind it carry
no stability promise. Everything here is pure Python without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from chrysalis._lazy import lazy_exports

# --- wire types: identities, connection IDs, carrier addresses, their errors ---------------
from chrysalis.core._addr import (
    INPROC_SCHEME,
    SWITCH_SCHEME,
    UDP_SCHEME,
    UNIXGRAM_SCHEME,
    DatagramAddr,
)
from chrysalis.core._cid import CID_LEN, INITIAL_SUFFIX_FLAG, ConnectionId, target_pid
from chrysalis.core._errors import (
    AddressError,
    ConnectionIdError,
    ConnectionIdParseError,
    HexParseError,
    InvalidLengthError,
    LinkIdParseError,
    PidAmbiguousError,
    PidLookupError,
    PidNotFoundError,
    PidParseError,
    PidPrefixError,
    PidPrefixErrorKind,
    WireFormatError,
)
from chrysalis.core._link import LinkContext, LinkId, LinkSide
from chrysalis.core._pid import LINK_ID_LEN, PID_LEN, Pid, PidPrefix

# --- plugin hookspecs -------------------------------------------------------------------------
# The hook contracts live in the public submodule ``chrysalis.core.hookspecs``. The plugin names
# load on first use (``__getattr__`` below: ``_LAZY`` through ``chrysalis._lazy``): the registry
# imports pluggy and builds a dozen dataclasses, and a process that only speaks the wire protocol
# (``chrysalis ls``) never looks a plugin up (issue 22, item 5). The ``TYPE_CHECKING`` imports
# show them to type checkers.
if TYPE_CHECKING:
    from chrysalis.core._plugin_types import (
        AddressResolverSpec,
        CarrierFactory,
        CarrierSpec,
        IdentityMaterial,
        IdentityProvider,
        IdentityProviderSpec,
        JoinSettings,
        PluginConflictError,
        PluginError,
        PluginLoadError,
        PluginSpecError,
        UnknownPluginError,
    )
    from chrysalis.core._plugins import PluginRegistry, default_registry
    from chrysalis.core.hookspecs import hookimpl

_PLUGIN_TYPES: Final = "chrysalis.core._plugin_types"
_LAZY: Final[Mapping[str, str]] = {
    "AddressResolverSpec": _PLUGIN_TYPES,
    "CarrierFactory": _PLUGIN_TYPES,
    "CarrierSpec": _PLUGIN_TYPES,
    "IdentityMaterial": _PLUGIN_TYPES,
    "IdentityProvider": _PLUGIN_TYPES,
    "IdentityProviderSpec": _PLUGIN_TYPES,
    "JoinSettings": _PLUGIN_TYPES,
    "PluginConflictError": _PLUGIN_TYPES,
    "PluginError": _PLUGIN_TYPES,
    "PluginLoadError": _PLUGIN_TYPES,
    "PluginSpecError": _PLUGIN_TYPES,
    "UnknownPluginError": _PLUGIN_TYPES,
    "PluginRegistry": "chrysalis.core._plugins",
    "default_registry": "chrysalis.core._plugins",
    "hookimpl": "chrysalis.core.hookspecs",
}
"""The public names defined on first use: name -> defining module."""

_SUBMODULES: Final = frozenset({"hookspecs"})
"""Public submodules that ``__init__`` imported before the plugin names became lazy, still
reachable as attributes of the package (imported on first use)."""

__getattr__, __dir__ = lazy_exports(globals(), _LAZY, _SUBMODULES)


# Public wire classes claim the facade as their module, so reprs, docs and pickles name
# ``chrysalis.core.Pid`` rather than a private module that may be reorganised.
for _wire_type in (
    AddressError,
    ConnectionId,
    ConnectionIdError,
    ConnectionIdParseError,
    DatagramAddr,
    HexParseError,
    InvalidLengthError,
    LinkContext,
    LinkId,
    LinkIdParseError,
    LinkSide,
    Pid,
    PidAmbiguousError,
    PidLookupError,
    PidNotFoundError,
    PidParseError,
    PidPrefix,
    PidPrefixError,
    PidPrefixErrorKind,
    WireFormatError,
):
    _wire_type.__module__ = __name__
del _wire_type

__all__ = [
    "AddressError",
    "AddressResolverSpec",
    "CID_LEN",
    "CarrierFactory",
    "CarrierSpec",
    "ConnectionId",
    "ConnectionIdError",
    "ConnectionIdParseError",
    "DatagramAddr",
    "HexParseError",
    "INITIAL_SUFFIX_FLAG",
    "INPROC_SCHEME",
    "IdentityMaterial",
    "IdentityProvider",
    "IdentityProviderSpec",
    "InvalidLengthError",
    "JoinSettings",
    "LINK_ID_LEN",
    "LinkContext",
    "LinkId",
    "LinkIdParseError",
    "LinkSide",
    "PID_LEN",
    "Pid",
    "PidAmbiguousError",
    "PidLookupError",
    "PidNotFoundError",
    "PidParseError",
    "PidPrefix",
    "PidPrefixError",
    "PidPrefixErrorKind",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "PluginRegistry",
    "PluginSpecError",
    "SWITCH_SCHEME",
    "UDP_SCHEME",
    "UNIXGRAM_SCHEME",
    "UnknownPluginError",
    "WireFormatError",
    "default_registry",
    "hookimpl",
    "target_pid",
]
