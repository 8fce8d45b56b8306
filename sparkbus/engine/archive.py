"""The archive: an entity with archive_retention keeps every message that leaves it (completed, received and
deleted, expired, purged, forwarded, or any of these from its dead-letter sub-queue) in a Delta table of its
own, `archive` beside its other tables, for that long after it left.

A message leaves in two steps: its state row turns gone (final: core.schemas.GONE_STATES says how it left),
then retention (sparkbus.engine.retention) removes its row from the `messages` table. With the archive on,
that removal first writes the archive rows (core.archiving.archive_rows: the message row and its gone state
row, so the same message always makes the same archive row). Delta commits one table at a time, so the
archive commit and the removal are two commits; what makes the pair exactly once, per partition p:

- the archive table's application transaction `p{p}` counts the partition's archive commits (n_a), and
  every archive commit sets it to n_a + 1, claiming it: of two runs that read the same n_a, one commits
  and the other conflicts and is skipped;
- the removal commit sets the messages table's `archived-p{p}` (n_m) to the count whose archive commit it
  follows, and removes the rows of that commit together with any others it archived before.

A run reads both counts first (pending). With n_a == n_m, every archived row has left the messages table
and no row still there is archived: it archives the rows leaving now, then removes them. With n_a > n_m an
archive commit was not followed by its removal (a crash in between, or the removal lost a race): its rows
are still in the messages table and still gone. The run then reads the sequence numbers the archive holds
in the range of the leaving rows, archives only the leaving rows not among them and removes all of them.
A row is archived only by a run that saw it unarchived, and removed only after its archive commit: never
archived twice, never removed unarchived. A crash anywhere leaves the messages the next run finds.

The archive is partitioned by partition_id and the UTC date each message was enqueued (replay and the
Spark source prune by enqueue time); each run writes one file per date it meets. Retention is by the
time a message left: a file whose every row left before now - archive_retention is removed by the
namespace's maintenance (prune), and readers filter the rows of files that are partly past it.
Switching the archive off removes the table (sparkbus.engine.admin.update_entity). The archive does not
count toward the entity's size or quota.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import archiving, sequencing
from ..core.forwarding import fanout_app_id
from ..core.schemas import ARCHIVE, ARCHIVE_DATE, ARCHIVE_ROWS, GONE_STATES, LOCKS, MESSAGES, TABLE_CONFIGURATION
from ..storage import CommitFailedError, DeltaError, commits, location, maintenance
from ..storage.reader import PartitionReader
from .registry import EntityInfo
from . import clock

ROLE = "archive"


def table_uri(tables: dict[str, str]) -> str:
    """Where the archive table of the entity whose tables these are (role -> uri) is: beside them, whether
    or not it exists yet."""
    messages = tables["messages"].rstrip("/")
    return location.join(messages[:messages.rindex("/")], ROLE)


def archive_app(partition: int) -> str:
    """The archive table's application transaction counting the partition's archive commits."""
    return f"p{partition}"


def removed_app(partition: int) -> str:
    """The messages table's application transaction: the count of the archive commit whose rows the
    partition's last removal took out."""
    return f"archived-p{partition}"


def open_view(info: EntityInfo) -> commits.LogView:
    """A log view of the entity's archive table, creating the table when it does not exist yet (a creator
    that loses to another opens the winner's)."""
    uri = table_uri(info.tables)
    if not storage.table_exists(uri):
        try:
            storage.create_table(uri, ARCHIVE, partition_by=("partition_id", ARCHIVE_DATE),
                                 configuration=TABLE_CONFIGURATION[ROLE])
        except (DeltaError, FileExistsError):
            if not storage.table_exists(uri):
                raise
    return commits.LogView(storage.open_table(uri))


@dataclass
class Pending:
    """The two counts of a partition (the module docstring): archived is ahead of removed when an archive
    commit's rows may still be in the messages table."""

    archived: int
    removed: int

    @property
    def behind(self) -> bool:
        return self.archived > self.removed


