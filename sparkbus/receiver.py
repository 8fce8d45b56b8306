"""ServiceBusReceiver: receive, settle, defer, dead-letter and peek (azure-servicebus shape).

A receiving client is not aware of partitioning (seed): receive_messages queries every available
partition and locks the oldest available messages of each, partition by partition.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from enum import Enum, IntEnum
from typing import Callable, Iterable, Iterator, Optional, TypeVar, Union

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from . import locks, partitioning, retention, retry, sequencing, sessions, storage
from .catalog import Catalog
from .exceptions import (InvalidOperationError, MessageAlreadySettled, MessageLockLostError, MessageNotFoundError,
                     MessagingEntityDisabledError, OperationTimeoutError, SessionCannotBeLockedError,
                     SessionLockLostError)
from .locks import Policy
from .registry import CachedEntity, EntityInfo
from .retry import DEFAULT as DEFAULT_RETRY, RetryPolicy
from .schemas import ACTIVE, COMPLETED, DEAD_LETTERED, DEFERRED, LOCKS
from .values import decode_properties

RECEIVER_KINDS = ("queue", "subscription")
T = TypeVar("T")
POLL_START, POLL_MAX = 0.01, 0.5  # seconds between polls of an empty entity, doubling


class ServiceBusReceiveMode(str, Enum):
    PEEK_LOCK = "peeklock"
    RECEIVE_AND_DELETE = "receiveanddelete"


class ServiceBusSubQueue(str, Enum):
    DEAD_LETTER = "deadletter"


class ServiceBusSessionFilter(Enum):
    NEXT_AVAILABLE = 0


NEXT_AVAILABLE_SESSION = ServiceBusSessionFilter.NEXT_AVAILABLE


class ServiceBusMessageState(IntEnum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class ServiceBusReceivedMessage:
    """A received (or peeked) message: the sent properties plus broker-assigned ones."""

    def __init__(self, row: dict, state_row: Optional[dict], state: ServiceBusMessageState) -> None:
        self.body: bytes = row["body"]
        self.application_properties = decode_properties(row["application_properties"])
        for name in ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject", "to",
                     "reply_to", "reply_to_session_id", "sequence_number", "enqueued_time_utc",
                     "scheduled_enqueue_time_utc", "expires_at_utc"):
            setattr(self, name, row[name])
        ttl = row["time_to_live_ms"]
        self.time_to_live = None if ttl is None else timedelta(milliseconds=ttl)
        self.state = state
        state_row = state_row or {}
        self.delivery_count: int = state_row.get("delivery_count", row.get("prior_deliveries", 0)) or 0
        self.lock_token: Optional[str] = state_row.get("lock_token")
        self.locked_until_utc: Optional[datetime] = state_row.get("locked_until_utc")
        self.dead_letter_reason = state_row.get("dead_letter_reason", row.get("prior_reason"))
        self.dead_letter_error_description = state_row.get("dead_letter_error_description", row.get("prior_description"))
        self.dead_letter_source = state_row.get("dead_letter_source")
        self._partition_id: int = row["partition_id"]
        self._settled = False

    def __str__(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"ServiceBusReceivedMessage(sequence_number={self.sequence_number}, message_id={self.message_id!r}, "
                f"delivery_count={self.delivery_count})")


class ServiceBusSession:
    """The session a session receiver holds (azure-servicebus shape): its id, lock and durable state."""

    def __init__(self, receiver: "ServiceBusReceiver", row: dict) -> None:
        self._receiver = receiver
        self.session_id: str = row["session_id"]
        self._partition: int = row["partition_id"]
        self._lock_token: str = row["lock_token"]
        self.locked_until_utc: datetime = row["locked_until_utc"]

    def get_state(self) -> Optional[bytes]:
        """The session state last set (bytes), or None."""
        return self._receiver._session_update(lambda row, info, now: None)["state"]

    def set_state(self, state: Union[str, bytes, bytearray, None]) -> None:
        """Replace the session state (durable before this returns); at most the entity's max message size."""
        if isinstance(state, str):
            state = state.encode("utf-8")
        if state is not None and not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"session state must be bytes, str or None, got {type(state).__name__}")

        def stored(row: dict, info: EntityInfo, now: datetime) -> dict:
            if state is not None and len(state) > info.max_message_bytes:
                raise ValueError(f"session state of {len(state)} bytes exceeds the {info.max_message_bytes}-byte "
                                 "maximum message size")
            return {**row, "state": None if state is None else bytes(state)}
        self._receiver._session_update(stored)

    def renew_lock(self) -> datetime:
        """Extend the session lock (and the locks of its unsettled messages) by lock_duration from now."""
        def renewed(row: dict, info: EntityInfo, now: datetime) -> dict:
            return {**row, "locked_until_utc": now + info.options["lock_duration"]}
        self.locked_until_utc = self._receiver._session_update(renewed)["locked_until_utc"]
        self._receiver._extend_message_locks(self.locked_until_utc)
        return self.locked_until_utc

    def __repr__(self) -> str:
        return f"ServiceBusSession(session_id={self.session_id!r}, locked_until_utc={self.locked_until_utc})"


