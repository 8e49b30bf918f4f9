"""Moved to ``monarch.actor._base.uid``; this old path stays importable for one
release."""

import sys

from monarch.actor._base import uid as _moved
from monarch.actor._base.uid import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
