"""Receive state: finding deliverable messages and taking, renewing and settling locks.

All state lives in the entity's `locks` table, one row per message that left its initial state, changed
by MERGEs whose predicate names one partition: receivers of different partitions never conflict, and on
one partition delta-rs lets one commit and the other re-reads and retries. Every decision (is the
message still available? is this lock still ours?) is read from the same table version the MERGE then
commits against, so a decision is never based on state that changed underneath it.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

import pyarrow as pa
from deltalake import DeltaTable

from . import maintenance, storage
from .schemas import ACTIVE, COMPLETED, DEAD_LETTERED, DEFERRED, LOCKS

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
EXPIRED_REASON = "TTLExpiredException"
_US = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    return (moment - EPOCH) // _US


@dataclass(frozen=True)
class Policy:
    """The entity settings that decide transitions."""

    lock_duration: timedelta
    max_delivery_count: int
    dead_letter_on_expiry: bool


def candidates(messages: DeltaTable, locks: DeltaTable, partitions: list[int], queue: str, now: datetime,
               limit: int, sequence_numbers: Optional[list[int]] = None) -> pa.Table:
    """Up to `limit` oldest messages per partition that a receiver of `queue` may lock now.

    queue: ACTIVE (includes expired and over-delivered messages, which the caller moves instead of
    delivering), DEFERRED or DEAD_LETTERED. sequence_numbers restricts the search (deferred receives).
    """
    now_us = micros(now)
    in_queue = {ACTIVE: f"(l.state IS NULL OR l.state = '{ACTIVE}')",
                DEFERRED: f"l.state = '{DEFERRED}'", DEAD_LETTERED: f"l.state = '{DEAD_LETTERED}'"}[queue]
    scheduled = ("AND (m.scheduled_enqueue_time_utc IS NULL OR "
                 f"CAST(m.scheduled_enqueue_time_utc AS BIGINT) <= {now_us})") if queue == ACTIVE else ""
    only = f"AND m.sequence_number IN ({', '.join(map(str, sequence_numbers))})" if sequence_numbers else ""
    sql = f"""
        SELECT * FROM (
          SELECT m.*, l.state AS lock_state, COALESCE(l.delivery_count, 0) AS prior_deliveries,
                 l.dead_letter_reason AS prior_reason, l.dead_letter_error_description AS prior_description,
                 ROW_NUMBER() OVER (PARTITION BY m.partition_id ORDER BY m.sequence_number) AS rank
          FROM messages m
          LEFT JOIN locks l ON m.partition_id = l.partition_id AND m.sequence_number = l.sequence_number
          WHERE m.partition_id IN ({', '.join(map(str, partitions))}) AND {in_queue} {scheduled} {only}
            AND (l.locked_until_utc IS NULL OR CAST(l.locked_until_utc AS BIGINT) <= {now_us})
        ) WHERE rank <= {int(limit)} ORDER BY partition_id, sequence_number
    """
    return storage.query(sql, messages=messages, locks=locks)


def lock_rows(locks: DeltaTable, partition: int, sequence_numbers: list[int]) -> dict[int, dict]:
    """Current locks-table rows of messages in one partition, by sequence number."""
    wanted = ", ".join(map(str, sequence_numbers))
    found = storage.query(f"SELECT * FROM locks WHERE partition_id = {partition} AND sequence_number IN ({wanted})",
                          locks=locks)
    return {r["sequence_number"]: r for r in found.to_pylist()}


def new_state(partition: int, sequence_number: int, state: str, delivery_count: int, now: datetime, *,
              lock_token: Optional[str] = None, locked_until: Optional[datetime] = None,
              reason: Optional[str] = None, description: Optional[str] = None, source: Optional[str] = None) -> dict:
    return {"partition_id": partition, "sequence_number": sequence_number, "state": state,
            "delivery_count": delivery_count, "lock_token": lock_token, "locked_until_utc": locked_until,
            "dead_letter_reason": reason, "dead_letter_error_description": description,
            "dead_letter_source": source, "updated_at_utc": now}


def commit(locks: DeltaTable, partition: int, rows: list[dict]) -> None:
    """Upsert state rows of one partition in one MERGE naming that partition."""
    if not rows:
        return
    source = pa.Table.from_pylist(rows, schema=LOCKS)
    (locks.merge(source, f"t.partition_id = {partition} AND t.partition_id = s.partition_id "
                         "AND t.sequence_number = s.sequence_number", source_alias="s", target_alias="t",
                 post_commithook_properties=storage.NO_HOOKS)
        .when_matched_update_all().when_not_matched_insert_all().execute())
    maintenance.after_commit(locks)


def take(candidate: dict, policy: Policy, now: datetime, queue: str, delete: bool) -> tuple[dict, bool]:
    """The state row a receiver writes for a candidate, and whether the message is delivered.

    Expired active messages are dead-lettered (or removed) and a message whose lock lapsed at the
    delivery limit is dead-lettered, instead of being delivered again.
    """
    pid, seq = candidate["partition_id"], candidate["sequence_number"]
    deliveries = candidate["prior_deliveries"]
    if queue == ACTIVE:
        expires = candidate["expires_at_utc"]
        if expires is not None and expires <= now:
            if policy.dead_letter_on_expiry:
                return new_state(pid, seq, DEAD_LETTERED, deliveries, now, reason=EXPIRED_REASON,
                                 description="The message expired and was dead lettered."), False
            return new_state(pid, seq, COMPLETED, deliveries, now), False
        if deliveries >= policy.max_delivery_count:
            return new_state(pid, seq, DEAD_LETTERED, deliveries, now, reason=MAX_DELIVERY_REASON,
                             description=f"Message could not be consumed after {deliveries} delivery attempts."), False
    state = candidate["lock_state"] or ACTIVE
    kept = dict(reason=candidate["prior_reason"], description=candidate["prior_description"])
    if delete:
        return new_state(pid, seq, COMPLETED, deliveries + 1, now, **kept), True
    return new_state(pid, seq, state, deliveries + 1, now, lock_token=str(uuid.uuid4()),
                     locked_until=now + policy.lock_duration, **kept), True
