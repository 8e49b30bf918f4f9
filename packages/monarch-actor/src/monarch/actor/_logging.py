"""Moved to ``monarch.actor._runtime.logging``; this path stays importable for one release."""

import sys

from monarch.actor._runtime import logging as _moved
from monarch.actor._runtime.logging import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
