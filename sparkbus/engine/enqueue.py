"""Storage-level send: validate, place, de-duplicate, number and commit rows to an entity's messages table.

One call is one Delta commit: every accepted message of the call becomes visible at once, across
partitions, or none does. Nothing here knows about the azure-shaped API classes.

Group commit (EntityWriter.send): a commit costs milliseconds of delta-rs work whatever it holds, so
threads of one process sending to the same entity at the same time share commits. The first caller
leads a group; callers arriving while the previous group commits join it; the leader commits the group's
messages in one commit (placement, duplicate detection and numbering as if the callers had sent one
after the other) and hands each caller its own result. Every caller still returns only after its
messages committed, so acknowledgement means the same. If the entity refuses the group (a quota, a
disabled entity: raised before anything is written), each caller's messages are committed on their own,
so one caller's refusal never becomes another's.

Entity identity (sparkbus.engine.registry): a writer given the `entity` (a sender's) confirms the
incarnation it wrote to after each commit (on an object store with a read sent before the commit's first
request) and after each failure. A send that met or wrote into a deleted
incarnation (the settings cached for up to a second still named it) is not acknowledged there: its
writes are removed with the incarnation's directory, and it is sent again to the entity's new
incarnation when it was created again (as a reconnecting SDK sender's next attempt would), or raises
MessagingEntityNotFoundError. A commit to a removed table never retries (TableRemovedError), so no
deleted queue ends a send in CommitConflictError.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Callable, Optional
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import records
from ..core import partitioning, sequencing, transitions
from ..core.durations import MAX_DURATION
from ..core.encoding import OUTGOING, body_sizes, header_sizes
from ..exceptions import (CommitConflictError, InvalidOperationError, MessageNotFoundError, MessageSizeExceededError,
                          MessagingEntityDisabledError, PartitionUnavailableError, ServiceBusError,
                          ServiceBusQuotaExceededError)
from ..storage import DeltaTable, commits, followed, location, maintenance, unnumbered
from ..storage.reader import PartitionReader
from ..core.schemas import BORN_DEAD_LETTER_COLUMNS, CANCELLED, LOCKS, MESSAGES, TRANSFER_COLUMNS
from . import duplicates, locks, retry
from .registry import CachedEntity, EntityDeleted, EntityInfo
from .retry import DEFAULT as DEFAULT_RETRY, RetryPolicy
from .runtime import PartitionSizes, partition_sizes
from . import clock

# Service Bus reports DateTime.MaxValue as the expiry of a message that never expires.
LATEST_TIME_US = records.micros(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc))


@dataclass
class EnqueueResult:
    """Outcome of one send: accepted and discarded-duplicate counts, and sequence numbers.

    sequence_numbers follows the input rows; a discarded duplicate has None.
    partitions maps each touched partition to the (first, last) sequence number assigned there.
    """

    message_count: int = 0
    duplicate_count: int = 0
    sequence_numbers: list[Optional[int]] = field(default_factory=list)
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)


def _first_rows(mask: np.ndarray, rows: pa.Table, limit: int = 5) -> str:
    """'positions [..] (message_id [..])' of the first offending rows."""
    where = np.flatnonzero(mask)[:limit]
    ids = rows["message_id"].take(pa.array(where)).to_pylist()
    return f"positions {where.tolist()} (message_id {ids})"


def _reject_oversized(rows: pa.Table, sizes: np.ndarray, limit: int, text: str) -> None:
    over = sizes > limit
    if over.any():
        first = int(np.flatnonzero(over)[0])
        raise MessageSizeExceededError(text.format(sizes[first], limit) + f" (rows at {_first_rows(over, rows)})")


def check_rows(info: EntityInfo, rows: pa.Table, *, batch_limit: bool) -> tuple[np.ndarray, np.ndarray]:
    """Entity status, session and size rules for rows; returns (body sizes, header sizes)."""
    check_status(info)
    if info.options.requires_session and rows.num_rows and rows["session_id"].null_count:
        missing = _first_rows(np.asarray(pc.is_null(rows["session_id"])), rows)
        raise InvalidOperationError(
            f"{info.kind} {info.path!r} requires sessions: the messages at {missing} have no session_id")
    body = body_sizes(rows)
    header = header_sizes(rows)
    size = body + header
    _reject_oversized(rows, header, info.max_header_bytes, "message header of {} bytes exceeds the {}-byte limit")
    _reject_oversized(rows, size, info.max_message_bytes, "message of {} bytes exceeds the {}-byte message size limit")
    if batch_limit and int(size.sum()) > info.max_batch_bytes:
        raise MessageSizeExceededError(
            f"the batch of {len(size)} messages is {int(size.sum())} bytes; the limit is {info.max_batch_bytes}")
    return body, header


def check_status(info: EntityInfo) -> None:
    """MessagingEntityDisabledError when the entity takes no messages (Disabled, SendDisabled)."""
    status = info.options.status
    if status in ("Disabled", "SendDisabled"):
        raise MessagingEntityDisabledError(f"{info.kind} {info.path!r} is {status}; sending is not allowed")


# The columns of a message row that depend on its commit: what an unnumbered file (a bulk send's, written
# before its commit: storage.unnumbered) holds placeholders in until the commit fills them in.
FILLED = ("sequence_number", "enqueued_time_utc", "expires_at_utc")


@dataclass(frozen=True)
class Unnumbered:
    """A data file of new messages written before their commit (storage.unnumbered), in the MESSAGES
    schema without the partition column, of one partition (partitioning.KEYLESS: of keyless messages,
    placed whole by the commit): FILLED hold placeholders, the expiry reckoned from written_at_us (the
    enqueue time the file assumes, microseconds since the epoch). body_bytes and header_bytes: the sums
    of its rows' sizes (quota checks)."""

    path: str
    partition: int
    rows: int
    body_bytes: int
    header_bytes: int
    written_at_us: int


