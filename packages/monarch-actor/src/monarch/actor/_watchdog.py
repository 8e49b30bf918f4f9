"""Moved to ``monarch.actor._runtime.watchdog``; this old path stays importable for one
release."""

import sys

from monarch.actor._runtime import watchdog as _moved
from monarch.actor._runtime.watchdog import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
