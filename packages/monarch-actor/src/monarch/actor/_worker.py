"""Moved to ``monarch.actor._hosts.worker``; this path stays importable for one release and
stays the worker's documented entry point: ``python -m monarch.actor._worker`` (the command
``default_bootstrap_cmd`` and ``MONARCH_WORKER_ARGV`` name)."""

import sys

from monarch.actor._hosts import worker as _moved
from monarch.actor._hosts.worker import *  # noqa: F403

if __name__ == "__main__":  # run as a program: this module is ``__main__``, keep it so
    sys.exit(_moved.main())
else:
    sys.modules[__name__] = _moved  # the same module: private names and patches included
