"""Receive state: finding deliverable messages and taking, renewing and settling locks.

All state lives in the entity's `locks` table, one row per message that left its initial state, changed
by MERGEs whose predicate names one partition: receivers of different partitions never conflict, and on
one partition delta-rs lets one commit and the other re-reads and retries. Every decision (is the
message still available? is this lock still ours?) is read from the same table version the MERGE then
commits against, so a decision is never based on state that changed underneath it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from . import maintenance, storage
from .schemas import ACTIVE, COMPLETED, DEAD_LETTERED, DEFERRED, GONE_STATES, LOCKS, TS

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
EXPIRED_REASON = "TTLExpiredException"
@dataclass(frozen=True)
class Policy:
    """The entity settings that decide transitions."""

    lock_duration: timedelta
    max_delivery_count: int
    dead_letter_on_expiry: bool


def candidates(messages: DeltaTable, locks: DeltaTable, partition: int, queue: str, now: datetime,
               limit: int, sequence_numbers: Optional[list[int]] = None, session_id: Optional[str] = None) -> pa.Table:
    """Up to `limit` oldest messages of one partition that a receiver of `queue` may lock now.

    queue: ACTIVE (includes expired and over-delivered messages, which the caller moves instead of
    delivering), DEFERRED or DEAD_LETTERED. sequence_numbers restricts the search (deferred receives),
    session_id to one session's messages.
    """
    now_us = storage.micros(now)
    in_queue = {ACTIVE: f"(l.state IS NULL OR l.state = '{ACTIVE}')",
                DEFERRED: f"l.state = '{DEFERRED}'", DEAD_LETTERED: f"l.state = '{DEAD_LETTERED}'"}[queue]
    scheduled = ("AND (m.scheduled_enqueue_time_utc IS NULL OR "
                 f"CAST(m.scheduled_enqueue_time_utc AS BIGINT) <= {now_us})") if queue == ACTIVE else ""
    only = f"AND m.sequence_number IN ({', '.join(map(str, sequence_numbers))})" if sequence_numbers else ""
    if session_id is not None:
        only += f" AND m.session_id = {storage.quoted(session_id)}"
    sql = f"""
        SELECT m.*, l.state AS lock_state, COALESCE(l.delivery_count, 0) AS prior_deliveries,
               l.dead_letter_reason AS prior_reason, l.dead_letter_error_description AS prior_description
        FROM messages m
        LEFT JOIN locks l ON l.partition_id = {partition} AND m.sequence_number = l.sequence_number
        WHERE m.partition_id = {partition} AND {in_queue} {scheduled} {only}
          AND (l.locked_until_utc IS NULL OR CAST(l.locked_until_utc AS BIGINT) <= {now_us})
        ORDER BY m.sequence_number LIMIT {int(limit)}
    """
    return storage.query(sql, messages=messages, locks=locks)


def lock_rows(locks: DeltaTable, partition: int, sequence_numbers: list[int]) -> pa.Table:
    """Current locks-table rows of messages in one partition."""
    return storage.query(f"SELECT * FROM locks WHERE {rows_predicate(partition, sequence_numbers)}", locks=locks)


def not_held(rows: pa.Table, tokens: dict[int, str], now: datetime) -> list[int]:
    """Sequence numbers in tokens whose state row (in rows) does not carry that lock, unexpired."""
    now_us = storage.micros(now)
    held = {seq for seq, token, state, until in zip(
        rows["sequence_number"].to_pylist(), rows["lock_token"].to_pylist(), rows["state"].to_pylist(),
        rows["locked_until_utc"].cast(pa.int64()).to_pylist())
        if token == tokens.get(seq) and state not in GONE_STATES and until is not None and until > now_us}
    return sorted(set(tokens) - held)


def released(rows: pa.Table, state: str, now: datetime) -> pa.Table:
    """State rows moved to `state` with their locks released."""
    n = rows.num_rows
    changes = {"state": pa.array([state] * n, pa.string()), "lock_token": pa.nulls(n, pa.string()),
               "locked_until_utc": pa.nulls(n, TS), "updated_at_utc": pa.array([now] * n, TS)}
    return pa.table([changes.get(f.name, rows[f.name]) for f in LOCKS], schema=LOCKS)


def locked_until(rows: pa.Table, until: datetime) -> pa.Table:
    """State rows with their locks extended to `until`."""
    index = rows.schema.get_field_index("locked_until_utc")
    return rows.set_column(index, "locked_until_utc", pa.array([until] * rows.num_rows, TS))


def new_state(partition: int, sequence_number: int, state: str, delivery_count: int, now: datetime, *,
              reason: Optional[str] = None, description: Optional[str] = None) -> dict:
    """An unlocked state row."""
    return {"partition_id": partition, "sequence_number": sequence_number, "state": state,
            "delivery_count": delivery_count, "lock_token": None, "locked_until_utc": None,
            "dead_letter_reason": reason, "dead_letter_error_description": description,
            "dead_letter_source": None, "updated_at_utc": now}


def commit(locks: DeltaTable, partition: int, rows: pa.Table) -> None:
    """Upsert state rows of one partition in one conditional commit naming that partition and the rows'
    sequence numbers: it replaces exactly those rows, and delta-rs rejects it if another writer changed
    any of them since the version the caller read (the caller re-reads and retries)."""
    if not rows.num_rows:
        return
    write_deltalake(locks, rows.select(LOCKS.names).cast(LOCKS), mode="overwrite",
                    predicate=rows_predicate(partition, rows["sequence_number"].to_pylist()),
                    post_commithook_properties=storage.NO_HOOKS)
    maintenance.after_commit(locks)


def rows_predicate(partition: int, sequence_numbers: list[int]) -> str:
    """SQL naming the rows of one partition with these sequence numbers; the range lets statistics prune
    files before the list is evaluated."""
    low, high = min(sequence_numbers), max(sequence_numbers)
    listed = "" if high - low + 1 == len(set(sequence_numbers)) else \
        f" AND sequence_number IN ({', '.join(map(str, sorted(set(sequence_numbers))))})"
    return f"partition_id = {partition} AND sequence_number >= {low} AND sequence_number <= {high}{listed}"


def plan(found: pa.Table, policy: Policy, now: datetime, queue: str, delete: bool,
         count: int) -> tuple[pa.Table, np.ndarray]:
    """The state rows a receiver writes for candidates (oldest first), and which of them it delivers.

    Up to `count` messages are delivered (locked, or removed when `delete`); expired active messages met
    on the way are dead-lettered (or removed), and messages whose lock lapsed at the delivery limit are
    dead-lettered instead of delivered. Returns (rows in the LOCKS schema, positions in `found` of the
    delivered messages, which are also the first rows of the returned table's delivered part).
    """
    n = found.num_rows
    deliveries = np.asarray(found["prior_deliveries"].to_numpy(zero_copy_only=False), dtype=np.int64)
    expired = np.zeros(n, dtype=bool)
    over = np.zeros(n, dtype=bool)
    if queue == ACTIVE:
        expires = pc.fill_null(found["expires_at_utc"].cast(pa.int64()), np.iinfo(np.int64).max)
        expired = np.asarray(expires.to_numpy(zero_copy_only=False)) <= storage.micros(now)
        over = ~expired & (deliveries >= policy.max_delivery_count)
    deliverable = ~expired & ~over
    reached = np.flatnonzero(np.cumsum(deliverable) == count)
    within = np.arange(n) <= (reached[0] if reached.size else n)
    deliver, moved = np.flatnonzero(deliverable & within), np.flatnonzero(~deliverable & within)

    taken = found.take(pa.array(deliver, pa.int64()))
    k = taken.num_rows
    prior_state = pc.fill_null(taken["lock_state"], ACTIVE) if k else pa.array([], pa.string())
    delivered = pa.table({
        "partition_id": taken["partition_id"], "sequence_number": taken["sequence_number"],
        "state": pa.array([COMPLETED] * k) if delete else prior_state,
        "delivery_count": pa.array(deliveries[deliver] + 1, pa.int32()),
        "lock_token": pa.array([None] * k if delete else new_lock_tokens(k), pa.string()),
        "locked_until_utc": pa.array([None if delete else now + policy.lock_duration] * k, TS),
        "dead_letter_reason": taken["prior_reason"], "dead_letter_error_description": taken["prior_description"],
        "dead_letter_source": pa.nulls(k, pa.string()), "updated_at_utc": pa.array([now] * k, TS),
    })
    moved_rows = []
    for i in moved.tolist():
        pid, seq = found["partition_id"][i].as_py(), found["sequence_number"][i].as_py()
        if expired[i] and policy.dead_letter_on_expiry:
            moved_rows.append(new_state(pid, seq, DEAD_LETTERED, int(deliveries[i]), now, reason=EXPIRED_REASON,
                                        description="The message expired and was dead lettered."))
        elif expired[i]:
            moved_rows.append(new_state(pid, seq, COMPLETED, int(deliveries[i]), now))
        else:
            moved_rows.append(new_state(pid, seq, DEAD_LETTERED, int(deliveries[i]), now, reason=MAX_DELIVERY_REASON,
                                        description=f"Message could not be consumed after {deliveries[i]} delivery attempts."))
    rows = pa.concat_tables([delivered.cast(LOCKS), pa.Table.from_pylist(moved_rows, schema=LOCKS)])
    return rows, deliver


def new_lock_tokens(count: int) -> list[str]:
    """count random version-4 UUID strings (one urandom call for all of them)."""
    raw = bytearray(os.urandom(16 * count))
    tokens = []
    for i in range(count):
        chunk = raw[16 * i:16 * i + 16]
        chunk[6] = (chunk[6] & 0x0F) | 0x40
        chunk[8] = (chunk[8] & 0x3F) | 0x80
        h = chunk.hex()
        tokens.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return tokens