class ServiceBusReceiver:
    """Receiver of a queue or subscription (or its dead-letter sub-queue); with session_id, of one session."""

    def __init__(self, catalog: Catalog, entity_path: str, *, receive_mode: object = ServiceBusReceiveMode.PEEK_LOCK,
                 sub_queue: object = None, prefetch_count: int = 0, max_wait_time: Optional[float] = None,
                 session_id: Union[str, ServiceBusSessionFilter, None] = None, spark: object = None,
                 retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.receive_mode = ServiceBusReceiveMode(receive_mode)
        self.sub_queue = None if sub_queue is None else ServiceBusSubQueue(sub_queue)
        if isinstance(prefetch_count, bool) or not isinstance(prefetch_count, int) or prefetch_count < 0:
            raise ValueError(f"prefetch_count must be an int >= 0, got {prefetch_count!r}")
        self.prefetch_count = prefetch_count
        self.max_wait_time = _check_wait(max_wait_time)
        self.entity_path = entity_path
        self._entity = CachedEntity(catalog, entity_path, RECEIVER_KINDS)
        self._tables: dict[str, DeltaTable] = {}
        self._next_partition = 0
        self._peek_cursor: Optional[int] = None
        self._prefetched: list[ServiceBusReceivedMessage] = []
        self._spark = spark
        self._retry = retry
        self._state_lock = threading.RLock()  # AutoLockRenewer renews from its own thread
        if session_id is not None and not isinstance(session_id, (str, ServiceBusSessionFilter)):
            raise TypeError(f"session_id must be a str or NEXT_AVAILABLE_SESSION, got {type(session_id).__name__}")
        self._session_requested = session_id is not None
        self.session: Optional[ServiceBusSession] = None
        self._session_held: dict[int, str] = {}  # unsettled messages received under the session: seq -> token
        self._session_closed = False
        info = self._entity.get()
        self._check_receivable(info, receiving=False)
        if session_id is not None:
            self.session = ServiceBusSession(self, self._lock_session(info, session_id))

    def __enter__(self) -> "ServiceBusReceiver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Message locks simply expire, as in Service Bus. A held session is released: the locks of its
        unsettled messages end now (they are delivered again first), then the session lock."""
        if self.session is None or self._session_closed:
            return
        self._session_closed = True
        try:
            self._extend_message_locks(datetime.now(timezone.utc))
            self._session_update(lambda row, info, now: {**row, "lock_token": None, "locked_until_utc": None})
        except SessionLockLostError:
            pass  # another receiver holds the session already

    def __iter__(self) -> Iterator[ServiceBusReceivedMessage]:
        """Yields messages as they arrive; stops once max_wait_time passes without one."""
        while True:
            got = self.receive_messages(max_message_count=1)
            if not got:
                return
            yield got[0]

    # ---- receiving -------------------------------------------------------------------------------------

    def receive_messages(self, max_message_count: Optional[int] = 1,
                         max_wait_time: Optional[float] = None) -> list[ServiceBusReceivedMessage]:
        """Up to max_message_count available messages from any partitions, oldest first in each.

        Waits up to max_wait_time (default: the receiver's; None: no waiting) while nothing is available.
        """
        count = 1 if max_message_count is None else max_message_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_message_count must be an int >= 1, got {max_message_count!r}")
        wait = _check_wait(max_wait_time) if max_wait_time is not None else self.max_wait_time
        deadline = time.monotonic() + (wait or 0)
        pause = POLL_START
        while True:
            got = self._receive(count)
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, POLL_MAX)

    def receive_deferred_messages(self, sequence_numbers: Union[int, Iterable[int]]) -> list[ServiceBusReceivedMessage]:
        """Lock and return deferred messages by sequence number (they keep their numbers)."""
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        for n in numbers:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise TypeError(f"sequence numbers must be non-negative ints, got {n!r}")
        info = self._entity.get()
        self._check_receivable(info)
        found: list[ServiceBusReceivedMessage] = []
        for partition in sorted({sequencing.partition_of_sequence(n) for n in numbers}):
            wanted = [n for n in numbers if sequencing.partition_of_sequence(n) == partition]
            found += self._lock_partition(info, partition, DEFERRED, len(wanted), wanted)
        missing = sorted(set(numbers) - {m.sequence_number for m in found})
        if missing:
            raise MessageNotFoundError(f"no deferred, unlocked message with sequence number(s) {missing[:10]}")
        return sorted(found, key=lambda m: numbers.index(m.sequence_number))

    def _receive(self, count: int) -> list[ServiceBusReceivedMessage]:
        """Serve from the prefetch cache (dropping messages whose lock lapsed), then lock more, caching
        up to prefetch_count extra messages for later calls."""
        now = datetime.now(timezone.utc)
        self._prefetched = [m for m in self._prefetched if m.locked_until_utc is None or m.locked_until_utc > now]
        got, self._prefetched = self._prefetched[:count], self._prefetched[count:]
        if len(got) < count:
            fetched = self._lock_any(count - len(got) + self.prefetch_count)
            wanted = count - len(got)
            got, self._prefetched = got + fetched[:wanted], self._prefetched + fetched[wanted:]
        return got

    def _lock_any(self, count: int) -> list[ServiceBusReceivedMessage]:
        info = self._entity.get()
        self._check_receivable(info)
        queue = DEAD_LETTERED if self.sub_queue else ACTIVE
        available = [p for p in range(info.partition_count) if p not in info.unavailable]
        if self.session is not None:
            available = [p for p in available if p == self.session._partition]
        if not available:
            return []
        start = self._next_partition % len(available)
        self._next_partition += 1
        got: list[ServiceBusReceivedMessage] = []
        for partition in available[start:] + available[:start]:
            got += self._lock_partition(info, partition, queue, count - len(got))
            if len(got) >= count:
                break
        return got

    def _lock_partition(self, info: EntityInfo, partition: int, queue: str, count: int,
                        sequence_numbers: Optional[list[int]] = None) -> list[ServiceBusReceivedMessage]:
        """Lock (or, receive-and-delete, remove) up to count deliverable messages of one partition."""
        policy = _policy(info)
        delete = self.receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE

        session = self.session

        def attempt() -> list[ServiceBusReceivedMessage]:
            messages, state = self._snapshot(info)
            now = datetime.now(timezone.utc)
            taking = policy
            if session is not None:  # message locks end with the session lock, so a takeover finds them free
                held = self._session_row(info, now)
                taking = replace(policy, lock_duration=held["locked_until_utc"] - now)
            found = locks.candidates(messages, state, partition, queue, now, count + 16, sequence_numbers,
                                     session.session_id if session else None)
            rows, deliver = locks.plan(found, taking, now, queue, delete, count)
            locks.commit(state, partition, rows)
            kind = _message_state(queue)
            return [ServiceBusReceivedMessage(row, written, kind) for row, written in
                    zip(storage.as_rows(found.take(pa.array(deliver, pa.int64()))),
                        storage.as_rows(rows.slice(0, len(deliver))))]

        delivered = self._retrying(info, attempt)
        if session is not None and not delete:
            self._session_held.update((m.sequence_number, m.lock_token) for m in delivered)
        self._retain(info, partition)
        return delivered

    def receive_dataframe(self, max_message_count: int = 1000, max_wait_time: Optional[float] = None):
        """Locked messages as a Spark DataFrame (one row per message, lock_token included)."""
        if self._spark is None:
            raise InvalidOperationError("receive_dataframe needs a SparkSession: ServiceBusClient(path, spark=spark)")
        from .dataframes import messages_to_arrow

        got = self.receive_messages(max_message_count=max_message_count, max_wait_time=max_wait_time)
        return self._spark.createDataFrame(messages_to_arrow(got), schema=_received_schema())

    def complete_dataframe(self, df: object) -> int:
        """Complete the messages of a DataFrame (sequence_number and lock_token columns), one commit per
        partition; a lost lock raises MessageLockLostError before anything is completed."""
        rows = df.select("sequence_number", "lock_token").collect()
        return self._complete_tokens({row.sequence_number: row.lock_token for row in rows})

    def complete_messages(self, messages: Iterable[ServiceBusReceivedMessage]) -> int:
        """Complete many messages with one commit per partition (a sparkbus addition; complete_message
        costs one commit each). If any lock was lost, MessageLockLostError and nothing is completed."""
        messages = list(messages)
        for message in messages:
            self._check_settleable(message)
        count = self._complete_tokens({m.sequence_number: m.lock_token for m in messages})
        for message in messages:
            message._settled = True
        return count

    def _complete_tokens(self, tokens: dict[int, str]) -> int:
        """Complete messages by sequence number and lock token, all locks checked before any commit."""
        if self.receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            raise InvalidOperationError("messages received in RECEIVE_AND_DELETE mode are already settled")
        info = self._entity.get()
        by_partition: dict[int, dict[int, str]] = {}
        for seq, token in tokens.items():
            by_partition.setdefault(sequencing.partition_of_sequence(seq), {})[seq] = token
        if len(by_partition) > 1:  # all or nothing: every lock is checked before the first commit
            state, now = self._table(info, "locks"), datetime.now(timezone.utc)
            lost = [seq for partition, held in by_partition.items()
                    for seq in locks.not_held(locks.lock_rows(state, partition, list(held)), held, now)]
            if lost:
                raise MessageLockLostError(
                    f"the locks of messages {sorted(lost)[:10]} expired or were taken; nothing completed")
        for partition, held in by_partition.items():
            def attempt(partition=partition, held=held) -> None:
                table, moment = self._table(info, "locks"), datetime.now(timezone.utc)
                if self.session is not None:
                    self._session_row(info, moment)
                current = locks.lock_rows(table, partition, list(held))
                lost = locks.not_held(current, held, moment)
                if lost:
                    raise MessageLockLostError(
                        f"the locks of messages {lost[:10]} in partition {partition} expired or were taken")
                locks.commit(table, partition, locks.released(current, COMPLETED, moment))
            self._retrying(info, attempt)
            self._retain(info, partition)
        for seq in tokens:
            self._session_held.pop(seq, None)
        return len(tokens)

    # ---- settlement ------------------------------------------------------------------------------------

    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        """Remove the message from the entity; durable before this returns."""
        self._settle(message, lambda row, info, now: {**row, "state": COMPLETED})

    def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        """Release the lock; at max_delivery_count the message is dead-lettered (MaxDeliveryCountExceeded)."""
        def abandoned(row: dict, info: EntityInfo, now: datetime) -> dict:
            if row["state"] == ACTIVE and row["delivery_count"] >= _policy(info).max_delivery_count:
                return {**row, "state": DEAD_LETTERED, "dead_letter_reason": locks.MAX_DELIVERY_REASON,
                        "dead_letter_error_description":
                            f"Message could not be consumed after {row['delivery_count']} delivery attempts."}
            return row
        self._settle(message, abandoned)

    def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        """Set the message aside; only receive_deferred_messages returns it again."""
        self._settle(message, lambda row, info, now: {**row, "state": DEFERRED})

    def dead_letter_message(self, message: ServiceBusReceivedMessage, reason: Optional[str] = None,
                            error_description: Optional[str] = None) -> None:
        """Move the message to the dead-letter sub-queue with a reason."""
        for name, value in (("reason", reason), ("error_description", error_description)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if self.sub_queue is not None:
            raise InvalidOperationError("a message in the dead-letter sub-queue cannot be dead-lettered again")
        self._settle(message, lambda row, info, now: {**row, "state": DEAD_LETTERED, "dead_letter_reason": reason,
                                                      "dead_letter_error_description": error_description})

    def renew_message_lock(self, message: ServiceBusReceivedMessage) -> datetime:
        """Extend the lock by lock_duration from now; returns the new locked_until_utc."""
        if self.session is not None:
            raise TypeError("renewing a message lock is not possible with sessions: renew the session lock "
                            "(receiver.session.renew_lock()) instead")
        def renewed(row: dict, info: EntityInfo, now: datetime) -> dict:
            return {**row, "lock_token": message.lock_token, "locked_until_utc": now + _policy(info).lock_duration}
        written = self._settle(message, renewed, settles=False)
        message.locked_until_utc = written["locked_until_utc"]
        return message.locked_until_utc

    def _settle(self, message: ServiceBusReceivedMessage, change, settles: bool = True) -> dict:
        self._check_settleable(message)
        info = self._entity.get()
        partition, seq = message._partition_id, message.sequence_number

        def attempt() -> dict:
            state = self._table(info, "locks")
            now = datetime.now(timezone.utc)
            if self.session is not None:
                self._session_row(info, now)
            current = locks.lock_rows(state, partition, [seq])
            if locks.not_held(current, {seq: message.lock_token}, now):
                raise MessageLockLostError(
                    f"the lock of message {seq} expired or was taken by another receiver; it will be redelivered")
            row = storage.as_rows(current)[0]
            written = change({**row, "lock_token": None, "locked_until_utc": None}, info, now)
            written["updated_at_utc"] = now
            locks.commit(state, partition, pa.Table.from_pylist([written], schema=LOCKS))
            return written

        written = self._retrying(info, attempt)
        self._retain(info, partition)
        if settles:
            message._settled = True
            self._session_held.pop(seq, None)
        return written

    def _check_settleable(self, message: ServiceBusReceivedMessage) -> None:
        if not isinstance(message, ServiceBusReceivedMessage):
            raise TypeError(f"expected a ServiceBusReceivedMessage, got {type(message).__name__}")
        if self.receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            raise InvalidOperationError("messages received in RECEIVE_AND_DELETE mode are already settled")
        if message._settled:
            raise MessageAlreadySettled(f"message {message.sequence_number} was already settled")
        if message.lock_token is None:
            raise InvalidOperationError("peeked messages carry no lock and cannot be settled")
        if self.session is not None and message.session_id != self.session.session_id:
            raise InvalidOperationError(f"message {message.sequence_number} belongs to session {message.session_id!r}; "
                                        f"this receiver holds session {self.session.session_id!r}")

    # ---- peek ------------------------------------------------------------------------------------------

    def peek_messages(self, max_message_count: int = 1, *, sequence_number: int = 0) -> list[ServiceBusReceivedMessage]:
        """Browse without locking: the oldest messages of one partition from the cursor (or sequence_number).

        Repeated calls continue where the last ended, partition by partition, until every message was
        seen once; a call may return fewer messages than asked (seed, "Browse/Peek messages").
        """
        if isinstance(max_message_count, bool) or not isinstance(max_message_count, int) or max_message_count < 1:
            raise ValueError(f"max_message_count must be an int >= 1, got {max_message_count!r}")
        if isinstance(sequence_number, bool) or not isinstance(sequence_number, int) or sequence_number < 0:
            raise ValueError(f"sequence_number must be an int >= 0, got {sequence_number!r}")
        info = self._entity.get()
        cursor = sequence_number if sequence_number or self._peek_cursor is None else self._peek_cursor
        messages, state = self._snapshot(info)
        now = datetime.now(timezone.utc)
        queue = f"l.state = '{DEAD_LETTERED}'" if self.sub_queue else (
            f"(l.state IS NULL OR l.state IN ('{ACTIVE}', '{DEFERRED}'))")
        if self.session is not None:
            queue += f" AND m.session_id = {storage.quoted(self.session.session_id)}"
        partition = sequencing.partition_of_sequence(cursor)
        while partition < info.partition_count:
            low = max(cursor, sequencing.compose(partition, 0))
            found = storage.query(f"""
                SELECT m.*, l.state AS lock_state, l.delivery_count, l.dead_letter_reason,
                       l.dead_letter_error_description, l.dead_letter_source
                FROM messages m LEFT JOIN locks l
                  ON m.partition_id = l.partition_id AND m.sequence_number = l.sequence_number
                WHERE m.partition_id = {partition} AND m.sequence_number >= {low} AND {queue}
                ORDER BY m.sequence_number LIMIT {max_message_count}""", messages=messages, locks=state)
            found = storage.as_rows(found)
            if found:
                self._peek_cursor = found[-1]["sequence_number"] + 1
                return [ServiceBusReceivedMessage(r, _peeked_state(r), _peek_state(r, now)) for r in found]
            partition += 1
            cursor = sequencing.compose(partition, 0)
        self._peek_cursor = sequencing.compose(info.partition_count, 0)
        return []

    # ---- internals -------------------------------------------------------------------------------------

    def _table(self, info: EntityInfo, role: str) -> DeltaTable:
        """The entity table at its latest version (kept open between calls)."""
        uri = info.tables[role]
        table = self._tables.get(uri)
        self._tables[uri] = storage.open_table(uri) if table is None else storage.refresh(table)
        return self._tables[uri]

    def _snapshot(self, info: EntityInfo) -> tuple[DeltaTable, DeltaTable]:
        """(messages, locks) at their latest versions, locks read first: retention removes a message's row
        from messages before its state row from locks, so this order never shows a completed message
        without its state row (which would make it look active again)."""
        state = self._table(info, "locks")
        return self._table(info, "messages"), state

    # ---- sessions --------------------------------------------------------------------------------------

    def _lock_session(self, info: EntityInfo, requested: Union[str, ServiceBusSessionFilter]) -> dict:
        """Lock the named session, or any session with available messages, waiting up to max_wait_time."""
        deadline = time.monotonic() + (self.max_wait_time or 0)
        pause = POLL_START
        while True:
            try:
                taken = self._try_lock_session(info, requested)
            except SessionCannotBeLockedError:
                if time.monotonic() >= deadline:
                    raise
                taken = None
            if taken is not None:
                return taken
            if time.monotonic() >= deadline:
                raise OperationTimeoutError(
                    f"no unlocked session with available messages in {info.path!r} within {self.max_wait_time or 0} s")
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, POLL_MAX)

    def _try_lock_session(self, info: EntityInfo, requested: Union[str, ServiceBusSessionFilter]) -> Optional[dict]:
        duration = info.options["lock_duration"]
        if isinstance(requested, str):
            partition = partitioning.partition_of(requested, info.partition_count)
            return self._retrying(info, lambda: sessions.lock(
                self._table(info, "sessions"), partition, requested, duration, datetime.now(timezone.utc)))
        available = [p for p in range(info.partition_count) if p not in info.unavailable]
        start = self._next_partition % max(len(available), 1)
        for partition in available[start:] + available[:start]:
            locks_table = self._table(info, "locks")
            messages, table = self._table(info, "messages"), self._table(info, "sessions")
            for session_id in sessions.available(messages, locks_table, table, partition, datetime.now(timezone.utc)):
                try:
                    return self._retrying(info, lambda: sessions.lock(
                        self._table(info, "sessions"), partition, session_id, duration, datetime.now(timezone.utc)))
                except SessionCannotBeLockedError:
                    continue  # another receiver took it first
        return None

    def _session_row(self, info: EntityInfo, now: datetime) -> dict:
        """The held session's row; SessionLockLostError if the lock expired or was taken."""
        session = self.session
        return sessions.held(self._table(info, "sessions"), session._partition, session.session_id,
                             session._lock_token, now)

    def _session_update(self, change) -> dict:
        """Apply change(row, info, now) to the held session's row (None: read only); returns the row."""
        info = self._entity.get()

        def attempt() -> dict:
            now = datetime.now(timezone.utc)
            row = self._session_row(info, now)
            written = change(row, info, now)
            if written is None:
                return row
            written["updated_at_utc"] = now
            sessions.write(self._tables[info.tables["sessions"]], written)
            return written

        return self._retrying(info, attempt)

    def _extend_message_locks(self, until: datetime) -> None:
        """Carry the session's unsettled message locks to the renewed session lock."""
        if not self._session_held:
            return
        info, partition, held = self._entity.get(), self.session._partition, dict(self._session_held)

        def attempt() -> None:
            table = self._table(info, "locks")
            current = locks.lock_rows(table, partition, list(held))
            lost = locks.not_held(current, held, datetime.now(timezone.utc))
            mine = current.filter(pc.invert(pc.is_in(current["sequence_number"], value_set=pa.array(lost, pa.int64()))))
            if mine.num_rows:
                locks.commit(table, partition, locks.locked_until(mine, until))

        self._retrying(info, attempt)

    def _retain(self, info: EntityInfo, partition: int) -> None:
        """Now and then, let completed messages of the partition leave the tables (sparkbus.retention)."""
        state = self._tables[info.tables["locks"]]
        if retention.due(state):
            with self._state_lock:
                retention.run(info, self._table(info, "messages"), state, partition)

    def _retrying(self, info: EntityInfo, attempt: Callable[[], T]) -> T:
        """Run attempt (which re-reads what it decides on) under the client's retry policy."""
        with self._state_lock:
            return retry.run(attempt, self._retry, what=f"receiving from {info.path!r}")

    def _check_receivable(self, info: EntityInfo, receiving: bool = True) -> None:
        """Status and session rules; a plain receiver of a session entity may peek but not receive."""
        status = info.options.get("status", "Active")
        if status in ("Disabled", "ReceiveDisabled"):
            raise MessagingEntityDisabledError(f"{info.kind} {info.path!r} is {status}; receiving is not allowed")
        sessionful = bool(info.options.get("requires_session"))
        if receiving and sessionful and self.sub_queue is None and not self._session_requested:
            raise InvalidOperationError(
                f"{info.kind} {info.path!r} requires sessions: receive with a session receiver (session_id=...)")
        if self._session_requested and (not sessionful or self.sub_queue is not None):
            raise InvalidOperationError(
                f"session receivers need an entity created with requires_session=True (not {info.path!r}"
                f"{' and not its dead-letter sub-queue' if self.sub_queue is not None else ''})")


def _received_schema():
    from .dataframes import RECEIVED_SPARK_SCHEMA

    return RECEIVED_SPARK_SCHEMA


def _check_wait(value: object) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"max_wait_time must be a number of seconds >= 0 or None, got {value!r}")
    return float(value)


def _policy(info: EntityInfo) -> Policy:
    return Policy(lock_duration=info.options["lock_duration"], max_delivery_count=info.options["max_delivery_count"],
                  dead_letter_on_expiry=bool(info.options.get("dead_lettering_on_message_expiration")))


def _message_state(queue: str) -> ServiceBusMessageState:
    return ServiceBusMessageState.DEFERRED if queue == DEFERRED else ServiceBusMessageState.ACTIVE


def _peeked_state(row: dict) -> dict:
    return {"delivery_count": row["delivery_count"] or 0, "dead_letter_reason": row["dead_letter_reason"],
            "dead_letter_error_description": row["dead_letter_error_description"],
            "dead_letter_source": row["dead_letter_source"]}


def _peek_state(row: dict, now: datetime) -> ServiceBusMessageState:
    if row["lock_state"] == DEFERRED:
        return ServiceBusMessageState.DEFERRED
    scheduled = row["scheduled_enqueue_time_utc"]
    if scheduled is not None and scheduled > now:
        return ServiceBusMessageState.SCHEDULED
    return ServiceBusMessageState.ACTIVE
