"""The public API of ``chrysalis.core`` is exactly what the facade declares."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import chrysalis.core

WIRE_NAMES = {
    "CID_LEN",
    "INITIAL_SUFFIX_FLAG",
    "INPROC_SCHEME",
    "LINK_ID_LEN",
    "PID_LEN",
    "SWITCH_SCHEME",
    "UDP_SCHEME",
    "UNIXGRAM_SCHEME",
    "AddressError",
    "ConnectionId",
    "ConnectionIdError",
    "ConnectionIdParseError",
    "DatagramAddr",
    "HexParseError",
    "InvalidLengthError",
    "LinkContext",
    "LinkId",
    "LinkIdParseError",
    "LinkSide",
    "Pid",
    "PidAmbiguousError",
    "PidLookupError",
    "PidNotFoundError",
    "PidParseError",
    "PidPrefix",
    "PidPrefixError",
    "PidPrefixErrorKind",
    "WireFormatError",
    "target_pid",
}
PLUGIN_NAMES = {
    "AddressResolverSpec",
    "CarrierFactory",
    "CarrierSpec",
    "IdentityMaterial",
    "IdentityProvider",
    "IdentityProviderSpec",
    "JoinSettings",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "PluginRegistry",
    "PluginSpecError",
    "UnknownPluginError",
    "default_registry",
    "hookimpl",
}
EXPECTED = WIRE_NAMES | PLUGIN_NAMES


def test_all_is_exactly_the_expected_set() -> None:
    assert set(chrysalis.core.__all__) == EXPECTED
    assert len(chrysalis.core.__all__) == len(EXPECTED)


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert chrysalis.core.__all__ == sorted(chrysalis.core.__all__)
    for name in chrysalis.core.__all__:
        assert getattr(chrysalis.core, name) is not None, name


def test_wire_classes_claim_the_facade_module() -> None:
    for name in WIRE_NAMES:
        value = getattr(chrysalis.core, name)
        if isinstance(value, type):
            assert value.__module__ == "chrysalis.core", name


def test_pickles_reference_only_the_facade() -> None:
    core = chrysalis.core
    pid = core.Pid(bytes(range(16)))
    values: list[object] = [
        pid,
        core.PidPrefix("abc"),
        core.LinkId(bytes(16)),
        core.LinkSide.CHILD,
        core.LinkContext(core.LinkId(bytes(16)), pid, core.LinkSide.PARENT),
        core.ConnectionId.initial(pid, 9),
        core.DatagramAddr.udp("::1", 1),
        core.PidPrefixErrorKind.TOO_LONG,
    ]
    for value in values:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            payload = pickle.dumps(value, protocol)
            assert b"chrysalis.core._" not in payload, (value, protocol)
            assert pickle.loads(payload) == value


def test_wire_modules_are_private() -> None:
    names = {info.name for info in pkgutil.iter_modules(chrysalis.core.__path__)}
    for module in ("_addr", "_cid", "_errors", "_link", "_pid"):
        assert module in names
        importlib.import_module(f"chrysalis.core.{module}")


def test_error_hierarchy() -> None:
    core = chrysalis.core
    for error in (
        core.InvalidLengthError,
        core.HexParseError,
        core.PidParseError,
        core.LinkIdParseError,
        core.ConnectionIdParseError,
        core.PidPrefixError,
        core.ConnectionIdError,
        core.AddressError,
    ):
        assert issubclass(error, core.WireFormatError)
        assert issubclass(error, ValueError)
    for parse_error in (core.PidParseError, core.LinkIdParseError, core.PidPrefixError):
        assert issubclass(parse_error, core.HexParseError)
    for lookup in (core.PidNotFoundError, core.PidAmbiguousError):
        assert issubclass(lookup, core.PidLookupError)
        assert issubclass(lookup, LookupError)
        assert not issubclass(lookup, ValueError)


def test_sans_io_modules_do_not_import_io_or_clocks() -> None:
    for module in ("_addr", "_cid", "_errors", "_link", "_pid"):
        loaded = importlib.import_module(f"chrysalis.core.{module}")
        for forbidden in ("socket", "asyncio", "trio", "time"):
            assert forbidden not in vars(loaded), (module, forbidden)
