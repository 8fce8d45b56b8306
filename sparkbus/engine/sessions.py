"""Session locks and session state (seed: sessions guarantee ordering and consistent session state).

A session lives in one partition: its session_id is the message's partition key. Its lock and its state
are one row of the entity's `sessions` table, partitioned by partition_id and written, like message
locks, by conditional overwrites whose predicate names the partition and the session: two receivers
racing for one session conflict and the loser re-reads (and finds it locked); sessions of different
partitions never conflict. Nothing here knows about the receiver classes.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Optional, cast

import pyarrow as pa

from .. import storage
from ..core import records
from ..core import transitions
from ..exceptions import SessionCannotBeLockedError, SessionLockLostError
from ..storage import DeltaTable, maintenance
from ..core.schemas import ACTIVE, GONE_SQL, SESSIONS


def session_row(table: DeltaTable, partition: int, session_id: str) -> Optional[dict[str, Any]]:
    found = storage.query(f"SELECT * FROM sessions WHERE partition_id = {partition} AND session_id = {storage.quoted(session_id)}",
                          sessions=table)
    rows = records.as_rows(found)
    return rows[0] if rows else None


def write(table: DeltaTable, row: dict[str, Any]) -> None:
    """Upsert one session row, rejected if another writer changed that session since the table's version."""
    storage.write(table, pa.Table.from_pylist([row], schema=SESSIONS), mode="overwrite",
                  predicate=f"partition_id = {row['partition_id']} AND session_id = {storage.quoted(row['session_id'])}",
                  post_commithook_properties=storage.NO_HOOKS)
    maintenance.after_commit(table)


def is_locked(row: Optional[dict[str, Any]], now: datetime) -> bool:
    return row is not None and row["lock_token"] is not None and row["locked_until_utc"] > now


def lock(table: DeltaTable, partition: int, session_id: str, duration: timedelta, now: datetime) -> dict[str, Any]:
    """Take the session's lock (keeping its state); SessionCannotBeLockedError while another holds it."""
    row = session_row(table, partition, session_id)
    if is_locked(row, now):
        assert row is not None
        raise SessionCannotBeLockedError(
            f"session {session_id!r} is locked by another receiver until {row['locked_until_utc'].isoformat()}")
    taken = {"partition_id": partition, "session_id": session_id, "lock_token": transitions.new_lock_tokens(1)[0],
             "locked_until_utc": now + duration, "state": row["state"] if row else None, "updated_at_utc": now}
    write(table, taken)
    return taken


def held(table: DeltaTable, partition: int, session_id: str, lock_token: str, now: datetime) -> dict[str, Any]:
    """The session row if this lock still holds it; SessionLockLostError otherwise."""
    row = session_row(table, partition, session_id)
    if row is None or row["lock_token"] != lock_token or row["locked_until_utc"] <= now:
        raise SessionLockLostError(
            f"the lock on session {session_id!r} expired or was taken by another receiver")
    return row


def available(messages: DeltaTable, locks_table: DeltaTable, sessions: DeltaTable, partitions: list[int],
              now: datetime, limit: int = 8) -> list[tuple[int, str]]:
    """(partition, session id) of the sessions in these partitions with a deliverable message and no
    unexpired lock, the session whose oldest waiting message was enqueued first coming first (across
    partitions: the time, not the sequence number, orders them)."""
    now_us = records.micros(now)
    found = storage.query(f"""
        SELECT m.partition_id, m.session_id, MIN(m.enqueued_time_utc) AS oldest, MIN(m.sequence_number) AS first
        FROM messages m
        LEFT JOIN locks l ON l.partition_id = m.partition_id AND l.sequence_number = m.sequence_number
        LEFT JOIN sessions s ON s.partition_id = m.partition_id AND s.session_id = m.session_id
        WHERE m.partition_id IN ({", ".join(map(str, partitions))}) AND m.session_id IS NOT NULL
          AND (l.state IS NULL OR l.state = '{ACTIVE}')
          AND (m.scheduled_enqueue_time_utc IS NULL OR CAST(m.scheduled_enqueue_time_utc AS BIGINT) <= {now_us})
          AND CAST(m.expires_at_utc AS BIGINT) > {now_us}
          AND (s.lock_token IS NULL OR CAST(s.locked_until_utc AS BIGINT) <= {now_us})
        GROUP BY m.partition_id, m.session_id ORDER BY oldest, first LIMIT {int(limit)}""",
        messages=messages, locks=locks_table, sessions=sessions)
    return list(zip(found["partition_id"].to_pylist(), found["session_id"].to_pylist()))


def listed(tables: dict[str, str], state_updated_after: Optional[datetime] = None) -> list[str]:
    """Session ids of an entity (its table uris by role), as Service Bus lists them: sessions with messages
    still in the entity or with a session state; with state_updated_after, the sessions whose state was
    set after that time."""
    sessions = storage.open_table(tables["sessions"])
    if state_updated_after is not None:
        after_us = records.micros(state_updated_after)
        found = storage.query(f"""
            SELECT DISTINCT session_id FROM sessions
            WHERE state IS NOT NULL AND CAST(updated_at_utc AS BIGINT) > {after_us} ORDER BY session_id""",
            sessions=sessions)
        return cast(list[str], found["session_id"].to_pylist())
    found = storage.query(f"""
        SELECT DISTINCT m.session_id FROM messages m
        LEFT JOIN locks l ON l.partition_id = m.partition_id AND l.sequence_number = m.sequence_number
        WHERE m.session_id IS NOT NULL AND (l.state IS NULL OR l.state NOT IN ({GONE_SQL}))
        UNION SELECT DISTINCT session_id FROM sessions WHERE state IS NOT NULL
        ORDER BY session_id""", locks=storage.open_table(tables["locks"]),  # before messages: see retention
        messages=storage.open_table(tables["messages"]), sessions=sessions)
    return cast(list[str], found["session_id"].to_pylist())
