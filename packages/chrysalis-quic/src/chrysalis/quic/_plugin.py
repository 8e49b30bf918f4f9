"""The ``chrysalis.quic`` plugin: the identity providers ``dev`` and ``file``.

Why a plugin: the identity a process uses is a deployment choice (a development CA on a
laptop, PEM files from a PKI in production, a site-specific issuer elsewhere), so the node
asks the plugin registry for an identity provider by name instead of importing one. This
module is registered through the ``chrysalis`` entry-point group of the ``chrysalis-quic``
distribution. Per the hook contract it only describes what it offers: nothing is read,
generated or created until a caller invokes ``create(...)`` and then ``issue()``.

Options (as the CLI passes them, strings or paths):

* ``dev``: ``directory`` (optional) where the development CA lives.
* ``file``: ``chain``, ``key`` and ``roots`` paths, or ``directory`` holding ``chain.pem``,
  ``key.pem`` and ``roots.pem`` (as written by ``write_identity``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from chrysalis.core import IdentityProviderSpec, hookimpl
from chrysalis.quic._providers import DevelopmentIdentityProvider, FileIdentityProvider

__all__ = ["chrysalis_identity_providers", "create_dev_provider", "create_file_provider"]


def create_dev_provider(*, directory: Path | str | None = None) -> DevelopmentIdentityProvider:
    """Factory of the ``dev`` provider: a fresh leaf per ``issue()`` from the development CA
    in ``directory`` (default: ``$CHRYSALIS_DEV_CA_DIR`` or a per-user temporary directory)."""
    return DevelopmentIdentityProvider(directory)


def create_file_provider(
    *,
    chain: Path | str | None = None,
    key: Path | str | None = None,
    roots: Path | str | None = None,
    directory: Path | str | None = None,
) -> FileIdentityProvider:
    """Factory of the ``file`` provider: either all of ``chain``, ``key`` and ``roots``, or
    only ``directory``. Raises ``TypeError`` for any other combination."""
    paths = (chain, key, roots)
    if directory is not None:
        if any(path is not None for path in paths):
            raise TypeError("give either directory or chain, key and roots, not both")
        return FileIdentityProvider.from_directory(directory)
    if chain is None or key is None or roots is None:
        raise TypeError("the file identity provider needs chain, key and roots (or directory)")
    return FileIdentityProvider(chain, key, roots)


@hookimpl
def chrysalis_identity_providers() -> Sequence[IdentityProviderSpec]:
    """The ``dev`` and ``file`` identity providers."""
    return (
        IdentityProviderSpec(
            name="dev",
            create=create_dev_provider,
            description="development CA shared per user; a fresh leaf and PID per process",
        ),
        IdentityProviderSpec(
            name="file",
            create=create_file_provider,
            description="PEM certificate chain, private key and trust roots read from files",
        ),
    )
