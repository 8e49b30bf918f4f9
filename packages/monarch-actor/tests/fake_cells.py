"""A stand-in for an actor cell, for tests that route envelopes into ``ProcRuntime.cells``
(``test_parked_calls.py``, ``test_received_counts.py``; imported by name: the tests put this
folder on ``sys.path``)."""

from __future__ import annotations


class FakeMailbox:
    def __init__(self) -> None:
        self._items: list[object] = []


class FakeCell:
    """Takes every item it is given (``items``); its mailbox stays empty (depth 0, with
    metrics on)."""

    def __init__(self) -> None:
        self.items: list[object] = []
        self.mailbox = FakeMailbox()

    def enqueue(self, item: object, force: bool = False) -> bool:
        self.items.append(item)
        return True
