"""Keeping Delta tables cheap to commit to and read, with compaction off the callers' path.

delta-rs spends time per data file and per log file on every commit (measured: a one-row commit took
17 ms with 50 data files and 60 ms with 400; 26.9 ms with 2,317 log files and 12.1 ms with 18), so the
process that commits every CHECKPOINT_EVERY-th version writes a checkpoint and removes log files past
the retention, and every COMPACT_EVERY-th compacts small files. Commits themselves run without
delta-rs' post-commit hooks (storage.NO_HOOKS): maintenance may lose a race with another process's,
and that must never be mistaken for a failed commit. Compaction rewrites data without changing it;
whatever maintenance finally loses to a race is skipped (the next due version asks again).

Compaction and log cleanup run on one background thread per process (started on first use): done
inline, the send or settle that hit a COMPACT_EVERY-th version waited for it (single-send p99 133-148
ms; 50 ms with the thread). Requests for one table coalesce while they wait. After a delta-rs commit the
checkpoint stays inline (fsynced before the cleanup that relies on them), on the committing object:
writing one re-bases that long-lived object on the checkpoint, and when they too moved to the thread,
callers' objects only ever applied commits incrementally and send p50 crept from 9.5 to 15 ms over 1,200
sends. Direct commits (sparkbus.storage.commits: sends and settlements) hold no delta-rs object to
re-base, so their checkpoints run on the thread too (after_direct_commit). The thread is a daemon; at interpreter exit the compaction under way finishes and
waiting ones are dropped. A process killed in the middle leaves at most unreferenced files, as any
failed commit does. Only one process compacts a table at a time (_compaction_lock): delta-rs does not
detect two concurrent compactions of the same files, and both would keep their copy of the rows.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from .. import storage
from . import location
from .errors import guarded

CHECKPOINT_EVERY = 10
COMPACT_EVERY = 20
# Files reaching this size are left alone: with delta-rs' default target (100 MB) a partition holding one
# large file and one new small file was rewritten whole every COMPACT_EVERY commits. A table's
# delta.targetFileSize, when set, is used instead (messages tables: core.schemas).
COMPACT_TARGET_BYTES = 16 * 1024 * 1024
# A compaction loses to any commit that rewrote the files it read (settlements do, all the time); tried
# once and skipped, a busy locks table piled up files and receive+complete went from 49 to 286 ms at p50.
COMPACT_ATTEMPTS = 5
_RACES = (CommitFailedError, DeltaError, FileNotFoundError)

COMPACT, CHECKPOINT, CLEANUP = "compact", "checkpoint", "cleanup"
LEASE_SECONDS = 600  # an object-store compaction lease outlives any compaction; a dead holder's expires
_waiting: dict[str, set[str]] = {}  # table uri -> jobs due: COMPACT, CHECKPOINT and/or CLEANUP (of expired log entries)
_checkpoint_of: dict[str, int] = {}  # table uri -> the version its waiting CHECKPOINT is of (direct commits)
_tasks: dict[str, Callable[[], object]] = {}  # key -> work of the layers above (run_later)
_changed = threading.Condition()
_kept = threading.local()  # .tables: uri -> DeltaTable, the objects this thread's jobs keep (_latest)
TABLES_KEPT = 32
_worker: Optional[threading.Thread] = None
_busy = False
_stopping = False
failures: list[tuple[str, Exception]] = []  # the last jobs that failed other than by losing a race


@guarded
def after_commit(table: DeltaTable) -> None:
    """Call after committing to `table` (the object is at the new version): makes the commit durable,
    writes the checkpoint this version is due, and asks the background thread for the log cleanup and
    compaction due. Never raises for races."""
    storage.sync_version(table)
    version = table.version()
    if version % CHECKPOINT_EVERY == 0:
        try:
            table.create_checkpoint()
            # the checkpoint replaces the log entries cleanup removes: durable first
            storage.sync_files(table, (f"{version:020d}.checkpoint.parquet", "_last_checkpoint"))
            _request(table.table_uri, CLEANUP)
        except _RACES:
            pass
    if version % COMPACT_EVERY == 0:
        _request(table.table_uri, COMPACT)


def after_direct_commit(uri: str, version: int) -> None:
    """Call after a direct commit (sparkbus.storage.commits, durable already) made `version` of the table
    at uri: asks the background thread for the checkpoint, log cleanup and compaction due. The caller
    holds no table object to re-base, so the checkpoint runs on the thread too."""
    if version % CHECKPOINT_EVERY == 0:
        _request(uri, CHECKPOINT, version)
    if version % COMPACT_EVERY == 0:
        _request(uri, COMPACT)


def _request(uri: str, job: str, version: Optional[int] = None) -> None:
    """Ask the background thread (started on first use) for a job on the table at uri (a checkpoint: of
    `version`, the latest asked for)."""
    with _changed:
        if _stopping:
            return
        _waiting.setdefault(uri, set()).add(job)
        if version is not None:
            _checkpoint_of[uri] = max(version, _checkpoint_of.get(uri, version))
        _start()


def run_later(key: str, task: Callable[[], object]) -> None:
    """Run task on the background thread: work of the layers above that must not sit on a caller's path
    (retention). A task still waiting under the same key is replaced (it would do the same work)."""
    with _changed:
        if _stopping:
            return
        _tasks[key] = task
        _start()


def _start() -> None:
    """Start the thread on first use and wake it (the caller holds _changed)."""
    global _worker
    if _worker is None:
        _worker = threading.Thread(target=_run, name="sparkbus-maintenance", daemon=True)
        _worker.start()
    _changed.notify()


def wait_idle(timeout: Optional[float] = None) -> bool:
    """Block until no job or task is waiting or running in this process; False on timeout."""
    with _changed:
        return _changed.wait_for(lambda: not _waiting and not _tasks and not _busy, timeout)


@guarded
def compact(uri: str) -> bool:
    """Compact the small files of the table at uri now, on its latest version, retrying lost races.
    Skipped (False) while another process or thread compacts the same table: see _compaction_lock."""
    with _compaction_lock(uri) as mine:
        if not mine:
            return False
        done: set[object] = set()  # the partitions compacted (None: the whole of an unpartitioned table)
        for _ in range(COMPACT_ATTEMPTS):
            try:
                table = _latest(uri)
                configured = table.metadata().configuration.get("delta.targetFileSize")
                target = int(configured) if configured else COMPACT_TARGET_BYTES
                for partition in _crowded(table, target):
                    if partition in done:
                        continue
                    filters = None if partition is None else [(storage.PARTITION_COLUMN, "=", str(partition))]
                    metrics = table.optimize.compact(partition_filters=filters, target_size=target,
                                                     post_commithook_properties=storage.NO_HOOKS)
                    if metrics.get("numFilesAdded"):
                        storage.sync_version(table)
                    done.add(partition)
                return True
            except _RACES:
                continue
        return True


def _crowded(table: DeltaTable, target: int) -> list[object]:
    """The partitions with more than one file below the target size, each compacted in a commit of its
    own: a whole-table compaction loses to any commit that rewrites a file of any partition (retention, a
    topic's cursor), one of a partition only to those of that partition. [None] for an unpartitioned
    table."""
    if storage.PARTITION_COLUMN not in table.metadata().partition_columns:
        return [None]
    actions = pa.table(table.get_add_actions(flatten=True))
    sizes = actions["size_bytes"].to_pylist()
    partitions = actions[f"partition.{storage.PARTITION_COLUMN}"].to_pylist()
    small: dict[object, int] = {}
    for partition, size in zip(partitions, sizes):
        if size < target:
            small[partition] = small.get(partition, 0) + 1
    return sorted((p for p, count in small.items() if count > 1), key=str)


@contextmanager
def _compaction_lock(uri: str) -> Iterator[bool]:
    """An exclusive, non-blocking lock on compacting one table, across processes: yields whether it was
    taken.

    delta-rs (1.6) does not detect two concurrent compactions of the same files: both commit, each
    adding its own copy of the rows (measured: two optimize.compact of one version left 20 rows of 10,
    also with one application transaction set by both). A compaction that conflicts with a writer's
    commit is detected and retried, so one compaction at a time per table is all that must be ensured:
    on local disk by flock on a file beside the table, on an object store by a lease object that every
    machine sees (_lease)."""
    root = storage.local_root(uri)
    if root is None:
        with _lease(uri.rstrip("/") + "/_sparkbus_compaction.lease") as mine:
            yield mine
        return
    root = root.rstrip("/")
    path = os.path.join(os.path.dirname(root), f".{os.path.basename(root)}.compaction.lock")
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)  # releases the lock


@contextmanager
def _lease(uri: str) -> Iterator[bool]:
    """A lease on an object store: an object created with put-if-absent holding its expiry time. An expired
    lease (its holder died) is taken over by a conditional overwrite on the object's ETag, so of two
    machines taking it over at once one wins; the holder deletes it when done. Yields whether it is ours."""
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store, key = location.store_of(uri)
    body = json.dumps({"expires": time.time() + LEASE_SECONDS}).encode()
    try:
        store.put(key, body, mode="create")
    except AlreadyExistsError:
        try:
            current = store.get(key)
            if json.loads(bytes(current.bytes())).get("expires", 0) > time.time():
                yield False
                return
            store.put(key, body, mode={"e_tag": current.meta["e_tag"]})
        except (FileNotFoundError, PreconditionError, AlreadyExistsError):  # released or taken meanwhile
            yield False
            return
    try:
        yield True
    finally:
        try:
            store.delete(key)
        except FileNotFoundError:
            pass


@guarded
def checkpoint(uri: str, version: Optional[int] = None) -> None:
    """Write a checkpoint of the table at `version` (its latest when None; durable), then clean up the log
    it replaces. At a version known to exist delta-rs reads no entry after it: an open at the latest
    version of a busy local table often failed, its listing of the log missing an entry being created
    (directories list in hash order), and checkpoints then fell behind for good."""
    try:
        table = storage.open_table(uri, version) if version is not None else _latest(uri)
        table.create_checkpoint()
        storage.sync_files(table, (f"{table.version():020d}.checkpoint.parquet", "_last_checkpoint"))
    except _RACES:
        return
    cleanup(uri)


@guarded
def cleanup(uri: str) -> None:
    """Remove the table's log entries older than its log retention that a checkpoint made redundant."""
    try:
        _latest(uri).cleanup_metadata()
    except _RACES:
        pass


def _latest(uri: str) -> DeltaTable:
    """The table at uri at its latest version, from an object this thread keeps between jobs: delta-rs
    then reads only the entries written since, where an open replays every entry after the latest
    checkpoint (with checkpoints behind under load, an open took 15-19 s). A thread keeps TABLES_KEPT."""
    kept = getattr(_kept, "tables", None)
    if kept is None:
        kept = _kept.tables = OrderedDict()
    table = kept.pop(uri, None)
    table = storage.open_table(uri) if table is None else storage.refresh(table)
    kept[uri] = table
    while len(kept) > TABLES_KEPT:
        kept.popitem(last=False)
    return table


def _run() -> None:
    """The thread's loop. Checkpoints of any table go first, then the layers' tasks, then compaction and
    log cleanup: every open of a table by delta-rs replays the log entries after its latest checkpoint, so
    a checkpoint that waited behind compactions and retention runs (each opening its table) made them
    slower still (measured under the soak's eight clients on two cores: checkpoints stalled at version
    ~700 of 8,000 and an open took 15-19 s)."""
    global _busy
    while True:
        with _changed:
            _busy = False
            _changed.notify_all()
            _changed.wait_for(lambda: _waiting or _tasks or _stopping)
            if _stopping:
                return
            task: Optional[Callable[[], object]] = None
            jobs: set[str] = set()
            due = next((table for table, waiting in _waiting.items() if CHECKPOINT in waiting), None)
            if due is not None:  # checkpoints first (see the docstring)
                uri, jobs = due, {CHECKPOINT}
                _waiting[due].discard(CHECKPOINT)
                if not _waiting[due]:
                    del _waiting[due]
            elif _tasks:
                uri, task = _tasks.popitem()
            else:
                uri, jobs = _waiting.popitem()
            at = _checkpoint_of.pop(uri, None) if CHECKPOINT in jobs else None
            _busy = True
        try:
            if task is not None:
                task()
            if CHECKPOINT in jobs:
                checkpoint(uri, at)
            elif CLEANUP in jobs:
                cleanup(uri)
            if COMPACT in jobs:
                compact(uri)
        except Exception as error:  # a storage fault (a read-only or broken table): the next due version asks
            # again; the thread must live on for the other tables
            failures.append((uri, error))
            del failures[:-10]


@atexit.register
def _stop() -> None:
    """At exit: drop waiting compactions and let the one under way finish (a thread killed inside
    delta-rs could take the interpreter down with it)."""
    global _stopping
    with _changed:
        _stopping = True
        _waiting.clear()
        _checkpoint_of.clear()
        _tasks.clear()
        _changed.notify_all()
        worker = _worker
    if worker is not None:
        worker.join()
