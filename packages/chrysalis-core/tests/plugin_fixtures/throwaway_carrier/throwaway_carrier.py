"""A throwaway chrysalis plugin: the carrier "testcarrier", whose sockets record their input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chrysalis.core import DatagramAddr
from chrysalis.core.hookspecs import CarrierSpec, hookimpl


@dataclass(frozen=True)
class ThrowawaySocket:
    """What the factory returns: the address and options it was opened with."""

    address: DatagramAddr
    options: dict[str, object]


def open_throwaway(address: DatagramAddr, /, **options: object) -> ThrowawaySocket:
    return ThrowawaySocket(address, dict(options))


@hookimpl
def chrysalis_carriers() -> Sequence[CarrierSpec]:
    return [CarrierSpec("testcarrier", open_throwaway, "throwaway test carrier")]
