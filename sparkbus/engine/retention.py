"""Retention: completed and cancelled messages leave an entity's tables, so receive cost follows the
live set, not the history.

What may leave, per partition:
- a `messages` row whose state row says completed or cancelled, except the partition's highest
  sequence number (sequencing: the high-water mark lives in that row) and, with duplicate detection,
  rows enqueued within the history window (duplicates: the window is the history);
- a `locks` row in a gone state whose message row is no longer there.
Messages go first, their state rows after (a crash in between leaves state rows that the next run
removes). An entity with an archive archives the leaving messages first, in a commit to its archive table,
and the removal records which archive commit it follows (sparkbus.engine.archive says why that is exactly
once); the namespace's sweep then runs eagerly, every gone row leaving however few. Receivers read `locks` before `messages` (receiver.ServiceBusReceiver._snapshot), so no
reader ever sees a completed message without its state row, which would make it look active.

A run handles one partition with two direct commits (sparkbus.storage.commits), each replacing the
partition's files that hold leaving rows by one file of the rest and claiming only those files: sends
appending meanwhile never conflict with it, a commit that rewrote one of them (a settlement, a compaction,
another run) does, and a run that loses a race is simply skipped: the next one finds the same rows. Gone
states are final, so what a run read of the `locks` table stays true while it commits. Messages go only
when the gone rows are at least a quarter of the partition (and MIN_REMOVED), so the files it rewrites
stay proportional to what it removes. (delta-rs' DELETE did the same with a query and a conflict-checked
rewrite; under the soak's load a run took up to two minutes and was half of the namespace service's CPU.)
"""
from __future__ import annotations

import functools
from typing import Callable, Iterable, Optional

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..storage import CommitFailedError, DeltaError, DeltaTable, commits, maintenance
from ..storage.reader import PartitionReader
from ..core import records
from ..core.schemas import GONE_STATES, LOCKS, MESSAGES
from .registry import EntityInfo
from . import archive, clock

RUN_EVERY = 50  # locks-table versions between runs (offset from checkpoints, which fall on multiples)
MIN_REMOVED = 2_000


@functools.cache
def _gone_states() -> pa.Array:
    """GONE_STATES as an Arrow array (made on first use: pa.array imports pandas, which an import of this
    module must not)."""
    return pa.array(GONE_STATES, pa.string())


def due(version: int) -> bool:
    """Whether the commit that brought the locks table to `version` should be followed by a retention run."""
    return version % RUN_EVERY == RUN_EVERY // 2


def may_remove(files: Iterable[commits.AddedFile]) -> bool:
    """Whether a run could remove anything from a partition of these message files: not when their
    statistics say it holds fewer than MIN_REMOVED rows (a run never removes fewer). Deciding that from
    the log view a receiver holds spares it the run's reads: a small queue's receives paid 10 ms of
    maintenance every 25th completion, for nothing."""
    listed = list(files)
    return not all("sequence_number" in f.high for f in listed) or sum(f.rows for f in listed) >= MIN_REMOVED


def run(info: EntityInfo, messages: DeltaTable, locks: DeltaTable, partition: int, *,
        minimum: int = MIN_REMOVED) -> int:
    """Remove gone rows of one partition: messages when at least max(minimum, a quarter of the partition)
    can go, then every state row left without a message (including those of an earlier run that was
    interrupted). Returns the message rows removed; 0 after a lost race."""
    return run_views(info, commits.LogView(messages), commits.LogView(locks), partition, minimum=minimum,
                     archived=archive_view(info))


def run_kept(info: EntityInfo, partition: int) -> int:
    """run() on the views of the entity's tables that the maintenance thread keeps between jobs
    (maintenance.followed_view), where it runs (maintenance.run_later): each run reads the log entries
    written since the last, not both tables' logs from their checkpoints."""
    return run_views(info, maintenance.followed_view(info.tables["messages"]),
                     maintenance.followed_view(info.tables["locks"]), partition, archived=archive_view(info))


def run_entity(info: EntityInfo, *, eager: bool = False) -> int:
    """run() on every available partition of the entity, its tables opened once and followed between them
    (eager: see run_views). Returns the message rows removed."""
    locks = commits.LogView(storage.open_table(info.tables["locks"]))  # before messages: see the docstring
    messages = commits.LogView(storage.open_table(info.tables["messages"]))
    archived = archive_view(info)
    return sum(run_views(info, messages, locks, partition, archived=archived, eager=eager)
               for partition in range(info.partition_count) if partition not in info.avoided())


def archive_view(info: EntityInfo) -> Optional[commits.LogView]:
    """A view of the entity's archive table when it has the archive on (created if missing), else None."""
    return archive.open_view(info) if info.options.archive_retention is not None else None


def run_views(info: EntityInfo, messages: commits.LogView, locks: commits.LogView, partition: int, *,
              minimum: int = MIN_REMOVED, archived: Optional[commits.LogView] = None, eager: bool = False) -> int:
    """run() on views of the two tables (brought to their latest versions first), which a caller running
    several partitions keeps between them. archived: a view of the entity's archive table when it has
    the archive on (sparkbus.engine.archive), which the leaving messages go to first. eager: every gone
    row that may leave does, however few (the namespace's sweep of an archived entity, so that the
    archive lags it by a sweep; replay, which reads the archive whole)."""
    try:
        locks.advance()
        messages.advance()
        if archived is not None:
            archived.advance()
        removed = _remove_messages(info, messages, locks, partition, 1 if eager else minimum, archived, eager)
        if removed:
            _remove_states(messages, locks.advance(), partition)
        return removed
    except (CommitFailedError, DeltaError, FileNotFoundError) as error:
        if isinstance(error, CommitFailedError) or storage.is_expired_version(error):
            return 0
        raise


