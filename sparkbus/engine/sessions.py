"""Session locks and session state (seed: sessions guarantee ordering and consistent session state).

A session lives in one partition: its session_id is the message's partition key. Its lock and its state
are one row of the entity's `sessions` table, partitioned by partition_id and written, like message
locks, by direct commits (sparkbus.storage.commits) that claim the partition: two receivers racing for one
session conflict and the loser re-reads (and finds it locked), as do two taking different sessions of one
partition (the loser re-reads and takes its own); sessions of different partitions never conflict. Rows
are read from log views and data files kept in memory (sparkbus.storage.reader), as message locks are.
Nothing here knows about the receiver classes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Optional, cast

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import records
from ..core import transitions
from ..exceptions import SessionCannotBeLockedError, SessionLockLostError
from ..storage import commits, maintenance
from ..storage.reader import PartitionReader, data_file
from ..core.schemas import ACTIVE, DEAD_LETTERED, GONE_SQL, SESSIONS


def session_row(view: commits.LogView, reader: PartitionReader, partition: int,
                session_id: str) -> Optional[dict[str, Any]]:
    """The session's row at the view's version (its partition's files, read once and kept), or None."""
    rows = reader.rows(view, partition)
    found = rows.filter(pc.equal(rows["session_id"], session_id))
    return records.as_rows(found)[-1] if found.num_rows else None


def write(view: commits.LogView, reader: PartitionReader, row: dict[str, Any]) -> None:
    """Upsert one session row in one direct commit based on the view's version (the view then moves to the
    commit's): the partition's files holding that session are rewritten without it, plus the new row. It
    claims the whole partition, so it is rejected (CommitFailedError: re-read and retry) if another writer
    changed any session of that partition since that version, or rewrote those files."""
    partition = row["partition_id"]
    removed, kept = [], []
    for path, data in reader.files(view, partition):
        hit = pc.equal(data["session_id"], row["session_id"])
        if pc.any(hit).as_py():
            removed.append(path)
            kept.append(data.filter(pc.invert(hit)))
    written = pa.concat_tables([*kept, records.from_rows([row], SESSIONS).drop_columns([storage.PARTITION_COLUMN])])
    claim = commits.Claim({partition: (-math.inf, math.inf)}, frozenset(removed))
    files: list[commits.AddedFile] = []
    try:
        files.append(commits.write_file(view.log, partition, written))
        done = commits.commit(view.log, view.position, files, removed, claim, operation="MERGE")
    except BaseException:
        commits.discard(view.log, files)
        raise
    view.committed(done, files, removed)
    reader.remember(data_file(view.log.uri, files[0].path), written)
    maintenance.after_direct_commit(view.log.uri, done.version)


def is_locked(row: Optional[dict[str, Any]], now: datetime) -> bool:
    return row is not None and row["lock_token"] is not None and row["locked_until_utc"] > now


def lock(view: commits.LogView, reader: PartitionReader, partition: int, session_id: str, duration: timedelta,
         now: datetime) -> dict[str, Any]:
    """Take the session's lock (keeping its state); SessionCannotBeLockedError while another holds it."""
    row = session_row(view, reader, partition, session_id)
    if is_locked(row, now):
        assert row is not None
        raise SessionCannotBeLockedError(
            f"session {session_id!r} is locked by another receiver until {row['locked_until_utc'].isoformat()}")
    taken = {"partition_id": partition, "session_id": session_id, "lock_token": transitions.new_lock_tokens(1)[0],
             "locked_until_utc": now + duration, "state": row["state"] if row else None, "updated_at_utc": now}
    write(view, reader, taken)
    return taken


def held(view: commits.LogView, reader: PartitionReader, partition: int, session_id: str, lock_token: str,
         now: datetime) -> dict[str, Any]:
    """The session row if this lock still holds it; SessionLockLostError otherwise."""
    row = session_row(view, reader, partition, session_id)
    if row is None or row["lock_token"] != lock_token or row["locked_until_utc"] <= now:
        raise SessionLockLostError(
            f"the lock on session {session_id!r} expired or was taken by another receiver")
    return row


def available(messages: pa.Table, states: pa.Table, sessions: pa.Table, now: datetime) -> pa.Table:
    """The sessions of one partition (its message rows, with at least CHOOSING's columns, its state rows and
    its session rows) with a deliverable message and no unexpired lock: session_id, the enqueued time of
    its oldest waiting message (oldest) and the lowest sequence number (first)."""
    now_us = records.micros(now)
    state = states["state"].take(pc.index_in(messages["sequence_number"], value_set=states["sequence_number"]))
    scheduled = messages["scheduled_enqueue_time_utc"].cast(pa.int64())
    keep = pc.and_(pc.is_valid(messages["session_id"]), pc.or_kleene(pc.is_null(state), pc.equal(state, ACTIVE)))
    keep = pc.and_(keep, pc.or_kleene(pc.is_null(scheduled), pc.less_equal(scheduled, now_us)))
    keep = pc.and_(keep, pc.fill_null(pc.greater(messages["expires_at_utc"].cast(pa.int64()), now_us), False))
    locked = sessions.filter(pc.and_(pc.is_valid(sessions["lock_token"]),
                                     pc.greater(sessions["locked_until_utc"].cast(pa.int64()), now_us)))
    keep = pc.and_(keep, pc.invert(pc.is_in(messages["session_id"], value_set=locked["session_id"])))
    waiting = pa.table({"session_id": messages["session_id"], "oldest": messages["enqueued_time_utc"].cast(pa.int64()),
                        "first": messages["sequence_number"]}).filter(keep)
    grouped = waiting.group_by("session_id", use_threads=False).aggregate([("oldest", "min"), ("first", "min")])
    return pa.table({"session_id": grouped["session_id"], "oldest": grouped["oldest_min"],
                     "first": grouped["first_min"]})


@dataclass(frozen=True)
class SessionSummary:
    """One session of an entity as the Explorer lists it."""

    session_id: str
    message_count: int  # its messages in the entity, active, deferred or scheduled (dead-lettered ones not)
    locked_until_utc: Optional[datetime]  # while a receiver holds it, else None
    state_size: int  # bytes of its session state (0: none set)


def summaries(tables: dict[str, str], now: datetime) -> list[SessionSummary]:
    """Every session that holds messages or has a stored row (a lock taken, state set), by session id."""
    locks = storage.open_table(tables["locks"])  # before messages: see retention
    counted = storage.query(f"""
        SELECT m.session_id, COUNT(*) AS n FROM messages m
        LEFT JOIN locks l ON l.partition_id = m.partition_id AND l.sequence_number = m.sequence_number
        WHERE m.session_id IS NOT NULL AND (l.state IS NULL OR l.state NOT IN ({GONE_SQL}, '{DEAD_LETTERED}'))
        GROUP BY m.session_id""", locks=locks, messages=storage.open_table(tables["messages"]))
    stored = storage.query("SELECT session_id, lock_token, locked_until_utc, state FROM sessions",
                           sessions=storage.open_table(tables["sessions"]))
    counts = dict(zip(counted["session_id"].to_pylist(), counted["n"].to_pylist()))
    rows = {r["session_id"]: r for r in stored.to_pylist()}
    found = []
    for session_id in sorted(set(counts) | set(rows)):
        row = rows.get(session_id) or {}
        until = row.get("locked_until_utc")
        held = row.get("lock_token") is not None and until is not None and until > now
        found.append(SessionSummary(session_id, int(counts.get(session_id, 0)), until if held else None,
                                    len(row.get("state") or b"")))
    return found


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
