"""Direct Delta commits: the hot paths write their data files and log entry themselves.

Why: a one-row conditional commit through delta-rs (`write_deltalake` with a predicate) costs 8-17 ms of
CPU on this machine, most of it planning and conflict resolution that a send or a settlement does not
need: the caller already knows which rows it writes and which region of the table it read. Written here,
the same commit is a Parquet file, one JSON log entry and their fsyncs (about 3 ms).

Protocol (Delta's optimistic concurrency, the same log delta-rs writes): version N is the log entry
`N.json`, created only if absent (on local disk a file written unnamed, or under a temporary name, then
hard-linked to its name, which fails when the name exists: _Staged; an object-store PUT with
If-None-Match). delta-rs creates entries only if absent too, so its commits (maintenance, MERGE, table
creation) and these interleave in one log. When version N is taken, its actions are read and checked
against the commit's `Claim` (what the caller read and relies on):

- any metaData or protocol action conflicts (the schema or the rules of the table changed);
- removing a file the commit also removes conflicts (someone rewrote the rows it read);
- adding a file in a claimed partition whose sequence-number range overlaps the claimed range conflicts
  (someone wrote rows the commit's decision depended on), and a file without statistics counts as
  overlapping;
- setting an application transaction id the commit also sets conflicts.

A conflict raises delta-rs' CommitFailedError, so callers re-plan exactly as after a delta-rs conflict;
otherwise the commit tries N+1. The skipped entries are returned: they are what the caller's cached view
of the table is missing.

Staleness: log cleanup deletes entries older than the table's log retention below the latest checkpoint.
An entry after the caller's base version was created after the caller learned that version (it was the
latest then), so none can have been cleaned up while less than the retention has passed since: a
`Position` older than half the retention is refused (CommitFailedError, "stale"), and the caller reopens
the table. Without that, an entry that existed and was cleaned up would be created again.

Durability (local files): before the log entry is linked into place, the data files, the partition
directories naming them and the entry's staged file are fsynced (storage.fsync_together: a one-file
commit's three in a row in the calling thread, more of them concurrently, which a journalling file system
such as ext4 commits together); the log directory naming the entry is fsynced after the link, before
the commit returns. The staged entry is written once and linked again at the next version when one is
taken. A PUT to an object store is durable when it returns.

Contention (object stores). A commit that loses version N pays its PUT's round trip, then a read of N
(and of the entries after it) before it can try N+1. On a log where a commit of this process lost a race
in the last CONTENDED_SECONDS, the entry at N is read beside the PUT, so a lost race costs the PUT's round
trip alone when that read finds the winner (read before the winner's PUT landed, it finds nothing and N is
read again). The data files' PUTs of such a commit go out beside a read of the entries written since its
base (tail_ahead), so its first entry PUT aims past them instead of losing to each in turn: a writer
whose view is k versions behind pays one round of reads that overlaps its data-file round trip, not k
lost PUTs. A log without contention pays no extra request. Every entry names its commit
(commitInfo.txnId): a store client that retried a conditional PUT whose first attempt had landed finds the
entry its own, and the commit succeeds instead of taking it for a lost race (and discarding files that a
committed entry names).

A removed table (its entity deleted) is never created again by a commit: on local disk a data file's
partition directory is made only inside the existing table directory, and a missing log directory fails
the commit with TableRemovedError, which no retry mends (a missing log *entry* is an expired-version race,
retried). An object store has no directories, so there a commit to a removed table succeeds; the layer
that knows which tables are current checks afterwards and removes what was written (sparkbus.engine.registry).
"""
from __future__ import annotations

import concurrent.futures
import copy
import errno
import functools
import json
import math
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Iterable, Optional, TypeVar, Union
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from ..core.records import EPOCH, stored_int64s
from ..core.sequencing import high_water_marks
from . import (PARTITION_COLUMN, Started, concurrently, fsync_file, fsync_together, durable, pool as storage_pool, local_root, refresh,
               set_read_at,
               transaction_version as _transaction_version,
               location, open_table, read_at)
from . import fetched, requests, small_files, spares
from .errors import guarded

ENGINE = "sparkbus"
# Rows up to this many bytes of Arrow buffers are encoded in memory and written into a file made ahead with
# one write: through pyarrow's own file, opened again by its /proc/self/fd name, making and writing a one-row
# file took 262-272 us in a loop, written at once 61-66 us; larger ones (compaction, bulk sends) are encoded
# straight into the file.
BUFFERED_WRITE = 4 << 20
T = TypeVar("T")
_DEFAULT_RETENTION = timedelta(days=30)  # Delta's default delta.logRetentionDuration
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(\w+?)s?\s*$", re.IGNORECASE)
_PARTITION_PATH = re.compile(rf"{PARTITION_COLUMN}(?:=|%3D)(\d+)/")
_UNITS = {"microsecond": 1e-6, "millisecond": 1e-3, "second": 1, "minute": 60, "hour": 3600, "day": 86400,
          "week": 604800}


@dataclass(frozen=True)
class AddedFile:
    """An add action: a data file of one partition, with the statistics conflicts and caches use."""

    path: str  # relative to the table root, as in the log
    partition: int
    size: int
    rows: int
    low: dict[str, Any] = field(default_factory=dict)   # column -> min, as in the statistics JSON
    high: dict[str, Any] = field(default_factory=dict)  # column -> max
    stats: str = ""                           # the add action's statistics JSON
    # values of the table's other partition columns (an archive's date), as (column, value) pairs
    values: tuple[tuple[str, str], ...] = ()

    def sequence_range(self) -> tuple[float, float]:
        """(min, max) sequence number, unbounded when the file carries no statistics for it."""
        return (self.low.get("sequence_number", -math.inf), self.high.get("sequence_number", math.inf))