def _remove_messages(info: EntityInfo, messages: commits.LogView, locks: commits.LogView, partition: int,
                     minimum: int, archived: Optional[commits.LogView] = None, eager: bool = False) -> int:
    gone = _gone(locks, partition)
    files = PartitionReader(MESSAGES, columns=("sequence_number", "enqueued_time_utc")).files(messages, partition)
    if not files:
        return 0
    numbers = pa.concat_arrays([data["sequence_number"].combine_chunks() for _, data in files])
    removable = pc.and_(pc.is_in(numbers, value_set=gone), pc.less(numbers, pc.max(numbers)))
    if info.options.requires_duplicate_detection:  # the rows within the history window are the history
        cutoff = records.micros(clock.now() - info.options.duplicate_detection_history_time_window)
        enqueued = pa.concat_arrays([data["enqueued_time_utc"].combine_chunks() for _, data in files])
        removable = pc.and_(removable, pc.less(enqueued.cast(pa.int64()), cutoff))
    count = pc.sum(removable.cast(pa.int64())).as_py() or 0
    counts = archive.pending(archived, messages, partition) if archived is not None else None
    eager = eager or (counts is not None and counts.behind)  # archived rows leave, however few
    if count == 0 or (count < max(minimum, len(numbers) // 4) and not eager):
        return 0
    leaving = numbers.filter(removable)
    paths = [path for path, data in files if pc.any(pc.is_in(data["sequence_number"], value_set=leaving)).as_py()]

    def archiving(rows: pa.Table) -> dict[str, int]:
        assert archived is not None and counts is not None
        states = PartitionReader(LOCKS).rows_of(locks, partition, rows["sequence_number"].combine_chunks())
        return archive.archive_leaving(archived, partition, counts, rows, states)

    _rewrite(messages, MESSAGES, partition, paths, leaving, leaving_first=archiving if archived is not None else None)
    return count


def _remove_states(messages: commits.LogView, locks: commits.LogView, partition: int) -> None:
    present = pa.concat_arrays([data["sequence_number"].combine_chunks() for _, data in
                                PartitionReader(MESSAGES, columns=("sequence_number",)).files(messages, partition)]
                               or [pa.array([], pa.int64())])
    files = PartitionReader(LOCKS, columns=("sequence_number", "state")).files(locks, partition)
    leaving = []
    paths = []
    for path, data in files:
        orphaned = pc.and_(pc.is_in(data["state"], value_set=_gone_states()),
                           pc.invert(pc.is_in(data["sequence_number"], value_set=present)))
        if pc.any(orphaned).as_py():
            paths.append(path)
            leaving.append(data["sequence_number"].filter(orphaned).combine_chunks())
    if paths:
        _rewrite(locks, LOCKS, partition, paths, pa.concat_arrays(leaving), only_gone=True)


def _rewrite(view: commits.LogView, schema: pa.Schema, partition: int, paths: list[str], leaving: pa.Array, *,
             only_gone: bool = False,
             leaving_first: Optional[Callable[[pa.Table], dict[str, int]]] = None) -> None:
    """One direct commit replacing the partition's files at paths by one file of their rows without those
    numbered in `leaving` (only_gone: and in a gone state). It claims the files it replaces: appends never
    conflict with it, a commit that rewrote one of them (a settlement, a compaction, another run) does, and
    then this run is skipped. leaving_first: called with the rows that leave before anything is written
    (the archive's commit), it returns the application transactions the commit sets."""
    reader = PartitionReader(schema)
    parts, gone = [], []
    for data in reader.named(view, paths):
        drop = pc.is_in(data["sequence_number"], value_set=leaving)
        if only_gone:
            drop = pc.and_(drop, pc.is_in(data["state"], value_set=_gone_states()))
        parts.append(data.filter(pc.invert(drop)))
        if leaving_first is not None:
            gone.append(data.filter(drop))
    app = leaving_first(reader.with_partition(gone, partition)) if leaving_first is not None else {}
    rows = pa.concat_tables(parts)
    files: list[commits.AddedFile] = []
    try:
        if rows.num_rows:
            files = commits.write_files(view.log, [partition], lambda _: rows)
        done = commits.commit(view.log, view.position, files, paths,
                              commits.Claim({}, frozenset(paths), app_ids=frozenset(app)), app, operation="DELETE")
    except BaseException:
        commits.discard(view.log, files)
        raise
    view.committed(done, files, paths, app)
    maintenance.after_direct_commit(view.log.uri, done.version)


def _gone(locks: commits.LogView, partition: int) -> pa.Array:
    """The sequence numbers of the partition's messages whose state is gone (completed or cancelled: final)."""
    files = PartitionReader(LOCKS, columns=("sequence_number", "state")).files(locks, partition)
    parts = [data["sequence_number"].filter(pc.is_in(data["state"], value_set=_gone_states())).combine_chunks()
             for _, data in files]
    return pa.concat_arrays(parts) if parts else pa.array([], pa.int64())
