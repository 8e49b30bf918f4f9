"""This host's identity, as the providers compare it (shared by ``_buffer`` and ``_net``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Final

__all__ = ["HOST", "host_identity"]


def host_identity() -> str:
    """This host's identity: its name, boot id (a rebooted host is another host) and network
    namespace (the ``shm`` provider's abstract sockets are per network namespace, so two
    namespaces of one machine count as two hosts)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = ""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"


#: This process's host identity (computed once).
HOST: Final = host_identity()
