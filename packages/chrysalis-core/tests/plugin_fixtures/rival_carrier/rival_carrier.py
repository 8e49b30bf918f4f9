"""A throwaway chrysalis plugin that claims the scheme "testcarrier" too (a conflict)."""

from __future__ import annotations

from collections.abc import Sequence

from chrysalis.core import DatagramAddr
from chrysalis.core.hookspecs import CarrierSpec, hookimpl


def open_rival(address: DatagramAddr, /, **options: object) -> str:
    return f"rival socket for {address}"


@hookimpl
def chrysalis_carriers() -> Sequence[CarrierSpec]:
    return [CarrierSpec("testcarrier", open_rival)]
