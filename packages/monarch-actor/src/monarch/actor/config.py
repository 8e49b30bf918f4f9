"""Flags of ``monarch.actor`` read at use time (``monarch.actor.config``).

``prefix_python_logs_with_actor``: whether log records emitted inside actors are prefixed with
``[actor=<instance chain>]`` (read at every record by the log-record factory of
``_runtime.logging``).
"""

from __future__ import annotations

__all__ = ["prefix_python_logs_with_actor"]

prefix_python_logs_with_actor: bool = True
