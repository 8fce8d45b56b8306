"""What the archive holds and for how long: archive rows made from a message and its last state, the dates
they are filed under, and which of them the retention still keeps. Pure rules, no storage
(sparkbus.engine.archive writes and reads them)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .records import conformed, micros, stored_int64s
from .values import decode_properties, encode_properties

UTC = timezone.utc
from .schemas import ARCHIVE_ROWS, FORWARDED, LOCKS, MESSAGES, TS

# the state columns an archive row keeps, as LOCKS names them -> as the archive does
KEPT_STATE = {"delivery_count": "delivery_count", "dead_letter_reason": "dead_letter_reason",
              "dead_letter_error_description": "dead_letter_error_description",
              "dead_letter_source": "dead_letter_source", "updated_at_utc": "left_time", "state": "left_as"}


def archive_rows(messages: pa.Table, states: pa.Table) -> pa.Table:
    """The archive rows (ARCHIVE_ROWS) of messages that left: each message row (MESSAGES) with its gone state
    row (LOCKS, the same sequence numbers in any order), in sequence-number order. Everything in a row
    follows from the two (the time it left is its state row's), so archiving the same message twice
    would make the same row. KeyError when a message has no state row."""
    messages = conformed(messages, MESSAGES)
    messages = messages.take(pc.sort_indices(messages["sequence_number"]))
    at = pc.index_in(messages["sequence_number"], value_set=states["sequence_number"])
    if at.null_count:
        raise KeyError(f"message {messages['sequence_number'].filter(pc.is_null(at))[0]} has no state row")
    states = conformed(states, LOCKS).take(at)
    columns = {name: messages[name] for name in MESSAGES.names}
    columns.update({archived: states[name] for name, archived in KEPT_STATE.items()})
    return pa.Table.from_arrays([columns[name] for name in ARCHIVE_ROWS.names], schema=ARCHIVE_ROWS)


def enqueued_dates(rows: pa.Table) -> pa.Array:
    """The date each row is filed under (schemas.ARCHIVE_DATE): the UTC date it was enqueued, as 'YYYY-MM-DD'."""
    days = stored_int64s(rows["enqueued_time_utc"]) // 86_400_000_000
    return pa.array(days.astype("datetime64[D]").astype(str), pa.string())


def by_date(rows: pa.Table) -> dict[str, pa.Table]:
    """rows split by the date each is filed under, each part in the order of rows."""
    dates = enqueued_dates(rows)
    return {date: rows.filter(pc.equal(dates, date)) for date in sorted(set(dates.to_pylist()))}


def kept_since(now: datetime, retention: timedelta) -> datetime:
    """The earliest time a row may have left and still be kept (rows that left before are past retention)."""
    return now - retention


def within_retention(rows: pa.Table, since: Optional[datetime]) -> pa.Table:
    """rows (archive rows) that left at or after since (all when None)."""
    if since is None or not rows.num_rows:
        return rows
    left = stored_int64s(rows["left_time"])
    return rows.filter(pa.array(left >= micros(since)))


def files_expired(latest_left: pa.ChunkedArray, since: datetime) -> pa.Array:
    """Per archive file, from its latest left_time (the log's statistics, null when it has none), whether
    every row it holds left before since: past retention."""
    latest = pc.cast(latest_left, pa.timestamp("us", tz="UTC"))
    return pc.fill_null(pc.less(latest, pa.scalar(since, pa.timestamp("us", tz="UTC"))), False)


@dataclass(frozen=True)
class DateRange:
    """The dates (ARCHIVE_DATE values) a range of enqueue times spans: first to last, open-ended when last
    is None."""

    first: str
    last: Optional[str]

    def holds(self, value: Optional[str]) -> bool:
        """Whether a file filed under the date `value` may hold rows of the range (True without a date)."""
        return value is None or (self.first <= value and (self.last is None or value <= self.last))


def date_range(start: datetime, end: Optional[datetime]) -> DateRange:
    """The dates messages enqueued in [start, end) are filed under."""
    last = None if end is None else (end - timedelta(microseconds=1)).astimezone(UTC).date().isoformat()
    return DateRange(start.astimezone(UTC).date().isoformat(), last)


def enqueued_within(rows: pa.Table, start: datetime, end: Optional[datetime]) -> pa.Table:
    """rows enqueued in [start, end)."""
    enqueued = stored_int64s(rows["enqueued_time_utc"])
    keep = enqueued >= micros(start)
    if end is not None:
        keep &= enqueued < micros(end)
    return rows.filter(pa.array(keep))


def fanned_out_states(rows: pa.Table, now: datetime) -> pa.Table:
    """State rows (LOCKS) for topic messages (MESSAGES) leaving their topic once fanned out: a topic's rows
    have none (they are not received), and their archive rows say they were forwarded, now."""
    n = rows.num_rows
    return pa.Table.from_arrays([
        rows["partition_id"], rows["sequence_number"], pa.array([FORWARDED] * n, pa.string()),
        pa.array(np.zeros(n, np.int32)), pa.nulls(n, pa.string()), pa.nulls(n, TS), pa.nulls(n, pa.string()),
        pa.nulls(n, pa.string()), pa.nulls(n, pa.string()), pa.array(np.full(n, micros(now), np.int64)).view(TS)],
        schema=LOCKS)


# The application properties a replayed message carries: where and when it came from.
REPLAYED_FROM = "x-opt-replayed-from"
ORIGINAL_SEQUENCE_NUMBER = "x-opt-original-sequence-number"
ORIGINAL_ENQUEUED_TIME = "x-opt-original-enqueued-time"
_ANNOTATED = "(?i)x-opt-(replayed-from|original-sequence-number|original-enqueued-time)"


def replayed_properties(rows: pa.Table, source_path: str) -> pa.Array:
    """The stored application properties (core.values' encoding) of archive rows as replay sends them: each
    row's own with REPLAYED_FROM, ORIGINAL_SEQUENCE_NUMBER and ORIGINAL_ENQUEUED_TIME set. Built as text
    over the whole column (decoding every row's properties cost a replay half its time); a row that
    already carries one of these names (a replay of a replay) is decoded, set and encoded again."""
    texts = rows["application_properties"].combine_chunks()
    enqueued = pc.strftime(rows["enqueued_time_utc"].combine_chunks(), "%Y-%m-%dT%H:%M:%S+00:00")
    added = pc.binary_join_element_wise(
        f'"{ORIGINAL_ENQUEUED_TIME}":["datetime","', enqueued,
        f'"],"{ORIGINAL_SEQUENCE_NUMBER}":["int",', pc.cast(rows["sequence_number"].combine_chunks(), pa.string()),
        f'],"{REPLAYED_FROM}":["str",{json.dumps(source_path)}]}}', "")
    empty = pc.fill_null(pc.less_equal(pc.utf8_length(texts), 2), True)  # no text, or "{}"
    opened = pc.utf8_slice_codeunits(pc.fill_null(texts, "{}"), 0, -1)
    joined = pc.if_else(empty, pc.binary_join_element_wise("{", added, ""),
                        pc.binary_join_element_wise(opened, ",", added, ""))
    clashing = np.flatnonzero(pc.fill_null(pc.match_substring_regex(texts, _ANNOTATED), False).to_numpy(
        zero_copy_only=False))
    if not len(clashing):
        return joined
    values = joined.to_pylist()
    for i in clashing.tolist():
        decoded = {k: v for k, v in decode_properties(texts[i].as_py()).items()  # (names match in any case)
                   if k.lower() not in (REPLAYED_FROM, ORIGINAL_SEQUENCE_NUMBER, ORIGINAL_ENQUEUED_TIME)}
        decoded.update({REPLAYED_FROM: source_path, ORIGINAL_SEQUENCE_NUMBER: rows["sequence_number"][i].as_py(),
                        ORIGINAL_ENQUEUED_TIME: rows["enqueued_time_utc"][i].as_py()})
        values[i] = encode_properties(decoded)
    return pa.array(values, pa.string())