@dataclass
class Entry:
    """One log entry's actions, as far as conflicts and cached views care."""

    version: int
    added: list[AddedFile] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)
    app_ids: dict[str, int] = field(default_factory=dict)
    table_changed: bool = False  # a metaData or protocol action
    timestamp: Optional[int] = None  # the commitInfo's, in ms since the epoch
    operation: Optional[str] = None  # the commitInfo's (WRITE, MERGE, DELETE, OPTIMIZE...)
    txn_id: Optional[str] = None  # the commitInfo's txnId: which commit wrote the entry

    def partitions(self) -> Optional[set[int]]:
        """The partitions whose files the entry adds or removes; None when a removed path names none."""
        found = [_PARTITION_PATH.match(path) for path in self.removed]
        if not all(found):
            return None
        return {a.partition for a in self.added} | {int(m.group(1)) for m in found if m}


@dataclass(frozen=True)
class Claim:
    """What a commit read: per partition the sequence-number range no concurrent file may overlap, the
    files it removes (it read them), and its application transaction ids."""

    ranges: dict[int, tuple[float, float]]
    removed: frozenset[str] = frozenset()
    app_ids: frozenset[str] = frozenset()

    def conflict(self, entry: Entry) -> Optional[str]:
        """Why entry conflicts with this claim, or None."""
        if entry.table_changed:
            return "the table's metadata changed"
        if self.removed & entry.removed:
            return "files this commit rewrites were rewritten"
        if self.app_ids & entry.app_ids.keys():
            return "the same application transaction was committed"
        for added in entry.added:
            claimed = self.ranges.get(added.partition)
            if claimed is not None:
                low, high = added.sequence_range()
                if low <= claimed[1] and high >= claimed[0]:
                    return f"rows of partition {added.partition} it read were written"
        return None


@dataclass(frozen=True)
class TableLog:
    """One table's log as direct commits need it: where it is, which columns carry statistics, how long a
    known version stays safe to commit after, and the file size compaction merges up to (None: not set)."""

    uri: str
    stats_columns: tuple[str, ...]
    safe_seconds: float
    target_file_size: Optional[int] = None

    @classmethod
    def of(cls, table: DeltaTable) -> "TableLog":
        """The log of a sparkbus table (protocol writer version 2 or lower: no writer features to honour)."""
        protocol = table.protocol()
        if protocol.min_writer_version > 2:
            raise ValueError(f"{table.table_uri}: writer version {protocol.min_writer_version} tables are not "
                             "written directly (sparkbus creates version 2 tables)")
        configuration = table.metadata().configuration
        columns = configuration.get("delta.dataSkippingStatsColumns")
        stats = tuple(c.strip() for c in columns.split(",")) if columns else \
            tuple(f.name for f in pa.schema(table.schema().to_arrow()) if f.name != PARTITION_COLUMN)[:32]
        retention = _retention(configuration.get("delta.logRetentionDuration"))
        uri = local_root(table.table_uri) or table.table_uri
        target = configuration.get("delta.targetFileSize")
        return cls(uri.rstrip("/"), stats, retention.total_seconds() / 2, int(target) if target else None)

    @property
    def log_dir(self) -> str:
        return location.join(self.uri, "_delta_log")

    def entry_uri(self, version: int) -> str:
        return entry_uri(self.uri, version)


def entry_uri(table_uri: str, version: int) -> str:
    """Where version's log entry of the table at table_uri is (whether or not it exists)."""
    return location.join(table_uri, "_delta_log", f"{version:020d}.json")


def has_version(table_uri: str, version: int) -> bool:
    """Whether the table at table_uri has a log entry for version: one read (or look), no listing. Log cleanup
    removes entries older than the table's log retention, so ask about the version after one read recently
    (then it exists once the table reached it). On local disk a look at the name (an entry is linked
    whole): the read cost an incarnation's confirm, three to a receive + complete, 30-70 us each."""
    target = entry_uri(table_uri, version)
    if location.is_local(target):
        return os.path.exists(target)
    try:
        location.get(target)
    except FileNotFoundError:
        return False
    return True


def refresh_if_moved(table: DeltaTable) -> DeltaTable:
    """The table at its latest version, like storage.refresh, but when the table object was read within its
    log's safe time (TableLog.safe_seconds: no entry after its version can have been cleaned up since) first
    one read of the next version's entry (a single GET on an object store, where refresh lists the log and
    reads its checkpoint pointer): when there is none, the object is already at the latest version."""
    started = time.monotonic()
    if started - read_at(table) < TableLog.of(table).safe_seconds:
        root = local_root(table.table_uri) or table.table_uri.rstrip("/")
        if not has_version(root, table.version() + 1):
            set_read_at(table, started)
            return table
    return refresh(table)


class TableRemovedError(OSError):
    """The table's directory or log directory does not exist: the table was removed (its entity deleted)."""


@dataclass(frozen=True)
class Position:
    """A version known to have been the table's latest at monotonic time known_at (or later)."""

    version: int
    known_at: float


@dataclass
class Committed:
    """The version a commit became, and the other writers' entries between the base and it."""

    version: int
    skipped: list[Entry]
    position: Position


def position_of(table: DeltaTable) -> Position:
    """The position of a table object opened or refreshed by sparkbus.storage (unknown ones are stale)."""
    return Position(table.version(), read_at(table))


