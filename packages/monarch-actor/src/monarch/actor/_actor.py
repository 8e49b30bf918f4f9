"""Moved to ``monarch.actor._base.actor``; this path stays importable for one release."""

import sys

from monarch.actor._base import actor as _moved
from monarch.actor._base.actor import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
