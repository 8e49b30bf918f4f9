"""Moved to ``monarch.actor._hosts.zygote``; this path stays importable for one release."""

import sys

from monarch.actor._hosts import zygote as _moved
from monarch.actor._hosts.zygote import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
