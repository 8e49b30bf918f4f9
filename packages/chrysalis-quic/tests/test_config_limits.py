"""QuicConfig's datagram size bound: no larger than the engines carry intact."""

from __future__ import annotations

import pytest

from chrysalis.quic import QuicConfig


def test_datagrams_up_to_16_kib_are_accepted_and_larger_ones_refused() -> None:
    assert QuicConfig(max_udp_payload=16384).max_udp_payload == 16384
    # a 2-byte varint frame length holds at most 16,383: larger datagrams corrupted frames
    with pytest.raises(ValueError, match=r"max_udp_payload must be in 1\.\.16384"):
        QuicConfig(max_udp_payload=16385)
    with pytest.raises(ValueError, match="too small"):
        QuicConfig(max_udp_payload=1199)
