"""Retention: completed and cancelled messages leave an entity's tables, so receive cost follows the
live set, not the history.

What may leave, per partition:
- a `messages` row whose state row says completed or cancelled, except the partition's highest
  sequence number (sequencing: the high-water mark lives in that row) and, with duplicate detection,
  rows enqueued within the history window (duplicates: the window is the history);
- a `locks` row in a gone state whose message row is no longer there.
Messages go first, their state rows after (a crash in between leaves state rows that the next run
removes). Receivers read `locks` before `messages` (receiver.ServiceBusReceiver._snapshot), so no
reader ever sees a completed message without its state row, which would make it look active.

A run handles one partition with two conditional deletes naming it; messages go only when the gone
rows are at least a quarter of the partition (and MIN_REMOVED), so the files it rewrites stay
proportional to what it removes. Both deletes conflict only with writers of the same partition, and a
run that loses a race is simply skipped: the next one finds the same rows.
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..storage import CommitFailedError, DeltaError, DeltaTable, maintenance
from ..core import records
from ..core.schemas import GONE_SQL
from .registry import EntityInfo
from . import clock

RUN_EVERY = 50  # locks-table versions between runs (offset from checkpoints, which fall on multiples)
MIN_REMOVED = 2_000
MAX_RANGES = 256  # ranges per delete predicate; what remains goes in a later run


def due(version: int) -> bool:
    """Whether the commit that brought the locks table to `version` should be followed by a retention run."""
    return version % RUN_EVERY == RUN_EVERY // 2


def run(info: EntityInfo, messages: DeltaTable, locks: DeltaTable, partition: int, *,
        minimum: int = MIN_REMOVED) -> int:
    """Remove gone rows of one partition: messages when at least max(minimum, a quarter of the partition)
    can go, then every state row left without a message (including those of an earlier run that was
    interrupted). Returns the message rows removed; 0 after a lost race."""
    try:
        removed = _remove_messages(info, messages, locks, partition, minimum)
        if removed:
            _remove_states(storage.refresh(messages), storage.refresh(locks), partition)
        return removed
    except (CommitFailedError, DeltaError, FileNotFoundError) as error:
        if isinstance(error, CommitFailedError) or storage.is_expired_version(error):
            return 0
        raise


def _remove_messages(info: EntityInfo, messages: DeltaTable, locks: DeltaTable, partition: int, minimum: int) -> int:
    window = ""
    if info.options.requires_duplicate_detection:
        cutoff = clock.now() - info.options.duplicate_detection_history_time_window
        window = f"AND CAST(m.enqueued_time_utc AS BIGINT) < {records.micros(cutoff)}"
    rows = storage.query(f"""
        SELECT m.sequence_number,
               l.state IN ({GONE_SQL}) {window}
                 AND m.sequence_number < MAX(m.sequence_number) OVER () AS removable
        FROM messages m
        LEFT JOIN locks l ON l.partition_id = {partition} AND l.sequence_number = m.sequence_number
        WHERE m.partition_id = {partition}
        ORDER BY m.sequence_number""", messages=messages, locks=locks)
    removable = pc.sum(pc.fill_null(rows["removable"], False).cast(pa.int64())).as_py() or 0
    if removable == 0 or removable < max(minimum, rows.num_rows // 4):
        return 0
    ranges = runs(rows["sequence_number"].to_pylist(), rows["removable"].to_pylist())[:MAX_RANGES]
    storage.delete_rows(messages, _ranges_predicate(partition, ranges))
    maintenance.after_commit(messages)
    return removable


def _remove_states(messages: DeltaTable, locks: DeltaTable, partition: int) -> None:
    rows = storage.query(f"""
        SELECT l.sequence_number, l.state IN ({GONE_SQL}) AND m.sequence_number IS NULL AS removable
        FROM locks l
        LEFT JOIN messages m ON m.partition_id = {partition} AND m.sequence_number = l.sequence_number
        WHERE l.partition_id = {partition}
        ORDER BY l.sequence_number""", messages=messages, locks=locks)
    ranges = runs(rows["sequence_number"].to_pylist(), rows["removable"].to_pylist())[:MAX_RANGES]
    if ranges:
        storage.delete_rows(locks, f"{_ranges_predicate(partition, ranges)} AND state IN ({GONE_SQL})")
        maintenance.after_commit(locks)


def runs(sequence_numbers: list[int], removable: list[Optional[bool]]) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive removable rows, in sequence order: deleting every row
    between first and last removes exactly the removable rows (the rows are all the partition has)."""
    found: list[tuple[int, int]] = []
    start: Optional[int] = None
    last: Optional[int] = None
    for seq, flag in zip(sequence_numbers, removable):
        if flag:
            start = seq if start is None else start
            last = seq
        elif start is not None:
            assert last is not None  # set with start
            found.append((start, last))
            start = None
    if start is not None:
        assert last is not None
        found.append((start, last))
    return found


def _ranges_predicate(partition: int, ranges: list[tuple[int, int]]) -> str:
    spans = " OR ".join(f"(sequence_number >= {a} AND sequence_number <= {b})" for a, b in ranges)
    return f"partition_id = {partition} AND ({spans})"
