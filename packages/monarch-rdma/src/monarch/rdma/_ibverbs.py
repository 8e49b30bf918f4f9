"""ibverbs device discovery (the part of the ``ibverbs`` provider that needs no device).

``is_ibverbs_available()`` is true only where an RDMA device is present (a character device in
``/dev/infiniband`` and a device in ``/sys/class/infiniband`` with an active port) *and*
pyverbs can be imported (``pip install monarch-rdma[verbs]``). It imports nothing: pyverbs is
looked up, not loaded, and the device is not opened (the port's state is read from sysfs).
The ``ibverbs`` provider (``_verbs``) is offered exactly where this is true.
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
    "usable_devices",
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


def usable_devices(sysfs: Path = SYSFS_DIR, dev: Path = DEV_DIR) -> list[str]:
    """The devices of ``list_devices`` with an active port (``ports/N/state`` says
    ``ACTIVE``): the ones a queue pair can be connected through."""
    usable = []
    for name in list_devices(sysfs, dev):
        try:
            states = [p.read_text() for p in (sysfs / name / "ports").glob("*/state")]
        except OSError:
            continue
        if any("ACTIVE" in state and "INACTIVE" not in state for state in states):
            usable.append(name)
    return usable


def pyverbs_importable() -> bool:
    """Whether ``pyverbs`` is installed (not imported)."""
    try:
        return importlib.util.find_spec("pyverbs") is not None
    except (ImportError, ValueError):
        return False


def is_ibverbs_available() -> bool:
    """Whether ibverbs RDMA hardware is usable from this process (a device and pyverbs)."""
    return bool(usable_devices()) and pyverbs_importable()


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
    if not usable_devices(sysfs, dev):
        return f"no usable RDMA device: no port of {', '.join(list_devices(sysfs, dev))} is active"
    if not pyverbs_importable():
        return "pyverbs is not installed (pip install 'monarch-rdma[verbs]')"
    return None
