"""Moved to ``chrysalis.quic._engines.aioquic_fast``; this old path stays importable for one release
(it is the same module object, so private names and monkeypatching behave as before)."""

from __future__ import annotations

import sys

from chrysalis.quic._engines import aioquic_fast as _moved
from chrysalis.quic._engines.aioquic_fast import *  # noqa: F403

sys.modules[__name__] = _moved
