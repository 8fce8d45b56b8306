"""Duplicate detection: a message id accepted within the entity's history window is acknowledged and dropped.

The history is the entity's own messages table: rows enqueued within duplicate_detection_history_time_window.
Reading it from the same snapshot the send commits against makes detection exact under concurrency: a
racing sender that commits the same id to the same partition first makes this send conflict, and the
retry sees the id. (The message id is the partition key unless a session id or partition key is set; as
in Service Bus, duplicates are detected per partition.) Only ids inside the window are ever consulted, so
the history is bounded by it; retention must keep rows at least that long.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Optional

import numpy as np
import pyarrow as pa

from .. import storage
from ..core import records
from ..storage import DeltaTable


def first_occurrences(message_ids: list[Optional[str]]) -> np.ndarray:
    """Mask keeping the first row of each message id within one send."""
    seen: set[Optional[str]] = set()
    keep = np.ones(len(message_ids), dtype=bool)
    for i, mid in enumerate(message_ids):
        if mid in seen:
            keep[i] = False
        else:
            seen.add(mid)
    return keep


def recent_ids(table: DeltaTable, partitions: list[int], now: datetime, window: timedelta) -> set[str]:
    """Message ids enqueued into the given partitions within the window before now."""
    if table.version() == 0 or not partitions:
        return set()
    cutoff_us = records.micros(now - window)
    found = storage.query(
        "SELECT message_id FROM messages WHERE partition_id IN ({}) AND CAST(enqueued_time_utc AS BIGINT) >= {}"
        .format(", ".join(str(int(p)) for p in partitions), cutoff_us), messages=table)
    return set(found["message_id"].to_pylist())


def not_seen(message_ids: pa.Array, seen: set[str]) -> np.ndarray:
    return np.array([mid not in seen for mid in message_ids.to_pylist()], dtype=bool)
