"""Moved to ``chrysalis.quic._engines.qh3``; this old path stays importable for one release
(it is the same module object, so private names and monkeypatching behave as before)."""

from __future__ import annotations

import sys

from chrysalis.quic._engines import qh3 as _moved
from chrysalis.quic._engines.qh3 import *  # noqa: F403

sys.modules[__name__] = _moved