@dataclass
class _Member:
    """One caller's messages in a group commit, and what came of them."""

    rows: pa.Table
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[EnqueueResult] = None
    error: Optional[BaseException] = None


def _split(result: EnqueueResult, sizes: list[int]) -> list[EnqueueResult]:
    """Per caller, its part of a group commit's result (rows in the order the callers' rows were joined)."""
    parts, start = [], 0
    for size in sizes:
        numbers = result.sequence_numbers[start:start + size]
        start += size
        ranges: dict[int, tuple[int, int]] = {}
        for n in numbers:
            if n is not None:
                p = sequencing.partition_of_sequence(n)
                low, high = ranges.get(p, (n, n))
                ranges[p] = (min(low, n), max(high, n))
        accepted = sum(n is not None for n in numbers)
        parts.append(EnqueueResult(accepted, size - accepted, numbers, ranges))
    return parts


@dataclass
class SizeBounds:
    """Per partition, an upper bound of the bytes its messages store, kept between sends without reading.

    The bound is the sum of what each counted file adds (rows x its largest message, from statistics;
    a send's own files exactly), or a partition's exact measure plus the files counted since. A file
    removed later (compaction, retention) subtracts what it added: its live rows are in the file
    replacing it, counted when that is added. A partition measured exactly
    (`measured`) forgets its counted files, since the measure leaves out settled rows those files still
    hold: their removal then subtracts nothing, and the bound stays an upper bound. Without subtracting,
    each compaction counted a partition's messages again and every send near the quota measured exactly
    (13 ms each)."""

    counted: dict[str, tuple[int, int]] = field(default_factory=dict)  # file path -> (partition, bytes)
    totals: dict[int, int] = field(default_factory=dict)

    def get(self, partition: int) -> int:
        return self.totals.get(partition, 0)

    def add(self, path: str, partition: int, size: int) -> None:
        self.counted[unquote(path)] = (partition, size)
        self.totals[partition] = self.totals.get(partition, 0) + size

    def remove(self, path: str) -> None:
        partition, size = self.counted.pop(unquote(path), (None, 0))
        if partition is not None:
            self.totals[partition] -= size

    def measured(self, exact: dict[int, int]) -> None:
        """Partitions measured exactly (partition -> bytes)."""
        self.counted = {path: c for path, c in self.counted.items() if c[0] not in exact}
        self.totals.update(exact)


