"""Arrow schemas of the per-entity Delta tables.

Every per-entity table is partitioned by partition_id. `messages` holds each message as sent (append
mostly, one row per message); `locks` holds the receive state of messages that left the initial
state (locked, deferred, dead-lettered, transfer-dead-lettered, completed), updated by conditional
overwrites that name the partition.
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

MESSAGES = pa.schema([
    pa.field("partition_id", pa.int32(), nullable=False),
    pa.field("sequence_number", pa.int64(), nullable=False),
    pa.field("message_id", pa.string()),
    pa.field("session_id", pa.string()),
    pa.field("partition_key", pa.string()),
    pa.field("correlation_id", pa.string()),
    pa.field("content_type", pa.string()),
    pa.field("subject", pa.string()),
    pa.field("to", pa.string()),
    pa.field("reply_to", pa.string()),
    pa.field("reply_to_session_id", pa.string()),
    pa.field("application_properties", pa.string()),
    pa.field("body", pa.binary()),
    pa.field("time_to_live_ms", pa.int64()),
    pa.field("enqueued_time_utc", TS, nullable=False),
    pa.field("scheduled_enqueue_time_utc", TS),
    pa.field("expires_at_utc", TS),
    pa.field("body_size", pa.int64(), nullable=False),
    pa.field("header_size", pa.int64(), nullable=False),
    # Auto-forwarding (sparkbus.engine.forwarding): transfers this message has made (null: none), and for a
    # message forwarded out of a dead-letter sub-queue, the entity it was dead-lettered in.
    pa.field("transfer_hop_count", pa.int32()),
    pa.field("dead_letter_source_entity", pa.string()),
    # Null for an ordinary body (one AMQP data section, stored as its bytes); "data", "sequence" or "value"
    # when body holds AMQP body sections (sparkbus.core.amqp: several data sections, sequences, a value).
    pa.field("body_type", pa.string()),
    # A copy fan-out dead-letters as it makes it (a rule that cannot be evaluated for the message, a copy
    # without a session id for a session subscription): the reason and description. Its dead-lettered state
    # row follows in the locks table, a second commit; until it is there, no receiver of the active queue
    # takes the copy and receivers of the dead-letter sub-queue find it (sparkbus.core.transitions.candidates).
    pa.field("born_dead_letter_reason", pa.string()),
    pa.field("born_dead_letter_description", pa.string()),
])
# Columns of MESSAGES that forwarding carries from a message to its copy (a sender leaves them null).
TRANSFER_COLUMNS = ("transfer_hop_count", "dead_letter_source_entity")
BORN_DEAD_LETTER_COLUMNS = ("born_dead_letter_reason", "born_dead_letter_description")

# Which queue a message is in, per the locks table; a message without a row there is active. A lock is
# separate: lock_token and locked_until_utc, so an expired lock leaves the message where it was.
ACTIVE = "active"
DEAD_LETTERED = "dead_lettered"
DEFERRED = "deferred"
TRANSFER_DEAD_LETTERED = "transfer_dead_lettered"  # forwarding failed (ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
DEAD_LETTER_STATES = (DEAD_LETTERED, TRANSFER_DEAD_LETTERED)
# The gone states are final: the message left the entity, and they say how (an archive row's left_as).
# A message that left from a dead-letter sub-queue has its way prefixed with DEAD_LETTER_PREFIX
# (transitions.left_as).
COMPLETED = "completed"
RECEIVED_AND_DELETED = "received_and_deleted"
EXPIRED = "expired"  # expired without dead-lettering on expiry
PURGED = "purged"  # delete_messages / purge_messages
FORWARDED = "forwarded"  # auto-forwarded, or a topic's scheduled message fanned out to its subscriptions
CANCELLED = "cancelled"  # a scheduled message cancelled
DEAD_LETTER_PREFIX = "dead_letter_"
LEAVING_WAYS = (COMPLETED, RECEIVED_AND_DELETED, EXPIRED, PURGED, FORWARDED)
GONE_STATES = (*LEAVING_WAYS, CANCELLED,
               *(DEAD_LETTER_PREFIX + way for way in (COMPLETED, RECEIVED_AND_DELETED, PURGED, FORWARDED)))
GONE_SQL = ", ".join(f"'{s}'" for s in GONE_STATES)  # for `state IN (...)` in queries

LOCKS = pa.schema([
    pa.field("partition_id", pa.int32(), nullable=False),
    pa.field("sequence_number", pa.int64(), nullable=False),
    pa.field("state", pa.string(), nullable=False),
    pa.field("delivery_count", pa.int32(), nullable=False),
    pa.field("lock_token", pa.string()),
    pa.field("locked_until_utc", TS),
    pa.field("dead_letter_reason", pa.string()),
    pa.field("dead_letter_error_description", pa.string()),
    pa.field("dead_letter_source", pa.string()),
    pa.field("updated_at_utc", TS, nullable=False),
])

# One row per session that was ever locked: its lock and its state (sparkbus.engine.sessions).
SESSIONS = pa.schema([
    pa.field("partition_id", pa.int32(), nullable=False),
    pa.field("session_id", pa.string(), nullable=False),
    pa.field("lock_token", pa.string()),
    pa.field("locked_until_utc", TS),
    pa.field("state", pa.binary()),
    pa.field("updated_at_utc", TS, nullable=False),
])

ENTITY_TABLES = {"messages": MESSAGES, "locks": LOCKS, "sessions": SESSIONS}

# The archive (sparkbus.engine.archive): each message that left the entity, as it was sent, with how and when
# it left and its last state (delivery count, dead-letter reason). Partitioned by partition_id and by the
# UTC date it was enqueued (ARCHIVE_DATE, 'YYYY-MM-DD'), which replay and the source prune by and retention
# drops; ARCHIVE_ROWS is what a data file holds (the table's schema without its partition columns but
# partition_id, as PartitionReader reads every table).
ARCHIVE_DATE = "enqueued_date"
ARCHIVE_ROWS = pa.schema([
    *MESSAGES,
    pa.field("delivery_count", pa.int32(), nullable=False),
    pa.field("dead_letter_reason", pa.string()),
    pa.field("dead_letter_error_description", pa.string()),
    pa.field("dead_letter_source", pa.string()),
    pa.field("left_time", TS, nullable=False),
    pa.field("left_as", pa.string(), nullable=False),
])
ARCHIVE = ARCHIVE_ROWS.append(pa.field(ARCHIVE_DATE, pa.string(), nullable=False))


# delta-rs lists the whole _delta_log on every commit, so commit latency grows with the log files kept:
# one-row commits went from 9 ms to 16 ms over 1,000 commits with the default 30-day retention, and
# stayed at 9-10 ms when old log files were cleaned up. Time travel over an entity table therefore reaches
# back LOG_RETENTION (raise it per table with delta-rs' alter.set_table_properties, at that cost).
LOG_RETENTION = "interval 10 seconds"
TOMBSTONE_RETENTION = "interval 1 minute"


def table_configuration(stats_columns: str, target_file_bytes: Optional[int] = None) -> dict[str, str]:
    """Frequent checkpoints (a one-row commit took 30 ms with 50 commits since the last one, 10 ms right
    after one), bounded log retention, statistics only on the columns sparkbus prunes or bounds with
    (each indexed column costs time on every commit), and the size compaction merges small files up to
    (storage.maintenance; its default when not given)."""
    configuration = {"delta.checkpointInterval": "10", "delta.dataSkippingStatsColumns": stats_columns,
                     "delta.logRetentionDuration": LOG_RETENTION,
                     "delta.deletedFileRetentionDuration": TOMBSTONE_RETENTION}
    if target_file_bytes is not None:
        configuration["delta.targetFileSize"] = str(target_file_bytes)
    return configuration


# Messages files are compacted up to 256 KiB only: a receiver reads whole the files holding the messages
# it locks (with 16 MiB files 4 receivers of one queue each read every body of the partitions they
# visited), and messages are short-lived: a batch send's file (up to the 256 KiB batch limit) is left as
# it is instead of being rewritten while receivers drain it (with 1 MiB, batch receive lost 10-20% to
# compactions in the sender's process), while single sends' files of a few KiB are still merged.
MESSAGES_TARGET_FILE_BYTES = 256 << 10

TABLE_CONFIGURATION = {
    "messages": table_configuration("sequence_number,body_size,header_size,enqueued_time_utc",
                                    MESSAGES_TARGET_FILE_BYTES),
    "locks": table_configuration("sequence_number,locked_until_utc"),
    "sessions": table_configuration("session_id,locked_until_utc"),
    "archive": table_configuration("sequence_number,enqueued_time_utc,left_time", MESSAGES_TARGET_FILE_BYTES),
}

# Request and message counts of a namespace (sparkbus.engine.metrics): one row per minute, entity and
# process that did something, appended when a process persists its counts. entity is "" for operations
# of the namespace itself (management). cpu_percent and memory_percent (premium) are the process's share
# of the machine over the minute.
METRICS = pa.schema([
    pa.field("time_utc", TS, nullable=False),
    pa.field("entity", pa.string(), nullable=False),
    pa.field("process", pa.string(), nullable=False),
    pa.field("incoming_requests", pa.int64(), nullable=False),
    pa.field("successful_requests", pa.int64(), nullable=False),
    pa.field("throttled_requests", pa.int64(), nullable=False),
    pa.field("user_errors", pa.int64(), nullable=False),
    pa.field("server_errors", pa.int64(), nullable=False),
    pa.field("incoming_messages", pa.int64(), nullable=False),
    pa.field("outgoing_messages", pa.int64(), nullable=False),
    pa.field("credits_used", pa.int64(), nullable=False),
    pa.field("cpu_percent", pa.float64()),
    pa.field("memory_percent", pa.float64()),
    # what processors and lock renewers did (nullable: tables written before them lack the columns, which
    # the first append naming them adds; a missing value reads as 0)
    pa.field("processed_messages", pa.int64()),
    pa.field("failed_messages", pa.int64()),
    pa.field("abandoned_messages", pa.int64()),
    pa.field("dead_lettered_messages", pa.int64()),
    pa.field("lock_renewals", pa.int64()),
])
PROCESSING_COUNTERS = ("processed_messages", "failed_messages", "abandoned_messages", "dead_lettered_messages",
                       "lock_renewals")
METRICS_COUNTERS = ("incoming_requests", "successful_requests", "throttled_requests", "user_errors",
                    "server_errors", "incoming_messages", "outgoing_messages", "credits_used", *PROCESSING_COUNTERS)
