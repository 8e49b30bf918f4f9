"""The ``Notifier`` contract: how a queue or pool says "look again" without assuming a runtime.

Why: the completion model must work with a driver on its own OS thread, inline on an asyncio or
trio loop, or busy-polled. Every wakeup therefore goes through one tiny protocol: ``notify()``
means "something you wait on may have changed". It carries no payload, so many signals can be
coalesced into one, and a spurious signal is always allowed: the woken party re-checks the
state it cares about. ``Wakeup`` (in ``_wakeup``) is the implementation that threads and
coroutines can wait on; ``NoopNotifier`` serves callers that poll.
"""

from __future__ import annotations

from typing import Protocol, final, runtime_checkable

__all__ = ["NOOP_NOTIFIER", "NoopNotifier", "Notifier"]


@runtime_checkable
class Notifier(Protocol):
    """Signals "a queue or pool you wait on may have changed".

    Contract for implementations:

    - ``notify()`` may be called from any thread, concurrently, any number of times.
    - Signals may be coalesced (several calls, one wakeup) and may be spurious.
    - It carries no payload and must return quickly.
    - It must not re-enter Chrysalis (no queue, pool or budget operation inside ``notify``),
      because callers invoke it right after releasing their own locks.
    """

    def notify(self) -> None:
        """Signal that the observed state may have changed."""


@final
class NoopNotifier:
    """A ``Notifier`` that does nothing, for callers that busy-poll."""

    __slots__ = ()

    def notify(self) -> None:
        """Do nothing."""

    def __repr__(self) -> str:
        return "NoopNotifier()"


NOOP_NOTIFIER = NoopNotifier()
"""The shared ``NoopNotifier`` instance (it has no state)."""


@final
class _FanoutNotifier:
    """Private: forwards each ``notify()`` to several notifiers, in order."""

    __slots__ = ("_targets",)

    def __init__(self, *targets: Notifier) -> None:
        self._targets = tuple(t for t in targets if not isinstance(t, NoopNotifier))

    def notify(self) -> None:
        for target in self._targets:
            target.notify()


def _fanout(*targets: Notifier) -> Notifier:
    """Return one notifier that signals every non-noop target (the target itself if only one)."""
    live = tuple(t for t in targets if not isinstance(t, NoopNotifier))
    if not live:
        return NOOP_NOTIFIER
    if len(live) == 1:
        return live[0]
    return _FanoutNotifier(*live)