def pending(archive: commits.LogView, messages: commits.LogView, partition: int) -> Pending:
    """The partition's counts at the views' versions."""
    return Pending(archive.app_version(archive_app(partition)) or 0,
                   messages.app_version(removed_app(partition)) or 0)


def archive_leaving(archive: commits.LogView, partition: int, counts: Pending, leaving: pa.Table,
                    states: pa.Table) -> dict[str, int]:
    """Archive the leaving message rows (MESSAGES, with their gone state rows in `states`) that the archive
    does not hold yet, in one commit claiming the partition's count; returns the application transaction
    the removal of all of them sets. CommitFailedError when another run archived meanwhile."""
    rows = archiving.archive_rows(leaving, states)
    if counts.behind and rows.num_rows:
        numbers = rows["sequence_number"]
        low, high = pc.min(numbers).as_py(), pc.max(numbers).as_py()
        held = [data["sequence_number"].combine_chunks() for _, data in
                PartitionReader(ARCHIVE_ROWS, columns=("sequence_number",)).files(archive, partition, low, high)]
        if held:
            rows = rows.filter(pc.invert(pc.is_in(numbers, value_set=pa.concat_arrays(held))))
    count = counts.archived
    if rows.num_rows:
        count += 1
        files: list[commits.AddedFile] = []
        app = {archive_app(partition): count}
        try:
            for date, part in archiving.by_date(rows).items():  # one file per date
                files.append(commits.write_file(archive.log, partition, part, compress=True,
                                                values=((ARCHIVE_DATE, date),)))
            done = commits.commit(archive.log, archive.position, files, [],
                                  commits.Claim({}, app_ids=frozenset(app)), app, operation="WRITE")
        except BaseException:
            commits.discard(archive.log, files)
            raise
        archive.committed(done, files, [], app)
        maintenance.after_direct_commit(archive.log.uri, done.version)
    return {removed_app(partition): count}


@dataclass(frozen=True)
class Held:
    """What an archive holds: its rows and their stored size (past-retention rows included until
    maintenance removes their files)."""

    messages: int = 0
    size_in_bytes: int = 0


def held(tables: dict[str, str]) -> Held:
    """What the archive of the entity whose tables these are holds (nothing when it has none): the files
    the namespace's sweep moved there (messages leave for the archive within a sweep)."""
    uri = table_uri(tables)
    if not storage.table_exists(uri):
        return Held()
    view = commits.LogView(storage.open_table(uri))
    files = [f for p in view.partitions() for f in view.files(p)]
    return Held(sum(f.rows for f in files), sum(f.size for f in files))


def prune(info: EntityInfo) -> int:
    """The archive's maintenance: remove its files whose every row is past the retention. Returns the
    files removed (0 after a lost race: the next run again)."""
    uri = table_uri(info.tables)
    retention: Optional[timedelta] = info.options.archive_retention
    if retention is None or not storage.table_exists(uri):
        return 0
    table = storage.open_table(uri)
    actions = pa.table(table.get_add_actions(flatten=True))
    if not actions.num_rows:
        return 0
    latest = actions["max.left_time"] if "max.left_time" in actions.column_names else pa.nulls(actions.num_rows)
    since = archiving.kept_since(clock.now(), retention)
    expired = actions["path"].filter(archiving.files_expired(latest, since)).to_pylist()
    if not expired:
        return 0
    try:
        done = commits.commit(commits.TableLog.of(table), commits.position_of(table), [], expired,
                              commits.Claim({}, frozenset(expired)), operation="DELETE")
    except CommitFailedError:
        return 0
    maintenance.after_direct_commit(uri, done.version)
    return len(expired)


def files(info: EntityInfo, start: datetime, end: Optional[datetime] = None) -> dict[int, list[str]]:
    """The archive's data files (paths as in its log) that may hold messages enqueued in [start, end), by
    partition: those filed under the dates the range spans (none when the entity has no archive table)."""
    uri = table_uri(info.tables)
    if not storage.table_exists(uri):
        return {}
    view = commits.LogView(storage.open_table(uri))
    dates = archiving.date_range(start, end)
    found = {p: [f.path for f in view.files(p) if dates.holds(dict(f.values).get(ARCHIVE_DATE))]
             for p in view.partitions()}
    return {p: paths for p, paths in found.items() if paths}


