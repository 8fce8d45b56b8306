"""Thin helpers over delta-rs: table creation, reads, writes, and making commits durable.

The only layer that talks to a store: the engine opens, reads and commits to tables through the functions
here and names delta-rs' types (DeltaTable, Transaction, CommitProperties, CommitFailedError, DeltaError)
as this package re-exports them, so every call that reaches a store is `guarded` (sparkbus.storage.errors:
a store's refusal raised as the SDK's error) and no layer above imports deltalake or obstore.

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
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Optional, TypeVar, Union
from urllib.parse import unquote, urlparse

import pyarrow as pa
from deltalake import CommitProperties as CommitProperties
from deltalake import DeltaTable as DeltaTable
from deltalake import PostCommitHookProperties, QueryBuilder
from deltalake import Transaction as Transaction
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError as CommitFailedError
from deltalake.exceptions import DeltaError as DeltaError
from deltalake.schema import Field
from deltalake.table import TableMerger

from ..core import sequencing
from . import location, requests
from .errors import guarded

# Every sparkbus commit runs without delta-rs' post-commit hooks; maintenance checkpoints and cleans
# the log separately. A hook that failed after a successful commit (another process's log cleanup won
# a race) looked like a failed commit, and re-running the operation locked or settled twice.
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
PARTITION_COLUMN = "partition_id"
T = TypeVar("T")
_READ_AT = "_sparkbus_read_at"  # attribute of the DeltaTable objects opened or refreshed here (read_at)


@guarded
def table_exists(uri: str) -> bool:
    requests.note("delta-rs")
    if location.is_local(uri) and not os.path.isdir(os.path.join(uri, "_delta_log")):
        return False
    return DeltaTable.is_deltatable(uri, storage_options=location.options_for(uri) or None)


@guarded
def open_table(uri: str, version: Optional[int] = None) -> DeltaTable:
    """The table at uri (at its latest version, or at `version`), with the storage options registered for
    its namespace (storage.location); a listing of its log that lost a race (is_expired_version) is tried
    again."""
    requests.note("delta-rs")
    attempt = 0
    while True:
        started = time.monotonic()
        try:
            table = DeltaTable(uri, version=version, storage_options=location.options_for(uri) or None)
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


def set_read_at(table: DeltaTable, started: float) -> None:
    """Record that the table object's version was the latest at monotonic time started (or later)."""
    setattr(table, _READ_AT, started)


def is_expired_version(error: BaseException) -> bool:
    """Reading the log lost a race: entries a table object needs were cleaned up (older than the log
    retention, or removed by another process's checkpoint while being read, the checkpoint it started from
    among them), or the listing missed entries
    created while it ran (local directories list in hash order, so a listing concurrent with commits can
    return version N+2 without N+1: delta-rs reports a gap). Reopen the table and read again."""
    if isinstance(error, FileNotFoundError):
        return "_delta_log" in str(error)
    text = str(error)
    return isinstance(error, DeltaError) and ("Invalid table version" in text
                                              or "Expected contiguous commit files" in text
                                              or ("_delta_log/" in text and "not found" in text))


@guarded
def refresh(table: DeltaTable) -> DeltaTable:
    """The table at its latest version: updated in place, or reopened when its version's log expired."""
    for attempt in range(10):
        try:
            if attempt == 0:
                started = time.monotonic()
                requests.note("delta-rs")
                table.update_incremental()
                setattr(table, _READ_AT, started)
                return table
            return open_table(table.table_uri)
        except (DeltaError, FileNotFoundError) as error:
            if not is_expired_version(error):
                raise
    raise RuntimeError(f"could not open {table.table_uri}: its log kept changing underneath")


@guarded
def create_table(uri: str, schema: pa.Schema, partition_by: Iterable[str] = (PARTITION_COLUMN,),
                 configuration: dict[str, str] | None = None) -> DeltaTable:
    """Create an empty Delta table (durable on return); fails if one exists."""
    requests.note("delta-rs")
    started = time.monotonic()
    table = DeltaTable.create(uri, schema=schema, partition_by=list(partition_by) or None, mode="error",
                              configuration=configuration, storage_options=location.options_for(uri) or None)
    setattr(table, _READ_AT, started)
    sync_version(table)
    root = local_root(table.table_uri)
    if root is not None and durable():  # the table's own directory, and the entity directory holding it
        fsync_directories((os.path.dirname(root.rstrip("/")),))
    return table


