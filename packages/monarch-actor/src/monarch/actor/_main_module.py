"""Moved to ``monarch.actor._runtime.main_module``; this path stays importable for one release."""

import sys

from monarch.actor._runtime import main_module as _moved
from monarch.actor._runtime.main_module import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
