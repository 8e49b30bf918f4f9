"""Moved to ``monarch.actor._runtime.ports``; this path stays importable for one release."""

import sys

from monarch.actor._runtime import ports as _moved
from monarch.actor._runtime.ports import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
