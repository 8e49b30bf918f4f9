"""Moved to ``monarch.actor._hosts.settle``; this path stays importable for one release."""

import sys

from monarch.actor._hosts import settle as _moved
from monarch.actor._hosts.settle import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