@guarded
def add_missing_columns(uri: str, schema: pa.Schema) -> list[str]:
    """Add the schema's columns the table lacks (nullable; rows written before read them as null), in one
    commit made durable; returns their names. A concurrent upgrade that added them first is fine."""
    requests.note("delta-rs")
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


@guarded
def write(table_or_uri: str | Path | DeltaTable, data: Any, **options: Any) -> None:
    """delta-rs' write_deltalake, with the same arguments: one commit, to which a table object given moves;
    CommitFailedError when a conflicting commit came first."""
    requests.note("delta-rs")
    write_deltalake(table_or_uri, data, **options)


@guarded
def merge(table: DeltaTable, source: pa.Table, predicate: str,
          clauses: Callable[[TableMerger], TableMerger], *, txn_id: Optional[str] = None) -> dict[str, Any]:
    """MERGE source (alias s) into table (alias t) on predicate, with the clauses `clauses` adds to delta-rs'
    merger and without post-commit hooks (NO_HOOKS): one commit, to which the table object moves, its
    commitInfo's txnId txn_id when given (how a caller finds its own entry in the log); returns delta-rs'
    metrics. CommitFailedError when a conflicting commit came first."""
    requests.note("delta-rs")
    merger = table.merge(source, predicate, source_alias="s", target_alias="t", post_commithook_properties=NO_HOOKS,
                         commit_properties=CommitProperties(custom_metadata={"txnId": txn_id}) if txn_id else None)
    return clauses(merger).execute()


@guarded
def delete_rows(table: DeltaTable, predicate: str) -> dict[str, Any]:
    """Delete the rows matching predicate, without post-commit hooks (NO_HOOKS): one commit when any matched,
    to which the table object moves; returns delta-rs' metrics."""
    requests.note("delta-rs")
    return table.delete(predicate, post_commithook_properties=NO_HOOKS)


@guarded
def transaction_version(table: DeltaTable, app_id: str) -> Optional[int]:
    """The version of application transaction app_id at the table object's version (None when never set):
    delta-rs reads it from the log."""
    requests.note("delta-rs")
    return table.transaction_version(app_id)


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


# A commit's fsyncs up to this many run one after another in the calling thread, more of them side by side
# on a pool. One file's commit (its data file, the partition directory naming it, the staged entry): on this
# kind of machine (2 vCPUs, ext4 without a journal) the three alone took 0.85 ms in a row against 0.6 ms
# side by side, but inside the process the pool's handoffs cost more than that: alternating the two ways
# operation by operation (eleven runs of 800), in a row single sends took 0.87-1.04x as long (median 0.92)
# and single receive + complete 0.91-1.01x (median 0.93); one helper thread fsyncing two of the three took
# 1.10-1.13x as long as all three in a row.
IN_A_ROW = 3


def fsync_together(files: list[Union[str, int]], directories: Iterable[str] = ()) -> None:
    """fsync files (by path or open descriptor: a commit's unnamed log entry) and directories (as
    fsync_directories does), returning when all are durable: up to IN_A_ROW in the calling thread, one
    after another, more of them concurrently (the first in the calling thread), where a file system
    handles concurrent fsyncs at about the cost of one (ext4 with a journal commits them together). In a
    row the first error raises at once; side by side, after every fsync ended."""
    directories = sorted(set(directories), key=len, reverse=True)
    parents = sorted({os.path.dirname(d) for d in directories if d not in _durable_directories} - set(directories))
    paths: list[Union[str, int]] = [*files, *directories, *parents]
    if len(paths) <= IN_A_ROW:
        for path in paths:
            fsync_file(path)
        _durable_directories.update(directories)
        return
    pending: list[concurrent.futures.Future[None]] = []
    try:
        for path in paths[1:]:
            pending.append(pool("fsync", 8).submit(fsync_file, path))
    except RuntimeError:  # the interpreter is exiting (a commit from an atexit hook): the rest in this thread
        for path in paths[1 + len(pending):]:
            fsync_file(path)
    try:
        fsync_file(paths[0])
    finally:
        concurrent.futures.wait(pending)
    for done in pending:
        done.result()
    _durable_directories.update(directories)


