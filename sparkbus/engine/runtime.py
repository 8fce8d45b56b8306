"""Runtime properties: message counts and sizes aggregated over the partitions of an entity's tables."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Optional

from .. import storage
from ..core import records
from ..core import sequencing
from ..storage import DeltaTable, commits
from ..core.schemas import DEAD_LETTERED, GONE_SQL, TRANSFER_DEAD_LETTERED
from . import clock


@dataclass(frozen=True)
class Counts:
    active: int = 0
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
                  now: Optional[datetime] = None, fanned_out: Optional[dict[int, int]] = None,
                  skipped: Iterable[int] = ()) -> Counts:
    """Counts over every partition but the skipped ones (unreadable), by state and by partition. header_copies: a topic
    stores headers once per subscription; fanned_out: a topic's cursors (partition -> n), below which
    unscheduled rows are already copied out."""
    now_us = records.micros(now or clock.now())
    messages, locks = open_live(messages_uri, locks_uri)
    conditions = [f"m.partition_id NOT IN ({', '.join(map(str, sorted(skipped)))})"] if skipped else []
    conditions += [f"NOT (m.partition_id = {p} AND m.sequence_number <= {sequencing.compose(p, n)} "
                   "AND m.scheduled_enqueue_time_utc IS NULL)" for p, n in (fanned_out or {}).items() if n]
    where = " AND ".join(conditions) or "TRUE"
    sql = f"""
        SELECT
          partition_id,
          COUNT(*) AS total,
          COALESCE(SUM(CASE WHEN state = '{DEAD_LETTERED}' THEN 1 ELSE 0 END), 0) AS dead_letter,
          COALESCE(SUM(CASE WHEN state = '{TRANSFER_DEAD_LETTERED}' THEN 1 ELSE 0 END), 0) AS transfer_dead_letter,
          COALESCE(SUM(CASE WHEN state IS NULL AND scheduled_enqueue_time_utc IS NOT NULL
                            AND CAST(scheduled_enqueue_time_utc AS BIGINT) > {now_us} THEN 1 ELSE 0 END), 0)
            AS scheduled,
          COALESCE(SUM(stored_size), 0) AS size_in_bytes
        {_live_messages(header_copies, where)}
        GROUP BY partition_id
    """
    rows = storage.query(sql, messages=messages, locks=locks).to_pylist()
    row = {name: sum(int(r[name]) for r in rows) for name in
           ("total", "dead_letter", "transfer_dead_letter", "scheduled", "size_in_bytes")}
    commits = [t for t in (storage.last_commit_time_ms(messages), storage.last_commit_time_ms(locks)) if t]
    accessed = datetime.fromtimestamp(max(commits) / 1000, timezone.utc) if commits else None
    total, dead, scheduled = int(row["total"]), int(row["dead_letter"]), int(row["scheduled"])
    transfer_dead = int(row["transfer_dead_letter"])
    return Counts(active=total - dead - transfer_dead - scheduled, dead_letter=dead,
                  transfer_dead_letter=transfer_dead, scheduled=scheduled, total=total,
                  size_in_bytes=int(row["size_in_bytes"]), accessed_at_utc=accessed,
                  by_partition={int(r["partition_id"]): int(r["total"]) for r in rows})


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
