"""The plugin registry: finds chrysalis plugins, collects what they offer, refuses conflicts.

Why not just ``pluggy.PluginManager.load_setuptools_entrypoints`` and a plain hook call:

* Attribution. A conflict ("two plugins claim scheme ``udp``") is only actionable when the
  message names both culprits by distribution, so the registry calls each hook implementation
  itself (``HookCaller.get_hookimpls``) and knows which plugin returned which record. A plain
  hook call returns an anonymous list.
* Load errors. A plugin whose import fails raises ``PluginLoadError`` naming the distribution
  and entry point, chained to the original exception; pluggy would let a bare ``ImportError``
  escape with no hint of where the entry point came from.
* Names. Entry-point plugins are registered as ``<distribution>:<entry point>``, so two
  distributions that happen to pick the same entry-point name do not shadow each other (pluggy
  silently skips the second); if they also claim the same scheme, the conflict is reported.
  A distribution present twice on ``sys.path`` is loaded once, from the first location, as
  ``import`` would.

Collected tables are cached and dropped on every ``register``/``unregister``. All public methods
hold one re-entrant lock, so a registry may be shared between threads; ``default_registry()``
builds the process-wide one lazily, exactly once.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pluggy

from chrysalis.core import hookspecs
from chrysalis.core._addr import DatagramAddr
from chrysalis.core._plugin_types import (
    AddressResolverSpec,
    CarrierSpec,
    IdentityProviderSpec,
    JoinSettings,
    PluginConflictError,
    PluginLoadError,
    PluginSpecError,
    UnknownPluginError,
    check_plugin_key,
)

if TYPE_CHECKING:
    import importlib.metadata

__all__ = ["PluginRegistry", "default_registry"]

_MAX_URL_LENGTH: Final = 4096

_SpecT = TypeVar("_SpecT", CarrierSpec, IdentityProviderSpec, AddressResolverSpec)


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a registered plugin came from, for error messages."""

    plugin_name: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None

    def describe(self) -> str:
        if self.distribution is None:
            return f"registered in code as {self.plugin_name}"
        return f"distribution {self.distribution} {self.version} (entry point {self.entry_point})"


@dataclass(frozen=True, slots=True)
class _Kind:
    """One extension point: its hook, record type, and how to name and key its records."""

    hook_name: str
    label: str
    record_type: type[Any]
    key: Callable[[Any], str]


_CARRIERS: Final = _Kind("chrysalis_carriers", "carrier scheme", CarrierSpec, lambda s: s.scheme)
_IDENTITIES: Final = _Kind(
    "chrysalis_identity_providers", "identity provider", IdentityProviderSpec, lambda s: s.name
)
_RESOLVERS: Final = _Kind(
    "chrysalis_address_resolvers",
    "address resolver scheme",
    AddressResolverSpec,
    lambda s: s.scheme,
)