def concurrently(calls: list[Callable[[], T]], pool_name: str, workers: int = 64) -> list[T]:
    """Run the calls side by side on the named pool (the first in this thread), their results in order:
    one group of branches for storage.requests (its sequential count is its longest branch's). The first
    error is raised once all ended. A call that runs `concurrently` itself must use another pool than its
    own (a pool waiting on itself could run out of threads)."""
    if len(calls) < 2:
        return [call() for call in calls]
    branches = [requests.branch(call) for call in calls]
    futures = [pool(pool_name, workers).submit(run) for run in branches[1:]]
    try:
        first = branches[0]()
    finally:
        concurrent.futures.wait(futures)
    done = [first, *(future.result() for future in futures)]
    requests.joined([length for _, length in done])
    return [result for result, _ in done]


class Started(Generic[T]):
    """A call sent now on a pool, side by side with what this thread does next (a check that may vouch for
    a write sent after it). result() waits for it and counts it as a branch that began where it was
    started (storage.requests), so it adds to the operation's sequential count only where it outlasted
    the work done meanwhile."""

    def __init__(self, call: Callable[[], T], pool_name: str, workers: int = 16) -> None:
        self._at = requests.position()
        self._future = pool(pool_name, workers).submit(requests.branch(call))

    def result(self) -> T:
        """The call's result (or its error, raised here)."""
        value, length = self._future.result()
        requests.rejoined(self._at, length)
        return value


_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_pools_guard = threading.Lock()
# Background work (maintenance: compaction, checkpoints, log cleanup) runs at this niceness, in pools of its
# own. On two cores a compaction beside single sends took the CPU they waited for: at the callers'
# priority their p99 was 3.3-3.5x their p50 (medians of runs interleaved with the others; 2.5x with
# compaction off), at this one 3.1-3.25x, and four receivers drained 12-29% faster.
BACKGROUND_NICENESS = 10
_lane = threading.local()


def run_in_background() -> None:
    """Mark the calling thread as background work: its storage pools are separate from the callers' (an
    fsync of a caller never queues behind a compaction's) and, where the OS lets a thread's priority be
    lowered (Linux), it runs at BACKGROUND_NICENESS, so the callers' threads get the CPU first. A
    priority that cannot be changed is left as it is."""
    _lane.background = True
    if not hasattr(os, "setpriority"):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, max(BACKGROUND_NICENESS, os.getpriority(os.PRIO_PROCESS, thread)))
    except OSError:  # a thread id is no process id here (macOS), or the change is not permitted
        pass


def pool(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """The process's thread pool of that name, created on first use: fsyncs, Parquet writes and uploads
    release the GIL, so several run side by side. Background threads (run_in_background) get a pool of
    that name of their own, whose threads run in the background too."""
    background = getattr(_lane, "background", False)
    key = f"{name}-background" if background else name
    with _pools_guard:
        if key not in _pools:
            _pools[key] = concurrent.futures.ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix=f"sparkbus-{key}",
                initializer=run_in_background if background else None)
        return _pools[key]


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


def fsync_file(path: Union[str, int]) -> None:
    """fsync one file or directory by path (or by an open descriptor, left open)."""
    if isinstance(path, int):
        os.fsync(path)
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@guarded
def query(sql: str, **tables: DeltaTable) -> pa.Table:
    """Run SQL over the given tables (registered under their keyword names) with delta-rs' engine."""
    requests.note("delta-rs")
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


@guarded
def remove_tree(uri: str) -> None:
    """Delete a directory tree, or everything under an object-store prefix; missing is fine."""
    location.remove_tree(uri)


def high_water_marks(table: DeltaTable) -> dict[int, int]:
    """Per partition: the highest n of its sequence numbers committed (sparkbus.core.sequencing), from the
    add actions' max statistics, no data read; partitions without rows are absent."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return {}
    return sequencing.high_water_marks(zip(actions["partition.partition_id"].to_pylist(),
                                           actions["max.sequence_number"].to_pylist()))


@guarded
def last_commit_time_ms(table: DeltaTable) -> int | None:
    """Timestamp of the table's latest commit, from the log (no data read)."""
    requests.note("delta-rs")
    history = table.history(1)
    return history[0].get("timestamp") if history else None
