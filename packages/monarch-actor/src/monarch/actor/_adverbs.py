"""Moved to ``monarch.actor._mesh.adverbs``; this old path stays importable for one
release."""

import sys

from monarch.actor._mesh import adverbs as _moved
from monarch.actor._mesh.adverbs import *  # noqa: F403

sys.modules[__name__] = _moved  # the same module: private names and patches included
