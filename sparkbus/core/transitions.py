"""Lock transitions: what a receiver writes to a message's state row, decided without I/O.

A state row (schemas.LOCKS) records a message that left its initial state: locked, deferred, dead-lettered
or completed, with its delivery count. Receiving plans rows for the oldest candidates (`plan`); each
settlement is a named function from the row as locked to the row written (`completed`, `abandoned`,
`deferred`, `dead_lettered`, `renewed`). Which rows a receiver may still change is decided here too:
`not_held` from rows read back, and `is_fresh` without reading. No other receiver can change a row while
its lock is unexpired (taking a lock needs it lapsed, and only the holder knows the token), so a lock
with more than FRESH_MARGIN left is still held exactly as written, and settling it needs no read: the
conditional commit would still reject it if that reasoning were ever wrong.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from collections.abc import Callable, Mapping
from typing import Any, Optional, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .records import conformed, from_rows, micros, nulls, stored_int64s
from .schemas import (ACTIVE, COMPLETED, DEAD_LETTER_PREFIX, DEAD_LETTER_STATES, DEAD_LETTERED, DEFERRED, EXPIRED,
                      FORWARDED, GONE_STATES, LOCKS, PURGED, RECEIVED_AND_DELETED, TRANSFER_DEAD_LETTERED, TS)
from .wire import MAX_DEAD_LETTER_TEXT

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
EXPIRED_REASON = "TTLExpiredException"
# What Service Bus says when a message without a session id reaches a session-enabled entity (a topic's
# copy for a subscription, or a forwarded message).
SESSION_ID_NULL_REASON = "Session id is null."
SESSION_ID_NULL_DESCRIPTION = "Session enabled entity doesn't allow a message whose session identifier is null."
# A stored message a receiver cannot decode (a row written by an older version or by another tool, e.g. a
# property with a lone surrogate): dead-lettered instead of delivered (sparkbus.engine.delivery).
UNDECODABLE_REASON = "MessageDecodeError"


def dead_letter_text(text: str) -> str:
    """text as a dead-letter reason or description can hold it, whatever error message it came from:
    lone surrogates escaped (stored text is UTF-8) and at most MAX_DEAD_LETTER_TEXT characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_DEAD_LETTER_TEXT else text[:MAX_DEAD_LETTER_TEXT - 3] + "..."


@dataclass(frozen=True)
class Policy:
    """The entity settings that decide transitions."""

    lock_duration: timedelta
    max_delivery_count: int
    dead_letter_on_expiry: bool


FRESH_MARGIN = timedelta(seconds=1)  # clock error tolerated between processes sharing a namespace


def is_fresh(locked_until: Optional[datetime], now: datetime) -> bool:
    """Whether a lock this receiver took (or renewed) to `locked_until` is certainly still its own."""
    return locked_until is not None and locked_until - now > FRESH_MARGIN


def all_fresh(rows: pa.Table, tokens: list[str], now: datetime) -> bool:
    """is_fresh for many state rows at once: whether each row (LOCKS) carries the token given for it, in
    order, with a lock that is certainly still this receiver's."""
    if not rows.num_rows:
        return True
    until = rows["locked_until_utc"]
    if until.null_count:
        return False
    if rows.num_rows <= 16:  # a few: compared as Python values (the kernels' calls cost more)
        if rows["lock_token"].to_pylist() != tokens:
            return False
    elif not pc.all(pc.fill_null(pc.equal(rows["lock_token"], pa.array(tokens, pa.string())), False)).as_py():
        return False
    return int(stored_int64s(until).min()) - micros(now) > FRESH_MARGIN // timedelta(microseconds=1)


