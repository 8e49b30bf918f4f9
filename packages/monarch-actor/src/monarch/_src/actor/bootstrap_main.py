"""``python -m monarch._src.actor.bootstrap_main``: the reference's worker command, here this
implementation's worker (``python -m monarch.actor._worker``; its options come from
``MONARCH_WORKER_ARGV``, as with any custom ``BootstrapCommand``), so programs that name the
reference's command in a ``BootstrapCommand`` run unchanged."""

from __future__ import annotations

import sys

from monarch.actor._hosts.worker import main

__all__ = ["invoke_main"]


def invoke_main() -> None:
    """Run this process as a worker until it is stopped, then exit with its status."""
    sys.exit(main())


if __name__ == "__main__":
    invoke_main()
