"""The records plugins hand to chrysalis, and the errors of the plugin system.

Why these live apart from ``hookspecs``: the hookspec module is the contract a plugin author
reads, one documented function per hook. The values those hooks return are plain, frozen records
that validate themselves on construction, so a malformed contribution fails inside the plugin
that built it (with a :class:`PluginSpecError` that says what is wrong) instead of deep inside a
transport much later. Every field that a plugin controls has a bound: names are short
identifiers, descriptions and options are capped, PEM blobs are capped.

Nothing here performs I/O. The registry (``_plugins``) collects these records from plugins and
detects conflicts; the factories inside them are only called when a caller asks for a carrier,
an identity or a resolution.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from chrysalis.core._addr import DatagramAddr
from chrysalis.core._pid import Pid

__all__ = [
    "MAX_DESCRIPTION_LENGTH",
    "MAX_JOIN_OPTIONS",
    "MAX_NAME_LENGTH",
    "MAX_OPTION_KEY_LENGTH",
    "MAX_OPTION_VALUE_LENGTH",
    "MAX_PEM_LENGTH",
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
    "PluginSpecError",
    "UnknownPluginError",
    "check_plugin_key",
]

#: Longest carrier scheme, identity-provider name or resolver scheme, in characters.
MAX_NAME_LENGTH: Final = 32
#: Longest human-readable description a spec may carry, in characters.
MAX_DESCRIPTION_LENGTH: Final = 256
#: Most entries in :attr:`JoinSettings.options`.
MAX_JOIN_OPTIONS: Final = 64
#: Longest key in :attr:`JoinSettings.options`, in characters.
MAX_OPTION_KEY_LENGTH: Final = 64
#: Longest value in :attr:`JoinSettings.options`, in characters.
MAX_OPTION_VALUE_LENGTH: Final = 1024
#: Largest PEM blob in :class:`IdentityMaterial`, in bytes.
MAX_PEM_LENGTH: Final = 1 << 20

_NAME_RE: Final = re.compile(r"[a-z][a-z0-9+.\-]*")
_CERTIFICATE_MARKER: Final = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY_MARKER: Final = b"PRIVATE KEY-----"


class PluginError(Exception):
    """Base class of every error the plugin system raises."""


class PluginSpecError(PluginError, ValueError):
    """A plugin contributed a malformed value.

    Raised by the spec records on construction (a bad scheme, a non-callable factory, an
    oversized option) and by the registry when a hook returns something other than a bounded
    sequence of the expected record type.
    """


class PluginConflictError(PluginError):
    """Two plugins claim the same key (a carrier scheme, an identity-provider name, a
    resolver scheme, or a plugin name).

    ``kind`` says what is claimed (``"scheme"``, ``"identity provider"``, ...), ``key`` the
    claimed value and ``owners`` describes both claimants, first registered first: either
    ``"distribution <name> <version> (entry point <ep>)"`` or ``"registered in code as <name>"``.
    """

    def __init__(self, kind: str, key: str, owners: tuple[str, str]) -> None:
        self.kind = kind
        self.key = key
        self.owners = owners
        super().__init__(f"{kind} {key!r} is claimed by both {owners[0]} and {owners[1]}")


class UnknownPluginError(PluginError, LookupError):
    """No plugin provides the requested key.

    ``kind`` says what was looked up, ``key`` the value asked for and ``available`` the sorted
    keys that are provided, so the message can list them.
    """

    def __init__(self, kind: str, key: str, available: tuple[str, ...]) -> None:
        self.kind = kind
        self.key = key
        self.available = available
        listing = ", ".join(repr(name) for name in available) if available else "none"
        super().__init__(f"no plugin provides {kind} {key!r}; available: {listing}")

    def __str__(self) -> str:
        # LookupError subclasses such as KeyError quote their argument; keep the message as is.
        return str(self.args[0])


class PluginLoadError(PluginError):
    """A plugin could not be loaded or failed while being asked for its contributions.

    The message names the distribution and entry point (or the in-code registration); the
    original exception is chained as ``__cause__``.
    """


def check_plugin_key(value: object, what: str) -> str:
    """Return ``value`` if it is a valid scheme or provider name, else raise.

    A valid key is a ``str`` matching ``[a-z][a-z0-9+.-]*`` of at most :data:`MAX_NAME_LENGTH`
    characters (lowercase on purpose: schemes compare byte for byte, never case-folded).
    ``what`` names the field in the :class:`PluginSpecError` message.
    """
    if not isinstance(value, str):
        raise PluginSpecError(f"{what} must be a str, not {type(value).__name__}")
    if len(value) > MAX_NAME_LENGTH:
        raise PluginSpecError(
            f"{what} {value[:MAX_NAME_LENGTH]!r}... is longer than {MAX_NAME_LENGTH} characters"
        )
    if _NAME_RE.fullmatch(value) is None:
        raise PluginSpecError(
            f"{what} {value!r} is not a lowercase identifier matching [a-z][a-z0-9+.-]*"
        )
    return value


def _check_callable(value: object, what: str) -> None:
    if not callable(value):
        raise PluginSpecError(f"{what} must be callable, not {type(value).__name__}")


def _check_description(value: object) -> None:
    if not isinstance(value, str):
        raise PluginSpecError(f"description must be a str, not {type(value).__name__}")
    if len(value) > MAX_DESCRIPTION_LENGTH:
        raise PluginSpecError(f"description is longer than {MAX_DESCRIPTION_LENGTH} characters")


class CarrierFactory(Protocol):
    """Opens a datagram socket for one address.

    Called as ``factory(address, **options)`` with an address whose ``scheme`` is the one the
    :class:`CarrierSpec` claims. Returns an open datagram socket as defined by
    ``chrysalis.datagram`` (core sits below that package and cannot name the type); the caller
    owns it and closes it. Raises ``ValueError`` for an address the carrier cannot express,
    ``TypeError`` for an option it does not know, ``OSError`` when the OS refuses.
    """

    def __call__(self, address: DatagramAddr, /, **options: object) -> Any: ...


@dataclass(frozen=True, slots=True)
class CarrierSpec:
    """One datagram carrier: the ``scheme`` of the addresses it serves and its ``open`` factory.

    ``scheme`` follows :func:`check_plugin_key`; ``description`` is a short human-readable
    line (at most :data:`MAX_DESCRIPTION_LENGTH` characters) for listings.
    """

    scheme: str
    open: CarrierFactory
    description: str = ""

    def __post_init__(self) -> None:
        check_plugin_key(self.scheme, "carrier scheme")
        _check_callable(self.open, "carrier factory 'open'")
        _check_description(self.description)


@dataclass(frozen=True, slots=True)
class IdentityMaterial:
    """The TLS identity of one process, as PEM.

    ``chain_pem``: the certificate chain, leaf first, then any intermediates. ``key_pem``: the
    private key of the leaf. ``roots_pem``: the trust roots used to verify peers. Each must be
    non-empty ``bytes`` of at most :data:`MAX_PEM_LENGTH` and carry the matching PEM marker;
    the certificates themselves are parsed and verified by the transport, not here. The key is
    left out of ``repr`` so it does not end up in logs.
    """

    chain_pem: bytes
    key_pem: bytes = field(repr=False)
    roots_pem: bytes

    def __post_init__(self) -> None:
        _check_pem(self.chain_pem, "chain_pem", _CERTIFICATE_MARKER)
        _check_pem(self.key_pem, "key_pem", _PRIVATE_KEY_MARKER)
        _check_pem(self.roots_pem, "roots_pem", _CERTIFICATE_MARKER)


def _check_pem(value: object, what: str, marker: bytes) -> None:
    if not isinstance(value, bytes):
        raise PluginSpecError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_PEM_LENGTH:
        raise PluginSpecError(f"{what} is longer than {MAX_PEM_LENGTH} bytes")
    if marker not in value:
        raise PluginSpecError(f"{what} does not contain a PEM {marker.decode()!r} block")


class IdentityProvider(Protocol):
    """Issues the TLS identity of this process (see :class:`IdentityMaterial`).

    ``issue()`` may be called more than once (for instance on rotation); each call returns the
    identity to use from then on. It raises ``OSError`` or ``ValueError`` when the material
    cannot be read or is invalid.
    """

    def issue(self) -> IdentityMaterial: ...


@dataclass(frozen=True, slots=True)
class IdentityProviderSpec:
    """One identity provider: its ``name`` and ``create(**options)``, which builds a provider.

    ``name`` follows :func:`check_plugin_key`.
    """

    name: str
    create: Callable[..., IdentityProvider]
    description: str = ""

    def __post_init__(self) -> None:
        check_plugin_key(self.name, "identity provider name")
        _check_callable(self.create, "identity provider factory 'create'")
        _check_description(self.description)


class _FrozenOptions(Mapping[str, str]):
    """A read-only, hashable copy of a small ``str -> str`` mapping."""

    __slots__ = ("_items",)

    def __init__(self, source: Mapping[str, str]) -> None:
        self._items: Mapping[str, str] = MappingProxyType(dict(source))

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(dict(self._items))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenOptions, (dict(self._items),))


_NO_OPTIONS: Final = _FrozenOptions({})


@dataclass(frozen=True, slots=True)
class JoinSettings:
    """How to join a cluster, as an address resolver derives it from a URL.

    ``address``: the datagram address to contact. ``authority``: the PID expected to answer
    there, when the URL pins one (the transport then refuses any other peer). ``options``:
    resolver-specific settings, at most :data:`MAX_JOIN_OPTIONS` entries of ``str`` keys (up to
    :data:`MAX_OPTION_KEY_LENGTH` characters) and ``str`` values (up to
    :data:`MAX_OPTION_VALUE_LENGTH`); stored as a read-only copy, so the record stays immutable
    and hashable.
    """

    address: DatagramAddr
    authority: Pid | None = None
    options: Mapping[str, str] = _NO_OPTIONS

    def __post_init__(self) -> None:
        if not isinstance(self.address, DatagramAddr):
            raise PluginSpecError(
                f"address must be a DatagramAddr, not {type(self.address).__name__}"
            )
        if self.authority is not None and not isinstance(self.authority, Pid):
            raise PluginSpecError(
                f"authority must be a Pid or None, not {type(self.authority).__name__}"
            )
        options: object = self.options
        if not isinstance(options, Mapping):
            raise PluginSpecError(f"options must be a mapping, not {type(options).__name__}")
        if len(options) > MAX_JOIN_OPTIONS:
            raise PluginSpecError(f"options has more than {MAX_JOIN_OPTIONS} entries")
        for key, value in options.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise PluginSpecError("options keys and values must be str")
            if not key or len(key) > MAX_OPTION_KEY_LENGTH:
                raise PluginSpecError(
                    f"option key {key[:MAX_OPTION_KEY_LENGTH]!r} must have 1 to "
                    f"{MAX_OPTION_KEY_LENGTH} characters"
                )
            if len(value) > MAX_OPTION_VALUE_LENGTH:
                raise PluginSpecError(
                    f"option {key!r} has a value longer than {MAX_OPTION_VALUE_LENGTH} characters"
                )
        if not isinstance(options, _FrozenOptions):
            object.__setattr__(self, "options", _FrozenOptions(options))


@dataclass(frozen=True, slots=True)
class AddressResolverSpec:
    """One address resolver: the URL ``scheme`` it serves and ``resolve(url)``.

    ``resolve`` receives the whole URL text (its scheme is ``scheme``) and returns the
    :class:`JoinSettings`; it raises ``ValueError`` for a URL it cannot parse. ``scheme``
    follows :func:`check_plugin_key`.
    """

    scheme: str
    resolve: Callable[[str], JoinSettings]
    description: str = ""

    def __post_init__(self) -> None:
        check_plugin_key(self.scheme, "address resolver scheme")
        _check_callable(self.resolve, "address resolver 'resolve'")
        _check_description(self.description)
