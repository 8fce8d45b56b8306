"""Keeping Delta tables cheap to commit to and read, with compaction off the callers' path.

delta-rs spends time per data file and per log file on every commit (measured: a one-row commit took
17 ms with 50 data files and 60 ms with 400; 26.9 ms with 2,317 log files and 12.1 ms with 18), so the
process that commits every CHECKPOINT_EVERY-th version writes a checkpoint and removes log files past
the retention, and every COMPACT_EVERY-th compacts small files (size-tiered: merged_together). Commits
themselves run without delta-rs' post-commit hooks (storage.NO_HOOKS): maintenance may lose a race with
another process's, and that must never be mistaken for a failed commit. Compaction rewrites data without changing it;
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
failed commit does. The thread runs below the callers' priority, on storage pools of its own
(storage.run_in_background), and follows each partitioned table with a view of its own, started from a
copy of the process's (storage.followed.kept_copy) where one exists, which retention uses too.

Compaction of a partitioned table is a direct commit too (_compact_partitions): it claims the files it
removes, so two compactions of the same files, or a compaction and a commit rewriting one of them, never
both succeed. Only one process compacts a table at a time all the same (_compaction_lock), so that the
work is not done twice; delta-rs compacts the tables without partitions, and it does not detect two
concurrent compactions of the same files (both would keep their copy of the rows): there the lock is
what keeps them apart.
"""
from __future__ import annotations

import atexit
import fcntl
import functools
import json
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from .. import storage
from . import commits, location
from . import followed as process_views
from .commits import AddedFile, LogView
from .errors import guarded
from .reader import PartitionReader

CHECKPOINT_EVERY = 10
# A checkpoint due after a direct commit is skipped while the table's latest one is younger than this (as
# this process first saw it) and fewer than CHECKPOINT_LAG versions behind: one every ten versions cost a
# busy table four checkpoints a second, and under the soak (three tables at 40 versions a second, two
# cores) more CPU than there was; replaying up to CHECKPOINT_LAG entries costs an open little.
CHECKPOINT_SECONDS = 2.0
CHECKPOINT_LAG = 200
COMPACT_EVERY = 20
# Files reaching this size are left alone: with delta-rs' default target (100 MB) a partition holding one
# large file and one new small file was rewritten whole every COMPACT_EVERY commits. A table's
# delta.targetFileSize, when set, is used instead (messages tables: core.schemas).
COMPACT_TARGET_BYTES = 16 * 1024 * 1024
# A compaction loses to any commit that rewrote the files it read (settlements do, all the time); tried
# once and skipped, a busy locks table piled up files and receive+complete went from 49 to 286 ms at p50.
COMPACT_ATTEMPTS = 5
COMPACT_MAX_FILES = 1_000  # files merged into one at most
# Size-tiered compaction (merged_together): files below COMPACT_TIER_BYTES form the first tier, each next
# tier is COMPACT_FAN_IN times larger, and a tier's files are merged once COMPACT_FAN_IN have gathered.
COMPACT_FAN_IN = 8
COMPACT_TIER_BYTES = 64 << 10
COMPACT_JOB_BYTES = 64 << 20  # stored bytes one compaction job reads at most
READER_BYTES = 8 << 20  # the decoded files a thread keeps per table (Delta data files never change)
_RACES = (CommitFailedError, DeltaError, FileNotFoundError)

