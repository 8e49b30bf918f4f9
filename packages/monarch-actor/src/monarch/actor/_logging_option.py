"""Moved to ``monarch.actor._mesh.logging_option``; this old path stays importable for one
release."""

import sys

from monarch.actor._mesh import logging_option as _moved
from monarch.actor._mesh.logging_option import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
