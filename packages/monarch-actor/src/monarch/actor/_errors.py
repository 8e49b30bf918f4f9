"""Moved to ``monarch.actor._base.errors``; this path stays importable for one release."""

import sys

from monarch.actor._base import errors as _moved
from monarch.actor._base.errors import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