COMPACT, CHECKPOINT, CLEANUP, TASK = "compact", "checkpoint", "cleanup", "task"
LEASE_SECONDS = 600  # an object-store compaction lease outlives any compaction; a dead holder's expires
# (table uri, COMPACT | CHECKPOINT | CLEANUP) or (key, TASK) -> (the job's work, when first asked), in the
# order first asked (see _run)
_due: dict[tuple[str, str], tuple[Callable[[], object], float]] = {}
# A thread committing while this process's oldest waiting job has waited longer than BEHIND_SECONDS waits
# for the line, up to BEHIND_WAIT_SECONDS per commit (_keep_pace).
BEHIND_SECONDS = 5.0
BEHIND_WAIT_SECONDS = 1.0
_checkpoint_at: dict[str, int] = {}  # table uri -> the version its waiting checkpoint is of (the latest asked)
_seen: dict[str, tuple[int, float]] = {}  # table uri -> (its latest checkpoint's version, when first seen here)
_changed = threading.Condition()
_kept = threading.local()  # what this thread's jobs keep per table uri: .tables (_latest), .views (_followed)
TABLES_KEPT = 32
_worker: Optional[threading.Thread] = None
_busy = False
_stopping = False
failures: list[tuple[str, Exception]] = []  # the last jobs that failed other than by losing a race


@dataclass(frozen=True)
class JobRun:
    """A job the thread ran: its kind (COMPACT, CHECKPOINT, CLEANUP or TASK), its table's uri (a task's
    key) and when it started and ended (time.perf_counter()): what an operation slower than its peers ran
    beside (benchmarks/bench_peers.py reports the single sends that overlapped none)."""

    kind: str
    key: str
    started: float
    ended: float


ran: deque[JobRun] = deque(maxlen=10_000)  # the latest jobs the thread ran, in the order they ended


@guarded
def after_commit(table: DeltaTable) -> None:
    """Call after committing to `table` (the object is at the new version): makes the commit durable,
    writes the checkpoint this version is due, and asks the background thread for the log cleanup and
    compaction due. Never raises for races."""
    _keep_pace()
    storage.sync_version(table)
    version = table.version()
    if version % CHECKPOINT_EVERY == 0:
        try:
            table.create_checkpoint()
            # the checkpoint replaces the log entries cleanup removes: durable first
            storage.sync_files(table, (f"{version:020d}.checkpoint.parquet", "_last_checkpoint"))
            _ask((table.table_uri, CLEANUP), functools.partial(cleanup, table.table_uri))
        except _RACES:
            pass
    if version % COMPACT_EVERY == 0:
        _ask((table.table_uri, COMPACT), functools.partial(compact, table.table_uri))


def after_direct_commit(uri: str, version: int) -> None:
    """Call after a direct commit (sparkbus.storage.commits, durable already) made `version` of the table
    at uri: asks the background thread for the checkpoint, log cleanup and compaction due. The caller
    holds no table object to re-base, so the checkpoint runs on the thread too."""
    _keep_pace()
    if version % CHECKPOINT_EVERY == 0:
        with _changed:
            at = _checkpoint_at[uri] = max(version, _checkpoint_at.get(uri, version))
            _ask((uri, CHECKPOINT), functools.partial(checkpoint, uri, at))
    if version % COMPACT_EVERY == 0:
        _ask((uri, COMPACT), functools.partial(compact, uri))


def run_later(key: str, task: Callable[[], object]) -> None:
    """Run task on the background thread: work of the layers above that must not sit on a caller's path
    (retention). A task still waiting under the same key is replaced (it would do the same work)."""
    _ask((key, TASK), task)


def _ask(job: tuple[str, str], work: Callable[[], object]) -> None:
    """Ask the background thread (started on first use) for a job: a job still waiting keeps its place in
    the line and takes the newer work."""
    with _changed:
        if _stopping:
            return
        waiting = _due.get(job)
        _due[job] = (work, time.monotonic() if waiting is None else waiting[1])  # a key keeps its position
        _start()


def _keep_pace() -> None:
    """Hold the committing thread while this process's maintenance is behind (its oldest waiting job has
    waited over BEHIND_SECONDS), up to BEHIND_WAIT_SECONDS. Maintenance must keep pace with the commits
    that ask for it: under the soak's load, without this, commits went on at full speed while the
    maintenance threads fell behind, every delta-rs open replayed more of the log, checkpoints took longer
    still, and after a few minutes nothing but maintenance ran (a table 15,000 versions past its latest
    checkpoint, a fan-out batch that never ended). The thread's own commits (compaction) never wait."""
    if not _due or threading.current_thread() is _worker:
        return
    with _changed:
        _changed.wait_for(lambda: _stopping or not _behind(), BEHIND_WAIT_SECONDS)