class LogView:
    """A table's live data files at a version, followed by reading the log entries after it.

    delta-rs' update_incremental took 3-9 ms per call on a busy queue (it lists the log directory and
    rebuilds its snapshot); the entries written since the last call are usually one or two, a few hundred
    bytes each. advance() reads them in order until the next version does not exist: then the view is at
    the latest version as of that probe (its Position). A view whose position is older than half the log
    retention, or an entry that changes the table's metadata, is seeded again from delta-rs, since
    entries it has not read may have been cleaned up meanwhile. Not thread-safe: one per user.
    """

    def __init__(self, table: DeltaTable) -> None:
        self._seed(table)

    def _seed(self, table: DeltaTable) -> None:
        self.log = TableLog.of(table)  # read again: the table's settings may have changed
        self.position = position_of(table)
        self._seeded = table
        self._app_ids: dict[str, Optional[int]] = {}  # app transactions known: read from the seed, then followed
        self._last_commit_ms: Optional[int] = None
        # partition -> when (monotonic) an entry this view read from the log, another writer's, last added
        # files there (a view's own commits reach it through committed, never through the log)
        self.others_at: dict[int, float] = getattr(self, "others_at", {})
        # DELETE commits applied (retention's), and seeds, which may have skipped some: storage.followed.advance_pair
        self.deletes = getattr(self, "deletes", -1) + 1
        actions = pa.table(table.get_add_actions(flatten=True))
        columns = [actions[c].to_pylist() if c in actions.column_names else [None] * actions.num_rows
                   for c in ("path", f"partition.{PARTITION_COLUMN}", "size_bytes", "num_records",
                             "min.sequence_number", "max.sequence_number")]
        others = [c for c in actions.column_names
                  if c.startswith("partition.") and c != f"partition.{PARTITION_COLUMN}"]
        values = list(zip(*(actions[c].cast(pa.string()).to_pylist() for c in others))) if others else None
        self._files: dict[str, AddedFile] = {}
        # the same files by partition (each in the order added): a receive asks for sixteen partitions' files
        self._partitions: dict[int, dict[str, AddedFile]] = {}
        for i, (path, partition, size, rows, low, high) in enumerate(zip(*columns)):
            self._add(AddedFile(path, int(partition), size or 0, rows or 0,
                                {} if low is None else {"sequence_number": low},
                                {} if high is None else {"sequence_number": high},
                                values=() if values is None else
                                tuple((c[len("partition."):], v) for c, v in zip(others, values[i]))))

    def _add(self, added: AddedFile) -> None:
        self._files[added.path] = added
        self._partitions.setdefault(added.partition, {})[added.path] = added

    def _remove(self, path: str) -> None:
        gone = self._files.pop(path, None)
        if gone is not None:
            files = self._partitions[gone.partition]
            del files[path]
            if not files:
                del self._partitions[gone.partition]

    @property
    def version(self) -> int:
        return self.position.version

    def arrow_schema(self) -> pa.Schema:
        """The table's schema (partition columns included) as of the view's seed: an entry that changes it
        seeds the view again."""
        return pa.schema(self._seeded.schema().to_arrow())

    def partition_columns(self) -> list[str]:
        """The table's partition columns, as of the view's seed."""
        return list(self._seeded.metadata().partition_columns)

    def copy(self) -> "LogView":
        """Another view at the same version, following the log on its own from there."""
        twin = copy.copy(self)
        twin._files = dict(self._files)
        twin._partitions = {partition: dict(files) for partition, files in self._partitions.items()}
        twin._app_ids = dict(self._app_ids)
        twin.others_at = dict(self.others_at)
        return twin

    def advance(self) -> "LogView":
        """Bring the view to the table's latest version; returns itself. On an object store the next
        entries are asked for a few at once (read_entries): one round of requests when at most one was
        written since."""
        while True:
            if time.monotonic() - self.position.known_at > self.log.safe_seconds:
                self._seed(open_table(self.log.uri))
                continue
            entries, started = read_entries(self.log, self.version + 1)
            changed = False
            for entry in entries:
                if entry.table_changed:
                    changed = True
                    break
                self._apply_others(entry)
            if changed:
                self._seed(open_table(self.log.uri))
                continue
            self.position = Position(self.version, started)
            return self

    def apply(self, entry: Entry, position: Position) -> None:
        """Apply the entry that made version position.version (the next one)."""
        for path in entry.removed:
            self._remove(path)
        for added in entry.added:
            self._remove(added.path)
            self._add(added)
        for app, version in entry.app_ids.items():
            self._app_ids[app] = version
        if entry.timestamp is not None:
            self._last_commit_ms = entry.timestamp
        if entry.operation == "DELETE":
            self.deletes += 1
        self.position = position

    def _apply_others(self, entry: Entry) -> None:
        """apply another writer's entry (the next version), noting the partitions it wrote (others_at)."""
        now = time.monotonic()
        for added in entry.added:
            self.others_at[added.partition] = now
        self.apply(entry, Position(entry.version, self.position.known_at))

    def app_version(self, app_id: str) -> Optional[int]:
        """The version of application transaction app_id at the view's version (None: never set); read
        from the log once, then followed."""
        if app_id not in self._app_ids:
            self._app_ids[app_id] = _transaction_version(self._seeded, app_id)
        return self._app_ids[app_id]

    def app_versions(self, app_ids: Iterable[str]) -> dict[str, Optional[int]]:
        """app_version of each of app_ids, those not known yet read together (app_versions of the seed:
        no entry followed since set them, so the seed's version is theirs)."""
        wanted = list(app_ids)
        unknown = [app for app in wanted if app not in self._app_ids]
        if unknown:
            self._app_ids.update(app_versions(self._seeded, unknown))
        return {app: self._app_ids[app] for app in wanted}

    def high_water_marks(self) -> dict[int, int]:
        """Per partition: the highest n of its sequence numbers (sparkbus.core.sequencing) among the live
        files' statistics; partitions without rows are absent."""
        return high_water_marks((f.partition, f.high.get("sequence_number")) for f in self._files.values() if f.rows)

    def last_commit_ms(self) -> Optional[int]:
        """The timestamp of the view's latest version (read once after a seed, then followed)."""
        if self._last_commit_ms is None:
            entry = read_entry(self.log, self.version) if self.version >= 0 else None
            self._last_commit_ms = entry.timestamp if entry is not None else None
        return self._last_commit_ms

    def committed(self, done: "Committed", added: list[AddedFile], removed: Iterable[str],
                  app_transactions: Optional[dict[str, int]] = None) -> None:
        """Apply this view's own commit and the entries it skipped over."""
        for entry in done.skipped:
            self._apply_others(entry)
        self.apply(Entry(done.version, list(added), set(removed), dict(app_transactions or {}),
                         timestamp=int(time.time() * 1000)), done.position)

    def partitions(self) -> set[int]:
        """The partitions that have live files."""
        return set(self._partitions)

    def files_key(self, partition: int) -> tuple[str, ...]:
        """The paths of the partition's live files, in the order added: equal for two versions of a view
        exactly when the partition's rows are the same (data files never change)."""
        return tuple(self._partitions.get(partition, ()))

    def files(self, partition: int, low: Optional[int] = None, high: Optional[int] = None) -> list[AddedFile]:
        """The partition's live files, in the order they were added; only those whose sequence-number
        range overlaps [low, high] when given (a file without statistics always does)."""
        found = list(self._partitions.get(partition, {}).values())
        if low is None or high is None:
            return found
        return [f for f in found if f.sequence_range()[0] <= high and f.sequence_range()[1] >= low]


