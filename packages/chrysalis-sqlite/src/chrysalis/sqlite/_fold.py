"""The fold: writing the clock entries of pending local versions.

Why deferred (issue 6): the entry's B-tree insert cost about as much as the application's own
insert, so a commit writes only its version's row in ``__chrysalis_versions_v1`` (the keys it
wrote, which it has to write anyway) and the entries are written here, in write transactions
that run anyway: the ``Ack``'s (``Replica._record_ack``), ``apply_changes``'s before it
compares (a remote change must meet the entry a pending local write gives its row), the status
query, ``close`` and the next open (a crash between commit and fold loses nothing: the list is
durable with the commit), and a commit that cannot defer its own entries
(``ReplicaTransaction``). A sender selects pending versions without folding them
(``Replica._select_for_peer``).

A module of its own because both the replica and the transaction fold, and all a fold needs is
the catalog (the clocks and the local origin) and the caller's connection.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from chrysalis.sqlite import _sql
from chrysalis.sqlite._catalog import ReplicaCatalog

__all__ = ["SET_FOLDED_TO_CLOCK", "fold"]

SET_FOLDED_TO_CLOCK: Final = (
    "UPDATE __chrysalis_folded_v1 SET folded_through = "
    "(SELECT db_version FROM __chrysalis_replica_v1 WHERE singleton = 1) WHERE singleton = 1"
)
"""Move the fold mark to the clock (nothing is pending any more)."""


def fold(conn: sqlite3.Connection, catalog: ReplicaCatalog, budget: int | None) -> bool:
    """Write the clock entries of pending local versions, in version order, inside the
    caller's write transaction; returns whether none is left pending.

    Each listed key gets ``(version, local origin, seq)``, ``seq`` being its position in the
    version's array (the capture's index), unless its entry is already greater: a later local
    write, or a remote change applied after this fold's predecessors. A local version is
    greater than every change known at its commit (the Lamport clock) and every remote change
    applied since was compared after folding it, so folding in version order gives each row
    the entry it would have had at commit. Deletes are not deferred (their tombstones are
    written at commit, without a lookup, and are rare): the fold writes upserts, and a listed
    key whose entry is the version's own tombstone, or any later entry, is left as it is.

    ``budget``: stop after the version at which about that many keys were folded (whole
    versions only; ``None``: fold everything). Rows of a version whose keys are value lists
    (BLOB) had their entries written at commit (see ``ReplicaTransaction``)."""
    origin = catalog.local_origin
    clocks = catalog.clocks
    cursor = conn.execute(_sql.SELECT_PENDING, (origin,))
    done = True
    try:
        used = 0
        last = 0
        for version, table, keys in cursor.fetchall() if budget is None else cursor:
            if version != last:
                if last and budget is not None and used >= budget:
                    done = False
                    break
                last = version
            clock = clocks.get(table)
            if clock is None or not isinstance(keys, str):
                continue  # an unregistered table's, or written at commit (value lists)
            conn.execute(clock.fold, (version, origin, keys))
            used += keys.count(",") + 1
    finally:
        cursor.close()
    if done:
        conn.execute(SET_FOLDED_TO_CLOCK)
    else:
        conn.execute(_sql.SET_FOLDED, (last,))
    return done