def _normalize_distribution(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class PluginRegistry:
    """The set of chrysalis plugins of one process (or one test) and what they contribute.

    A fresh registry has no plugins. ``load_entry_points()`` adds those installed
    distributions declare in the ``chrysalis`` entry-point group; ``register()`` adds one from
    code. Lookups (``carrier``, ``identity_provider``, ``address_resolver`` and the table
    methods) collect the contributions of every plugin, raising ``PluginConflictError`` when two
    plugins claim one key, ``PluginSpecError`` when a hook returns something malformed and
    ``PluginLoadError`` when a hook raises.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._origins: dict[str, _Origin] = {}
        self._loaded_entry_points: set[tuple[str, str]] = set()
        self._tables: dict[str, Mapping[str, tuple[Any, _Origin]]] = {}

    # -- plugins --------------------------------------------------------------------------

    def load_entry_points(self) -> int:
        """Load and register every plugin declared in the ``chrysalis`` entry-point group.

        Idempotent: an entry point loaded before (even if its plugin was unregistered since) is
        not loaded again, so the call returns only the number of newly registered plugins. A
        plugin that fails to import or to register raises ``PluginLoadError`` naming the
        distribution and entry point, chained to the cause; plugins loaded before it stay
        registered, and a later call retries the failed one.
        """
        # Imported here, not at the top: ``importlib.metadata`` (with ``email``, ``zipfile``,
        # ``csv``) is about a twentieth of a worker's start-up, and a process that never looks
        # up an entry point (a worker, a worker loop) never needs it. Once imported it is a
        # ``sys.modules`` hit; this runs once per registry anyway.
        import importlib.metadata

        with self._lock:
            count = 0
            for dist in importlib.metadata.distributions():
                dist_name = dist.metadata["Name"]
                if not dist_name:
                    continue
                normalized = _normalize_distribution(dist_name)
                for ep in dist.entry_points.select(group=hookspecs.ENTRY_POINT_GROUP):
                    if (normalized, ep.name) in self._loaded_entry_points:
                        continue  # loaded before, or a shadowed copy further down sys.path
                    origin = _Origin(
                        plugin_name=f"{normalized}:{ep.name}",
                        distribution=dist_name,
                        version=dist.version,
                        entry_point=ep.name,
                    )
                    if self._load_entry_point(ep, origin):
                        count += 1
                    self._loaded_entry_points.add((normalized, ep.name))
            return count

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint, origin: _Origin) -> bool:
        where = f"entry point {ep.name} = {ep.value!r} of {origin.describe()}"
        if self._pm.is_blocked(origin.plugin_name):
            return False
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginLoadError(f"cannot load plugin {where}: {exc!r}") from exc
        if self._pm.is_registered(plugin):
            return False  # the same object, already registered in code or by another entry point
        try:
            self._register(plugin, origin)
        except (PluginSpecError, pluggy.PluginValidationError) as exc:
            raise PluginLoadError(f"cannot register plugin {where}: {exc}") from exc
        return True

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (a module or object with ``@hookimpl`` functions) from code.

        ``name`` defaults to pluggy's canonical name (a module's ``__name__``); conflicts
        report the plugin as "registered in code as <name>". Returns the name, or ``None`` if
        the name is blocked. Raises ``PluginConflictError`` when the name is taken,
        ``ValueError`` when the object is already registered, ``PluginSpecError`` when a hook
        implementation does not match its specification (an unknown ``chrysalis_*`` hook,
        unexpected arguments, or a wrapper).
        """
        with self._lock:
            if self._pm.is_registered(plugin):
                raise ValueError(f"plugin {plugin!r} is already registered")
            plugin_name = name if name is not None else self._pm.get_canonical_name(plugin)
            if self._pm.is_blocked(plugin_name):
                return None
            try:
                self._register(plugin, _Origin(plugin_name))
            except pluggy.PluginValidationError as exc:
                raise PluginSpecError(str(exc)) from exc
            return plugin_name

    def _register(self, plugin: object, origin: _Origin) -> None:
        name = origin.plugin_name
        if self._pm.has_plugin(name):
            holder = self._origins.get(name, _Origin(name))
            raise PluginConflictError("plugin name", name, (holder.describe(), origin.describe()))
        self._pm.register(plugin, name)
        try:
            self._pm.check_pending()
            for caller in self._pm.get_hookcallers(plugin) or ():
                for impl in caller.get_hookimpls():
                    if impl.plugin is plugin and (impl.wrapper or impl.hookwrapper):
                        raise PluginSpecError(
                            f"{origin.describe()}: {caller.name} is a collection hook; "
                            "wrappers are not supported"
                        )
        except BaseException:
            self._pm.unregister(plugin)
            raise
        self._origins[name] = origin
        self._tables.clear()

    def unregister(self, plugin: object | None = None, name: str | None = None) -> object:
        """Unregister a plugin given the object or its registered name; return the plugin.

        Raises ``ValueError`` when neither is given, when nothing is registered under them, or
        when both are given and do not belong together.
        """
        with self._lock:
            if plugin is not None:
                registered = self._pm.get_name(plugin)
                if registered is None or (name is not None and name != registered):
                    raise ValueError(f"plugin {plugin!r} is not registered as {name!r}")
                name = registered
            if name is None:
                raise ValueError("unregister needs a plugin or a name")
            if not self._pm.has_plugin(name):
                raise ValueError(f"no plugin registered as {name!r}")
            removed = self._pm.unregister(name=name)
            self._origins.pop(name, None)
            self._tables.clear()
            return removed

    def plugin_names(self) -> tuple[str, ...]:
        """Return the sorted names of the registered plugins (``<distribution>:<entry point>``
        for plugins loaded from entry points)."""
        with self._lock:
            return tuple(sorted(name for name, _ in self._pm.list_name_plugin()))

    # -- collection -----------------------------------------------------------------------

    def _table(self, kind: _Kind) -> Mapping[str, tuple[Any, _Origin]]:
        with self._lock:
            cached = self._tables.get(kind.hook_name)
            if cached is not None:
                return cached
            caller: pluggy.HookCaller = getattr(self._pm.hook, kind.hook_name)
            found: dict[str, tuple[Any, _Origin]] = {}
            for impl in caller.get_hookimpls():
                origin = self._origins.get(impl.plugin_name, _Origin(impl.plugin_name))
                for spec in self._call(impl, kind, origin):
                    key = kind.key(spec)
                    if key in found:
                        first = found[key][1]
                        raise PluginConflictError(
                            kind.label, key, (first.describe(), origin.describe())
                        )
                    found[key] = (spec, origin)
            table = MappingProxyType(found)
            self._tables[kind.hook_name] = table
            return table

    @staticmethod
    def _call(impl: pluggy.HookImpl, kind: _Kind, origin: _Origin) -> Sequence[Any]:
        try:
            # Specs take no arguments and pluggy refuses implementations with extra ones.
            result: object = impl.function()
        except Exception as exc:
            raise PluginLoadError(
                f"{origin.describe()} failed in {kind.hook_name}: {exc!r}"
            ) from exc
        if not isinstance(result, list | tuple):
            raise PluginSpecError(
                f"{origin.describe()}: {kind.hook_name} must return a list or tuple, "
                f"not {type(result).__name__}"
            )
        if len(result) > hookspecs.MAX_SPECS_PER_HOOK:
            raise PluginSpecError(
                f"{origin.describe()}: {kind.hook_name} returned {len(result)} records, "
                f"more than {hookspecs.MAX_SPECS_PER_HOOK}"
            )
        for spec in result:
            if not isinstance(spec, kind.record_type):
                raise PluginSpecError(
                    f"{origin.describe()}: {kind.hook_name} returned a "
                    f"{type(spec).__name__}, not a {kind.record_type.__name__}"
                )
        return result

    def _lookup(self, kind: _Kind, key: str) -> tuple[Any, _Origin]:
        table = self._table(kind)
        entry = table.get(key)
        if entry is None:
            raise UnknownPluginError(kind.label, key, tuple(sorted(table)))
        return entry

    @staticmethod
    def _specs(table: Mapping[str, tuple[_SpecT, _Origin]]) -> Mapping[str, _SpecT]:
        return MappingProxyType({key: spec for key, (spec, _) in sorted(table.items())})

    def carriers(self) -> Mapping[str, CarrierSpec]:
        """Return every carrier, keyed by scheme (a read-only snapshot, sorted by scheme)."""
        return self._specs(self._table(_CARRIERS))

    def carrier(self, scheme: str) -> CarrierSpec:
        """Return the carrier for ``scheme``; ``UnknownPluginError`` lists the available ones."""
        spec: CarrierSpec = self._lookup(_CARRIERS, scheme)[0]
        return spec

    def identity_providers(self) -> Mapping[str, IdentityProviderSpec]:
        """Return every identity provider, keyed by name (a read-only snapshot, sorted)."""
        return self._specs(self._table(_IDENTITIES))

    def identity_provider(self, name: str) -> IdentityProviderSpec:
        """Return the identity provider ``name``; ``UnknownPluginError`` lists the others."""
        spec: IdentityProviderSpec = self._lookup(_IDENTITIES, name)[0]
        return spec

    def address_resolvers(self) -> Mapping[str, AddressResolverSpec]:
        """Return every address resolver, keyed by URL scheme (a read-only snapshot, sorted)."""
        return self._specs(self._table(_RESOLVERS))

    def address_resolver(self, scheme: str) -> AddressResolverSpec:
        """Return the resolver for URL ``scheme``; ``UnknownPluginError`` lists the others."""
        spec: AddressResolverSpec = self._lookup(_RESOLVERS, scheme)[0]
        return spec

    # -- conveniences ---------------------------------------------------------------------

    def open_carrier(self, address: DatagramAddr | str, /, **options: object) -> Any:
        """Open a datagram socket for ``address`` with the carrier of its scheme.

        A ``str`` is parsed with ``DatagramAddr.parse`` first (``AddressError``, a
        ``ValueError``, when malformed). ``options`` go to the carrier's factory unchanged.
        Raises ``UnknownPluginError`` when no carrier serves the scheme, and whatever the
        factory raises (see ``CarrierFactory``).
        """
        addr = DatagramAddr.parse(address) if isinstance(address, str) else address
        return self.carrier(addr.scheme).open(addr, **options)

    def resolve_address(self, url: str) -> JoinSettings:
        """Turn ``url`` into ``JoinSettings`` with the resolver of its scheme.

        The scheme is the text before the first ``:``. Raises ``ValueError`` for a URL without
        a valid scheme or longer than 4096 characters, ``UnknownPluginError`` when no resolver
        serves the scheme, ``PluginSpecError`` when the resolver returns something other than
        ``JoinSettings``, and whatever the resolver raises for a URL it cannot parse.
        """
        if len(url) > _MAX_URL_LENGTH:
            raise ValueError(f"address URL is longer than {_MAX_URL_LENGTH} characters")
        scheme, colon, _ = url.partition(":")
        if not colon:
            raise ValueError(f"address URL {url[:64]!r} has no scheme")
        try:
            check_plugin_key(scheme, "URL scheme")
        except PluginSpecError as exc:
            raise ValueError(str(exc)) from None
        spec, origin = self._lookup(_RESOLVERS, scheme)
        settings: object = spec.resolve(url)
        if not isinstance(settings, JoinSettings):
            raise PluginSpecError(
                f"{origin.describe()}: resolver for {scheme!r} returned a "
                f"{type(settings).__name__}, not JoinSettings"
            )
        return settings


_default_lock: Final = threading.Lock()
_default: PluginRegistry | None = None


def default_registry() -> PluginRegistry:
    """Return the process-wide registry, with entry points loaded on first use.

    Thread-safe: concurrent first calls build and load one registry. If loading raises, the
    error propagates and the next call tries again.
    """
    global _default
    registry = _default
    if registry is not None:
        return registry
    with _default_lock:
        if _default is None:
            candidate = PluginRegistry()
            candidate.load_entry_points()
            _default = candidate
        return _default


def _reset_default_registry() -> None:
    """Forget the process-wide registry (for tests)."""
    global _default
    with _default_lock:
        _default = None