def parquet_options(log: TableLog, *, compress: bool) -> dict[str, Any]:
    """How a data file is encoded. A queue's file lives until its messages are settled and retention
    removes it, so the hot paths write for speed: no compression and no dictionaries (on this machine
    snappy and dictionaries took a third of a one-row file's encoding and most of a 1,000-row one's),
    Parquet statistics only for the columns the log keeps statistics of, and no copy of
    the Arrow schema (the Parquet types read back as the table's schema). compress: what compaction
    writes, the files that linger, is compressed (snappy, as delta-rs writes). A file of a few rows is
    encoded the same way without pyarrow's writer (storage.small_files)."""
    return {"compression": "snappy" if compress else "none", "use_dictionary": compress,
            "write_statistics": list(log.stats_columns), "store_schema": False}


def write_file(log: TableLog, partition: int, data: pa.Table, *, compress: bool = False,
               values: tuple[tuple[str, str], ...] = ()) -> AddedFile:
    """Write one partition's rows (the table schema without the partition column) as a new data file
    (encoded as parquet_options says; a few rows, uncompressed, by storage.small_files); the file is part
    of the table only once a commit names it, and commit() makes it durable first (on an object store it
    is durable on return). values: the file's values of the table's other partition columns (its
    directories below the partition's, in order)."""
    directory = "/".join([f"{PARTITION_COLUMN}={partition}", *(f"{k}={v}" for k, v in values)])
    relative = f"{directory}/part-00000-{uuid.uuid4()}-c000.{'snappy.' if compress else ''}parquet"
    target = location.join(log.uri, relative)
    options = parquet_options(log, compress=compress)
    data = _without_empty_columns(data)
    small = None if compress else small_files.encoded(data, log.stats_columns)
    if location.is_local(target):
        size = _written_ahead(target, data, options, small)
        if size is None:
            try:
                opened = pa.OSFile(target, "wb")  # native writes (a Python file object costs 2x on 1 GB)
            except FileNotFoundError:  # the partition's first file (or its table was removed)
                chain = [os.path.dirname(target)]
                for _ in values:
                    chain.append(os.path.dirname(chain[-1]))
                for made in reversed(chain):
                    _partition_directory(made)
                opened = pa.OSFile(target, "wb")
            with opened as sink:
                if small is not None:
                    sink.write(small)
                else:
                    pq.write_table(data, sink, **options)
                size = sink.tell()
    else:
        if small is not None:
            payload = small
        else:
            sink = pa.BufferOutputStream()
            pq.write_table(data, sink, **options)
            payload = sink.getvalue().to_pybytes()
        location.put(target, payload)
        fetched.written(target, payload)
        size = len(payload)
    fetched.wrote_rows(target, data)
    low, high, stats = _statistics(data, log.stats_columns)
    return AddedFile(quote(relative, safe="/="), partition, size, data.num_rows, low, high, stats, values)


def adopt(log: TableLog, partition: int, source: str) -> str:
    """Move a data file written elsewhere on this file system (storage.unnumbered: a bulk send's executor
    wrote it) into the partition's directory under a new data file's name; its path relative to the table,
    as a log names it. Like write_file's files, it is part of the table only once a commit names it
    (commit fsyncs it and its directory first). A file on another file system is copied."""
    directory = f"{PARTITION_COLUMN}={partition}"
    relative = f"{directory}/part-00000-{uuid.uuid4()}-c000.parquet"
    target = location.join(log.uri, relative)
    if not location.is_local(target):
        raise ValueError(f"{log.uri}: files are adopted into local tables only")
    _partition_directory(os.path.dirname(target))
    try:
        os.rename(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target)
        os.remove(source)
    return quote(relative, safe="/=")


def added_file(log: TableLog, partition: int, relative: str) -> AddedFile:
    """The add action of a data file already in the table's directory (adopt), its statistics read from
    the file's stats columns."""
    path = location.join(log.uri, unquote(relative))
    file = pq.ParquetFile(path)
    present = set(file.schema_arrow.names)
    data = file.read(columns=[c for c in log.stats_columns if c in present])
    low, high, stats = _statistics(data, log.stats_columns)
    return AddedFile(relative, partition, os.path.getsize(path), file.metadata.num_rows, low, high, stats, ())


