"""Bounds on the logical clock (issue 15).

A replica's clock (``db_version``) is a Lamport clock: each commit moves it one past the
greatest version it has seen, and a received change raises it to the change's version. Without
a bound, one peer that sends a version near ``2**63`` raises every receiver's clock to the top
of SQLite's integers, where the next local commit cannot move it any more: writes stop for good
on every replica the change reaches. So a receiver refuses (``ClockBoundError``) every change
whose version is above

- ``MAX_ACCEPTED_VERSION`` (``2**62``), always: a peer can raise a clock at most that far,
  which leaves ``2**63 - 1 - 2**62`` (about 4.6e18) local commits;
- and, for a replica given a ``clock`` (wall time in seconds, passed in: this module reads no
  clock), ``hlc_version(now + max_clock_drift)``: such a replica's clock is a hybrid logical
  clock, whose versions are wall time in units of ``2**-16`` ms (``hlc_version``) plus a
  logical count, so a peer can only push versions ``max_clock_drift`` seconds ahead of local
  time, which real time then catches up with.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "DEFAULT_MAX_CLOCK_DRIFT",
    "MAX_ACCEPTED_VERSION",
    "hlc_version",
]

MAX_ACCEPTED_VERSION: Final = 2**62
"""The greatest version any replica accepts from a peer, clock or no clock."""

DEFAULT_MAX_CLOCK_DRIFT: Final = 60.0
"""Default of ``Replica(max_clock_drift=...)``: how many seconds ahead of the local wall
clock a received version may be, for a replica given a ``clock``."""

HLC_LOGICAL_BITS: Final = 16
"""Low bits of a hybrid version left to the logical count (65 536 versions per millisecond
before the count spills into the next millisecond, which keeps the clock monotonic)."""


def hlc_version(seconds: float) -> int:
    """The hybrid-logical-clock version of wall time ``seconds`` (since the Unix epoch):
    whole milliseconds shifted left by ``HLC_LOGICAL_BITS``, clamped to
    ``[0, MAX_ACCEPTED_VERSION]``. Raises ``ValueError`` for a time that is not finite."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise ValueError(f"the replica's clock must return finite seconds, not {seconds!r}")
    if seconds <= 0:
        return 0
    return min(int(seconds * 1000) << HLC_LOGICAL_BITS, MAX_ACCEPTED_VERSION)
