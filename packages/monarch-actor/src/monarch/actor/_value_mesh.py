"""Moved to ``monarch.actor._base.value_mesh``; this path stays importable for one release."""

import sys

from monarch.actor._base import value_mesh as _moved
from monarch.actor._base.value_mesh import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
