"""Moved to ``monarch.actor._runtime.telemetry``; this old path stays importable for one
release."""

import sys

from monarch.actor._runtime import telemetry as _moved
from monarch.actor._runtime.telemetry import *  # noqa: F403

sys.modules[__name__] = _moved  # the package: the old module's names (state is in submodules)