def _written_ahead(target: str, data: pa.Table, options: dict[str, Any], small: Optional[bytes]) -> Optional[int]:
    """data written as Parquet to target in an unnamed file made ahead in target's directory (spares), then
    linked to target: its size; None when no file was ready or the directory is gone (the caller writes
    target itself, and reports a removed table). small: data's file, when storage.small_files encoded it."""
    spare = spares.take(os.path.dirname(target))
    if spare is None:
        return None
    try:
        try:
            if small is not None:
                size = _write_all(spare, small)
            elif data.get_total_buffer_size() <= BUFFERED_WRITE:
                sink = pa.BufferOutputStream()
                pq.write_table(data, sink, **options)
                size = _write_all(spare, sink.getvalue())
            else:
                with pa.OSFile(f"/proc/self/fd/{spare}", "wb") as native:  # the same file, opened natively
                    pq.write_table(data, native, **options)
                    size = native.tell()
        except OSError as error:  # named by target (whose directory names the partition), not the descriptor
            raise OSError(error.errno, error.strerror or str(error), target) from error
        return size if spares.link(spare, target) else None
    finally:
        os.close(spare)


def _write_all(descriptor: int, content: "pa.Buffer | bytes") -> int:
    """content written to the file open at descriptor; its length."""
    view = memoryview(content)
    while view:
        view = view[os.write(descriptor, view):]
    return len(content)


def _without_empty_columns(data: pa.Table) -> pa.Table:
    """data without its nullable columns that are null in every row. Delta readers (delta-rs, Spark and
    PartitionReader) read a column a file lacks as null, as they read files written before the column
    was added; a single send's row leaves most of its 23 columns empty, and writing 9 instead of 23
    halved its encoding."""
    rows, schema = len(data), data.schema
    kept = [i for i, column in enumerate(data.columns) if column.null_count < rows or not schema.field(i).nullable]
    return data.select(kept) if rows and len(kept) < data.num_columns else data  # (select: drop_columns took 30x)


def _partition_directory(directory: str) -> None:
    """Make a partition's directory inside its table's, which must exist (TableRemovedError otherwise: a
    write must not create the directory of a removed table again)."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        pass
    except FileNotFoundError as error:
        raise TableRemovedError(f"{os.path.dirname(directory)}: the table's directory does not exist") from error


def write_files(log: TableLog, partitions: list[int], rows_of: Callable[[int], pa.Table], *,
                compress: bool = False) -> list[AddedFile]:
    """write_file(log, p, rows_of(p), compress=compress) for each partition (rows_of is called when its file
    is written), in that order. Several files are written concurrently (Parquet encoding and uploads
    release the GIL): on an object store up to 8 PUTs at once (in a row, a send to 16 partitions paid 16
    round trips), on a local disk one per core (a bulk send then holds that many partitions' copies at a
    time). If one fails, the files already written are deleted and the error raised."""
    if len(partitions) < 2:
        return [write_file(log, p, rows_of(p), compress=compress) for p in partitions]
    pool = (storage_pool("write", min(4, os.cpu_count() or 1)) if location.is_local(log.uri)
            else storage_pool("upload", 8))
    def written(p: int) -> Callable[[], tuple[AddedFile, int]]:
        return requests.branch(lambda: write_file(log, p, rows_of(p), compress=compress))

    futures: list[concurrent.futures.Future[tuple[AddedFile, int]]] = []
    try:
        for p in partitions:
            futures.append(pool.submit(written(p)))
    except RuntimeError:  # the interpreter is exiting (an atexit hook's send): the rest in this thread
        futures += [_done(written(p)) for p in partitions[len(futures):]]
    concurrent.futures.wait(futures)
    failed = [error for f in futures if (error := f.exception()) is not None]
    if failed:
        discard(log, [f.result()[0] for f in futures if f.exception() is None])
        raise failed[0]
    requests.joined([f.result()[1] for f in futures])
    return [f.result()[0] for f in futures]


def _done(call: Callable[[], T]) -> concurrent.futures.Future[T]:
    """call() run in this thread, as a completed future (its result or its exception)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    try:
        future.set_result(call())
    except Exception as error:
        future.set_exception(error)
    return future


def discard(log: TableLog, files: Iterable[AddedFile]) -> None:
    """Delete data files a failed commit wrote (best effort: an unreferenced file harms nothing)."""
    discard_paths(log, [added.path for added in files])


def discard_paths(log: TableLog, paths: Iterable[str]) -> None:
    """discard, of data files named by their paths relative to the table (as a log names them, adopt)."""
    for path in paths:
        try:
            location.remove(location.join(log.uri, unquote(path)))
        except OSError:
            pass


@dataclass
class Outcomes:
    """What this process's direct commits to one log met: commits made, versions taken first by another
    writer (the commit then tried the next one, its claim unharmed) and commits refused (CommitFailedError,
    a conflict or a stale base: the caller re-plans). What a benchmark or an operator reads to see what
    writers of one table fight over; counted under a lock, so threads' commits are all counted."""

    committed: int = 0
    versions_lost: int = 0
    refused: int = 0


_outcomes: dict[str, Outcomes] = {}
_counting = threading.Lock()


def outcomes(table_uri: str) -> Outcomes:
    """A copy of the counts of this process's direct commits to the table at table_uri (zeros before any)."""
    with _counting:
        return replace(_outcomes.get(table_uri) or Outcomes())


