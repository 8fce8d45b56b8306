"""Messages in columnar (Arrow) form: the columns a sender provides, new message ids, and sizes.

Every send, of one message or of a DataFrame, becomes an Arrow table of OUTGOING rows, and sizes are
computed by one vectorised function over that table, so the Python and Spark paths agree byte for byte.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schemas import MESSAGES
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


def header_sizes(rows: pa.Table) -> np.ndarray:
    """Header bytes per row (int64): UTF-8 bytes of the string system properties and of the stored
    application properties, plus 8 bytes for each time-to-live or scheduled time that is set. Columns
    null in every row (most of a single message's) add nothing and cost no kernel call."""
    total = np.zeros(rows.num_rows, dtype=np.int64)
    for name in (*STRING_PROPERTIES, "application_properties"):
        column = rows.column(name)
        if column.null_count < len(column):
            total += _lengths(column)
    for name in ("time_to_live_ms", "scheduled_enqueue_time_utc"):
        column = rows.column(name)
        if column.null_count < len(column):
            total += FIXED_WIDTH_BYTES * np.asarray(pc.is_valid(column), dtype=np.int64)
    return total


def _lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Byte lengths of a string or binary column, 0 where null (one kernel call, none for an all-null column)."""
    if column.null_count == len(column):
        return np.zeros(len(column), dtype=np.int64)
    lengths = pc.binary_length(column)
    if column.null_count:
        lengths = pc.fill_null(lengths, 0)
    return np.asarray(lengths, dtype=np.int64)


def header_size(strings: Iterable[Optional[str]], properties: Optional[str], timed: int) -> int:
    """header_sizes of one message without Arrow (what a message batch adds up per message): the UTF-8 bytes
    of its string system properties and stored application properties, plus 8 bytes for each of the
    `timed` time-to-live and scheduled time it sets."""
    text = sum(len(s.encode("utf-8")) for s in strings if s is not None)
    return text + (len(properties.encode("utf-8")) if properties is not None else 0) + FIXED_WIDTH_BYTES * timed


def body_sizes(rows: pa.Table) -> np.ndarray:
    """Body bytes per row (int64)."""
    return _lengths(rows.column("body"))
