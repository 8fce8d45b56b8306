"""The delivery engine under ServiceBusReceiver: lock, settle, renew, peek, deferred messages and sessions.

One Delivery serves one receiver. It follows the entity's tables between calls (storage.commits.LogView:
only the log entries written since are read, the messages and locks logs side by side; a new receiver
starts from a copy of the process's views, storage.followed.view_of) and keeps the partitions' data files
it read in memory (storage.reader.PartitionReader: files never change, so only those committed since are
read, and on an object store those it lacks are fetched at once), runs every operation under the client's
retry policy, and now and then asks the maintenance thread for a retention run. No delta-rs query or
delta-rs commit is on its path: sessions, peeks and locks are read from views and committed directly. What to lock is chosen on Arrow (sparkbus.core.transitions).
Concurrency: each operation is planned on one table version and committed conditionally against it
(sparkbus.engine.locks); losing to another writer means planning again on the newer version. Settling reads
nothing first when the receiver's locks are fresh (sparkbus.core.transitions.is_fresh): nobody else can have
changed those rows, and a retry after a lost commit always reads. Calls from several threads of one
receiver (AutoLockRenewer renews from its own) are serialised by one re-entrant lock. Received messages are
decoded before the commit that locks them (as far as needed to know they decode: sparkbus.receiver), so one
that cannot be decoded is dead-lettered by that same commit instead of failing the receive for everyone
(decoded). Settling many locks works on Arrow columns, table by table (_grouped, transitions.TABLE_FORMS).

Entity identity (sparkbus.engine.registry): message locks (Held) and session locks (SessionLock) carry the
incarnation of the entity they were taken in, and are refused in any other (MessageLockLostError,
SessionLockLostError) before anything is read or written; a fresh lock's kept state row is trusted only in
its own incarnation. Every operation runs through `retrying`, which confirms the incarnation it used after
a failure and after a write (on an object store with a read sent as it starts, beside the write): an operation that met or wrote into a deleted incarnation (the info cached
for up to a second still named it) raises EntityDeleted, which settling and session operations turn into
their lock's error, and the receiver follows to the new incarnation where it may (receive, peek).
"""
from __future__ import annotations

import asyncio
import functools
import math
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Awaitable, Callable, Iterable, NamedTuple, Optional, TypeVar, Union, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import records
from ..core import partitioning, sequencing, transitions
from ..core.transitions import Policy
from ..exceptions import (InvalidOperationError, MessageLockLostError, MessageNotFoundError,
                          MessagingEntityNotFoundError, OperationTimeoutError, PartitionUnavailableError,
                          SessionCannotBeLockedError, SessionLockLostError)
from ..storage import commits, followed, maintenance
from ..storage.reader import PartitionReader, prefetch_together
from ..core.schemas import (ACTIVE, BORN_DEAD_LETTER_COLUMNS, DEAD_LETTERED, DEFERRED, LOCKS, MESSAGES, SESSIONS,
                               TRANSFER_DEAD_LETTERED)
from . import locks, retention, retry, sessions
from .catalog import Catalog
from .registry import Ahead, CachedEntity, EntityDeleted, EntityInfo
from .retry import RetryPolicy
from . import clock

T = TypeVar("T")
M = TypeVar("M")  # what a receive's decode makes of a message (sparkbus.receiver: a received message)
POLL_START, POLL_MAX = 0.01, 0.5  # seconds between tries on an empty entity, doubling (poll)
WATCH_EVERY = 0.02  # seconds between looks at a local entity's log directories while a receive waits
TRUSTED_VIEW = 1.0  # seconds a locks view moved for a receive serves settling its fresh locks unmoved
OPTIMISTIC_FOR = 2.0  # seconds after views were read that a receive on an object store first tries them as held
OPTIMISTIC_PAUSE = 5.0  # seconds without such tries after one lost to another receiver
CALM_SECONDS = 1.0  # a partition another receiver committed in this recently is visited after the others (_apart)
PERMUTATIONS = 256  # orders of the partitions receives visit them in (lock_any): each process draws its own
# The message columns choosing and planning a lock read (transitions.candidates and plan).
CHOOSING = ("sequence_number", "session_id", "enqueued_time_utc", "scheduled_enqueue_time_utc", "expires_at_utc",
            *BORN_DEAD_LETTER_COLUMNS)
# the state columns a peeked message carries (as named there: the locks table's column)
PEEKED_STATE = {"lock_state": "state", "delivery_count": "delivery_count", "dead_letter_reason": "dead_letter_reason",
                "dead_letter_error_description": "dead_letter_error_description",
                "dead_letter_source": "dead_letter_source"}
NEXT_AVAILABLE = None  # lock_session(requested=NEXT_AVAILABLE): any session with available messages
# What a receiver's decode of a stored row written by an older version or another tool can raise: such a
# message is dead-lettered instead of delivered (decoded).
DECODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError)
DecodeError = Union[ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError]
Change = Callable[[Mapping[str, Any], datetime], dict[str, Any]]
# How a receive turns the messages it locked into what it returns: given their message rows and the state
# rows written for them (two tables, row i of one with row i of the other), one entry per message: what
# it decodes to, or the error (one of DECODE_ERRORS) decoding it raised (see decoded).
Decode = Callable[[pa.Table, pa.Table], list[Union[M, DecodeError]]]


@dataclass
class SessionLock:
    """A session lock this receiver holds."""

    session_id: str
    partition: int
    lock_token: str
    locked_until_utc: datetime
    incarnation: str  # of the entity it was taken in (sparkbus.engine.registry)


class Quiet(NamedTuple):
    """A partition where a receive found nothing to deliver: the files both tables held there then, and
    until when (microseconds since the epoch; None: no moment) that stays true without a write."""

    messages: tuple[str, ...]
    locks: tuple[str, ...]
    until: Optional[int]

    def holds(self, messages: commits.LogView, state: commits.LogView, partition: int, now: datetime) -> bool:
        """Whether the partition still has nothing to deliver at now, on these views."""
        return (self.until is None or records.micros(now) < self.until) and \
            self.messages == messages.files_key(partition) and self.locks == state.files_key(partition)


class Held(NamedTuple):
    """A message lock this receiver holds: its token and, when known, the state row as written then (a
    dict, or a row of the table the lock was committed with: records.Row) and the incarnation of the
    entity it was taken in (a lock known by its token only is always read back)."""

    token: str
    row: Optional[Mapping[str, Any]] = None
    incarnation: Optional[str] = None


def policy(info: EntityInfo) -> Policy:
    """The entity settings that decide lock transitions."""
    return Policy(lock_duration=info.options.lock_duration, max_delivery_count=info.options.max_delivery_count,
                  dead_letter_on_expiry=info.options.dead_lettering_on_message_expiration)


