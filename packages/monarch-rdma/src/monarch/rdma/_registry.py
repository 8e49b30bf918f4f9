"""The provider registry: finds provider plugins, collects their ``ProviderSpec``s, refuses
conflicts, and builds each provider once per process.

``default_registry()`` is the process-wide one: the plugins of the ``monarch.rdma`` entry-point
group plus the built-in ones (registered in code when the entry points did not bring them, so a
stale installed metadata never loses the ``net`` provider).
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from types import ModuleType
from typing import Any

import pluggy

from monarch.rdma import hookspecs
from monarch.rdma._provider import ProviderSpec, RDMAProvider

__all__ = [
    "ProviderConflictError",
    "ProviderLoadError",
    "ProviderRegistry",
    "default_registry",
]


class ProviderConflictError(RuntimeError):
    """Two plugins claim the same provider name."""


class ProviderLoadError(RuntimeError):
    """A plugin could not be imported, or its hook raised or returned something malformed."""


class ProviderRegistry:
    """The provider plugins of one process (or one test). A fresh registry has none;
    ``load_entry_points()`` adds the installed ones, ``register()`` one from code."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._specs: dict[str, ProviderSpec] | None = None
        self._instances: dict[str, RDMAProvider] = {}
        #: Bumped whenever the plugin set changes (a cached choice of provider is then stale).
        self.generation = 0

    def load_entry_points(self) -> int:
        """Register every plugin of the ``monarch.rdma`` entry-point group not registered yet;
        returns how many were added. ``ProviderLoadError`` names an entry point that fails."""
        count = 0
        with self._lock:
            for ep in importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
                try:
                    plugin = ep.load()
                except Exception as exc:
                    raise ProviderLoadError(
                        f"cannot load monarch.rdma plugin {ep.name} = {ep.value!r}: {exc!r}"
                    ) from exc
                if self._pm.is_registered(plugin):
                    continue
                self.register(plugin, name=f"entry-point:{ep.name}")
                count += 1
        return count

    def register(self, plugin: Any, *, name: str | None = None) -> None:
        """Register ``plugin`` (a module or object with ``@hookimpl`` functions)."""
        with self._lock:
            if self._pm.is_registered(plugin):
                return
            self._pm.register(plugin, name=name)
            self._specs = None
            self.generation += 1

    def is_registered(self, plugin: Any) -> bool:
        with self._lock:
            return self._pm.is_registered(plugin)

    def specs(self) -> dict[str, ProviderSpec]:
        """Every provider offered, by name (cached until the plugin set changes)."""
        with self._lock:
            if self._specs is not None:
                return dict(self._specs)
            table: dict[str, tuple[ProviderSpec, str]] = {}
            caller = self._pm.hook.monarch_rdma_providers
            for impl in caller.get_hookimpls():
                who = self._pm.get_name(impl.plugin) or repr(impl.plugin)
                try:
                    offered = impl.function()
                except Exception as exc:
                    raise ProviderLoadError(f"plugin {who} failed: {exc!r}") from exc
                if not isinstance(offered, list | tuple):
                    raise ProviderLoadError(f"plugin {who} returned {type(offered).__name__}")
                if len(offered) > hookspecs.MAX_SPECS_PER_HOOK:
                    raise ProviderLoadError(f"plugin {who} returned {len(offered)} providers")
                for spec in offered:
                    if not isinstance(spec, ProviderSpec):
                        raise ProviderLoadError(f"plugin {who} returned {spec!r}")
                    if spec.name in table:
                        other = table[spec.name][1]
                        raise ProviderConflictError(
                            f"RDMA provider {spec.name!r} is claimed by both {other} and {who}"
                        )
                    table[spec.name] = (spec, who)
            self._specs = {name: entry[0] for name, entry in table.items()}
            return dict(self._specs)

    def available(self) -> dict[str, ProviderSpec]:
        """The providers whose ``available()`` probe says they work in this process."""
        return {name: spec for name, spec in self.specs().items() if spec.available()}

    def provider(self, name: str) -> RDMAProvider:
        """This process's instance of provider ``name`` (built on first use)."""
        with self._lock:
            instance = self._instances.get(name)
            if instance is None:
                spec = self.specs().get(name)
                if spec is None:
                    raise RuntimeError(f"no RDMA provider named {name!r} in this process")
                instance = spec.create()
                self._instances[name] = instance
            return instance


_default: ProviderRegistry | None = None
_default_lock = threading.Lock()
_builtins: list[ModuleType] = []


def add_builtin(plugin: ModuleType) -> None:
    """Declare a built-in plugin module (called once at import by ``monarch.rdma``)."""
    _builtins.append(plugin)


def default_registry() -> ProviderRegistry:
    """The process-wide registry: entry-point plugins plus the built-in ones."""
    global _default
    with _default_lock:
        if _default is None:
            registry = ProviderRegistry()
            registry.load_entry_points()
            for plugin in _builtins:
                registry.register(plugin, name=f"builtin:{plugin.__name__}")
            _default = registry
        return _default


def _fresh_locks_after_fork() -> None:
    """A process forked while another thread held a lock here (monarch's zygote forks workers
    from a copy of the client, whose main thread may be asking for its backend meanwhile) would
    inherit it held forever: the child takes new ones. The registry itself is consistent: it is
    published only once built, and its caches are replaced whole."""
    global _default_lock
    _default_lock = threading.Lock()
    if _default is not None:
        _default._lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_locks_after_fork)