def _behind() -> bool:
    """Whether the oldest waiting job has waited over BEHIND_SECONDS (the caller holds _changed)."""
    oldest = next(iter(_due.values()), None)
    return oldest is not None and time.monotonic() - oldest[1] > BEHIND_SECONDS


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
        return _changed.wait_for(lambda: not _due and not _busy, timeout)


@guarded
def compact(uri: str) -> bool:
    """Compact the small files of the table at uri now, on its latest version, retrying lost races.
    Skipped (False) while another process or thread compacts the same table: see _compaction_lock."""
    with _compaction_lock(uri) as mine:
        if not mine:
            return False
        for _ in range(COMPACT_ATTEMPTS):
            try:
                followed = _followed(uri)
                if followed is None:
                    _compact_whole(uri)
                else:
                    _compact_partitions(*followed)
                return True
            except _RACES:
                continue
        return True


def _compact_partitions(view: LogView, reader: PartitionReader) -> bool:
    """Merge the files merged_together chooses in each partition (and, in a table with more partition
    columns, such as an archive's dates, each of their directories) into one file, all in one direct commit
    that claims only the files it removes: sends appending meanwhile never conflict with it, a commit that
    rewrote one of its files does (then the next attempt re-plans from the log, reading only the files
    written since). delta-rs' compaction, a commit per partition, replayed the log to open the table and,
    with the table's sends at 40 versions a second, fell behind for good: under the soak a topic's table
    reached 10,000 live files. Returns whether it committed."""
    view.advance()
    target = view.log.target_file_size or COMPACT_TARGET_BYTES
    merged: dict[tuple[int, tuple[tuple[str, str], ...]], list[AddedFile]] = {}
    total = 0
    for partition in sorted(view.partitions()):
        if total >= COMPACT_JOB_BYTES:  # the rest in the next job: memory stays bounded
            break
        groups: dict[tuple[tuple[str, str], ...], list[AddedFile]] = {}
        for added in view.files(partition):
            groups.setdefault(added.values, []).append(added)
        for values, listed in groups.items():
            chosen = merged_together(listed, target)
            if chosen:
                merged[(partition, values)] = chosen
                total += sum(f.size for f in chosen)
    if not merged:
        return False
    rows = reader.merged(view, {group: [f.path for f in chosen] for group, chosen in merged.items()})  # (one round)

    def sorted_rows(group: tuple[int, tuple[tuple[str, str], ...]]) -> pa.Table:
        data = rows.pop(group)
        return data.take(pc.sort_indices(data["sequence_number"])) if "sequence_number" in data.column_names \
            else data

    removed = frozenset(f.path for chosen in merged.values() for f in chosen)
    files: list[AddedFile] = []
    try:
        plain = sorted(p for p, values in merged if not values)
        files = commits.write_files(view.log, plain, lambda p: sorted_rows((p, ())), compress=True)
        for partition, values in sorted(group for group in merged if group[1]):
            files.append(commits.write_file(view.log, partition, sorted_rows((partition, values)), compress=True,
                                            values=values))
        done = commits.commit(view.log, view.position, files, removed, commits.Claim({}, removed),
                              operation="OPTIMIZE", data_change=False)
    except BaseException:
        commits.discard(view.log, files)
        raise
    view.committed(done, files, removed)
    after_direct_commit(view.log.uri, done.version)
    return True


def size_tier(size: int) -> int:
    """A data file's size tier: 0 below COMPACT_TIER_BYTES, each next tier COMPACT_FAN_IN times larger."""
    tier, bound = 0, COMPACT_TIER_BYTES
    while size >= bound:
        tier, bound = tier + 1, bound * COMPACT_FAN_IN
    return tier