def _count(log: TableLog, *, committed: int = 0, versions_lost: int = 0, refused: int = 0) -> None:
    with _counting:
        counts = _outcomes.setdefault(log.uri, Outcomes())
        counts.committed += committed
        counts.versions_lost += versions_lost
        counts.refused += refused


def tail_ahead(log: TableLog, base: Position) -> "Optional[Started[tuple[list[Entry], float]]]":
    """On an object-store log contended lately (see Contention), the entries after base, read from now on
    (started before the commit's data files are written, and handed to commit as `ahead`); None elsewhere."""
    if location.is_local(log.uri) or time.monotonic() - _lost_at.get(log.uri, -math.inf) >= CONTENDED_SECONDS:
        return None
    return Started(functools.partial(read_entries, log, base.version + 1), "tail")


def commit(log: TableLog, base: Position, added: list[AddedFile], removed: Iterable[str], claim: Claim,
           app_transactions: Optional[dict[str, int]] = None, operation: str = "WRITE", *,
           data_change: bool = True,
           ahead: "Optional[Started[tuple[list[Entry], float]]]" = None) -> Committed:
    """Commit the files at the first free version after base, checking every entry in between against
    claim; the files and the entry are durable when it returns (see Durability in the module docstring).
    data_change=False marks a rewrite of the same rows (compaction): Delta streams skip its files.
    ahead: the entries after base as tail_ahead reads them, checked first (the first PUT aims past them).
    Raises CommitFailedError on a conflict or a stale base (nothing committed; the caller discards its
    files and re-plans), TableRemovedError when the table's directories are gone."""
    txn_id = uuid.uuid4().hex
    payload = _entry_payload(added, list(removed), app_transactions or {}, operation, data_change, txn_id)
    staged = _stage(log, added, payload)
    try:
        done = _committed(log, base, claim, staged, payload, txn_id, ahead)
    except CommitFailedError:
        _count(log, refused=1)
        raise
    finally:
        if staged is not None:
            staged.close()
    _count(log, committed=1)
    return done


def _committed(log: TableLog, base: Position, claim: Claim, staged: Optional[_Staged], payload: bytes, txn_id: str,
               ahead: "Optional[Started[tuple[list[Entry], float]]]") -> Committed:
    """commit's versions tried in turn, from the first free one after base (see commit)."""
    skipped = _checked(log, claim, ahead.result()[0]) if ahead is not None else []
    version = base.version + 1 + len(skipped)
    while True:
        started = time.monotonic()
        if started - base.known_at > log.safe_seconds:  # checked for every version tried (see the docstring)
            raise CommitFailedError(f"{log.uri}: stale snapshot: version {base.version} was read more than "
                                    f"{log.safe_seconds:.0f} s ago and later log entries may be cleaned up")
        target = log.entry_uri(version)
        beside: Optional[Started[Optional[Entry]]] = None
        if staged is None and started - _lost_at.get(log.uri, -math.inf) < CONTENDED_SECONDS:
            beside = Started(functools.partial(read_entry, log, version), "entries")  # see Contention
        if (staged.link(target) if staged is not None else create_entry(target, payload)):
            return Committed(version, skipped, Position(version, started))
        _count(log, versions_lost=1)
        if staged is None:
            _lost_at[log.uri] = time.monotonic()
        winner = beside.result() if beside is not None else None
        # the winner read beside the PUT (None: read before it landed), or it and any written after it
        taken = [winner] if winner is not None else read_entries(log, version)[0]
        if not taken:  # taken and then cleaned up: this position is older than it looked
            raise CommitFailedError(f"{log.uri}: stale snapshot: version {version} is gone from the log")
        if taken[0].txn_id == txn_id:  # ours: a PUT the client retried after its first one had landed
            return Committed(version, skipped, Position(version, started))
        skipped += _checked(log, claim, taken)
        version = taken[-1].version + 1


def _checked(log: TableLog, claim: Claim, entries: list[Entry]) -> list[Entry]:
    """entries, written by others after the commit's base: CommitFailedError at the first the claim
    conflicts with."""
    for entry in entries:
        reason = claim.conflict(entry)
        if reason is not None:
            raise CommitFailedError(f"{log.uri}: concurrent commit at version {entry.version}: {reason}")
    return entries


def _stage(log: TableLog, added: list[AddedFile], payload: bytes) -> Optional[_Staged]:
    """On a local disk: the entry written to a file in the log directory not yet named as a version, and
    it, the data files and the partition directories naming them fsynced together (None for an object
    store)."""
    if not location.is_local(log.uri):
        return None
    staged = _Staged.written(location.join(log.uri, "_delta_log"), payload)
    if durable():
        try:
            paths = [os.path.join(log.uri, unquote(a.path)) for a in added]
            fsync_together([staged.file, *paths], {os.path.dirname(path) for path in paths})
        except BaseException:
            staged.close()
            raise
    return staged


_named_only: set[str] = set()  # log directories whose file system has no unnamed files (O_TMPFILE)


