"""The locks table: reading state rows and committing them.

All state lives in the entity's `locks` table, one row per message that left its initial state, changed
by direct commits (sparkbus.storage.commits) that claim one partition and the rows' sequence numbers:
receivers of different partitions never conflict, and on one partition one commits and the other
re-reads and retries. Every decision (is the message still available? is this lock still ours?) is read
from the table version the commit is then based on, or (settling a fresh lock, see
sparkbus.core.transitions) known without reading; either way the commit is rejected if those rows changed
since that version.
"""
from __future__ import annotations

import threading
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..storage import Transaction, commits, maintenance
from ..storage.reader import PartitionReader, data_file
from ..core import records
from ..core.schemas import LOCKS

# Files read to rewrite them, kept decoded between commits (Delta data files never change); one lock for
# the threads of a process.
_reader = PartitionReader(LOCKS)
_reading = threading.Lock()


def lock_rows(view: commits.LogView, partition: int, sequence_numbers: list[int]) -> pa.Table:
    """Locks-table rows of messages in one partition at the view's version."""
    numbers = pa.array(sorted(set(sequence_numbers)), pa.int64())
    with _reading:
        found = [data.filter(pc.is_in(data["sequence_number"], value_set=numbers))
                 for _, data in _reader.files(view, partition, numbers[0].as_py(), numbers[-1].as_py())]
    return _reader.with_partition(found, partition)


def commit(view: commits.LogView, partition: int, rows: pa.Table,
           app_transactions: Optional[list[Transaction]] = None,
           reader: Optional[PartitionReader] = None) -> None:
    """Upsert state rows of one partition in one conditional commit based on the view's version (the view
    then moves to the commit's): the partition's files holding any of those sequence numbers are rewritten
    without them, plus the new rows, and the commit fails (CommitFailedError: the caller re-reads and retries) if another writer
    rewrote those files or added rows in the rows' sequence-number range since that version.
    app_transactions are recorded with the commit (two concurrent commits setting one conflict). The
    file written is remembered by this module's reader and `reader` (the caller's), which would otherwise
    read it back from storage on their next read of the partition."""
    commit_partitions(view, {partition: rows}, app_transactions, reader)


def commit_partitions(view: commits.LogView, rows: dict[int, pa.Table],
                      app_transactions: Optional[list[Transaction]] = None,
                      reader: Optional[PartitionReader] = None) -> None:
    """commit for the state rows of several partitions (partition -> rows) in ONE commit: each partition's
    file is written (side by side on an object store), then one log entry names them all, claiming every
    partition's range. A settlement of messages in sixteen partitions waits for two requests, not
    thirty-two."""
    plans: dict[int, tuple[pa.Table, list[str], tuple[int, int]]] = {}
    for partition, part in rows.items():
        if not part.num_rows:
            continue
        part = records.conformed(part, LOCKS)
        listed = sorted(set(part["sequence_number"].to_pylist()))
        numbers = pa.array(listed, pa.int64())
        low, high = listed[0], listed[-1]
        with _reading:
            overlapping = _reader.files(view, partition, low, high)
        removed, kept = [], []
        for path, data in overlapping:
            rest = _without(data, numbers, listed)
            if rest is not None:
                removed.append(path)
                kept.append(rest)
        plans[partition] = (pa.concat_tables([*kept, part.drop_columns([storage.PARTITION_COLUMN])]), removed,
                            (low, high))
    if not plans:
        return
    partitions = list(plans)
    removed_all = [path for _, removed, _ in plans.values() for path in removed]
    claim = commits.Claim({p: plans[p][2] for p in partitions}, frozenset(removed_all),
                          frozenset(t.app_id for t in app_transactions or ()))
    files: list[commits.AddedFile] = []
    try:
        ahead = commits.tail_ahead(view.log, view.position)
        files = commits.write_files(view.log, partitions, lambda p: plans[p][0])
        done = commits.commit(view.log, view.position, files, removed_all, claim,
                              {t.app_id: t.version for t in app_transactions or ()}, operation="MERGE", ahead=ahead)
    except BaseException:
        commits.discard(view.log, files)
        raise
    view.committed(done, files, removed_all)
    for partition, added in zip(partitions, files):
        path = data_file(view.log.uri, added.path)
        with _reading:
            _reader.remember(path, plans[partition][0])
        if reader is not None:
            reader.remember(path, plans[partition][0])
    maintenance.after_direct_commit(view.log.uri, done.version)


def _without(data: pa.Table, numbers: pa.Array, listed: list[int]) -> Optional[pa.Table]:
    """A file's rows without those of these sequence numbers (numbers, and listed as ints), or None when it
    holds none of them. A file of a few rows (a single message's lock) is looked at as Python values: the
    kernel calls cost it more."""
    column = data["sequence_number"]
    if len(column) <= 16:
        wanted = set(listed)
        keep = [n not in wanted for n in column.to_pylist()]
        if all(keep):
            return None
        return data.filter(pa.array(keep)) if any(keep) else data.slice(0, 0)
    hit = pc.is_in(column, value_set=numbers)
    if not pc.any(hit).as_py():
        return None
    return data.filter(pc.invert(hit))


def rows_predicate(partition: int, sequence_numbers: list[int]) -> str:
    """SQL naming the rows of one partition with these sequence numbers; the range lets statistics prune
    files before the list is evaluated."""
    low, high = min(sequence_numbers), max(sequence_numbers)
    listed = "" if high - low + 1 == len(set(sequence_numbers)) else \
        f" AND sequence_number IN ({', '.join(map(str, sorted(set(sequence_numbers))))})"
    return f"partition_id = {partition} AND sequence_number >= {low} AND sequence_number <= {high}{listed}"
