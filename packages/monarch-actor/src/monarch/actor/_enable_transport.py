"""Moved to ``monarch.actor._runtime.enable_transport``; this old path stays importable for one
release."""

import sys

from monarch.actor._runtime import enable_transport as _moved
from monarch.actor._runtime.enable_transport import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