@dataclass
class _Staged:
    """A log entry written before it has a version: where the file system offers it (Linux: ext4, xfs,
    btrfs, tmpfs), an unnamed file (O_TMPFILE) in the log directory, held by its descriptor, and linked to
    its version's name through /proc/self/fd; elsewhere a temporary file at `path`, linked and then
    removed. The unnamed file spares the temporary name's creation and removal, two changes to the log
    directory per commit (0.15-0.25 ms of a 1.2 ms commit on this machine's ext4), and a crash leaves
    nothing behind (the file system frees an unnamed file at recovery). The unnamed file is one made ahead
    (spares) when one is ready. Either is linked with link(2),
    which fails when the name exists: the put-if-absent of a local log."""
    directory: int  # the log directory, open: the unnamed file is made, linked and fsynced through it
    path: str = ""  # the temporary file's (named entries only)
    descriptor: Optional[int] = None  # the unnamed file's

    @classmethod
    def written(cls, log_dir: str, payload: bytes, *, unnamed: bool = True) -> "_Staged":
        """payload in a new staged entry in log_dir (not fsynced): unnamed where the file system has unnamed
        files, unless unnamed is False; TableRemovedError when the directory does not exist (the table was
        removed: an expired version retries, this cannot)."""
        try:
            directory = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError as error:
            raise TableRemovedError(f"{log_dir}: the table's log directory does not exist") from error
        staged = cls(directory)
        try:
            if unnamed and spares.UNNAMED and log_dir not in _named_only:
                staged.descriptor = spares.take(log_dir)
                if staged.descriptor is None:
                    try:
                        staged.descriptor = os.open(".", spares.UNNAMED | os.O_WRONLY, 0o644, dir_fd=directory)
                    except OSError as error:
                        if error.errno not in spares.UNSUPPORTED:
                            raise
                        _named_only.add(log_dir)
            if staged.descriptor is not None:
                _write_all(staged.descriptor, payload)
            else:
                staged.path = os.path.join(log_dir, f".{uuid.uuid4().hex}.json.tmp")
                with open(staged.path, "wb") as f:
                    f.write(payload)
        except BaseException:
            staged.close()
            raise
        return staged

    @property
    def file(self) -> Union[int, str]:
        """What fsyncs the entry's content: the unnamed file's descriptor or the temporary file's path."""
        return self.descriptor if self.descriptor is not None else self.path

    def link(self, target: str) -> bool:
        """Link the entry to target (a name in the log directory) unless that exists, then fsync the log
        directory: whether this call created it."""
        try:
            if self.descriptor is not None:
                os.link(f"/proc/self/fd/{self.descriptor}", os.path.basename(target), dst_dir_fd=self.directory,
                        follow_symlinks=True)
            else:
                os.link(self.path, os.path.basename(target), dst_dir_fd=self.directory)
        except FileExistsError:
            return False
        if durable():
            os.fsync(self.directory)
        return True

    def close(self) -> None:
        """Release the staged entry: the unnamed file's descriptor, or the temporary file itself."""
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None
        if self.path:
            os.unlink(self.path)
            self.path = ""
        if self.directory >= 0:
            os.close(self.directory)
            self.directory = -1


def entries_after(table_uri: str, version: int) -> list[Entry]:
    """The entries after version, in order, up to the latest (reads until one does not exist)."""
    return read_entries(table_uri, version + 1)[0]


CONTENDED_SECONDS = 2.0  # a log where a commit lost a version race this recently counts as contended
_lost_at: dict[str, float] = {}  # object-store log uri -> when a commit of this process last lost a race there
WINDOW_FIRST, WINDOW_MOST = 2, 16  # log entries asked for at once on an object store: first, and at most


def read_entries(log: "TableLog | str", first: int) -> tuple[list[Entry], float]:
    """The entries from version `first` on, in order, up to the first that does not exist, and the monotonic
    time before the request that found it missing (the last one read was the latest then, or later).

    On local disk they are read one by one (a read costs microseconds). On an object store each round asks
    for a window of versions at once, two at first and twice as many each time all were there: an entry and
    the next version's absence cost one round trip, k new entries about log2(k). A version found missing in
    a window ends the list even when a later one was found (it was created after the missing one was asked
    for)."""
    uri = log if isinstance(log, str) else log.uri
    entries: list[Entry] = []
    window = 1 if location.is_local(uri) else WINDOW_FIRST
    while True:
        started = time.monotonic()
        versions = range(first + len(entries), first + len(entries) + window)
        found = concurrently([functools.partial(read_entry, log, v) for v in versions], "entries")
        for entry in found:
            if entry is None:
                return entries, started
            entries.append(entry)
        if window > 1:
            window = min(window * 2, WINDOW_MOST)


@guarded
def has_entry_by(table_uri: str, version: int, txn_id: str) -> bool:
    """Whether an entry after version, of any table (partitioned or not), is the commit whose commitInfo's
    txnId is txn_id: read one by one up to the first missing version (a commit's caller looks right after
    it, so the entries after its snapshot are few)."""
    while True:
        version += 1
        try:
            text = location.get(entry_uri(table_uri, version))
        except FileNotFoundError:
            return False
        for line in text.splitlines():
            if line.strip() and json.loads(line).get("commitInfo", {}).get("txnId") == txn_id:
                return True


@guarded
def read_entry(log: "TableLog | str", version: int) -> Optional[Entry]:
    """The actions of one version of a table (its log or uri), or None when its entry does not exist (yet,
    or any more)."""
    try:
        text = location.get(entry_uri(log, version) if isinstance(log, str) else log.entry_uri(version))
    except FileNotFoundError:
        return None
    entry = Entry(version)
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            entry.added.append(_added(action["add"]))
        elif "remove" in action:
            entry.removed.add(action["remove"]["path"])
        elif "txn" in action:
            entry.app_ids[action["txn"]["appId"]] = action["txn"]["version"]
        elif "metaData" in action or "protocol" in action:
            entry.table_changed = True
        elif "commitInfo" in action:
            entry.timestamp = action["commitInfo"].get("timestamp")
            entry.operation = action["commitInfo"].get("operation")
            entry.txn_id = action["commitInfo"].get("txnId")
    return entry


