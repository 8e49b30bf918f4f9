"""Errors of the tensor engine as the client sees them."""

from __future__ import annotations

from monarch.tensor._table import Failure

__all__ = ["RemoteException"]


class RemoteException(Exception):
    """An operation failed on a worker: raised by the fetch of a tensor it (or anything computed
    from it) should have produced. ``op`` names the operation, ``issued_at`` where the client
    issued it, ``rank`` the worker, ``worker_traceback`` the worker's traceback."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.describe())
        self.op = failure.op
        self.issued_at = failure.issued_at
        self.rank = failure.rank
        self.worker_traceback = failure.traceback