def unlocked(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The row with its lock released, stamped now: the common part of every settlement."""
    return {**row, "lock_token": None, "locked_until_utc": None, "updated_at_utc": now}


def returned(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A lock given back as if it had never been taken (its delivery did not happen): released, and the
    delivery count it raised lowered again."""
    return {**unlocked(row, now), "delivery_count": max(0, row["delivery_count"] - 1)}


def left_as(way: str, prior: Optional[str]) -> str:
    """The gone state of a message leaving its entity `way` (a LEAVING_WAYS) from the state `prior` (None:
    active): the way, prefixed when it left from a dead-letter sub-queue."""
    return DEAD_LETTER_PREFIX + way if prior in DEAD_LETTER_STATES else way


def left_as_array(way: str, prior: pa.ChunkedArray | pa.Array) -> pa.Array:
    """left_as for a column of prior states (null: active); a few as Python values (the kernels' calls cost
    more)."""
    if len(prior) <= 16:
        return pa.array([left_as(way, state) for state in prior.to_pylist()], pa.string())
    dead = pc.fill_null(pc.is_in(prior, value_set=pa.array(DEAD_LETTER_STATES, pa.string())), False)
    if not pc.any(dead).as_py():
        return pa.array([way] * len(prior), pa.string())
    return pc.if_else(dead, DEAD_LETTER_PREFIX + way, way)


def completed(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    return {**unlocked(row, now), "state": left_as(COMPLETED, row["state"])}


def forwarded(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Moved to the entity it is forwarded to (sparkbus.engine.forwarding)."""
    return {**unlocked(row, now), "state": left_as(FORWARDED, row["state"])}


def completed_table(rows: pa.Table, now: datetime) -> pa.Table:
    """`completed` of many state rows (LOCKS) at once, in one Arrow operation per column."""
    n = rows.num_rows
    rows = conformed(rows, LOCKS)
    changed = {"state": left_as_array(COMPLETED, rows["state"]), "lock_token": pa.nulls(n, pa.string()),
               "locked_until_utc": pa.nulls(n, TS), "updated_at_utc": times(now, n)}
    return pa.Table.from_arrays([changed.get(name, rows.column(i)) for i, name in enumerate(LOCKS.names)], schema=LOCKS)


# The settlements that have a table form: settling many messages (complete_messages) writes their rows
# with it instead of a dict per row.
TABLE_FORMS: dict[Callable[[Mapping[str, Any], datetime], dict[str, Any]], Callable[[pa.Table, datetime], pa.Table]] = {
    completed: completed_table}


def times(moment: datetime, count: int) -> pa.Array:
    """count copies of one time (TS), made without converting count datetimes (int64 viewed as TS: a cast
    cost 8x)."""
    return pa.array(np.full(count, micros(moment), dtype=np.int64)).view(TS)


def deferred(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    return {**unlocked(row, now), "state": DEFERRED}


def dead_lettered(row: Mapping[str, Any], now: datetime, reason: Optional[str], description: Optional[str]) -> dict[str, Any]:
    return {**unlocked(row, now), "state": DEAD_LETTERED, "dead_letter_reason": reason,
            "dead_letter_error_description": description}


def transfer_dead_lettered(row: Mapping[str, Any], now: datetime, reason: str, description: str) -> dict[str, Any]:
    """Moved to the transfer dead-letter sub-queue: forwarding it failed (sparkbus.engine.forwarding)."""
    return {**unlocked(row, now), "state": TRANSFER_DEAD_LETTERED, "dead_letter_reason": reason,
            "dead_letter_error_description": description}


def abandoned(row: Mapping[str, Any], now: datetime, policy: Policy) -> dict[str, Any]:
    """Released for redelivery; an active message at max_delivery_count is dead-lettered instead."""
    if row["state"] == ACTIVE and row["delivery_count"] >= policy.max_delivery_count:
        return dead_lettered(row, now, MAX_DELIVERY_REASON,
                             f"Message could not be consumed after {row['delivery_count']} delivery attempts.")
    return unlocked(row, now)


def renewed(row: Mapping[str, Any], now: datetime, policy: Policy) -> dict[str, Any]:
    """The lock extended by lock_duration from now (kept, not released)."""
    return {**row, "locked_until_utc": now + policy.lock_duration, "updated_at_utc": now}


CANDIDATE_STATE_COLUMNS = ("lock_state", "prior_deliveries", "prior_reason", "prior_description")


_PRIOR_COLUMNS = ("state", "dead_letter_reason", "dead_letter_error_description")  # (text columns of LOCKS)


def candidates(messages: pa.Table, states: pa.Table, queue: str, now: datetime, limit: int,
               sequence_numbers: Optional[list[int]] = None, session_id: Optional[str] = None,
               enqueued_before: Optional[datetime] = None, up_to: Optional[int] = None) -> pa.Table:
    """Up to `limit` oldest of one partition's messages that a receiver of `queue` may lock now, given
    the partition's message rows and state rows, with the state columns plan() needs (lock_state,
    prior_deliveries, prior_reason, prior_description).

    queue: ACTIVE (includes expired and over-delivered messages, which plan() moves instead of
    delivering), DEFERRED or DEAD_LETTERED. sequence_numbers restricts the search (deferred receives),
    session_id to one session's messages, up_to to sequence numbers up to that one (a consuming stream's).
    """
    now_us = micros(now)
    numbers = stored_int64s(messages["sequence_number"])
    known = state_columns(states)
    position = known.positions(numbers)
    has = position >= 0
    born_dead = ~has & _valid(messages["born_dead_letter_reason"])  # its dead-lettered state row is on its way
    keep = _per_message(known.unlocked(now_us), position, True)  # no lock, or lapsed
    if queue == ACTIVE:
        keep &= _per_message(known.active, position, ~born_dead)
        keep &= _at_most(messages["scheduled_enqueue_time_utc"], now_us, True)
    else:
        keep &= _per_message(_equal(states["state"], queue), position, born_dead & (queue == DEAD_LETTERED))
    if sequence_numbers:
        keep &= np.isin(numbers, np.asarray(sequence_numbers, dtype=np.int64))
    if session_id is not None:
        keep &= np.asarray(pc.fill_null(pc.equal(messages["session_id"], session_id), False), dtype=bool)
    if enqueued_before is not None:
        keep &= _at_most(messages["enqueued_time_utc"], micros(enqueued_before) - 1, False)  # before it
    if up_to is not None:
        keep &= numbers <= up_to
    chosen = np.flatnonzero(keep)
    rows = chosen[np.argsort(numbers[chosen], kind="stable")[:limit]]  # the oldest, in order
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and (len(rows) < 2 or (np.diff(rows) == 1).all()):
        found = messages.slice(int(rows[0]), len(rows))  # consecutive rows, as the oldest mostly are: no copy
    elif messages.column(0).num_chunks <= 1:
        found = messages.take(pa.array(rows, pa.int64()))
    else:  # filter, not take: take on a table of many chunks first concatenates every chunk (all the bodies)
        mask = np.zeros(messages.num_rows, dtype=bool)
        mask[rows] = True
        found = messages.filter(pa.array(mask))
        order = np.argsort(numbers[mask], kind="stable")
        if not np.array_equal(order, np.arange(len(order))):  # files hold rows in order: mostly no copy
            found = found.take(pa.array(order))
    # CANDIDATE_STATE_COLUMNS: each candidate's state row's (none: active, never delivered), or a dead
    # letter's on its way (born_dead)
    at = position[rows]
    if (at < 0).all():  # none has a state row (never delivered, the usual case): no take over the state rows,
        # which on a table of many chunks (one per state file) first concatenates each column
        lock_state, reason, description = (nulls(len(at), pa.string()) for _ in _PRIOR_COLUMNS)
    else:
        lock_state, reason, description = states.select(list(_PRIOR_COLUMNS)).take(pa.array(at, mask=at < 0)).columns
    born = born_dead[rows]
    if born.any():
        chosen_born = pa.array(born)
        lock_state = pc.if_else(chosen_born, DEAD_LETTERED, lock_state)
        reason = pc.if_else(chosen_born, found["born_dead_letter_reason"], reason)
        description = pc.if_else(chosen_born, found["born_dead_letter_description"], description)
    counts = known.deliveries
    deliveries = np.where(at >= 0, counts[np.maximum(at, 0)] if len(counts) else 0, 0)
    for name, column in (("lock_state", lock_state), ("prior_deliveries", pa.array(deliveries.astype(np.int32))),
                         ("prior_reason", reason), ("prior_description", description)):
        found = found.append_column(name, column)
    return found


def settled(ranges: list[tuple[float, float]], states: pa.Table, now: Optional[datetime] = None) -> list[bool]:
    """Which of a partition's message files, given by their sequence-number ranges [low, high] (unbounded
    when unknown), hold nothing a receiver of the active queue could take: every number in the range has a
    state row, and none of them is ACTIVE. Completed, cancelled, deferred and dead-lettered messages never
    return to the active queue, and a partition numbers its messages consecutively, so such a file need not
    be read to choose what to lock. A drained partition keeps its rows until retention removes them; four
    receivers of one queue read every one of them, in every partition each came to, to find nothing.

    now: an ACTIVE row locked beyond now counts too (another receiver holds the message; nothing to take
    before its lock lapses, when the file is read again): receivers sharing a partition read the files the
    others had just locked, only to find nothing in them."""
    if not ranges:
        return []
    known = state_columns(states)
    gone = ~known.active
    if now is not None:
        gone |= ~known.unlocked(micros(now))
    numbers = np.sort(known.numbers[gone])
    if len(numbers) > 1 and (repeated := numbers[1:] == numbers[:-1]).any():  # (np.unique: 12 times slower)
        numbers = numbers[np.concatenate(([True], ~repeated))]
    lows = np.array([low for low, _ in ranges], dtype=np.float64)
    highs = np.array([high for _, high in ranges], dtype=np.float64)
    bounded = np.isfinite(lows) & np.isfinite(highs)
    lows, highs = np.where(bounded, lows, 0).astype(np.int64), np.where(bounded, highs, -1).astype(np.int64)
    held = np.searchsorted(numbers, highs, side="right") - np.searchsorted(numbers, lows, side="left")
    return cast(list[bool], (bounded & (held == highs - lows + 1)).tolist())


def quiet_until(messages: pa.Table, states: pa.Table, now: datetime) -> Optional[int]:
    """For a partition where candidates() found nothing to receive from ACTIVE at now: the first moment
    (microseconds since the epoch) when, without a write to either table, one of its messages could
    become receivable: the earliest lock of an active message to lapse or scheduled message to fall due
    after now. None: never (only a write can change the answer)."""
    now_us = micros(now)
    numbers = stored_int64s(messages["sequence_number"])
    known = state_columns(states)
    position = known.positions(numbers)
    active = _per_message(known.active, position, True)
    moments = []
    if known.any_locked:
        moments.append(known.lock_ends[known.lock_set & (known.lock_ends > now_us) & known.active])
    scheduled = messages["scheduled_enqueue_time_utc"]
    if len(scheduled) and scheduled.null_count < len(scheduled):
        due = stored_int64s(scheduled)
        moments.append(due[_valid(scheduled) & (due > now_us) & active])
    later = [m for m in moments if len(m)]
    return int(min(m.min() for m in later)) if later else None


class StateColumns:
    """What choosing and skipping read from one partition's state rows (LOCKS), each column taken from
    its buffers once: a receive asks settled(), candidates() and quiet_until() of the same rows, and on
    this kind of machine every Arrow or numpy call made after a wait (a commit's fsyncs) runs with cold
    caches, 20-60 us for a string comparison that costs 7 us in a loop. Built by state_columns; read-only."""

    def __init__(self, states: pa.Table) -> None:
        self.table = states
        self.numbers = stored_int64s(states["sequence_number"])
        self.active = _equal(states["state"], ACTIVE)
        until = states["locked_until_utc"]
        self.any_locked = bool(len(until)) and until.null_count < len(until)
        self.lock_ends = stored_int64s(until) if self.any_locked else np.zeros(len(until), np.int64)
        self.lock_set = _valid(until)
        for shared in (self.numbers, self.active, self.lock_ends, self.lock_set):
            shared.flags.writeable = False  # served to every caller of these rows: none may change them
        self._deliveries: Optional[np.ndarray] = None
        self._ranked: Optional[tuple[np.ndarray, np.ndarray]] = None

    def unlocked(self, now_us: int) -> np.ndarray:
        """Per row, whether it holds no lock at now_us (none, or lapsed)."""
        if not self.any_locked:
            return np.ones(len(self.numbers), dtype=bool)
        return ~self.lock_set | (self.lock_ends <= now_us)

    @property
    def deliveries(self) -> np.ndarray:
        if self._deliveries is None:
            counts = stored_int64s(self.table["delivery_count"])
            counts.flags.writeable = False
            self._deliveries = counts
        return self._deliveries

    def positions(self, numbers: np.ndarray) -> np.ndarray:
        """For each of numbers, the index of its state row, or -1 where it has none."""
        if not len(self.numbers):
            return np.full(len(numbers), -1, dtype=np.int64)
        if self._ranked is None:
            order = np.argsort(self.numbers, kind="stable")
            self._ranked = order, self.numbers[order]  # (both private: positions returns new arrays)
        order, ranked = self._ranked
        slot = np.minimum(np.searchsorted(ranked, numbers), len(ranked) - 1)
        return np.where(ranked[slot] == numbers, order[slot], -1)


_last_states: Optional[StateColumns] = None  # the rows state_columns last served (one entry: a receive's)


def state_columns(states: pa.Table) -> StateColumns:
    """StateColumns of these state rows, the same object again for the same table (the entry holds the
    table, so its identity cannot be reused meanwhile; threads at worst build it twice)."""
    global _last_states
    known = _last_states
    if known is None or known.table is not states:
        known = _last_states = StateColumns(states)
    return known


def _per_message(values: np.ndarray, position: np.ndarray, otherwise: "np.ndarray | bool") -> np.ndarray:
    """Per message, the value of its state row (position: -1 for none), `otherwise` where it has none."""
    if not len(values):
        return np.full(position.shape, otherwise, dtype=bool)
    return np.where(position >= 0, values[np.maximum(position, 0)], otherwise)


def _valid(column: pa.ChunkedArray) -> np.ndarray:
    """Which values of a column are set (no kernel call when none or all are)."""
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    if column.null_count == len(column):
        return np.zeros(len(column), dtype=bool)
    return np.asarray(pc.is_valid(column), dtype=bool)


def _at_most(column: pa.ChunkedArray, bound: int, unset: bool) -> np.ndarray:
    """Which values of a timestamp column are at most bound (microseconds), `unset` where null."""
    if column.null_count == len(column):
        return np.full(len(column), unset, dtype=bool)
    values = stored_int64s(column)
    return np.where(_valid(column), values <= bound, unset) if column.null_count else values <= bound


def _equal(column: pa.ChunkedArray, text: str) -> np.ndarray:
    """Which values of a string column equal text (False where null)."""
    equal = pc.equal(column, text)
    return np.asarray(pc.fill_null(equal, False) if column.null_count else equal, dtype=bool)


def plan(found: pa.Table, policy: Policy, now: datetime, queue: str, delete: bool,
         count: int) -> tuple[pa.Table, np.ndarray]:
    """The state rows a receiver writes for candidates (oldest first), and which of them it delivers.

    Up to `count` messages are delivered (locked, or removed when `delete`); expired active messages met
    on the way are dead-lettered (or removed), and messages whose lock lapsed at the delivery limit are
    dead-lettered instead of delivered. Returns (rows in the LOCKS schema, positions in `found` of the
    delivered messages, which are also the first rows of the returned table's delivered part).
    """
    n = found.num_rows
    deliveries = stored_int64s(found["prior_deliveries"])
    if queue == ACTIVE:
        expired = _at_most(found["expires_at_utc"], micros(now), False)  # (unset: never expires)
        over = ~expired & (deliveries >= policy.max_delivery_count)
    else:
        expired = over = np.zeros(n, dtype=bool)
    deliverable = ~expired & ~over
    reached = np.flatnonzero(np.cumsum(deliverable) == count)
    within = np.arange(n) <= (reached[0] if reached.size else n)
    deliver, moved = np.flatnonzero(deliverable & within), np.flatnonzero(~deliverable & within)

    k = len(deliver)
    # (the candidates' first rows, as mostly: a slice; take copies)
    taken = found.select(["partition_id", "sequence_number", "lock_state", "prior_reason", "prior_description"])
    taken = taken.slice(0, k) if k == 0 or deliver[-1] == k - 1 else taken.take(pa.array(deliver, pa.int64()))
    state = left_as_array(RECEIVED_AND_DELETED, taken["lock_state"]) if delete else taken["lock_state"]
    if state.null_count and k <= 16:  # (a few as Python values: the kernel call cost a single receive 30-70 us)
        state = pa.array([ACTIVE if value is None else value for value in state.to_pylist()], pa.string())
    elif state.null_count:
        state = pc.fill_null(state, ACTIVE)
    # the LOCKS columns, in its order and types (non-nullable ones set here)
    rows = pa.Table.from_arrays([
        taken["partition_id"], taken["sequence_number"], state, pa.array((deliveries[deliver] + 1).astype(np.int32)),
        pa.nulls(k, pa.string()) if delete else lock_token_array(k),
        pa.nulls(k, TS) if delete else times(now + policy.lock_duration, k),
        taken["prior_reason"], taken["prior_description"], pa.nulls(k, pa.string()), times(now, k)], schema=LOCKS)
    moved_rows = []
    for i in moved.tolist():
        pid, seq = found["partition_id"][i].as_py(), found["sequence_number"][i].as_py()
        if expired[i] and policy.dead_letter_on_expiry:
            moved_rows.append(new_state(pid, seq, DEAD_LETTERED, int(deliveries[i]), now, reason=EXPIRED_REASON,
                                        description="The message expired and was dead lettered."))
        elif expired[i]:
            moved_rows.append(new_state(pid, seq, EXPIRED, int(deliveries[i]), now))
        else:
            moved_rows.append(new_state(pid, seq, DEAD_LETTERED, int(deliveries[i]), now, reason=MAX_DELIVERY_REASON,
                                        description=f"Message could not be consumed after {deliveries[i]} delivery attempts."))
    return (pa.concat_tables([rows, from_rows(moved_rows, LOCKS)]) if moved_rows else rows), deliver


def not_held(rows: pa.Table, tokens: dict[int, str], now: datetime) -> list[int]:
    """Sequence numbers in tokens whose state row (in rows) does not carry that lock, unexpired."""
    now_us = micros(now)
    held = {seq for seq, token, state, until in zip(
        rows["sequence_number"].to_pylist(), rows["lock_token"].to_pylist(), rows["state"].to_pylist(),
        rows["locked_until_utc"].cast(pa.int64()).to_pylist())
        if token == tokens.get(seq) and state not in GONE_STATES and until is not None and until > now_us}
    return sorted(set(tokens) - held)


def locked_until(rows: pa.Table, until: datetime) -> pa.Table:
    """State rows with their locks extended to `until`."""
    index = rows.schema.get_field_index("locked_until_utc")
    return rows.set_column(index, "locked_until_utc", pa.array([until] * rows.num_rows, TS))


def deleted(found: pa.Table, now: datetime) -> pa.Table:
    """The state rows that remove candidates (batch delete, purge): purged, with their delivery counts and
    dead-letter reasons unchanged."""
    rows = [new_state(pid, seq, left_as(PURGED, prior), deliveries, now, reason=reason, description=description)
            for pid, seq, prior, deliveries, reason, description in
            zip(*(found[name].to_pylist() for name in ("partition_id", "sequence_number", "lock_state",
                                                        "prior_deliveries", "prior_reason", "prior_description")))]
    return from_rows(rows, LOCKS)


def new_state(partition: int, sequence_number: int, state: str, delivery_count: int, now: datetime, *,
              reason: Optional[str] = None, description: Optional[str] = None) -> dict[str, Any]:
    """An unlocked state row."""
    return {"partition_id": partition, "sequence_number": sequence_number, "state": state,
            "delivery_count": delivery_count, "lock_token": None, "locked_until_utc": None,
            "dead_letter_reason": reason, "dead_letter_error_description": description,
            "dead_letter_source": None, "updated_at_utc": now}


def new_lock_tokens(count: int) -> list[str]:
    """count random version-4 UUID strings (one urandom call for all of them, formatted vectorised)."""
    return cast(list[str], lock_token_array(count).to_pylist())


def lock_token_array(count: int) -> pa.Array:
    """new_lock_tokens as an Arrow string array (made without a Python str per token, but for a few: there
    uuid4's are quicker than the vectorised formatting)."""
    if count <= 8:
        return pa.array([str(uuid.uuid4()) for _ in range(count)], pa.string())
    raw = np.frombuffer(os.urandom(16 * count), dtype=np.uint8).reshape(count, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    digits = np.empty((count, 32), dtype=np.uint8)
    digits[:, 0::2], digits[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 0x0F]
    text = np.full((count, 36), ord("-"), dtype=np.uint8)
    for start, end, at in ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19), (20, 32, 24)):
        text[:, at:at + end - start] = digits[:, start:end]
    return pa.array(text.view("S36").ravel(), pa.binary(36)).cast(pa.string())


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