def app_versions(table: DeltaTable, app_ids: Iterable[str]) -> dict[str, Optional[int]]:
    """The versions of application transactions app_ids at the table object's version (None: never set),
    from one read of the log: the latest checkpoint's txn actions and the entries after it up to that
    version, side by side (two rounds of requests).
    delta-rs replays the log for each app id it is asked about (on an object store about seven requests
    each: a topic's sixteen partition cursors took 112). Asked per app id of delta-rs when the latest
    checkpoint is newer than the table object or in parts."""
    wanted, version, uri = set(app_ids), table.version(), table.table_uri
    try:
        last = json.loads(location.get(location.join(uri, "_delta_log", "_last_checkpoint")))
    except FileNotFoundError:
        last = None
    if last is not None and (last["version"] > version or last.get("parts")):
        return {app: _transaction_version(table, app) for app in wanted}
    first = 0 if last is None else last["version"] + 1

    def checkpointed() -> dict[str, Optional[int]]:
        if last is None:
            return {}
        name = f"{last['version']:020d}.checkpoint.parquet"
        txn = pq.read_table(pa.BufferReader(location.get(location.join(uri, "_delta_log", name))),
                            columns=["txn"])["txn"]
        return {row["appId"]: row["version"] for row in txn.drop_null().to_pylist()}

    checkpoint = Started(checkpointed, "app-versions")
    # the table object has read up to its version: those entries exist, and are read in one round
    entries = concurrently([functools.partial(read_entry, uri, v) for v in range(first, version + 1)], "entries")
    found = checkpoint.result()
    for entry in entries:
        if entry is None:  # cleaned up meanwhile (a checkpoint newer than the one read was written)
            return {app: _transaction_version(table, app) for app in wanted}
        found.update(entry.app_ids)
    return {app: found.get(app) for app in wanted}


@guarded
def create_entry(target: str, payload: bytes) -> bool:
    """Create the log entry at target (<table>/_delta_log/<version>.json, the directory existing) unless it
    exists, durable on return: whether this call created it."""
    if not location.is_local(target):
        return location.create(target, payload)
    staged = _Staged.written(os.path.dirname(target), payload)
    try:
        if durable():
            fsync_file(staged.file)
        return staged.link(target)
    finally:
        staged.close()


def _entry_payload(added: list[AddedFile], removed: list[str], app_transactions: dict[str, int],
                   operation: str, data_change: bool, txn_id: str) -> bytes:
    now = int(time.time() * 1000)
    lines: list[dict[str, Any]] = [{"commitInfo": {"timestamp": now, "operation": operation, "engineInfo": ENGINE,
                                                   "operationParameters": {}, "clientVersion": ENGINE,
                                                   "txnId": txn_id}}]
    lines += [{"txn": {"appId": app, "version": v, "lastUpdated": now}} for app, v in app_transactions.items()]
    lines += [{"remove": {"path": path, "deletionTimestamp": now, "dataChange": data_change}} for path in removed]
    lines += [{"add": {"path": a.path, "partitionValues": {PARTITION_COLUMN: str(a.partition), **dict(a.values)},
                       "size": a.size,
                       "modificationTime": now, "dataChange": data_change, "stats": a.stats}} for a in added]
    return "\n".join(json.dumps(line) for line in lines).encode()


def _added(action: dict[str, Any]) -> AddedFile:
    stats = json.loads(action["stats"]) if action.get("stats") else {}
    values = action["partitionValues"]
    return AddedFile(action["path"], int(values[PARTITION_COLUMN]), int(action.get("size", 0)),
                     int(stats.get("numRecords", 0)), stats.get("minValues", {}), stats.get("maxValues", {}),
                     action.get("stats") or "",
                     tuple((k, v) for k, v in values.items() if k != PARTITION_COLUMN and v is not None))


def _statistics(data: pa.Table, columns: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Min, max and the add action's statistics JSON for the stats columns, as delta-rs writes them
    (timestamps as ISO strings at millisecond precision: the minimum rounded down, the maximum up, so
    they stay bounds)."""
    low, high, nulls = {}, {}, {}
    present = set(data.schema.names)
    for name in columns:
        if name not in present:
            continue
        column = data.column(name)
        nulls[name] = column.null_count
        kind = column.type
        if column.null_count == len(column) or pa.types.is_string(kind):
            continue  # strings are not compared by sparkbus; delta-rs truncates them anyway
        # numpy's min and max (Arrow's kernels and a timestamp cast made this 3.7x slower on a single send's
        # row); integers and microseconds straight from the column's buffers
        timestamp = pa.types.is_timestamp(kind)
        if pa.types.is_signed_integer(kind) or timestamp and kind.unit == "us":
            values = stored_int64s(column.drop_null() if column.null_count else column)
        else:
            values = (column.drop_null() if column.null_count else column).to_numpy()
            if timestamp:
                values = values.astype("datetime64[us]").view(np.int64)
        if len(values) <= 32:  # (a few: Python's min and max of a list are quicker than numpy's)
            listed = values.tolist()
            least, most = min(listed), max(listed)
        else:
            least, most = values.min().item(), values.max().item()
        if timestamp:
            least, most = _iso_millis(least // 1000), _iso_millis(-(-most // 1000))
        low[name], high[name] = least, most
    stats = {"numRecords": data.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    return low, high, json.dumps(stats)


def _iso_millis(millis: int) -> str:
    return (EPOCH + timedelta(milliseconds=millis)).isoformat(timespec="milliseconds")[:-6] + "Z"


def _retention(setting: Optional[str]) -> timedelta:
    """A delta.logRetentionDuration value ("interval 10 seconds") as a duration (Delta's default if unset)."""
    if not setting:
        return _DEFAULT_RETENTION
    match = _INTERVAL.match(setting)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"unreadable delta.logRetentionDuration {setting!r}: expected 'interval <n> <unit>'")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2).lower()])
