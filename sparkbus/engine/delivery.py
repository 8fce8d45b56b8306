"""The delivery engine under ServiceBusReceiver: lock, settle, renew, peek, deferred messages and sessions.

One Delivery serves one receiver. It follows the entity's tables between calls (storage.commits.LogView:
only the log entries written since are read; delta-rs tables, refreshed, serve SQL) and keeps the
partitions' data files it read in memory (storage.PartitionReader: files never change, so only those
committed since are read), runs every operation under the client's retry policy, and now and then asks
the maintenance thread for a retention run. What to lock is chosen on Arrow (sparkbus.core.transitions).
Concurrency: each operation is planned on one table version and committed conditionally against it
(sparkbus.engine.locks); losing to another writer means planning again on the newer version. Settling reads
nothing first when the receiver's locks are fresh (sparkbus.core.transitions.is_fresh): nobody else can have
changed those rows, and a retry after a lost commit always reads. Calls from several threads of one
receiver (AutoLockRenewer renews from its own) are serialised by one re-entrant lock.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Iterable, Optional, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from .. import storage
from ..core import partitioning, sequencing, transitions
from ..core.transitions import Policy
from ..exceptions import (MessageLockLostError, MessageNotFoundError, OperationTimeoutError, PartitionUnavailableError,
                          SessionCannotBeLockedError)
from ..storage import commits, maintenance
from ..storage.schemas import ACTIVE, DEFERRED, LOCKS, MESSAGES
from . import locks, retention, retry, sessions
from .catalog import Catalog
from .registry import CachedEntity, EntityInfo
from .retry import RetryPolicy

T = TypeVar("T")
POLL_START, POLL_MAX = 0.01, 0.5  # seconds between polls of an empty entity, doubling
NEXT_AVAILABLE = None  # lock_session(requested=NEXT_AVAILABLE): any session with available messages
Change = Callable[[dict, datetime], dict]


@dataclass
class SessionLock:
    """A session lock this receiver holds."""

    session_id: str
    partition: int
    lock_token: str
    locked_until_utc: datetime


@dataclass(frozen=True)
class Held:
    """A message lock this receiver holds: its token and, when known, the state row as written then."""

    token: str
    row: Optional[dict] = None


def policy(info: EntityInfo) -> Policy:
    """The entity settings that decide lock transitions."""
    return Policy(lock_duration=info.options.lock_duration, max_delivery_count=info.options.max_delivery_count,
                  dead_letter_on_expiry=info.options.dead_lettering_on_message_expiration)


def poll(attempt: Callable[[], Optional[T]], wait: Optional[float]) -> Optional[T]:
    """attempt() until it returns something or `wait` seconds passed (None: once), pausing 10 ms,
    doubling to 0.5 s, between tries."""
    deadline = time.monotonic() + (wait or 0)
    pause = POLL_START
    while True:
        got = attempt()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, POLL_MAX)


class Delivery:
    """Receive-side operations on one queue or subscription."""

    def __init__(self, catalog: Catalog, entity_path: str, kinds: tuple[str, ...], retry_policy: RetryPolicy) -> None:
        self.entity = CachedEntity(catalog, entity_path, kinds)
        self._retry = retry_policy
        self._tables: dict[str, DeltaTable] = {}
        self._views: dict[str, commits.LogView] = {}
        self._readers = {"messages": storage.PartitionReader(MESSAGES), "locks": storage.PartitionReader(LOCKS)}
        self._guard = threading.RLock()

    # ---- tables and retries ----------------------------------------------------------------------------

    def table(self, info: EntityInfo, role: str) -> DeltaTable:
        """The entity table at its latest version (kept open between calls)."""
        uri = info.tables[role]
        table = self._tables.get(uri)
        self._tables[uri] = storage.open_table(uri) if table is None else storage.refresh(table)
        return self._tables[uri]

    def view(self, info: EntityInfo, role: str) -> commits.LogView:
        """The entity table's files at its latest version, followed from its log (kept between calls)."""
        uri = info.tables[role]
        view = self._views.get(uri)
        if view is None:
            view = self._views[uri] = commits.LogView(storage.open_table(uri))
        return view.advance()

    def snapshot(self, info: EntityInfo) -> tuple[commits.LogView, commits.LogView]:
        """(messages, locks) views at their latest versions, locks read first: retention removes a
        message's row from messages before its state row from locks, so this order never shows a
        completed message without its state row (which would make it look active again)."""
        state = self.view(info, "locks")
        return self.view(info, "messages"), state

    def tables(self, info: EntityInfo) -> tuple[DeltaTable, DeltaTable]:
        """(messages, locks) as delta-rs tables at their latest versions (for SQL), locks read first."""
        state = self.table(info, "locks")
        return self.table(info, "messages"), state

    def retrying(self, info: EntityInfo, attempt: Callable[[int], T]) -> T:
        """attempt(try_number), which re-reads what it decides on, under the client's retry policy."""
        tries = iter(range(1 << 30))
        with self._guard:
            return retry.run(lambda: attempt(next(tries)), self._retry, what=f"receiving from {info.path!r}")

    def retain(self, info: EntityInfo, partition: int) -> None:
        """Now and then, let completed messages of the partition leave the tables (sparkbus.engine.retention),
        on the maintenance thread: inline, a run put 60-100 ms on every 25th receive+complete."""
        if retention.due(self._views[info.tables["locks"]].version):
            maintenance.run_later(f"retention {info.tables['locks']} {partition}", lambda: retention.run(
                info, storage.open_table(info.tables["messages"]), storage.open_table(info.tables["locks"]), partition))

    # ---- locking -----------------------------------------------------------------------------------------

    def lock(self, info: EntityInfo, partition: int, queue: str, count: int, *, delete: bool,
             sequence_numbers: Optional[list[int]] = None,
             session: Optional[SessionLock] = None) -> list[tuple[dict, dict]]:
        """Lock (delete: remove) up to count deliverable messages of one partition's `queue` (ACTIVE,
        DEFERRED or DEAD_LETTERED), oldest first; returns (message row, state row written) pairs."""
        rules = policy(info)

        def attempt(_: int) -> list[tuple[dict, dict]]:
            messages, state = self.snapshot(info)
            now = datetime.now(timezone.utc)
            taking = rules
            if session is not None:  # message locks end with the session lock, so a takeover finds them free
                self.check_session(info, session, now)
                taking = replace(rules, lock_duration=session.locked_until_utc - now)
            found = transitions.candidates(
                self._readers["messages"].rows(messages, partition), self._readers["locks"].rows(state, partition),
                queue, now, count + 16, sequence_numbers, session.session_id if session else None)
            rows, deliver = transitions.plan(found, taking, now, queue, delete, count)
            locks.commit(state, partition, rows)
            return list(zip(storage.as_rows(found.take(pa.array(deliver, pa.int64()))),
                            storage.as_rows(rows.slice(0, len(deliver)))))

        delivered = self.retrying(info, attempt)
        self.retain(info, partition)
        return delivered

    def lock_exactly(self, info: EntityInfo, queue: str, sequence_numbers: list[int], *, delete: bool,
                     session: Optional[SessionLock] = None) -> list[tuple[dict, dict]]:
        """Lock (delete: remove) exactly these messages of `queue` (receive_deferred_messages), or none:
        MessageNotFoundError names the numbers that are not deliverable now, before anything is written.
        Partitions commit one by one, so a number taken by another receiver between the check and its
        partition's commit releases the locks already taken here, delivery counts as they were (in
        RECEIVE_AND_DELETE mode, what an earlier partition removed in that race stays removed)."""
        wanted = deferred_partitions(sequence_numbers)
        messages, state = self.snapshot(info)
        now = datetime.now(timezone.utc)
        present = {n for partition, numbers in wanted.items() for n in transitions.candidates(
            self._readers["messages"].rows(messages, partition), self._readers["locks"].rows(state, partition),
            queue, now, len(numbers), numbers, session.session_id if session else None)["sequence_number"].to_pylist()}
        missing = sorted(set(sequence_numbers) - present)
        if missing:
            raise MessageNotFoundError(f"no {queue.lower()}, unlocked message with sequence number(s) {missing[:10]}; "
                                       "nothing was received")
        taken: list[tuple[dict, dict]] = []
        for partition, numbers in wanted.items():
            got = self.lock(info, partition, queue, len(numbers), delete=delete, sequence_numbers=numbers,
                            session=session)
            taken += got
            if len(got) < len(numbers):  # lost a race for one of them
                if not delete:
                    self.settle(info, {state_row["sequence_number"]: Held(state_row["lock_token"], state_row)
                                       for _, state_row in taken}, transitions.returned, session)
                lost = sorted(set(numbers) - {row["sequence_number"] for row, _ in got})
                raise MessageNotFoundError(f"message(s) {lost[:10]} were taken by another receiver; nothing was "
                                           "received")
        return taken

    def delete(self, info: EntityInfo, partition: int, queue: str, count: int, before: datetime,
               session: Optional[SessionLock] = None) -> int:
        """Remove up to count unlocked messages of one partition's `queue` enqueued before `before`, oldest
        first, in one conditional commit (a message locked meanwhile makes it retry); returns how many."""
        def attempt(_: int) -> int:
            messages, state = self.snapshot(info)
            now = datetime.now(timezone.utc)
            if session is not None:
                self.check_session(info, session, now)
            found = transitions.candidates(
                self._readers["messages"].rows(messages, partition), self._readers["locks"].rows(state, partition),
                queue, now, count, session_id=session.session_id if session else None, enqueued_before=before)
            if found.num_rows:
                locks.commit(state, partition, transitions.deleted(found, now))
            return found.num_rows

        removed = self.retrying(info, attempt)
        self.retain(info, partition)
        return removed

    def lock_any(self, info: EntityInfo, queue: str, count: int, *, delete: bool, start: int,
                 session: Optional[SessionLock] = None) -> list[tuple[dict, dict]]:
        """Up to count messages from the available partitions, visited from the start-th on (a session
        receiver visits its session's partition only)."""
        available = available_partitions(info)
        if session is not None:
            available = [p for p in available if p == session.partition]
        if not available:
            return []
        start %= len(available)
        got: list[tuple[dict, dict]] = []
        for partition in available[start:] + available[:start]:
            try:
                got += self.lock(info, partition, queue, count - len(got), delete=delete, session=session)
            except PartitionUnavailableError as fault:  # its files cannot be read: serve the others
                if info.fault_in(fault) != partition or session is not None:
                    raise
                continue
            if len(got) >= count:
                break
        return got

    # ---- settling ----------------------------------------------------------------------------------------

    def settle(self, info: EntityInfo, held: dict[int, Held], change: Change,
               session: Optional[SessionLock] = None) -> dict[int, dict]:
        """Apply change(row as locked, now) to held messages: one conditional commit per partition.
        MessageLockLostError if any lock was lost; with several partitions, all locks are checked before
        the first commit, so either all are settled or none. Returns the rows written by sequence number."""
        by_partition: dict[int, dict[int, Held]] = {}
        for seq, lock in held.items():
            by_partition.setdefault(sequencing.partition_of_sequence(seq), {})[seq] = lock
        if len(by_partition) > 1 and not self._all_fresh(held, datetime.now(timezone.utc)):
            with self._guard:
                state, now = self.view(info, "locks"), datetime.now(timezone.utc)
                lost = [seq for partition, mine in by_partition.items()
                        for seq in transitions.not_held(locks.lock_rows(state, partition, list(mine)), _tokens(mine),
                                                        now)]
            if lost:
                raise MessageLockLostError(
                    f"the locks of messages {sorted(lost)[:10]} expired or were taken; nothing completed")
        written: dict[int, dict] = {}
        for partition, mine in by_partition.items():
            written.update(self.retrying(info, lambda attempt, p=partition, m=mine:
                                         self._settle_partition(info, p, m, change, session, attempt)))
            self.retain(info, partition)
        return written

    def _settle_partition(self, info: EntityInfo, partition: int, held: dict[int, Held], change: Change,
                          session: Optional[SessionLock], attempt: int) -> dict[int, dict]:
        state, now = self.view(info, "locks"), datetime.now(timezone.utc)
        if session is not None:
            self.check_session(info, session, now, read=attempt > 0)
        if attempt == 0 and self._all_fresh(held, now):
            rows = [held[seq].row for seq in held]
        else:
            current = locks.lock_rows(state, partition, list(held))
            lost = transitions.not_held(current, _tokens(held), now)
            if lost:
                raise MessageLockLostError(
                    f"the locks of messages {lost[:10]} in partition {partition} expired or were taken by another "
                    "receiver; they will be redelivered")
            rows = storage.as_rows(current)
        written = [change(row, now) for row in rows]
        locks.commit(state, partition, storage.from_rows(written, LOCKS))
        return {row["sequence_number"]: row for row in written}

    @staticmethod
    def _all_fresh(held: dict[int, Held], now: datetime) -> bool:
        return all(lock.row is not None and lock.row["lock_token"] == lock.token
                   and transitions.is_fresh(lock.row["locked_until_utc"], now) for lock in held.values())

    def extend_locks(self, info: EntityInfo, partition: int, held: dict[int, str], until: datetime) -> None:
        """Set the message locks still held (seq -> token) to end at `until` (a renewed or released session)."""
        if not held:
            return

        def attempt(_: int) -> None:
            state = self.view(info, "locks")
            current = locks.lock_rows(state, partition, list(held))
            lost = transitions.not_held(current, held, datetime.now(timezone.utc))
            mine = current.filter(pc.invert(pc.is_in(current["sequence_number"], value_set=pa.array(lost, pa.int64()))))
            if mine.num_rows:
                locks.commit(state, partition, transitions.locked_until(mine, until))

        self.retrying(info, attempt)

    # ---- peeking -----------------------------------------------------------------------------------------

    def peek(self, info: EntityInfo, cursor: int, count: int, *, sub_queue: Optional[str],
             session_id: Optional[str]) -> tuple[list[dict], int]:
        """Up to count messages of one partition from sequence number `cursor` on, without locking, with
        their state columns; and the cursor to continue from (past the last partition: nothing left).
        sub_queue: the state of a sub-queue's messages (DEAD_LETTERED, TRANSFER_DEAD_LETTERED), or None."""
        messages, state = self.tables(info)
        queue = f"l.state = {storage.quoted(sub_queue)}" if sub_queue else (
            f"(l.state IS NULL OR l.state IN ('{ACTIVE}', '{DEFERRED}'))")
        if session_id is not None:
            queue += f" AND m.session_id = {storage.quoted(session_id)}"
        partition = sequencing.partition_of_sequence(cursor)
        while partition < info.partition_count:
            low = max(cursor, sequencing.compose(partition, 0))
            try:
                found = storage.as_rows(storage.query(f"""
                    SELECT m.*, l.state AS lock_state, l.delivery_count, l.dead_letter_reason,
                           l.dead_letter_error_description, l.dead_letter_source
                    FROM messages m LEFT JOIN locks l
                      ON m.partition_id = l.partition_id AND m.sequence_number = l.sequence_number
                    WHERE m.partition_id = {partition} AND m.sequence_number >= {low} AND {queue}
                    ORDER BY m.sequence_number LIMIT {count}""", messages=messages, locks=state))
            except Exception as error:  # DataFusion's errors are plain Exceptions naming the file
                if info.fault_in(error) != partition:
                    raise
                found = []  # a partition whose files cannot be read is skipped, as an unavailable one
            if found:
                return found, found[-1]["sequence_number"] + 1
            partition += 1
            cursor = sequencing.compose(partition, 0)
        return [], sequencing.compose(info.partition_count, 0)

    # ---- sessions ----------------------------------------------------------------------------------------

    def lock_session(self, info: EntityInfo, requested: Optional[str], wait: Optional[float]) -> SessionLock:
        """Lock the named session (requested=NEXT_AVAILABLE: the unlocked session with the oldest waiting
        message, across the available partitions), waiting up to `wait` seconds.
        SessionCannotBeLockedError while a named session stays locked; OperationTimeoutError when no
        session became available."""
        refused: list[SessionCannotBeLockedError] = []  # the named session's latest refusal

        def attempt() -> Optional[SessionLock]:
            try:
                return self._try_lock_session(info, requested)
            except SessionCannotBeLockedError as error:
                refused[:] = [error]
                return None

        taken = poll(attempt, wait)
        if taken is None and refused:
            raise refused[0]
        if taken is None:
            raise OperationTimeoutError(
                f"no unlocked session with available messages in {info.path!r} within {wait or 0} s")
        return taken

    def _try_lock_session(self, info: EntityInfo, requested: Optional[str]) -> Optional[SessionLock]:
        duration = info.options.lock_duration

        def take(partition: int, session_id: str) -> SessionLock:
            row = self.retrying(info, lambda _: sessions.lock(
                self.table(info, "sessions"), partition, session_id, duration, datetime.now(timezone.utc)))
            return SessionLock(session_id, partition, row["lock_token"], row["locked_until_utc"])

        if requested is not None:
            return take(partitioning.partition_of(requested, info.partition_count), requested)
        available = available_partitions(info)
        while available:
            messages, state = self.tables(info)
            table = self.table(info, "sessions")
            try:
                waiting = sessions.available(messages, state, table, available, datetime.now(timezone.utc))
            except Exception as error:  # a partition whose files cannot be read is left out
                faulty = info.fault_in(error)
                if faulty not in available:
                    raise
                available.remove(faulty)
                continue
            for partition, session_id in waiting:
                try:
                    return take(partition, session_id)
                except SessionCannotBeLockedError:
                    continue  # another receiver took it first
            return None
        return None

    def check_session(self, info: EntityInfo, session: SessionLock, now: datetime, read: bool = False) -> None:
        """SessionLockLostError unless the session lock is still held: known without reading while it is
        fresh (nobody can take an unexpired session lock), read back otherwise or when `read`."""
        if read or not transitions.is_fresh(session.locked_until_utc, now):
            self.session_row(info, session, now)

    def session_row(self, info: EntityInfo, session: SessionLock, now: datetime) -> dict:
        """The held session's row; SessionLockLostError if the lock expired or was taken."""
        return sessions.held(self.table(info, "sessions"), session.partition, session.session_id,
                             session.lock_token, now)

    def update_session(self, session: SessionLock, change: Callable[[dict, EntityInfo, datetime], Optional[dict]]) -> dict:
        """Apply change(row, info, now) to the held session's row (None: read only); returns the row."""
        info = self.entity.get()

        def attempt(_: int) -> dict:
            now = datetime.now(timezone.utc)
            row = self.session_row(info, session, now)
            written = change(row, info, now)
            if written is None:
                return row
            written["updated_at_utc"] = now
            sessions.write(self._tables[info.tables["sessions"]], written)
            return written

        return self.retrying(info, attempt)


def available_partitions(info: EntityInfo) -> list[int]:
    """The entity's partitions that are neither declared unavailable nor found faulty (availability.down)."""
    avoided = info.avoided()
    return [p for p in range(info.partition_count) if p not in avoided]


def _tokens(held: dict[int, Held]) -> dict[int, str]:
    return {seq: lock.token for seq, lock in held.items()}


def deferred_partitions(numbers: Iterable[int]) -> dict[int, list[int]]:
    """Sequence numbers grouped by the partition they were assigned in."""
    grouped: dict[int, list[int]] = {}
    for n in numbers:
        grouped.setdefault(sequencing.partition_of_sequence(n), []).append(n)
    return dict(sorted(grouped.items()))

