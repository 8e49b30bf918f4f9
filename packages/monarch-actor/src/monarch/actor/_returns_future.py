"""Moved to ``monarch.actor._runtime.returns_future``; this old path stays importable for one
release."""

import sys

from monarch.actor._runtime import returns_future as _moved
from monarch.actor._runtime.returns_future import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