def poll(attempt: Callable[[], Optional[T]], wait: Optional[float], *, changed: Optional[Callable[[], bool]] = None,
         stop: Optional[threading.Event] = None) -> Optional[T]:
    """attempt() until it returns something, `wait` seconds passed (0: one try; None: no limit) or stop is
    set, pausing 10 ms, doubling to POLL_MAX, between tries. changed (a cheap look at whether the entity's
    tables changed since the previous look; Delivery.watch) is called once before the first try, then every
    WATCH_EVERY seconds of a pause, and ends the pause when true: a local receiver sees a new message within
    tens of milliseconds, while an idle one reads storage every POLL_MAX seconds (locks expire and
    scheduled messages fall due without a write)."""
    deadline = None if wait is None else time.monotonic() + wait
    pause = POLL_START
    stop = stop or threading.Event()
    if changed is not None and wait != 0:
        changed()
    while True:
        got = attempt()
        now = time.monotonic()
        if got or stop.is_set() or (deadline is not None and now >= deadline):
            return got
        until = now + pause if deadline is None else min(now + pause, deadline)
        pause = min(pause * 2, POLL_MAX)
        while (left := until - now) > 0:
            step = left if changed is None else min(left, WATCH_EVERY)
            if stop.wait(step):
                return got
            if changed is not None and changed():
                break
            now = time.monotonic()


async def apoll(attempt: Callable[[], Awaitable[Optional[T]]], wait: Optional[float], *,
                changed: Optional[Callable[[], bool]] = None, stop: Optional[asyncio.Event] = None) -> Optional[T]:
    """poll for the async API: the same tries and pauses, where a pause is an asyncio sleep (nothing runs
    while idle but a look at `changed` every WATCH_EVERY seconds, a few stat calls) and attempt a coroutine
    (sparkbus.aio runs the try on its thread pool). Cancelling the awaiting task ends it at once."""
    loop = asyncio.get_running_loop()
    deadline = None if wait is None else loop.time() + wait
    pause = POLL_START
    stop = stop or asyncio.Event()
    if changed is not None and wait != 0:
        changed()
    while True:
        got = await attempt()
        now = loop.time()
        if got or stop.is_set() or (deadline is not None and now >= deadline):
            return got
        until = now + pause if deadline is None else min(now + pause, deadline)
        pause = min(pause * 2, POLL_MAX)
        while (left := until - now) > 0:
            if changed is None:
                try:
                    await asyncio.wait_for(stop.wait(), left)
                    return got
                except asyncio.TimeoutError:
                    pass
            else:  # a plain sleep between looks (a task and a timer per look for wait_for cost a third more CPU)
                await asyncio.sleep(min(left, WATCH_EVERY))
                if stop.is_set():
                    return got
                if changed():
                    break
            now = loop.time()


