"""ibverbs device discovery (the part of the ``ibverbs`` provider that needs no device).

``is_ibverbs_available()`` is true only where an RDMA device is present (a character device in
``/dev/infiniband`` and a device in ``/sys/class/infiniband``) *and* pyverbs can be imported
(``pip install monarch-rdma[verbs]``). It imports nothing: pyverbs is looked up, not loaded.
The provider that would transfer over verbs is a later increment, so this answer does not yet
make ``get_rdma_backend()`` say ``"ibverbs"`` (it reports the provider that actually serves).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = [
    "DEV_DIR",
    "SYSFS_DIR",
    "is_ibverbs_available",
    "list_devices",
    "unavailable_reason",
]

DEV_DIR = Path("/dev/infiniband")
SYSFS_DIR = Path("/sys/class/infiniband")


def list_devices(sysfs: Path = SYSFS_DIR, dev: Path = DEV_DIR) -> list[str]:
    """The names of the RDMA devices (``mlx5_0``, ``efa_0``, ...), sorted; empty unless the
    kernel exposes both the devices (``sysfs``) and their ``uverbs`` character files (``dev``)."""
    try:
        names = sorted(entry.name for entry in sysfs.iterdir())
        uverbs = [entry for entry in dev.iterdir() if entry.name.startswith("uverbs")]
    except OSError:
        return []
    if not uverbs or not all(os.access(entry, os.R_OK | os.W_OK) for entry in uverbs):
        return []
    return names


def pyverbs_importable() -> bool:
    """Whether ``pyverbs`` is installed (not imported)."""
    try:
        return importlib.util.find_spec("pyverbs") is not None
    except (ImportError, ValueError):
        return False


def is_ibverbs_available() -> bool:
    """Whether ibverbs RDMA hardware is usable from this process (a device and pyverbs)."""
    return bool(list_devices()) and pyverbs_importable()


def unavailable_reason(sysfs: Path = SYSFS_DIR, dev: Path = DEV_DIR) -> str | None:
    """Why ibverbs cannot serve this process (``None`` when a device and pyverbs are there):
    the first missing piece, in words, for logs and error messages."""
    if not sysfs.is_dir():
        return f"no RDMA device: {sysfs} does not exist (no RDMA driver loaded)"
    try:
        uverbs = [entry for entry in dev.iterdir() if entry.name.startswith("uverbs")]
    except OSError:
        uverbs = []
    if not uverbs:
        return f"no RDMA device: no uverbs device file in {dev}"
    if not list_devices(sysfs, dev):
        return f"no usable RDMA device: the uverbs files of {dev} are not readable and writable"
    if not pyverbs_importable():
        return "pyverbs is not installed (pip install 'monarch-rdma[verbs]')"
    return None