def merged_together(files: list[AddedFile], target: int) -> list[AddedFile]:
    """The files of one partition (in the order added) that one compaction merges: those of the smallest
    size tier below the target that holds COMPACT_FAN_IN files, up to the target size or COMPACT_MAX_FILES;
    none when no tier has gathered that many. Merged files land in a larger tier, so a row is rewritten
    about once per tier (three or four times on its way to the target size), not at every compaction:
    merging all small files each time rewrote a partition's grown file with every few new rows (single
    sends paid for it in CPU at p50), and every receiver then read that new file whole again."""
    tiers: dict[int, list[AddedFile]] = {}
    for added in files:
        if added.size < target:
            tiers.setdefault(size_tier(added.size), []).append(added)
    for tier in sorted(tiers):
        if len(tiers[tier]) < COMPACT_FAN_IN:
            continue
        chosen: list[AddedFile] = []
        size = 0
        for added in tiers[tier]:
            if size >= target or len(chosen) >= COMPACT_MAX_FILES:
                break
            chosen.append(added)
            size += added.size
        return chosen
    return []


def _compact_whole(uri: str) -> None:
    """delta-rs' compaction of a table without partitions (the catalog, sessions: small and seldom
    written)."""
    table = _latest(uri)
    configured = table.metadata().configuration.get("delta.targetFileSize")
    target = int(configured) if configured else COMPACT_TARGET_BYTES
    metrics = table.optimize.compact(target_size=target, post_commithook_properties=storage.NO_HOOKS)
    if metrics.get("numFilesAdded"):
        storage.sync_version(table)


def _followed(uri: str) -> Optional[tuple[LogView, PartitionReader]]:
    """The log view and reader this thread keeps for the partitioned table at uri (None for a table
    without partitions): compaction follows the log entry by entry between jobs and reads each file once."""
    kept: Optional[OrderedDict[str, tuple[LogView, PartitionReader]]] = getattr(_kept, "views", None)
    if kept is None:
        kept = _kept.views = OrderedDict()
    followed = kept.pop(uri, None)
    if followed is None:
        # a copy of the view the process's receivers follow, where there is one: an open replays the log
        # from its latest checkpoint (about 0.1 s of CPU for 300 entries)
        view = process_views.kept_copy(uri)
        if view is None:
            table = _latest(uri)
            if storage.PARTITION_COLUMN not in table.metadata().partition_columns:
                return None
            view = LogView(table)
        partitioned_by = view.partition_columns()
        if storage.PARTITION_COLUMN not in partitioned_by:
            return None
        schema = pa.schema([f for f in view.arrow_schema()  # the columns data files hold
                            if f.name == storage.PARTITION_COLUMN or f.name not in partitioned_by])
        followed = (view, PartitionReader(schema, max_bytes=READER_BYTES, written=True))
    kept[uri] = followed
    while len(kept) > TABLES_KEPT:
        kept.popitem(last=False)
    return followed


def followed_view(uri: str) -> LogView:
    """The log view this thread keeps of the partitioned table at uri (the one compaction follows), for
    the tasks of the layers above that run on this thread (retention): opening the table for each run
    replayed its log from the latest checkpoint (0.5-1.3 s a run with four receivers on two cores); the
    kept view reads only the entries written since. Call it on the maintenance thread only (run_later):
    the view is that thread's. ValueError for a table without partitions."""
    followed = _followed(uri)
    if followed is None:
        raise ValueError(f"{uri}: not a partitioned table")
    return followed[0]


