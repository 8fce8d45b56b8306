"""Runtime properties: message counts and sizes aggregated over the partitions of an entity's tables."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Optional

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import records
from ..core import sequencing
from ..storage import DeltaTable, commits, followed
from ..core.schemas import DEAD_LETTERED, DEFERRED, GONE_SQL, GONE_STATES, LOCKS, MESSAGES, TRANSFER_DEAD_LETTERED
from . import clock


# what counting reads of each table (narrow: the bodies are never parsed)
COUNTED_MESSAGE = ("sequence_number", "scheduled_enqueue_time_utc", "body_size", "header_size")
COUNTED_STATE = ("sequence_number", "state")


@dataclass(frozen=True)
class Counts:
    active: int = 0  # deferred ones included, as Service Bus counts them
    deferred: int = 0
    dead_letter: int = 0
    transfer_dead_letter: int = 0
    scheduled: int = 0
    total: int = 0
    size_in_bytes: int = 0
    accessed_at_utc: Optional[datetime] = None
    by_partition: dict[int, int] = field(default_factory=dict)  # partition -> total (partitions with messages)


def _live_messages(header_copies: int, where: str = "TRUE") -> str:
    """FROM clause over messages still in the entity (not completed or cancelled), with their stored size."""
    return f"""
        FROM (SELECT m.*, l.state, m.body_size + m.header_size * {int(header_copies)} AS stored_size
              FROM messages m
              LEFT JOIN locks l ON m.partition_id = l.partition_id AND m.sequence_number = l.sequence_number
              WHERE (l.state IS NULL OR l.state NOT IN ({GONE_SQL})) AND {where})
    """


def open_live(messages_uri: str, locks_uri: str) -> tuple[DeltaTable, DeltaTable]:
    """(messages, locks), locks opened first: see sparkbus.engine.retention for why."""
    locks = storage.open_table(locks_uri)
    return storage.open_table(messages_uri), locks


def entity_counts(messages_uri: str, locks_uri: str, *, header_copies: int = 1,
                  now: Optional[datetime] = None, cursors: Optional[dict[int, str]] = None,
                  skipped: Iterable[int] = ()) -> Counts:
    """Counts over every partition but the skipped ones (unreadable), by state and by partition. header_copies: a topic
    stores headers once per subscription; cursors: a topic's fan-out cursors (partition -> the application
    transaction whose version is the n below which unscheduled rows are already copied out). Read from the process's followed tables (storage.followed):
    one round of requests when nothing changed, one more for the files written since."""
    now_us = records.micros(now or clock.now())
    locks, messages = followed.entity_rows(locks_uri, LOCKS, COUNTED_STATE, messages_uri, MESSAGES, COUNTED_MESSAGE,
                                           skipped, (cursors or {}).values())
    fanned_out = {p: messages.app_versions[app] or 0 for p, app in (cursors or {}).items()}
    m, state_rows = messages.rows, locks.rows
    position = pc.index_in(m["sequence_number"], value_set=state_rows["sequence_number"])
    state = state_rows["state"].take(position)
    scheduled_at = m["scheduled_enqueue_time_utc"].cast(pa.int64())
    keep = pc.invert(pc.fill_null(pc.is_in(state, value_set=pa.array(GONE_STATES)), False))
    for p, n in fanned_out.items():
        if n:  # copied out to the subscriptions: no longer the topic's
            copied = pc.and_(pc.and_(pc.equal(m["partition_id"], p),
                                     pc.less_equal(m["sequence_number"], sequencing.compose(p, n))),
                             pc.is_null(scheduled_at))
            keep = pc.and_(keep, pc.invert(copied))
    live = pa.table({"partition_id": m["partition_id"], "state": state, "scheduled": scheduled_at,
                     "size": pc.add(m["body_size"].cast(pa.int64()),
                                    pc.multiply(m["header_size"].cast(pa.int64()), int(header_copies)))}).filter(keep)
    by_state = {value: pc.sum(pc.fill_null(pc.equal(live["state"], value), False).cast(pa.int64())).as_py() or 0
                for value in (DEAD_LETTERED, TRANSFER_DEAD_LETTERED, DEFERRED)}
    scheduled = pc.sum(pc.fill_null(pc.and_(pc.is_null(live["state"]), pc.greater(live["scheduled"], now_us)),
                                    False).cast(pa.int64())).as_py() or 0
    total = live.num_rows
    partitions = live["partition_id"].value_counts().to_pylist() if total else []
    stamps = [t for t in (messages.last_commit_ms, locks.last_commit_ms) if t]
    dead, transfer_dead = int(by_state[DEAD_LETTERED]), int(by_state[TRANSFER_DEAD_LETTERED])
    return Counts(active=total - dead - transfer_dead - int(scheduled), deferred=int(by_state[DEFERRED]), dead_letter=dead,
                  transfer_dead_letter=transfer_dead, scheduled=int(scheduled), total=total,
                  size_in_bytes=int(pc.sum(live["size"]).as_py() or 0),
                  accessed_at_utc=datetime.fromtimestamp(max(stamps) / 1000, timezone.utc) if stamps else None,
                  by_partition={int(v["values"]): int(v["counts"]) for v in partitions})


@dataclass
class PartitionSizes:
    """Exact stored bytes of some partitions, measured at these versions of the messages and locks tables."""

    sizes: dict[int, int]
    messages_version: int
    locks_version: int
    expires: float  # monotonic time after which log entries it has not read may have been cleaned up

    def follow(self, messages_uri: str, locks_uri: str) -> None:
        """Move to the tables' latest versions, forgetting the partitions whose files changed since (the
        others' sizes are still exact): a few reads of small log entries instead of a query. Past its
        expiry everything is forgotten."""
        if time.monotonic() > self.expires:
            self.sizes = {}
            return
        messages = commits.entries_after(messages_uri, self.messages_version)
        locks = commits.entries_after(locks_uri, self.locks_version)
        for entry in messages + locks:
            changed = None if entry.table_changed else entry.partitions()
            self.sizes = {} if changed is None else {p: n for p, n in self.sizes.items() if p not in changed}
        self.messages_version += len(messages)
        self.locks_version += len(locks)


def partition_sizes(messages_uri: str, locks_uri: str, partitions: Iterable[int], header_copies: int) -> PartitionSizes:
    """Exact stored bytes of the given partitions (every one named, 0 when empty) at the latest versions."""
    partitions = sorted({int(p) for p in partitions})
    ids = ", ".join(map(str, partitions))
    sql = f"SELECT partition_id, SUM(stored_size) AS size {_live_messages(header_copies, f'm.partition_id IN ({ids})')} GROUP BY partition_id"
    started = time.monotonic()
    messages, locks = open_live(messages_uri, locks_uri)
    table = storage.query(sql, messages=messages, locks=locks)
    found = dict(zip(table["partition_id"].to_pylist(), (int(v) for v in table["size"].to_pylist())))
    safe = min(commits.TableLog.of(messages).safe_seconds, commits.TableLog.of(locks).safe_seconds)
    return PartitionSizes({p: found.get(p, 0) for p in partitions}, messages.version(), locks.version(),
                          started + safe)
