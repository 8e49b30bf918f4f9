"""``ProcMesh.logging_option``: the log level of a mesh's processes, and how their output is
shown.

Why: Monarch programs call ``await procs.logging_option(stream_to_client=True, level=...)``
after spawning. Here every local worker's stdout and stderr already reach the client's stdout
and stderr, each line with its rank prefix (``[1] ``, Monarch's ``prefix_with_rank``; the
worker's pipes are copied by ``_hosts.groups.OutputForwarder``), which is what Monarch does when
log forwarding streams to the client. So the call's effects are the level (every process of the
mesh sets its root logger to ``level``, through a short-lived system actor) and the aggregation:
with ``stream_to_client=True`` and ``aggregate_window_sec=N``, repeated lines of the mesh's
processes (stdout and stderr each on its own) are merged and written once every ``N`` seconds
(``_runtime.logging.LineAggregator``); any other call turns that off (the defaults, as in
Monarch: no aggregation). As in Monarch, ``level`` outside 0..255 and ``aggregate_window_sec``
without ``stream_to_client`` raise ``ValueError``, and ``stream_to_client=True`` without
``enable_log_forwarding`` only warns. The window applies to the whole ``ProcMesh`` a slice
belongs to; output of workers on attached hosts stays on their hosts (rank-prefixed there).
"""

from __future__ import annotations

import logging
import uuid
import warnings
from typing import TYPE_CHECKING, Any

from monarch.actor._base.actor import Actor
from monarch.actor._base.endpoint import endpoint
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._mesh.meshes import ProcMesh

__all__ = ["LoggingControl", "logging_option"]


class LoggingControl(Actor):
    """System actor: applies a ``logging_option`` in one process."""

    @endpoint
    def set_level(self, level: int) -> int:
        logging.getLogger().setLevel(level)
        return logging.getLogger().getEffectiveLevel()


def check_logging_option(
    stream_to_client: bool, aggregate_window_sec: int | None, level: int
) -> None:
    """The reference's checks of ``logging_option`` arguments (``ValueError``/``TypeError``)."""
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"logging level must be an int, got {level!r}")
    if level < 0 or level > 255:
        raise ValueError(f"Invalid logging level: {level}")
    if aggregate_window_sec is not None:
        if isinstance(aggregate_window_sec, bool) or not isinstance(aggregate_window_sec, int):
            raise TypeError(f"aggregate_window_sec must be an int, got {aggregate_window_sec!r}")
        if not stream_to_client:
            raise ValueError("aggregate_window_sec needs stream_to_client=True")
    if stream_to_client and not _config.get("enable_log_forwarding"):
        warnings.warn(
            "logging_option(stream_to_client=True): log forwarding was disabled when this "
            "ProcMesh was spawned, and Monarch would not stream its output to the client. Here "
            "its output reaches this process's output in any case (with each rank's prefix, "
            "aggregated as asked). Call configure(enable_log_forwarding=True) before creating "
            "the ProcMesh, or set HYPERACTOR_MESH_ENABLE_LOG_FORWARDING=true, for the same "
            "behaviour under Monarch.",
            stacklevel=3,
        )


async def logging_option(
    mesh: ProcMesh, stream_to_client: bool, aggregate_window_sec: int | None, level: int
) -> None:
    """Apply ``level`` in every process of ``mesh`` and the aggregation window to its output
    (after the checks); see the module doc."""
    check_logging_option(stream_to_client, aggregate_window_sec, level)
    await mesh.initialized
    state = mesh._state
    group = state.group if state is not None else None
    if group is not None:
        window = aggregate_window_sec if stream_to_client and aggregate_window_sec else None
        group.set_output_window(float(window) if window else None)
    control: Any = mesh.spawn(f"logging_option_{uuid.uuid4().hex[:8]}", LoggingControl)
    try:
        await control.set_level.call(level)
    finally:
        await control.stop("logging_option applied")
