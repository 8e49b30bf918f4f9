"""Moved to ``monarch.actor._transport.lane``; this path stays importable for one release."""

import sys

from monarch.actor._transport import lane as _moved
from monarch.actor._transport.lane import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
