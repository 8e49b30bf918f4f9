"""Moved to ``monarch.actor._transport.node``; this path stays importable for one release."""

import sys

from monarch.actor._transport import node as _moved
from monarch.actor._transport.node import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
