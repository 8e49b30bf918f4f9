"""Moved to ``monarch.actor._transport.lane_proto``; this path stays importable for one release."""

import sys

from monarch.actor._transport import lane_proto as _moved
from monarch.actor._transport.lane_proto import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
