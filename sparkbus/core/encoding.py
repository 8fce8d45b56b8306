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
from .wire import MAX_ID_LENGTH

STRING_PROPERTIES = ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject",
                     "to", "reply_to", "reply_to_session_id")
LENGTH_LIMITED = ("message_id", "session_id", "partition_key", "reply_to_session_id")  # 1 to MAX_ID_LENGTH
# Columns a sender provides; partition_id, sequence_number and the times are set when the send commits.
OUTGOING = pa.schema([MESSAGES.field(name) for name in (*STRING_PROPERTIES, "application_properties", "body",
                                                         "body_type", "time_to_live_ms",
                                                         "scheduled_enqueue_time_utc")])


# What may hide a value without a wire form in a stored application-properties text (JSON, ASCII-escaped):
# a \uD800-\uDFFF escape (a lone surrogate, or half of a valid pair) or a run of 19 digits (an int that
# may be outside the signed 64-bit range). Rows without either are fine; the others are checked exactly.
_SUSPECT_PROPERTIES = r"\\u[dD][89abcdefABCDEF]|[0-9]{19}"


def suspect_rows(rows: pa.Table) -> np.ndarray:
    """Indices of OUTGOING rows that may break a wire-form limit and need the exact (slow) check: an id
    column outside 1..MAX_ID_LENGTH characters, or application properties that may hold a lone surrogate
    or an int beyond 64 bits (see _SUSPECT_PROPERTIES). One vectorised pass over the batch."""
    suspect = np.zeros(rows.num_rows, dtype=bool)
    properties = rows["application_properties"]
    if properties.null_count < len(properties):
        found = pc.match_substring_regex(properties, _SUSPECT_PROPERTIES)
        suspect |= pc.fill_null(found, False).to_numpy(zero_copy_only=False)
    for name in LENGTH_LIMITED:
        if rows[name].null_count < rows.num_rows:
            length = pc.utf8_length(rows[name]).to_numpy(zero_copy_only=False)  # NaN where null: compares false
            suspect |= (length < 1) | (length > MAX_ID_LENGTH)
    return np.flatnonzero(suspect)


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
