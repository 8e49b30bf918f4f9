"""Test helper shared by the storage and fold tests: the changes a selection's encoded batch
carries, decoded the way a receiving session does."""

from __future__ import annotations

from chrysalis.sqlite import BatchChunk, Change, FrameDecoder, pack_batch_chunks


def decode_changes(encoded: tuple[bytes, ...]) -> list[Change]:
    """Every change in ``encoded`` (a selection's batch chunks), in order."""
    decoder = FrameDecoder()
    for frame in pack_batch_chunks(encoded):
        decoder.feed(frame)
    changes: list[Change] = []
    while (message := decoder.next_message()) is not None:
        assert isinstance(message, BatchChunk)
        changes += message.changes
    return changes