class Delivery:
    """Receive-side operations on one queue or subscription."""

    def __init__(self, catalog: Catalog, entity_path: str, kinds: tuple[str, ...], retry_policy: RetryPolicy) -> None:
        self.entity = CachedEntity(catalog, entity_path, kinds)
        self._retry = retry_policy
        self._views: dict[str, commits.LogView] = {}
        # Choosing what to lock reads CHOOSING's narrow columns of a partition's messages; only the rows
        # chosen are then read whole (with 4 receivers on one queue, each had read every body of every
        # partition it visited, 4x the data, most of it for messages another receiver took).
        choosing = PartitionReader(MESSAGES, columns=CHOOSING)
        self._readers = {"messages": PartitionReader(MESSAGES, narrow=choosing), "locks": PartitionReader(LOCKS),
                         "choosing": choosing,
                         "sessions": PartitionReader(SESSIONS)}
        self._guard = threading.RLock()
        self._wrote = False  # whether the operation `retrying` runs committed something
        self._writing_to: Optional[EntityInfo] = None  # the incarnation it runs on
        self._ahead: Optional[Ahead] = None  # the read confirming it, sent before its first write
        self._operation = threading.local()  # .moved: the views this thread's receive has moved (snapshot)
        self._lost_optimistic = -math.inf  # when a receive planned on unmoved views last lost its commit
        # Partitions a receive found nothing to deliver in (Quiet), for the messages table named: skipped
        # by later receives while neither table's files there changed and no lock lapsed nor scheduled
        # message fell due. A drained partition keeps its rows until retention removes them, and four
        # receivers of one queue went through all of every such partition on every receive (60-100 rows
        # looked at per message delivered).
        self._quiet: dict[int, Quiet] = {}
        self._quiet_in: Optional[str] = None
        # locks view uri -> its `deletes` when the pair last moved together: a locks view that has applied a
        # retention run since (its own commit walked past one) may be ahead of the messages view
        self._paired: dict[str, int] = {}

    # ---- tables and retries ----------------------------------------------------------------------------

    def watch(self) -> Callable[[], bool]:
        """For poll: a look at whether any of the entity's tables changed since the previous look (their
        log directories' modification times). Never for an object store, which has no cheap sign (poll's
        timer serves it); always when the entity cannot be resolved (the next try raises what the caller
        should see)."""
        seen: list[tuple[Optional[int], ...]] = []

        def changed() -> bool:
            try:
                marks = tuple(storage.log_marker(uri) for uri in self.entity.get().tables.values())
            except Exception:
                return True
            if None in marks:
                return False
            moved = seen != [marks]
            seen[:] = [marks]
            return moved
        return changed

    def view(self, info: EntityInfo, role: str, *, advance: bool = True) -> commits.LogView:
        """The entity table's files at its latest version, followed from its log (kept between calls); not
        moved when advance is False, or when this thread's receive already moved it (see snapshot). The
        locks and messages views only ever move together (snapshot)."""
        uri = info.tables[role]
        view = self._views.get(uri)
        moved = getattr(self._operation, "moved", None)
        if role in ("locks", "messages") and (view is None or advance and (moved is None or uri not in moved)):
            messages, state = self.snapshot(info)
            return state if role == "locks" else messages
        if view is None:
            _keep_only(self._views, info)
            view = self._views[uri] = followed.view_of(uri)
        elif advance and (moved is None or uri not in moved):
            view.advance()
        if moved is not None:
            moved.add(uri)
        return view

    def snapshot(self, info: EntityInfo, *, again: bool = False) -> tuple[commits.LogView, commits.LogView]:
        """(messages, locks) views at their latest versions, moved together (one round of requests on an
        object store) in an order that never shows a completed message without its state row (retention
        removes the message's row first: storage.followed.advance_pair). A receive visiting several
        partitions (lock_any) moves them once, at its first partition: a message committed meanwhile is
        found by the next receive, and every commit is conditional on the version it was planned on, so
        nothing is decided on a stale view. again: a retry after a lost commit, which must read anew."""
        uris = (info.tables["locks"], info.tables["messages"])
        moved = getattr(self._operation, "moved", None)
        fresh = [uri for uri in uris if uri not in self._views]
        if fresh:  # first use: copies of the process's views, moved below
            _keep_only(self._views, info)
            for uri in fresh:
                self._views[uri] = followed.view_of(uri, advance=False)
        state, messages = self._views[uris[0]], self._views[uris[1]]
        # (a locks view that applied a retention run on its own, walking past it in a commit, moves again)
        if fresh or again or moved is None or not set(uris) <= moved or self._paired.get(uris[0]) != state.deletes:
            followed.advance_pair(state, messages)
            self._paired[uris[0]] = state.deletes
        if moved is not None:
            moved.update(uris)
        return messages, state

    def close(self) -> None:
        """The receiver is done: its views become the process's when they are further on (followed.offer),
        so the next receiver of these tables starts from them; a locks view only when it is not ahead of
        its messages view (see _optimistic), so the process's pair stays one a receive may trust."""
        for uri, view in list(self._views.items()):
            if self._paired.get(uri, view.deletes) == view.deletes:
                followed.offer(view)

    def retrying(self, info: EntityInfo, attempt: Callable[[int], T]) -> T:
        """attempt(try_number), which re-reads what it decides on, under the client's retry policy, on info's
        incarnation: confirmed after each failure and after a write (EntityDeleted when it is gone; see the
        module docstring), so a deleted table's missing files are never retried or taken for faults."""
        tries = iter(range(1 << 30))
        with self._guard:
            self._wrote, self._ahead, self._writing_to = False, None, info
            result = self._reading(info, lambda: retry.run(
                lambda: attempt(next(tries)), self._retry, what=f"receiving from {info.path!r}",
                on_transient=lambda: self.entity.confirm(info)))
            if self._wrote:
                self.entity.confirm(info, ahead=self._ahead)
            return result

    def _reading(self, info: EntityInfo, operation: Callable[[], T]) -> T:
        """operation() on info's incarnation; its failure is confirmed first (EntityDeleted, chained to the
        failure, when that incarnation is gone)."""
        try:
            return operation()
        except EntityDeleted:
            raise
        except Exception as error:
            self.entity.confirm(info, error)
            raise

    def _write_ahead(self) -> None:
        """Before the first write of the operation `retrying` runs: on an object store, the read that
        confirms its incarnation, sent now beside the write (sparkbus.engine.registry)."""
        if self._ahead is None and self._writing_to is not None:
            self._ahead = self.entity.check_ahead(self._writing_to)

    def _commit(self, state: commits.LogView, partition: int, rows: pa.Table) -> None:
        """locks.commit, noted for `retrying` to confirm the incarnation afterwards."""
        self._commit_many(state, {partition: rows})

    def _commit_many(self, state: commits.LogView, rows: dict[int, pa.Table]) -> None:
        """locks.commit_partitions (one commit), noted for `retrying` to confirm the incarnation afterwards;
        on an object store the confirm's read is sent before the operation's first write, beside it."""
        if any(part.num_rows for part in rows.values()):
            self._write_ahead()
        locks.commit_partitions(state, rows, reader=self._readers["locks"])
        self._wrote = self._wrote or any(part.num_rows for part in rows.values())

    def _whole(self, messages: commits.LogView, partition: int, chosen: pa.Table) -> pa.Table:
        """The chosen candidates (CHOOSING columns and the state columns candidates() adds) as whole message
        rows with those state columns, in their order."""
        whole = self._readers["messages"].rows_of(messages, partition, chosen["sequence_number"].combine_chunks())
        for name in transitions.CANDIDATE_STATE_COLUMNS:
            whole = whole.append_column(chosen.schema.field(name), chosen[name])
        return whole

    def retain(self, info: EntityInfo, partitions: Iterable[int]) -> None:
        """Now and then, let completed messages of one of the partitions a commit touched leave the tables
        (sparkbus.engine.retention), on the maintenance thread: inline, a run put 60-100 ms on every 25th
        receive+complete. One partition per due version, taken in turn, whatever the commit spanned: a run
        for each of sixteen partitions at once kept the maintenance thread from its checkpoints."""
        touched = sorted(set(partitions))
        version = self._views[info.tables["locks"]].version
        if not touched or not retention.due(version):
            return
        partition = touched[(version // retention.RUN_EVERY) % len(touched)]
        messages = self._views.get(info.tables["messages"])
        if messages is not None and not retention.may_remove(messages.files(partition)):
            return
        maintenance.run_later(f"retention {info.tables['locks']} {partition}", lambda: self.entity.confirmed(
            info, lambda: retention.run_kept(info, partition)))

    # ---- locking -----------------------------------------------------------------------------------------

    def lock(self, info: EntityInfo, partition: int, queue: str, count: int, *, delete: bool, decode: Decode[M],
             sequence_numbers: Optional[list[int]] = None, session: Optional[SessionLock] = None) -> list[M]:
        """Lock (delete: remove) up to count deliverable messages of one partition's `queue` (ACTIVE,
        DEFERRED or DEAD_LETTERED), oldest first; returns what decode makes of them. A message decode
        fails for is not delivered (see decoded)."""
        return self.lock_many(info, [partition], queue, count, delete=delete, decode=decode,
                              sequence_numbers=sequence_numbers, session=session, skip_faults=False)

    def lock_many(self, info: EntityInfo, partitions: list[int], queue: str, count: int, *, delete: bool,
                  decode: Decode[M], sequence_numbers: Optional[list[int]] = None,
                  session: Optional[SessionLock] = None, skip_faults: bool = True,
                  up_to: Optional[Mapping[int, int]] = None, as_of: Optional[datetime] = None,
                  bodies: bool = True) -> list[M]:
        """Lock (delete: remove) up to count deliverable messages of `queue` (ACTIVE, DEFERRED or
        DEAD_LETTERED), oldest first in each partition, from the partitions in order, in ONE commit (their
        files read side by side first: on an object store a receive across sixteen partitions waits for
        as many requests as one in a single partition). Returns what decode makes of them; a message
        decode fails for is not delivered (see decoded). skip_faults: a partition whose files cannot be
        read is left out (and reported), as an unavailable one. up_to: per partition, the highest sequence
        number to take; as_of: the moment deliverability is judged at (default now); bodies=False: decode
        gets the messages' narrow columns only (nothing to hand out)."""
        rules = policy(info)
        # a receive of the active queue, unrestricted: what it finds nothing in stays quiet (Quiet)
        plain = queue == ACTIVE and sequence_numbers is None and session is None and up_to is None and as_of is None
        moved = [0]  # undecodable messages the last attempt dead-lettered
        delivered: list[M] = []
        faulty: set[int] = set()
        touched: set[int] = set()

        def attempt(try_number: int) -> list[M]:
            left = count - len(delivered)
            if try_number > 0 and getattr(self._operation, "moved", None):
                self._lost_optimistic = time.monotonic()  # a commit planned on unmoved views lost
            messages, state = self.snapshot(info, again=try_number > 0)
            now = clock.now() if as_of is None else as_of
            taking = rules
            if session is not None:  # message locks end with the session lock, so a takeover finds them free
                self.check_session(info, session, now)
                taking = replace(rules, lock_duration=session.locked_until_utc - now)
            visited = [p for p in partitions if p not in faulty and messages.files(p)]  # others hold nothing
            prefetch_together([(self._readers["choosing"], messages, visited), (self._readers["locks"], state, visited)],
                              lazily=[self._readers["choosing"]] if plain else [])
            got: list[M] = []
            written: dict[int, pa.Table] = {}
            moved[0] = 0
            if self._quiet_in != info.tables["messages"]:
                self._quiet, self._quiet_in = {}, info.tables["messages"]
            for partition in visited:
                if left - len(got) <= 0:
                    break
                if plain and (quiet := self._quiet.get(partition)) is not None and \
                        quiet.holds(messages, state, partition, now):
                    continue
                try:
                    states = self._readers["locks"].rows(state, partition)
                    skip = transitions.settled([f.sequence_range() for f in messages.files(partition)], states,
                                               now) if plain else None
                    choosing = self._readers["choosing"].rows(messages, partition, skip=skip)
                    found = transitions.candidates(
                        choosing, states, queue, now, left - len(got) + 16, sequence_numbers,
                        session.session_id if session else None, up_to=None if up_to is None else up_to.get(partition))
                    if not found.num_rows:  # nothing to deliver or expire here: nothing to plan or commit
                        if plain:
                            self._quiet[partition] = Quiet(messages.files_key(partition), state.files_key(partition),
                                                           transitions.quiet_until(choosing, states, now))
                        continue
                    rows, deliver = transitions.plan(found, taking, now, queue, delete, left - len(got))
                    chosen = _rows_at(found, deliver)
                    whole = self._whole(messages, partition, chosen) if bodies else chosen
                except PartitionUnavailableError as fault:  # its files cannot be read: serve the others
                    if not skip_faults or info.fault_in(fault) != partition or session is not None:
                        raise
                    faulty.add(partition)
                    continue
                taken, written[partition], dead = decoded(whole, rows, decode, queue, now)
                got += taken
                moved[0] += dead
            self._commit_many(state, written)
            touched.update(written)
            return got

        while True:  # again, for others in the place of undecodable messages it dead-lettered
            delivered += self.retrying(info, attempt)
            if not moved[0] or len(delivered) >= count or sequence_numbers is not None:
                break
        self.retain(info, touched)
        return delivered

    def complete_read(self, info: EntityInfo, up_to: Mapping[int, int], as_of: datetime) -> int:
        """Complete what a consuming stream read: every message of the partitions in up_to with a sequence
        number up to up_to[partition] that a receiver could have received at as_of (active, due, not
        expired, not locked then or since: a message another receiver holds is left to it). Messages
        expired by as_of are moved as a receive moves them. One commit for all partitions per
        COMPLETE_READ_CHUNK messages; returns how many were completed."""
        completed = 0
        while True:
            got = self.lock_many(info, sorted(up_to), ACTIVE, COMPLETE_READ_CHUNK, delete=True, decode=_numbered,
                                 up_to=up_to, as_of=as_of, bodies=False)
            completed += len(got)
            if len(got) < COMPLETE_READ_CHUNK:
                return completed

    def lock_exactly(self, info: EntityInfo, queue: str, sequence_numbers: list[int], *, delete: bool,
                     decode: Decode[M], session: Optional[SessionLock] = None) -> list[M]:
        """Lock (delete: remove) exactly these messages of `queue` (receive_deferred_messages), or none:
        MessageNotFoundError names the numbers that are not deliverable now, before anything is written.
        Partitions commit one by one, so a number taken by another receiver between the check and its
        partition's commit releases the locks already taken here, delivery counts as they were (in
        RECEIVE_AND_DELETE mode, what an earlier partition removed in that race stays removed). Returns
        what decode makes of them; one decode fails for is dead-lettered and left out (decoded)."""
        self._operation.moved = set()  # the views move once, for the check and the locks (snapshot)
        try:
            return self._lock_exactly(info, queue, sequence_numbers, delete=delete, decode=decode, session=session)
        finally:
            self._operation.moved = None

    def _lock_exactly(self, info: EntityInfo, queue: str, sequence_numbers: list[int], *, delete: bool,
                      decode: Decode[M], session: Optional[SessionLock] = None) -> list[M]:
        wanted = deferred_partitions(sequence_numbers)
        if session is not None:
            self.check_session(info, session, clock.now())

        def deliverable() -> set[int]:
            messages, state = self.snapshot(info)
            now = clock.now()
            return {n for partition, numbers in wanted.items() for n in transitions.candidates(
                self._readers["choosing"].rows(messages, partition), self._readers["locks"].rows(state, partition),
                queue, now, len(numbers), numbers, session.session_id if session else None)["sequence_number"].to_pylist()}
        present = self._reading(info, deliverable)
        missing = sorted(set(sequence_numbers) - present)
        if missing:
            self.entity.confirm(info)  # not found because the entity is gone? (see lock_any)
            raise MessageNotFoundError(f"no {queue.lower().replace('_', '-')}, unlocked message with sequence "
                                       f"number(s) {missing[:10]}; nothing was received")
        taken: list[tuple[dict[str, Any], M]] = []  # (state row written, what decode made) of each message
        undecodable: set[int] = set()

        def tracked(messages: pa.Table, states: pa.Table) -> list[Union[tuple[dict[str, Any], M], DecodeError]]:
            made: list[Union[tuple[dict[str, Any], M], DecodeError]] = []
            for state_row, item in zip(records.as_rows(states), decode(messages, states)):
                if isinstance(item, DECODE_ERRORS):
                    undecodable.add(state_row["sequence_number"])
                    made.append(item)
                else:
                    made.append((state_row, item))
            return made

        for partition, numbers in wanted.items():
            got = self.lock(info, partition, queue, len(numbers), delete=delete, sequence_numbers=numbers,
                            session=session, decode=tracked)
            taken += got
            lost = sorted(set(numbers) - undecodable - {state_row["sequence_number"] for state_row, _ in got})
            if lost:  # lost a race for one of them
                if not delete:
                    self.settle(info, {state_row["sequence_number"]: Held(state_row["lock_token"], state_row)
                                       for state_row, _ in taken}, transitions.returned, session)
                raise MessageNotFoundError(f"message(s) {lost[:10]} were taken by another receiver; nothing was "
                                           "received")
        return [message for _, message in taken]

    def delete(self, info: EntityInfo, partition: int, queue: str, count: int, before: datetime,
               session: Optional[SessionLock] = None) -> int:
        """Remove up to count unlocked messages of one partition's `queue` enqueued before `before`, oldest
        first, in one conditional commit (a message locked meanwhile makes it retry); returns how many."""
        def attempt(_: int) -> int:
            messages, state = self.snapshot(info)
            now = clock.now()
            if session is not None:
                self.check_session(info, session, now)
            found = transitions.candidates(
                self._readers["choosing"].rows(messages, partition), self._readers["locks"].rows(state, partition),
                queue, now, count, session_id=session.session_id if session else None, enqueued_before=before)
            if found.num_rows:
                self._commit(state, partition, transitions.deleted(found, now))
            return cast(int, found.num_rows)

        removed = self.retrying(info, attempt)
        self.retain(info, [partition])
        return removed

    def lock_any(self, info: EntityInfo, queue: str, count: int, *, delete: bool, start: int, decode: Decode[M],
                 session: Optional[SessionLock] = None) -> list[M]:
        """Up to count messages from the available partitions, as decode makes them, the partitions visited
        in an order that start draws (a session receiver visits its session's partition only). A
        permutation, not a rotation: receivers passing over drained partitions spread out instead of all
        moving on to the same next one and racing for its oldest messages (four local receivers lost 13-17
        commits of 95 that way instead of 17-23 of 100). Finding none, it confirms the incarnation
        (EntityDeleted when it is gone): files it had read and written are kept in memory, so a receive
        from a deleted queue may fail nowhere else, and the receiver must not go on serving what it
        prefetched there."""
        available = available_partitions(info)
        if session is not None:
            available = [p for p in available if p == session.partition]
        if not available:
            return []
        order = _apart([available[i] for i in _permutation(len(available), start)],
                       self._views.get(info.tables["locks"]))
        got: list[M] = []
        if self._optimistic(info):  # first from what the views hold, without a look at the logs
            got = self._visit(info, order, queue, count, delete, decode, session,
                              moved={info.tables["locks"], info.tables["messages"]})
        if not got:
            got = self._visit(info, order, queue, count, delete, decode, session, moved=set())
        if not got:  # nothing read failed and nothing was written: still the entity's incarnation?
            self.entity.confirm(info)
        return got

    def _visit(self, info: EntityInfo, partitions: list[int], queue: str, count: int, delete: bool,
               decode: Decode[M], session: Optional[SessionLock], moved: set[str]) -> list[M]:
        """Lock up to count messages from the partitions in order (lock_many), the views moved at most once
        (moved: the tables' uris already counted as moved: snapshot)."""
        self._operation.moved = moved
        try:
            return self.lock_many(info, partitions, queue, count, delete=delete, session=session, decode=decode)
        finally:
            self._operation.moved = None

    def _optimistic(self, info: EntityInfo, roles: tuple[str, ...] = ("locks", "messages"),
                    held: bool = False) -> bool:
        """Whether a receive (or a session's acceptance: roles) may first try what the views of these tables
        already hold, without reading the logs: on an object store (where that read is a round trip), with
        views read lately and no such try lost to another receiver lately. held: a view this receiver
        lacks is taken unmoved from the process's (storage.followed.view_of), as a new receiver's are.
        Nothing is decided on a stale view: its commit is conditional, and a lost one retries on the logs
        read anew. Never when the locks view has applied a retention run since the pair last moved
        together (a commit of its own walked past one): a completed message's row may then still be in the
        messages view while its state row is gone, which reads as a message to deliver."""
        if storage.location.is_local(info.tables["locks"]):
            return False
        if held and any(info.tables[role] not in self._views for role in roles):
            _keep_only(self._views, info)
            for role in roles:
                uri = info.tables[role]
                if uri not in self._views:
                    self._views[uri] = followed.view_of(uri, advance=False)
                    if role == "locks":  # the process's pair is one a receive may trust (close)
                        self._paired[uri] = self._views[uri].deletes
        locks_view = self._views.get(info.tables["locks"])
        if locks_view is None or self._paired.get(info.tables["locks"]) != locks_view.deletes:
            return False
        views = [self._views.get(info.tables[role]) for role in roles]
        now = time.monotonic()
        return all(view is not None and now - view.position.known_at < OPTIMISTIC_FOR for view in views) and \
            now - self._lost_optimistic > OPTIMISTIC_PAUSE

    # ---- settling ----------------------------------------------------------------------------------------

    def settle(self, info: EntityInfo, held: dict[int, Held], change: Change,
               session: Optional[SessionLock] = None) -> pa.Table:
        """Apply change(row as locked, now) to held messages: one conditional commit per partition.
        MessageLockLostError if any lock was lost (SessionLockLostError if the session's was); with several
        partitions, all locks are checked before the first commit, so either all are settled or none.
        Locks of another incarnation of the entity are lost, refused before anything is read or written.
        Returns the state rows written (LOCKS)."""
        if session is not None and session.incarnation != info.incarnation:
            raise session_lost(session, f"{info.kind} {info.path!r} was deleted and created again")
        stale = sorted(seq for seq, lock in held.items() if lock.incarnation not in (None, info.incarnation))
        if stale:
            raise MessageLockLostError(
                f"the locks of messages {stale[:10]} were taken in {info.kind} {info.path!r} before it was deleted "
                "and created again; they ended with it, and nothing was settled")
        by_partition: dict[int, dict[int, Held]] = {}
        for seq, lock in held.items():
            by_partition.setdefault(sequencing.partition_of_sequence(seq), {})[seq] = lock
        grouped = {partition: _grouped(mine.values()) for partition, mine in by_partition.items()}
        try:
            if len(by_partition) > 1 and any(_fresh(*group, clock.now()) is None for group in grouped.values()):
                with self._guard:
                    lost = self._reading(info, lambda: [
                        seq for partition, mine in by_partition.items() for seq in transitions.not_held(
                            locks.lock_rows(self.view(info, "locks"), partition, list(mine)), _tokens(mine),
                            clock.now())])
                if lost:
                    raise MessageLockLostError(
                        f"the locks of messages {sorted(lost)[:10]} expired or were taken; nothing completed")
            written = self.retrying(info, lambda attempt: self._settle_partitions(
                info, by_partition, change, session, grouped if attempt == 0 else None))
            self.retain(info, by_partition)
            return written
        except EntityDeleted as gone:
            if session is not None:
                raise session_lost(session, str(gone)) from gone
            raise MessageLockLostError(f"the message locks ended with their entity: {gone}") from gone

    def lock_info(self, session: Optional[SessionLock] = None) -> EntityInfo:
        """The entity's info for settling or renewing locks it gave (under session, when given): the lock's
        error (MessageLockLostError, SessionLockLostError) when the entity no longer exists, and, for a
        session, when it is another incarnation than the session's."""
        try:
            info = self.entity.get()
        except (MessagingEntityNotFoundError, InvalidOperationError) as gone:  # deleted (maybe of another kind now)
            why = f"{self.entity.path!r} was deleted ({gone})"
            if session is not None:
                raise session_lost(session, why) from gone
            raise MessageLockLostError(f"the message locks ended with their entity: {why}") from gone
        if session is not None and session.incarnation != info.incarnation:
            raise session_lost(session, f"{info.kind} {info.path!r} was deleted and created again")
        return info

    def _settle_partitions(self, info: EntityInfo, by_partition: dict[int, dict[int, Held]], change: Change,
                           session: Optional[SessionLock],
                           grouped: Optional[dict[int, tuple[list[_Group], list[Held]]]]) -> pa.Table:
        """Settle held locks (partition -> seq -> lock) in one commit; the state rows written. A settlement
        with a table form (transitions.TABLE_FORMS) changes the rows as Arrow columns, others row by row.
        grouped: the locks of each partition as _grouped groups them, on a first attempt (a retry after a
        lost commit reads the state rows instead)."""
        now = clock.now()
        whole = transitions.TABLE_FORMS.get(change)
        fresh = {partition: _fresh(*group, now) for partition, group in grouped.items()} if grouped else {}
        trusted = grouped is not None and all(rows is not None for rows in fresh.values())
        known = self._views.get(info.tables["locks"])
        # Settling fresh locks decides nothing on what the view holds: a view moved a moment ago is committed
        # on as it is (a commit walks past newer versions itself, checking each against its claim)
        state = self.view(info, "locks", advance=not (trusted and known is not None and
                                                      time.monotonic() - known.position.known_at < TRUSTED_VIEW))
        if session is not None:
            self.check_session(info, session, now, read=grouped is None)  # (a retry reads it again)
        written: dict[int, pa.Table] = {}
        for partition, held in by_partition.items():
            rows: Union[pa.Table, list[Mapping[str, Any]]]
            if trusted:
                known_rows = fresh[partition]
                assert known_rows is not None  # (trusted: every partition's are known)
                rows = known_rows if whole else [lock.row for lock in held.values()]
            else:
                rows = locks.lock_rows(state, partition, list(held))
                lost = transitions.not_held(rows, _tokens(held), now)
                if lost:
                    raise MessageLockLostError(
                        f"the locks of messages {lost[:10]} in partition {partition} expired or were taken by "
                        "another receiver; they will be redelivered")
            if whole is not None:
                written[partition] = whole(rows, now)
            else:
                written[partition] = records.from_rows([change(row, now) for row in (
                    records.as_rows(rows) if isinstance(rows, pa.Table) else rows)], LOCKS)
        self._commit_many(state, written)
        return pa.concat_tables(list(written.values())) if written else LOCKS.empty_table()

    def extend_locks(self, session: SessionLock, held: dict[int, str], until: datetime) -> None:
        """Set the message locks still held (seq -> token) under session to end at `until` (a renewed or
        released session); SessionLockLostError when the entity was deleted since the session was locked."""
        if not held:
            return
        info = self.lock_info(session)

        def attempt(_: int) -> None:
            state = self.view(info, "locks")
            current = locks.lock_rows(state, session.partition, list(held))
            lost = transitions.not_held(current, held, clock.now())
            mine = current.filter(pc.invert(pc.is_in(current["sequence_number"], value_set=pa.array(lost, pa.int64()))))
            self._commit(state, session.partition, transitions.locked_until(mine, until))

        try:
            self.retrying(info, attempt)
        except EntityDeleted as gone:
            raise session_lost(session, str(gone)) from gone

    # ---- peeking -----------------------------------------------------------------------------------------

    def peek(self, info: EntityInfo, cursor: int, count: int, *, sub_queue: Optional[str],
             session_id: Optional[str]) -> tuple[list[dict[str, Any]], int]:
        """Up to count messages of one partition from sequence number `cursor` on, without locking, with
        their state columns; and the cursor to continue from (past the last partition: nothing left).
        sub_queue: the state of a sub-queue's messages (DEAD_LETTERED, TRANSFER_DEAD_LETTERED), or None.
        Confirmed afterwards: EntityDeleted rather than a deleted incarnation's messages."""
        return self.entity.confirmed(info, lambda: self._peek(info, cursor, count, sub_queue, session_id))

    def _peek(self, info: EntityInfo, cursor: int, count: int, sub_queue: Optional[str],
              session_id: Optional[str]) -> tuple[list[dict[str, Any]], int]:
        with self._guard:
            messages, state = self.snapshot(info)
            partition = sequencing.partition_of_sequence(cursor)
            while partition < info.partition_count:
                low = max(cursor, sequencing.compose(partition, 0))
                try:
                    found = self._peek_partition(messages, state, partition, low, count, sub_queue, session_id)
                except PartitionUnavailableError as error:
                    self.entity.confirm(info, error)  # a deleted table's files are no fault
                    if info.fault_in(error) != partition:
                        raise
                    found = []  # a partition whose files cannot be read is skipped, as an unavailable one
                if found:
                    return found, found[-1]["sequence_number"] + 1
                partition += 1
                cursor = sequencing.compose(partition, 0)
            return [], sequencing.compose(info.partition_count, 0)

    def _peek_partition(self, messages: commits.LogView, state: commits.LogView, partition: int, low: int,
                        count: int, sub_queue: Optional[str], session_id: Optional[str]) -> list[dict[str, Any]]:
        """Up to count of the partition's messages from sequence number low on, in order, in the sub-queue
        (its state) or the active and deferred ones, whole, with their state columns (PEEKED_STATE)."""
        narrow = self._readers["choosing"].rows(messages, partition)
        states = self._readers["locks"].rows(state, partition)
        lock_state = states["state"].take(pc.index_in(narrow["sequence_number"], value_set=states["sequence_number"]))
        keep = pc.greater_equal(narrow["sequence_number"], low)
        if sub_queue:
            keep = pc.and_(keep, pc.fill_null(pc.equal(lock_state, sub_queue), False))
        else:
            keep = pc.and_(keep, pc.or_(pc.is_null(lock_state), pc.is_in(lock_state, value_set=pa.array([ACTIVE, DEFERRED]))))
        if session_id is not None:
            keep = pc.and_(keep, pc.fill_null(pc.equal(narrow["session_id"], session_id), False))
        numbers = pc.sort_indices(narrow["sequence_number"].filter(keep))
        chosen = narrow["sequence_number"].filter(keep).take(numbers[:count]).combine_chunks()
        if not len(chosen):
            return []
        whole = self._readers["messages"].rows_of(messages, partition, chosen)
        at = pc.index_in(chosen, value_set=states["sequence_number"])
        for name, column in PEEKED_STATE.items():
            whole = whole.append_column(name, states[column].take(at))
        return records.as_rows(whole)

    # ---- sessions ----------------------------------------------------------------------------------------

    def lock_session(self, info: EntityInfo, requested: Optional[str], wait: Optional[float]) -> SessionLock:
        """Lock the named session (requested=NEXT_AVAILABLE: the unlocked session with the oldest waiting
        message, across the available partitions), waiting up to `wait` seconds.
        SessionCannotBeLockedError while a named session stays locked; OperationTimeoutError when no
        session became available."""
        refused: list[SessionCannotBeLockedError] = []  # the named session's latest refusal

        def attempt() -> Optional[SessionLock]:
            try:
                return self._reading(info, lambda: self._try_lock_session(info, requested))
            except SessionCannotBeLockedError as error:
                refused[:] = [error]
                return None

        taken = poll(attempt, wait or 0)
        if taken is None and refused:
            raise refused[0]
        if taken is None:
            raise OperationTimeoutError(
                f"no unlocked session with available messages in {info.path!r} within {wait or 0} s")
        return taken

    def _try_lock_session(self, info: EntityInfo, requested: Optional[str]) -> Optional[SessionLock]:
        duration = info.options.lock_duration
        optimistic = False  # whether the session is chosen on views not moved for it (below)

        def take(partition: int, session_id: str, moved: bool) -> SessionLock:
            def attempt(try_number: int) -> dict[str, Any]:
                # the sessions view the session was chosen on serves the first try (the commit is
                # conditional on its version)
                if try_number > 0 and optimistic:
                    self._lost_optimistic = time.monotonic()  # chosen on unmoved views and lost
                view = self.view(info, "sessions", advance=try_number > 0 or not moved)
                self._write_ahead()
                row = sessions.lock(view, self._readers["sessions"], partition, session_id, duration, clock.now())
                self._wrote = True
                return row
            row = self.retrying(info, attempt)
            return SessionLock(session_id, partition, row["lock_token"], row["locked_until_utc"], info.incarnation)

        if requested is not None:
            return take(partitioning.partition_of(requested, info.partition_count), requested, False)
        available = available_partitions(info)
        # first among the sessions the views (the process's, read lately) already show; when none of those
        # can be taken, among those the logs read now show
        optimistic = self._optimistic(info, ("messages", "locks", "sessions"), held=True)
        while available:
            waiting = self._waiting_sessions(info, available, advance=not optimistic)
            if waiting is None:  # a partition whose files cannot be read was left out: look again
                continue
            for partition, session_id in waiting:
                try:
                    return take(partition, session_id, True)
                except SessionCannotBeLockedError:
                    continue  # another receiver took it first
            if not optimistic:
                return None
            optimistic = False
        return None

    def _waiting_sessions(self, info: EntityInfo, available: list[int], limit: int = 8, *,
                          advance: bool = True) -> Optional[list[tuple[int, str]]]:
        """(partition, session id) of up to limit unlocked sessions with a deliverable message in the
        available partitions, the one whose oldest waiting message was enqueued first coming first (across
        partitions the time, not the sequence number, orders them); the three views moved together (unless
        not advance) and the partitions' files read side by side. None after removing a partition whose
        files cannot be read from available (it is reported)."""
        with self._guard:
            if advance:
                moved: list[tuple[commits.LogView, ...]] = storage.concurrently(
                    [lambda: self.snapshot(info), lambda: (self.view(info, "sessions"),)], "sessions")
                (messages, state), (view,) = moved
            else:
                messages, state, view = (self._views[info.tables[role]] for role in ("messages", "locks", "sessions"))
            prefetch_together([(self._readers[reader], table, available)
                               for reader, table in (("choosing", messages), ("locks", state), ("sessions", view))])
            now, found = clock.now(), []
            for partition in available:
                try:
                    waiting = sessions.available(self._readers["choosing"].rows(messages, partition),
                                                 self._readers["locks"].rows(state, partition),
                                                 self._readers["sessions"].rows(view, partition), now)
                except PartitionUnavailableError as error:
                    self.entity.confirm(info, error)  # a deleted table's files are no fault
                    if info.fault_in(error) != partition:
                        raise
                    available.remove(partition)
                    return None
                found += [(oldest, first, partition, session_id) for session_id, oldest, first in
                          zip(*(waiting[name].to_pylist() for name in ("session_id", "oldest", "first")))]
        return [(partition, session_id) for _, _, partition, session_id in sorted(found)[:limit]]

    def check_session(self, info: EntityInfo, session: SessionLock, now: datetime, read: bool = False) -> None:
        """SessionLockLostError unless the session lock is still held: known without reading while it is
        fresh (nobody can take an unexpired session lock) and info is the incarnation it was taken in, read
        back otherwise or when `read`."""
        if session.incarnation != info.incarnation:
            raise session_lost(session, f"{info.kind} {info.path!r} was deleted and created again")
        if read or not transitions.is_fresh(session.locked_until_utc, now):
            self.session_row(info, session, now)

    def session_row(self, info: EntityInfo, session: SessionLock, now: datetime) -> dict[str, Any]:
        """The held session's row; SessionLockLostError if the lock expired or was taken."""
        return sessions.held(self.view(info, "sessions"), self._readers["sessions"], session.partition,
                             session.session_id, session.lock_token, now)

    def update_session(self, session: SessionLock, change: Callable[[dict[str, Any], EntityInfo, datetime],
                                                                    Optional[dict[str, Any]]]) -> dict[str, Any]:
        """Apply change(row, info, now) to the held session's row (None: read only); returns the row.
        SessionLockLostError when the lock expired or was taken, or the entity was deleted since it was
        taken (then nothing is read or written in a new incarnation)."""
        info = self.lock_info(session)

        def attempt(try_number: int) -> dict[str, Any]:
            now = clock.now()
            # while the session lock is fresh nobody else can change its row: the view as it is serves the
            # first try (a write is conditional on its version anyway)
            trusted = try_number == 0 and transitions.is_fresh(session.locked_until_utc, now)
            row = sessions.held(self.view(info, "sessions", advance=not trusted), self._readers["sessions"],
                                session.partition, session.session_id, session.lock_token, now)
            written = change(row, info, now)
            if written is None:
                return row
            written["updated_at_utc"] = now
            self._write_ahead()
            sessions.write(self.view(info, "sessions", advance=False), self._readers["sessions"], written)
            self._wrote = True
            return written

        try:
            row = self.retrying(info, attempt)
            if not self._wrote:  # read from views kept in memory: still the incarnation it was read in?
                self.entity.confirm(info)
            return row
        except EntityDeleted as gone:
            raise session_lost(session, str(gone)) from gone


COMPLETE_READ_CHUNK = 5000  # messages a consuming stream's completion takes per commit


def _numbered(taken: pa.Table, rows: pa.Table) -> list[Union[int, DecodeError]]:
    """Decode for complete_read: the sequence numbers (nothing is handed out)."""
    return cast("list[Union[int, DecodeError]]", taken["sequence_number"].to_pylist())


def decoded(taken: pa.Table, rows: pa.Table, decode: Decode[M], queue: str,
            now: datetime) -> tuple[list[M], pa.Table, int]:
    """(what decode makes of the messages a receive delivers, the state rows to commit, how many messages
    were dead-lettered). taken: the delivered messages, whose state rows are the first rows of `rows`
    (transitions.plan). Decoding runs before the commit, so a message decode fails for (it gives one of
    DECODE_ERRORS in its place: a row written by an older version or another tool, such as a property
    with a lone surrogate or an AMQP body that does not decode) is not delivered and never locked: the
    same commit dead-letters it (reason transitions.UNDECODABLE_REASON, the error as description, its
    delivery count unchanged), and the other messages are delivered. In a dead-letter sub-queue, where
    it cannot be dead-lettered again, it is left as it was (still visible to peek)."""
    made = decode(taken, rows.slice(0, taken.num_rows))
    failed = {i: error for i, error in enumerate(made) if isinstance(error, Exception)}
    delivered = [item for item in made if not isinstance(item, Exception)]  # made, without those failed
    if not failed:
        return delivered, rows, 0
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[list(failed)] = False
    if queue in (DEAD_LETTERED, TRANSFER_DEAD_LETTERED):
        return delivered, rows.filter(pa.array(keep)), 0
    at = pa.array(list(failed), pa.int64())
    dead = [transitions.new_state(
        partition, seq, DEAD_LETTERED, deliveries or 0, now, reason=transitions.UNDECODABLE_REASON,
        description=transitions.dead_letter_text(f"the stored message cannot be decoded: {error}"))
        for partition, seq, deliveries, error in zip(
            taken["partition_id"].take(at).to_pylist(), taken["sequence_number"].take(at).to_pylist(),
            taken["prior_deliveries"].take(at).to_pylist(), failed.values())]
    written = pa.concat_tables([rows.filter(pa.array(keep)).cast(LOCKS), records.from_rows(dead, LOCKS)])
    return delivered, written, len(dead)


def session_lost(session: SessionLock, why: str) -> SessionLockLostError:
    """The error of a session lock that ended with its entity's incarnation (why: what happened to it)."""
    return SessionLockLostError(f"the lock on session {session.session_id!r} ended with its entity: {why}")


def _keep_only(cache: dict[str, T], info: EntityInfo) -> None:
    """Drop the tables of other incarnations (a deleted entity's) from a cache keyed by table uri. Another
    thread may add to the cache meanwhile (a session receive reads its tables' views side by side, each
    branch adding the one it opens): the keys are copied at once, and a key already dropped is no error."""
    current = set(info.tables.values())
    for uri in [known for known in list(cache) if known not in current]:
        cache.pop(uri, None)


@functools.lru_cache(maxsize=64)
def _permutations(count: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(random.sample(range(count), count)) for _ in range(PERMUTATIONS))


def _permutation(count: int, start: int) -> tuple[int, ...]:
    """A permutation of range(count) that start draws, from PERMUTATIONS this process made at random once
    per count (seeding a generator for each receive cost it 40 us)."""
    return _permutations(count)[start % PERMUTATIONS]


def _apart(order: list[int], state: Optional[commits.LogView]) -> list[int]:
    """order with the partitions no other receiver locked or settled in for CALM_SECONDS first (as the
    locks view saw their commits), the others after them, each group in its order. Receivers of one entity
    keep to partitions of their own while there are enough with messages, instead of reading and racing for
    the lock rows of the others' (four processes parsed five times the lock rows per message of one)."""
    if state is None or not state.others_at:
        return order
    now = time.monotonic()
    busy = {p for p, at in state.others_at.items() if now - at < CALM_SECONDS}
    return [p for p in order if p not in busy] + [p for p in order if p in busy]


def available_partitions(info: EntityInfo) -> list[int]:
    """The entity's partitions that are neither declared unavailable nor found faulty (availability.down)."""
    avoided = info.avoided()
    return [p for p in range(info.partition_count) if p not in avoided]


# Locks whose state rows are rows of one committed table (records.Row, as a receive made them): the
# table (of the rows' Columns), the rows' positions in it, the tokens held.
_Group = tuple[pa.Table, list[int], list[str]]


def _grouped(held: Iterable[Held]) -> tuple[list[_Group], list[Held]]:
    """Held locks grouped for checking and settling them table by table (one Arrow operation per table
    instead of a dict per message), and the other locks."""
    tables: dict[int, _Group] = {}
    loose = []
    for lock in held:
        row = lock.row
        if isinstance(row, records.Row) and row.columns.table is not None:
            _, at, tokens = tables.setdefault(id(row.columns), (row.columns.table, [], []))
            at.append(row.index)
            tokens.append(lock.token)
        else:
            loose.append(lock)
    return list(tables.values()), loose


def _fresh(tables: list[_Group], loose: list[Held], now: datetime) -> Optional[pa.Table]:
    """The locks' state rows (LOCKS: one take per committed table, then the other locks' rows) when every
    one is known as written and certainly still held (transitions.all_fresh); None otherwise."""
    if any(lock.row is None for lock in loose):
        return None
    parts = [records.conformed(_rows_in_order(table, at), LOCKS) for table, at, _ in tables]
    if loose:
        parts.append(records.from_rows([lock.row for lock in loose if lock.row is not None], LOCKS))  # (all)
    rows = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    tokens = [token for _, _, held in tables for token in held] + [lock.token for lock in loose]
    return rows if transitions.all_fresh(rows, tokens, now) else None


def _rows_at(table: pa.Table, positions: np.ndarray) -> pa.Table:
    """The table's rows at ascending positions: a slice (no copy of the bodies) when they are its first rows."""
    if positions.size and positions[-1] == positions.size - 1:
        return table.slice(0, positions.size)
    return table.take(pa.array(positions, pa.int64()))


def _rows_in_order(table: pa.Table, positions: list[int]) -> pa.Table:
    """The table's rows at positions, in their order: a slice when they are consecutive rows in order (a
    batch settled as it was received), a take otherwise."""
    if positions and positions == list(range(positions[0], positions[0] + len(positions))):
        return table.slice(positions[0], len(positions))
    return table.take(pa.array(positions, pa.int64()))


def _tokens(held: dict[int, Held]) -> dict[int, str]:
    return {seq: lock.token for seq, lock in held.items()}


def deferred_partitions(numbers: Iterable[int]) -> dict[int, list[int]]:
    """Sequence numbers grouped by the partition they were assigned in."""
    grouped: dict[int, list[int]] = {}
    for n in numbers:
        grouped.setdefault(sequencing.partition_of_sequence(n), []).append(n)
    return dict(sorted(grouped.items()))

