"""Moved to ``monarch.actor._runtime.liveness``; this old path stays importable for one
release."""

import sys

from monarch.actor._runtime import liveness as _moved
from monarch.actor._runtime.liveness import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