class EntityWriter:
    """Appends to one entity's messages table, keeping its table handle and high-water marks between sends."""

    def __init__(self, info_source: Callable[[], EntityInfo], *, retry: RetryPolicy = DEFAULT_RETRY,
                 entity: Optional[CachedEntity] = None) -> None:
        """entity: the sender's, whose confirm raises EntityDeleted when an incarnation is no longer the
        entity's; given, sends follow the entity across a delete (see the module docstring)."""
        self._info_source = info_source
        self._retry = retry
        self._entity = entity
        self._round_robin: Optional[partitioning.RoundRobin] = None
        self._table: Optional[DeltaTable] = None
        self._table_uri: Optional[str] = None
        self._log: Optional[commits.TableLog] = None
        # High-water marks and size bounds, valid at version _position: the commit's claim must describe
        # exactly the snapshot it is checked against, or numbers would repeat. None: read them again.
        self._marks: dict[int, int] = {}
        self._bounds = SizeBounds()
        self._measured: Optional[PartitionSizes] = None  # the last exact measure (_check_quota)
        self._position: Optional[commits.Position] = None
        self._joining = threading.Lock()     # guards _group
        self._committing = threading.Lock()  # one group commit at a time
        self._group: Optional[list[_Member]] = None  # the group new callers join

    def send(self, rows: pa.Table) -> EnqueueResult:
        """append() of one caller's messages (OUTGOING rows, within the batch limit), committed together
        with other threads' concurrent sends to this entity (see the module docstring)."""
        member = _Member(rows)
        with self._joining:
            leads = self._group is None
            if leads:
                self._group = []
            group = self._group
            assert group is not None  # this caller's, or the one it joins
            group.append(member)
        if leads:
            with self._committing:  # while the previous group commits, others join this one
                with self._joining:
                    self._group = None
                self._commit_group(group)
        member.done.wait()
        if member.error is not None:
            raise member.error
        assert member.result is not None  # _commit_group answers every member
        return member.result

    def _commit_group(self, group: list[_Member]) -> None:
        try:
            if len(group) > 1:
                try:
                    self._commit_together(group)
                    return
                except (ServiceBusError, ValueError, TypeError):  # refused before writing: each on its own
                    pass
            for member in group:
                if member.result is not None or member.error is not None:
                    continue  # answered on its own already (_commit_together)
                try:
                    member.result = self.append(member.rows)
                except BaseException as error:
                    member.error = error
        except BaseException as error:
            for member in group:
                if member.result is None and member.error is None:
                    member.error = error
        finally:
            for member in group:
                member.done.set()

    def _commit_together(self, group: list[_Member]) -> None:
        """One commit of the group's messages. A caller whose own messages break a size or session rule
        (or its batch limit) is answered on its own, by the same checks it would meet alone, so it does
        not hold back the others."""
        info = self.info()
        rows = pa.concat_tables([m.rows for m in group])
        counts = [m.rows.num_rows for m in group]  # each at least 1: senders skip empty sends
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        body = body_sizes(rows)
        header = header_sizes(rows)
        broken = (header > info.max_header_bytes) | (body + header > info.max_message_bytes)
        if info.options.requires_session:
            broken |= np.asarray(pc.is_null(rows["session_id"]))
        alone = np.logical_or.reduceat(broken, starts) | (np.add.reduceat(body + header, starts) > info.max_batch_bytes)
        for member in (m for m, refused in zip(group, alone) if refused):
            try:
                member.result = self.append(member.rows, info=info)
            except BaseException as error:
                member.error = error
        members = [m for m, refused in zip(group, alone) if not refused]
        if members:
            together = rows.filter(pa.array(np.repeat(~alone, counts))) if alone.any() else rows
            result = self.append(together, batch_limit=False, info=info)
            for member, part in zip(members, _split(result, [m.rows.num_rows for m in members])):
                member.result = part

    def info(self) -> EntityInfo:
        return self._info_source()

    def append(self, rows: pa.Table, *, codes: Optional[np.ndarray] = None, batch_limit: bool = True,
               info: Optional[EntityInfo] = None, with_sequence_numbers: bool = True,
               app_transactions: Optional[dict[str, int]] = None) -> EnqueueResult:
        """Send rows (OUTGOING schema, plus the TRANSFER_COLUMNS when forwarding) as one atomic commit.

        codes: placement codes computed elsewhere (the Spark UDF); batch_limit: apply the tier's batch size
        limit (not for DataFrames); with_sequence_numbers: report each row's number (not for bulk sends);
        app_transactions: {app id: version} recorded with the commit; when the table already has every one
        of them at its version or later, nothing is written (a replayed streaming batch, a forwarded batch
        copied before), and when it has some of them, CommitConflictError (another writer copied part).
        Two concurrent commits of one app id conflict, and the check is made at the version the commit is
        based on.
        """
        info = info or self.info()
        try:
            return self._append(info, rows, codes, batch_limit, with_sequence_numbers, app_transactions)
        except EntityDeleted as gone:  # (only with confirm) created again: send there, placed for it
            if gone.current is None or codes is not None or app_transactions:
                raise
            return self._append(gone.current, rows, codes, batch_limit, with_sequence_numbers, app_transactions)

    def _append(self, info: EntityInfo, rows: pa.Table, codes: Optional[np.ndarray], batch_limit: bool,
                with_sequence_numbers: bool, app_transactions: Optional[dict[str, int]]) -> EnqueueResult:
        """append() on info's incarnation: confirmed after its commit and after a failure (EntityDeleted)."""
        if not rows.schema.equals(OUTGOING):  # (a sender's rows are OUTGOING already: no copy for them)
            names = set(rows.schema.names)
            schema = pa.schema([*OUTGOING, *(MESSAGES.field(n) for n in TRANSFER_COLUMNS if n in names)])
            rows = rows.select(schema.names).cast(schema)
        body, header = check_rows(info, rows, batch_limit=batch_limit)
        if self._round_robin is None:
            self._round_robin = partitioning.RoundRobin(info.partition_count)
        if codes is None:
            codes = partitioning.table_codes(rows, info.options.requires_duplicate_detection,
                                             info.partition_count)
        placed = partitioning.resolve(codes, info.avoided(), self._round_robin, info.partition_count)
        dedup = info.options.requires_duplicate_detection
        keep = duplicates.first_occurrences(rows["message_id"].to_pylist()) if dedup else np.ones(rows.num_rows, bool)
        ahead = self._entity.check_ahead(info) if self._entity is not None else None

        def attempt() -> EnqueueResult:
            table = self._view(info, reads=dedup or bool(app_transactions))
            if app_transactions:
                done = commits.app_versions(table, app_transactions)
                have = sorted(app for app, version in app_transactions.items()
                              if (found := done[app]) is not None and found >= version)
                if len(have) == len(app_transactions):
                    return EnqueueResult()
                if have:
                    raise CommitConflictError(f"{info.path!r} already has application transactions {have} of "
                                              f"this commit (another writer made them); nothing was written")
            return self._commit(info, table, rows, placed, keep, body, header, dedup, with_sequence_numbers,
                                app_transactions)

        def refresh() -> None:  # the conflict or the cleaned-up log says the table moved on
            self._position = None
            if self._entity is not None:  # or the table was deleted: no retry mends that
                self._entity.confirm(info)

        try:
            result = retry.run(attempt, self._retry, what=f"sending to {info.path!r}", on_transient=refresh)
        except EntityDeleted:
            raise
        except Exception as error:  # not transient (retry.run raised it): a partition's fault? (DataFusion
            # and object_store errors are plain Exceptions naming the file, OSErrors the path)
            if self._entity is not None:  # a deleted table's missing files are no fault
                self._entity.confirm(info, error)
            if isinstance(error, ServiceBusError):  # refused by a rule or a conflict: not the storage's fault
                raise
            partition = info.fault_in(error)
            if partition is None or partition not in placed:
                raise
            # The write failed before its commit (reading or writing the partition's files), so nothing
            # was committed: place again without it (keyless messages go elsewhere; keyed ones
            # raise PartitionUnavailableError). Each failure removes one partition, so this ends.
            try:
                return self._append(info, rows, codes, batch_limit, with_sequence_numbers, app_transactions)
            except PartitionUnavailableError as unavailable:
                if "could not be written" in str(unavailable):  # a later partition's failure says it already
                    raise
                raise PartitionUnavailableError(f"{unavailable}; partition {partition} could not be written: "
                                                f"{error}") from error
        if self._entity is not None:
            self._entity.confirm(info, ahead=ahead)
        return result

    def _view(self, info: EntityInfo, reads: bool) -> DeltaTable:
        """The messages table with marks and bounds at a position commits may be based on. reads: the
        caller reads the table (duplicates, application transactions), so the table object must be at that
        position too. Sends in between commit directly and leave the object behind, which costs nothing
        until something reads it."""
        uri = info.tables["messages"]
        if self._table is None or self._table_uri != uri:
            self._table, self._table_uri, self._position = storage.open_table(uri), uri, None
        else:
            assert self._log is not None  # read with the table
            if self._position is None or reads or time.monotonic() - self._position.known_at > self._log.safe_seconds:
                self._table = storage.refresh(self._table)
            else:
                return self._table
        self._log = commits.TableLog.of(self._table)  # read again: the table's settings may have changed
        if self._position is None or self._table.version() != self._position.version:
            self._marks = storage.high_water_marks(self._table)
            self._bounds = _size_upper_bounds(self._table, info.header_copies)
        self._position = commits.position_of(self._table)
        return self._table

    def _commit(self, info: EntityInfo, table: DeltaTable, rows: pa.Table, placed: np.ndarray, keep: np.ndarray,
                body: np.ndarray, header: np.ndarray, dedup: bool, with_sequence_numbers: bool,
                app_transactions: Optional[dict[str, int]] = None) -> EnqueueResult:
        now = clock.now()
        accept = keep.copy()
        if dedup and accept.any():
            window = info.options.duplicate_detection_history_time_window
            seen = duplicates.recent_ids(table, np.unique(placed[accept]).tolist(), now, window)
            accept &= duplicates.not_seen(rows["message_id"], seen)
        result = EnqueueResult(duplicate_count=int((~accept).sum()),
                               sequence_numbers=[None] * rows.num_rows if with_sequence_numbers else [])
        if not accept.any():
            return result
        index = np.flatnonzero(accept)
        partitions = placed[index]
        touched = np.unique(partitions).tolist()
        stored = body[index] + header[index] * info.header_copies
        incoming = {int(p): int(stored[partitions == p].sum()) for p in touched}
        self._check_quota(info, incoming)
        sequence, ranges = sequencing.number(partitions, self._marks)
        accepted = rows if len(index) == rows.num_rows else rows.take(pa.array(index))
        data = stored_rows(accepted, partitions, sequence, body[index], header[index], now,
                           info.options.default_message_time_to_live).drop_columns(
            [storage.PARTITION_COLUMN])
        claim = commits.Claim({p: (sequencing.compose(p, self._marks.get(p, 0) + 1), math.inf) for p in touched},
                              app_ids=frozenset(app_transactions or ()))
        assert self._log is not None and self._position is not None  # set by _view
        ahead = commits.tail_ahead(self._log, self._position)
        # a filter per partition: 0.6 s for 1 GB, one Table.take grouping it 9 s (a table of many chunks)
        files = commits.write_files(self._log, touched, lambda p: data if len(touched) == 1
                                    else data.filter(pa.array(partitions == p)))
        transactions = dict(app_transactions) if app_transactions else None
        try:
            done = commits.commit(self._log, self._position, files, [], claim, transactions, ahead=ahead)
        except BaseException:
            commits.discard(self._log, files)
            raise
        self._committed(info, done, files, transactions, ranges, [incoming[added.partition] for added in files])
        result.message_count = len(index)
        result.partitions = ranges
        if with_sequence_numbers:
            for i, seq in zip(index.tolist(), sequence.tolist()):
                result.sequence_numbers[i] = seq
        return result

    def _committed(self, info: EntityInfo, done: commits.Committed, files: list[commits.AddedFile],
                   transactions: Optional[dict[str, int]], ranges: dict[int, tuple[int, int]],
                   stored: list[int]) -> None:
        """After this writer's commit of files (stored: each file's stored bytes): the followed views,
        marks, size bounds and position move to it, and maintenance hears of the version."""
        assert self._log is not None and self._position is not None  # set by _view
        followed.committed(info.tables["messages"], self._position.version, done, files, transactions)
        for entry in done.skipped:  # other writers' commits between the base and this one (other partitions)
            self._learn(entry, info.header_copies)
        for pid, (_, last) in ranges.items():
            self._marks[pid] = last & sequencing.LOW_MASK
        for added, size in zip(files, stored):
            self._bounds.add(added.path, added.partition, size)
        if self._position is not None:  # (None: a skipped entry says to read the table again)
            self._position = done.position
        maintenance.after_direct_commit(self._log.uri, done.version)

    def stats_columns(self, info: EntityInfo) -> tuple[str, ...]:
        """The columns the messages table keeps statistics of (what an unnumbered file's writer needs)."""
        self._view(info, reads=False)
        assert self._log is not None  # read with the table
        return self._log.stats_columns

    def append_unnumbered(self, files: list[Unnumbered], *, info: Optional[EntityInfo] = None) -> EnqueueResult:
        """Send the messages of files written before their commit (Unnumbered, in the DataFrame's order:
        each partition's files numbered one after the other) as one atomic commit: the files move into
        the table, and each attempt fills in their sequence numbers and enqueue times (and the expiry
        reckoned from them) before it commits, again after a conflict. The caller has applied the
        session and size rules and the placement; here the entity's status and its partitions' size
        quota are checked. Only for entities without duplicate detection; the files are removed when
        nothing is committed."""
        info = info or self.info()
        check_status(info)
        if info.options.requires_duplicate_detection:
            raise ValueError("unnumbered files skip duplicate detection: send them to entities without it")
        if not files:
            return EnqueueResult()
        keyless = [i for i, f in enumerate(files) if f.partition == partitioning.KEYLESS]
        if keyless:
            if self._round_robin is None:
                self._round_robin = partitioning.RoundRobin(info.partition_count)
            unavailable = info.avoided()
            placed = partitioning.keyless_files([files[i].rows for i in keyless],
                                                [p for p in range(info.partition_count) if p not in unavailable],
                                                self._round_robin)
            files = list(files)
            for i, p in zip(keyless, placed):
                files[i] = replace(files[i], partition=p)
        incoming: dict[int, int] = {}
        stored = [f.body_bytes + f.header_bytes * info.header_copies for f in files]
        for f, size in zip(files, stored):
            incoming[f.partition] = incoming.get(f.partition, 0) + size
        ahead = self._entity.check_ahead(info) if self._entity is not None else None
        self._view(info, reads=False)
        assert self._log is not None
        log = self._log
        adopted: list[str] = []
        try:
            for f in files:
                adopted.append(commits.adopt(log, f.partition, f.path))
        except BaseException:
            commits.discard_paths(log, adopted)
            raise
        as_of = [f.written_at_us for f in files]  # the enqueue time each file's FILLED columns hold now

        def attempt() -> EnqueueResult:
            self._view(info, reads=False)
            self._check_quota(info, incoming)
            partitions = np.repeat(np.array([f.partition for f in files], dtype=np.int32), [f.rows for f in files])
            sequence, ranges = sequencing.number(partitions, self._marks)
            now_us = records.micros(clock.now())
            added, start = [], 0
            for i, (relative, f) in enumerate(zip(adopted, files)):
                numbers, shift = sequence[start:start + f.rows], now_us - as_of[i]
                start += f.rows
                unnumbered.fill(location.join(log.uri, unquote(relative)), {
                    "sequence_number": _replaced(numbers),
                    "enqueued_time_utc": _replaced(np.full(f.rows, now_us, dtype=np.int64)),
                    "expires_at_utc": _later(shift)})
                as_of[i] = now_us
                added.append(commits.added_file(log, f.partition, relative))
            assert self._position is not None  # set by _view
            claim = commits.Claim({p: (sequencing.compose(p, self._marks.get(p, 0) + 1), math.inf) for p in ranges})
            done = commits.commit(log, self._position, added, [], claim, ahead=commits.tail_ahead(log, self._position))
            self._committed(info, done, added, None, ranges, stored)
            return EnqueueResult(message_count=len(sequence), partitions=ranges)

        def refresh() -> None:  # the conflict or the cleaned-up log says the table moved on
            self._position = None
            if self._entity is not None:
                self._entity.confirm(info)

        try:
            result = retry.run(attempt, self._retry, what=f"sending to {info.path!r}", on_transient=refresh)
        except BaseException as error:
            commits.discard_paths(log, adopted)
            if self._entity is not None and isinstance(error, Exception) and not isinstance(error, EntityDeleted):
                self._entity.confirm(info, error)
            raise
        if self._entity is not None:
            self._entity.confirm(info, ahead=ahead)
        return result

    def _learn(self, entry: commits.Entry, header_copies: int) -> None:
        """Bring marks and bounds past another writer's entry (see SizeBounds for removed files). Reading the
        table again after every compaction put the single-send p99 at 30-90 ms (delta-rs replaying the
        log). An entry that changed the table's metadata or carries no statistics makes the next send read
        marks and bounds again."""
        if entry.table_changed:
            self._position = None
        for path in entry.removed:
            self._bounds.remove(path)
        for added in entry.added:
            top = added.high.get("sequence_number")
            if top is None:
                self._position = None
                continue
            p = added.partition
            self._marks[p] = max(self._marks.get(p, 0), top & sequencing.LOW_MASK)
            largest = added.high.get("body_size", 0) + added.high.get("header_size", 0) * header_copies
            self._bounds.add(added.path, p, added.rows * largest)

    def _check_quota(self, info: EntityInfo, incoming: dict[int, int]) -> None:
        """Each partition must hold its messages plus the new ones within the entity's per-partition size.

        A cheap upper bound from file statistics decides most sends; only near the limit is the partition's
        exact size queried (about 13 ms); that measure, followed along the tables' logs, answers again for a
        partition whose files have not changed since: a sender retrying against a full partition is refused
        without a query each time.
        """
        limit = info.max_partition_bytes
        doubtful = [p for p, add in incoming.items() if self._bounds.get(p) + add > limit]
        if not doubtful:
            return
        measured = self._measured
        if measured is not None:
            measured.follow(info.tables["messages"], info.tables["locks"])
        if measured is None or not set(doubtful) <= measured.sizes.keys():  # every partition: one query costs the same
            measured = self._measured = partition_sizes(info.tables["messages"], info.tables["locks"],
                                                        range(info.partition_count), info.header_copies)
        self._bounds.measured({p: measured.sizes[p] for p in doubtful})  # at the latest version: still bounds here
        for p in doubtful:
            exact = measured.sizes[p]
            if exact + incoming[p] > limit:
                raise ServiceBusQuotaExceededError(
                    f"partition {p} of {info.kind} {info.path!r} holds {exact} bytes; adding "
                    f"{incoming[p]} would exceed its {limit}-byte size limit")


