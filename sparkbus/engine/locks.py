"""The locks table: reading state rows and committing them.

All state lives in the entity's `locks` table, one row per message that left its initial state, changed
by predicate overwrites that name one partition and the rows' sequence numbers: receivers of different
partitions never conflict, and on one partition delta-rs lets one commit and the other re-reads and
retries. Every decision (is the message still available? is this lock still ours?) is read from the
table version the commit is then based on, or (settling a fresh lock, see sparkbus.core.transitions) known
without reading; either way the commit is rejected if those rows changed since that version.
"""
from __future__ import annotations

import pyarrow as pa
from typing import Optional

from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from .. import storage
from ..storage import maintenance
from ..storage.schemas import LOCKS


def lock_rows(locks: DeltaTable, partition: int, sequence_numbers: list[int]) -> pa.Table:
    """Current locks-table rows of messages in one partition."""
    return storage.query(f"SELECT * FROM locks WHERE {rows_predicate(partition, sequence_numbers)}", locks=locks)


def commit(locks: DeltaTable, partition: int, rows: pa.Table,
           app_transactions: Optional[list[Transaction]] = None) -> None:
    """Upsert state rows of one partition in one conditional commit naming that partition and the rows'
    sequence numbers: it replaces exactly those rows, and delta-rs rejects it if another writer changed
    any of them since the version the caller read (the caller re-reads and retries). app_transactions are
    recorded with the commit (and make two concurrent commits setting one of them conflict)."""
    if not rows.num_rows:
        return
    write_deltalake(locks, rows.select(LOCKS.names).cast(LOCKS), mode="overwrite",
                    predicate=rows_predicate(partition, rows["sequence_number"].to_pylist()),
                    commit_properties=CommitProperties(app_transactions=app_transactions) if app_transactions else None,
                    post_commithook_properties=storage.NO_HOOKS)
    maintenance.after_commit(locks)


def rows_predicate(partition: int, sequence_numbers: list[int]) -> str:
    """SQL naming the rows of one partition with these sequence numbers; the range lets statistics prune
    files before the list is evaluated."""
    low, high = min(sequence_numbers), max(sequence_numbers)
    listed = "" if high - low + 1 == len(set(sequence_numbers)) else \
        f" AND sequence_number IN ({', '.join(map(str, sorted(set(sequence_numbers))))})"
    return f"partition_id = {partition} AND sequence_number >= {low} AND sequence_number <= {high}{listed}"
