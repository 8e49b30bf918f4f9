"""Moved to ``monarch.actor._hosts.client_attach``; this path stays importable for one release."""

import sys

from monarch.actor._hosts import client_attach as _moved
from monarch.actor._hosts.client_attach import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