def rows(info: EntityInfo, partition: int, paths: list[str], start: datetime, end: Optional[datetime] = None) -> pa.Table:
    """The archive rows (ARCHIVE_ROWS) of one partition's messages enqueued in [start, end) that left the
    entity and are within retention, in sequence-number (enqueue) order: those of the archive files at paths
    (files() chooses them), and of messages that left but whose rows stay in the messages table (retention
    keeps a partition's highest sequence number, and duplicate detection its window: see
    sparkbus.engine.retention), read from there as their archive rows will be."""
    reader = PartitionReader(ARCHIVE_ROWS)
    archived = ARCHIVE_ROWS.empty_table()
    if paths:
        view = commits.LogView(storage.open_table(table_uri(info.tables)))
        archived = reader.with_partition(reader.named(view, paths), partition)
    locks = commits.LogView(storage.open_table(info.tables["locks"]))  # before messages: see retention
    messages = commits.LogView(storage.open_table(info.tables["messages"]))
    staying = _staying_in_topic(messages, partition) if info.kind == "topic" else _staying(messages, locks, partition)
    if staying.num_rows and archived.num_rows:
        staying = staying.filter(pc.invert(pc.is_in(staying["sequence_number"], value_set=archived["sequence_number"])))
    since = archiving.kept_since(clock.now(), info.options.archive_retention) \
        if info.options.archive_retention is not None else None
    found = archiving.within_retention(archiving.enqueued_within(pa.concat_tables([archived, staying]), start, end),
                                       since)
    return found.take(pc.sort_indices(found["sequence_number"]))


def read(info: EntityInfo, start: datetime, end: Optional[datetime] = None) -> Iterator[pa.Table]:
    """rows() of every partition that has some, in partition order."""
    chosen = files(info, start, end)
    for partition in range(info.partition_count):
        found = rows(info, partition, chosen.get(partition, []), start, end)
        if found.num_rows:
            yield found


def _staying(messages: commits.LogView, locks: commits.LogView, partition: int) -> pa.Table:
    """The archive rows of the partition's messages that left and whose rows are still in the messages
    table."""
    states = PartitionReader(LOCKS).rows(locks, partition)
    states = states.filter(pc.is_in(states["state"], value_set=pa.array(GONE_STATES, pa.string())))
    if not states.num_rows:
        return ARCHIVE_ROWS.empty_table()
    numbers = states["sequence_number"]
    reader = PartitionReader(MESSAGES)
    parts = [data.filter(pc.is_in(data["sequence_number"], value_set=numbers))
             for _, data in reader.files(messages, partition, pc.min(numbers).as_py(), pc.max(numbers).as_py())]
    rows = reader.with_partition(parts, partition)
    if not rows.num_rows:
        return ARCHIVE_ROWS.empty_table()
    return archiving.archive_rows(rows, states.filter(pc.is_in(numbers, value_set=rows["sequence_number"])))


def _staying_in_topic(messages: commits.LogView, partition: int) -> pa.Table:
    """The archive rows of a topic partition's messages fanned out whose rows are still in its messages
    table (the partition's highest: sparkbus.engine.fanout.advance_topic)."""
    cursor = messages.app_version(fanout_app_id(partition))
    if not cursor:
        return ARCHIVE_ROWS.empty_table()
    last = sequencing.compose(partition, cursor)
    reader = PartitionReader(MESSAGES)
    rows = reader.with_partition([data for _, data in reader.files(messages, partition, sequencing.compose(partition, 0),
                                                                   last)], partition)
    rows = rows.filter(pc.and_(pc.less_equal(rows["sequence_number"], last),
                               pc.is_null(rows["scheduled_enqueue_time_utc"])))
    if not rows.num_rows:
        return ARCHIVE_ROWS.empty_table()
    return archiving.archive_rows(rows, archiving.fanned_out_states(rows, clock.now()))
