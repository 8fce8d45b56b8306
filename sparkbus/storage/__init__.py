"""Thin helpers over delta-rs: table creation, reads, and making commits durable.

Every read goes through delta-rs' own DataFusion engine (QueryBuilder), never through pyarrow's
dataset scanner: scanner threads still alive at interpreter exit made about 1 process in 12 abort
with "terminate called without an active exception" (measured; see docs/architecture.md, "Clean exit").

Durability: delta-rs writes a commit's data files and log entry without fsync, so an acknowledged
message would survive a process crash but not a power loss. `sync_version` fsyncs what one version
wrote (its data files, then its log entry, then the directories naming them) and runs after every
commit that acknowledges an operation, before the call returns. Power lost between delta-rs' write and
that fsync can only touch a call that has not returned yet; storage may then keep the log entry but
not a data file it names (the order inside delta-rs is not ours to change), which a reader sees as a
missing file of an unacknowledged commit. Commits sparkbus writes itself (sparkbus.storage.commits)
fsync in the right order: data files, the log entry, then the directories. Object stores need none of
this: a PUT is durable when it returns. SPARKBUS_DURABILITY=off skips the fsyncs, for throwaway
namespaces.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Iterable, Optional
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, PostCommitHookProperties, QueryBuilder
from deltalake.exceptions import DeltaError
from deltalake.schema import Field

from ..core import sequencing
from ..exceptions import PartitionUnavailableError
from . import location

if TYPE_CHECKING:
    from .commits import LogView

# Every sparkbus commit runs without delta-rs' post-commit hooks; maintenance checkpoints and cleans
# the log separately. A hook that failed after a successful commit (another process's log cleanup won
# a race) looked like a failed commit, and re-running the operation locked or settled twice.
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
PARTITION_COLUMN = "partition_id"
_READ_AT = "_sparkbus_read_at"  # attribute of the DeltaTable objects opened or refreshed here (read_at)


def table_exists(uri: str) -> bool:
    if location.is_local(uri) and not os.path.isdir(os.path.join(uri, "_delta_log")):
        return False
    return DeltaTable.is_deltatable(uri, storage_options=location.options_for(uri) or None)


def open_table(uri: str) -> DeltaTable:
    """The table at uri, with the storage options registered for its namespace (storage.location); a
    listing of its log that lost a race (is_expired_version) is tried again."""
    attempt = 0
    while True:
        started = time.monotonic()
        try:
            table = DeltaTable(uri, storage_options=location.options_for(uri) or None)
        except (DeltaError, FileNotFoundError) as error:
            attempt += 1
            if attempt == 10 or not is_expired_version(error):
                raise
            time.sleep(0.005 * attempt)  # the entries being created are there in a moment
            continue
        setattr(table, _READ_AT, started)
        return table


def read_at(table: DeltaTable) -> float:
    """Monotonic time before the table object last read its version from the log (opened or refreshed
    here): that version was the latest at that time or later. -inf for objects made elsewhere."""
    return getattr(table, _READ_AT, -math.inf)


def is_expired_version(error: BaseException) -> bool:
    """Reading the log lost a race: entries a table object needs were cleaned up (older than the log
    retention, or removed by another process's checkpoint while being read), or the listing missed entries
    created while it ran (local directories list in hash order, so a listing concurrent with commits can
    return version N+2 without N+1: delta-rs reports a gap). Reopen the table and read again."""
    if isinstance(error, FileNotFoundError):
        return "_delta_log" in str(error)
    return isinstance(error, DeltaError) and ("Invalid table version" in str(error)
                                              or "Expected contiguous commit files" in str(error))


def refresh(table: DeltaTable) -> DeltaTable:
    """The table at its latest version: updated in place, or reopened when its version's log expired."""
    for attempt in range(10):
        try:
            if attempt == 0:
                started = time.monotonic()
                table.update_incremental()
                setattr(table, _READ_AT, started)
                return table
            return open_table(table.table_uri)
        except (DeltaError, FileNotFoundError) as error:
            if not is_expired_version(error):
                raise
    raise RuntimeError(f"could not open {table.table_uri}: its log kept changing underneath")


def create_table(uri: str, schema: pa.Schema, partition_by: Iterable[str] = (PARTITION_COLUMN,),
                 configuration: dict[str, str] | None = None) -> DeltaTable:
    """Create an empty Delta table (durable on return); fails if one exists."""
    started = time.monotonic()
    table = DeltaTable.create(uri, schema=schema, partition_by=list(partition_by) or None, mode="error",
                              configuration=configuration, storage_options=location.options_for(uri) or None)
    setattr(table, _READ_AT, started)
    sync_version(table)
    root = local_root(table.table_uri)
    if root is not None and durable():  # the table's own directory, and the entity directory holding it
        fsync_directories((os.path.dirname(root.rstrip("/")),))
    return table


def add_missing_columns(uri: str, schema: pa.Schema) -> list[str]:
    """Add the schema's columns the table lacks (nullable; rows written before read them as null), in one
    commit made durable; returns their names. A concurrent upgrade that added them first is fine."""
    table = open_table(uri)
    have = {field.name for field in table.schema().fields}
    missing = [field for field in schema if field.name not in have]
    if not missing:
        return []
    try:
        table.alter.add_columns([Field.from_arrow(field.with_nullable(True)) for field in missing])
    except DeltaError:
        table = open_table(uri)  # lost to another process's upgrade? then the columns are there now
        if any(field.name not in {f.name for f in table.schema().fields} for field in missing):
            raise
        return []
    sync_version(table)
    return [field.name for field in missing]


def durable() -> bool:
    """Whether commits are fsynced (SPARKBUS_DURABILITY is not "off")."""
    return os.environ.get("SPARKBUS_DURABILITY", "on").lower() != "off"


def sync_version(table: DeltaTable) -> None:
    """fsync the files the table's current version added, then its log entry, then the directories
    naming them (no-op for object stores and with SPARKBUS_DURABILITY=off)."""
    root = local_root(table.table_uri)
    if root is None or not durable():
        return
    log_dir = os.path.join(root, "_delta_log")
    entry = os.path.join(log_dir, f"{table.version():020d}.json")
    with open(entry, "rb") as log:
        actions = log.read()
    directories = {log_dir}
    for line in actions.splitlines():
        added = json.loads(line).get("add")
        if added:
            path = os.path.join(root, unquote(added["path"]))
            fsync_file(path)
            directories.add(os.path.dirname(path))
    fsync_file(entry)
    fsync_directories(directories)


def sync_files(table: DeltaTable, names: Iterable[str]) -> None:
    """fsync files of the table's log directory (a checkpoint before older log entries are removed)."""
    root = local_root(table.table_uri)
    if root is None or not durable():
        return
    log_dir = os.path.join(root, "_delta_log")
    for name in names:
        path = os.path.join(log_dir, name)
        if os.path.exists(path):
            fsync_file(path)
    fsync_directories((log_dir,))


_durable_directories: set[str] = set()  # directories whose own entry in their parent was fsynced


def fsync_directories(directories: Iterable[str]) -> None:
    """fsync directories (new entries in them); the first time a directory is seen, its parent too (it
    may be new itself: a partition's first file, a table's first commit)."""
    fsync_together([], directories)


def fsync_together(files: list[str], directories: Iterable[str] = ()) -> None:
    """fsync files and directories (as fsync_directories does) concurrently, returning when all are
    durable: a journalling file system commits concurrent fsyncs together, so several cost about one.
    The first error raises (after every fsync ended)."""
    directories = sorted(set(directories), key=len, reverse=True)
    parents = sorted({os.path.dirname(d) for d in directories if d not in _durable_directories} - set(directories))
    paths = [*files, *directories, *parents]
    pending: list[concurrent.futures.Future[None]] = []
    try:
        for path in paths[1:]:
            pending.append(pool("fsync", 8).submit(fsync_file, path))
    except RuntimeError:  # the interpreter is exiting (a commit from an atexit hook): the rest in this thread
        for path in paths[1 + len(pending):]:
            fsync_file(path)
    try:
        if paths:
            fsync_file(paths[0])
    finally:
        concurrent.futures.wait(pending)
    for done in pending:
        done.result()
    _durable_directories.update(directories)


_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_pools_guard = threading.Lock()


def pool(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """The process's thread pool of that name, created on first use: fsyncs, Parquet writes and uploads
    release the GIL, so several run side by side."""
    with _pools_guard:
        if name not in _pools:
            _pools[name] = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                                 thread_name_prefix=f"sparkbus-{name}")
        return _pools[name]


def local_root(uri: str) -> Optional[str]:
    """The local path of a table uri; None for an object store."""
    if uri.startswith("file://"):
        return unquote(urlparse(uri).path)
    return None if "://" in uri else uri


def log_marker(uri: str) -> Optional[int]:
    """A cheap sign that a local table changed: its log directory's modification time in ns, which every
    new entry (a link into the directory) moves; -1 when the directory is gone; None for an object store,
    which has no cheap sign (callers poll)."""
    root = local_root(uri)
    if root is None:
        return None
    try:
        return os.stat(os.path.join(root, "_delta_log")).st_mtime_ns
    except FileNotFoundError:
        return -1


def fsync_file(path: str) -> None:
    """fsync one file or directory by path."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def query(sql: str, **tables: DeltaTable) -> pa.Table:
    """Run SQL over the given tables (registered under their keyword names) with delta-rs' engine."""
    builder = QueryBuilder()
    for name, table in tables.items():
        builder.register(name, table)
    return _without_views(pa.table(builder.execute(sql).read_all()))


_VIEW_TYPES = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def _without_views(table: pa.Table) -> pa.Table:
    """DataFusion returns string and binary *view* columns, which many pyarrow kernels (take, concat)
    do not support: cast them to plain string and binary."""
    if not any(f.type in _VIEW_TYPES for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(_VIEW_TYPES.get(f.type, f.type)) for f in table.schema]))


