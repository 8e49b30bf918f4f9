"""Moved to ``monarch.actor._runtime.context``; this path stays importable for one release."""

import sys

from monarch.actor._runtime import context as _moved
from monarch.actor._runtime.context import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