@contextmanager
def _compaction_lock(uri: str) -> Iterator[bool]:
    """An exclusive, non-blocking lock on compacting one table, across processes: yields whether it was
    taken.

    delta-rs (1.6) does not detect two concurrent compactions of the same files: both commit, each
    adding its own copy of the rows (measured: two optimize.compact of one version left 20 rows of 10,
    also with one application transaction set by both). A compaction that conflicts with a writer's
    commit is detected and retried, so one compaction at a time per table is all that must be ensured
    for delta-rs' (direct compactions detect each other as well; the lock saves the duplicated work):
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
    """A lease on an object store: an object created with put-if-absent (location.create) holding its expiry
    time and a holder id of its own (which tells an ambiguous create apart from another holder). An expired
    lease (its holder died) is taken over by a conditional overwrite on the object's ETag, so of two
    machines taking it over at once one wins; the holder deletes it when done. Yields whether it is ours."""
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store, key = location.store_of(uri)
    body = json.dumps({"expires": time.time() + LEASE_SECONDS, "holder": uuid.uuid4().hex}).encode()
    if not location.create(uri, body):
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
    it replaces; a checkpoint at a version is skipped when a recent one makes it early (_recent). At a
    version known to exist delta-rs reads no entry after it: an open at the latest version of a busy local
    table often failed, its listing of the log missing an entry being created (directories list in hash
    order), and checkpoints then fell behind for good."""
    if version is not None and _recent(uri, version):
        return
    try:
        table = storage.open_table(uri, version) if version is not None else _latest(uri)
        table.create_checkpoint()
        storage.sync_files(table, (f"{table.version():020d}.checkpoint.parquet", "_last_checkpoint"))
    except _RACES:
        return
    _seen[uri] = (table.version(), time.monotonic())
    cleanup(uri, table)


def _recent(uri: str, version: int) -> bool:
    """Whether the table's latest checkpoint makes one at `version` early: it is at `version` or later, or
    this process first saw it less than CHECKPOINT_SECONDS ago and it is fewer than CHECKPOINT_LAG versions
    behind (no clock is compared: first seen here is no earlier than written)."""
    try:
        latest = int(json.loads(location.get(location.join(uri, "_delta_log", "_last_checkpoint")))["version"])
    except (FileNotFoundError, ValueError, KeyError):
        return False
    now = time.monotonic()
    seen = _seen.get(uri)
    if seen is None or seen[0] != latest:
        seen = _seen[uri] = (latest, now)
    return latest >= version or (now - seen[1] < CHECKPOINT_SECONDS and version - latest < CHECKPOINT_LAG)


@guarded
def cleanup(uri: str, table: Optional[DeltaTable] = None) -> None:
    """Remove the table's log entries older than its log retention that a checkpoint made redundant. table:
    an object of the table at the checkpoint just written, used as it is; without it the object this
    thread keeps is brought to the latest version first (a refresh replays every entry since its last:
    20-190 ms of CPU for a few hundred)."""
    try:
        (table if table is not None else _latest(uri)).cleanup_metadata()
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
    """The thread's loop: jobs in the order first asked, a job asked again keeping its place, so no table's
    jobs and no kind of job wait behind more than one round of the others. Measured under the soak's
    eight clients on two cores: with checkpoints first, compactions never ran and a topic's table reached
    10,000 live files (a checkpoint of it took 10 s); with checkpoints by table in the order the tables
    were first seen, a topic's checkpoints stopped at version 210 of 5,000 behind its queue's."""
    global _busy
    storage.run_in_background()
    while True:
        with _changed:
            _busy = False
            _changed.notify_all()
            _changed.wait_for(lambda: _due or _stopping)
            if _stopping:
                return
            job, (work, _) = next(iter(_due.items()))
            del _due[job]
            if job[1] == CHECKPOINT:
                del _checkpoint_at[job[0]]
            _busy = True
        started = time.perf_counter()
        try:
            work()
        except Exception as error:  # a storage fault (a read-only or broken table): the next due version asks
            # again; the thread must live on for the other tables
            failures.append((job[0], error))
            del failures[:-10]
        finally:
            ran.append(JobRun(job[1], job[0], started, time.perf_counter()))


@atexit.register
def _stop() -> None:
    """At exit: drop waiting compactions and let the one under way finish (a thread killed inside
    delta-rs could take the interpreter down with it)."""
    global _stopping
    with _changed:
        _stopping = True
        _due.clear()
        _checkpoint_at.clear()
        _changed.notify_all()
        worker = _worker
    if worker is not None:
        worker.join()
