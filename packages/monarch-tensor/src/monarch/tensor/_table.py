"""The worker's table of local tensors (sans-IO: no torch, no actors; values are opaque).

Refs are client-chosen integers. A value is a tensor, or a :class:`Failure` standing for the
tensor an op could not produce (later ops that read it fail the same way without running).
The table is bounded: putting a new ref past ``capacity`` raises :class:`TableFull`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_CAPACITY", "Failure", "TableFull", "TensorTable"]

#: Live tensors a worker keeps at most (each client tensor alive on the mesh holds one).
DEFAULT_CAPACITY = 100_000


@dataclass(frozen=True)
class Failure:
    """Why a ref has no value: the op that failed, where the client issued it, the worker's
    traceback and the rank it ran on."""

    op: str
    issued_at: str
    traceback: str
    rank: int

    def describe(self) -> str:
        return (
            f"{self.op} (issued at {self.issued_at}) failed on worker rank {self.rank}:\n"
            f"{self.traceback.rstrip()}"
        )


class TableFull(RuntimeError):
    """The worker holds ``capacity`` live tensors already."""


class TensorTable:
    """Ref -> value, bounded."""

    __slots__ = ("_capacity", "_values")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._values: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, ref: int) -> bool:
        return ref in self._values

    def get(self, ref: int) -> Any:
        try:
            return self._values[ref]
        except KeyError:
            raise KeyError(
                f"tensor ref {ref} is not on this worker (freed, never created, or created on "
                "another mesh)"
            ) from None

    def put(self, ref: int, value: Any) -> None:
        if ref not in self._values and len(self._values) >= self._capacity:
            raise TableFull(
                f"the worker holds {len(self._values)} live tensors (capacity {self._capacity}); "
                "drop references to distributed tensors that are no longer needed"
            )
        self._values[ref] = value

    def drop(self, ref: int) -> None:
        self._values.pop(ref, None)

    def first_failure(self, refs: list[int]) -> Failure | None:
        for ref in refs:
            value = self._values.get(ref)
            if isinstance(value, Failure):
                return value
        return None
