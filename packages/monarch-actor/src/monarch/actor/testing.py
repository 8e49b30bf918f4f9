"""Support for the tests of programs written with ``monarch.actor`` (not in the reference API).

``flush_supervision()`` returns once every supervision event already received or in flight has
been delivered to its handler, so a test can assert that *no* fault reached the client
(``from monarch.actor.testing import flush_supervision``).
"""

from __future__ import annotations

from monarch.actor._hosts.settle import flush_supervision

__all__ = ["flush_supervision"]
