"""Messages in columnar (Arrow) form: the columns a sender provides, new message ids, and sizes.

Every send, of one message or of a DataFrame, becomes an Arrow table of OUTGOING rows, and sizes are
computed by one vectorised function over that table, so the Python and Spark paths agree byte for byte.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..storage.schemas import MESSAGES

MAX_ID_LENGTH = 128
STRING_PROPERTIES = ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject",
                     "to", "reply_to", "reply_to_session_id")
LENGTH_LIMITED = ("message_id", "session_id", "partition_key")
# Columns a sender provides; partition_id, sequence_number and the times are set when the send commits.
OUTGOING = pa.schema([MESSAGES.field(name) for name in (*STRING_PROPERTIES, "application_properties", "body",
                                                         "body_type", "time_to_live_ms",
                                                         "scheduled_enqueue_time_utc")])


def check_id(name: str, value: str) -> str:
    """A message_id, session_id or partition_key: 1 to MAX_ID_LENGTH characters (ValueError otherwise)."""
    if not 0 < len(value) <= MAX_ID_LENGTH:
        raise ValueError(f"{name} must be 1 to {MAX_ID_LENGTH} characters, got {len(value)}")
    return value


FIXED_WIDTH_BYTES = 8  # a time-to-live or scheduled time, when set, counts as 8 header bytes


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def new_message_ids(count: int) -> pa.Array:
    """count random uuid4 hex strings (what ServiceBusMessage assigns), generated vectorised."""
    raw = np.frombuffer(os.urandom(16 * count), dtype=np.uint8).reshape(count, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    text = np.empty((count, 32), dtype=np.uint8)
    text[:, 0::2], text[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 0x0F]
    return pa.array(text.view("S32").ravel(), pa.binary(32)).cast(pa.string())


def header_sizes(rows: pa.Table) -> pa.Array:
    """Header bytes per row: UTF-8 bytes of the string system properties and of the stored application
    properties, plus 8 bytes for each time-to-live or scheduled time that is set."""
    total = pa.array([0] * rows.num_rows, pa.int64())
    for name in (*STRING_PROPERTIES, "application_properties"):
        total = pc.add(total, pc.fill_null(pc.cast(pc.binary_length(rows[name]), pa.int64()), 0))
    for name in ("time_to_live_ms", "scheduled_enqueue_time_utc"):
        is_set = pc.cast(pc.is_valid(rows[name]), pa.int64())
        total = pc.add(total, pc.multiply(is_set, FIXED_WIDTH_BYTES))
    return total


def body_sizes(rows: pa.Table) -> pa.Array:
    return pc.fill_null(pc.cast(pc.binary_length(rows["body"]), pa.int64()), 0)