def quoted(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def remove_tree(uri: str) -> None:
    """Delete a directory tree, or everything under an object-store prefix; missing is fine."""
    location.remove_tree(uri)


def high_water_marks(table: DeltaTable) -> dict[int, int]:
    """Per partition: the highest n of its sequence numbers committed (sparkbus.core.sequencing), from the
    add actions' max statistics, no data read; partitions without rows are absent."""
    actions = pa.table(table.get_add_actions(flatten=True))
    marks: dict[int, int] = {}
    if actions.num_rows == 0:
        return marks
    for pid, top in zip(actions["partition.partition_id"].to_pylist(), actions["max.sequence_number"].to_pylist()):
        if top is not None:
            marks[pid] = max(marks.get(pid, 0), top & sequencing.LOW_MASK)
    return marks


def last_commit_time_ms(table: DeltaTable) -> int | None:
    """Timestamp of the table's latest commit, from the log (no data read)."""
    history = table.history(1)
    return history[0].get("timestamp") if history else None


class PartitionReader:
    """Reads the rows one partition of a table holds at the table object's version, from its data files,
    keeping decoded files in memory: Delta data files never change once written, so a cached file is
    never stale, and after the first read only the files committed since are read (a few small ones
    per operation instead of a DataFusion query over all of them). Least recently used files are
    dropped beyond max_bytes. Files are read whole, single-threaded, without pyarrow's dataset
    scanner (see the module docstring). Given `columns`, only those (and the partition column) are read
    and returned: choosing what to lock needs a few narrow columns, not the bodies."""

    def __init__(self, schema: pa.Schema, max_bytes: int = 256 << 20,
                 columns: Optional[tuple[str, ...]] = None) -> None:
        if columns is not None:
            schema = pa.schema([f for f in schema if f.name == PARTITION_COLUMN or f.name in columns])
        self._schema = schema
        self._file_schema = pa.schema([f for f in schema if f.name != PARTITION_COLUMN])
        self._max_bytes = max_bytes
        self._files: OrderedDict[str, pa.Table] = OrderedDict()
        self._bytes = 0

    def rows(self, view: "LogView", partition: int) -> pa.Table:
        """Every row of the partition at the view's version (in the schema given, file by file)."""
        return self.with_partition([data for _, data in self.files(view, partition)], partition)

    def rows_of(self, view: "LogView", partition: int, sequence_numbers: pa.Array) -> pa.Table:
        """The partition's rows of these sequence numbers, in their order, read only from the files whose
        range may hold them (all must exist: KeyError naming one that does not)."""
        if not len(sequence_numbers):
            return self.with_partition([], partition)
        extremes = pc.min_max(sequence_numbers)
        parts = [data.filter(pc.is_in(data["sequence_number"], value_set=sequence_numbers))
                 for _, data in self.files(view, partition, extremes["min"].as_py(), extremes["max"].as_py())]
        found = self.with_partition(parts, partition)
        order = pc.index_in(sequence_numbers, value_set=found["sequence_number"])
        if order.null_count:
            raise KeyError(f"sequence number {sequence_numbers.filter(pc.is_null(order))[0]} is not in partition "
                           f"{partition} at version {view.version}")
        return found.take(order)

    def with_partition(self, parts: list[pa.Table], partition: int) -> pa.Table:
        """File rows (without the partition column) as one table in the schema given."""
        data = pa.concat_tables(parts) if parts else self._file_schema.empty_table()
        column = pa.repeat(pa.scalar(partition, self._schema.field(PARTITION_COLUMN).type), data.num_rows)
        return data.add_column(0, self._schema.field(PARTITION_COLUMN), column).select(self._schema.names)

    def files(self, view: "LogView", partition: int, low: Optional[int] = None,
              high: Optional[int] = None) -> list[tuple[str, pa.Table]]:
        """(path as in the log, rows without the partition column) of the partition's data files at the
        view's version, only those that may hold sequence numbers in [low, high] when given.
        PartitionUnavailableError when one cannot be read."""
        try:
            return [(f.path, self._file(location.join(view.log.uri, unquote(f.path))))
                    for f in view.files(partition, low, high)]
        except (OSError, pa.ArrowException) as error:  # missing, unreadable or corrupt: the partition's fault
            fault = PartitionUnavailableError(f"partition {partition} of {view.log.uri} cannot be read: {error}")
            fault.partition_id = partition
            raise fault from error

    def remember(self, path: str, data: pa.Table) -> None:
        """Keep the rows of a data file this process just wrote (path as files() names it, data without the
        partition column): the next read of that file costs nothing."""
        self._keep(path, data.cast(self._file_schema))

    def _file(self, path: str) -> pa.Table:
        cached = self._files.get(path)
        if cached is not None:
            self._files.move_to_end(path)
            return cached
        source = path if location.is_local(path) else pa.BufferReader(location.get(path))
        file = pq.ParquetFile(source)
        present = set(file.schema_arrow.names)
        data = file.read([n for n in self._file_schema.names if n in present], use_threads=False)
        if data.schema != self._file_schema:  # older files lack columns added since: they read as null
            data = pa.table([data[f.name] if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
                             for f in self._file_schema], names=self._file_schema.names).cast(self._file_schema)
        self._keep(path, data)
        return data

    def _keep(self, path: str, data: pa.Table) -> None:
        """Cache a file's rows, dropping the least recently used beyond max_bytes."""
        if path in self._files:
            return
        self._files[path] = data
        self._bytes += data.nbytes
        while self._bytes > self._max_bytes and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._bytes -= dropped.nbytes
