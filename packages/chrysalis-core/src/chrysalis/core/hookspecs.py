"""The chrysalis plugin contract: every hook a plugin may implement, each documented as a contract.

Chrysalis is extended at three points, each keyed by a short lowercase name:

* carriers: a datagram address scheme (``udp``, ``unix``, ...) to the factory that opens a
  datagram socket for an address of that scheme;
* identity providers: a provider name to a factory of providers that issue this process's
  certificate chain, private key and trust roots;
* address resolvers: a URL scheme to the function that turns such a URL into join settings.

A plugin is any module or object with functions marked ``@hookimpl`` whose names are the hook
names below. It reaches a process in one of two ways: an installed distribution declares it in
the ``chrysalis`` entry-point group, for example in its ``pyproject.toml``::

    [project.entry-points.chrysalis]
    udp = "chrysalis.datagram._plugin"

or code registers it with ``PluginRegistry.register(plugin)``.

Design choices, made deliberately:

* Every hook takes no arguments and returns a sequence of records, so one plugin can
  contribute several carriers (or providers, or resolvers), or none (an empty sequence).
* No hook is ``firstresult``: every plugin's contributions are gathered, and a key claimed by
  two plugins is an error (``PluginConflictError``) naming both, never a silent override
  decided by registration order.
* Hooks are collection hooks: wrappers (``wrapper=True`` / ``hookwrapper=True``) are refused.
* The registry calls each hook once and caches the result until the plugin set changes, so a
  hook must be cheap, deterministic and free of side effects: it describes what the plugin
  offers, and opens nothing. Sockets, files and keys are touched only when a caller invokes the
  factory inside a returned record.
* A plugin written against a newer chrysalis may implement hooks this version lacks by marking
  them ``@hookimpl(optionalhook=True)``; any other unknown ``chrysalis_*`` hook is refused when
  the plugin is registered (it is almost always a misspelling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pluggy

from chrysalis.core._plugin_types import (
    AddressResolverSpec,
    CarrierFactory,
    CarrierSpec,
    IdentityMaterial,
    IdentityProvider,
    IdentityProviderSpec,
    JoinSettings,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_SPECS_PER_HOOK",
    "PROJECT_NAME",
    "AddressResolverSpec",
    "CarrierFactory",
    "CarrierSpec",
    "IdentityMaterial",
    "IdentityProvider",
    "IdentityProviderSpec",
    "JoinSettings",
    "chrysalis_address_resolvers",
    "chrysalis_carriers",
    "chrysalis_identity_providers",
    "hookimpl",
    "hookspec",
]

#: The pluggy project name: hook markers and the plugin manager use it.
PROJECT_NAME: Final = "chrysalis"
#: The entry-point group scanned for plugins in installed distributions.
ENTRY_POINT_GROUP: Final = PROJECT_NAME
#: The most records one plugin may return from one hook call.
MAX_SPECS_PER_HOOK: Final = 64

#: Marks the hook specifications in this module.
hookspec: Final = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a plugin's hook implementations: ``@hookimpl def chrysalis_carriers(): ...``.
hookimpl: Final = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def chrysalis_carriers() -> Sequence[CarrierSpec]:
    """Return the datagram carriers this plugin provides (a list or tuple of ``CarrierSpec``).

    Contract:

    * Each ``CarrierSpec.scheme`` is the scheme of the ``DatagramAddr`` values the carrier
      serves. A scheme is claimed by at most one plugin per process; a second claim makes every
      lookup fail with ``PluginConflictError`` naming both plugins' distributions.
    * ``CarrierSpec.open(address, **options)`` is called with an address of that scheme and
      carrier-specific keyword options; it returns an open datagram socket as specified by
      ``chrysalis.datagram``, owned (and closed) by the caller. It raises ``ValueError`` for an
      address it cannot express, ``TypeError`` for an unknown option and ``OSError`` when the
      operating system refuses.
    * This hook opens nothing itself, has no side effects and returns the same carriers each
      time; at most ``MAX_SPECS_PER_HOOK`` of them, possibly none.
    """
    raise NotImplementedError("hook specification: implemented by plugins, never called")


@hookspec
def chrysalis_identity_providers() -> Sequence[IdentityProviderSpec]:
    """Return the identity providers this plugin provides (a list or tuple of
    ``IdentityProviderSpec``).

    Contract:

    * Each ``IdentityProviderSpec.name`` is claimed by at most one plugin per process; a second
      claim is a ``PluginConflictError`` naming both plugins' distributions.
    * ``IdentityProviderSpec.create(**options)`` builds an ``IdentityProvider`` for one process
      from provider-specific keyword options, raising ``TypeError`` for an unknown option and
      ``ValueError`` for a bad value.
    * ``IdentityProvider.issue()`` returns an ``IdentityMaterial``: the PEM certificate chain
      with the leaf first, the leaf's PEM private key, and the PEM trust roots used to verify
      peers. Leaf keys should be ECDSA P-256: the QUIC stacks and the certificate verifier used
      by chrysalis reject Ed25519 leaves.
    * This hook creates no keys and reads no files itself; it returns the same providers each
      time, at most ``MAX_SPECS_PER_HOOK`` of them, possibly none.
    """
    raise NotImplementedError("hook specification: implemented by plugins, never called")


@hookspec
def chrysalis_address_resolvers() -> Sequence[AddressResolverSpec]:
    """Return the address resolvers this plugin provides (a list or tuple of
    ``AddressResolverSpec``).

    Contract:

    * Each ``AddressResolverSpec.scheme`` is a URL scheme (the text before the first ``:``),
      claimed by at most one plugin per process; a second claim is a ``PluginConflictError``
      naming both plugins' distributions.
    * ``AddressResolverSpec.resolve(url)`` receives the whole URL and returns ``JoinSettings``:
      the datagram address to contact, optionally the PID expected there, and string options.
      It raises ``ValueError`` for a URL it cannot parse. It should not block on the network:
      it translates text, the transport does the contacting.
    * This hook returns the same resolvers each time, at most ``MAX_SPECS_PER_HOOK`` of them,
      possibly none.
    """
    raise NotImplementedError("hook specification: implemented by plugins, never called")