def _size_upper_bounds(table: DeltaTable, header_copies: int) -> SizeBounds:
    """Per partition, an upper bound of stored bytes from file statistics (rows x largest sizes)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    bounds = SizeBounds()
    if actions.num_rows == 0:
        return bounds
    columns = ("path", "partition.partition_id", "num_records", "max.body_size", "max.header_size")
    for path, pid, n, body, header in zip(*(actions[c].to_pylist() for c in columns)):
        bounds.add(path, pid, n * ((body or 0) + (header or 0) * header_copies))
    return bounds


def stored_rows(rows: pa.Table, partitions: np.ndarray, sequence: np.ndarray, body: np.ndarray,
                header: np.ndarray, now: datetime, default_ttl: timedelta) -> pa.Table:
    """OUTGOING rows completed with placement, numbering, times and sizes, in the MESSAGES schema (times
    as int64 arrays viewed as timestamps: a cast cost 8x; this took 239 us for a single send's row, now
    124). default_ttl: the entity's default message time to live."""
    now_us = records.micros(now)
    ttl_column = rows["time_to_live_ms"]
    if ttl_column.null_count == len(ttl_column):  # no message sets one (the usual case): no kernel calls
        has_ttl, ttl_ms = np.zeros(len(ttl_column), dtype=bool), np.zeros(len(ttl_column), dtype=np.int64)
    else:
        has_ttl = np.asarray(pc.is_valid(ttl_column))
        ttl_ms = np.asarray(pc.fill_null(ttl_column, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    if default_ttl < MAX_DURATION:  # effective time-to-live: min(message's, entity default)
        default_ms = default_ttl // timedelta(milliseconds=1)
        ttl_ms = np.where(has_ttl, np.minimum(ttl_ms, default_ms), default_ms)
        has_ttl = np.ones(len(ttl_ms), dtype=bool)
    headroom_ms = (LATEST_TIME_US - now_us) // 1000
    expires = np.where(has_ttl & (ttl_ms < headroom_ms), now_us + ttl_ms * 1000, LATEST_TIME_US).astype(np.int64)
    columns = dict(zip(rows.schema.names, rows.columns))
    count = len(sequence)
    for name in (*TRANSFER_COLUMNS, *BORN_DEAD_LETTER_COLUMNS):  # no transfer made; not a dead-letter copy
        if name not in columns:
            columns[name] = records.nulls(count, MESSAGES.field(name).type)
    columns.update(partition_id=pa.array(partitions.astype(np.int32, copy=False)),
                   sequence_number=pa.array(sequence, pa.int64()),
                   enqueued_time_utc=pa.array(np.full(count, now_us), pa.int64()).view(_TIME),
                   expires_at_utc=pa.array(expires, pa.int64()).view(_TIME),
                   body_size=pa.array(body, pa.int64()), header_size=pa.array(header, pa.int64()))
    return pa.Table.from_arrays([columns[name] for name in MESSAGES.names], schema=MESSAGES)


_TIME = MESSAGES.field("enqueued_time_utc").type


def _replaced(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A fill of a column (storage.unnumbered.fill): values, whatever it holds."""
    return lambda current: values


def _later(shift_us: int) -> Callable[[np.ndarray], np.ndarray]:
    """A fill of an expiry column: each expiry shift_us later, as its enqueue time moved (one that never
    comes stays so, and none passes the latest time)."""
    return lambda current: np.where(current == LATEST_TIME_US, current, np.minimum(current + shift_us, LATEST_TIME_US))


# what cancelling reads of the messages it names (files kept between calls; one lock for the process's threads)
_scheduled = PartitionReader(MESSAGES, columns=("sequence_number", "scheduled_enqueue_time_utc"))
_scheduled_guard = threading.Lock()


def cancel_scheduled(info: EntityInfo, numbers: list[int], policy: RetryPolicy = DEFAULT_RETRY,
                     confirm: Optional[Callable[[], None]] = None) -> None:
    """Mark scheduled, not yet enqueued messages cancelled, all or none, in one commit naming their partitions
    (locks.commit_partitions), decided on the tables' log views (storage.followed) and files kept in memory.
    confirm: run after a lost commit before planning again (it raises when the entity was deleted)."""
    by_partition: dict[int, list[int]] = {}
    for n in sorted(set(numbers)):
        by_partition.setdefault(sequencing.partition_of_sequence(n), []).append(n)

    def attempt() -> None:
        now = clock.now()
        now_us = records.micros(now)
        state = followed.view_of(info.tables["locks"], advance=False)
        messages = followed.view_of(info.tables["messages"], advance=False)
        followed.advance_pair(state, messages)
        found: set[int] = set()
        with _scheduled_guard:
            _scheduled.prefetch(messages, by_partition)
            for partition, wanted in by_partition.items():
                rows = _scheduled.rows(messages, partition)
                waiting = pc.and_(pc.is_in(rows["sequence_number"], value_set=pa.array(wanted, pa.int64())),
                                  pc.fill_null(pc.greater(rows["scheduled_enqueue_time_utc"].cast(pa.int64()), now_us),
                                               False))
                found.update(rows["sequence_number"].filter(waiting).to_pylist())
        missing = sorted(set(numbers) - found)
        if missing:
            raise MessageNotFoundError(
                f"no message waiting for its scheduled time with sequence number(s) {missing[:10]} in {info.path!r}")
        taken = sorted(n for partition, wanted in by_partition.items()
                       for n in locks.lock_rows(state, partition, wanted)["sequence_number"].to_pylist())
        if taken:
            raise MessageNotFoundError(f"message(s) {taken[:10]} were already delivered, settled or cancelled")
        locks.commit_partitions(state, {partition: records.from_rows(
            [transitions.new_state(partition, n, CANCELLED, 0, now) for n in wanted], LOCKS)
            for partition, wanted in by_partition.items()})
        followed.offer(state)
        followed.offer(messages)

    retry.run(attempt, policy, what=f"cancelling scheduled messages of {info.path!r}", on_transient=confirm)
